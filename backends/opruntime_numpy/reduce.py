"""sum, mean and amax on the CPU: one NumPy ufunc reduction each, over the problem's axes (any
strides: NumPy walks a view as it is). Every dtype accumulates in float64 (``dtype=`` of the
reduction, no wider copy of the input), rounded once at the end: accumulated in float32, a
sum whose terms cancel was 1.2e-5 to 5.8e-5 off in float32 (5 of 150 pinned runs of the
conformance cases) and 3.7e-2 in float16 (1 of 300); ``maximum.reduce`` keeps NaN (as torch's amax).

With numba (:mod:`.jit`), ``numpy.<op>.numba`` (float32 and float64) reads the input once across
the cores (:mod:`._nb_reduce`): the input seen as ``(outer, n, inner)`` by
``opruntime.kernels.reduction_plan`` (a strided view; a transposed copy only where the reduced
axes do not collapse), blocks of a row in parallel with vectorized partial sums combined in
float64 along a row, or blocks of columns accumulated in float64 down the rows. NumPy's
reductions run on one core, pairwise along a contiguous row (about 20 GB/s here)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from opruntime.kernels import FLOATS, Kernel, Problem, c_strides, itemsize, reduction_plan, roofline

from . import jit
from .matmul import CPU_BYTES, CPU_FLOPS

# inf - inf in a sum gives NaN, as the reference: errstate as a decorator keeps NumPy quiet cheaply
_quiet = np.errstate(invalid="ignore", over="ignore")


def _sum(problem: Problem, x: np.ndarray) -> np.ndarray:
    a = problem.attrs
    return np.add.reduce(x, axis=a["axis"], dtype=np.float64, keepdims=a["keepdims"])


@_quiet
def reduce_sum(problem: Problem, config: Any, x: np.ndarray) -> np.ndarray:
    """``np.add.reduce`` over the problem's axes."""
    return np.asarray(_sum(problem, x)).astype(problem.dtype, copy=False)


@_quiet
def reduce_mean(problem: Problem, config: Any, x: np.ndarray) -> np.ndarray:
    """The sum, then one division by the count, in the sum's accumulator dtype."""
    s = np.asarray(_sum(problem, x))
    count = math.prod(x.shape[i] for i in problem.attrs["axis"])
    np.divide(s, s.dtype.type(count), out=s)  # out=: a 0-D result stays an array
    return s.astype(problem.dtype, copy=False)


@_quiet
def reduce_max(problem: Problem, config: Any, x: np.ndarray) -> np.ndarray:
    """``np.maximum.reduce`` (NaN propagates); exact in any dtype, so no wider accumulator."""
    a = problem.attrs
    return np.asarray(np.maximum.reduce(x, axis=a["axis"], keepdims=a["keepdims"]))


def cost(problem: Problem, config: Any) -> float:
    n = math.prod(problem.shapes[0])
    return roofline(float(n), n * itemsize(problem.dtype), CPU_FLOPS, CPU_BYTES, 2e-6)


def prepare_numba(problem: Problem, config: Any) -> Any:
    """The launcher of ``numpy.<op>.numba``: the input as ``(outer, n, inner)`` (a strided view, or
    a transposed copy), the loop's float64 result divided by ``n`` for ``mean`` and rounded once
    (by the loop itself along rows; a contiguous input along its last axes takes the shortest
    launcher, :func:`launch_rows`: no NumPy call but two reshapes)."""
    nb = jit.loops("_nb_reduce")
    (outer, n, inner, so, sn, si), perm = reduction_plan(problem)
    is_max = problem.op == "amax"
    # the strided path: runs of rows per task, so that 4 tasks a thread or more share the rows
    tasks = outer * -(-inner // nb.WIDTH)
    parts = max(1, min(n // 64, -(-4 * jit.threads() // tasks)))
    mean = problem.op == "mean"
    dtype = np.dtype(problem.dtype)
    out_shape = problem.out_shape
    strides = problem.strides[0]
    contiguous = strides is None or strides == c_strides(problem.shapes[0])  # reshape: the view, no as_strided (10 us)

    rows = perm is None and inner == 1 and contiguous  # the hot case

    def launch_rows(x: np.ndarray) -> np.ndarray:
        """Rows reduced: the loop divides (mean) and rounds into the result itself."""
        out = np.empty(outer, dtype)
        jit.call(nb.rows, x.reshape(outer, n), out, is_max, float(n) if mean else 1.0)
        return out.reshape(out_shape)

    @_quiet
    def launch(x: np.ndarray) -> np.ndarray:
        if perm is not None:
            x = np.ascontiguousarray(x.transpose(perm))
            view = x.reshape(outer, n)
        elif contiguous:
            view = x.reshape(outer, n, inner)
        else:
            size = x.itemsize
            view = np.lib.stride_tricks.as_strided(x, (outer, n, inner), (so * size, sn * size, si * size))
        if inner == 1:
            return launch_rows(view)
        acc = np.empty((outer, inner), np.float64)
        jit.call(nb.cols, view, acc, is_max, parts)
        if mean:
            acc /= n
        return acc.astype(dtype).reshape(out_shape)

    return jit.first_use(f"numpy.{problem.op}.numba", launch_rows if rows else launch)


def numba_cost(problem: Problem, config: Any) -> float:
    """One read of the input across the threads (a transposed copy first where the axes need it)."""
    n = math.prod(problem.shapes[0])
    moved = n * itemsize(problem.dtype) * (1 if reduction_plan(problem)[1] is None else 3)
    return roofline(float(n), moved, CPU_FLOPS * 4, CPU_BYTES * 1.5, 6e-6)


def kernels() -> list[Kernel]:
    out = [
        #      op      name                  kind   dtypes  run
        Kernel("sum", "numpy.sum.ufunc", "cpu", FLOATS, reduce_sum, cost=cost, source="np.add.reduce"),
        Kernel("mean", "numpy.mean.ufunc", "cpu", FLOATS, reduce_mean, cost=cost, source="np.add.reduce / n"),
        Kernel("amax", "numpy.amax.ufunc", "cpu", FLOATS, reduce_max, cost=cost, source="np.maximum.reduce"),
    ]
    if jit.available():
        src = jit.source("_nb_reduce")
        out += [Kernel(op, f"numpy.{op}.numba", "cpu", frozenset({"float32", "float64"}), prepare=prepare_numba, cost=numba_cost,
                       source=src, notes=jit.notes(f"numpy.{op}.numba"))
                for op in ("sum", "mean", "amax")]
    return out
