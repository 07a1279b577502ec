// scaled_dot_product_attention: softmax(q k^T * scale + mask) v, one work-group per tile of BM
// query rows of one (batch, head), an online softmax over tiles of BN keys (no L x S buffer).
//
// Build options:
//   T, ACC          element / accumulation type (half computes in float); USE_FP64 / USE_FP16
//   E, EV           head dims of q / k and of v (compile-time: private arrays and unrolled loops)
//   BM, BN          query rows per work-group, keys per tile
//   TPR             work-items per row group: they split a tile's keys for the scores and the
//                   value columns for the output (a power of two)
//   RM              query rows per work-item (rows rg, rg + RG, ...; RG = BM / RM row groups)
//   MASK            0 none, 1 boolean (uchar, 0: the key takes no part), 2 additive (T)
//   CAUSAL          1: key j is visible to query i iff j <= i (top-left); key tiles past a query
//                   tile's last row are never visited
//
// Work-group: WG = TPR * RG work-items, 1-D; work-item lid is (rg = lid / TPR, t = lid % TPR).
// Local memory: the Q tile (BM x E, rows padded), one K / V tile buffer (K stored transposed,
// E x BN, so neighbouring work-items read neighbouring keys; then V, BN x VSTR), the tile's
// probabilities (BM x BN, ACC) and the per-work-item partial row maxima (BM x TPR, ACC).
//
// Per key tile, three barriers:
//   1. K tile loaded; each work-item forms RM x NJ scores (keys t, t + TPR, ...) in registers,
//      scaled into the log2 domain, masked, and its partial row maxima -> local.
//   2. V tile loaded over the K tile; each row's new maximum from the TPR partials; the row's
//      accumulators (RM x NC, columns t, t + TPR, ...) rescaled by exp2(m_old - m_new); p =
//      exp2(s - m_new) -> local; each work-item keeps a partial row sum of its own keys' p (all
//      work-items of a row rescale by the same factor, so the partials add up at the end).
//   3. acc += P V over the tile.
// A row whose every key is masked keeps m = -inf: its p are 0 (exp2(-inf - 0)) and its sum 0, and
// it is written as zeros. A NaN score (a NaN in an additive mask) makes the row's maximum NaN
// (NMAX propagates NaN, unlike fmax), so the row comes out NaN, as the reference.
//
// Operands are read in place through their element strides (batch, head, row, column), any
// layout; a broadcast batch has batch stride 0, and heads are shared by h / (H / Hx) (GQA). The
// mask's broadcast rows / columns have stride 0. The output is contiguous (B, H, L, EV).

#define RG (BM / RM)
#define WG (TPR * RG)
#define NJ (BN / TPR)
#define NC ((EV + TPR - 1) / TPR)
#define QSTR (E + 1)        // Q tile row stride: odd, so the row groups' reads hit distinct banks
#define KSTR (BN + 1)       // K^T tile row stride (per head-dim element)
#define VSTR (NC * TPR)     // V tile row stride: columns EV.. are zero-filled
#define PSTR (BN + 1)
#define KV_SIZE ((E * KSTR) > (BN * VSTR) ? (E * KSTR) : (BN * VSTR))
#define LOG2E ((ACC)1.4426950408889634)
#define NEG_INF ((ACC)(-INFINITY))
// max that propagates NaN (fmax returns the other operand)
#define NMAX(a, b) (((a) > (b) || isnan(a)) ? (a) : (b))

#if MASK == 1
#define MT uchar
#else
#define MT T
#endif

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void attention(__global const T* q, const long qoff, const long qsb, const long qsh, const long qsl, const long qse,
               const int qg,
               __global const T* k, const long koff, const long ksb, const long ksh, const long ksl, const long kse,
               const int kg,
               __global const T* v, const long voff, const long vsb, const long vsh, const long vsl, const long vse,
               const int vg,
               __global const MT* mask, const long moff, const long msb, const long msh, const long msl,
               const long mss, const int mg,
               __global T* out, const int H, const int L, const int S, const int BH, const ACC scale) {
    __local T qs[BM * QSTR];
    __local T kv[KV_SIZE];
    __local ACC ps[BM * PSTR];
    __local ACC mx[BM * TPR];

    const int lid = get_local_id(0), t = lid % TPR, rg = lid / TPR;
    const int group = get_group_id(0);
    const int ntiles = (L + BM - 1) / BM;
    // the heaviest (causal: last) query tiles first, every (batch, head) of a tile together
    const int tile = ntiles - 1 - group / BH, bh = group % BH;
    const int b = bh / H, h = bh % H, i0 = tile * BM;

    __global const T* qp = q + qoff + b * qsb + (h / qg) * qsh;
    __global const T* kp = k + koff + b * ksb + (h / kg) * ksh;
    __global const T* vp = v + voff + b * vsb + (h / vg) * vsh;
#if MASK
    __global const MT* mp = mask + moff + b * msb + (h / mg) * msh;
#endif

    for (int idx = lid; idx < BM * E; idx += WG) {
        const int r = idx / E, e = idx % E, i = i0 + r;
        qs[r * QSTR + e] = i < L ? qp[i * qsl + e * qse] : (T)0;
    }

    ACC acc[RM][NC], m[RM], l[RM];
    for (int rm = 0; rm < RM; rm++) {
        m[rm] = NEG_INF;
        l[rm] = 0;
        for (int c = 0; c < NC; c++) acc[rm][c] = 0;
    }
#if MASK == 2
    const ACC s2 = scale;
#else
    const ACC s2 = scale * LOG2E;  // scores go straight into the log2 domain
#endif
#if CAUSAL
    const int jend = min(S, min(L, i0 + BM));  // keys past the tile's last row: masked for every row
#else
    const int jend = S;
#endif

    for (int j0 = 0; j0 < jend; j0 += BN) {
        barrier(CLK_LOCAL_MEM_FENCE);  // the last tile's P V (and, first, the Q tile's stores) done
        for (int idx = lid; idx < BN * E; idx += WG) {
            const int r = idx / E, e = idx % E, j = j0 + r;
            kv[e * KSTR + r] = j < S ? kp[j * ksl + e * kse] : (T)0;
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        // 1. scores, in registers
        ACC s[RM][NJ];
        for (int rm = 0; rm < RM; rm++)
            for (int n = 0; n < NJ; n++) s[rm][n] = 0;
        for (int e = 0; e < E; e++) {
            ACC kk[NJ];
            for (int n = 0; n < NJ; n++) kk[n] = (ACC)kv[e * KSTR + t + n * TPR];
            for (int rm = 0; rm < RM; rm++) {
                const ACC qq = (ACC)qs[(rg + rm * RG) * QSTR + e];
                for (int n = 0; n < NJ; n++) s[rm][n] = fma(qq, kk[n], s[rm][n]);
            }
        }
        for (int rm = 0; rm < RM; rm++) {
            const int r = rg + rm * RG, i = i0 + r;
            ACC pm = NEG_INF;
            for (int n = 0; n < NJ; n++) {
                const int j = j0 + t + n * TPR;
                ACC x = s[rm][n] * s2;
#if MASK == 2
                if (i < L && j < S) x = (x + (ACC)mp[i * msl + j * mss]) * LOG2E;
#elif MASK == 1
                if (i < L && j < S && !mp[i * msl + j * mss]) x = NEG_INF;
#endif
#if CAUSAL
                if (j > i) x = NEG_INF;
#endif
                if (j >= S) x = NEG_INF;
                s[rm][n] = x;
                pm = NMAX(pm, x);
            }
            mx[r * TPR + t] = pm;
        }
        barrier(CLK_LOCAL_MEM_FENCE);  // K read by all; partial maxima written

        // 2. V over K; the online softmax update
        for (int idx = lid; idx < BN * VSTR; idx += WG) {
            const int r = idx / VSTR, c = idx % VSTR, j = j0 + r;
            kv[r * VSTR + c] = (j < S && c < EV) ? vp[j * vsl + c * vse] : (T)0;
        }
        for (int rm = 0; rm < RM; rm++) {
            const int r = rg + rm * RG;
            ACC mt = m[rm];
            for (int u = 0; u < TPR; u++) mt = NMAX(mt, mx[r * TPR + u]);
            const ACC base = mt == NEG_INF ? (ACC)0 : mt;  // a row masked so far stays at zero
            const ACC alpha = exp2(m[rm] - base);
            m[rm] = mt;
            ACC sum = l[rm] * alpha;
            for (int c = 0; c < NC; c++) acc[rm][c] *= alpha;
            for (int n = 0; n < NJ; n++) {
                const ACC p = exp2(s[rm][n] - base);
                sum += p;
                ps[r * PSTR + t + n * TPR] = p;
            }
            l[rm] = sum;
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        // 3. acc += P V
        const int jn = min(BN, jend - j0);
        for (int jj = 0; jj < jn; jj++) {
            ACC vv[NC];
            for (int c = 0; c < NC; c++) vv[c] = (ACC)kv[jj * VSTR + t + c * TPR];
            for (int rm = 0; rm < RM; rm++) {
                const ACC p = ps[(rg + rm * RG) * PSTR + jj];
                for (int c = 0; c < NC; c++) acc[rm][c] = fma(p, vv[c], acc[rm][c]);
            }
        }
    }

    // the row sums: each work-item's partial over its own keys, added across the row group
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int rm = 0; rm < RM; rm++) mx[(rg + rm * RG) * TPR + t] = l[rm];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int rm = 0; rm < RM; rm++) {
        const int r = rg + rm * RG, i = i0 + r;
        if (i >= L) continue;
        ACC sum = 0;
        for (int u = 0; u < TPR; u++) sum += mx[r * TPR + u];
        const ACC inv = sum == (ACC)0 ? (ACC)0 : (ACC)1 / sum;  // every key masked: zeros
        __global T* o = out + ((long)bh * L + i) * EV;
        for (int c = 0; c < NC; c++) {
            const int col = t + c * TPR;
            if (col < EV) o[col] = (T)(acc[rm][c] * inv);
        }
    }
}
