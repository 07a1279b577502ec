// softmax / log_softmax along one axis. log_softmax is (x - max) - log(sum): never x - (max + log(sum)),
// which cancels to 0 for values near the float range's end.
// One build per (DTYPE, FAMILY, tunables); each build has
// two entry points, softmax_<family> and log_softmax_<family>.
//
// Defines (injected by softmax.py):
//   DTYPE   0 float32, 1 float16, 2 bfloat16 (both computed in float32), 3 float64
//   VEC     elements per load / store (16 bytes: 4 float32, 8 float16, 2 float64), or 1
//   THREADS threads per block
//   FAMILY  1 warp:    GROUP (<= 32) threads per row, the row in registers (PACKS packs of VEC
//                      per thread), ROWS rows per thread group in flight
//           2 block:   a block per row, the row in registers (PACKS packs per thread)
//           3 online:  a block per row of any length: online max and sum in one read pass,
//                      then a second pass that re-reads (from L2 when the row fits) and writes
//           5 cluster: a row split over a cluster of CLUSTER blocks (sm_90), each holding PACKS
//                      packs per thread in registers; the blocks' partial statistics meet
//                      through distributed shared memory. Many small blocks per SM instead of
//                      one big one, so loads of one row overlap the reductions of another
//           4 strided: any axis, any strides: the input is (outer, n, inner) with element
//                      strides (so, sn, si); blockDim (TX, TY): TX threads across the inner dim
//                      (coalesced), TY across the reduced axis; online statistics
// Rows are (rows, cols) with row stride ldx and unit column stride for families 1-3; the output
// is always C-contiguous. A row of all -inf gives NaN (as the float64 reference does).
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
#ifndef CLUSTER
#define CLUSTER 2
#endif

#include "dtype.cuh"
#if DTYPE == 3
__device__ __forceinline__ ACC exp_acc(ACC v) { return exp(v); }
__device__ __forceinline__ ACC log_acc(ACC v) { return log(v); }
#define NEG_INF (-__longlong_as_double(0x7ff0000000000000LL))
#else
__device__ __forceinline__ ACC exp_acc(ACC v) { return __expf(v); }
__device__ __forceinline__ ACC log_acc(ACC v) { return logf(v); }
#define NEG_INF (-__int_as_float(0x7f800000))
#endif

struct __align__(sizeof(T) * VEC) Pack {
    T v[VEC];
};

template <int W>
__device__ __forceinline__ ACC group_max(ACC v) {
#pragma unroll
    for (int o = W / 2; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
template <int W>
__device__ __forceinline__ ACC group_sum(ACC v) {
#pragma unroll
    for (int o = W / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Online statistics (running max m, sum s of exp(x - m)); m == -inf means "nothing finite yet"
// and keeps s at 0, so a later finite value is not poisoned by exp(-inf - -inf).
__device__ __forceinline__ void stats_merge(ACC& m, ACC& s, ACC m2, ACC s2) {
    ACC mn = max(m, m2);
    if (mn != NEG_INF) s = s * exp_acc(m - mn) + s2 * exp_acc(m2 - mn);
    m = mn;
}
template <int W>
__device__ __forceinline__ void group_stats(ACC& m, ACC& s) {
#pragma unroll
    for (int o = W / 2; o > 0; o >>= 1) {
        ACC m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        stats_merge(m, s, m2, s2);
    }
}
// The final statistics of a row whose max is -inf: NaN everywhere, as the reference.
__device__ __forceinline__ ACC finish_sum(ACC m, ACC s) { return m == NEG_INF ? (ACC)0 / (ACC)0 : s; }

#if FAMILY == 1 || FAMILY == 2
// -- the row held in registers -----------------------------------------------------------------
#if FAMILY == 1
#define WIDTH GROUP                  // threads sharing one row
#define ROWS_IN_FLIGHT ROWS
#else
#define WIDTH THREADS
#define ROWS_IN_FLIGHT 1
#endif
#define NWARPS (THREADS / 32)

template <int W>
__device__ __forceinline__ ACC row_max(ACC v, ACC* red) {
    if (W <= 32) return group_max<(W <= 32 ? W : 32)>(v);
    v = group_max<32>(v);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    v = red[0];
#pragma unroll
    for (int i = 1; i < NWARPS; i++) v = max(v, red[i]);
    return v;
}
template <int W>
__device__ __forceinline__ ACC row_sum(ACC v, ACC* red) {
    if (W <= 32) return group_sum<(W <= 32 ? W : 32)>(v);
    v = group_sum<32>(v);
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
    __syncthreads();
    v = red[0];
#pragma unroll
    for (int i = 1; i < NWARPS; i++) v += red[i];
    return v;
}

template <bool LOG>
__device__ __forceinline__ void regs_rows(const T* __restrict__ x, T* __restrict__ y, i64 rows, i64 cols, i64 ldx) {
    __shared__ ACC red_max[32], red_sum[32];  // two arrays: no third barrier between the reductions
    const int lane = threadIdx.x % WIDTH;
    const i64 tid = (i64)blockIdx.x * THREADS + threadIdx.x;
    const i64 first = tid / WIDTH * ROWS_IN_FLIGHT;
    // every lane of a warp runs the same iterations (the shuffles need all 32), so the loop
    // test uses the warp's first row; rows past the end are masked at the loads and stores
    const i64 warp_first = (tid & ~(i64)31) / WIDTH * ROWS_IN_FLIGHT;
    const i64 step = (i64)gridDim.x * THREADS / WIDTH * ROWS_IN_FLIGHT;
    for (i64 it = 0; warp_first + it < rows; it += step) {
        const i64 r0 = first + it;
        ACC v[ROWS_IN_FLIGHT][PACKS * VEC];
#pragma unroll
        for (int r = 0; r < ROWS_IN_FLIGHT; r++) {
            const i64 row = r0 + r;
#pragma unroll
            for (int p = 0; p < PACKS; p++) {
                const i64 col = ((i64)p * WIDTH + lane) * VEC;
                if (row < rows && col < cols) {
                    Pack pk = *reinterpret_cast<const Pack*>(x + row * ldx + col);
#pragma unroll
                    for (int e = 0; e < VEC; e++) v[r][p * VEC + e] = to_acc(pk.v[e]);
                } else {
#pragma unroll
                    for (int e = 0; e < VEC; e++) v[r][p * VEC + e] = NEG_INF;
                }
            }
        }
#pragma unroll
        for (int r = 0; r < ROWS_IN_FLIGHT; r++) {
            const i64 row = r0 + r;
            ACC m = NEG_INF;
#pragma unroll
            for (int i = 0; i < PACKS * VEC; i++) m = max(m, v[r][i]);
            m = row_max<WIDTH>(m, red_max);
            ACC s = 0;
#pragma unroll
            for (int i = 0; i < PACKS * VEC; i++) {
                ACC e = exp_acc(v[r][i] - m);  // NaN for a row of -inf: the reference's answer
                s += e;
                if (!LOG) v[r][i] = e;
            }
            s = row_sum<WIDTH>(s, red_sum);
            const ACC k = LOG ? log_acc(s) : (ACC)1 / s;
#pragma unroll
            for (int p = 0; p < PACKS; p++) {
                const i64 col = ((i64)p * WIDTH + lane) * VEC;
                if (row < rows && col < cols) {
                    Pack pk;
#pragma unroll
                    for (int e = 0; e < VEC; e++) pk.v[e] = from_acc(LOG ? (v[r][p * VEC + e] - m) - k : v[r][p * VEC + e] * k);
                    *reinterpret_cast<Pack*>(y + row * cols + col) = pk;
                }
            }
        }
    }
}
#if FAMILY == 1
#define ENTRY(name) name##_warp
#else
#define ENTRY(name) name##_block
#endif
extern "C" __global__ void __launch_bounds__(THREADS) ENTRY(softmax)(const T* x, T* y, i64 rows, i64 cols, i64 ldx) {
    regs_rows<false>(x, y, rows, cols, ldx);
}
extern "C" __global__ void __launch_bounds__(THREADS) ENTRY(log_softmax)(const T* x, T* y, i64 rows, i64 cols, i64 ldx) {
    regs_rows<true>(x, y, rows, cols, ldx);
}
#endif

#if FAMILY == 3
// -- a block per row of any length: online statistics, then re-read and write ---------------------
#define NWARPS (THREADS / 32)
#ifndef UNROLL
#define UNROLL 4
#endif
template <bool LOG>
__device__ __forceinline__ void online_rows(const T* __restrict__ x, T* __restrict__ y, i64 rows, i64 cols, i64 ldx) {
    __shared__ ACC red_m[NWARPS], red_s[NWARPS];
    const i64 nvec = cols / VEC;
    for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
        const T* xr = x + row * ldx;
        ACC m = NEG_INF, s = 0;
        for (i64 i0 = threadIdx.x; i0 < nvec; i0 += (i64)THREADS * UNROLL) {
            Pack pk[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {  // UNROLL loads in flight before the first use
                const i64 i = i0 + (i64)u * THREADS;
                if (i < nvec) {
                    pk[u] = reinterpret_cast<const Pack*>(xr)[i];
                } else {
#pragma unroll
                    for (int e = 0; e < VEC; e++) pk[u].v[e] = from_acc(NEG_INF);
                }
            }
            ACC pm = NEG_INF;
#pragma unroll
            for (int u = 0; u < UNROLL; u++)
#pragma unroll
                for (int e = 0; e < VEC; e++) pm = max(pm, to_acc(pk[u].v[e]));
            const ACC mn = max(m, pm);
            if (mn != NEG_INF) {
                ACC ps = 0;
#pragma unroll
                for (int u = 0; u < UNROLL; u++)
#pragma unroll
                    for (int e = 0; e < VEC; e++) ps += exp_acc(to_acc(pk[u].v[e]) - mn);
                s = s * exp_acc(m - mn) + ps;
            }
            m = mn;
        }
        group_stats<32>(m, s);
        if (threadIdx.x % 32 == 0) red_m[threadIdx.x / 32] = m, red_s[threadIdx.x / 32] = s;
        __syncthreads();
        m = red_m[0], s = red_s[0];
#pragma unroll
        for (int w = 1; w < NWARPS; w++) stats_merge(m, s, red_m[w], red_s[w]);
        __syncthreads();  // red_* are rewritten by the next row
        s = finish_sum(m, s);
        const ACC k = LOG ? log_acc(s) : (ACC)1 / s;
        T* yr = y + row * cols;
        for (i64 i = threadIdx.x; i < nvec; i += THREADS) {
            Pack pk = reinterpret_cast<const Pack*>(xr)[i];
#pragma unroll
            for (int e = 0; e < VEC; e++) {
                const ACC v = to_acc(pk.v[e]);
                pk.v[e] = from_acc(LOG ? (v - m) - k : exp_acc(v - m) * k);
            }
            reinterpret_cast<Pack*>(yr)[i] = pk;
        }
    }
}
extern "C" __global__ void __launch_bounds__(THREADS) softmax_online(const T* x, T* y, i64 rows, i64 cols, i64 ldx) {
    online_rows<false>(x, y, rows, cols, ldx);
}
extern "C" __global__ void __launch_bounds__(THREADS) log_softmax_online(const T* x, T* y, i64 rows, i64 cols, i64 ldx) {
    online_rows<true>(x, y, rows, cols, ldx);
}
#endif

#if FAMILY == 4
// -- any axis, any strides: (outer, n, inner) -> contiguous ----------------------------------------
// Grid: x over inner in steps of TX, y over outer. Thread (tx, ty) owns column i = blockIdx.x*TX+tx
// and the reduced indices ty, ty+TY, ...; the TY partial statistics meet in shared memory.
template <bool LOG>
__device__ __forceinline__ void strided(const T* __restrict__ x, T* __restrict__ y, i64 n, i64 inner, i64 outer,
                                        i64 so, i64 sn, i64 si) {
    __shared__ ACC sm[THREADS], ss[THREADS];
    const int tx = threadIdx.x, ty = threadIdx.y, TX = blockDim.x, TY = blockDim.y;
    const i64 i = (i64)blockIdx.x * TX + tx;
    for (i64 o = blockIdx.y; o < outer; o += gridDim.y) {
        const T* xc = x + o * so + i * si;
        ACC m = NEG_INF, s = 0;
        if (i < inner) {
            i64 k = ty;
            for (; k + 3 * TY < n; k += 4 * TY) {  // four loads in flight
                ACC a = to_acc(xc[k * sn]), b = to_acc(xc[(k + TY) * sn]);
                ACC c = to_acc(xc[(k + 2 * TY) * sn]), d = to_acc(xc[(k + 3 * TY) * sn]);
                const ACC mn = max(max(m, max(a, b)), max(c, d));
                if (mn != NEG_INF)
                    s = s * exp_acc(m - mn) + exp_acc(a - mn) + exp_acc(b - mn) + exp_acc(c - mn) + exp_acc(d - mn);
                m = mn;
            }
            for (; k < n; k += TY) stats_merge(m, s, to_acc(xc[k * sn]), (ACC)1);
        }
        if (TY > 1) {
            sm[ty * TX + tx] = m, ss[ty * TX + tx] = s;
            __syncthreads();
            m = sm[tx], s = ss[tx];
            for (int t = 1; t < TY; t++) stats_merge(m, s, sm[t * TX + tx], ss[t * TX + tx]);
            __syncthreads();
        }
        s = finish_sum(m, s);
        const ACC kk = LOG ? log_acc(s) : (ACC)1 / s;
        if (i < inner) {
            T* yc = y + o * n * inner + i;
            for (i64 k = ty; k < n; k += TY) {
                const ACC v = to_acc(xc[k * sn]);
                yc[k * inner] = from_acc(LOG ? (v - m) - kk : exp_acc(v - m) * kk);
            }
        }
    }
}
extern "C" __global__ void __launch_bounds__(THREADS) softmax_strided(const T* x, T* y, i64 n, i64 inner, i64 outer,
                                                                    i64 so, i64 sn, i64 si) {
    strided<false>(x, y, n, inner, outer, so, sn, si);
}
extern "C" __global__ void __launch_bounds__(THREADS) log_softmax_strided(const T* x, T* y, i64 n, i64 inner,
                                                                        i64 outer, i64 so, i64 sn, i64 si) {
    strided<true>(x, y, n, inner, outer, so, sn, si);
}
#endif

#if FAMILY == 5 && defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
// clusters need sm_90: on older chips the entry points exist (so every build links) but trap;
// softmax.py offers the cluster family only on sm_90 and newer
extern "C" __global__ void softmax_cluster(const T*, T*, i64, i64, i64) { __trap(); }
extern "C" __global__ void log_softmax_cluster(const T*, T*, i64, i64, i64) { __trap(); }
#elif FAMILY == 5
// -- a row over a cluster of blocks; statistics through distributed shared memory -------------------
#define NWARPS (THREADS / 32)
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// Read the ACC at `p` (shared memory) of the cluster's block `rank`.
__device__ __forceinline__ ACC ld_cluster(const ACC* p, unsigned rank) {
    unsigned a;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(smem_addr(p)), "r"(rank));
#if DTYPE == 3
    double v;
    asm volatile("ld.shared::cluster.f64 %0, [%1];" : "=d"(v) : "r"(a) : "memory");
#else
    float v;
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(a) : "memory");
#endif
    return v;
}
template <bool LOG>
__device__ __forceinline__ void cluster_rows(const T* __restrict__ x, T* __restrict__ y, i64 rows, i64 cols, i64 ldx) {
    __shared__ ACC red_max[NWARPS], red_sum[NWARPS], cta_max[1], cta_sum[1];
    const unsigned rank = cluster_rank();
    const i64 row = blockIdx.x / CLUSTER;  // the grid is exactly rows * CLUSTER blocks
    const int warp = threadIdx.x / 32;
    ACC v[PACKS * VEC];
#pragma unroll
    for (int p = 0; p < PACKS; p++) {
        const i64 col = (((i64)p * CLUSTER + rank) * THREADS + threadIdx.x) * VEC;
        if (col < cols) {
            Pack pk = *reinterpret_cast<const Pack*>(x + row * ldx + col);
#pragma unroll
            for (int e = 0; e < VEC; e++) v[p * VEC + e] = to_acc(pk.v[e]);
        } else {
#pragma unroll
            for (int e = 0; e < VEC; e++) v[p * VEC + e] = NEG_INF;
        }
    }
    ACC m = NEG_INF;
#pragma unroll
    for (int i = 0; i < PACKS * VEC; i++) m = max(m, v[i]);
    m = group_max<32>(m);
    if (threadIdx.x % 32 == 0) red_max[warp] = m;
    __syncthreads();
    m = red_max[0];
#pragma unroll
    for (int w = 1; w < NWARPS; w++) m = max(m, red_max[w]);
    if (threadIdx.x == 0) cta_max[0] = m;
    cluster_sync();
#pragma unroll
    for (int c = 0; c < CLUSTER; c++) m = max(m, ld_cluster(cta_max, c));
    ACC s = 0;
#pragma unroll
    for (int i = 0; i < PACKS * VEC; i++) {
        ACC e = exp_acc(v[i] - m);
        s += e;
        if (!LOG) v[i] = e;
    }
    s = group_sum<32>(s);
    if (threadIdx.x % 32 == 0) red_sum[warp] = s;
    __syncthreads();
    s = red_sum[0];
#pragma unroll
    for (int w = 1; w < NWARPS; w++) s += red_sum[w];
    if (threadIdx.x == 0) cta_sum[0] = s;
    cluster_sync();
    s = 0;
#pragma unroll
    for (int c = 0; c < CLUSTER; c++) s += ld_cluster(cta_sum, c);
    const ACC k = LOG ? log_acc(s) : (ACC)1 / s;
#pragma unroll
    for (int p = 0; p < PACKS; p++) {
        const i64 col = (((i64)p * CLUSTER + rank) * THREADS + threadIdx.x) * VEC;
        if (col < cols) {
            Pack pk;
#pragma unroll
            for (int e = 0; e < VEC; e++) pk.v[e] = from_acc(LOG ? (v[p * VEC + e] - m) - k : v[p * VEC + e] * k);
            *reinterpret_cast<Pack*>(y + row * cols + col) = pk;
        }
    }
    cluster_sync();  // keep this block's shared memory alive until every block has read it
}
extern "C" __global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(THREADS)
    softmax_cluster(const T* x, T* y, i64 rows, i64 cols, i64 ldx) {
    cluster_rows<false>(x, y, rows, cols, ldx);
}
extern "C" __global__ void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(THREADS)
    log_softmax_cluster(const T* x, T* y, i64 rows, i64 cols, i64 ldx) {
    cluster_rows<true>(x, y, rows, cols, ldx);
}
#endif
