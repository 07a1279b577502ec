"""softmax / log_softmax in as few passes as NumPy allows: max, one subtract into the output
buffer, exp in place, sum, and an in-place scale (or log-sum-exp subtraction)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from opruntime.kernels import FLOATS, Kernel, Problem, itemsize, roofline

from .matmul import CPU_BYTES, CPU_FLOPS, F16

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


def kernels() -> list[Kernel]:
    return [
        Kernel("softmax", "numpy.softmax.fused", "cpu", FLOATS, softmax, cost=cost),
        Kernel("log_softmax", "numpy.log_softmax.fused", "cpu", FLOATS, log_softmax, cost=cost),
    ]
