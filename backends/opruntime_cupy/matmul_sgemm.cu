// fp32 GEMM on the CUDA cores: C[b] = A[b] @ B[b], A (M x K), B (K x N), C (M x N) contiguous.
//
// Each block computes a BM x BN tile of C, walking K in steps of BK through two shared-memory
// buffers (the next tile is fetched into registers while the current one is multiplied, one
// barrier per step). Each warp owns a WM x WN piece; each thread a TM x TN register tile made
// of 4x4 sub-tiles spaced LM*4 rows / LN*4 columns apart, so that its shared-memory reads are
// 16-byte vectors and a warp's reads hit distinct banks or broadcast.
//
// Operand layouts (compile-time): A_KCONTIG: A's k index is contiguous (row-major A), else its
// m index is (a transposed view). B_NCONTIG: B's n index is contiguous (row-major B), else k.
// VEC_A / VEC_B: 1 loads 16-byte vectors along the contiguous index (needs that extent and
// the other stride to be multiples of 4 and a 16-byte-aligned base: matmul.py checks); 0 loads
// single elements with arbitrary (even negative or zero) strides. Edges are predicated.
// Batches: blockIdx.z (+ z0) indexes up to three batch dims (d2 x d1 x d0) with per-operand strides,
// 0 for a broadcast dim. Epilogue (BIAS, ACT: matmul_common.cuh): bias[n] and the activation
// applied to each accumulator before it is stored.
#include "matmul_common.cuh"

#ifndef BM
#define BM 128
#define BN 128
#define BK 8
#define WM 32
#define WN 64
#define TM 8
#define TN 8
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 2
#endif

#define LM (WM / TM)  // lanes of a warp along m
#define LN (WN / TN)  // lanes along n
#define NT ((BM / WM) * (BN / WN) * 32)
#define PAD 4         // floats of padding per shared row: conflict-free transposed stores
#define A_ELEMS (BM * BK / NT)  // elements of A each thread fetches per step
#define B_ELEMS (BK * BN / NT)

static_assert(LM * LN == 32, "a warp is LM x LN lanes");
static_assert(TM % 4 == 0 && TN % 4 == 0, "thread tiles are made of 4x4 sub-tiles");
static_assert(BM % WM == 0 && BN % WN == 0, "warps tile the block");
static_assert(A_ELEMS % 4 == 0 && B_ELEMS % 4 == 0 && A_ELEMS > 0 && B_ELEMS > 0, "whole vectors per thread");

struct Smem {
    float a[2][BK][BM + PAD];
    float b[2][BK][BN + PAD];
};

// Which elements of a tile a thread fetches: element v (of VA or VB) sits at tile coordinates
// (r0 + v * dr, c0 + v * dc); r runs along m (A) or n (B), c along k. With NT a multiple of the
// tile's row length these are affine in v, so one base offset and one step per thread suffice.
#if VEC_A && A_KCONTIG
#define VA (A_ELEMS / 4)
#define A_R0 (tid / (BK / 4))
#define A_C0 ((tid % (BK / 4)) * 4)
#define A_DR (NT / (BK / 4))
#define A_DC 0
#elif VEC_A
#define VA (A_ELEMS / 4)
#define A_R0 ((tid % (BM / 4)) * 4)
#define A_C0 (tid / (BM / 4))
#define A_DR 0
#define A_DC (NT / (BM / 4))
#elif A_KCONTIG
#define VA A_ELEMS
#define A_R0 (tid / BK)
#define A_C0 (tid % BK)
#define A_DR (NT / BK)
#define A_DC 0
#else
#define VA A_ELEMS
#define A_R0 (tid % BM)
#define A_C0 (tid / BM)
#define A_DR 0
#define A_DC (NT / BM)
#endif
#if VEC_B && B_NCONTIG
#define VB (B_ELEMS / 4)
#define B_R0 ((tid % (BN / 4)) * 4)
#define B_C0 (tid / (BN / 4))
#define B_DR 0
#define B_DC (NT / (BN / 4))
#elif VEC_B
#define VB (B_ELEMS / 4)
#define B_R0 (tid / (BK / 4))
#define B_C0 ((tid % (BK / 4)) * 4)
#define B_DR (NT / (BK / 4))
#define B_DC 0
#elif B_NCONTIG
#define VB B_ELEMS
#define B_R0 (tid % BN)
#define B_C0 (tid / BN)
#define B_DR 0
#define B_DC (NT / BN)
#else
#define VB B_ELEMS
#define B_R0 (tid / BK)
#define B_C0 (tid % BK)
#define B_DR (NT / BK)
#define B_DC 0
#endif
static_assert(NT % (BK / 4) == 0 && NT % (BM / 4) == 0 && NT % (BN / 4) == 0, "affine fetch pattern");
static_assert(VEC_A || (NT % BK == 0 && NT % BM == 0), "affine fetch pattern (scalar A)");
static_assert(VEC_B || (NT % BK == 0 && NT % BN == 0), "affine fetch pattern (scalar B)");

// One operand's fetcher: `p` points at this thread's first element of the current k tile.
// VEC: 1 reads float4 along the contiguous index (KC: k contiguous, else r contiguous).
template <int V, int VEC, int KC, int R0M, int DR, int DC>
struct Fetch {
    static constexpr int W = VEC ? 4 : 1;
    float r[V * W];
    __device__ __forceinline__ void load(const float* p, i64 vstep, int rlim, int klim) {
        // rlim: rows left from this thread's first row; klim: k left from its first column
#pragma unroll
        for (int v = 0; v < V; ++v) {
            const bool ok = (v * DR < rlim) && (v * DC < klim);
            if (VEC) {
                float4 x = ok ? *reinterpret_cast<const float4*>(p + v * vstep) : make_float4(0, 0, 0, 0);
                r[v * 4] = x.x; r[v * 4 + 1] = x.y; r[v * 4 + 2] = x.z; r[v * 4 + 3] = x.w;
            } else {
                r[v] = ok ? p[v * vstep] : 0.0f;
            }
        }
    }
};

// Store fetched values into a [BK][ROW + PAD] shared tile at (r0 + v*DR, c0 + v*DC).
template <int ROW, int V, int VEC, int KC, int DR, int DC>
__device__ __forceinline__ void stash(float (&s)[BK][ROW + PAD], const float* r, int r0, int c0) {
#pragma unroll
    for (int v = 0; v < V; ++v) {
        const int rr = r0 + v * DR, cc = c0 + v * DC;
        if (VEC && KC) {  // 4 consecutive k: transpose into 4 rows
#pragma unroll
            for (int j = 0; j < 4; ++j) s[cc + j][rr] = r[v * 4 + j];
        } else if (VEC) {  // 4 consecutive r: one 16-byte store
            *reinterpret_cast<float4*>(&s[cc][rr]) = make_float4(r[v * 4], r[v * 4 + 1], r[v * 4 + 2], r[v * 4 + 3]);
        } else {
            s[cc][rr] = r[v];
        }
    }
}

extern "C" __global__ void __launch_bounds__(NT, MIN_BLOCKS)
sgemm(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
      const GemmParams p
#if BIAS
      , const float* __restrict__ bias
#endif
      ) {
    __shared__ __align__(16) Smem sm;
    const int M = (int)p.M, N = (int)p.N, K = (int)p.K;
    const i64 sam = p.sam, sak = p.sak, sbk = p.sbk, sbn = p.sbn;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    int m0, n0;  // grouped tile order (matmul_common.cuh)
    grouped_tile(M, N, BM, BN, m0, n0);

    const int wm0 = (warp / (BN / WN)) * WM, wn0 = (warp % (BN / WN)) * WN;
    const int lm = lane / LN, ln = lane % LN;

    {  // one batch entry per blockIdx.z; launches of more than 65535 entries are split (z0)
        const i64 bz = p.z0 + blockIdx.z;
        const i64 b0 = bz % p.d0, b1 = (bz / p.d0) % p.d1, b2 = bz / (p.d0 * p.d1);
        const float* Ab = A + b2 * p.sa2 + b1 * p.sa1 + b0 * p.sa0;
        const float* Bb = B + b2 * p.sb2 + b1 * p.sb1 + b0 * p.sb0;
        float* Cb = C + bz * (i64)M * N;

        float acc[TM][TN];
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

        // this thread's fetch pattern (see the A_* / B_* macros)
        const int ar0 = A_R0, ac0 = A_C0, br0 = B_R0, bc0 = B_C0;
        const i64 a_vstep = (i64)A_DR * sam + (i64)A_DC * sak, b_vstep = (i64)B_DR * sbn + (i64)B_DC * sbk;
        const float* pa = Ab + (i64)(m0 + ar0) * sam + (i64)ac0 * sak;
        const float* pb = Bb + (i64)(n0 + br0) * sbn + (i64)bc0 * sbk;
        // along a contiguous k the step is a constant
        const i64 a_kstep = (VEC_A && A_KCONTIG) ? (i64)BK : (i64)BK * sak;
        const i64 b_kstep = (VEC_B && !B_NCONTIG) ? (i64)BK : (i64)BK * sbk;
        const int arlim = M - m0 - ar0, brlim = N - n0 - br0;
        Fetch<VA, VEC_A, A_KCONTIG, 0, A_DR, A_DC> fa_;
        Fetch<VB, VEC_B, !B_NCONTIG, 0, B_DR, B_DC> fb_;
        fa_.load(pa, a_vstep, arlim, K - ac0);
        fb_.load(pb, b_vstep, brlim, K - bc0);
        stash<BM, VA, VEC_A, A_KCONTIG, A_DR, A_DC>(sm.a[0], fa_.r, ar0, ac0);
        stash<BN, VB, VEC_B, !B_NCONTIG, B_DR, B_DC>(sm.b[0], fb_.r, br0, bc0);
        __syncthreads();

        const int steps = (K + BK - 1) / BK;
        for (int t = 0; t < steps; ++t) {
            const int cur = t & 1;
            if (t + 1 < steps) {  // the next tile travels while this one is multiplied
                pa += a_kstep;
                pb += b_kstep;
                fa_.load(pa, a_vstep, arlim, K - (t + 1) * BK - ac0);
                fb_.load(pb, b_vstep, brlim, K - (t + 1) * BK - bc0);
            }
#pragma unroll
            for (int kk = 0; kk < BK; ++kk) {
                float fa[TM], fb[TN];
#pragma unroll
                for (int i = 0; i < TM / 4; ++i) {
                    float4 x = *reinterpret_cast<const float4*>(&sm.a[cur][kk][wm0 + i * LM * 4 + lm * 4]);
                    fa[i * 4] = x.x; fa[i * 4 + 1] = x.y; fa[i * 4 + 2] = x.z; fa[i * 4 + 3] = x.w;
                }
#pragma unroll
                for (int j = 0; j < TN / 4; ++j) {
                    float4 x = *reinterpret_cast<const float4*>(&sm.b[cur][kk][wn0 + j * LN * 4 + ln * 4]);
                    fb[j * 4] = x.x; fb[j * 4 + 1] = x.y; fb[j * 4 + 2] = x.z; fb[j * 4 + 3] = x.w;
                }
#pragma unroll
                for (int i = 0; i < TM; ++i)
#pragma unroll
                    for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(fa[i], fb[j], acc[i][j]);
            }
            if (t + 1 < steps) {
                stash<BM, VA, VEC_A, A_KCONTIG, A_DR, A_DC>(sm.a[cur ^ 1], fa_.r, ar0, ac0);
                stash<BN, VB, VEC_B, !B_NCONTIG, B_DR, B_DC>(sm.b[cur ^ 1], fb_.r, br0, bc0);
            }
            __syncthreads();
        }

#if HAS_EPILOGUE
#pragma unroll
        for (int j = 0; j < TN / 4; ++j) {
            const int n = n0 + wn0 + j * LN * 4 + ln * 4;
#pragma unroll
            for (int q = 0; q < 4; ++q) {
#if BIAS
                const float b = n + q < N ? bias[n + q] : 0.0f;
#else
                const float b = 0.0f;
#endif
#pragma unroll
                for (int i = 0; i < TM; ++i) acc[i][j * 4 + q] = activate<ACT>(acc[i][j * 4 + q] + b);
            }
        }
#endif
        const bool vec_c = (N & 3) == 0;
#pragma unroll
        for (int i = 0; i < TM; ++i) {
            const int m = m0 + wm0 + (i / 4) * LM * 4 + lm * 4 + (i % 4);
            if (m >= M) continue;
            float* crow = Cb + (i64)m * N;
#pragma unroll
            for (int j = 0; j < TN / 4; ++j) {
                const int n = n0 + wn0 + j * LN * 4 + ln * 4;
                if (vec_c) {
                    if (n < N) *reinterpret_cast<float4*>(crow + n) =
                        make_float4(acc[i][j * 4], acc[i][j * 4 + 1], acc[i][j * 4 + 2], acc[i][j * 4 + 3]);
                } else {
#pragma unroll
                    for (int q = 0; q < 4; ++q)
                        if (n + q < N) crow[n + q] = acc[i][j * 4 + q];
                }
            }
        }
    }
}
