"""relu on the CPU: one NumPy ``maximum`` pass (NaN stays NaN), computed in the input's dtype."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from opruntime.kernels import FLOATS, Kernel, Problem, itemsize, roofline

from .matmul import CPU_BYTES, CPU_FLOPS


def relu(problem: Problem, config: Any, x: np.ndarray) -> np.ndarray:
    # into a new array of x's shape (0-d too: a bare ufunc call would return a NumPy scalar)
    return np.maximum(x, x.dtype.type(0), out=np.empty(x.shape, x.dtype))


def cost(problem: Problem, config: Any) -> float:
    n = math.prod(problem.out_shape)
    return roofline(float(n), 2.0 * n * itemsize(problem.dtype), CPU_FLOPS, CPU_BYTES, 1e-6)


def kernels() -> list[Kernel]:
    return [Kernel("relu", "numpy.relu.maximum", "cpu", FLOATS, relu, cost=cost)]
