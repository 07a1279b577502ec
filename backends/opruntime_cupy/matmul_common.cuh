// What the matmul kernels of this backend share: the scalar parameters of one launch, passed
// as one struct (one kernel argument: fewer arguments for the host to marshal per call).
#pragma once
#include "common.cuh"
#include "epilogue.cuh"

// Layout and scheduling flags every matmul kernel reads (matmul.py sets them per problem; the
// defaults are the contiguous, vector-loaded float case). A_KCONTIG: A's k index is contiguous,
// else m. B_NCONTIG: B's n index is contiguous, else k. VEC_A / VEC_B: 16-byte loads. BF16:
// the 16-bit type is bfloat16, else half. GROUP_M: block rows walked together for L2 reuse.
#ifndef A_KCONTIG
#define A_KCONTIG 1
#endif
#ifndef B_NCONTIG
#define B_NCONTIG 1
#endif
#ifndef VEC_A
#define VEC_A 1
#endif
#ifndef VEC_B
#define VEC_B 1
#endif
#ifndef BF16
#define BF16 0
#endif
#ifndef GROUP_M
#define GROUP_M 8
#endif

// The epilogue (linear): BIAS 1 adds bias[n] (a kernel argument after the parameter block, of
// the element type), ACT applies activate<ACT> of epilogue.cuh; both in fp32 on the accumulator,
// before the one rounding to the output type. matmul builds neither.
#ifndef BIAS
#define BIAS 0
#endif
#ifndef ACT
#define ACT 0
#endif
#define HAS_EPILOGUE (BIAS || ACT)

struct GemmParams {
    i64 M, N, K;
    i64 sam, sak;  // A[m, k] at m * sam + k * sak (elements)
    i64 sbk, sbn;  // B[k, n] at k * sbk + n * sbn
    i64 z0;        // first batch entry of this launch (launches cover at most 65535 entries)
    i64 d1, d0;    // batch dims (d2 x d1 x d0), d0 innermost
    i64 sa2, sa1, sa0, sb2, sb1, sb0;  // batch strides of A and B (0: broadcast)
};

// The C tile of this block in grouped order: GROUP_M tile rows are walked together, so the B
// tiles they share are still in L2 when the next row needs them: tile number pid (a persistent
// kernel walks several per block), or the block's own.
__device__ __forceinline__ void grouped_tile_at(int pid, int M, int N, int bm, int bn, int& m0, int& n0) {
    const int tiles_m = (M + bm - 1) / bm, tiles_n = (N + bn - 1) / bn;
    const int per_group = GROUP_M * tiles_n;
    const int first_m = (pid / per_group) * GROUP_M;
    const int gsize = min(tiles_m - first_m, GROUP_M);
    m0 = (first_m + (pid % per_group) % gsize) * bm;
    n0 = ((pid % per_group) / gsize) * bn;
}
__device__ __forceinline__ void grouped_tile(int M, int N, int bm, int bn, int& m0, int& n0) {
    grouped_tile_at(blockIdx.x, M, N, bm, bn, m0, n0);
}

// Store 8 16-bit values (one uint4) at C[.., n..n+7] of a row of N: one 16-byte store when rows
// are 16-byte aligned (vec), else element by element up to the row's end.
__device__ __forceinline__ void store8_16bit(bits16* dst, uint4 v, int n, int N, bool vec) {
    if (vec) {
        *reinterpret_cast<uint4*>(dst) = v;
    } else {
        const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int q = 0; q < 8; ++q)
            if (n + q < N) dst[q] = (bits16)(w[q >> 1] >> ((q & 1) * 16));
    }
}


// bias[n] of a 16-bit bias as float (0 past the row's end: nothing is stored there).
__device__ __forceinline__ float bias16(const bits16* bias, int n, int N) {
    if (n >= N) return 0.0f;
#if BF16
    return bf16_to_f32(bias[n]);
#else
    return f16_to_f32(bias[n]);
#endif
}
