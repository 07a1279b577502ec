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

#ifndef BM
#define BM 128
#define BN 256
#define BK 64
#define STAGES 4
#endif
// Descriptor of an n-contiguous B: B_LBO_MN 1 puts the stride between 64-wide atoms along n in
// the leading-byte-offset field and the 8-row stride along k in the stride field; 0 swaps them.
// B_LBO_MN 1 with TNSP_B 1 is the convention checked right on an H200 (the others are wrong).
#ifndef B_LBO_MN
#define B_LBO_MN 1
#endif
#ifndef TNSP_B
#define TNSP_B 1  // the instruction's transpose-B flag for an n-contiguous B
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

#if BF16
#define WG_T "bf16"
#else
#define WG_T "f16"
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Shared-memory matrix descriptor: address, leading / stride byte offsets, 128-byte swizzle.
__device__ __forceinline__ unsigned long long desc(unsigned addr, unsigned lbo, unsigned sbo) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)((lbo & 0x3FFFF) >> 4) << 16) |
           ((unsigned long long)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

template <int TB>
__device__ __forceinline__ void wgmma_n128(float (&d)[64], unsigned long long da, unsigned long long db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." WG_T "." WG_T " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1, 0, %67;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(1), "n"(TB));
}
template <int TB>
__device__ __forceinline__ void wgmma_n256(float (&d)[128], unsigned long long da, unsigned long long db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32." WG_T "." WG_T " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "%128, %129, p, 1, 1, 0, %131;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(da), "l"(db), "r"(1), "n"(TB));
}
#endif

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
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            const unsigned long long da = desc(a0 + kk * 32, 16, 1024);
#if B_NCONTIG
#if B_LBO_MN
            const unsigned long long db = desc(b0s + kk * 16 * 128, BK * 128, 1024);
#else
            const unsigned long long db = desc(b0s + kk * 16 * 128, 1024, BK * 128);
#endif
            constexpr int TB = TNSP_B;
#else
            const unsigned long long db = desc(b0s + kk * 32, 16, 1024);
            constexpr int TB = 0;
#endif
#if BN == 256
            wgmma_n256<TB>(acc, da, db);
#else
            wgmma_n128<TB>(acc, da, db);
#endif
        }
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
