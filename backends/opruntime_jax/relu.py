"""relu on JAX devices: XLA's ``jax.nn.relu`` (one fused elementwise kernel; NaN stays NaN)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from opruntime.kernels import Kernel, Problem

from .compile import JitKernel, device_cost, io_bytes
from .matmul import FLOATS


def build_xla(problem: Problem, config: Mapping[str, Any]) -> Any:
    import jax

    return jax.nn.relu


def xla_cost(problem: Problem, config: Any) -> float:
    return device_cost(problem, float(math.prod(problem.out_shape)), io_bytes(problem), byte_eff=0.9)


def kernels() -> list[Kernel]:
    return [Kernel("relu", "jax.relu.xla", "jax", FLOATS, prepare=JitKernel("jax.relu.xla", build_xla).prepare,
                   cost=xla_cost, vendor=True, source="jax.nn.relu")]
