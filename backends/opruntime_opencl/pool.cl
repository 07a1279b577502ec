// max_pool2d, avg_pool2d and adaptive_avg_pool2d: one work-item per output element.
//
// Build options: T, ACC (element / accumulator type: half is summed in float), USE_FP64 / USE_FP16.
// NDRange (OW, OH, planes), planes = N * C; the output is C-contiguous (N, C, OH, OW). The input
// is read in place through its element strides (sn, sc, sh, sw) from element `xoff` of its
// buffer, so transposed or sliced views need no copy.
//
// max: padded taps are skipped (they count as -inf); a NaN in the window gives NaN.
// avg: torch's divisor: the window clipped to the padded input (`include` 1) or to the input.
// adaptive: output i of a dim L pooled to O averages [floor(i*L/O), ceil((i+1)*L/O)).

#define NEG_INF (-INFINITY)

#define POOL_ARGS                                                                               \
    __global const T *x, const long xoff, __global T *y, const int C, const int H, const int W,  \
        const int OH, const int OW, const long planes, const long sn, const long sc, const long sh, \
        const long sw

// The plane of work-item (ow, oh, p), or 0 when it lies past the output (a rounded-up NDRange).
#define PLANE_OR_RETURN                                                     \
    const int ow = get_global_id(0), oh = get_global_id(1);                 \
    const long p = get_global_id(2);                                        \
    if (ow >= OW || oh >= OH || p >= planes) return;                        \
    __global const T *xp = x + xoff + (p / C) * sn + (p % C) * sc;          \
    const long out = (p * OH + oh) * OW + ow

__kernel void max_pool2d(POOL_ARGS, const int kh, const int kw, const int strh, const int strw, const int ph,
                         const int pw, const int dh, const int dw, const int include) {
    PLANE_OR_RETURN;
    const int h0 = oh * strh - ph, w0 = ow * strw - pw;
    ACC m = NEG_INF;
    for (int i = 0; i < kh; ++i) {
        const int ih = h0 + i * dh;
        if (ih < 0 || ih >= H) continue;
        for (int j = 0; j < kw; ++j) {
            const int iw = w0 + j * dw;
            if (iw < 0 || iw >= W) continue;
            const ACC v = (ACC)xp[ih * sh + iw * sw];
            if (v > m || isnan(v)) m = v;  // once NaN, nothing compares greater: NaN stays
        }
    }
    y[out] = (T)m;
}

__kernel void avg_pool2d(POOL_ARGS, const int kh, const int kw, const int strh, const int strw, const int ph,
                         const int pw, const int dh, const int dw, const int include) {
    PLANE_OR_RETURN;
    const int h0 = oh * strh - ph, w0 = ow * strw - pw;
    const int h1 = min(h0 + kh, H + ph), w1 = min(w0 + kw, W + pw);
    const int pool = (h1 - h0) * (w1 - w0);
    const int hs = max(h0, 0), ws = max(w0, 0), he = min(h1, H), we = min(w1, W);
    ACC s = (ACC)0;
    for (int ih = hs; ih < he; ++ih)
        for (int iw = ws; iw < we; ++iw) s += (ACC)xp[ih * sh + iw * sw];
    const int div = include ? pool : (he - hs) * (we - ws);
    y[out] = (T)(he > hs && we > ws ? s / (ACC)div : (ACC)0);
}

__kernel void adaptive_avg_pool2d(POOL_ARGS) {
    PLANE_OR_RETURN;
    const int hs = (int)(((long)oh * H) / OH), he = (int)(((long)(oh + 1) * H + OH - 1) / OH);
    const int ws = (int)(((long)ow * W) / OW), we = (int)(((long)(ow + 1) * W + OW - 1) / OW);
    ACC s = (ACC)0;
    for (int ih = hs; ih < he; ++ih)
        for (int iw = ws; iw < we; ++iw) s += (ACC)xp[ih * sh + iw * sw];
    y[out] = (T)(s / (ACC)((he - hs) * (we - ws)));
}
