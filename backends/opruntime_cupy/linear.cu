// The bias + activation epilogue as a pass of its own, in place: y = activate<ACT>(y + bias[c]
// (+ resid[i])), for outputs a GEMM wrote without it (linear through cuBLAS, conv2d through
// im2col + cuBLAS, a linear's residual after the own GEMMs). y is contiguous, seen as (outer,
// channels, inner): element i has channel (i / inner) % channels: linear's (rows, N) is inner 1,
// conv2d's NCHW is inner H*W. resid, when read, is contiguous like y.
//
// Defines: DTYPE (dtype.cuh), ACT (epilogue.cuh), BIAS (0: activation only; bias is then not
// read), RESID (1: resid added; else not read), VEC (elements per 16-byte access, or 1: scalar),
// IDX (int, or long long past 2**31 elements). VEC > 1 needs a 16-byte aligned y, inner == 1 with channels % VEC == 0 (a vector
// holds channels c..c+VEC-1) or inner % VEC == 0 (a vector is one channel): linear.py checks.
// A grid-stride loop over vectors, the grid sized to the SMs.
#include "dtype.cuh"
#include "epilogue.cuh"

#ifndef ACT
#define ACT 0
#endif
#ifndef BIAS
#define BIAS 1
#endif
#ifndef RESID
#define RESID 0
#endif
#ifndef VEC
#define VEC (16 / (int)sizeof(T))
#endif
#ifndef IDX
#define IDX int
#endif
#ifndef THREADS
#define THREADS 256
#endif

#if VEC > 1
union Pack {
    uint4 u;
    T v[VEC];
};
static_assert(sizeof(Pack) == 16, "a vector is 16 bytes");
#endif

extern "C" __global__ void __launch_bounds__(THREADS)
bias_act(T* __restrict__ y, const T* __restrict__ bias, const T* __restrict__ resid, long long nvec_, long long inner_,
         long long channels_) {
    const IDX nvec = (IDX)nvec_, inner = (IDX)inner_, channels = (IDX)channels_;
    for (IDX v = (IDX)blockIdx.x * THREADS + threadIdx.x; v < nvec; v += (IDX)gridDim.x * THREADS) {
        const IDX i = v * VEC;
        const IDX c0 = (i / inner) % channels;
#if VEC > 1
        Pack p;
        p.u = reinterpret_cast<const uint4*>(y)[v];
#if RESID
        Pack r;
        r.u = reinterpret_cast<const uint4*>(resid)[v];
#endif
#pragma unroll
        for (int q = 0; q < VEC; ++q) {
#if BIAS
            ACC b = to_acc(bias[inner == 1 ? c0 + q : c0]);
#else
            ACC b = ACC(0);
#endif
#if RESID
            b += to_acc(r.v[q]);
#endif
            p.v[q] = from_acc(activate<ACT>(to_acc(p.v[q]) + b));
        }
        reinterpret_cast<uint4*>(y)[v] = p.u;
#else
#if BIAS
        ACC b = to_acc(bias[c0]);
#else
        ACC b = ACC(0);
#endif
#if RESID
        b += to_acc(resid[i]);
#endif
        y[i] = from_acc(activate<ACT>(to_acc(y[i]) + b));
#endif
    }
}
