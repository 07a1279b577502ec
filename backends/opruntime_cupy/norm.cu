// layer_norm / rms_norm over rows, and batch_norm (inference) over NC(S) planes.
// One build per (DTYPE, FAMILY, tunables, HAS_W, HAS_B); entry points norm_<family>.
//
// Defines (injected by norm.py):
//   DTYPE   0 float32, 1 float16, 2 bfloat16 (both computed in float32), 3 float64
//   VEC     elements per load / store (16 bytes: 4 float32, 8 float16, 2 float64), or 1
//   THREADS threads per block
//   RMS     0 layer_norm (centred), 1 rms_norm
//   HAS_W, HAS_B  0/1: a weight / bias vector is given (batch_norm: after running mean and var)
//   FAMILY  1 warp:  GROUP (<= 32) threads per row, the row in registers (PACKS packs of VEC per
//                    thread), ROWS rows per thread group in flight; rows up to 1024 elements
//           2 block: a block per row, the row in registers (PACKS packs per thread)
//           3 loop:  a block per row of any length: the row read three times (sum, centred sum
//                    of squares, write), the second and third reads mostly from L2
//           4 planes: batch_norm, grid (x: chunks of a plane, y: planes); the channel's mean, scale
//                    and bias read per thread from the four vectors, then a subtraction and one FMA
//                    per element: (x - mean) * scale + bias
//           5 flat:  batch_norm over all elements, scalar (small planes)
// Rows: x is (rows, cols) with row stride ldx and unit column stride; y is C-contiguous; the
// weight and bias are contiguous vectors of cols. With VEC > 1 the host guarantees cols, ldx and
// every base address are multiples of 16 bytes. The variance is the exact two-pass one over the
// row held in registers (families 1 and 2): mean first, then the centred sum of squares.
#include "common.cuh"

#ifndef DTYPE
#define DTYPE 0  // defaults let the file build on its own (CI compiles each one)
#endif
#ifndef FAMILY
#define FAMILY 1
#endif
#ifndef THREADS
#define THREADS 128
#endif
#ifndef VEC
#define VEC 1
#endif
#ifndef PACKS
#define PACKS 1
#endif
#ifndef ROWS
#define ROWS 1
#endif
#ifndef GROUP
#define GROUP 32
#endif
#ifndef RMS
#define RMS 0
#endif
#ifndef HAS_W
#define HAS_W 1
#endif
#ifndef HAS_B
#define HAS_B 1
#endif

#include "dtype.cuh"
#if DTYPE == 3
__device__ __forceinline__ ACC inv_sqrt(ACC v) { return 1.0 / sqrt(v); }
__device__ __forceinline__ ACC fma_acc(ACC a, ACC b, ACC c) { return fma(a, b, c); }
#else
__device__ __forceinline__ ACC inv_sqrt(ACC v) { return rsqrtf(v); }
__device__ __forceinline__ ACC fma_acc(ACC a, ACC b, ACC c) { return fmaf(a, b, c); }
#endif

struct __align__(sizeof(T) * VEC) Pack {
    T v[VEC];
};

template <int W>
__device__ __forceinline__ ACC group_sum(ACC v) {
#pragma unroll
    for (int o = W / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

#if FAMILY == 1 || FAMILY == 2 || FAMILY == 3
#define NWARPS (THREADS / 32)
// The sum over the W threads of a row: shuffles within a warp, shared memory across warps. The
// second barrier keeps `red` from being rewritten (next reduction or row) before every warp read it.
template <int W>
__device__ __forceinline__ ACC row_sum(ACC v, ACC* red) {
    if (W <= 32) return group_sum<(W <= 32 ? W : 32)>(v);
    v = group_sum<32>(v);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    v = red[0];
#pragma unroll
    for (int i = 1; i < NWARPS; i++) v += red[i];
    __syncthreads();
    return v;
}

// y = (v - mean) * inv * w + b for one pack of the row at column col
__device__ __forceinline__ Pack finish(const ACC* v, ACC mean, ACC inv, const T* __restrict__ w,
                                       const T* __restrict__ b, i64 col) {
    Pack out;
#if HAS_W
    const Pack wp = *reinterpret_cast<const Pack*>(w + col);
#endif
#if HAS_B
    const Pack bp = *reinterpret_cast<const Pack*>(b + col);
#endif
#pragma unroll
    for (int e = 0; e < VEC; e++) {
        ACC r = (v[e] - mean) * inv;
#if HAS_W
        r *= to_acc(wp.v[e]);
#endif
#if HAS_B
        r += to_acc(bp.v[e]);
#endif
        out.v[e] = from_acc(r);
    }
    return out;
}
#endif

#if FAMILY == 1 || FAMILY == 2
// -- the row held in registers -----------------------------------------------------------------
#if FAMILY == 1
#define WIDTH GROUP  // threads sharing one row
#define ROWS_IN_FLIGHT ROWS
#else
#define WIDTH THREADS
#define ROWS_IN_FLIGHT 1
#endif

__device__ __forceinline__ void regs_rows(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                                          T* __restrict__ y, i64 rows, i64 cols, i64 ldx, ACC eps) {
    __shared__ ACC red[32];
    const int lane = threadIdx.x % WIDTH;
    const i64 tid = (i64)blockIdx.x * THREADS + threadIdx.x;
    const i64 first = tid / WIDTH * ROWS_IN_FLIGHT;
    // every lane of a warp runs the same iterations (the shuffles need all 32), so the loop
    // test uses the warp's first row; rows past the end are masked at the loads and stores
    const i64 warp_first = (tid & ~(i64)31) / WIDTH * ROWS_IN_FLIGHT;
    const i64 step = (i64)gridDim.x * THREADS / WIDTH * ROWS_IN_FLIGHT;
    const ACC inv_n = (ACC)1 / (ACC)cols;
    for (i64 it = 0; warp_first + it < rows; it += step) {
        const i64 r0 = first + it;
        ACC v[ROWS_IN_FLIGHT][PACKS * VEC];
#pragma unroll
        for (int r = 0; r < ROWS_IN_FLIGHT; r++) {  // every load of the rows in flight first
            const i64 row = r0 + r;
#pragma unroll
            for (int p = 0; p < PACKS; p++) {
                const i64 col = ((i64)p * WIDTH + lane) * VEC;
                if (row < rows && col < cols) {
                    const Pack pk = *reinterpret_cast<const Pack*>(x + row * ldx + col);
#pragma unroll
                    for (int e = 0; e < VEC; e++) v[r][p * VEC + e] = to_acc(pk.v[e]);
                } else {
#pragma unroll
                    for (int e = 0; e < VEC; e++) v[r][p * VEC + e] = 0;
                }
            }
        }
#pragma unroll
        for (int r = 0; r < ROWS_IN_FLIGHT; r++) {
            const i64 row = r0 + r;
#if RMS
            const ACC mean = 0;
#else
            ACC s = 0;
#pragma unroll
            for (int i = 0; i < PACKS * VEC; i++) s += v[r][i];
            const ACC mean = row_sum<WIDTH>(s, red) / (ACC)cols;  // a division: a constant row gives its value exactly
#endif
            ACC q = 0;
#pragma unroll
            for (int p = 0; p < PACKS; p++) {
                const bool in = ((i64)p * WIDTH + lane) * VEC < cols;  // padding is 0, not 0 - mean
#pragma unroll
                for (int e = 0; e < VEC; e++) {
                    const ACC d = in ? v[r][p * VEC + e] - mean : (ACC)0;
                    q += d * d;
                }
            }
            const ACC inv = inv_sqrt(row_sum<WIDTH>(q, red) * inv_n + eps);
#pragma unroll
            for (int p = 0; p < PACKS; p++) {
                const i64 col = ((i64)p * WIDTH + lane) * VEC;
                if (row < rows && col < cols)
                    *reinterpret_cast<Pack*>(y + row * cols + col) = finish(&v[r][p * VEC], mean, inv, w, b, col);
            }
        }
    }
}
#if FAMILY == 1
extern "C" __global__ void __launch_bounds__(THREADS) norm_warp(const T* x, const T* w, const T* b, T* y, i64 rows,
                                                                i64 cols, i64 ldx, ACC eps) {
    regs_rows(x, w, b, y, rows, cols, ldx, eps);
}
#else
extern "C" __global__ void __launch_bounds__(THREADS) norm_block(const T* x, const T* w, const T* b, T* y, i64 rows,
                                                                 i64 cols, i64 ldx, ACC eps) {
    regs_rows(x, w, b, y, rows, cols, ldx, eps);
}
#endif
#endif

#if FAMILY == 3
// -- a block per row of any length, re-read from L2 ---------------------------------------------------
#ifndef UNROLL
#define UNROLL 2  // loads in flight per thread and pass (4 spilled for 16-byte packs at 512 threads)
#endif
extern "C" __global__ void __launch_bounds__(THREADS) norm_loop(const T* __restrict__ x, const T* __restrict__ w,
                                                                const T* __restrict__ b, T* __restrict__ y, i64 rows,
                                                                i64 cols, i64 ldx, ACC eps) {
    __shared__ ACC red[32];
    const i64 nvec = cols / VEC;
    const ACC inv_n = (ACC)1 / (ACC)cols;
    for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
        const Pack* xr = reinterpret_cast<const Pack*>(x + row * ldx);
#if RMS
        const ACC mean = 0;
#else
        ACC s = 0;
        for (i64 i0 = threadIdx.x; i0 < nvec; i0 += (i64)THREADS * UNROLL) {
            Pack pk[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {  // UNROLL loads in flight before the first use
                const i64 i = i0 + (i64)u * THREADS;
                if (i < nvec) pk[u] = xr[i];
            }
#pragma unroll
            for (int u = 0; u < UNROLL; u++)
                if (i0 + (i64)u * THREADS < nvec)
#pragma unroll
                    for (int e = 0; e < VEC; e++) s += to_acc(pk[u].v[e]);
        }
        const ACC mean = row_sum<THREADS>(s, red) / (ACC)cols;
#endif
        ACC q = 0;
        for (i64 i0 = threadIdx.x; i0 < nvec; i0 += (i64)THREADS * UNROLL) {
            Pack pk[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                const i64 i = i0 + (i64)u * THREADS;
                if (i < nvec) pk[u] = xr[i];
            }
#pragma unroll
            for (int u = 0; u < UNROLL; u++)
                if (i0 + (i64)u * THREADS < nvec)
#pragma unroll
                    for (int e = 0; e < VEC; e++) {
                        const ACC d = to_acc(pk[u].v[e]) - mean;
                        q += d * d;
                    }
        }
        const ACC inv = inv_sqrt(row_sum<THREADS>(q, red) * inv_n + eps);
        Pack* yr = reinterpret_cast<Pack*>(y + row * cols);
        for (i64 i = threadIdx.x; i < nvec; i += THREADS) {
            const Pack pk = xr[i];
            ACC v[VEC];
#pragma unroll
            for (int e = 0; e < VEC; e++) v[e] = to_acc(pk.v[e]);
            yr[i] = finish(v, mean, inv, w, b, i * VEC);
        }
    }
}
#endif

#if FAMILY == 4 || FAMILY == 5
// -- batch_norm: y = (x - mean[c]) * scale[c] + bias[c] -------------------------------------------------
// The centring comes first, in ACC. Folding the mean into the bias (y = x * scale + shift, shift =
// bias - mean * scale) rounds x * scale (or, under an FMA, scale itself) and shift to ACC before
// they cancel: where the output is near zero against |mean * scale| the error is an ulp of
// |mean * scale|, not of |y| (float32, mean ~ 100, outputs ~ 0.01: ~1e-3 relative). x - mean is
// exact when x is within a factor two of the mean (Sterbenz), and its rounding otherwise is
// relative to |x - mean|. The extra subtraction per element is free: the kernels are memory-bound.
struct Channel {
    ACC mean, scale, bias;  // scale = weight / sqrt(var + eps); bias 0 when absent
};

__device__ __forceinline__ Channel channel_stats(const T* __restrict__ mean, const T* __restrict__ var,
                                                 const T* __restrict__ w, const T* __restrict__ b, i64 c, ACC eps) {
    Channel ch;
    ch.mean = to_acc(mean[c]);
    ch.scale = inv_sqrt(to_acc(var[c]) + eps);
#if HAS_W
    ch.scale *= to_acc(w[c]);
#endif
#if HAS_B
    ch.bias = to_acc(b[c]);
#else
    ch.bias = 0;
#endif
    return ch;
}

__device__ __forceinline__ T channel_apply(T x, const Channel& ch) {
#if HAS_B
    return from_acc(fma_acc(to_acc(x) - ch.mean, ch.scale, ch.bias));
#else
    return from_acc((to_acc(x) - ch.mean) * ch.scale);
#endif
}
#endif

#if FAMILY == 4
// Grid (x: chunks of VEC-packs of one plane, y: planes, looped past 65535). A plane of S
// elements starts at plane * S: with VEC > 1 the host guarantees S % VEC == 0 and alignment.
extern "C" __global__ void __launch_bounds__(THREADS) norm_planes(const T* __restrict__ x, const T* __restrict__ mean,
                                                                  const T* __restrict__ var, const T* __restrict__ w,
                                                                  const T* __restrict__ b, T* __restrict__ y,
                                                                  i64 planes, i64 channels, i64 spatial, ACC eps) {
    const i64 npk = spatial / VEC;
    for (i64 plane = blockIdx.y; plane < planes; plane += gridDim.y) {
        const Channel ch = channel_stats(mean, var, w, b, plane % channels, eps);
        const Pack* xp = reinterpret_cast<const Pack*>(x + plane * spatial);
        Pack* yp = reinterpret_cast<Pack*>(y + plane * spatial);
        for (i64 i = (i64)blockIdx.x * THREADS + threadIdx.x; i < npk; i += (i64)gridDim.x * THREADS) {
            Pack pk = xp[i];
#pragma unroll
            for (int e = 0; e < VEC; e++) pk.v[e] = channel_apply(pk.v[e], ch);
            yp[i] = pk;
        }
    }
}
#endif

#if FAMILY == 5
// Every element of (N, C, S) in one grid-stride loop; the channel from the flat index.
extern "C" __global__ void __launch_bounds__(THREADS) norm_flat(const T* __restrict__ x, const T* __restrict__ mean,
                                                                const T* __restrict__ var, const T* __restrict__ w,
                                                                const T* __restrict__ b, T* __restrict__ y, i64 n,
                                                                i64 channels, i64 spatial, ACC eps) {
    for (i64 i = (i64)blockIdx.x * THREADS + threadIdx.x; i < n; i += (i64)gridDim.x * THREADS) {
        const Channel ch = channel_stats(mean, var, w, b, (i / spatial) % channels, eps);
        y[i] = channel_apply(x[i], ch);
    }
}
#endif
