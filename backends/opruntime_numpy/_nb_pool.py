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


@njit(parallel=True, **OPTIONS)
def avg(x, out, inv, kh, kw, sh, sw, dh, dw, ph, pw, wp):
    """avg_pool2d of ``x`` (planes, h, w) into ``out`` (planes, oh, ow): one plane per parallel task,
    separable and vectorized where it can be. Per output row: the window's input rows inside the
    plane summed into one zero-padded row of ``wp`` elements (contiguous adds; padding adds
    zeros, so rows outside are skipped); then the window sums at every start column (stride 1:
    contiguous, vectorized); then every ``sw``-th of them times ``inv`` (oh, ow), the reciprocal of
    the divisor each output takes (torch's, with or without the padding). The strided taps read
    straight from the plane, one output at a time, did not vectorize (3x slower)."""
    planes, h, w = x.shape
    oh, ow = out.shape[1], out.shape[2]
    starts = (ow - 1) * sw + 1
    zero = x.dtype.type(0.0)
    for p in prange(planes):
        row = np.zeros(wp, x.dtype)
        sums = np.empty(starts, x.dtype)
        mid = row[pw:pw + w]
        for oy in range(oh):
            for c in range(w):
                mid[c] = zero
            for i in range(kh):
                r = oy * sh - ph + i * dh
                if 0 <= r < h:
                    xr = x[p, r]
                    for c in range(w):
                        mid[c] += xr[c]
            for c in range(starts):
                sums[c] = row[c]
            for j in range(1, kw):
                tap = row[j * dw:j * dw + starts]
                for c in range(starts):
                    sums[c] += tap[c]
            o = out[p, oy]
            v = inv[oy]
            for ox in range(ow):
                o[ox] = sums[ox * sw] * v[ox]


@njit(parallel=True, **OPTIONS)
def maxp(x, out, kh, kw, sh, sw, dh, dw, ph, pw, wp):
    """max_pool2d of ``x`` (planes, h, w) into ``out`` (planes, oh, ow), separable as :func:`avg`:
    one plane per parallel task; per output row, the elementwise max of the window's input rows
    inside the plane into one row of ``wp`` elements (-inf where the padding is: contiguous,
    vectorized), then each output the max of its window's ``kw`` values of that row. The input
    is read once, with no padded copy of the plane (the loop before this one copied each plane
    into a -inf-padded buffer and read each tap with the stride: 1.7 ms on ResNet-50's 4 x 64 x
    112 x 112, 3 x 3 stride 2). NaN propagates as torch's (a NaN in the window gives NaN); max is
    exact, so the result is the one the window's values give in any order."""
    planes, h, w = x.shape
    oh, ow = out.shape[1], out.shape[2]
    starts = (ow - 1) * sw + 1
    lowest = x.dtype.type(-np.inf)
    for p in prange(planes):
        row = np.empty(wp, x.dtype)
        sums = np.empty(starts, x.dtype)
        mid = row[pw:pw + w]
        for c in range(wp):
            row[c] = lowest
        for oy in range(oh):
            first = True
            for i in range(kh):
                r = oy * sh - ph + i * dh
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
            for c in range(starts):
                sums[c] = row[c]
            for j in range(1, kw):
                tap = row[j * dw:j * dw + starts]
                for c in range(starts):
                    v, a = tap[c], sums[c]
                    sums[c] = v if (v > a or v != v) else a
            o = out[p, oy]
            for ox in range(ow):
                o[ox] = sums[ox * sw]
