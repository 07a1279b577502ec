// softmax / log_softmax along one axis. The input is viewed as (outer, L, inner): row r is
// (r / inner, r % inner), its elements are `inner` apart (1 for the last axis).
//
// Build options: T, ACC (element / compute type), USE_FP64 / USE_FP16, LOG (0 softmax, 1 log_softmax).
//   softmax_rows:    TPR work-items per row, RPW rows per work-group (work-group TPR x RPW);
//                    VW vector width (1, 2, 4, 8, 16; > 1 only for the last axis with L % VW == 0
//                    and an aligned start, which the host checks); ONEPASS 1: the row is held in
//                    NV vectors per work-item (one read, one write), ONEPASS 0: the row is re-read
//                    (long rows). RED: 0 local memory, 1 NVIDIA warp shuffles (inline PTX, float
//                    only), 2 cl_khr_subgroups (RPW == 1 only).
//   softmax_columns: one work-item per row, walking down the column with an online max / sum:
//                    coalesced when inner is large.
// Math is done on VW-wide vectors (exp, fmax on vectors), which CPU devices map to SIMD.

#if RED == 2
#pragma OPENCL EXTENSION cl_khr_subgroups : enable
#endif

#define NEG_INF (-INFINITY)
#define ADD(a, b) ((a) + (b))

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#if VW == 1
#define VT T
#define VACC ACC
#define TO_ACC(v) ((ACC)(v))
#define TO_T(v) ((T)(v))
#define HRED(v, f) (v)
#else
#define VT CAT(T, VW)
#define VACC CAT(ACC, VW)
#define TO_ACC(v) CAT(convert_, VACC)(v)
#define TO_T(v) CAT(convert_, VT)(v)
// horizontal reduction of a vector by halves
#define HRED2(v, f) f((v).s0, (v).s1)
#define HRED4(v, f) HRED2(f((v).lo, (v).hi), f)
#define HRED8(v, f) HRED4(f((v).lo, (v).hi), f)
#define HRED16(v, f) HRED8(f((v).lo, (v).hi), f)
#define HRED(v, f) CAT(HRED, VW)(v, f)
#endif
// element e of a column group (VW adjacent rows, contiguous in memory)
#if VW == 1
#define LOADC(p, e) ((ACC)(p)[(long)(e) * inner])
#define STOREC(p, e, v) ((p)[(long)(e) * inner] = (T)(v))
#else
#define LOADC(p, e) TO_ACC(*(__global const VT*)((p) + (long)(e) * inner))
#define STOREC(p, e, v) (*(__global VT*)((p) + (long)(e) * inner) = TO_T(v))
#endif
#if VW == 1  // v where m is finite, 0 where m is -inf (an all -inf prefix sums nothing)
#define UNLESS_NEGINF(v, m) ((m) == NEG_INF ? (ACC)0 : (v))
#else
#define UNLESS_NEGINF(v, m) select((v), (VACC)(0), (m) == (VACC)(NEG_INF))
#endif

#ifdef TPR  // ------------------------------------------------------------------ softmax_rows
#define WARPS ((TPR + 31) / 32)

inline ACC combine(ACC a, ACC b, int is_max) { return is_max ? fmax(a, b) : a + b; }

#if RED == 1
inline float shfl_xor(float v, int mask) {
    float r;
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(v), "r"(mask));
    return r;
}
#endif

// Reduce v over the TPR work-items of this row. `buf` holds TPR values of this row and `buf2`
// 32; each reduction in a kernel has its own buffers, so no barrier is needed after it.
inline ACC row_reduce(ACC v, int is_max, int lx, __local ACC* buf, __local ACC* buf2) {
#if TPR == 1
    return v;
#elif RED == 1
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

// element e of the row (a vector of VW when VW > 1: then inner == 1)
#if VW == 1
#define LOADV(p, e) TO_ACC((p)[(long)(e) * inner])
#define STOREV(p, e, v) ((p)[(long)(e) * inner] = TO_T(v))
#else
#define LOADV(p, e) TO_ACC(*(__global const VT*)((p) + (e)))
#define STOREV(p, e, v) (*(__global VT*)((p) + (e)) = TO_T(v))
#endif

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
    VACC mv = (VACC)(NEG_INF), sv = (VACC)(0);

#if ONEPASS
    VACC v[NV];
    #pragma unroll
    for (int i = 0; i < NV; i++) {
        int e = (i * TPR + lx) * VW;
        v[i] = (active && e < L) ? LOADV(xr, e) : (VACC)(NEG_INF);
        mv = fmax(mv, v[i]);
    }
    const ACC m = row_reduce(HRED(mv, fmax), 1, lx, red_max[ly], red_max2[ly]);
    #pragma unroll
    for (int i = 0; i < NV; i++) {
        if ((i * TPR + lx) * VW < L) {
            VACC ex = exp(v[i] - m);
            sv += ex;
#if !LOG
            v[i] = ex;  // kept: the output is ex / s
#endif
        }
    }
    const ACC s = row_reduce(HRED(sv, ADD), 0, lx, red_sum[ly], red_sum2[ly]);
#if LOG
    const ACC logs = log(s);  // (x - m) - log(s): m + log(s) would round away log(s) for huge m
#else
    const ACC inv = (ACC)1 / s;
#endif
    #pragma unroll
    for (int i = 0; i < NV; i++) {
        int e = (i * TPR + lx) * VW;
        if (!active || e >= L) continue;
#if LOG
        STOREV(yr, e, (v[i] - m) - logs);
#else
        STOREV(yr, e, v[i] * inv);
#endif
    }
#else  // ONEPASS == 0: long rows, read three times
    for (int e = lx * VW; e < L && active; e += TPR * VW) mv = fmax(mv, LOADV(xr, e));
    const ACC m = row_reduce(HRED(mv, fmax), 1, lx, red_max[ly], red_max2[ly]);
    VACC comp = (VACC)(0);  // Kahan compensation: long rows make long serial sums
    for (int e = lx * VW; e < L && active; e += TPR * VW) {
        VACC yk = exp(LOADV(xr, e) - m) - comp, t = sv + yk;
        comp = (t - sv) - yk;
        sv = t;
    }
    const ACC s = row_reduce(HRED(sv, ADD), 0, lx, red_sum[ly], red_sum2[ly]);
#if LOG
    const ACC logs = log(s);
    for (int e = lx * VW; e < L && active; e += TPR * VW) STOREV(yr, e, (LOADV(xr, e) - m) - logs);
#else
    const ACC inv = (ACC)1 / s;
    for (int e = lx * VW; e < L && active; e += TPR * VW) STOREV(yr, e, exp(LOADV(xr, e) - m) * inv);
#endif
#endif
}
#endif  // TPR

#ifdef COLUMNS  // ---------------------------------------------------------- softmax_columns
// Each work-item takes VW adjacent rows (adjacent in the inner dim: inner % VW == 0), so every
// load is a VW-wide vector and neighbouring work-items read neighbouring vectors.
__kernel void softmax_columns(__global const T* x, const long xoff, __global T* y, const int rows, const int L,
                              const int inner) {
    const int row = get_global_id(0) * VW;
    if (row >= rows) return;
    const long base = (long)(row / inner) * L * inner + row % inner;
    __global const T* xr = x + xoff + base;
    __global T* yr = y + base;
    VACC m = (VACC)(NEG_INF), s = (VACC)(0), comp = (VACC)(0);  // comp: Kahan compensation
    for (int e = 0; e < L; e++) {  // online max and sum: one read
        VACC v = LOADC(xr, e), mnew = fmax(m, v);
        VACC scale = UNLESS_NEGINF(exp(m - mnew), mnew);  // rescale what was summed so far
        VACC add = UNLESS_NEGINF(exp(v - mnew), mnew);
        s *= scale;
        comp *= scale;
        VACC yk = add - comp, t = s + yk;
        comp = (t - s) - yk;
        s = t;
        m = mnew;
    }
#if LOG
    const VACC logs = log(s);
    for (int e = 0; e < L; e++) STOREC(yr, e, (LOADC(xr, e) - m) - logs);
#else
    const VACC inv = (VACC)(1) / s;
    for (int e = 0; e < L; e++) STOREC(yr, e, exp(LOADC(xr, e) - m) * inv);
#endif
}
#endif  // COLUMNS
