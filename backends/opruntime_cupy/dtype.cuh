// The element type T of one build and its accumulator type ACC, chosen by DTYPE, with the
// conversions between them:
//   DTYPE 0 float32, 1 float16, 2 bfloat16 (both accumulated in float32), 3 float64
#pragma once
#ifndef DTYPE
#define DTYPE 0  // defaults let every file build on its own (CI compiles each one)
#endif
#include "common.cuh"

#if DTYPE == 3
typedef double T;
typedef double ACC;
__device__ __forceinline__ ACC to_acc(T v) { return v; }
__device__ __forceinline__ T from_acc(ACC v) { return v; }
#else
typedef float ACC;
#if DTYPE == 0
typedef float T;
__device__ __forceinline__ ACC to_acc(T v) { return v; }
__device__ __forceinline__ T from_acc(ACC v) { return v; }
#elif DTYPE == 1
typedef bits16 T;
__device__ __forceinline__ ACC to_acc(T v) { return f16_to_f32(v); }
__device__ __forceinline__ T from_acc(ACC v) { return f32_to_f16(v); }
#else
typedef bits16 T;
__device__ __forceinline__ ACC to_acc(T v) { return bf16_to_f32(v); }
__device__ __forceinline__ T from_acc(ACC v) { return f32_to_bf16(v); }
#endif
#endif
