"""matmul on JAX devices: XLA's dot (the vendor baseline) and a blocked Pallas kernel.

XLA runs float32 at ``Precision.HIGHEST`` (true float32, no TF32; set JAX's own
``jax_default_matmul_precision`` to allow TF32 and it applies instead). The Pallas kernel is
selectable by pin (``[ops.matmul] kernel = "jax.matmul.pallas_blocked"``); its estimate ranks it
below XLA, which was faster in every case measured (docs/notes-jax.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from opruntime.kernels import Kernel, Problem

from . import pallas_matmul
from .compile import JitKernel, device_cost, io_bytes, matmul_precision, platform

FLOATS = frozenset({"float16", "bfloat16", "float32", "float64"})
PALLAS_FLOATS = frozenset({"float16", "bfloat16", "float32"})


def build_xla(problem: Problem, config: Mapping[str, Any]) -> Any:
    import jax.numpy as jnp

    precision = matmul_precision(problem.dtype)
    return lambda a, b: jnp.matmul(a, b, precision=precision)


def flops(problem: Problem) -> float:
    return 2.0 * math.prod(problem.out_shape) * problem.shapes[0][-1]


def xla_cost(problem: Problem, config: Any) -> float:
    return device_cost(problem, flops(problem), io_bytes(problem))


#: Pallas efficiency relative to XLA on the platform figures: (float32, half, launch multiplier).
#: Measured on an H200 at 4096^3: 0.88x XLA in float32 (Triton's IEEE dot), 0.95-0.98x in
#: fp16 / bf16. Untested on TPU. Interpreted on the CPU it is orders of magnitude slower.
PALLAS_EFF = {"cpu": (0.002, 0.002, 100.0), "gpu": (0.85, 0.93, 1.5), "tpu": (0.7, 0.7, 1.5)}


def pallas_cost(problem: Problem, config: Mapping[str, Any]) -> float:
    f32, half, launch = PALLAS_EFF.get(platform(problem), (0.5, 0.5, 1.5))
    eff = half if problem.dtype in ("float16", "bfloat16") else f32
    bm, bn, _ = pallas_matmul.blocks(problem, config)
    m, n = problem.shapes[0][-2], problem.shapes[1][-1]
    reads = io_bytes(problem) * (1 + m / bn / 8 + n / bm / 8)  # A re-read per column block, B per row block (L2 helps)
    return device_cost(problem, flops(problem), reads, flop_eff=eff, launch_mult=launch)


#: (bm, bn, bk, num_warps, num_stages); the first of each list is the heuristic's choice, the
#: autotuner times them all. num_warps / num_stages only matter to Triton. GPU rows: the best
#: first, as measured at 4096^3 on an H200 (docs/notes-jax.md).
PALLAS_CONFIGS = {
    ("gpu", "float32"): [(64, 64, 32, 4, 3), (128, 128, 32, 8, 3), (128, 64, 32, 4, 3), (64, 128, 16, 4, 4)],
    ("gpu", "half"): [(128, 256, 64, 8, 3), (128, 128, 64, 8, 3), (64, 128, 64, 4, 4), (128, 128, 32, 4, 4)],
    ("tpu", "float32"): [(256, 256, 256, None, None), (512, 512, 256, None, None), (128, 128, 128, None, None)],
    ("tpu", "half"): [(512, 512, 512, None, None), (256, 256, 256, None, None), (128, 128, 128, None, None)],
    ("cpu", "float32"): [(128, 128, 128, None, None), (64, 64, 64, None, None)],
}


def pallas_configs(problem: Problem) -> list[dict[str, Any]]:
    plat = platform(problem)
    fam = "float32" if problem.dtype == "float32" else "half"
    rows = PALLAS_CONFIGS.get((plat, fam)) or PALLAS_CONFIGS.get((plat, "float32")) or PALLAS_CONFIGS[("gpu", fam)]
    keys = ("bm", "bn", "bk", "num_warps", "num_stages")
    return [{k: v for k, v in zip(keys, r) if v is not None} for r in rows]


def kernels() -> list[Kernel]:
    return [
        #       op        name                         kind   dtypes         prepare
        Kernel("matmul", "jax.matmul.xla", "jax", FLOATS, prepare=JitKernel("jax.matmul.xla", build_xla).prepare,
               cost=xla_cost, vendor=True, source="jnp.matmul precision=HIGHEST for f32/f64"),
        Kernel("matmul", "jax.matmul.pallas_blocked", "jax", PALLAS_FLOATS,
               prepare=JitKernel("jax.matmul.pallas_blocked", pallas_matmul.build).prepare,
               supports=pallas_matmul.supports, cost=pallas_cost, config_for=pallas_configs,
               configs=({"bm": 64, "bn": 64, "bk": 32},), source=_source(pallas_matmul)),
    ]


def _source(module: Any) -> str:
    import inspect

    return inspect.getsource(module)
