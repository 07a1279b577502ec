"""linear on JAX devices: ``x @ w.T + b (+ residual)`` and the activation (``epilogue.activate``) in one jitted
function; XLA fuses the bias and the activation into the dot's output (cuBLASLt's epilogue on
GPUs), float32 at ``Precision.HIGHEST``. float16 and bfloat16 accumulate in float32 and apply the
bias, residual and activation there, rounded once at the end (as the CUDA kernels): rounded after
the dot and again after the bias, a sum that cancels kept the dot's rounding error, 7 ulp of a
float16 result."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from opruntime.kernels import Kernel, Problem

from .compile import JitKernel, accumulator, device_cost, io_bytes, matmul_precision
from .epilogue import activate
from .matmul import FLOATS


def build_xla(problem: Problem, config: Mapping[str, Any]) -> Any:
    from jax import lax

    precision, act = matmul_precision(problem.dtype), problem.attrs["activation"]
    acc = accumulator(problem.dtype)
    has_bias, has_residual = problem.attrs["bias"], problem.attrs["residual"]
    # contract x's dim 1 with w's dim 1: x @ w.T without materialising the transpose
    dims = (((1,), (1,)), ((), ()))

    def linear(x: Any, w: Any, *rest: Any) -> Any:
        y = lax.dot_general(x, w, dims, precision=precision, preferred_element_type=acc)
        if has_bias:
            y = y + rest[0].astype(y.dtype)
        if has_residual:
            y = y + rest[-1].astype(y.dtype)
        return activate(act, y).astype(x.dtype)

    return linear


def xla_cost(problem: Problem, config: Any) -> float:
    m, k = problem.shapes[0]
    return device_cost(problem, 2.0 * m * problem.shapes[1][0] * k + 8.0 * math.prod(problem.out_shape),
                       io_bytes(problem))


def kernels() -> list[Kernel]:
    return [
        Kernel("linear", "jax.linear.xla", "jax", FLOATS, prepare=JitKernel("jax.linear.xla", build_xla).prepare,
               cost=xla_cost, vendor=True, source="lax.dot_general(x, w, contract 1 with 1) + b, activate; HIGHEST f32/f64"),
    ]
