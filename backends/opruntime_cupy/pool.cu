// max_pool2d, avg_pool2d, adaptive_avg_pool2d and the global (1x1) average pool.
//
// Defines (injected by pool.py):
//   DTYPE  0 float32, 1 float16, 2 bfloat16 (both accumulated in float32), 3 float64
//   OPT    outputs per thread along W (max / avg): 1, 2 or 4
//   FIXED  1: the window (KH, KW, SH, SW, DH, DW) is compiled in (loops unrolled; the run-time
//          window arguments are ignored); 0: it comes from the arguments
//
// The input is read in place through its element strides (sn, sc, sh, sw) and the read-only
// cache (__ldg): transposed and sliced views need no copy. The output is C-contiguous
// (N, C, OH, OW); planes = N * C.
//
// max_pool2d / avg_pool2d / adaptive_avg_pool2d: blockDim (TX, TY, TZ) tiles (W / OPT, OH,
// planes); consecutive threads take consecutive outputs along W (coalesced stores, and loads
// when the input's W stride is 1). Grid dims y and z loop (grid-stride) past their limits and
// past the grid the host sizes to the SMs.
//   max: padded taps are skipped (they count as -inf); a NaN in the window gives NaN.
//   avg: torch's divisor: the window clipped to the padded input (include 1) or to the input.
//   adaptive: output i of a dim L pooled to O averages [floor(i*L/O), ceil((i+1)*L/O)).
// global_avg_pool2d: GROUP lanes of a warp per plane (a shuffle reduction), scalar loads or,
// in global_avg_pool2d_vec, 128-bit loads (contiguous planes whose size and stride are whole
// 16-byte words, from an aligned base); global_avg_pool2d_block: a block per plane (large planes).
#include "dtype.cuh"

#ifndef OPT
#define OPT 1
#endif
#ifndef FIXED
#define FIXED 0
#endif

#if DTYPE == 3
#define NEG_INF (-__longlong_as_double(0x7ff0000000000000LL))
#else
#define NEG_INF (-__int_as_float(0x7f800000))
#endif

#if FIXED
#define P_KH KH
#define P_KW KW
#define P_SH SH
#define P_SW SW
#define P_DH DH
#define P_DW DW
#else
#define P_KH kh
#define P_KW kw
#define P_SH strh
#define P_SW strw
#define P_DH dh
#define P_DW dw
#endif

__device__ __forceinline__ ACC load(const T* p) { return to_acc(__ldg(p)); }

// The loops over (plane, output row) of this thread; the body (the macro's argument) computes OPT
// outputs of row oh from ow0 (xp: the plane's input, yp: the output row).
#define FOR_EACH_ROW(...)                                                                        \
    const int ow0 = (blockIdx.x * blockDim.x + threadIdx.x) * OPT;                                \
    if (ow0 >= OW) return;                                                                        \
    for (i64 p = (i64)blockIdx.z * blockDim.z + threadIdx.z; p < planes; p += (i64)gridDim.z * blockDim.z) { \
        const T* __restrict__ xp = x + (p / C) * sn + (p % C) * sc;                               \
        for (int oh = blockIdx.y * blockDim.y + threadIdx.y; oh < OH; oh += gridDim.y * blockDim.y) { \
            T* __restrict__ yp = y + (p * OH + oh) * OW;                                          \
            __VA_ARGS__                                                                           \
        }                                                                                         \
    }

#define POOL_PARAMS                                                                                  \
    const T *__restrict__ x, T *__restrict__ y, const int C, const int H, const int W, const int OH, \
        const int OW, const i64 planes, const i64 sn, const i64 sc, const i64 sh, const i64 sw
#define WINDOW_PARAMS                                                                              \
    const int kh, const int kw, const int strh, const int strw, const int ph, const int pw, const int dh, \
        const int dw, const int include

extern "C" __global__ void max_pool2d(POOL_PARAMS, WINDOW_PARAMS) {
    FOR_EACH_ROW({
        ACC m[OPT];
#pragma unroll
        for (int o = 0; o < OPT; ++o) m[o] = NEG_INF;
        const int h0 = oh * P_SH - ph;
#pragma unroll
        for (int i = 0; i < P_KH; ++i) {
            const int ih = h0 + i * P_DH;
            if (ih < 0 || ih >= H) continue;
            const T* __restrict__ row = xp + ih * sh;
#pragma unroll
            for (int o = 0; o < OPT; ++o) {
                const int w0 = (ow0 + o) * P_SW - pw;
#pragma unroll
                for (int j = 0; j < P_KW; ++j) {
                    const int iw = w0 + j * P_DW;
                    if (iw >= 0 && iw < W) {
                        const ACC v = load(row + iw * sw);
                        if (v > m[o] || v != v) m[o] = v;  // once NaN, nothing compares greater
                    }
                }
            }
        }
#pragma unroll
        for (int o = 0; o < OPT; ++o)
            if (ow0 + o < OW) yp[ow0 + o] = from_acc(m[o]);
    })
}

extern "C" __global__ void avg_pool2d(POOL_PARAMS, WINDOW_PARAMS) {
    FOR_EACH_ROW({
        const int h0 = oh * P_SH - ph;
        const int h1 = min(h0 + P_KH, H + ph);
        const int hin = min(h1, H) - max(h0, 0);  // input rows the window covers
        ACC s[OPT];
#pragma unroll
        for (int o = 0; o < OPT; ++o) s[o] = ACC(0);
#pragma unroll
        for (int i = 0; i < P_KH; ++i) {
            const int ih = h0 + i;
            if (ih < 0 || ih >= H) continue;
            const T* __restrict__ row = xp + ih * sh;
#pragma unroll
            for (int o = 0; o < OPT; ++o) {
                const int w0 = (ow0 + o) * P_SW - pw;
#pragma unroll
                for (int j = 0; j < P_KW; ++j) {
                    const int iw = w0 + j;
                    if (iw >= 0 && iw < W) s[o] += load(row + iw * sw);
                }
            }
        }
#pragma unroll
        for (int o = 0; o < OPT; ++o) {
            const int w0 = (ow0 + o) * P_SW - pw;
            const int w1 = min(w0 + P_KW, W + pw);
            const int win = min(w1, W) - max(w0, 0);
            const int div = include ? (h1 - h0) * (w1 - w0) : hin * win;
            if (ow0 + o < OW) yp[ow0 + o] = from_acc(hin > 0 && win > 0 ? s[o] / (ACC)div : ACC(0));
        }
    })
}

extern "C" __global__ void adaptive_avg_pool2d(POOL_PARAMS) {
    FOR_EACH_ROW({
        const int hs = (int)(((i64)oh * H) / OH), he = (int)(((i64)(oh + 1) * H + OH - 1) / OH);
#pragma unroll
        for (int o = 0; o < OPT; ++o) {
            const int ow = ow0 + o;
            if (ow >= OW) break;
            const int ws = (int)(((i64)ow * W) / OW), we = (int)(((i64)(ow + 1) * W + OW - 1) / OW);
            ACC s = ACC(0);
            for (int ih = hs; ih < he; ++ih) {
                const T* __restrict__ row = xp + ih * sh;
                for (int iw = ws; iw < we; ++iw) s += load(row + iw * sw);
            }
            yp[ow] = from_acc(s / (ACC)((he - hs) * (we - ws)));
        }
    })
}

// -- the global average: a reduction per plane -----------------------------------------------------
// Plane p holds `count` elements; element e is at (e / W) * sh + (e % W) * sw from the plane's
// start, or at e * sw when `flat` (a plane whose rows follow each other: sh == W * sw).
#define GLOBAL_PARAMS                                                                                     \
    const T *__restrict__ x, T *__restrict__ y, const int C, const int W, const i64 planes, const i64 count, \
        const i64 sn, const i64 sc, const i64 sh, const i64 sw, const int flat, const int group

__device__ __forceinline__ ACC element(const T* __restrict__ xp, i64 e, int W, i64 sh, i64 sw, int flat) {
    if (flat) return load(xp + e * sw);
    const i64 r = e / W;
    return load(xp + r * sh + (e - r * W) * sw);
}

// GROUP (`group`, a power of two <= 32) lanes per plane, 32 / group planes per warp at a time.
// Every lane of a warp runs the same iterations (the shuffles need all 32): the loop test uses the
// warp's first plane, and planes past the end are masked.
__device__ __forceinline__ ACC group_sum(ACC v, int group) {
    for (int o = group / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

#define GLOBAL_WARP_LOOP(...)                                                               \
    const int lane = threadIdx.x & 31, gl = lane & (group - 1);                                   \
    const int per_warp = 32 / group;                                                              \
    const i64 warp = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;                           \
    const i64 step = ((i64)gridDim.x * blockDim.x >> 5) * per_warp;                               \
    for (i64 p0 = warp * per_warp; p0 < planes; p0 += step) {                                     \
        const i64 p = p0 + lane / group;                                                          \
        ACC s = ACC(0);                                                                           \
        if (p < planes) {                                                                         \
            const T* __restrict__ xp = x + (p / C) * sn + (p % C) * sc;                           \
            __VA_ARGS__                                                                           \
        }                                                                                         \
        s = group_sum(s, group);                                                                  \
        if (gl == 0 && p < planes) y[p] = from_acc(s / (ACC)count);                               \
    }

extern "C" __global__ void global_avg_pool2d(GLOBAL_PARAMS) {
    GLOBAL_WARP_LOOP({
        for (i64 e = gl; e < count; e += group) s += element(xp, e, W, sh, sw, flat);
    })
}

// 128-bit words: the host checks that planes are contiguous (sw 1, flat), that count, sn and sc
// are whole words and that x is 16-byte aligned.
extern "C" __global__ void global_avg_pool2d_vec(GLOBAL_PARAMS) {
    constexpr int V = 16 / sizeof(T);
    GLOBAL_WARP_LOOP({
        const uint4* __restrict__ xv = reinterpret_cast<const uint4*>(xp);
        const i64 words = count / V;
        for (i64 k = gl; k < words; k += group) {
            uint4 u = __ldg(xv + k);
            const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
            for (int v = 0; v < V; ++v) s += to_acc(e[v]);
        }
    })
}

// A block per plane (grid-stride over planes), for large planes: a warp sum, then the warps'
// partial sums through shared memory.
extern "C" __global__ void global_avg_pool2d_block(GLOBAL_PARAMS) {
    __shared__ ACC partial[32];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    for (i64 p = blockIdx.x; p < planes; p += gridDim.x) {
        const T* __restrict__ xp = x + (p / C) * sn + (p % C) * sc;
        ACC s = ACC(0);
        for (i64 e = threadIdx.x; e < count; e += blockDim.x) s += element(xp, e, W, sh, sw, flat);
        s = group_sum(s, 32);
        if (lane == 0) partial[wid] = s;
        __syncthreads();
        if (wid == 0) {
            s = lane < nw ? partial[lane] : ACC(0);
            s = group_sum(s, 32);
            if (lane == 0) y[p] = from_acc(s / (ACC)count);
        }
        __syncthreads();  // partial is reused by the next plane
    }
}
