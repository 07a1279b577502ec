"""matmul on the demo device."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from opruntime import Kernel, Problem
from opruntime.kernels import itemsize, roofline

from .memory import DemoArray

DTYPES = frozenset({"float32", "float64"})
#: The demo device's figures for the cost models (FLOP/s, bytes/s, launch seconds). A real
#: backend reads them from the device (its clock, cores and memory bus) or measures them once.
FLOPS, BYTES, LAUNCH = 20e9, 5e9, 5e-6


def kernels() -> list[Kernel]:
    return [
        #      op        name                  kind    dtypes  run
        Kernel("matmul", "demo.matmul.blas", "demo", DTYPES, run, cost=cost),
    ]


def run(problem: Problem, config: Any, a: DemoArray, b: DemoArray) -> DemoArray:
    # Operands have equal rank >= 2 and broadcastable batch dims (the frontend saw to it);
    # they may be strided views, which np.matmul reads as they are.
    return DemoArray(np.matmul(a.buf, b.buf))


def cost(problem: Problem, config: Any) -> float:
    k = problem.shapes[0][-1]
    flops = 2.0 * math.prod(problem.out_shape) * k
    nbytes = (sum(math.prod(s) for s in problem.shapes) + math.prod(problem.out_shape)) * itemsize(problem.dtype)
    return roofline(flops, nbytes, FLOPS, BYTES, LAUNCH)
