// softmax over the last axis of a C-contiguous float32 (rows, cols) array: one work-group of WG
// work-items per row. WG (a power of two) arrives as a build option, -DWG=128.
// Three passes over the row (max, sum of exponentials, write); the reductions go through local memory.
// A row of all -inf gives NaN, as the float64 reference does.

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void softmax_rows(__global const float* x, const long xoff, __global float* y, const int cols) {
    __local float red[WG];
    const int lid = get_local_id(0);
    __global const float* xr = x + xoff + (long)get_group_id(0) * cols;
    __global float* yr = y + (long)get_group_id(0) * cols;

    float m = -INFINITY;
    for (int i = lid; i < cols; i += WG) m = fmax(m, xr[i]);
    red[lid] = m;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (lid < s) red[lid] = fmax(red[lid], red[lid + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    m = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);  // everyone has read red[0] before it is reused

    float sum = 0.0f;
    for (int i = lid; i < cols; i += WG) sum += exp(xr[i] - m);
    red[lid] = sum;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (lid < s) red[lid] += red[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float inv = 1.0f / red[0];
    for (int i = lid; i < cols; i += WG) yr[i] = exp(xr[i] - m) * inv;
}
