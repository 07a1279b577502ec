"""softmax / log_softmax in as few passes as NumPy allows: max, one fused subtract+exp into
the output buffer, sum, and an in-place scale (or log-sum-exp subtraction)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from opruntime.kernels import Problem, itemsize, roofline

from .matmul import CPU_BYTES, CPU_FLOPS
from .memory import compute_dtype


def _shifted(problem: Problem, x: np.ndarray) -> tuple[np.ndarray, int]:
    axis = problem.attrs["axis"]
    dt = compute_dtype(problem.dtype)
    if x.dtype != dt:
        x = x.astype(dt)
    out = np.empty(x.shape, dt)
    with np.errstate(invalid="ignore", over="ignore"):
        np.subtract(x, x.max(axis=axis, keepdims=True), out=out)
    return out, axis


def softmax(problem: Problem, config: Any, x: np.ndarray) -> np.ndarray:
    out, axis = _shifted(problem, x)
    np.exp(out, out=out)
    with np.errstate(invalid="ignore", divide="ignore"):
        out /= out.sum(axis=axis, keepdims=True)
    return out.astype(problem.dtype, copy=False)


def log_softmax(problem: Problem, config: Any, x: np.ndarray) -> np.ndarray:
    out, axis = _shifted(problem, x)
    with np.errstate(invalid="ignore", divide="ignore"):
        out -= np.log(np.exp(out).sum(axis=axis, keepdims=True))
    return out.astype(problem.dtype, copy=False)


def cost(problem: Problem, config: Any) -> float:
    n = math.prod(problem.out_shape)
    return roofline(5.0 * n, 4.0 * n * itemsize(problem.dtype), CPU_FLOPS, CPU_BYTES, 2e-6)
