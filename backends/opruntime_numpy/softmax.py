"""softmax / log_softmax on the CPU, two kernels each:

* ``numpy.<op>.fused``: as few passes as NumPy allows: max, one subtract into the output buffer,
  exp in place, sum, and an in-place scale (or log-sum-exp subtraction). Every pass reads and
  writes the whole array.
* ``numpy.<op>.numba`` (with numba, :mod:`.jit`): one read of the input. Along a contiguous axis,
  rows run in parallel and each row is processed while it is in cache (max, exp into the output
  and sum, scale; log_softmax: max, sum of exps, ``x - max - log(sum)``), with a vectorized exp
  (:mod:`._nb_math`), the next row and its output row prefetched during the exps (4096 x 1024:
  1.28 -> 0.81 ms in the cpu suite, the reads from memory no longer wait for the arithmetic);
  rows longer than :data:`ROW_BLOCK` take an online pass over blocks (running max, rescaled sum)
  and an output pass, in a loop compiled apart (first use of the rows' loop: 1.33 s); fewer rows
  than 4x the threads are cut in pieces of :data:`SPLIT` elements or more, whose (max, sum) are
  found in parallel, combined, and the output pieces written in parallel. Along a strided axis, tasks of (block of :data:`COL_BLOCK`
  columns, run of rows) run in parallel, each one pass down its rows (vectorized across the
  columns, each row of a block one contiguous run: whole rows up to COL_BLOCK, a stream the
  prefetchers follow; blocks of rows in L2, their max then their exps: one exp an element), then in the same tasks the runs' max and sum combined per column and the
  output pass; the tasks are ranges of two plain loops that one ``prange`` wrapper calls by address
  (``_nb_rows.par_cols``, :func:`.jit.task`): the loops compile apart and the wrapper once, a first
  use of 1.4 s where ``prange`` loops linked into one function took 2.3 (the target is 2), and on
  numba's threads, as the conv kernels: 4096 x 1024 ran 1.8-2.0 ms (median) where the same loops
  on Python threads ran 2.7-3.3. float16 is computed in float32.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from opruntime.kernels import FLOATS, Kernel, Problem, itemsize, roofline

from . import buffers, jit
from .matmul import CPU_BYTES, CPU_FLOPS, F16

#: elements of a row processed in cache (L2) with three passes; longer rows go online over blocks of
#: it (two exps an element instead of one)
ROW_BLOCK = 1 << 16
#: columns per parallel task of the strided-axis path (one contiguous run of a row each)
COL_BLOCK = 1024
#: the least elements of a row piece when fewer rows than 4x the threads are cut in pieces
SPLIT = 1 << 15

# -inf rows give inf - inf = NaN, as the reference does. errstate as a decorator is the cheapest
# thread-safe way to keep NumPy quiet about it (half the cost of a `with` block per call).
_quiet = np.errstate(invalid="ignore", over="ignore", divide="ignore")


@_quiet
def softmax(problem: Problem, config: Any, x: np.ndarray) -> np.ndarray:
    axis = problem.attrs["axis"]
    if x.dtype is F16:  # computed in float32
        x = x.astype(np.float32)
    out = np.subtract(x, x.max(axis=axis, keepdims=True))
    np.exp(out, out=out)
    out /= out.sum(axis=axis, keepdims=True)
    return out.astype(problem.dtype, copy=False)


@_quiet
def log_softmax(problem: Problem, config: Any, x: np.ndarray) -> np.ndarray:
    axis = problem.attrs["axis"]
    if x.dtype is F16:
        x = x.astype(np.float32)
    out = np.subtract(x, x.max(axis=axis, keepdims=True))
    out -= np.log(np.exp(out).sum(axis=axis, keepdims=True))
    return out.astype(problem.dtype, copy=False)


def cost(problem: Problem, config: Any) -> float:
    n = math.prod(problem.out_shape)
    return roofline(5.0 * n, 4.0 * n * itemsize(problem.dtype), CPU_FLOPS, CPU_BYTES, 2e-6)


#: fewer elements than this along a strided axis run in the calling thread (a hand-off costs ~30 us)
SERIAL = 1 << 16


def prepare_numba(problem: Problem, config: Any) -> Any:
    """The launcher of ``numpy.<op>.numba``: the input seen as (outer, n) rows when the axis is
    the last one that is not 1, else as (outer, n, inner); a view where NumPy can make one (numba
    reads strided views in place), a copy otherwise."""
    nb = jit.loops("_nb_rows")
    shape = problem.shapes[0]
    axis = problem.attrs["axis"]
    outer, n, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    log = problem.op == "log_softmax"
    f16 = problem.dtype == "float16"
    width = min(inner, COL_BLOCK)
    # the strided path: runs of rows per task, so that there are 4 tasks a thread or more
    col_parts = max(1, min(n // 16, -(-4 * jit.threads() // (outer * -(-inner // width)))))
    threads = jit.threads()
    # fewer long rows than threads to balance them: each row cut in pieces (of SPLIT elements at least)
    parts = min(-(-threads * 4 // outer), n // SPLIT) if inner == 1 and outer < 4 * threads else 1
    tasks = outer * -(-inner // width) * col_parts
    workers = 1 if outer * n * inner < SERIAL else min(threads, tasks)
    pieces = max(1, tasks if tasks <= workers * 4 else workers * 3) if workers > 1 else 1

    @_quiet
    def launch(x: np.ndarray) -> np.ndarray:
        if f16:
            x = x.astype(np.float32)
        out = buffers.empty((outer, n, inner), x.dtype)
        if inner == 1 and parts > 1:
            jit.call(nb.softmax_split, x.reshape(outer, n), out.reshape(outer, n), log, parts, ROW_BLOCK)
        elif inner == 1 and n > ROW_BLOCK:
            jit.call(nb.softmax_long_rows, x.reshape(outer, n), out.reshape(outer, n), log, ROW_BLOCK)
        elif inner == 1:
            jit.call(nb.softmax_rows, x.reshape(outer, n), out.reshape(outer, n), log)
        else:  # the runs' statistics, then the output, in the same pieces of tasks
            ms = np.empty((outer, col_parts, inner), x.dtype)
            ss = np.empty((outer, col_parts, inner), np.float64)  # sums in float64
            x3 = x.reshape(outer, n, inner)
            args = (x3, out, ms, ss, log, width, col_parts)
            if pieces == 1:
                jit.call(nb.cols_stats, *args, 0, tasks)
                jit.call(nb.cols_out, *args, 0, tasks)
            else:  # on numba's threads, each loop called by address from one prange wrapper
                jit.run_dynamic(nb.par_cols, jit.task(nb.cols_stats, *args), *args, tasks, pieces)
                jit.run_dynamic(nb.par_cols, jit.task(nb.cols_out, *args), *args, tasks, pieces)
        out = out.reshape(shape)
        return out.astype(np.float16) if f16 else out

    return jit.first_use(f"numpy.{problem.op}.numba", launch)


def numba_cost(problem: Problem, config: Any) -> float:
    """One read and one write (float16: and its float32 copies), across the threads."""
    n = math.prod(problem.out_shape)
    moved = 2.0 * n * (6 if problem.dtype == "float16" else itemsize(problem.dtype))
    return roofline(5.0 * n, moved, CPU_FLOPS * 4, CPU_BYTES * 1.5, 6e-6)


def kernels() -> list[Kernel]:
    out = [
        Kernel("softmax", "numpy.softmax.fused", "cpu", FLOATS, softmax, cost=cost),
        Kernel("log_softmax", "numpy.log_softmax.fused", "cpu", FLOATS, log_softmax, cost=cost),
    ]
    if jit.available():
        src = jit.source("_nb_rows")
        out += [Kernel(op, f"numpy.{op}.numba", "cpu", FLOATS, prepare=prepare_numba, cost=numba_cost, source=src,
                          notes=jit.notes(f"numpy.{op}.numba"))
                for op in ("softmax", "log_softmax")]
    return out
