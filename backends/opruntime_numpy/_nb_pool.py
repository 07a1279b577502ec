"""numba loops of the pools (imported through :mod:`.jit` only). float32 and float64 are computed
natively (the launchers widen float16 to float32).

* :func:`avg` and :func:`maxp` (``avg_pool2d``, ``max_pool2d``): separable, one plane per parallel
  task, the input read once and no padded copy of the plane;
* :func:`plane_means`: the global (1x1) pool of planes of up to :data:`SHORT` elements, one
  contiguous plane per row of a 2-D view, rows in parallel, each a vectorized sum (partial sums
  per lane, :func:`._nb_math.radd`). Longer planes go through ``_nb_reduce.rows`` (float64 blocks).
* :func:`adaptive`: any output size, one plane per parallel task: per output row, the input rows
  of its window summed into a float64 row (vectorized across the columns), then each output
  column's window of that row summed and divided by the window's size. The input is read once.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._nb_math import radd

OPTIONS = dict(cache=True, nogil=True, error_model="numpy")
#: planes up to this many elements are summed in their own dtype (at most 64 additions a lane)
SHORT = 4096


@njit(parallel=True, **OPTIONS)
def plane_means(x, out):
    """``out[p] = mean(x[p])`` for the 2-D ``x`` (planes, h*w)."""
    planes, n = x.shape
    scale = x.dtype.type(1.0) / x.dtype.type(n)
    for p in prange(planes):
        xr = x[p]
        s = x.dtype.type(0.0)
        for j in range(n):
            s = radd(s, xr[j])
        out[p] = s * scale


@njit(parallel=True, **OPTIONS)
def adaptive(x, out, h0, h1, w0, w1):
    """``out[p, i, j] = mean(x[p, h0[i]:h1[i], w0[j]:w1[j]])`` for the 3-D ``x`` (planes, h, w)."""
    planes, h, w = x.shape
    oh, ow = out.shape[1], out.shape[2]
    for p in prange(planes):
        row = np.empty(w, np.float64)
        for i in range(oh):
            for c in range(w):
                row[c] = 0.0
            for r in range(h0[i], h1[i]):
                xr = x[p, r]
                for c in range(w):
                    row[c] += xr[c]
            rows = h1[i] - h0[i]
            for j in range(ow):
                s = 0.0
                for c in range(w0[j], w1[j]):
                    s += row[c]
                out[p, i, j] = s / (rows * (w1[j] - w0[j]))


#: output rows of a plane per block of :func:`avg` / :func:`maxp`: their window rows (RB x the
#: padded width) and the window sums stay in L1 (8 x 113 float32: 3.6 KB each)
RB = 8


@njit(parallel=True, **OPTIONS)
def avg(x, out, inv, kh, kw, sh, sw, dh, dw, ph, pw, wp):
    """avg_pool2d of ``x`` (planes, h, w) into ``out`` (planes, oh, ow): one plane per parallel task,
    separable, in blocks of :data:`RB` output rows. Per output row of a block, the window's input
    rows inside the plane summed into one zero-padded row of ``wp`` elements of ``m`` (contiguous
    adds; padding adds zeros, so rows outside are skipped); then the window sums at every start
    column of the whole block in one flat loop over ``m`` (``s[k] = m[k] + m[k + dw] + ...``: the
    sums that straddle two rows are never picked); then every ``sw``-th of each row times ``inv``
    (oh, ow), the reciprocal of the divisor each output takes (torch's, with or without the
    padding). The window sums per output row (111 starts on ResNet's 112 x 112) left most of each
    loop to its scalar remainder; a block's flat loop of RB x 113 does not (4 x 64 x 112 x 112, 3 x 3
    stride 2: the window sums 217 of max_pool's 662 us). The strided taps read straight from the
    plane, one output at a time, did not vectorize (3x slower)."""
    planes, h, w = x.shape
    oh, ow = out.shape[1], out.shape[2]
    reach = (kw - 1) * dw
    zero = x.dtype.type(0.0)
    for p in prange(planes):
        m = np.zeros(RB * wp, x.dtype)  # the padding columns stay zero
        s = np.empty(RB * wp, x.dtype)
        for oy0 in range(0, oh, RB):
            rows = min(RB, oh - oy0)
            for q in range(rows):
                mid = m[q * wp + pw:q * wp + pw + w]
                for c in range(w):
                    mid[c] = zero
                for i in range(kh):
                    r = (oy0 + q) * sh - ph + i * dh
                    if 0 <= r < h:
                        xr = x[p, r]
                        for c in range(w):
                            mid[c] += xr[c]
            n = rows * wp - reach
            for c in range(n):
                s[c] = m[c]
            for j in range(1, kw):
                tap = m[j * dw:j * dw + n]
                for c in range(n):
                    s[c] += tap[c]
            for q in range(rows):
                o = out[p, oy0 + q]
                v = inv[oy0 + q]
                sq = s[q * wp:]
                if sw == 2:  # a constant stride: LLVM's interleaved loads (5% of the pool)
                    for ox in range(ow):
                        o[ox] = sq[2 * ox] * v[ox]
                else:
                    for ox in range(ow):
                        o[ox] = sq[ox * sw] * v[ox]


@njit(parallel=True, **OPTIONS)
def maxp(x, out, kh, kw, sh, sw, dh, dw, ph, pw, wp):
    """max_pool2d of ``x`` (planes, h, w) into ``out`` (planes, oh, ow), separable and in blocks of
    :data:`RB` output rows as :func:`avg`: per output row, the elementwise max of the window's input
    rows inside the plane into one row of ``wp`` elements of ``m`` (-inf where the padding is:
    contiguous, vectorized), then the window max at every start column of the block in one flat
    loop, then every ``sw``-th of each row. The input is read once, with no padded copy of the
    plane (the loop before this one copied each plane into a -inf-padded buffer and read each tap
    with the stride: 1.7 ms on ResNet-50's 4 x 64 x 112 x 112, 3 x 3 stride 2). NaN propagates as
    torch's (a NaN in the window gives NaN); max is exact, so the result is the one the window's
    values give in any order."""
    planes, h, w = x.shape
    oh, ow = out.shape[1], out.shape[2]
    reach = (kw - 1) * dw
    lowest = x.dtype.type(-np.inf)
    for p in prange(planes):
        m = np.full(RB * wp, lowest, x.dtype)  # the padding columns stay -inf
        s = np.empty(RB * wp, x.dtype)
        for oy0 in range(0, oh, RB):
            rows = min(RB, oh - oy0)
            for q in range(rows):
                mid = m[q * wp + pw:q * wp + pw + w]
                first = True
                for i in range(kh):
                    r = (oy0 + q) * sh - ph + i * dh
                    if 0 <= r < h:
                        xr = x[p, r]
                        if first:
                            for c in range(w):
                                mid[c] = xr[c]
                            first = False
                        else:
                            for c in range(w):
                                v, a = xr[c], mid[c]
                                mid[c] = v if (v > a or v != v) else a
                if first:  # no row of the window inside the plane: -inf, as the padding
                    for c in range(w):
                        mid[c] = lowest
            n = rows * wp - reach
            for c in range(n):
                s[c] = m[c]
            for j in range(1, kw):
                tap = m[j * dw:j * dw + n]
                for c in range(n):
                    v, a = tap[c], s[c]
                    s[c] = v if (v > a or v != v) else a
            for q in range(rows):
                o = out[p, oy0 + q]
                sq = s[q * wp:]
                if sw == 2:  # a constant stride: LLVM's interleaved loads (5% of the pool)
                    for ox in range(ow):
                        o[ox] = sq[2 * ox]
                else:
                    for ox in range(ow):
                        o[ox] = sq[ox * sw]
