// softmax / log_softmax along one axis. The input is viewed as (outer, L, inner): row r is
// (r / inner, r % inner), its elements are `inner` apart (1 for the last axis).
//
// Build options: T, ACC (element / compute type), USE_FP64 / USE_FP16, LOG (0 softmax, 1 log_softmax).
//   softmax_rows:    TPR work-items per row, RPW rows per work-group (work-group TPR x RPW),
//                    VW vector width (> 1 only for the last axis, aligned rows), NV vectors per
//                    work-item held in registers (ONEPASS 1: one read, one write) or ONEPASS 0 (the
//                    row is re-read: long rows). RED: 0 local memory, 1 NVIDIA warp shuffles
//                    (inline PTX), 2 cl_khr_subgroups (RPW == 1 only).
//   softmax_columns: one work-item per row, reading down the column: coalesced when inner is large.

#ifdef USE_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
#ifdef USE_FP16
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#endif
#if RED == 2
#pragma OPENCL EXTENSION cl_khr_subgroups : enable
#endif

#define NEG_INF (-INFINITY)

inline ACC finish(ACC x, ACC m, ACC s) {
#if LOG
    return x - m - log(s);
#else
    return exp(x - m) / s;
#endif
}

#ifdef TPR  // ------------------------------------------------------------------ softmax_rows
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#if VW == 1
#define VT T
#elif VW == 2
#define VT CAT(T, 2)
#define VGET(v, i) ((i) == 0 ? (v).s0 : (v).s1)
#define VMAKE(t) ((VT)((t)[0], (t)[1]))
#elif VW == 4
#define VT CAT(T, 4)
#define VGET(v, i) ((i) == 0 ? (v).s0 : (i) == 1 ? (v).s1 : (i) == 2 ? (v).s2 : (v).s3)
#define VMAKE(t) ((VT)((t)[0], (t)[1], (t)[2], (t)[3]))
#endif
#define WARPS ((TPR + 31) / 32)

inline ACC combine(ACC a, ACC b, int is_max) { return is_max ? fmax(a, b) : a + b; }

#if RED == 1
inline float shfl_xor(float v, int mask) {
    float r;
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(v), "r"(mask));
    return r;
}
#endif

// Reduce v over the TPR work-items of this row. `buf` holds (at least) TPR values of this row
// and `buf2` 32; each reduction of a kernel gets its own buffers, so no barrier is needed after.
inline ACC row_reduce(ACC v, int is_max, int lx, __local ACC* buf, __local ACC* buf2) {
#if RED == 1
    #pragma unroll
    for (int o = (TPR < 32 ? TPR : 32) / 2; o > 0; o /= 2) v = combine(v, shfl_xor(v, o), is_max);
#if TPR > 32
    if ((lx & 31) == 0) buf[lx / 32] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    v = buf[0];
    #pragma unroll
    for (int w = 1; w < WARPS; w++) v = combine(v, buf[w], is_max);
#endif
    return v;
#elif RED == 2
    v = is_max ? sub_group_reduce_max(v) : sub_group_reduce_add(v);
    if (get_sub_group_local_id() == 0) buf[get_sub_group_id()] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    v = buf[0];
    for (uint w = 1; w < get_num_sub_groups(); w++) v = combine(v, buf[w], is_max);
    return v;
#else
    buf[lx] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
#if TPR > 32
    if (lx < 32) {  // level 1: 32 work-items fold TPR / 32 values each
        ACC r = buf[lx];
        for (int j = lx + 32; j < TPR; j += 32) r = combine(r, buf[j], is_max);
        buf2[lx] = r;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    buf = buf2;
#endif
    ACC r = buf[0];  // level 2: every work-item folds the (at most 32) partials itself
    #pragma unroll
    for (int j = 1; j < (TPR < 32 ? TPR : 32); j++) r = combine(r, buf[j], is_max);
    return r;
#endif
}

__kernel __attribute__((reqd_work_group_size(TPR, RPW, 1)))
void softmax_rows(__global const T* x, const long xoff, __global T* y, const int rows, const int L,
                  const int inner) {
    __local ACC red_max[RPW][TPR], red_sum[RPW][TPR];
    __local ACC red_max2[RPW][32], red_sum2[RPW][32];
    const int lx = get_local_id(0), ly = get_local_id(1);
    const int row = get_group_id(1) * RPW + ly;
    const bool active = row < rows;  // idle rows still take part in the barriers
    const long base = (long)(row / inner) * L * inner + row % inner;
    __global const T* xr = x + xoff + base;
    __global T* yr = y + base;
    ACC m = NEG_INF, s = (ACC)0;

#if ONEPASS
    ACC v[NV * VW];
    #pragma unroll
    for (int i = 0; i < NV; i++) {
        int e = (i * TPR + lx) * VW;
#if VW == 1
        v[i] = (active && e < L) ? (ACC)xr[(long)e * inner] : NEG_INF;
#else
        if (active && e < L) {  // L % VW == 0 and the row is aligned (the host checks)
            VT t = *(__global const VT*)(xr + e);
            #pragma unroll
            for (int c = 0; c < VW; c++) v[i * VW + c] = (ACC)VGET(t, c);
        } else {
            #pragma unroll
            for (int c = 0; c < VW; c++) v[i * VW + c] = NEG_INF;
        }
#endif
        #pragma unroll
        for (int c = 0; c < VW; c++) m = fmax(m, v[i * VW + c]);
    }
    m = row_reduce(m, 1, lx, red_max[ly], red_max2[ly]);
    #pragma unroll
    for (int i = 0; i < NV * VW; i++) {
        int e = (i / VW * TPR + lx) * VW + i % VW;
        if (e < L) {
            ACC ex = exp(v[i] - m);
            s += ex;
#if !LOG
            v[i] = ex;  // kept: the output is ex / s
#endif
        }
    }
    s = row_reduce(s, 0, lx, red_sum[ly], red_sum2[ly]);
#if !LOG
    const ACC inv = (ACC)1 / s;
#endif
    #pragma unroll
    for (int i = 0; i < NV; i++) {
        int e = (i * TPR + lx) * VW;
        if (!active || e >= L) continue;
#if LOG
        ACC lse = m + log(s);
#define OUT(val) ((val) - lse)
#else
#define OUT(val) ((val) * inv)
#endif
#if VW == 1
        yr[(long)e * inner] = (T)OUT(v[i]);
#else
        T t[VW];
        #pragma unroll
        for (int c = 0; c < VW; c++) t[c] = (T)OUT(v[i * VW + c]);
        *(__global VT*)(yr + e) = VMAKE(t);
#endif
#undef OUT
    }
#else  // ONEPASS == 0: long rows, read three times
    for (int e = lx; e < L && active; e += TPR) m = fmax(m, (ACC)xr[(long)e * inner]);
    m = row_reduce(m, 1, lx, red_max[ly], red_max2[ly]);
    for (int e = lx; e < L && active; e += TPR) s += exp((ACC)xr[(long)e * inner] - m);
    s = row_reduce(s, 0, lx, red_sum[ly], red_sum2[ly]);
    for (int e = lx; e < L && active; e += TPR) yr[(long)e * inner] = (T)finish((ACC)xr[(long)e * inner], m, s);
#endif
}
#endif  // TPR

#ifdef COLUMNS  // ---------------------------------------------------------- softmax_columns
__kernel void softmax_columns(__global const T* x, const long xoff, __global T* y, const int rows, const int L,
                              const int inner) {
    const int row = get_global_id(0);
    if (row >= rows) return;
    const long base = (long)(row / inner) * L * inner + row % inner;
    __global const T* xr = x + xoff + base;
    ACC m = NEG_INF, s = (ACC)0;
    for (int e = 0; e < L; e++) {  // online max and sum: one read
        ACC v = (ACC)xr[(long)e * inner];
        if (v > m) {
            s = s * exp(m - v) + (ACC)1;
            m = v;
        } else if (v != NEG_INF) {
            s += exp(v - m);
        }
    }
    for (int e = 0; e < L; e++) y[base + (long)e * inner] = (T)finish((ACC)xr[(long)e * inner], m, s);
}
#endif  // COLUMNS
