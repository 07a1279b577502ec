"""The elementwise family on JAX devices: ``add``/``sub``/``mul``/``div`` as ``jax.numpy``
arithmetic (NumPy broadcasting) followed by their ``activation=`` (``epilogue.activate``),
``neg``, and the activations through the same ``epilogue.activate``, each one jitted function
that XLA fuses into one kernel. float16 and
bfloat16 are computed in float32 inside it (one rounding, no extra memory traffic)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from opruntime.kernels import Kernel, Problem
from opruntime.ops.elementwise import BINARY_OPS, UNARY_OPS, activation

from .compile import JitKernel, device_cost, io_bytes
from .epilogue import activate
from .matmul import FLOATS


def build_xla(problem: Problem, config: Mapping[str, Any]) -> Any:
    import jax.numpy as jnp

    op = problem.op
    if op in BINARY_OPS:
        fn = {"add": jnp.add, "sub": jnp.subtract, "mul": jnp.multiply, "div": jnp.divide}[op]
        act = activation(problem)
        if problem.dtype in ("float16", "bfloat16"):  # in float32, rounded once: correctly rounded as
            # NumPy, torch and the CUDA kernels (XLA's CPU float16 division was 1 ulp off: 3 / 2.5)
            return lambda a, b: activate(act, fn(a.astype(jnp.float32), b.astype(jnp.float32))).astype(a.dtype)
        if act is None:
            return fn
        return lambda a, b: activate(act, fn(a, b))  # one jitted function: XLA fuses the two
    if op == "neg":
        return jnp.negative
    if op == "relu":  # exact in any dtype
        return lambda x: activate("relu", x)
    act = activation(problem)
    if problem.dtype in ("float16", "bfloat16"):
        return lambda x: activate(act, x.astype(jnp.float32)).astype(x.dtype)
    return lambda x: activate(act, x)


def xla_cost(problem: Problem, config: Any) -> float:
    return device_cost(problem, float(math.prod(problem.out_shape)), io_bytes(problem), byte_eff=0.9)


def kernels() -> list[Kernel]:
    return [Kernel(op, f"jax.{op}.xla", "jax", FLOATS, prepare=JitKernel(f"jax.{op}.xla", build_xla).prepare,
                   cost=xla_cost, vendor=True, source="jax.numpy / opruntime_jax.epilogue.activate")
            for op in (*BINARY_OPS, *UNARY_OPS)]
