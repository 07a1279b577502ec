// relu: y[i] = max(x[i], 0), NaN kept, over a contiguous run of n elements.
// One grid-stride loop; with VEC, 128-bit loads and stores (16 / sizeof(T) elements each) and a
// scalar tail. DTYPE picks T (dtype.cuh); the comparison runs in the accumulator type.
#include "dtype.cuh"
#ifndef VEC
#define VEC 1
#endif

__device__ __forceinline__ T relu1(T v) {
    const ACC a = to_acc(v);
    return (a > ACC(0) || a != a) ? v : from_acc(ACC(0));
}

extern "C" __global__ void relu(const T* __restrict__ x, T* __restrict__ y, const i64 n) {
    const i64 first = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    i64 done = 0;
#if VEC
    constexpr int W = 16 / sizeof(T);  // elements per 128-bit word
    const i64 words = n / W;
    const uint4* __restrict__ xv = reinterpret_cast<const uint4*>(x);
    uint4* __restrict__ yv = reinterpret_cast<uint4*>(y);
    for (i64 w = first; w < words; w += stride) {
        uint4 u = xv[w];
        T* e = reinterpret_cast<T*>(&u);
#pragma unroll
        for (int k = 0; k < W; ++k) e[k] = relu1(e[k]);
        yv[w] = u;
    }
    done = words * W;
#endif
    for (i64 j = done + first; j < n; j += stride) y[j] = relu1(x[j]);
}
