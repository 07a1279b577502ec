// scaled_dot_product_attention: softmax(q k^T * scale + mask) v, as the operator's contract gives
// it (opruntime/ops/attention.py): q (Bq, Hq, L, E), k (Bk, Hk, S, E), v (Bv, Hv, S, Ev), the mask
// (Bm, Hm, Lm, Sm), each with element strides; output (b, h, i) reads q[b % Bq, h / (H / Hq), i],
// k and v likewise and mask[b % Bm, h / (H / Hm), i % Lm, j % Sm]. The launcher passes a batch,
// row or column of size 1 with stride 0, so b % Bx is b * stride and i % Lm is i * stride. The
// output is (B, H, L, Ev), C-contiguous. A row whose every key is masked gives zeros; a NaN score
// gives a NaN row. One build per (DTYPE, FAMILY, tunables); the entry point of each family:
//
//   FAMILY 1  attn_flash    FlashAttention-2 on the tensor cores, no L x S buffer (below).
//   FAMILY 2  attn_simt     the same online softmax in plain FMAs, any dtype (float64's kernel).
//   FAMILY 3  attn_softmax  the composite's masked softmax over a materialised score buffer.
//   FAMILY 4  attn_wgmma    FAMILY 1's algorithm on Hopper's warpgroup MMA (sm_90a).
//
// Defines (injected by attention.py):
//   DTYPE   0 float32, 1 float16, 2 bfloat16, 3 float64 (dtype.cuh: T and its accumulator ACC)
//   CAUSAL  1: key j is visible to query i iff j <= i (top-left)
//   MASK    0 none, 1 boolean (one byte per element, nonzero: the key takes part), 2 additive (T)
//   FAMILY 1: D, DV (E and Ev padded: multiples of 16, 8 for float32), BM, BN (query rows and
//             keys per tile), WARPS (BM / 16), VEC (1: cp.async 16-byte copies, which need a unit
//             last stride, 16-byte aligned rows and E, Ev multiples of 16 bytes; 0: element loads
//             with any strides), QREG (1: q's fragments stay in registers)
//   FAMILY 2: WARPS (4 query rows each), BN, DV (Ev padded to a multiple of 32)
//   FAMILY 3: THREADS per row
//   FAMILY 4: D, DV (padded to 64, 128 or 256), BN (64, 128), NWG (warpgroups of 64 query rows)
// opruntime-arch: sm_90a (FAMILY 4's wgmma; every other family builds for sm_80 and sm_90 too)
#include "common.cuh"

#ifndef DTYPE
#define DTYPE 1  // defaults let the file build on its own (CI compiles each variant)
#endif
#ifndef FAMILY
#define FAMILY 1
#endif
#ifndef CAUSAL
#define CAUSAL 0
#endif
#ifndef MASK
#define MASK 0
#endif

#include "dtype.cuh"
#define BF16 (DTYPE == 2)  // the 16-bit type of mma.cuh and wgmma.cuh
#include "mma.cuh"
#include "wgmma.cuh"

#define LOG2E 1.4426950408889634f

// The scalars of one launch, one kernel argument (attention.py's ctypes mirror: same order).
struct AttnParams {
    i64 sq[4];  // q's strides (elements): batch, head, row, column; 0 for a dim of size 1
    i64 sk[4];
    i64 sv[4];
    i64 sm[4];  // the mask's: 0 for a broadcast batch, head, row or column
    int B, H, L, S, E, Ev;
    int gq, gk, gv, gm;  // output heads per operand head: head h reads the operand's head h / g
    float scale_log2;    // scale * log2(e): the float kernels take exponentials in base 2
    float pad_;
    double scale;        // the scale itself (FAMILY 2 and 3)
};

#if DTYPE == 3
#define ACC_NEG_INF (-__longlong_as_double(0x7ff0000000000000LL))
__device__ __forceinline__ ACC acc_exp(ACC x) { return exp(x); }
#else
#define ACC_NEG_INF (-__int_as_float(0x7f800000))
__device__ __forceinline__ ACC acc_exp(ACC x) { return expf(x); }
#endif
#define NEG_INF (-__int_as_float(0x7f800000))
// 2^x (MUFU): 2^-inf = 0, NaN stays NaN
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// The online softmax of one key tile in the tensor-core kernels (FAMILY 1 and 4), on the scores as
// the mma accumulators lay them out: s[4 n + e] is row g + 8 (e >> 1) of the warp's 16 (first row
// wr0), key n0 + 8 n + 2 t + (e & 1), for N8 tiles of 8 keys; the quad t = 0..3 shares rows g and
// g + 8. The scores become 2^(score * scale * log2 e - m), m_r and l_r (this thread's columns of
// the row sum: summed over the quad at the end) move on, and alpha is the factor the output so far
// must take. mk, mrow, smc: the mask (MASK 1: bytes, nonzero takes part; MASK 2: additive, type M)
// and this thread's two rows of it.
//   A tile with no mask and no edge keeps its raw scores: the scale goes into ex2's FFMA (scale
//   > 0). The running max m moves only when a row's max grows by more than 8 (or from -inf): the
//   probabilities stay below 2^8 (exact in the 16-bit types' range, divided out by l at the end),
//   and alpha stays 1 while it holds, so the caller can skip rescaling the output.
template <int N8, typename M>
__device__ __forceinline__ void tile_softmax(float* s, int n0, int S, int wr0, int g, int t, float sl2, float* m_r,
                                             float* l_r, float* alpha, const M* mk, const i64* mrow, i64 smc) {
    const bool edge = n0 + 8 * N8 > S || (CAUSAL && n0 + 8 * N8 - 1 > wr0);
    const bool raw = !MASK && !edge && sl2 > 0.0f;
    if (!raw) {
#pragma unroll
        for (int n = 0; n < N8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int kc = n0 + n * 8 + 2 * t + (e & 1);
                float x = s[4 * n + e] * sl2;
#if MASK == 1
                if (kc < S && !mk[mrow[e >> 1] + kc * smc]) x = NEG_INF;
#elif MASK == 2
                if (kc < S) x = fmaf(to_acc(mk[mrow[e >> 1] + kc * smc]), LOG2E, x);
#else
                (void)mk, (void)mrow, (void)smc;
#endif
                if (edge && (kc >= S || (CAUSAL && kc > wr0 + g + (e >> 1) * 8))) x = NEG_INF;
                s[4 * n + e] = x;
            }
    }
    const float f = raw ? sl2 : 1.0f;  // s * f: the scores in base 2
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        float mx = NEG_INF;
#pragma unroll
        for (int n = 0; n < N8; ++n) mx = fmaxf(mx, fmaxf(s[4 * n + 2 * hh], s[4 * n + 2 * hh + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        mx *= f;
        alpha[hh] = 1.0f;
        if (mx - m_r[hh] > 8.0f) {  // false for NaN (both -inf): nothing seen yet, nothing moves
            alpha[hh] = ex2(m_r[hh] - mx);
            m_r[hh] = mx;
        }
        const float nbase = m_r[hh] == NEG_INF ? 0.0f : -m_r[hh];  // 2^(-inf - 0) = 0
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < N8; ++n) {
            s[4 * n + 2 * hh] = ex2(fmaf(s[4 * n + 2 * hh], f, nbase));
            s[4 * n + 2 * hh + 1] = ex2(fmaf(s[4 * n + 2 * hh + 1], f, nbase));
            sum += s[4 * n + 2 * hh] + s[4 * n + 2 * hh + 1];
        }
        l_r[hh] = l_r[hh] * alpha[hh] + sum;
    }
}

// The work items of the tiled kernels (FAMILY 1: one per block, run in launch order; FAMILY 4: taken
// from a counter by persistent blocks), so that whichever block is free takes the next: heads in
// equal groups whose k and v fit half the L2 (50 MiB), the m-blocks of a group heaviest first
// (causal: the last rows, which see the most keys), the heads of the group within an m-block. The
// blocks running at once share k and v in the L2, and the short causal items come last, where
// they fill the gaps (item w in the order: batch x head bh, m-block mb).
__device__ __forceinline__ int head_group(int BH, int S, int EEv, int isz) {
    const int most = max(1, min(BH, (int)((25ll << 20) / max(1ll, (i64)S * EEv * isz))));
    const int groups = (BH + most - 1) / most;
    return (BH + groups - 1) / groups;
}
__device__ __forceinline__ void work_item(unsigned w, int n_mb, int BH, int HG, int& bh, int& mb) {
    const unsigned per_group = (unsigned)n_mb * HG;
    const int grp = (int)(w / per_group), hg = min(HG, BH - grp * HG);
    const unsigned wi = w - grp * per_group;
    const int mi = (int)(wi / hg);
    bh = grp * HG + (int)(wi - (unsigned)mi * hg);
    mb = CAUSAL ? n_mb - 1 - mi : mi;
}

// ===============================================================================================
#if FAMILY == 1
// FlashAttention-2. One block per work item (a tile of BM query rows of one batch x head, in
// work_item's order: causal, the longest first); WARPS warps, each owning
// 16 query rows. The q tile is loaded once (its mma A fragments kept in registers when QREG); the
// key and value tiles stream through two shared-memory stages each, filled by cp.async while the
// previous tile is multiplied. Per key tile a warp computes S = q k^T with mma.sync (m16n8k16 on
// float16 / bfloat16, fp32 accumulation; float32 as three m16n8k8 TF32 products, below), scales
// it into base 2 (scale * log2 e), masks it, and updates its rows' running max m and sum l of
// 2^(s - m) in registers (online softmax: the output so far is rescaled by 2^(m_old - m_new));
// the probabilities are rounded to the input type and fed back as A fragments of P v, so S never
// leaves registers. Causal: tiles past the block's last row are never loaded, a warp skips the
// tiles past its own last row, and only tiles that cross the diagonal (or the end of the keys)
// are masked element by element. At the end each row is divided by l (l == 0, every key masked:
// zeros) and the tile is staged in shared memory for 16-byte stores.
//
// Shared memory holds rows of 16-byte chunks, padded by one chunk: row r of chunk stride
// (D / CE + 1) starts 16 * (odd) bytes further than row r - 1, so the eight rows of an ldmatrix
// (or eight threads storing one chunk each) fall in eight distinct bank groups.
//
// float32 (DTYPE 0): each operand x is split into x_hi = tf32(x) and x_lo = tf32(x - x_hi), and
// a b = a_lo b_hi + a_hi b_lo + a_hi b_hi (the dropped a_lo b_lo is about 2^-22 of a b): errors of
// plain fp32 FMAs, at tensor-core speed. ldmatrix moves 32-bit elements as pairs of 16-bit ones,
// so q and k use the same fragment addressing as the 16-bit types (two 16-byte chunks per k-step:
// 16 halves or 8 floats). P v needs v's fragments transposed, which ldmatrix cannot do for 32-bit
// elements: they are read with plain shared loads, and the keys of each 8-key step are taken in
// the order (0, 2, 4, 6, 1, 3, 5, 7) in both P and v (a sum over keys does not depend on their
// order), so that each thread's two scores of an accumulator tile are its A fragment as they lie.
// The three products of a step are issued over several n8 tiles at a time (all of the scores'
// tiles; F32_G of the output's), each product of a tile after the others' same product: the
// dependent products of one accumulator stand apart, and their order (small ones first) holds.
#if DTYPE == 3
#error "attn_flash: float16, bfloat16 (mma.sync) or float32 (3xTF32); float64 is FAMILY 2"
#endif
#ifndef D
#define D 128
#endif
#ifndef DV
#define DV D
#endif
#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 64
#endif
#ifndef WARPS
#define WARPS (BM / 16)
#endif
#ifndef VEC
#define VEC 1
#endif
#ifndef QREG
#define QREG (DTYPE != 0 && D <= 128)
#endif
#ifndef F32_G  // float32's P v: output tiles per group (a divisor of DV / 8)
#define F32_G ((DV / 8) % 8 == 0 ? 8 : (DV / 8) % 4 == 0 ? 4 : (DV / 8) % 2 == 0 ? 2 : 1)
#endif

#define NT (WARPS * 32)
constexpr int CE = 16 / (int)sizeof(T);  // elements per 16-byte chunk: 8 halves or 4 floats
constexpr int DC = D / CE, DVC = DV / CE;  // chunks per row of q / k and of v
constexpr int QS = DC + 1, VS = DVC + 1;   // row strides in chunks (one chunk of padding)
constexpr int OS = QS > VS ? QS : VS;      // the q tile's rows also stage the output
constexpr int KSTEPS = DC / 2;             // k-steps of q k^T, two chunks each
constexpr int NS = BN / 8, NO = DV / 8;    // n8 tiles of the scores and of the output, per warp

static_assert(BM == 16 * WARPS, "each warp owns 16 query rows");
static_assert(DC % 2 == 0 && DVC % 2 == 0 && BN % 16 == 0, "whole k-steps and pairs of n8 tiles");
static_assert(!(QREG && DTYPE == 0), "float32 splits q's fragments as it reads them");

#if DTYPE == 0
__device__ __forceinline__ unsigned to_tf32(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}
// x (as bits) = hi + lo, both TF32 values
__device__ __forceinline__ void split(unsigned x, unsigned& hi, unsigned& lo) {
    const float f = __uint_as_float(x);
    hi = to_tf32(f);
    lo = to_tf32(f - __uint_as_float(hi));
}
__device__ __forceinline__ void mma_tf32(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// d[n] += a * b[n] in three TF32 products (lo x hi, hi x lo, hi x hi: float32's precision), each
// product issued over all N tiles before the next, so that N independent accumulators lie between
// two dependent products (a = ah + al, b[n] = bh[n] + bl[n], as split gives them)
template <int N>
__device__ __forceinline__ void mma3_tf32(float (*d)[4], const unsigned (&ah)[4], const unsigned (&al)[4],
                                          const unsigned (*bh)[2], const unsigned (*bl)[2]) {
#pragma unroll
    for (int n = 0; n < N; ++n) mma_tf32(d[n], al, bh[n][0], bh[n][1]);
#pragma unroll
    for (int n = 0; n < N; ++n) mma_tf32(d[n], ah, bl[n][0], bl[n][1]);
#pragma unroll
    for (int n = 0; n < N; ++n) mma_tf32(d[n], ah, bh[n][0], bh[n][1]);
}
__device__ __forceinline__ unsigned lds32(unsigned addr) {
    unsigned v;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr));
    return v;
}
#endif

// Copy a ROWS x CH-chunk tile into shared memory (row stride RS chunks): element (r, c) is
// g[r * sr + c * sc]; rows from rows_left on and columns from cols on are zeros (so padded
// columns add nothing to q k^T, and keys past the end hold no NaN to multiply by 0 in P v).
template <int ROWS, int CH, int RS>
__device__ __forceinline__ void load_tile(uint4* s, const T* g, i64 sr, i64 sc, int rows_left, int cols, int tid) {
    constexpr int TOTAL = ROWS * CH, ITER = (TOTAL + NT - 1) / NT;
    if constexpr (NT % CH == 0 && TOTAL % NT == 0) {
        // each thread keeps one chunk column and steps down the rows: one pointer, one add per copy
        constexpr int STEP = NT / CH;
        const int r0 = tid / CH, c = tid - r0 * CH;
        const bool cok = c * CE < cols;
#if VEC
        const T* src = g + (i64)r0 * sr + c * CE;
        const i64 step = STEP * sr;
        const unsigned dst = smem_addr(s + r0 * RS + c);
#pragma unroll
        for (int it = 0; it < ITER; ++it, src += step) {
            const bool ok = cok && r0 + it * STEP < rows_left;
            cp_async16(dst + it * STEP * RS * 16, ok ? src : g, ok);
        }
        (void)sc;
#else
#pragma unroll 1
        for (int it = 0; it < ITER; ++it) {  // element loads: one chunk at a time (registers)
            const int r = r0 + it * STEP;
            union {
                uint4 u;
                T e[CE];
            } w;
#pragma unroll
            for (int q = 0; q < CE; ++q) {
                const int col = c * CE + q;
                w.e[q] = (r < rows_left && col < cols) ? g[(i64)r * sr + (i64)col * sc] : (T)0;
            }
            s[r * RS + c] = w.u;
        }
        (void)cok;
#endif
    } else {
#if VEC
#pragma unroll
#else
#pragma unroll 1
#endif
        for (int it = 0; it < ITER; ++it) {
            const int idx = it * NT + tid;
            if (TOTAL % NT != 0 && idx >= TOTAL) break;
            const int r = idx / CH, c = idx - r * CH;
            uint4* dst = s + r * RS + c;
            const bool rok = r < rows_left;
#if VEC
            const bool ok = rok && c * CE < cols;
            cp_async16(smem_addr(dst), ok ? g + (i64)r * sr + c * CE : g, ok);
            (void)sc;
#else
            union {
                uint4 u;
                T e[CE];
            } w;
#pragma unroll
            for (int q = 0; q < CE; ++q) {
                const int col = c * CE + q;
                w.e[q] = (rok && col < cols) ? g[(i64)r * sr + (i64)col * sc] : (T)0;
            }
            *dst = w.u;
#endif
        }
    }
}

extern "C" __global__ void __launch_bounds__(NT, 1)
attn_flash(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V, const void* __restrict__ M,
           T* __restrict__ O, const AttnParams p) {
    extern __shared__ __align__(128) uint4 smem[];
    uint4* sQ = smem;              // BM x OS chunks: the q tile, then the output tile
    uint4* sK = sQ + BM * OS;      // two stages of BN x QS
    uint4* sV = sK + 2 * BN * QS;  // two stages of BN x VS
    const unsigned sQa = smem_addr(sQ), sKa = smem_addr(sK), sVa = smem_addr(sV);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3, quad = lane >> 3, l8 = lane & 7;
    const int L = p.L, S = p.S;
    int bh, mb;  // the block's work item (work_item: causal, the longest rows first)
    work_item(blockIdx.x, (L + BM - 1) / BM, p.B * p.H, head_group(p.B * p.H, S, p.E + p.Ev, sizeof(T)), bh, mb);
    const int m0 = mb * BM, wr0 = m0 + warp * 16;  // the block's and the warp's first query row
    const int n_end = CAUSAL ? min(S, m0 + BM) : S;
    const int nt = (n_end + BN - 1) / BN;
    const float sl2 = p.scale_log2;
#if MASK == 1
    const unsigned char* mk = reinterpret_cast<const unsigned char*>(M);
#elif MASK == 2
    const T* mk = reinterpret_cast<const T*>(M);
#else
    (void)M;
#endif

    const int b = bh / p.H, h = bh - b * p.H;
    const T* q = Q + b * p.sq[0] + (h / p.gq) * p.sq[1] + (i64)m0 * p.sq[2];
    const T* k = K + b * p.sk[0] + (h / p.gk) * p.sk[1];
    const T* v = V + b * p.sv[0] + (h / p.gv) * p.sv[1];
#if MASK
    i64 mrow[2];  // the mask's rows of this thread's two query rows (rows past L read row L - 1)
    {
        const i64 base = b * p.sm[0] + (h / p.gm) * p.sm[1];
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) mrow[hh] = base + (i64)min(wr0 + g + hh * 8, L - 1) * p.sm[2];
    }
    const i64 smc = p.sm[3];
#endif
    // cp.async groups, in order: (q, k0), v0, then per tile j: k[j+1], v[j+1] (empty past the
    // end, so that "wait until at most 2 are pending" always means the one before them).
    load_tile<BM, DC, QS>(sQ, q, p.sq[2], p.sq[3], L - m0, p.E, tid);
    load_tile<BN, DC, QS>(sK, k, p.sk[2], p.sk[3], S, p.E, tid);
    cp_async_commit();
    load_tile<BN, DVC, VS>(sV, v, p.sv[2], p.sv[3], S, p.Ev, tid);
    cp_async_commit();

    float acc[NO][4];
#pragma unroll
    for (int n = 0; n < NO; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;
    float m_r[2] = {NEG_INF, NEG_INF}, l_r[2] = {0.0f, 0.0f};
#if QREG
    unsigned qf[KSTEPS][4];
#endif
    // this thread's ldmatrix row of the warp's q rows (A fragments: matrices rows 0-7 / 8-15
    // x chunks 2kk / 2kk + 1)
    const unsigned qaddr = sQa + ((warp * 16 + (quad & 1) * 8 + l8) * QS + (quad >> 1)) * 16;

    for (int j = 0; j < nt; ++j) {
        const int n0 = j * BN;
        if (j + 1 < nt)
            load_tile<BN, DC, QS>(sK + ((j + 1) & 1) * BN * QS, k + (i64)(n0 + BN) * p.sk[2], p.sk[2], p.sk[3],
                                  S - n0 - BN, p.E, tid);
        cp_async_commit();
        cp_async_wait<2>();  // q and k[j] have landed
        __syncthreads();     // ... for every thread; and every warp is done with v[j - 1]
        if (j + 1 < nt)
            load_tile<BN, DVC, VS>(sV + ((j + 1) & 1) * BN * VS, v + (i64)(n0 + BN) * p.sv[2], p.sv[2],
                                   p.sv[3], S - n0 - BN, p.Ev, tid);
        cp_async_commit();
#if QREG
        if (j == 0) {
#pragma unroll
            for (int kk = 0; kk < KSTEPS; ++kk) ldsm_x4(qf[kk], qaddr + kk * 32);
        }
#endif
        // causal: a warp whose rows all end before this tile has nothing to do in it
        const bool active = !CAUSAL || n0 <= wr0 + 15;
        float s[NS][4];
        if (active) {
#pragma unroll
            for (int n = 0; n < NS; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[n][e] = 0.0f;
            // -- S = q k^T: B fragments of two n8 tiles per ldmatrix.x4 (rows: keys; chunks: k)
            const unsigned kaddr = sKa + (((j & 1) * BN + (quad >> 1) * 8 + l8) * QS + (quad & 1)) * 16;
#if QREG
#pragma unroll
#elif DTYPE == 0
#pragma unroll 1
#else
#pragma unroll 2
#endif
            for (int kk = 0; kk < KSTEPS; ++kk) {
                unsigned a[4];
#if QREG
#pragma unroll
                for (int e = 0; e < 4; ++e) a[e] = qf[kk][e];
#else
                ldsm_x4(a, qaddr + kk * 32);
#endif
#if DTYPE == 0
                unsigned ah[4], al[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) split(a[e], ah[e], al[e]);
                // every n8 tile's B fragments split first, then each of the three products
                // over all NS tiles: NS independent accumulators between dependent products
                unsigned bh[NS][2], bl[NS][2];
#pragma unroll
                for (int j2 = 0; j2 < NS / 2; ++j2) {
                    unsigned x[4];
                    ldsm_x4(x, kaddr + (j2 * 16 * QS + kk * 2) * 16);
#pragma unroll
                    for (int e = 0; e < 4; ++e) split(x[e], bh[2 * j2 + (e >> 1)][e & 1], bl[2 * j2 + (e >> 1)][e & 1]);
                }
                mma3_tf32<NS>(s, ah, al, bh, bl);
#else
#pragma unroll
                for (int j2 = 0; j2 < NS / 2; ++j2) {
                    unsigned x[4];
                    ldsm_x4(x, kaddr + (j2 * 16 * QS + kk * 2) * 16);
                    mma16816(s[2 * j2], a, x[0], x[1]);
                    mma16816(s[2 * j2 + 1], a, x[2], x[3]);
                }
#endif
            }
            // -- the online softmax (tile_softmax): s[n][e] is its s[4 n + e]
            float alpha[2];
#if MASK
            tile_softmax<NS>(&s[0][0], n0, S, wr0, g, t, sl2, m_r, l_r, alpha, mk, mrow, smc);
#else
            tile_softmax<NS, unsigned char>(&s[0][0], n0, S, wr0, g, t, sl2, m_r, l_r, alpha, nullptr, nullptr, 0);
#endif
#pragma unroll
            for (int hh = 0; hh < 2; ++hh)
                if (alpha[hh] != 1.0f) {
#pragma unroll
                    for (int n = 0; n < NO; ++n) {
                        acc[n][2 * hh] *= alpha[hh];
                        acc[n][2 * hh + 1] *= alpha[hh];
                    }
                }
        }
        cp_async_wait<2>();  // v[j] has landed
        __syncthreads();     // ... for every thread; and every warp is done with k[j]
        if (active) {
            // -- O += P v
#if DTYPE == 0
            // Per n8 tile of the output, the tile of keys is summed in a zeroed accumulator and
            // then added to the output with one rounded FADD: the tensor cores truncate as they
            // accumulate, a bias that over S = 32768 keys reached 2e-4 when every product went
            // straight into the output; per tile of keys it stays under 1e-6.
            unsigned ph[NS][4], pl[NS][4];  // P = ph + pl as A fragments: keys 2t and 2t+1 of each step
#pragma unroll
            for (int kk = 0; kk < NS; ++kk) {
                split(__float_as_uint(s[kk][0]), ph[kk][0], pl[kk][0]);
                split(__float_as_uint(s[kk][2]), ph[kk][1], pl[kk][1]);
                split(__float_as_uint(s[kk][1]), ph[kk][2], pl[kk][2]);
                split(__float_as_uint(s[kk][3]), ph[kk][3], pl[kk][3]);
            }
            // row 2 t, column g of the stage (bytes); 8 keys per step, in the order 0 2 4 6 1 3 5 7
            const unsigned vaddr = sVa + ((j & 1) * BN * VS + 2 * t * VS) * 16 + g * 4;
            // F32_G output tiles at a time: each product issued over the group, so that
            // F32_G independent accumulators lie between two dependent products
#pragma unroll
            for (int n0 = 0; n0 < NO; n0 += F32_G) {
                float part[F32_G][4];
#pragma unroll
                for (int gi = 0; gi < F32_G; ++gi)
#pragma unroll
                    for (int e = 0; e < 4; ++e) part[gi][e] = 0.0f;
#pragma unroll
                for (int kk = 0; kk < NS; ++kk) {
                    unsigned vh[F32_G][2], vl[F32_G][2];
#pragma unroll
                    for (int gi = 0; gi < F32_G; ++gi) {
                        const unsigned vr = vaddr + kk * 8 * (VS * 16) + (n0 + gi) * 32;
                        split(lds32(vr), vh[gi][0], vl[gi][0]);
                        split(lds32(vr + VS * 16), vh[gi][1], vl[gi][1]);
                    }
                    mma3_tf32<F32_G>(part, ph[kk], pl[kk], vh, vl);
                }
#pragma unroll
                for (int gi = 0; gi < F32_G; ++gi)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[n0 + gi][e] += part[gi][e];
            }
#else
            const unsigned vaddr = sVa + (((j & 1) * BN + (quad & 1) * 8 + l8) * VS + (quad >> 1)) * 16;
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) {
                const unsigned a[4] = {pack2(s[2 * kk][0], s[2 * kk][1]), pack2(s[2 * kk][2], s[2 * kk][3]),
                                       pack2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                       pack2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
                for (int j2 = 0; j2 < NO / 2; ++j2) {
                    unsigned x[4];
                    ldsm_x4_t(x, vaddr + (kk * 16 * VS + j2 * 2) * 16);
                    mma16816(acc[2 * j2], a, x[0], x[1]);
                    mma16816(acc[2 * j2 + 1], a, x[2], x[3]);
                }
            }
#endif
        }
    }
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the q tile: its rows stage the output

    // -- epilogue: divide by l (0 when every key was masked), stage, 16-byte stores
    float inv[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        float l = l_r[hh];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        inv[hh] = l == 0.0f ? 0.0f : 1.0f / l;
    }
    T* st = reinterpret_cast<T*>(sQ + warp * 16 * OS);  // the warp's 16 rows, OS * CE elements apart
#pragma unroll
    for (int n = 0; n < NO; ++n)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            T* d = st + (g + hh * 8) * (OS * CE) + n * 8 + 2 * t;
#if DTYPE == 0
            *reinterpret_cast<float2*>(d) = make_float2(acc[n][2 * hh] * inv[hh], acc[n][2 * hh + 1] * inv[hh]);
#else
            *reinterpret_cast<unsigned*>(d) = pack2(acc[n][2 * hh] * inv[hh], acc[n][2 * hh + 1] * inv[hh]);
#endif
        }
    __syncwarp();
    const int Ev = p.Ev;
    const bool vec_out = Ev % CE == 0;  // rows start 16-byte aligned
    T* out = O + ((i64)bh * L + wr0) * Ev;
    for (int idx = lane; idx < 16 * DVC; idx += 32) {
        const int row = idx / DVC, c = idx - row * DVC;
        if (wr0 + row >= L || c * CE >= Ev) continue;
        const T* src = st + row * (OS * CE) + c * CE;
        T* dst = out + (i64)row * Ev + c * CE;
        if (vec_out) {
            *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
        } else {
#pragma unroll
            for (int e = 0; e < CE; ++e)
                if (c * CE + e < Ev) dst[e] = src[e];
        }
    }
}

// ===============================================================================================
#elif FAMILY == 2
// The online softmax in plain FMAs, for float64 (and any dtype: every stride, every size). One
// block per (tile of BM = 4 WARPS query rows, batch x head); the q tile, one key tile and one
// value tile in shared memory as ACC (rows padded to an odd stride). Per key tile: every thread
// computes BM * BN / threads scores (a dot product over E from shared memory); each warp then
// takes its 4 rows: scale, mask, the running max and sum (warp shuffles), the probabilities back
// in place; and accumulates P v for its 4 rows, each lane owning the columns lane + 32 c of Ev.
#ifndef WARPS
#define WARPS 4
#endif
#ifndef BN
#define BN 32
#endif
#ifndef DV
#define DV 32
#endif
#define NT (WARPS * 32)
#define RPW 4              // query rows per warp
#define BM (WARPS * RPW)
#define OC (DV / 32)       // output columns per lane
static_assert(DV % 32 == 0 && NT % BN == 0, "whole columns per lane, whole rows of scores per pass");

extern "C" __global__ void __launch_bounds__(NT)
attn_simt(const T* __restrict__ Q, const T* __restrict__ K, const T* __restrict__ V, const void* __restrict__ M,
          T* __restrict__ O, const AttnParams p) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int E = p.E, Ev = p.Ev, L = p.L, S = p.S;
    const int ES = E | 1, PS = BN + 1;  // odd row strides
    ACC* sQ = reinterpret_cast<ACC*>(smem_raw);  // BM x ES
    ACC* sK = sQ + BM * ES;                      // BN x ES
    ACC* sV = sK + BN * ES;                      // BN x DV
    ACC* sP = sV + BN * DV;                      // BM x PS: scores, then probabilities
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int mb = CAUSAL ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x;
    const int m0 = mb * BM;
    const int n_end = CAUSAL ? min(S, m0 + BM) : S;
    const ACC scale = (ACC)p.scale;
#if MASK == 1
    const unsigned char* mk = reinterpret_cast<const unsigned char*>(M);
#elif MASK == 2
    const T* mk = reinterpret_cast<const T*>(M);
#else
    (void)M;
#endif

    for (int bh = blockIdx.y; bh < p.B * p.H; bh += gridDim.y) {
        const int b = bh / p.H, h = bh - b * p.H;
        const T* q = Q + b * p.sq[0] + (h / p.gq) * p.sq[1];
        const T* k = K + b * p.sk[0] + (h / p.gk) * p.sk[1];
        const T* v = V + b * p.sv[0] + (h / p.gv) * p.sv[1];
#if MASK
        const i64 mbase = b * p.sm[0] + (h / p.gm) * p.sm[1];
#endif
        __syncthreads();  // the previous (batch, head) is done with shared memory
        for (int idx = tid; idx < BM * E; idx += NT) {
            const int r = idx / E, e = idx - r * E;
            sQ[r * ES + e] = m0 + r < L ? to_acc(q[(i64)(m0 + r) * p.sq[2] + e * p.sq[3]]) : (ACC)0;
        }
        ACC o[RPW][OC], m_r[RPW], l_r[RPW];
#pragma unroll
        for (int rr = 0; rr < RPW; ++rr) {
            m_r[rr] = ACC_NEG_INF;
            l_r[rr] = 0;
#pragma unroll
            for (int c = 0; c < OC; ++c) o[rr][c] = 0;
        }
        for (int n0 = 0; n0 < n_end; n0 += BN) {
            __syncthreads();  // every warp is done with the last tiles
            for (int idx = tid; idx < BN * E; idx += NT) {
                const int r = idx / E, e = idx - r * E;
                sK[r * ES + e] = n0 + r < S ? to_acc(k[(i64)(n0 + r) * p.sk[2] + e * p.sk[3]]) : (ACC)0;
            }
            for (int idx = tid; idx < BN * DV; idx += NT) {
                const int r = idx / DV, c = idx - r * DV;
                sV[idx] = n0 + r < S && c < Ev ? to_acc(v[(i64)(n0 + r) * p.sv[2] + c * p.sv[3]]) : (ACC)0;
            }
            __syncthreads();
            for (int idx = tid; idx < BM * BN; idx += NT) {
                const int r = idx / BN, c = idx - r * BN;
                const ACC* qr = sQ + r * ES;
                const ACC* kr = sK + c * ES;
                ACC dot = 0;
                for (int e = 0; e < E; ++e) dot = fma(qr[e], kr[e], dot);
                sP[r * PS + c] = dot;
            }
            __syncthreads();
#pragma unroll
            for (int rr = 0; rr < RPW; ++rr) {
                const int r = warp * RPW + rr, i = m0 + r;
#if MASK
                const i64 mrow = mbase + (i64)min(i, L - 1) * p.sm[2];
#endif
                ACC mx = ACC_NEG_INF;
                for (int c = lane; c < BN; c += 32) {
                    const int kc = n0 + c;
                    ACC x = sP[r * PS + c] * scale;
#if MASK == 1
                    if (kc < S && !mk[mrow + kc * p.sm[3]]) x = ACC_NEG_INF;
#elif MASK == 2
                    if (kc < S) x += to_acc(mk[mrow + kc * p.sm[3]]);
#endif
                    if (kc >= S || (CAUSAL && kc > i)) x = ACC_NEG_INF;
                    sP[r * PS + c] = x;
                    mx = fmax(mx, x);
                }
                mx = fmax(m_r[rr], warp_max(mx));
                const ACC base = mx == ACC_NEG_INF ? (ACC)0 : mx;
                const ACC alpha = acc_exp(m_r[rr] - base);
                m_r[rr] = mx;
                ACC sum = 0;
                for (int c = lane; c < BN; c += 32) {
                    const ACC e = acc_exp(sP[r * PS + c] - base);
                    sP[r * PS + c] = e;
                    sum += e;
                }
                l_r[rr] = l_r[rr] * alpha + warp_sum(sum);
#pragma unroll
                for (int c = 0; c < OC; ++c) o[rr][c] *= alpha;
            }
            __syncwarp();  // this warp's rows of P are written (no other warp reads them)
            for (int c = 0; c < BN; ++c) {
                ACC vc[OC];
#pragma unroll
                for (int oc = 0; oc < OC; ++oc) vc[oc] = sV[c * DV + oc * 32 + lane];
#pragma unroll
                for (int rr = 0; rr < RPW; ++rr) {
                    const ACC pr = sP[(warp * RPW + rr) * PS + c];
#pragma unroll
                    for (int oc = 0; oc < OC; ++oc) o[rr][oc] = fma(pr, vc[oc], o[rr][oc]);
                }
            }
        }
#pragma unroll
        for (int rr = 0; rr < RPW; ++rr) {
            const int i = m0 + warp * RPW + rr;
            if (i >= L) continue;
            const ACC inv = l_r[rr] == 0 ? (ACC)0 : (ACC)1 / l_r[rr];
            T* out = O + ((i64)bh * L + i) * Ev;
#pragma unroll
            for (int oc = 0; oc < OC; ++oc) {
                const int col = oc * 32 + lane;
                if (col < Ev) out[col] = from_acc(o[rr][oc] * inv);
            }
        }
    }
}

// ===============================================================================================
#elif FAMILY == 3
// The composite's softmax: one block per row of the score buffer X (B x H x L rows of S scores,
// C-contiguous, ACC), rewritten in place as probabilities: x * scale, the mask and the causal
// cut applied as the flash kernel applies them; an online max and sum in one pass (per thread,
// then merged across the block), the probabilities in a second pass. A row with every key masked
// gives zeros; a NaN gives a NaN row.
#ifndef THREADS
#define THREADS 256
#endif

__device__ __forceinline__ void merge_stats(ACC& m, ACC& l, ACC m2, ACC l2) {
    const ACC mn = fmax(m, m2);
    if (mn != ACC_NEG_INF) l = l * acc_exp(m - mn) + l2 * acc_exp(m2 - mn);
    else l = l + l2;  // both empty (0), or NaN carried
    m = mn;
}

extern "C" __global__ void __launch_bounds__(THREADS)
attn_softmax(ACC* __restrict__ X, const void* __restrict__ M, const AttnParams p) {
    __shared__ ACC red_m[THREADS / 32], red_l[THREADS / 32];
    const i64 row = blockIdx.x;
    const int L = p.L, S = p.S;
    const i64 bh = row / L;
    const int i = (int)(row - bh * L), b = (int)(bh / p.H), h = (int)(bh - (i64)b * p.H);
    ACC* x = X + row * S;
    const int visible = CAUSAL ? min(S, i + 1) : S;
    const ACC scale = (ACC)p.scale;
#if MASK == 1
    const unsigned char* mk = reinterpret_cast<const unsigned char*>(M) + b * p.sm[0] + (h / p.gm) * p.sm[1] +
                              i * p.sm[2];
#elif MASK == 2
    const T* mk = reinterpret_cast<const T*>(M) + b * p.sm[0] + (h / p.gm) * p.sm[1] + i * p.sm[2];
#else
    (void)M;
    (void)b;
    (void)h;
#endif
    auto score = [&](int c) -> ACC {
        if (c >= visible) return ACC_NEG_INF;
        ACC s = x[c] * scale;
#if MASK == 1
        if (!mk[c * p.sm[3]]) s = ACC_NEG_INF;
#elif MASK == 2
        s += to_acc(mk[c * p.sm[3]]);
#endif
        return s;
    };
    ACC m = ACC_NEG_INF, l = 0;
    for (int c = threadIdx.x; c < S; c += THREADS) {
        const ACC s = score(c);
        if (s == ACC_NEG_INF) continue;
        if (s > m) {
            l = l * acc_exp(m - s) + (ACC)1;
            m = s;
        } else {
            l += acc_exp(s - m);  // NaN: carried into l
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) merge_stats(m, l, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, l, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        red_m[warp] = m;
        red_l[warp] = l;
    }
    __syncthreads();
    m = red_m[0];
    l = red_l[0];
#pragma unroll
    for (int w = 1; w < THREADS / 32; ++w) merge_stats(m, l, red_m[w], red_l[w]);
    const ACC inv = l == 0 ? (ACC)0 : (ACC)1 / l;
    const ACC base = m == ACC_NEG_INF ? (ACC)0 : m;
    for (int c = threadIdx.x; c < S; c += THREADS) x[c] = acc_exp(score(c) - base) * inv;
}
// ===============================================================================================
#elif FAMILY == 4
// FlashAttention with Hopper's warpgroup MMA (wgmma, sm_90a; other targets build a trap), warp
// specialised as FlashAttention-3. Persistent blocks (one per SM) take work items (a tile of BM = 64
// NWG query rows of one batch x head) in turn; each block is a producer warpgroup and NWG consumer
// warpgroups of 64 query rows each, and the next item's q and k tiles load while the consumers
// finish the last one.
//   Producer: copies the q tile and the k and v tiles with cp.async, in the 128-byte swizzle the
//   descriptors name (matmul_wgmma.cu's conventions: rows of 64 elements, chunk c of row r at
//   c ^ (r % 8), 64-wide atoms of the head dim one after another), into two stages each for k
//   and v. Each copy ends with cp.async.mbarrier.arrive on the stage's "full" barrier; before
//   refilling a stage it waits on its "empty" barrier. It gives its registers to the consumers.
//   Consumers: per key tile, S = q k^T with m64nBNk16 (both operands in shared memory), the
//   online softmax in registers (per warp the accumulator layout of the mma.sync kernel: rows g
//   and g + 8, columns 2 t, 2 t + 1 of each n8 tile), and O += P v with m64nDVk16, P from
//   registers as A fragments, v read n-contiguous and transposed by the instruction. Two overlaps
//   keep the tensor cores busy: within a warpgroup, the scores of tile j + 1 and P v of tile j
//   are issued together and the softmax of tile j + 1 runs while P v is multiplied; between the
//   two warpgroups (NWG 2), named barriers take turns at issuing, so one warpgroup's softmax runs
//   while the other's products are on the tensor cores. Each stage is released (an arrive on its
//   "empty" barrier) as soon as the product that reads it has landed. Causal: tiles past the
//   block's last row are never loaded; both warpgroups run the same tiles (their turns alternate)
//   and the diagonal is masked element by element. The output is written from the registers.
// Needs 16-byte copies (unit last strides, aligned rows); head dims padded to 64, 128 or 256.
#if DTYPE != 1 && DTYPE != 2
#error "attn_wgmma: float16 or bfloat16"
#endif
#ifndef D
#define D 128
#endif
#ifndef DV
#define DV D
#endif
#ifndef BN
#define BN 128
#endif
#ifndef NWG
#define NWG 2
#endif
#define BM (64 * NWG)
#define PT 128                      // producer threads
#define NT ((NWG + 1) * 128)
static_assert(D % 64 == 0 && DV % 64 == 0 && D <= 256 && DV <= 256, "64-wide atoms of the head dims");
static_assert(BN == 64 || BN == 128 || BN == 256, "one m64nBNk16 per k-step of S");
static_assert(NWG == 1 || NWG == 2, "64 or 128 query rows per block");
#define QA (D / 64)                 // 64-wide atoms of q / k rows
#define VA (DV / 64)                // ... and of v rows
#define Q_BYTES (BM * D * 2)        // the q tile (a multiple of 1024)
#define K_BYTES (BN * D * 2)        // one stage of k
#define V_BYTES (BN * DV * 2)       // one stage of v

// ROWS rows of ATOMS x 64 elements into the swizzled layout, by the PT producer threads: atom a at
// a * ROWS * 128 bytes, row r at r * 128, chunk c at (c ^ (r % 8)) * 16; rows from rows_left on and
// columns from cols on are zeros. Row r of the source starts at g + r * sr (unit column stride).
template <int ROWS, int ATOMS>
__device__ __forceinline__ void load_swizzled(unsigned s, const bits16* g, i64 sr, int rows_left, int cols, int tid) {
    constexpr int CH = ATOMS * 8, STEP = PT / CH, ITER = ROWS * CH / PT;
    static_assert(PT % CH == 0 && (ROWS * CH) % PT == 0, "whole rows per pass");
    const int r0 = tid / CH, c = tid - r0 * CH;
    const bool cok = c * 8 < cols;
    const bits16* src = g + (i64)r0 * sr + c * 8;
    const unsigned dst = s + (c >> 3) * ROWS * 128;
#pragma unroll 4  // not whole: the producer keeps its registers few
    for (int it = 0; it < ITER; ++it, src += STEP * sr) {
        const int r = r0 + it * STEP;
        const bool ok = cok && r < rows_left;
        cp_async16(dst + r * 128 + (((c & 7) ^ (r & 7)) << 4), ok ? src : g, ok);
    }
}

extern "C" __global__ void __launch_bounds__(NT, 1)
attn_wgmma(const bits16* __restrict__ Q, const bits16* __restrict__ K, const bits16* __restrict__ V,
           const void* __restrict__ M, bits16* __restrict__ O, unsigned* __restrict__ next_item, const AttnParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    // descriptors address 1024-byte swizzle atoms: align the tiles by hand
    const unsigned raw = smem_addr(smem_raw);
    const unsigned sQ = (raw + 1023) & ~1023u, sK = sQ + Q_BYTES, sV = sK + 2 * K_BYTES, bars = sV + 2 * V_BYTES;
    // mbarriers (8 bytes each): q full / empty, then k full, k empty, v full, v empty of each stage
    const unsigned q_full = bars, q_empty = bars + 8;
#define K_FULL(st) (bars + 16 + 8 * (st))
#define K_EMPTY(st) (bars + 32 + 8 * (st))
#define V_FULL(st) (bars + 48 + 8 * (st))
#define V_EMPTY(st) (bars + 64 + 8 * (st))
    // the work items' order: the producer takes each from the counter and hands it to the
    // consumers in slot qi & 1 (two words after the barrier item_full, one arrival per item)
    const unsigned item_full = bars + 80, slots = bars + 88;
    const int tid = threadIdx.x;
    if (tid == 0) {
        mbar_init(item_full, 1);
        mbar_init(q_full, PT);
        mbar_init(q_empty, NWG * 4);  // one arrive per consumer warp
#pragma unroll
        for (int st = 0; st < 2; ++st) {
            mbar_init(K_FULL(st), PT);
            mbar_init(V_FULL(st), PT);
            mbar_init(K_EMPTY(st), NWG * 4);
            mbar_init(V_EMPTY(st), NWG * 4);
        }
    }
    __syncthreads();
    const int L = p.L, S = p.S;
    const int n_mb = (L + BM - 1) / BM, BH = p.B * p.H;
    const int HG = head_group(BH, S, p.E + p.Ev, 2);
    const unsigned items = (unsigned)n_mb * BH;
    // work item w (work_item): its batch x head, first row and key tiles
    auto item = [&](unsigned w, int& bh, int& m0, int& nt) {
        int mb;
        work_item(w, n_mb, BH, HG, bh, mb);
        m0 = mb * BM;
        nt = ((CAUSAL ? min(S, m0 + BM) : S) + BN - 1) / BN;
    };

    if (tid < PT) {
        // ---- producer
#if NWG == 2
        setmaxnreg_dec<40>();
#endif
        // Items are handed out by a counter (greedy: a block that finishes early takes the next,
        // heaviest first within a group of heads), not by a fixed stride (causal items differ
        // in length: a fixed stride left some blocks 20-30% more work than the mean). The
        // counter's next value is fetched one item ahead; every block's last fetch is past the
        // end, and the block whose fetch is the very last of the launch sets it back to 0.
        unsigned nxt = 0;
        if (tid == 0) nxt = atomicAdd(next_item, 1u);
        int it = 0;  // tiles issued by this block (stage it & 1, its use (it >> 1) & 1 of the stage)
        for (int qi = 0;; ++qi) {
            mbar_wait(q_empty, (qi & 1) ^ 1);  // the previous item is done with q (and read its slot)
            if (tid == 0) {
                st_shared_u32(slots + 4 * (qi & 1), nxt);
                mbar_arrive(item_full);
                if (nxt < items)
                    nxt = atomicAdd(next_item, 1u);
                else if (nxt == items + gridDim.x - 1)
                    atomicExch(next_item, 0u);  // every other fetch of this launch came before
            }
            named_bar_sync(3, PT);  // the producer's threads read the slot
            const unsigned w = ld_shared_u32(slots + 4 * (qi & 1));
            if (w >= items) break;
            int bh, m0, nt;
            item(w, bh, m0, nt);
            const int b = bh / p.H, h = bh - b * p.H;
            const bits16* q = Q + b * p.sq[0] + (h / p.gq) * p.sq[1] + (i64)m0 * p.sq[2];
            const bits16* k = K + b * p.sk[0] + (h / p.gk) * p.sk[1];
            const bits16* v = V + b * p.sv[0] + (h / p.gv) * p.sv[1];
            load_swizzled<BM, QA>(sQ, q, p.sq[2], L - m0, p.E, tid);
            cp_async_arrive_noinc(q_full);
            for (int j = 0; j < nt; ++j, ++it) {
                const int st = it & 1, free = ((it >> 1) & 1) ^ 1;
                mbar_wait(K_EMPTY(st), free);
                load_swizzled<BN, QA>(sK + st * K_BYTES, k + (i64)j * BN * p.sk[2], p.sk[2], S - j * BN, p.E, tid);
                cp_async_arrive_noinc(K_FULL(st));
                mbar_wait(V_EMPTY(st), free);
                load_swizzled<BN, VA>(sV + st * V_BYTES, v + (i64)j * BN * p.sv[2], p.sv[2], S - j * BN, p.Ev, tid);
                cp_async_arrive_noinc(V_FULL(st));
            }
        }
        cp_async_wait<0>();
        return;
    }

    // ---- consumers
#if NWG == 2
    setmaxnreg_inc<232>();
#endif
    const int ctid = tid - PT, lane = tid & 31, cw = ctid >> 5, c = ctid >> 7;  // consumer thread, warp, warpgroup
    const int g = lane >> 2, t = lane & 3;
    const float sl2 = p.scale_log2;
#if MASK == 1
    const unsigned char* mk = reinterpret_cast<const unsigned char*>(M);
#elif MASK == 2
    const bits16* mk = reinterpret_cast<const bits16*>(M);
#else
    (void)M;
#endif
    const unsigned qbase = sQ + c * 64 * 128;
    float o[DV / 2], s[BN / 2], m_r[2], l_r[2], alpha[2];
    unsigned pa[BN / 16][4];

    // turns at the tensor cores (NWG 2): warpgroup c waits for barrier 1 + c before issuing its
    // products and then lets the other one go; warpgroup 0 goes first
    auto turn_wait = [&]() {
#if NWG == 2
        named_bar_sync(1 + c, 256);
#endif
    };
    auto turn_pass = [&]() {
#if NWG == 2
        named_bar_arrive(2 - c, 256);
#endif
    };
#if NWG == 2
    if (c == 1) named_bar_arrive(1, 256);
#endif
    // stage bookkeeping of tile it: its stage and the parity of that stage's fill
    auto wait_full = [&](unsigned bar, int it) {
        mbar_wait(bar, (it >> 1) & 1);
        fence_proxy_async();  // the producer's copies, seen through the barrier, for the tensor cores
    };
    auto release = [&](unsigned bar) {
        __syncwarp();
        if (lane == 0) mbar_arrive(bar);
    };
    // S = q k^T into s (stage st), asynchronously, within the current wgmma group
    auto issue_scores = [&](int st) {
        const unsigned kbase = sK + st * K_BYTES;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
            wgmma_ss<BN>(s, desc(qbase + (kk >> 2) * BM * 128 + (kk & 3) * 32, 16, 1024),
                         desc(kbase + (kk >> 2) * BN * 128 + (kk & 3) * 32, 16, 1024), kk);
    };
    auto issue_pv = [&](int st) {
        const unsigned vbase = sV + st * V_BYTES;
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) wgmma_rs<DV>(o, pa[kk], desc(vbase + kk * 16 * 128, BN * 128, 1024));
    };
#if MASK
    i64 mrow[2];
    i64 smc = 0;
#endif
    // the online softmax of key tile j (landed in s): tile_softmax
    auto softmax_tile = [&](int j, int wr0) {
#if MASK
        tile_softmax<BN / 8>(s, j * BN, S, wr0, g, t, sl2, m_r, l_r, alpha, mk, mrow, smc);
#else
        tile_softmax<BN / 8, unsigned char>(s, j * BN, S, wr0, g, t, sl2, m_r, l_r, alpha, nullptr, nullptr, 0);
#endif
    };
    // the output so far times alpha, and the probabilities as the A fragments of P v
    auto rescale_and_pack = [&]() {
        if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
            for (int n = 0; n < DV / 8; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) o[4 * n + e] *= alpha[e >> 1];
        }
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
            for (int i = 0; i < 4; ++i) pa[kk][i] = pack2(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
    };

    int it = 0;
    for (int qi = 0;; ++qi) {
        mbar_wait(item_full, qi & 1);
        const unsigned w = ld_shared_u32(slots + 4 * (qi & 1));
        if (w >= items) break;
        int bh, m0, nt;
        item(w, bh, m0, nt);
        const int b = bh / p.H, h = bh - b * p.H, wr0 = m0 + cw * 16;  // the warp's first row
#if MASK
        {
            const i64 mbase = b * p.sm[0] + (h / p.gm) * p.sm[1];
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) mrow[hh] = mbase + (i64)min(wr0 + g + hh * 8, L - 1) * p.sm[2];
            smc = p.sm[3];
        }
#endif
#pragma unroll
        for (int i = 0; i < DV / 2; ++i) o[i] = 0.0f;
        m_r[0] = m_r[1] = NEG_INF;
        l_r[0] = l_r[1] = 0.0f;

        mbar_wait(q_full, qi & 1);
        if (nt > 0) {
            wait_full(K_FULL(it & 1), it);
            turn_wait();
            wg_fence();
            issue_scores(it & 1);
            wg_commit();
            turn_pass();
            wg_wait<0>();
            fence_regs<BN / 2>(s);
            release(K_EMPTY(it & 1));
            if (nt == 1) release(q_empty);  // the item's last scores have landed: q is free
            softmax_tile(0, wr0);
            rescale_and_pack();
        }
        // tile j: the scores of tile j + 1 and P v of tile j are issued together; the softmax of
        // tile j + 1 runs on the CUDA cores while the tensor cores multiply P v
        for (int j = 0; j < nt; ++j) {
            const int cur = it + j, nxt = cur + 1;
            wait_full(V_FULL(cur & 1), cur);
            if (j + 1 < nt) {
                wait_full(K_FULL(nxt & 1), nxt);
                turn_wait();
                fence_regs<DV / 2>(o);
                wg_fence();
                issue_scores(nxt & 1);
                wg_commit();
                issue_pv(cur & 1);
                wg_commit();
                turn_pass();
                wg_wait<1>();  // the scores have landed; P v is still in flight
                fence_regs<BN / 2>(s);
                release(K_EMPTY(nxt & 1));
                if (j + 2 == nt) release(q_empty);
                softmax_tile(j + 1, wr0);
                wg_wait<0>();
                fence_regs<DV / 2>(o);
                // pa stays live (and unmodified) until the product that reads it has landed
#pragma unroll
                for (int kk = 0; kk < BN / 16; ++kk)
#pragma unroll
                    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(pa[kk][i])::"memory");
                release(V_EMPTY(cur & 1));
                rescale_and_pack();
            } else {  // the last tile: P v alone
                turn_wait();
                fence_regs<DV / 2>(o);
                wg_fence();
                issue_pv(cur & 1);
                wg_commit();
                turn_pass();
                wg_wait<0>();
                fence_regs<DV / 2>(o);
                release(V_EMPTY(cur & 1));
            }
        }
        if (nt == 0) release(q_empty);
        it += nt;

        // divide by l (l == 0, every key masked: zeros) and write the rows from the registers
        float inv[2];
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            float l = l_r[hh];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            inv[hh] = l == 0.0f ? 0.0f : 1.0f / l;
        }
        const int Ev = p.Ev;
        bits16* out = O + ((i64)bh * L + wr0) * Ev;
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int row = g + hh * 8;
            if (wr0 + row >= L) continue;
            bits16* dst = out + (i64)row * Ev;
#pragma unroll
            for (int n = 0; n < DV / 8; ++n) {
                const int col = n * 8 + 2 * t;
                const unsigned v2 = pack2(o[4 * n + 2 * hh] * inv[hh], o[4 * n + 2 * hh + 1] * inv[hh]);
                if (col + 1 < Ev && (Ev & 1) == 0) {
                    *reinterpret_cast<unsigned*>(dst + col) = v2;
                } else {
                    if (col < Ev) dst[col] = (bits16)(v2 & 0xFFFFu);
                    if (col + 1 < Ev) dst[col + 1] = (bits16)(v2 >> 16);
                }
            }
        }
    }
#undef K_FULL
#undef K_EMPTY
#undef V_FULL
#undef V_EMPTY
#else
    __trap();  // built for a target without wgmma: attention.py never launches this
#endif
}
#endif
