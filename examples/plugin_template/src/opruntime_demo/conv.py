"""conv2d on the demo device: one einsum over a strided window view (every attribute)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from opruntime import Kernel, Problem
from opruntime.kernels import itemsize, roofline
from opruntime.ops.base import ACTIVATIONS

from .matmul import BYTES, DTYPES, FLOPS, LAUNCH
from .memory import DemoArray


def kernels() -> list[Kernel]:
    return [
        #      op        name                    kind    dtypes  run
        Kernel("conv2d", "demo.conv2d.window", "demo", DTYPES, run, cost=cost),
    ]


def run(problem: Problem, config: Any, x: DemoArray, w: DemoArray, bias: DemoArray | None = None) -> DemoArray:
    # attrs are normalised by the frontend: stride / dilation pairs, padding as
    # (top, bottom, left, right), groups, bias (the third operand when True), and activation
    # (None or a name of opruntime.ops.base.EPILOGUES, applied after the bias).
    a = problem.attrs
    (sh, sw), (dh, dw), g = a["stride"], a["dilation"], a["groups"]
    pt, pb, pl, pr = a["padding"]
    xb = np.pad(x.buf, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    o, cg, kh, kw = w.shape
    n, _, ho, wo = problem.out_shape
    win = sliding_window_view(xb, (dh * (kh - 1) + 1, dw * (kw - 1) + 1), axis=(2, 3))
    win = win[:, :, : sh * (ho - 1) + 1 : sh, : sw * (wo - 1) + 1 : sw, ::dh, ::dw]  # (n, c, ho, wo, kh, kw)
    win = win.reshape(n, g, cg, ho, wo, kh, kw)
    wg = w.buf.reshape(g, o // g, cg, kh, kw)
    out = np.einsum("ngchwij,gocij->ngohw", win, wg, optimize=True).reshape(n, o, ho, wo)
    if bias is not None:
        out += bias.buf.reshape(1, -1, 1, 1)
    if a.get("activation") is not None:  # the frontend's float64 definition, in the output's precision
        out = ACTIVATIONS[a["activation"]](out.astype(np.float64))
    return DemoArray(np.ascontiguousarray(out, dtype=problem.dtype))


def cost(problem: Problem, config: Any) -> float:
    _, cg, kh, kw = problem.shapes[1]
    flops = 2.0 * math.prod(problem.out_shape) * cg * kh * kw
    nbytes = (sum(math.prod(s) for s in problem.shapes) + math.prod(problem.out_shape)) * itemsize(problem.dtype)
    return roofline(flops, nbytes, FLOPS, BYTES, LAUNCH)
