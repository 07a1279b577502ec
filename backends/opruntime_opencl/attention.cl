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
//   VW              vector width (1, 2, 4, 8, 16) along the keys and the value columns: work-item
//                   t takes key vectors t, t + TPR, ... of the tile and column vectors t, t + TPR,
//                   ...; CPUs use one work-item per row group (TPR = 1) and SIMD-wide VW
//   KPAD            padding of the K^T and P rows in local memory (bank conflicts / alignment)
//   MASK            0 none, 1 boolean (uchar, 0: the key takes no part), 2 additive (T)
//   CAUSAL          1: key j is visible to query i iff j <= i (top-left); key tiles past a query
//                   tile's last row are never visited
//
// Work-group: WG = TPR * RG work-items, 1-D; work-item lid is (rg = lid / TPR, t = lid % TPR).
// Local memory: the Q tile (BM x E, rows padded), one K / V tile buffer (K stored transposed,
// E x BN, so a work-item's keys are contiguous; then V, BN x VSTR), the tile's probabilities
// (BM x BN, ACC) and the per-work-item partial row maxima (BM x TPR, ACC).
//
// Per key tile, three barriers:
//   1. K tile loaded; each work-item forms RM x NJV score vectors in registers, scaled into the
//      log2 domain, masked, and its partial row maxima -> local.
//   2. V tile loaded over the K tile; each row's new maximum from the TPR partials; the row's
//      accumulators (RM x NCV vectors) rescaled by exp2(m_old - m_new); p = exp2(s - m_new) ->
//      local; each work-item keeps partial row sums of its own keys' p (all work-items of a row
//      rescale by the same factor, so the partials add up at the end).
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
#define NJV (BN / (TPR * VW))              // key vectors per work-item
#define NCV ((EV + TPR * VW - 1) / (TPR * VW))  // value column vectors per work-item
#define QSTR (E + 1)        // Q tile row stride: odd, so the row groups' reads hit distinct banks
#define KSTR (BN + KPAD)    // K^T tile row stride (one row per head-dim element)
#define VSTR (NCV * TPR * VW)  // V tile row stride: columns EV.. are zero-filled
#define PSTR (BN + KPAD)
#define KV_SIZE ((E * KSTR) > (BN * VSTR) ? (E * KSTR) : (BN * VSTR))
#define LOG2E ((ACC)1.4426950408889634)
#define NEG_INF ((ACC)(-INFINITY))
// max that propagates NaN (fmax returns the other operand)
#define NMAX(a, b) (((a) > (b) || isnan(a)) ? (a) : (b))

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#if VW == 1
#define VA ACC
#define LOADV(p) ((ACC)*(p))
#define STOREV(v, p) (*(p) = (v))
#define VMAX(a, b) NMAX(a, b)
#define HMAX(v) (v)
#define HSUM(v) (v)
#else
#define VA CAT(ACC, VW)
#if defined(USE_FP64)
#define VI CAT(long, VW)
#else
#define VI CAT(int, VW)
#endif
#if VW == 2  // the lanes' indices
#define IOTA (VI)(0, 1)
#elif VW == 4
#define IOTA (VI)(0, 1, 2, 3)
#elif VW == 8
#define IOTA (VI)(0, 1, 2, 3, 4, 5, 6, 7)
#else
#define IOTA (VI)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
#endif
#define LOADV(p) CAT(convert_, VA)(CAT(vload, VW)(0, p))
#define STOREV(v, p) CAT(vstore, VW)(v, 0, p)
// NMAX lane by lane (vectors of any width: the comparisons give the matching integer vector)
#define VMAX(a, b) select((b), (a), ((a) > (b)) | isnan(a))
// horizontal reductions by halves
#define HMAX2(v) NMAX((v).s0, (v).s1)
#define HMAX4(v) HMAX2(VMAX((v).lo, (v).hi))
#define HMAX8(v) HMAX4(VMAX((v).lo, (v).hi))
#define HMAX16(v) HMAX8(VMAX((v).lo, (v).hi))
#define HSUM2(v) ((v).s0 + (v).s1)
#define HSUM4(v) HSUM2((v).lo + (v).hi)
#define HSUM8(v) HSUM4((v).lo + (v).hi)
#define HSUM16(v) HSUM8((v).lo + (v).hi)
#define HMAX(v) CAT(HMAX, VW)(v)
#define HSUM(v) CAT(HSUM, VW)(v)
#endif

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

    VA acc[RM][NCV], lsum[RM], s[RM][NJV];  // function scope: these live across barriers
    ACC m[RM];
    for (int rm = 0; rm < RM; rm++) {
        m[rm] = NEG_INF;
        lsum[rm] = (VA)(0);
        for (int c = 0; c < NCV; c++) acc[rm][c] = (VA)(0);
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
        for (int rm = 0; rm < RM; rm++)
            for (int n = 0; n < NJV; n++) s[rm][n] = (VA)(0);
        for (int e = 0; e < E; e++) {
            VA kk[NJV];
            for (int n = 0; n < NJV; n++) kk[n] = LOADV(kv + e * KSTR + (n * TPR + t) * VW);
            for (int rm = 0; rm < RM; rm++) {
                const VA qq = (VA)((ACC)qs[(rg + rm * RG) * QSTR + e]);
                for (int n = 0; n < NJV; n++) s[rm][n] = fma(qq, kk[n], s[rm][n]);
            }
        }
        for (int rm = 0; rm < RM; rm++) {
            const int r = rg + rm * RG, i = i0 + r;
            VA pm = (VA)(NEG_INF);
            for (int n = 0; n < NJV; n++) {
                const int jv = j0 + (n * TPR + t) * VW;  // the vector's first key
                VA x = s[rm][n] * s2;
#if MASK || VW == 1
                {  // lane by lane: mask entries are gathered through their strides
#if VW == 1
                    ACC xs[1] = {x};
#else
                    ACC xs[VW];
                    STOREV(x, xs);
#endif
                    for (int w = 0; w < VW; w++) {
                        const int j = jv + w;
                        ACC y = xs[w];
#if MASK == 2
                        if (i < L && j < S) y = (y + (ACC)mp[i * msl + j * mss]) * LOG2E;
#elif MASK == 1
                        if (i < L && j < S && !mp[i * msl + j * mss]) y = NEG_INF;
#endif
#if CAUSAL
                        if (j > i) y = NEG_INF;
#endif
                        xs[w] = j < S ? y : NEG_INF;
                    }
#if VW == 1
                    x = xs[0];
#else
                    x = LOADV(xs);
#endif
                }
#else  // no mask, VW > 1: causal and the tile's end by selects on the keys' indices
                {
                    const VI j = (VI)(jv) + IOTA;
#if CAUSAL
                    x = select(x, (VA)NEG_INF, j > (VI)(i));
#endif
                    x = select(x, (VA)NEG_INF, j >= (VI)(S));
                }
#endif
                s[rm][n] = x;
                pm = VMAX(pm, x);
            }
            mx[r * TPR + t] = HMAX(pm);
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
            VA sum = lsum[rm] * alpha;
            for (int c = 0; c < NCV; c++) acc[rm][c] *= alpha;
            for (int n = 0; n < NJV; n++) {
                const VA p = exp2(s[rm][n] - base);
                sum += p;
                STOREV(p, ps + r * PSTR + (n * TPR + t) * VW);
            }
            lsum[rm] = sum;
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        // 3. acc += P V
        const int jn = min(BN, jend - j0);
        for (int jj = 0; jj < jn; jj++) {
            VA vv[NCV];
            for (int c = 0; c < NCV; c++) vv[c] = LOADV(kv + jj * VSTR + (c * TPR + t) * VW);
            for (int rm = 0; rm < RM; rm++) {
                const VA p = (VA)(ps[(rg + rm * RG) * PSTR + jj]);
                for (int c = 0; c < NCV; c++) acc[rm][c] = fma(p, vv[c], acc[rm][c]);
            }
        }
    }

    // the row sums: each work-item's partial over its own keys, added across the row group
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int rm = 0; rm < RM; rm++) mx[(rg + rm * RG) * TPR + t] = HSUM(lsum[rm]);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int rm = 0; rm < RM; rm++) {
        const int r = rg + rm * RG, i = i0 + r;
        if (i >= L) continue;
        ACC sum = 0;
        for (int u = 0; u < TPR; u++) sum += mx[r * TPR + u];
        const ACC inv = sum == (ACC)0 ? (ACC)0 : (ACC)1 / sum;  // every key masked: zeros
        __global T* o = out + ((long)bh * L + i) * EV;
        for (int c = 0; c < NCV; c++) {
            const int col = (c * TPR + t) * VW;
            const VA y = acc[rm][c] * inv;
#if VW == 1
            if (col < EV) o[col] = (T)y;
#else
            if (col + VW <= EV) {
                CAT(vstore, VW)(CAT(convert_, CAT(T, VW))(y), 0, o + col);
            } else if (col < EV) {
                ACC ys[VW];
                STOREV(y, ys);
                for (int w = 0; col + w < EV; w++) o[col + w] = (T)ys[w];
            }
#endif
        }
    }
}
