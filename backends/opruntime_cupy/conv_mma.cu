// conv2d as an implicit GEMM on the tensor cores: float16 / bfloat16 operands, float32
// accumulation, mma.sync.m16n8k16 fed by ldmatrix from shared memory.
//
// Defines: DTYPE (1 float16, 2 bfloat16); BM x BN block tile (output channels x output pixels),
// BK = 32; WARPS_M x WARPS_N warps, each computing (BM/WARPS_M) x (BN/WARPS_N) as 16x8 mma
// tiles; AVEC 1 when crs % 8 == 0 (16-byte weight loads), else 0. Two shared-memory buffers,
// rows padded by 16 bytes (ldmatrix reads 8 rows of 16 bytes without bank conflicts); the next
// tile is gathered into registers while the current one is multiplied; one barrier per step.
// Grid: (ceil(npq/BN), ceil(kg/BM), groups).
#ifndef DTYPE
#define DTYPE 1
#endif
#include "conv_types.cuh"

#ifndef BM
#define BM 128
#define BN 128
#define WARPS_M 2
#define WARPS_N 4
#endif
#ifndef AVEC
#define AVEC 0
#endif

#define BK 32
#define THREADS (32 * WARPS_M * WARPS_N)
#define WM (BM / WARPS_M)
#define WN (BN / WARPS_N)
#define MT (WM / 16)                       // mma tiles per warp along M
#define NT (WN / 8)                        // ... along N (even: ldmatrix.x4.trans loads two)
#define A_CHUNKS (BM * BK / 8 / THREADS)   // 8-element weight chunks per thread
#define B_PAIRS (BN / 2)                   // threads per B row: two adjacent pixels each
#define B_STEP (THREADS / B_PAIRS)
#define B_PER (BK / B_STEP)
#define LDA (BK + 8)
#define LDB (BN + 8)

#if DTYPE == 1
#define MMA_TYPE "f16"
#else
#define MMA_TYPE "bf16"
#endif

__device__ __forceinline__ void ldsm_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void mma16816(float* d, const unsigned* a, const unsigned* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." MMA_TYPE "." MMA_TYPE ".f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

#ifndef MINB
#define MINB 1
#endif

extern "C" __global__ void __launch_bounds__(THREADS, MINB)
conv_mma(const T* __restrict__ x, const T* __restrict__ wt, const T* __restrict__ bias, T* __restrict__ y,
         const int4* __restrict__ tab, const ConvParams p) {
    __shared__ __align__(16) T As[2][BM][LDA];
    __shared__ __align__(16) T Bs[2][BK][LDB];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int wm = warp % WARPS_M, wn = warp / WARPS_M;
    const int g = blockIdx.z;
    const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
    const T* xg = x + g * p.cg * p.sx_c;
    const T* wg = wt + (long long)g * p.kg * p.crs;

    // B: two adjacent output pixels per thread, for the whole reduction
    const int bn = (tid % B_PAIRS) * 2, bk = tid / B_PAIRS;
    int ih0[2], iw0[2], xbase[2];
#pragma unroll
    for (int u = 0; u < 2; u++) {
        const int pix = n0 + bn + u;
        ih0[u] = PIX_INVALID, iw0[u] = 0, xbase[u] = 0;
        if (pix < p.npq) {
            const int img = pix / p.pq, pq = pix - img * p.pq, op = pq / p.q, oq = pq - op * p.q;
            ih0[u] = op * p.str_h - p.pad_t;
            iw0[u] = oq * p.str_w - p.pad_l;
            xbase[u] = img * p.sx_n + ih0[u] * p.sx_h + iw0[u] * p.sx_w;
        }
    }

    uint4 ra[A_CHUNKS];
    unsigned rb[B_PER];
    auto fetch = [&](int k0) {
#pragma unroll
        for (int i = 0; i < A_CHUNKS; i++) {
            const int c = tid + i * THREADS, row = c / (BK / 8), kc = (c % (BK / 8)) * 8;
            const int m = m0 + row, k = k0 + kc;
            const T* src = wg + (long long)m * p.crs + k;
#if AVEC
            ra[i] = (m < p.kg && k < p.crs) ? *reinterpret_cast<const uint4*>(src) : make_uint4(0, 0, 0, 0);
#else
            T v[8];
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] = (m < p.kg && k + e < p.crs) ? src[e] : (T)0;
            ra[i] = make_uint4(v[0] | (unsigned)v[1] << 16, v[2] | (unsigned)v[3] << 16, v[4] | (unsigned)v[5] << 16,
                               v[6] | (unsigned)v[7] << 16);
#endif
        }
#pragma unroll
        for (int j = 0; j < B_PER; j++) {
            const int4 t = tab[k0 + bk + j * B_STEP];
            unsigned pair = 0;
#pragma unroll
            for (int u = 0; u < 2; u++) {
                const int ih = ih0[u] + t.y, iw = iw0[u] + t.z;
                const T v = ((unsigned)ih < (unsigned)p.h && (unsigned)iw < (unsigned)p.w) ? xg[xbase[u] + t.x] : (T)0;
                pair |= (unsigned)v << (16 * u);
            }
            rb[j] = pair;
        }
    };
    auto stash = [&](int buf) {
#pragma unroll
        for (int i = 0; i < A_CHUNKS; i++) {
            const int c = tid + i * THREADS, row = c / (BK / 8), kc = (c % (BK / 8)) * 8;
            *reinterpret_cast<uint4*>(&As[buf][row][kc]) = ra[i];
        }
#pragma unroll
        for (int j = 0; j < B_PER; j++) *reinterpret_cast<unsigned*>(&Bs[buf][bk + j * B_STEP][bn]) = rb[j];
    };

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.f;

    // ldmatrix lane addresses (element offsets inside a buffer)
    const int a_row = wm * WM + (lane % 16), a_col = (lane / 16) * 8;
    const int b_row = (lane % 8) + ((lane / 8) % 2) * 8, b_col = wn * WN + (lane / 16) * 8;

    const int steps = (p.crs + BK - 1) / BK;
    fetch(0);
    stash(0);
    __syncthreads();
    int buf = 0;
    for (int st = 0; st < steps; st++) {
        if (st + 1 < steps) fetch((st + 1) * BK);
#pragma unroll
        for (int ks = 0; ks < BK / 16; ks++) {
            unsigned a[MT][4], b[NT][2];
#pragma unroll
            for (int i = 0; i < MT; i++)
                ldsm_x4(smem_addr(&As[buf][a_row + i * 16][ks * 16 + a_col]), a[i][0], a[i][1], a[i][2], a[i][3]);
#pragma unroll
            for (int j = 0; j < NT; j += 2)
                ldsm_x4_t(smem_addr(&Bs[buf][ks * 16 + b_row][b_col + j * 8]), b[j][0], b[j][1], b[j + 1][0], b[j + 1][1]);
#pragma unroll
            for (int i = 0; i < MT; i++)
#pragma unroll
                for (int j = 0; j < NT; j++) mma16816(acc[i][j], a[i], b[j]);
        }
        if (st + 1 < steps) stash(buf ^ 1);
        __syncthreads();
        buf ^= 1;
    }

    // epilogue: accumulator (i, j, e) is row wm*WM + i*16 + lane/4 (+8 for e >= 2),
    // column wn*WN + j*8 + (lane%4)*2 + e%2
    const long long kpq = (long long)p.k * p.pq;
#pragma unroll
    for (int j = 0; j < NT; j++) {
#pragma unroll
        for (int e2 = 0; e2 < 2; e2++) {
            const int pix = n0 + wn * WN + j * 8 + (lane % 4) * 2 + e2;
            if (pix >= p.npq) continue;
            const int img = pix / p.pq, pq = pix - img * p.pq;
            T* ycol = y + img * kpq + pq;
#pragma unroll
            for (int i = 0; i < MT; i++) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int m = m0 + wm * WM + i * 16 + lane / 4 + h * 8;
                    if (m < p.kg) {
                        const int oc = g * p.kg + m;
                        float v = acc[i][j][h * 2 + e2];
                        if (p.has_bias) v += to_acc(bias[oc]);
                        ycol[(long long)oc * p.pq] = from_acc(activate<ACT>(v));
                    }
                }
            }
        }
    }
}
