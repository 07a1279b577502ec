"""sum, mean and amax on JAX devices: ``jnp.sum`` / ``jnp.mean`` / ``jnp.max`` through XLA (one
fused reduction). float16 and bfloat16 accumulate in float32 (``dtype=`` of the reduction: the
widening happens inside XLA's reduction, no float32 copy of the input) and are rounded once;
``jnp.max`` propagates NaN. ``axis=()`` reduces nothing: ``x + 0`` makes the result a new
buffer (a jitted identity would hand the operand itself back)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from opruntime.kernels import Kernel, Problem

from .compile import JitKernel, device_cost, io_bytes
from .matmul import FLOATS

HALF = ("float16", "bfloat16")


def build(problem: Problem, config: Mapping[str, Any]) -> Any:
    """The traceable function of ``problem`` (``jax.jit`` is applied by :class:`JitKernel`)."""
    import jax.numpy as jnp

    axes, keep, op = problem.attrs["axis"], problem.attrs["keepdims"], problem.op
    if not axes:
        return lambda x: (x + jnp.zeros((), x.dtype)).reshape(problem.out_shape)
    if op == "amax":
        return lambda x: jnp.max(x, axis=axes, keepdims=keep)
    fn = jnp.sum if op == "sum" else jnp.mean
    if problem.dtype in HALF:
        return lambda x: fn(x, axis=axes, keepdims=keep, dtype=jnp.float32).astype(x.dtype)
    return lambda x: fn(x, axis=axes, keepdims=keep)


def cost(problem: Problem, config: Any) -> float:
    return device_cost(problem, float(math.prod(problem.shapes[0])), io_bytes(problem), byte_eff=0.85)


def kernels() -> list[Kernel]:
    out = []
    for op, how in (("sum", "jnp.sum"), ("mean", "jnp.mean"), ("amax", "jnp.max")):
        name = f"jax.{op}.xla"
        #             op  name  kind   dtypes  prepare
        out.append(Kernel(op, name, "jax", FLOATS, prepare=JitKernel(name, build).prepare, cost=cost, vendor=True,
                          source=f"{how}, 16-bit types accumulated in float32"))
    return out
