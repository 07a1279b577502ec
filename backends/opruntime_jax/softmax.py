"""softmax / log_softmax on JAX devices: ``jax.nn`` through XLA (one fused reduction kernel),
and a row-blocked Pallas kernel: the default on GPUs for rows of 16K+ values, where it measured
1.3-1.4x XLA, and selectable by pin elsewhere (``[ops.softmax] kernel = "jax.softmax.pallas_rows"``). float16 / bfloat16 are computed in
float32 inside the fused kernel (no extra memory traffic)."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

from opruntime.kernels import Kernel, Problem

from . import pallas_softmax
from .compile import JitKernel, device_cost, io_bytes, platform
from .matmul import FLOATS, PALLAS_FLOATS, _source


def build_xla(problem: Problem, config: Mapping[str, Any], log: bool) -> Any:
    import jax
    import jax.numpy as jnp

    fn, axis = (jax.nn.log_softmax if log else jax.nn.softmax), problem.attrs["axis"]
    if problem.dtype in ("float16", "bfloat16"):
        return lambda x: fn(x.astype(jnp.float32), axis=axis).astype(x.dtype)
    return lambda x: fn(x, axis=axis)


#: XLA's softmax on GPUs reaches ~0.55 of the bandwidth on rows of 16K+ values (one block per
#: row, measured on an H200: 1.9 TB/s at 1024x32768 vs 3.7 TB/s at 8192x8192); elsewhere ~0.9.
LONG_ROW = 16384


def xla_cost(problem: Problem, config: Any) -> float:
    long_rows = platform(problem) == "gpu" and problem.shapes[0][problem.attrs["axis"]] >= LONG_ROW
    return device_cost(problem, 5.0 * math.prod(problem.out_shape), io_bytes(problem),
                       byte_eff=0.55 if long_rows else 0.9)


#: Pallas bandwidth efficiency relative to the platform figure, and launch multiplier. On an H200
#: the compiled kernel measured 1.0-1.1x XLA up to 8K columns and 1.3-1.4x above (docs/notes-jax.md):
#: 0.85 keeps XLA the default up to 8K and makes Pallas the choice for long rows. Untested on TPU
#: (rated below XLA); interpreted on the CPU it is orders of magnitude slower.
PALLAS_EFF = {"cpu": (0.01, 50.0), "gpu": (0.85, 1.2), "tpu": (0.5, 1.2)}


def pallas_cost(problem: Problem, config: Mapping[str, Any]) -> float:
    eff, launch = PALLAS_EFF.get(platform(problem), (0.5, 1.2))
    cols = pallas_softmax.rows_cols(problem)[1]
    padded = pallas_softmax.padded_cols(problem) / cols
    moved = 2.0 if problem.attrs["axis"] != len(problem.shapes[0]) - 1 else 0.0  # a transpose in and out
    nbytes = io_bytes(problem) * (padded + moved + (1.0 if padded > 1 else 0.0))
    return device_cost(problem, 5.0 * math.prod(problem.out_shape), nbytes, byte_eff=eff, launch_mult=launch)


def kernels() -> list[Kernel]:
    src = _source(pallas_softmax)
    table = []
    for op, log in (("softmax", False), ("log_softmax", True)):
        xla, pallas = f"jax.{op}.xla", f"jax.{op}.pallas_rows"
        table += [
            #      op  name    kind   dtypes  prepare
            Kernel(op, xla, "jax", FLOATS, prepare=JitKernel(xla, functools.partial(build_xla, log=log)).prepare,
                   cost=xla_cost, vendor=True, source=f"jax.nn.{op}, half types in float32"),
            Kernel(op, pallas, "jax", PALLAS_FLOATS,
                   prepare=JitKernel(pallas, functools.partial(pallas_softmax.build, log=log)).prepare,
                   supports=pallas_softmax.supports, cost=pallas_cost, config_for=pallas_softmax.configs,
                   configs=({"block_rows": 1},), source=src),
        ]
    return table
