// fp16 / bf16 GEMM with Hopper's warpgroup MMA (wgmma, sm_90a only): C[b] = A[b] @ B[b],
// A (M x K) with k contiguous, B (K x N) with n contiguous (B_NCONTIG 1) or k contiguous (0),
// C (M x N) contiguous; fp32 accumulation in registers.
//
// A block of BM/64 warpgroups computes BM x BN; each warpgroup 64 rows x BN columns with one
// m64nBNk16 instruction per k16 step, both operands read by the tensor cores straight from
// shared memory through matrix descriptors. Tiles arrive by cp.async (16-byte copies,
// zero-filled at the edges) in STAGES stages, STAGES-2 tiles ahead, while one group of
// wgmma is in flight; the stages are laid out in the 128-byte swizzle the descriptors name:
// A and a k-contiguous B as rows of 64 k values (128 B) with chunk c of row r at c ^ (r % 8);
// an n-contiguous B as atoms of 64 n values x BK k rows, chunk c of row k at c ^ (k % 8).
// The output is staged through shared memory for 16-byte stores. Epilogue (BIAS, ACT:
// matmul_common.cuh): bias[n] and the activation applied in fp32 before the rounding to 16 bits.
//
// Needs -arch=sm_90a (wgmma); for other targets the kernel compiles to a trap (CI builds it).
// opruntime-arch: sm_90a
#include "matmul_common.cuh"
#include "wgmma.cuh"

#ifndef BM
#define BM 128
#define BN 256
#define BK 64
#define STAGES 4
#endif
#define NWG (BM / 64)
#define NT (NWG * 128)
#define A_TILE (BM * BK)  // 16-bit elements per stage
#define B_TILE (BK * BN)
#define STAGE_BYTES ((A_TILE + B_TILE) * 2)
static_assert(BK == 64, "rows of 128 bytes: the 128-byte swizzle");
static_assert(BN == 128 || BN == 256, "one m64nBNk16 instruction per k16 step");
static_assert(STAGES >= 3, "STAGES-2 tiles in flight");
static_assert((A_TILE * 2) % 1024 == 0 && (B_TILE * 2) % 1024 == 0, "swizzle atoms stay 1024-byte aligned");

// One stage of A: BM rows x 64 k, rows of 128 B, chunk c of row r at c ^ (r & 7).
__device__ __forceinline__ void load_a(unsigned s, const bits16* g, i64 sam, int rows_left, int k_left, int tid) {
    const int c = tid & 7, r0 = tid >> 3;
    const bool cok = c * 8 < k_left;
#pragma unroll
    for (int i = 0; i < BM * 8 / NT; ++i) {
        const int r = r0 + i * (NT / 8);
        const bool ok = cok && r < rows_left;
        cp_async16(s + r * 128 + ((c ^ (r & 7)) << 4), ok ? g + r * sam + c * 8 : g, ok);
    }
}

#if B_NCONTIG
// One stage of an n-contiguous B: atoms of 64 n x 64 k rows (8 KiB), chunk c of row k at c ^ (k & 7).
__device__ __forceinline__ void load_b(unsigned s, const bits16* g, i64 sbk, int n_left, int k_left, int tid) {
    constexpr int CPR = BN / 8;  // chunks per k row
    const int n8 = tid % CPR, k0 = tid / CPR;
    const int atom = n8 >> 3, c = n8 & 7;
    const bool nok = n8 * 8 < n_left;
#pragma unroll
    for (int i = 0; i < BK * CPR / NT; ++i) {
        const int k = k0 + i * (NT / CPR);
        const bool ok = nok && k < k_left;
        cp_async16(s + atom * (BK * 128) + k * 128 + ((c ^ (k & 7)) << 4), ok ? g + k * sbk + n8 * 8 : g, ok);
    }
}
#else
// One stage of a k-contiguous B: BN rows (n) x 64 k, like A.
__device__ __forceinline__ void load_b(unsigned s, const bits16* g, i64 sbn, int n_left, int k_left, int tid) {
    const int c = tid & 7, r0 = tid >> 3;
    const bool cok = c * 8 < k_left;
#pragma unroll
    for (int i = 0; i < BN * 8 / NT; ++i) {
        const int r = r0 + i * (NT / 8);
        const bool ok = cok && r < n_left;
        cp_async16(s + r * 128 + ((c ^ (r & 7)) << 4), ok ? g + r * sbn + c * 8 : g, ok);
    }
}
#endif

extern "C" __global__ void __launch_bounds__(NT, 1)
hgemm_wgmma(const bits16* __restrict__ A, const bits16* __restrict__ B, bits16* __restrict__ C, const GemmParams p
#if BIAS
            , const bits16* __restrict__ bias
#endif
            ) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    // descriptors address 1024-byte swizzle atoms: align the stages by hand
    const unsigned raw = smem_addr(smem_raw);
    const unsigned base = (raw + 1023) & ~1023u;
    unsigned char* smem = smem_raw + (base - raw);
    const int M = (int)p.M, N = (int)p.N, K = (int)p.K;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = tid >> 7;

    int m0, n0;
    grouped_tile(M, N, BM, BN, m0, n0);

    const i64 bz = p.z0 + blockIdx.z;
    const i64 b0 = bz % p.d0, b1 = (bz / p.d0) % p.d1, b2 = bz / (p.d0 * p.d1);
    const bits16* Ab = A + b2 * p.sa2 + b1 * p.sa1 + b0 * p.sa0 + (i64)m0 * p.sam;
    const bits16* Bb = B + b2 * p.sb2 + b1 * p.sb1 + b0 * p.sb0 + (i64)n0 * p.sbn;
    bits16* Cb = C + bz * (i64)M * N;

    const int ktiles = (K + BK - 1) / BK;
    auto stage_a = [&](int s) { return base + s * STAGE_BYTES; };
    auto stage_b = [&](int s) { return base + s * STAGE_BYTES + A_TILE * 2; };
    auto load_stage = [&](int s, int kt) {
        const int k0 = kt * BK;
        load_a(stage_a(s), Ab + k0, p.sam, M - m0, K - k0, tid);
#if B_NCONTIG
        load_b(stage_b(s), Bb + (i64)k0 * p.sbk, p.sbk, N - n0, K - k0, tid);
#else
        load_b(stage_b(s), Bb + k0, p.sbn, N - n0, K - k0, tid);
#endif
    };

    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;

    constexpr int AHEAD = STAGES - 2;  // tiles in flight ahead of the one multiplied
#pragma unroll
    for (int s = 0; s < AHEAD; ++s) {
        if (s < ktiles) load_stage(s, s);
        cp_async_commit();
    }
    for (int t = 0; t < ktiles; ++t) {
        cp_async_wait<AHEAD - 1>();  // tile t has landed (for this thread's copies) ...
        fence_proxy_async();          // ... visible to the tensor cores' (async) proxy ...
        __syncthreads();              // ... and for every thread's copies
        // refill the stage last read by tile t-2, whose wgmma group completed (wait<1> below)
        if (t + AHEAD < ktiles) load_stage((t + AHEAD) % STAGES, t + AHEAD);
        cp_async_commit();

        const int s = t % STAGES;
        const unsigned a0 = stage_a(s) + wg * 64 * 128, b0s = stage_b(s);
        wg_fence();
        wgmma_k64<BN, B_NCONTIG>(acc, a0, b0s, 1);
        wg_commit();
        wg_wait<1>();
    }
    wg_wait<0>();
    cp_async_wait<0>();
    __syncthreads();

    // Epilogue: accumulator i of a thread is row 16 * (warp % 4) + lane / 4 (+8 for i % 4 >= 2)
    // of its warpgroup's 64, column 8 * (i / 4) + 2 * (lane % 4) + i % 2; staged through shared
    // memory (rows padded by 8 values) and written as 16-byte row pieces.
#if HAS_EPILOGUE
    // With bias / activation the accumulators are staged as fp32 and the epilogue runs on the
    // way out, 8 values per thread at a time: applied to the 128 live accumulators it spilled
    // (erf's temporaries on top of them: 412 B with gelu at 128x256).
    constexpr int FROW = BN + 8;
    static_assert(BM * FROW * 4 <= STAGES * STAGE_BYTES, "fp32 staging fits the stages");
    float* fs = reinterpret_cast<float*>(smem);
    {
        const int r = wg * 64 + (warp & 3) * 16 + (lane >> 2), c = (lane & 3) * 2;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
            *reinterpret_cast<float2*>(fs + r * FROW + j * 8 + c) = make_float2(acc[4 * j], acc[4 * j + 1]);
            *reinterpret_cast<float2*>(fs + (r + 8) * FROW + j * 8 + c) = make_float2(acc[4 * j + 2], acc[4 * j + 3]);
        }
    }
    __syncthreads();
    const bool vec = (N & 7) == 0;
    constexpr int CPR = BN / 8;
#pragma unroll 2
    for (int it = 0; it < BM * CPR / NT; ++it) {
        const int idx = it * NT + tid, row = idx / CPR, ch = idx % CPR;
        const int m = m0 + row, n = n0 + ch * 8;
        if (m >= M || n >= N) continue;
        const float4 lo = *reinterpret_cast<const float4*>(fs + row * FROW + ch * 8);
        const float4 hi = *reinterpret_cast<const float4*>(fs + row * FROW + ch * 8 + 4);
        float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
        for (int q = 0; q < 8; ++q) {
#if BIAS
            v[q] += bias16(bias, n + q, N);
#endif
            v[q] = activate<ACT>(v[q]);
        }
        uint4 o;
#if BF16
        o.x = pack_bf16x2(v[0], v[1]); o.y = pack_bf16x2(v[2], v[3]);
        o.z = pack_bf16x2(v[4], v[5]); o.w = pack_bf16x2(v[6], v[7]);
#else
        o.x = pack_f16x2(v[0], v[1]); o.y = pack_f16x2(v[2], v[3]);
        o.z = pack_f16x2(v[4], v[5]); o.w = pack_f16x2(v[6], v[7]);
#endif
        store8_16bit(Cb + (i64)m * N + n, o, n, N, vec);
    }
#else
    constexpr int CROW = BN + 8;
    static_assert(BM * CROW * 2 <= STAGES * STAGE_BYTES, "staging fits the stages");
    bits16* cs = reinterpret_cast<bits16*>(smem);
    const int r = wg * 64 + (warp & 3) * 16 + (lane >> 2), c = (lane & 3) * 2;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
#if BF16
        *reinterpret_cast<unsigned*>(cs + r * CROW + j * 8 + c) = pack_bf16x2(acc[4 * j], acc[4 * j + 1]);
        *reinterpret_cast<unsigned*>(cs + (r + 8) * CROW + j * 8 + c) = pack_bf16x2(acc[4 * j + 2], acc[4 * j + 3]);
#else
        *reinterpret_cast<unsigned*>(cs + r * CROW + j * 8 + c) = pack_f16x2(acc[4 * j], acc[4 * j + 1]);
        *reinterpret_cast<unsigned*>(cs + (r + 8) * CROW + j * 8 + c) = pack_f16x2(acc[4 * j + 2], acc[4 * j + 3]);
#endif
    }
    __syncthreads();
    const bool vec = (N & 7) == 0;
    constexpr int CPR = BN / 8;
#pragma unroll 4
    for (int it = 0; it < BM * CPR / NT; ++it) {
        const int idx = it * NT + tid, row = idx / CPR, ch = idx % CPR;
        const int m = m0 + row, n = n0 + ch * 8;
        if (m >= M || n >= N) continue;
        const uint4 v = *reinterpret_cast<const uint4*>(cs + row * CROW + ch * 8);
        store8_16bit(Cb + (i64)m * N + n, v, n, N, vec);
    }
#endif  // HAS_EPILOGUE
#else
    __trap();  // built for a target without wgmma: matmul.py never launches this
#endif
}
