"""conv2d on JAX devices: XLA's ``lax.conv_general_dilated`` (cuDNN on GPUs), every attribute
passed through: stride, four-sided padding, dilation (as ``rhs_dilation``), groups (as
``feature_group_count``) and bias, at ``Precision.HIGHEST`` for float32."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from opruntime.kernels import Kernel, Problem

from .compile import JitKernel, device_cost, io_bytes, matmul_precision
from .matmul import FLOATS

DIMENSION_NUMBERS = ("NCHW", "OIHW", "NCHW")


def build_xla(problem: Problem, config: Mapping[str, Any]) -> Any:
    from jax import lax

    at = problem.attrs
    pt, pb, pl, pr = at["padding"]
    precision = matmul_precision(problem.dtype)

    def conv(x: Any, w: Any, bias: Any = None) -> Any:
        out = lax.conv_general_dilated(
            x, w, window_strides=at["stride"], padding=((pt, pb), (pl, pr)), rhs_dilation=at["dilation"],
            dimension_numbers=DIMENSION_NUMBERS, feature_group_count=at["groups"], precision=precision)
        return out if bias is None else out + bias.reshape(1, -1, 1, 1)

    return conv


def xla_cost(problem: Problem, config: Any) -> float:
    _, cg, kh, kw = problem.shapes[1]
    flops = 2.0 * math.prod(problem.out_shape) * cg * kh * kw
    return device_cost(problem, flops, io_bytes(problem), flop_eff=0.8)


def kernels() -> list[Kernel]:
    return [
        #       op        name                 kind   dtypes  run
        Kernel("conv2d", "jax.conv2d.xla", "jax", FLOATS, **JitKernel("jax.conv2d.xla", build_xla).callables(),
               cost=xla_cost, vendor=True, source="lax.conv_general_dilated NCHW/OIHW precision=HIGHEST for f32/f64"),
    ]
