"""numba loops of the GEMM operators (``numpy.linear.numba``, ``numpy.matmul.numba``; imported
through :mod:`.jit` only): a product cut into tasks of rows (and of batch items), each task one
BLAS call in the calling thread (scipy's ``?gemm`` through numba's ``numba_xxgemm``, as the GEMM
convolutions of :mod:`._nb_conv`; :mod:`._blas` holds the library to one thread), the tasks run
on numba's threads by a ``par_*`` wrapper that calls the loop by address (:func:`.jit.task`).

**Why not one multi-threaded BLAS call.** OpenBLAS's worker threads and numba's OpenMP threads are
two pools; on few cores the one left spinning after its work takes a core from the other's next
call. A linear as one 2-thread ``sgemm`` followed by a parallel epilogue on numba's threads
measured 8.8 ms on 1024 x 1024 x 1024 where the ``sgemm`` alone took 5.6 and the epilogue 0.14
(both pools spinning on the 2 cores, each slowing the other's next call by about 2 ms, even 2 ms
later). Here one pool does both: each thread's GEMM writes its block of rows, then applies the
bias and activation to it while the block is in cache (:func:`linear_rows`): 5.7 ms in all.

A task's BLAS call packs the whole of the other operand (the weights) once: a few large tasks
(one per thread by default) beat many small ones (1024^3 in tasks of 128 rows: 6.9 ms, 256: 6.2,
512: 5.7).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._nb_conv import _ptr, _unit_alpha, _xxgemm
from ._nb_elementwise import bias_act_row
from .jit import wrapper_options

OPTIONS = dict(cache=True, nogil=True, error_model="numpy")
#: the wrappers' options: parallel, LLVM's optimizer off (:func:`.jit.wrapper_options`)
WRAPPER = wrapper_options(**OPTIONS)


@njit(inline="always", **OPTIONS)
def _gemm_t(a, a_off, lda, ta, b, b_off, ldb, tb, c, c_off, ldc, m, n, k, ab):
    """Row-major ``C = op(A) @ op(B) + beta C`` on flat C-contiguous ``a``, ``b``, ``c`` of one
    dtype, ``C`` (m, n) from element ``c_off`` with row stride ``ldc``; ``op(A)`` (m, k) is ``A``
    stored (m, k) with row stride ``lda``, or with ``ta`` its transpose, stored (k, m); ``op(B)``
    (k, n) likewise (``tb``: stored (n, k)). ``ab`` = [alpha, beta]. One BLAS call, column-major
    (``C^T = op(B)^T op(A)^T``), no copy of any operand."""
    kind = np.int8(115) if c.itemsize == 4 else np.int8(100)  # 's' / 'd'
    tr_b = np.int8(116) if tb else np.int8(110)  # 't' / 'n'
    tr_a = np.int8(116) if ta else np.int8(110)
    _xxgemm(kind, tr_b, tr_a, n, m, k, _ptr(ab, 0), _ptr(b, b_off), ldb, _ptr(a, a_off), lda,
            _ptr(ab, 1), _ptr(c, c_off), ldc)


@njit(**OPTIONS)
def linear_rows(x, w, w_kn, bias, res, out, rows, code, first, last):
    """``out = act(code, x @ W.T + bias + res)`` by blocks of ``rows`` rows, tasks
    ``first:last``: ``x`` (m, k) and ``out`` (m, n) C-contiguous; ``w`` the weights C-contiguous,
    ``W`` (n, k) itself or, with ``w_kn``, stored as ``W.T`` (k, n) (a transposed view's base: no
    copy); ``bias`` (n,) or size 0; ``res`` (m, n) C-contiguous or with 0 rows (none). Each
    block's rows of the residual are copied into the output and the block's GEMM adds to them
    (beta 1), then the bias and activation (:func:`._nb_elementwise.bias_act_row`) run over them
    while they are in cache."""
    m, k = x.shape
    n = out.shape[1]
    xf = x.reshape(-1)
    wf = w.reshape(-1)
    of = out.reshape(-1)
    added = res.shape[0] > 0
    ab = _unit_alpha(out.dtype, 1 if added else 0)
    ldw = n if w_kn else k
    for t in range(first, last):
        r0 = t * rows
        cnt = min(rows, m - r0)
        if added:
            out[r0:r0 + cnt] = res[r0:r0 + cnt]
        if k == 0:  # BLAS leaves C alone when k is 0 with beta 0 only in some builds
            if not added:
                out[r0:r0 + cnt] = 0
        else:
            _gemm_t(xf, r0 * k, k, False, wf, 0, ldw, not w_kn, of, r0 * n, n, cnt, n, k, ab)
        if bias.shape[0] > 0 or code != 0:
            for r in range(r0, r0 + cnt):
                bias_act_row(out[r], bias, code)


@njit(**OPTIONS)
def matmul_rows(a, b, out, rows, first, last):
    """``out[i] = a[i or 0] @ b[i or 0]`` by blocks of ``rows`` rows: ``a`` (Ba, m, k), ``b``
    (Bb, k, n) and ``out`` (B, m, n) C-contiguous, ``Ba`` and ``Bb`` each B or 1 (broadcast). A
    task is (batch item, block of rows), tasks ``first:last``; k > 0."""
    nbat, m, n = out.shape
    k = a.shape[2]
    nblk = (m + rows - 1) // rows
    af = a.reshape(-1)
    bf = b.reshape(-1)
    of = out.reshape(-1)
    ab = _unit_alpha(out.dtype, 0)
    a_step = m * k if a.shape[0] > 1 else 0
    b_step = k * n if b.shape[0] > 1 else 0
    for t in range(first, last):
        i = t // nblk
        r0 = (t - i * nblk) * rows
        cnt = min(rows, m - r0)
        _gemm_t(af, i * a_step + r0 * k, k, False, bf, i * b_step, n, False, of, (i * m + r0) * n, n, cnt, n, k, ab)


@njit(**WRAPPER)
def par_linear(fn, x, w, w_kn, bias, res, out, rows, code, tasks, pieces):
    """:func:`linear_rows` (``fn``) over ``tasks`` tasks cut into ``pieces`` ranges, in parallel."""
    for p in prange(pieces):
        fn(x, w, w_kn, bias, res, out, rows, code, tasks * p // pieces, tasks * (p + 1) // pieces)


@njit(**WRAPPER)
def par_matmul(fn, a, b, out, rows, tasks, pieces):
    """:func:`matmul_rows` (``fn``) over ``tasks`` tasks cut into ``pieces`` ranges, in parallel."""
    for p in prange(pieces):
        fn(a, b, out, rows, tasks * p // pieces, tasks * (p + 1) // pieces)
