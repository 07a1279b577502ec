// conv2d, NCHW x OIHW (cross-correlation, as torch), every attribute: stride, 4-sided padding,
// dilation, groups, bias. x and w are contiguous (with element offsets xoff / woff); y is fresh.
//
// Build options: T, ACC, USE_FP64 / USE_FP16; ACT: the activation applied after the bias
// (epilogue.cl's ACTIVATE, prepended by the launcher; none without it).
//   conv_igemm:  implicit GEMM per group: (Og x Kc) weights times the (Kc x N*Ho*Wo) im2col
//                matrix, which is never stored: each B-tile element is gathered from x through
//                `tab` (per k = (c, i, j): the offset c*H*W + i*dh*W + j*dw and the tap's dy, dx).
//                Tile TM x TN x TK, WPTM x WPTN outputs per work-item; work-group (TN/WPTN, TM/WPTM).
//   conv_direct: one output per work-item, a plain loop over (c, i, j): the simple baseline.
//
// Both multiply padded taps' zeros in (as the reference does) rather than skip them, so a
// non-finite weight gives NaN at the borders on every device.

#ifndef ACTIVATE
#define ACTIVATE(v) (v)
#endif

#define CONV_ARGS                                                                                   \
    __global const T *x, const long xoff, __global const T *w, const long woff, __global const T *bias, \
        const long boff, const int has_bias, __global T *y, const int N, const int C, const int H,   \
        const int W, const int O, const int Ho, const int Wo, const int Og, const int Cg,             \
        const int sh, const int sw, const int pt, const int pl

#ifdef TM  // ------------------------------------------------------------------- conv_igemm
#define RTM (TM / WPTM)
#define RTN (TN / WPTN)
#define WG (RTM * RTN)
#define BROWS (WG / TN)  // B-tile rows loaded per pass (each work-item keeps one column)

__kernel __attribute__((reqd_work_group_size(RTN, RTM, 1)))
void conv_igemm(CONV_ARGS, __global const int4* tab, const int Kc) {
    __local T As[TK][TM + 1];
    __local T Bs[TK][TN];
    const int lx = get_local_id(0), ly = get_local_id(1), tid = ly * RTN + lx;
    const int p0 = get_group_id(0) * TN, m0 = get_group_id(1) * TM, g = get_group_id(2);
    const int HoWo = Ho * Wo, P = N * HoWo;

    // this work-item's B column (an output pixel): where its receptive field starts
    const int bc = tid % TN, br = tid / TN, p = p0 + bc;
    const int pn = p / HoWo, pq = p % HoWo;
    const int iy0 = (pq / Wo) * sh - pt, ix0 = (pq % Wo) * sw - pl;
    const long xbase = xoff + ((long)pn * C + (long)g * Cg) * H * W + (long)iy0 * W + ix0;
    __global const T* wg = w + woff + (long)(g * Og + m0) * Kc;

    ACC acc[WPTM][WPTN];
    #pragma unroll
    for (int i = 0; i < WPTM; i++)
        #pragma unroll
        for (int j = 0; j < WPTN; j++) acc[i][j] = (ACC)0;

    for (int k0 = 0; k0 < Kc; k0 += TK) {
        for (int idx = tid; idx < TM * TK; idx += WG) {
            int k = idx % TK, m = idx / TK;
            As[k][m] = (m0 + m < Og && k0 + k < Kc) ? wg[(long)m * Kc + k0 + k] : (T)0;
        }
        #pragma unroll
        for (int r = br; r < TK; r += BROWS) {
            int k = k0 + r;
            T v = (T)0;
            if (p < P && k < Kc) {
                int4 t = tab[k];
                int iy = iy0 + t.y, ix = ix0 + t.z;
                if (iy >= 0 && iy < H && ix >= 0 && ix < W) v = x[xbase + t.x];
            }
            Bs[r][bc] = v;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        #pragma unroll
        for (int k = 0; k < TK; k++) {
            ACC a[WPTM], b[WPTN];
            #pragma unroll
            for (int i = 0; i < WPTM; i++) a[i] = (ACC)As[k][ly + i * RTM];
            #pragma unroll
            for (int j = 0; j < WPTN; j++) b[j] = (ACC)Bs[k][lx + j * RTN];
            #pragma unroll
            for (int i = 0; i < WPTM; i++)
                #pragma unroll
                for (int j = 0; j < WPTN; j++) acc[i][j] += a[i] * b[j];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    #pragma unroll
    for (int j = 0; j < WPTN; j++) {
        int q = p0 + lx + j * RTN;
        if (q >= P) continue;
        long obase = (long)(q / HoWo) * O * HoWo + q % HoWo;
        #pragma unroll
        for (int i = 0; i < WPTM; i++) {
            int m = m0 + ly + i * RTM;
            if (m >= Og) continue;
            int o = g * Og + m;
            ACC r = acc[i][j];
            if (has_bias) r += (ACC)bias[boff + o];
            y[obase + (long)o * HoWo] = (T)ACTIVATE(r);
        }
    }
}
#endif  // TM

#ifdef DIRECT  // --------------------------------------------------------------- conv_direct
__kernel void conv_direct(CONV_ARGS, const int kh, const int kw, const int dh, const int dw) {
    const long id = get_global_id(0);
    const int HoWo = Ho * Wo;
    if (id >= (long)N * O * HoWo) return;
    const int ox = id % Wo, oy = (id / Wo) % Ho, o = (id / HoWo) % O, n = id / ((long)O * HoWo);
    const int g = o / Og;
    ACC acc = has_bias ? (ACC)bias[boff + o] : (ACC)0;
    for (int c = 0; c < Cg; c++) {
        __global const T* xc = x + xoff + ((long)n * C + g * Cg + c) * H * W;
        __global const T* wc = w + woff + ((long)o * Cg + c) * kh * kw;
        for (int i = 0; i < kh; i++) {
            int iy = oy * sh - pt + i * dh;
            bool row_in = iy >= 0 && iy < H;
            for (int j = 0; j < kw; j++) {
                int ix = ox * sw - pl + j * dw;
                // a padded tap still multiplies its zero in: 0 * inf must give NaN here as in
                // the reference (and in conv_igemm, whose tiles hold the zeros)
                ACC v = (row_in && ix >= 0 && ix < W) ? (ACC)xc[(long)iy * W + ix] : (ACC)0;
                acc += v * (ACC)wc[i * kw + j];
            }
        }
    }
    y[id] = (T)ACTIVATE(acc);
}
#endif  // DIRECT
