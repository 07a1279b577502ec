"""numba loops of the reductions ``sum`` / ``mean`` / ``amax`` (imported through :mod:`.jit` only).

The input comes as a view ``(outer, n, inner)`` reduced over ``n`` (any strides; the launcher
makes it from ``opruntime.kernels.reduction_plan``; ``(outer, n)`` when ``inner == 1``), float32
or float64.

* ``inner == 1`` (:func:`rows`): tasks of ``(row, block of BLOCK elements)`` run in parallel, so a
  few long rows (a sum over everything) use every core as many short ones do; each block is one
  vectorized loop (a sum with :func:`._nb_math.radd`: partial sums per lane) in float64; then
  each row's blocks are combined in float64. float64 throughout: a float32 accumulator's error is
  relative to the sum of the magnitudes, so a sum or mean near zero (20001 random normals) lost
  2e-5 of its own value, past the float32 tolerance.
* ``inner > 1`` (:func:`cols`): tasks of ``(outer index, block of WIDTH columns, run of rows)``;
  down its rows each row's block is one contiguous run added into a float64 accumulator per
  column (vectorized across the columns); the runs' partials are combined per column at the end.

``amax`` reduces with ``llvm.maximum`` (:func:`._nb_math.maximum`): vectorized, and NaN as soon
as one NaN goes by (as torch's amax).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._nb_math import maximum, radd

OPTIONS = dict(cache=True, nogil=True, error_model="numpy")
#: elements of a row per task (and per float64 partial)
BLOCK = 4096
#: columns per task of the strided path (a block of them and its float64 partial stay in L1)
WIDTH = 1024


@njit(**OPTIONS)
def _block_sum(v):
    """The sum of ``v`` in float64: a float32 accumulator's error is relative to the sum of the
    magnitudes, which a mean near zero turned into 2e-5 of its own value (over 20001 elements)."""
    s = 0.0
    for j in range(v.shape[0]):
        s = radd(s, np.float64(v[j]))
    return s


@njit(**OPTIONS)
def _block_max(v):
    """The largest of ``v``, NaN when it holds one (``llvm.maximum``, vectorized)."""
    m = v.dtype.type(-np.inf)
    for j in range(v.shape[0]):
        m = maximum(m, v[j])
    return np.float64(m)


@njit(parallel=True, **OPTIONS)
def rows(x, out, is_max, div):
    """``out[o] = sum (or max) of x[o] / div`` for the 2-D ``x`` (outer, n), in float64 and rounded
    once into ``out`` (outer,) of the result's dtype (``div``: ``n`` for a mean, else 1): the
    launcher then has no float64 array to divide and cast (and no NumPy warning state to set up
    for a cast that overflows: 14 -> 5 us of its time on 4096x1024)."""
    outer, n = x.shape
    blocks = (n + BLOCK - 1) // BLOCK
    if blocks == 1:  # rows of one block: straight into out (no partials, no serial combine)
        for o in prange(outer):
            out[o] = (_block_max(x[o]) if is_max else _block_sum(x[o])) / div
        return
    part = np.empty((outer, blocks), np.float64)
    for t in prange(outer * blocks):
        o = t // blocks
        j0 = (t % blocks) * BLOCK
        v = x[o, j0:min(n, j0 + BLOCK)]  # a slice: contiguous rows get the vectorized loop
        part[o, t % blocks] = _block_max(v) if is_max else _block_sum(v)
    for o in range(outer):
        if is_max:
            m = part[o, 0]
            for b in range(1, blocks):
                p = part[o, b]
                m = p if (p > m or p != p) and m == m else m
            out[o] = m
        else:
            s = 0.0
            for b in range(blocks):
                s += part[o, b]
            out[o] = s / div


@njit(parallel=True, **OPTIONS)
def cols(x, out, is_max, parts):
    """``out[o, c] = sum (or max) of x[o, :, c]`` for the 3-D ``x`` (outer, n, inner); ``out``
    float64 (outer, inner). Tasks of (outer index, block of WIDTH columns, one of ``parts`` runs
    of rows): a task reads its rows' blocks one after another (whole rows when ``inner <= WIDTH``:
    a contiguous stream the prefetchers follow, where a narrow block per row would start a new
    page every row), into a partial per task; then the partials are combined per column."""
    outer, n, inner = x.shape
    blocks = (inner + WIDTH - 1) // WIDTH
    step = (n + parts - 1) // parts
    part = np.empty((outer, parts, inner), np.float64)
    for t in prange(outer * blocks * parts):
        o = t // (blocks * parts)
        b = (t // parts) % blocks
        k = t % parts
        c0 = b * WIDTH
        c1 = min(inner, c0 + WIDTH)
        w = c1 - c0
        i0 = min(n, k * step)
        i1 = min(n, i0 + step)
        total = part[o, k, c0:c1]
        if is_max:
            m = np.full(w, -np.inf, x.dtype)
            for i in range(i0, i1):
                xi = x[o, i, c0:c1]
                for c in range(w):
                    m[c] = maximum(m[c], xi[c])
            for c in range(w):
                total[c] = np.float64(m[c])
        else:
            for c in range(w):
                total[c] = 0.0
            for i in range(i0, i1):  # in float64, as the rows' blocks (a sum near zero keeps its digits)
                xi = x[o, i, c0:c1]
                for c in range(w):
                    total[c] += np.float64(xi[c])
    for o in range(outer):
        res = out[o]
        for c in range(inner):
            res[c] = part[o, 0, c]
        for k in range(1, parts):
            pk = part[o, k]
            if is_max:
                for c in range(inner):
                    res[c] = maximum(res[c], pk[c])
            else:
                for c in range(inner):
                    res[c] += pk[c]
