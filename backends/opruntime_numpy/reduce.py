"""sum, mean and amax on the CPU: one NumPy ufunc reduction each, over the problem's axes (any
strides: NumPy walks a view as it is). float16 accumulates in float32 (``dtype=`` of the
reduction, no float32 copy of the input) and is rounded once at the end; ``maximum.reduce``
keeps NaN (as torch's amax)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from opruntime.kernels import FLOATS, Kernel, Problem, itemsize, roofline

from .matmul import CPU_BYTES, CPU_FLOPS, F16

F32 = np.dtype(np.float32)
# inf - inf in a sum gives NaN, as the reference: errstate as a decorator keeps NumPy quiet cheaply
_quiet = np.errstate(invalid="ignore", over="ignore")


def _sum(problem: Problem, x: np.ndarray) -> np.ndarray:
    a = problem.attrs
    return np.add.reduce(x, axis=a["axis"], dtype=F32 if x.dtype is F16 else None, keepdims=a["keepdims"])


@_quiet
def reduce_sum(problem: Problem, config: Any, x: np.ndarray) -> np.ndarray:
    """``np.add.reduce`` over the problem's axes."""
    return np.asarray(_sum(problem, x)).astype(problem.dtype, copy=False)


@_quiet
def reduce_mean(problem: Problem, config: Any, x: np.ndarray) -> np.ndarray:
    """The sum, then one division by the count (in float32 for float16)."""
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


def kernels() -> list[Kernel]:
    return [
        #      op      name                  kind   dtypes  run
        Kernel("sum", "numpy.sum.ufunc", "cpu", FLOATS, reduce_sum, cost=cost, source="np.add.reduce"),
        Kernel("mean", "numpy.mean.ufunc", "cpu", FLOATS, reduce_mean, cost=cost, source="np.add.reduce / n"),
        Kernel("amax", "numpy.amax.ufunc", "cpu", FLOATS, reduce_max, cost=cost, source="np.maximum.reduce"),
    ]
