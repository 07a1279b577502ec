// sum / mean / amax over the (outer, n, inner) view of the input: output o = (o / inner, o % inner)
// reduces the n elements x[(o / inner) * so + (o % inner) * si + k * sn], k < n (element strides).
// With splits > 1 the k range of each output is cut into `splits` chunks of `chunk` elements;
// chunk s of output o writes its partial (ACC, unscaled) to part[s * outputs + o] and `finish`
// combines them (two passes, no atomics). The output y is C-contiguous, one T per output.
//
// Defines (injected by reduce.py):
//   DTYPE   0 float32, 1 float16, 2 bfloat16 (both accumulated in float32), 3 float64 (in double)
//   OP      0 sum, 1 mean (the sum times `scale` = 1 / n), 2 amax (NaN propagates, as torch)
//   THREADS threads per block
// Entry points, each taking (x, y, outer, inner, so, si, n, sn, chunk, splits, scale):
//   rows_warp[_vec]   a warp per (output, chunk): the reduced axis with unit stride (sn == 1 for
//                     the _vec forms: 128-bit loads, the row starts 16-byte aligned), short rows
//   rows_block[_vec]  a block per (output, chunk): long rows; a shuffle tree per warp, then
//                     shared memory across the warps
//   cols              blockDim (TX, TY): TX threads across neighbouring outputs (coalesced when
//                     they are neighbours in memory), TY down the reduced range, four loads in
//                     flight each; the TY partials meet in shared memory
//   finish            (part, y, outputs, splits, scale): the chunks' partials, as `cols` on ACC
#include "dtype.cuh"

#ifndef OP
#define OP 0
#endif
#ifndef THREADS
#define THREADS 256
#endif

#if DTYPE == 3
#define NEG_INF (-__longlong_as_double(0x7ff0000000000000LL))
#else
#define NEG_INF (-__int_as_float(0x7f800000))
#endif

#if OP == 2
#define IDENT NEG_INF
__device__ __forceinline__ ACC comb(ACC a, ACC b) { return (a > b || a != a) ? a : b; }  // NaN in either wins
#else
#define IDENT ((ACC)0)
__device__ __forceinline__ ACC comb(ACC a, ACC b) { return a + b; }
#endif

constexpr int VEC = 16 / sizeof(T);  // elements per 128-bit load
struct __align__(16) Vec {
    T v[VEC];
};

template <int W>
__device__ __forceinline__ ACC group_comb(ACC v) {
#pragma unroll
    for (int o = W / 2; o > 0; o >>= 1) v = comb(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The result of output o (chunk s): a partial in ACC, or the final value in T.
__device__ __forceinline__ void store(void* y, i64 o, i64 outputs, int s, int splits, ACC v, ACC scale) {
    if (splits > 1) {
        reinterpret_cast<ACC*>(y)[(i64)s * outputs + o] = v;
    } else {
#if OP == 1
        v *= scale;
#endif
        reinterpret_cast<T*>(y)[o] = from_acc(v);
    }
}

// -- rows: G threads (a warp, or the block) per (output, chunk) ----------------------------------
template <int G, bool V>
__device__ __forceinline__ void rows(const T* __restrict__ x, void* __restrict__ y, i64 outer, i64 inner, i64 so,
                                     i64 si, i64 n, i64 sn, i64 chunk, int splits, ACC scale) {
    constexpr int GROUPS = THREADS / G;  // rows in flight per block
    __shared__ ACC red[THREADS / 32];
    const int lane = threadIdx.x % G, grp = threadIdx.x / G;
    const i64 outputs = outer * inner, tasks = outputs * splits;
    // the loop bound is the same for every thread of a group (and of the block when G == THREADS)
    for (i64 t = (i64)blockIdx.x * GROUPS + grp; t < tasks; t += (i64)gridDim.x * GROUPS) {
        const i64 o = t / splits;
        const int s = (int)(t - o * splits);
        const i64 k0 = (i64)s * chunk, len = min(n - k0, chunk);
        const T* p = x + (o / inner) * so + (o % inner) * si + k0 * sn;
        ACC a0 = IDENT, a1 = IDENT;
        if constexpr (V) {
            const Vec* pv = reinterpret_cast<const Vec*>(p);
            const i64 nv = len / VEC;
            i64 i = lane;
            for (; i + G < nv; i += 2 * G) {  // two 128-bit loads in flight
                const Vec u = pv[i], w = pv[i + G];
#pragma unroll
                for (int e = 0; e < VEC; e++) a0 = comb(a0, to_acc(u.v[e])), a1 = comb(a1, to_acc(w.v[e]));
            }
            if (i < nv) {
                const Vec u = pv[i];
#pragma unroll
                for (int e = 0; e < VEC; e++) a0 = comb(a0, to_acc(u.v[e]));
            }
            for (i64 k = nv * VEC + lane; k < len; k += G) a0 = comb(a0, to_acc(p[k]));
        } else {
            i64 k = lane;
            for (; k + G < len; k += 2 * G) a0 = comb(a0, to_acc(p[k * sn])), a1 = comb(a1, to_acc(p[(k + G) * sn]));
            if (k < len) a0 = comb(a0, to_acc(p[k * sn]));
        }
        ACC v = group_comb<(G < 32 ? G : 32)>(comb(a0, a1));
        if (G > 32) {
            if (lane % 32 == 0) red[lane / 32] = v;
            __syncthreads();
            if (lane == 0) {
#pragma unroll
                for (int w = 1; w < G / 32; w++) v = comb(v, red[w]);
            }
            __syncthreads();  // red is written again by the next task
        }
        if (lane == 0) store(y, o, outputs, s, splits, v, scale);
    }
}

#define ROWS_ENTRY(name, G, V)                                                                              \
    extern "C" __global__ void __launch_bounds__(THREADS)                                                  \
        name(const T* x, void* y, i64 outer, i64 inner, i64 so, i64 si, i64 n, i64 sn, i64 chunk, int splits, \
             ACC scale) {                                                                                  \
        rows<G, V>(x, y, outer, inner, so, si, n, sn, chunk, splits, scale);                               \
    }
ROWS_ENTRY(rows_warp, 32, false)
ROWS_ENTRY(rows_warp_vec, 32, true)
ROWS_ENTRY(rows_block, THREADS, false)
ROWS_ENTRY(rows_block_vec, THREADS, true)

// -- columns: threads across outputs, each walking down its share of the reduced range ---------------
template <bool PARTIALS>  // the input: PARTIALS (ACC) or the operand (T)
__device__ __forceinline__ ACC load(const void* x, i64 i) {
    if constexpr (PARTIALS) {
        return reinterpret_cast<const ACC*>(x)[i];
    } else {
        return to_acc(reinterpret_cast<const T*>(x)[i]);
    }
}

template <bool PARTIALS>
__device__ __forceinline__ void columns(const void* __restrict__ x, void* __restrict__ y, i64 outer, i64 inner, i64 so,
                                     i64 si, i64 n, i64 sn, i64 chunk, int splits, ACC scale) {
    __shared__ ACC red[THREADS];
    const int tx = threadIdx.x, ty = threadIdx.y, TX = blockDim.x, TY = blockDim.y;
    const i64 outputs = outer * inner, o = (i64)blockIdx.x * TX + tx;
    const int s = blockIdx.y;
    ACC a0 = IDENT, a1 = IDENT, a2 = IDENT, a3 = IDENT;
    if (o < outputs) {
        const i64 base = (o / inner) * so + (o % inner) * si;
        const i64 k1 = min(n, (i64)(s + 1) * chunk);
        i64 k = (i64)s * chunk + ty;
        for (; k + 3 * TY < k1; k += 4 * TY) {
            const ACC b0 = load<PARTIALS>(x, base + k * sn), b1 = load<PARTIALS>(x, base + (k + TY) * sn);
            const ACC b2 = load<PARTIALS>(x, base + (k + 2 * TY) * sn), b3 = load<PARTIALS>(x, base + (k + 3 * TY) * sn);
            a0 = comb(a0, b0), a1 = comb(a1, b1), a2 = comb(a2, b2), a3 = comb(a3, b3);
        }
        for (; k < k1; k += TY) a0 = comb(a0, load<PARTIALS>(x, base + k * sn));
    }
    ACC v = comb(comb(a0, a1), comb(a2, a3));
    if (TY > 1) {
        red[ty * TX + tx] = v;
        __syncthreads();
        if (ty == 0)
            for (int t = 1; t < TY; t++) v = comb(v, red[t * TX + tx]);
    }
    if (ty == 0 && o < outputs) store(y, o, outputs, s, splits, v, scale);
}

extern "C" __global__ void __launch_bounds__(THREADS)
    cols(const T* x, void* y, i64 outer, i64 inner, i64 so, i64 si, i64 n, i64 sn, i64 chunk, int splits, ACC scale) {
    columns<false>(x, y, outer, inner, so, si, n, sn, chunk, splits, scale);
}

// The partials part[s * outputs + o] of `splits` chunks combined, scaled and rounded once.
extern "C" __global__ void __launch_bounds__(THREADS)
    finish(const ACC* part, T* y, i64 outputs, i64 splits, ACC scale) {
    columns<true>(part, y, 1, outputs, 0, 1, splits, outputs, splits, 1, scale);
}
