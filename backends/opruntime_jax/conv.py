"""conv2d on JAX devices: XLA's ``lax.conv_general_dilated`` (cuDNN on GPUs), every attribute
passed through: stride, four-sided padding, dilation (as ``rhs_dilation``), groups (as
``feature_group_count``), bias and the activation (fused by XLA into the convolution's output),
at ``Precision.HIGHEST`` for float32.

XLA aborts the whole process (an absl ``BadStatusOrAccess``, no Python exception) on a shape
whose element count overflows int64: padding ``2**31`` on every side of a 3x3 input gives a
``4294967298 x 4294967298`` result and did. :func:`supports` declines such problems, so that the
frontend reports them (no kernel supports it / out of memory) instead of the process dying."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from opruntime.kernels import Kernel, Problem

from .compile import JitKernel, device_cost, io_bytes, matmul_precision
from .epilogue import activate
from .matmul import FLOATS

DIMENSION_NUMBERS = ("NCHW", "OIHW", "NCHW")


def build_xla(problem: Problem, config: Mapping[str, Any]) -> Any:
    from jax import lax

    at = problem.attrs
    pt, pb, pl, pr = at["padding"]
    precision, act = matmul_precision(problem.dtype), at.get("activation")

    # XLA's convolutions skip the padded taps (an inf or NaN weight there gives a finite value
    # where the float64 reference has 0 * inf = NaN): float64 on the CPU pads explicitly, then
    # convolves with no padding (the other CPU dtypes multiply the padding in); on GPUs (cuDNN, every
    # dtype, and an explicit pad is folded back into the convolution) the outputs whose window
    # holds a non-finite tap over the padding are found apart and set to NaN (:func:`_padding_nans`).
    on_cpu = getattr(problem.device.provider, "platform", "cpu") == "cpu"
    explicit = on_cpu and problem.dtype == "float64" and any(at["padding"])
    marked = not on_cpu and any(at["padding"])
    padding = ((0, 0), (0, 0)) if explicit else ((pt, pb), (pl, pr))

    def conv(x: Any, w: Any, bias: Any = None) -> Any:
        if explicit:
            x = lax.pad(x, x.dtype.type(0), ((0, 0, 0), (0, 0, 0), (pt, pb, 0), (pl, pr, 0)))
        out = lax.conv_general_dilated(
            x, w, window_strides=at["stride"], padding=padding, rhs_dilation=at["dilation"],
            dimension_numbers=DIMENSION_NUMBERS, feature_group_count=at["groups"], precision=precision)
        if marked:
            out = _padding_nans(out, x.shape, w, at)
        return activate(act, out if bias is None else out + bias.reshape(1, -1, 1, 1))

    return conv


def _padding_nans(out: Any, x_shape: tuple[int, ...], w: Any, at: Mapping[str, Any]) -> Any:
    """``out`` with NaN where a non-finite weight tap meets the zero padding (``0 * inf`` and
    ``0 * nan`` are NaN in the reference; cuDNN skips those taps). The padding's indicator (one
    image, one channel: 1 over the padding, 0 over the data) convolved with each output channel's
    non-finite taps (any over its input channels: the padding is the same in every channel) counts,
    per output position, the non-finite taps over padding: a small convolution of 0 / 1 values
    (exact), and one select over the output."""
    import jax.numpy as jnp
    from jax import lax

    pt, pb, pl, pr = at["padding"]
    h, wd = x_shape[2:]
    bad = jnp.any(~jnp.isfinite(w), axis=1, keepdims=True).astype(jnp.float32)  # (K, 1, kh, kw)
    edge = jnp.pad(jnp.zeros((1, 1, h, wd), jnp.float32), ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=1.0)
    hits = lax.conv_general_dilated(edge, bad, window_strides=at["stride"], padding=((0, 0), (0, 0)),
                                    rhs_dilation=at["dilation"], dimension_numbers=DIMENSION_NUMBERS)
    return jnp.where(hits > 0, jnp.asarray(jnp.nan, out.dtype), out)


#: Every extent (dimension, stride, padding, dilation, padded or dilated size) must be below this:
#: no such tensor fits in a device, and it keeps XLA's int64 element counts from overflowing.
INT32 = 2**31
#: Element counts (of the padded input and the result) must be below this; XLA's shape check
#: aborts beyond it.
INT64 = 2**63


def supports(problem: Problem) -> bool:
    """False for a problem XLA cannot represent: any dimension, stride, padding, dilation, padded
    input extent or dilated window extent of 2**31 or more, or an element count (of the padded
    input or of the result) of 2**63 or more. Such a result would not fit in any device anyway."""
    at = problem.attrs
    (n, c, h, w), (_, _, kh, kw) = problem.shapes[:2]
    pt, pb, pl, pr = at["padding"]
    dh, dw = at["dilation"]
    padded = (n, c, h + pt + pb, w + pl + pr)
    extents = (*(d for s in problem.shapes for d in s), *problem.out_shape, *at["stride"], *at["padding"],
               dh, dw, at["groups"], *padded, dh * (kh - 1) + 1, dw * (kw - 1) + 1)
    return max(extents) < INT32 and math.prod(padded) < INT64 and math.prod(problem.out_shape) < INT64


def xla_cost(problem: Problem, config: Any) -> float:
    _, cg, kh, kw = problem.shapes[1]
    flops = 2.0 * math.prod(problem.out_shape) * cg * kh * kw
    return device_cost(problem, flops, io_bytes(problem), flop_eff=0.8)


def kernels() -> list[Kernel]:
    return [
        #       op        name                 kind   dtypes  prepare
        Kernel("conv2d", "jax.conv2d.xla", "jax", FLOATS, prepare=JitKernel("jax.conv2d.xla", build_xla).prepare,
               supports=supports, cost=xla_cost, vendor=True, source="lax.conv_general_dilated NCHW/OIHW precision=HIGHEST for f32/f64"),
    ]
