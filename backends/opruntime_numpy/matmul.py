"""matmul through NumPy's BLAS."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from opruntime.kernels import FLOATS, Kernel, Problem, itemsize, roofline

F16 = np.dtype(np.float16)
CPU_FLOPS, CPU_BYTES = 50e9, 10e9  # rough 2-core figures: the estimate only ranks CPU kernels


def run(problem: Problem, config: Any, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype is F16:  # computed in float32
        return np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(np.float16)
    return np.matmul(a, b)


def cost(problem: Problem, config: Any) -> float:
    k = problem.shapes[0][-1]
    flops = 2.0 * math.prod(problem.out_shape) * k
    nbytes = (sum(math.prod(s) for s in problem.shapes) + math.prod(problem.out_shape)) * itemsize(problem.dtype)
    return roofline(flops, nbytes, CPU_FLOPS, CPU_BYTES, 1e-6)


def kernels() -> list[Kernel]:
    return [Kernel("matmul", "numpy.matmul.blas", "cpu", FLOATS, run, cost=cost)]
