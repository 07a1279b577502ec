// layer_norm / rms_norm: a work-group of WG work-items per row, the row's sums reduced in local
// memory; batch_norm: one work-item per element, the channel's scale computed from its vectors.
//
// Build options: T, ACC (element / compute type), USE_FP64 / USE_FP16, WG (work-items per row, a
// power of two), RMS (0 layer_norm, 1 rms_norm). Which optional vectors are present (weight,
// bias) is an argument, not a build option, so one program serves every call of a dtype.
// Rows are contiguous (the host gathers strided inputs); x, w and b start at element offsets.

#ifdef WG  // ------------------------------------------------------------------------ norm_rows
// The sum of v over the work-group (every work-item gets it). `buf` holds WG values.
inline ACC group_sum(ACC v, __local ACC* buf) {
    const int lx = get_local_id(0);
    buf[lx] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int o = WG / 2; o > 0; o /= 2) {
        if (lx < o) buf[lx] += buf[lx + o];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const ACC r = buf[0];
    barrier(CLK_LOCAL_MEM_FENCE);  // buf is reused by the next sum
    return r;
}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void norm_rows(__global const T* x, const long xoff, __global const T* w, const long woff,
               __global const T* b, const long boff, __global T* y, const int cols, const int has_w,
               const int has_b, const ACC eps) {
    __local ACC buf[WG];
    const int lx = get_local_id(0);
    const long row = get_group_id(0);
    __global const T* xr = x + xoff + row * cols;
    __global T* yr = y + row * cols;
    const ACC inv_n = (ACC)1 / (ACC)cols;
#if RMS
    const ACC mean = 0;
#else
    ACC s = 0;
    for (int i = lx; i < cols; i += WG) s += (ACC)xr[i];
    const ACC mean = group_sum(s, buf) * inv_n;
#endif
    ACC q = 0;  // the second pass re-reads the row (from cache): exact two-pass variance
    for (int i = lx; i < cols; i += WG) {
        const ACC d = (ACC)xr[i] - mean;
        q += d * d;
    }
    const ACC inv = (ACC)1 / sqrt(group_sum(q, buf) * inv_n + eps);
    for (int i = lx; i < cols; i += WG) {
        ACC v = ((ACC)xr[i] - mean) * inv;
        if (has_w) v *= (ACC)w[woff + i];
        if (has_b) v += (ACC)b[boff + i];
        yr[i] = (T)v;
    }
}
#endif  // WG

#ifdef BATCH  // ----------------------------------------------------------------- batch_norm
// The global range is (S, N * C): dim 0 runs over the spatial positions of one (n, c) plane.
__kernel void batch_norm(__global const T* x, const long xoff, __global const T* mean, const long moff,
                         __global const T* var, const long voff, __global const T* w, const long woff,
                         __global const T* b, const long boff, __global T* y, const int channels,
                         const long spatial, const int has_w, const int has_b, const ACC eps) {
    const long i = get_global_id(0);
    const long plane = get_global_id(1);
    if (i >= spatial) return;
    const int c = (int)(plane % channels);
    ACC scale = (ACC)1 / sqrt((ACC)var[voff + c] + eps);
    if (has_w) scale *= (ACC)w[woff + c];
    ACC v = ((ACC)x[xoff + plane * spatial + i] - (ACC)mean[moff + c]) * scale;
    if (has_b) v += (ACC)b[boff + c];
    y[plane * spatial + i] = (T)v;
}
#endif  // BATCH
