"""The elementwise family on the CPU: ``add``/``sub``/``mul``/``div`` as one NumPy ufunc into a new
array (broadcasting and strided operands read in place; float16 computed as NumPy does), ``neg``
as ``np.negative``, and the activations through this backend's ``epilogue.activate`` (float16
computed in float32, one rounding at the end)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from opruntime.kernels import FLOATS, Kernel, Problem, itemsize, roofline
from opruntime.ops.elementwise import BINARY_OPS, UNARY_OPS, activation

from .epilogue import activate
from .matmul import CPU_BYTES, CPU_FLOPS, F16

UFUNCS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}
_quiet = np.errstate(divide="ignore", invalid="ignore", over="ignore")  # IEEE results, no warnings


@_quiet
def binary(problem: Problem, config: Any, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # into a new array of the broadcast shape (0-d too: a bare ufunc call would return a scalar)
    return UFUNCS[problem.op](a, b, out=np.empty(problem.out_shape, a.dtype))


@_quiet
def unary(problem: Problem, config: Any, x: np.ndarray) -> np.ndarray:
    if problem.op == "neg":
        return np.negative(x, out=np.empty(x.shape, x.dtype))
    if problem.op == "relu":  # exact in any dtype: no widening
        return np.maximum(x, x.dtype.type(0), out=np.empty(x.shape, x.dtype))
    y = np.array(x, np.float32 if x.dtype is F16 else x.dtype, order="C", copy=True)
    activate(activation(problem), y.reshape(-1))  # 1-d: on a 0-d array NumPy's ufuncs give scalars
    return y if y.dtype == x.dtype else y.astype(x.dtype)


def cost(problem: Problem, config: Any) -> float:
    n = math.prod(problem.out_shape)
    moved = sum(math.prod(s) for s in problem.shapes) + n
    return roofline(float(n), moved * itemsize(problem.dtype), CPU_FLOPS, CPU_BYTES, 1e-6)


def kernels() -> list[Kernel]:
    return ([Kernel(op, f"numpy.{op}.ufunc", "cpu", FLOATS, binary, cost=cost) for op in BINARY_OPS]
            + [Kernel(op, f"numpy.{op}.ufunc", "cpu", FLOATS, unary, cost=cost) for op in UNARY_OPS])
