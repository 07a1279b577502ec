// fp16 / bf16 GEMM on the tensor cores (mma.sync m16n8k16, fp32 accumulation):
// C[b] = A[b] @ B[b], A (M x K), B (K x N), C (M x N) contiguous, all of one 16-bit type.
//
// Each block computes a BM x BN tile of C. K is walked in steps of BK through STAGES
// shared-memory stages filled by cp.async (16-byte copies, zero-filled past the edges), so
// STAGES-1 tiles are in flight while one is multiplied. Shared tiles are stored with their
// contiguous index along rows of 16-byte chunks, XOR-swizzled so that ldmatrix (8 rows x 16
// bytes per matrix) hits 8 distinct bank groups. Each warp owns a WM x WN piece: WM/16 x WN/8
// mma tiles whose fragments come from ldmatrix (.trans where the tile is stored transposed).
//
// Layouts (compile-time): A_KCONTIG: A's k index is contiguous, else m. B_NCONTIG: B's n index
// is contiguous, else k. VEC_A / VEC_B 1: cp.async 16-byte copies (needs the contiguous extents and other
// strides to be multiples of 8 and 16-byte-aligned bases: matmul.py checks); 0: element
// loads with any strides (VEC_x 0: synchronous, for odd shapes and strided views).
// Epilogue (BIAS, ACT: matmul_common.cuh): bias[n] and the activation applied in fp32 to the
// accumulators before they are rounded to 16 bits.
#include "matmul_common.cuh"
#include "mma.cuh"

#ifndef BM
#define BM 128
#define BN 256
#define BK 32
#define WM 64
#define WN 64
#define STAGES 4
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1
#endif

#define NT ((BM / WM) * (BN / WN) * 32)
#define MI (WM / 16)
#define NI (WN / 8)
// shared tiles: rows x cols, cols contiguous
#define A_ROWS (A_KCONTIG ? BM : BK)
#define A_COLS (A_KCONTIG ? BK : BM)
#define B_ROWS (B_NCONTIG ? BK : BN)
#define B_COLS (B_NCONTIG ? BN : BK)
#define A_TILE (BM * BK)
#define B_TILE (BK * BN)
#define A_CHUNKS (A_TILE / 8)
#define B_CHUNKS (B_TILE / 8)

static_assert(BK % 32 == 0 && WM % 16 == 0 && WN % 16 == 0, "mma tiles; an even number of k16 steps per tile");
static_assert(A_CHUNKS % NT == 0 && B_CHUNKS % NT == 0, "whole chunks per thread");
static_assert(A_COLS % 16 == 0 && B_COLS % 16 == 0, "rows of at least two chunks");

// Physical chunk of logical chunk c in row r of a tile with CH 16-byte chunks per row.
template <int CH>
__device__ __forceinline__ int swz(int r, int c) {
    if constexpr (CH >= 8) return c ^ (r & 7);
    else if constexpr (CH == 4) return c ^ ((r >> 1) & 3);
    else return c ^ ((r >> 2) & 1);
}

// Load one stage: rows x cols tile of one operand. (r, c) in the tile are (i, j) in global
// memory with i along the rows' index (stride s_row) and j along the contiguous index.
template <int ROWS, int COLS, int VEC>
__device__ __forceinline__ void load_tile(bits16* s, const bits16* g, i64 s_row, i64 s_col, int rows_left,
                                          int cols_left, int tid) {
    constexpr int CH = COLS / 8, PER = ROWS * CH / NT, RS = NT / CH;
    static_assert(NT % CH == 0, "a thread keeps its chunk column");
    const int r0 = tid / CH, c = tid % CH;
    const bool cok = c * 8 < cols_left;
    const bits16* p = g + r0 * s_row + (VEC ? c * 8 : c * 8 * s_col);  // one pointer, stepped by RS rows
    const i64 step = RS * s_row;
#pragma unroll
    for (int i = 0; i < PER; ++i, p += step) {
        const int r = r0 + i * RS;
        bits16* dst = s + r * COLS + swz<CH>(r, c) * 8;
        const bool rok = r < rows_left;
        if (VEC) {
            const bool ok = rok && cok;
            cp_async16(smem_addr(dst), ok ? p : g, ok);
        } else {
            bits16 v[8];
#pragma unroll
            for (int q = 0; q < 8; ++q) {
                const bool ok = rok && c * 8 + q < cols_left;
                v[q] = ok ? p[q * s_col] : (bits16)0;
            }
            uint4 w;
            w.x = v[0] | ((unsigned)v[1] << 16); w.y = v[2] | ((unsigned)v[3] << 16);
            w.z = v[4] | ((unsigned)v[5] << 16); w.w = v[6] | ((unsigned)v[7] << 16);
            *reinterpret_cast<uint4*>(dst) = w;
        }
    }
}

extern "C" __global__ void __launch_bounds__(NT, MIN_BLOCKS)
hgemm(const bits16* __restrict__ A, const bits16* __restrict__ B, bits16* __restrict__ C,
      const GemmParams p
#if BIAS
      , const bits16* __restrict__ bias
#endif
      ) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bits16* sA = reinterpret_cast<bits16*>(smem_raw);
    bits16* sB = sA + STAGES * A_TILE;
    const int M = (int)p.M, N = (int)p.N, K = (int)p.K;
    const i64 sam = p.sam, sak = p.sak, sbk = p.sbk, sbn = p.sbn;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    int m0, n0;
    grouped_tile(M, N, BM, BN, m0, n0);
    const int wm0 = (warp / (BN / WN)) * WM, wn0 = (warp % (BN / WN)) * WN;

    const i64 bz = p.z0 + blockIdx.z;
    const i64 b0 = bz % p.d0, b1 = (bz / p.d0) % p.d1, b2 = bz / (p.d0 * p.d1);
    const bits16* Ab = A + b2 * p.sa2 + b1 * p.sa1 + b0 * p.sa0 + (i64)m0 * sam;
    const bits16* Bb = B + b2 * p.sb2 + b1 * p.sb1 + b0 * p.sb0 + (i64)n0 * sbn;
    bits16* Cb = C + bz * (i64)M * N;

    const int ktiles = (K + BK - 1) / BK;
    auto load_stage = [&](int stage, int kt) {
        const int k0 = kt * BK;
#if A_KCONTIG
        load_tile<BM, BK, VEC_A>(sA + stage * A_TILE, Ab + (i64)k0 * sak, sam, sak, M - m0, K - k0, tid);
#else
        load_tile<BK, BM, VEC_A>(sA + stage * A_TILE, Ab + (i64)k0 * sak, sak, sam, K - k0, M - m0, tid);
#endif
#if B_NCONTIG
        load_tile<BK, BN, VEC_B>(sB + stage * B_TILE, Bb + (i64)k0 * sbk, sbk, sbn, K - k0, N - n0, tid);
#else
        load_tile<BN, BK, VEC_B>(sB + stage * B_TILE, Bb + (i64)k0 * sbk, sbn, sbk, N - n0, K - k0, tid);
#endif
    };

    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < ktiles) load_stage(s, s);
        cp_async_commit();
    }

    const int q = lane >> 3, l8 = lane & 7;
    const unsigned sA0 = smem_addr(sA), sB0 = smem_addr(sB);
    // Fragments of one k16 step of one stage: A by ldmatrix.x4 per 16 rows, B per 16 columns.
    auto load_frags = [&](unsigned (&af)[MI][4], unsigned (&bf)[NI][2], int stage, int kk) {
        const unsigned a_base = sA0 + stage * A_TILE * 2, b_base = sB0 + stage * B_TILE * 2;
#pragma unroll
        for (int i = 0; i < MI; ++i) {
#if A_KCONTIG
            const int r = wm0 + i * 16 + (q & 1) * 8 + l8, c = kk * 2 + (q >> 1);
            ldsm_x4(af[i], a_base + (r * A_COLS + swz<A_COLS / 8>(r, c) * 8) * 2);
#else
            const int r = kk * 16 + (q >> 1) * 8 + l8, c = (wm0 + i * 16) / 8 + (q & 1);
            ldsm_x4_t(af[i], a_base + (r * A_COLS + swz<A_COLS / 8>(r, c) * 8) * 2);
#endif
        }
#pragma unroll
        for (int j = 0; j < NI / 2; ++j) {
            unsigned x[4];
#if B_NCONTIG
            const int r = kk * 16 + (q & 1) * 8 + l8, c = (wn0 + j * 16) / 8 + (q >> 1);
            ldsm_x4_t(x, b_base + (r * B_COLS + swz<B_COLS / 8>(r, c) * 8) * 2);
#else
            const int r = wn0 + j * 16 + (q >> 1) * 8 + l8, c = kk * 2 + (q & 1);
            ldsm_x4(x, b_base + (r * B_COLS + swz<B_COLS / 8>(r, c) * 8) * 2);
#endif
            bf[2 * j][0] = x[0]; bf[2 * j][1] = x[1]; bf[2 * j + 1][0] = x[2]; bf[2 * j + 1][1] = x[3];
        }
    };

    // Main loop, software-pipelined twice: cp.async keeps STAGES-1 tiles in flight, and the
    // fragments of the next k16 step (of this tile, or the first of the next) are read from
    // shared memory while the tensor cores work on the current ones.
    constexpr int KS = BK / 16;
    unsigned af[2][MI][4], bf[2][NI][2];
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    load_frags(af[0], bf[0], 0, 0);
    for (int t = 0; t < ktiles; ++t) {
        const int stage = t % STAGES;
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) {
            if (kk == 0) {  // refill the stage every warp finished reading before the last barrier
                if (t + STAGES - 1 < ktiles) load_stage((t + STAGES - 1) % STAGES, t + STAGES - 1);
                cp_async_commit();
            }
            if (kk == KS - 1) {  // the next tile must have landed before its first fragments
                cp_async_wait<STAGES - 2>();
                __syncthreads();
                if (t + 1 < ktiles) load_frags(af[(kk + 1) & 1], bf[(kk + 1) & 1], (t + 1) % STAGES, 0);
            } else {
                load_frags(af[(kk + 1) & 1], bf[(kk + 1) & 1], stage, kk + 1);
            }
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NI; ++j) mma16816(acc[i][j], af[kk & 1][i], bf[kk & 1][j][0], bf[kk & 1][j][1]);
        }
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the stages: their memory stages the output

    // Epilogue: each mma tile gives a thread rows g and g+8, columns 2c and 2c+1. The warp's
    // WM x WN tile goes through shared memory (rows padded by 8 values against bank conflicts)
    // so that global stores are whole 16-byte row pieces.
    constexpr int CROW = WN + 8;
    static_assert((BM / WM) * (BN / WN) * WM * CROW <= STAGES * (A_TILE + B_TILE), "staging fits the stages");
    bits16* cs = sA + warp * WM * CROW;
    const int g = lane >> 2, c2 = (lane & 3) * 2;
#if HAS_EPILOGUE
    // the two columns of each mma tile this thread holds: the same for every row it holds
#pragma unroll
    for (int j = 0; j < NI; ++j) {
#if BIAS
        const int n = n0 + wn0 + j * 8 + c2;
        const float b0 = bias16(bias, n, N), b1 = bias16(bias, n + 1, N);
#else
        const float b0 = 0.0f, b1 = 0.0f;
#endif
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                acc[i][j][h * 2] = activate<ACT>(acc[i][j][h * 2] + b0);
                acc[i][j][h * 2 + 1] = activate<ACT>(acc[i][j][h * 2 + 1] + b1);
            }
    }
#endif
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int j = 0; j < NI; ++j)
                *reinterpret_cast<unsigned*>(cs + (i * 16 + g + h * 8) * CROW + j * 8 + c2) =
                    pack2(acc[i][j][h * 2], acc[i][j][h * 2 + 1]);
    __syncwarp();
    const bool vec = (N & 7) == 0;  // rows start 16-byte aligned
    constexpr int CPR = WN / 8;     // 16-byte pieces per row
#pragma unroll 4
    for (int it = 0; it < WM * CPR / 32; ++it) {
        const int idx = it * 32 + lane, row = idx / CPR, ch = idx % CPR;
        const int m = m0 + wm0 + row, n = n0 + wn0 + ch * 8;
        if (m >= M || n >= N) continue;
        const uint4 v = *reinterpret_cast<const uint4*>(cs + row * CROW + ch * 8);
        store8_16bit(Cb + (i64)m * N + n, v, n, N, vec);
    }
}
