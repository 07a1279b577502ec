// sum / mean / amax over the (outer, n, inner) view of the input: output o = (o / inner, o % inner)
// reduces the n elements x[xoff + (o / inner) * so + (o % inner) * si + k * sn], k < n.
// With splits > 1 each output's range of k is cut into `splits` chunks of `chunk` elements; chunk
// s of output o writes its partial (in ACC, unscaled) to part[s * outputs + o], and
// reduce_finish combines the partials. The output y is C-contiguous, one T per output.
//
// Build options: T, ACC (element / accumulator type: float for half), USE_FP64 / USE_FP16,
//   OP 0 sum, 1 mean (the sum times `scale` = 1 / count), 2 amax (NaN propagates),
//   WG the work-group size of reduce_rows (a power of two).
//   reduce_rows: a work-group per (output, chunk); along a unit-stride axis 4-wide vloads
//                (element alignment is all vload4 needs), a tree in local memory.
//   reduce_cols: a work-item per (output, chunk) walking down its k range: coalesced where
//                neighbouring outputs are neighbours in memory (si == 1, or so == 1 with inner 1).

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define VACC CAT(ACC, 4)

#if OP == 2
#define IDENT ((ACC)(-INFINITY))
inline ACC comb(ACC a, ACC b) { return (a > b || a != a) ? a : b; }  // NaN in either wins
#else
#define IDENT ((ACC)0)
inline ACC comb(ACC a, ACC b) { return a + b; }
#endif
#if OP == 1
#define FINAL(v, scale) ((v) * (scale))
#else
#define FINAL(v, scale) (v)
#endif

inline void store(__global T* y, __global ACC* part, long o, long outputs, int s, int splits, ACC v, ACC scale) {
    if (splits > 1)
        part[(long)s * outputs + o] = v;
    else
        y[o] = (T)FINAL(v, scale);
}

#ifdef WG
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void reduce_rows(__global const T* x, const long xoff, __global T* y, __global ACC* part, const long outer,
                 const long inner, const long so, const long si, const long n, const long sn, const long chunk,
                 const int splits, const ACC scale) {
    __local ACC red[WG];
    const int lx = get_local_id(0);
    const long g = get_group_id(0), o = g / splits;
    const int s = (int)(g % splits);
    const long k0 = (long)s * chunk, k1 = min(n, k0 + chunk);
    __global const T* p = x + xoff + (o / inner) * so + (o % inner) * si + k0 * sn;
    const long len = k1 - k0;
    ACC acc = IDENT;
    if (sn == 1) {
        const long nv = len / 4;
        for (long i = lx; i < nv; i += WG) {
            VACC v = CAT(convert_, VACC)(vload4(i, p));
            acc = comb(acc, comb(comb(v.s0, v.s1), comb(v.s2, v.s3)));
        }
        for (long k = nv * 4 + lx; k < len; k += WG) acc = comb(acc, (ACC)p[k]);
    } else {
        for (long k = lx; k < len; k += WG) acc = comb(acc, (ACC)p[k * sn]);
    }
    red[lx] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = WG / 2; w > 0; w >>= 1) {
        if (lx < w) red[lx] = comb(red[lx], red[lx + w]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lx == 0) store(y, part, o, outer * inner, s, splits, red[0], scale);
}
#endif

__kernel void reduce_cols(__global const T* x, const long xoff, __global T* y, __global ACC* part, const long outer,
                          const long inner, const long so, const long si, const long n, const long sn,
                          const long chunk, const int splits, const ACC scale) {
    const long o = get_global_id(0), outputs = outer * inner;
    const int s = (int)get_global_id(1);
    if (o >= outputs || s >= splits) return;
    const long k0 = (long)s * chunk, k1 = min(n, k0 + chunk);
    __global const T* p = x + xoff + (o / inner) * so + (o % inner) * si;
    ACC a0 = IDENT, a1 = IDENT;  // two chains: two loads in flight
    long k = k0;
    for (; k + 1 < k1; k += 2) {
        a0 = comb(a0, (ACC)p[k * sn]);
        a1 = comb(a1, (ACC)p[(k + 1) * sn]);
    }
    if (k < k1) a0 = comb(a0, (ACC)p[k * sn]);
    store(y, part, o, outputs, s, splits, comb(a0, a1), scale);
}

// The partials of the chunks (part[s * outputs + o]) combined, scaled and rounded once.
__kernel void reduce_finish(__global const ACC* part, __global T* y, const long outputs, const int splits,
                            const ACC scale) {
    const long o = get_global_id(0);
    if (o >= outputs) return;
    ACC acc = part[o];
    for (int s = 1; s < splits; s++) acc = comb(acc, part[(long)s * outputs + o]);
    y[o] = (T)FINAL(acc, scale);
}
