// conv2d as an implicit GEMM on the CUDA cores (no im2col buffer: the B tile is gathered from
// the input on the fly through the offset table, see conv_types.cuh).
//
// Defines: DTYPE; BM x BN block tile (output channels x output pixels), BK reduction step;
// each thread computes an 8x8 tile (two 4x4 quarters, BM/2 and BN/2 apart, for conflict-free
// 128-bit shared-memory reads); THREADS = BM*BN/64. Two shared-memory buffers, the next tile
// loaded into registers while the current one is multiplied, one barrier per step.
// MINB: blocks per SM to fit (caps registers). Grid: (ceil(npq/BN), ceil(kg/BM), groups).
#include "conv_types.cuh"

#ifndef BM
#define BM 128
#define BN 128
#endif
#ifndef BK
#define BK 8
#endif

#define THREADS (BM * BN / 64)
#define PAD 4
#define A_PER (BM * BK / THREADS)     // A elements per thread: consecutive k of one row
#define B_STEP (THREADS / BN)         // B rows loaded per pass (one pixel per thread)
#define B_PER (BK / B_STEP)           // B elements per thread

__device__ __forceinline__ void lds4(const float* p, float* v) {
    float4 t = *reinterpret_cast<const float4*>(p);
    v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
}
__device__ __forceinline__ void lds4(const double* p, double* v) {
    double2 t = *reinterpret_cast<const double2*>(p), u = *reinterpret_cast<const double2*>(p + 2);
    v[0] = t.x, v[1] = t.y, v[2] = u.x, v[3] = u.y;
}

#ifndef MINB
#define MINB 2  // blocks per SM the register budget is cut for
#endif

extern "C" __global__ void __launch_bounds__(THREADS, MINB)
conv_simt(const T* __restrict__ x, const T* __restrict__ wt, const T* __restrict__ bias, T* __restrict__ y,
          const int4* __restrict__ tab, const ConvParams p) {
    __shared__ __align__(16) ACC As[2][BK][BM + PAD];
    __shared__ __align__(16) ACC Bs[2][BK][BN + PAD];
    const int tid = threadIdx.x;
    const int g = blockIdx.z;
    const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
    const T* xg = x + g * p.cg * p.sx_c;
    const T* wg = wt + (long long)g * p.kg * p.crs;

    // this thread's B column: one output pixel for the whole reduction
    const int bn = tid % BN, bk = tid / BN;
    int ih0 = PIX_INVALID, iw0 = 0, xbase = 0;
    {
        const int pix = n0 + bn;
        if (pix < p.npq) {
            const int img = pix / p.pq, pq = pix - img * p.pq, op = pq / p.q, oq = pq - op * p.q;
            ih0 = op * p.str_h - p.pad_t;
            iw0 = oq * p.str_w - p.pad_l;
            xbase = img * p.sx_n + ih0 * p.sx_h + iw0 * p.sx_w;
        }
    }
    // this thread's A row and k range
    const int am = tid / (BK / A_PER), ak = (tid % (BK / A_PER)) * A_PER;
    const bool arow = m0 + am < p.kg;
    const T* wrow = wg + (long long)(m0 + am) * p.crs;

    ACC ra[A_PER], rb[B_PER];
    auto fetch = [&](int k0) {
#pragma unroll
        for (int i = 0; i < A_PER; i++) {
            const int k = k0 + ak + i;
            ra[i] = (arow && k < p.crs) ? to_acc(wrow[k]) : (ACC)0;
        }
#pragma unroll
        for (int j = 0; j < B_PER; j++) {
            const int4 t = tab[k0 + bk + j * B_STEP];
            const int ih = ih0 + t.y, iw = iw0 + t.z;
            rb[j] = ((unsigned)ih < (unsigned)p.h && (unsigned)iw < (unsigned)p.w) ? to_acc(xg[xbase + t.x]) : (ACC)0;
        }
    };
    auto stash = [&](int buf) {
#pragma unroll
        for (int i = 0; i < A_PER; i++) As[buf][ak + i][am] = ra[i];
#pragma unroll
        for (int j = 0; j < B_PER; j++) Bs[buf][bk + j * B_STEP][bn] = rb[j];
    };

    const int tx = tid % (BN / 8), ty = tid / (BN / 8);
    ACC acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[i][j] = 0;

    const int steps = (p.crs + BK - 1) / BK;
    fetch(0);
    stash(0);
    __syncthreads();
    int buf = 0;
    for (int st = 0; st < steps; st++) {
        if (st + 1 < steps) fetch((st + 1) * BK);
#pragma unroll
        for (int kk = 0; kk < BK; kk++) {
            ACC a[8], b[8];
            lds4(&As[buf][kk][ty * 4], a);
            lds4(&As[buf][kk][BM / 2 + ty * 4], a + 4);
            lds4(&Bs[buf][kk][tx * 4], b);
            lds4(&Bs[buf][kk][BN / 2 + tx * 4], b + 4);
#pragma unroll
            for (int i = 0; i < 8; i++)
#pragma unroll
                for (int j = 0; j < 8; j++) acc[i][j] += a[i] * b[j];
        }
        if (st + 1 < steps) stash(buf ^ 1);
        __syncthreads();
        buf ^= 1;
    }

    // epilogue: bias, activation, convert, store y[img, g*kg + m, pq]
    const long long kpq = (long long)p.k * p.pq;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int pix = n0 + (j < 4 ? tx * 4 + j : BN / 2 + tx * 4 + j - 4);
        if (pix >= p.npq) continue;
        const int img = pix / p.pq, pq = pix - img * p.pq;
        T* ycol = y + img * kpq + pq;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int m = m0 + (i < 4 ? ty * 4 + i : BM / 2 + ty * 4 + i - 4);
            if (m < p.kg) {
                const int oc = g * p.kg + m;
                ACC v = acc[i][j];
                if (p.has_bias) v += to_acc(bias[oc]);
                ycol[(long long)oc * p.pq] = from_acc(activate<ACT>(v));
            }
        }
    }
}
