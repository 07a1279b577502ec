"""conv2d on the CPU: an im2col + GEMM path over a strided window view (any attributes), a 1x1
path (one batched GEMM, no column buffer) and a depthwise path (one multiply-add per kernel tap
over the whole batch). No Python loop runs over the batch or the channels."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from opruntime.kernels import FLOATS, Kernel, Problem, itemsize, roofline

from .matmul import CPU_BYTES, CPU_FLOPS
from .memory import compute_dtype


def _prepare(problem: Problem, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None):
    dt = compute_dtype(problem.dtype)
    x, w = x.astype(dt, copy=False), w.astype(dt, copy=False)
    pt, pb, pl, pr = problem.attrs["padding"]
    if pt or pb or pl or pr:
        x = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    return x, w, (None if bias is None else bias.astype(dt, copy=False))


def _finish(problem: Problem, out: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    if bias is not None:
        out += bias.reshape(1, -1, 1, 1)
    return out.astype(problem.dtype, copy=False)


def _windows(x: np.ndarray, problem: Problem, kh: int, kw: int) -> np.ndarray:
    """A (N, C, kh, kw, Ho, Wo) view of the padded input: no copy."""
    (sh, sw), (dh, dw) = problem.attrs["stride"], problem.attrs["dilation"]
    _, _, ho, wo = problem.out_shape
    n, c = x.shape[:2]
    s0, s1, s2, s3 = x.strides
    return as_strided(x, (n, c, kh, kw, ho, wo), (s0, s1, s2 * dh, s3 * dw, s2 * sh, s3 * sw), writeable=False)


def im2col(problem: Problem, config: Any, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    x, w, bias = _prepare(problem, x, w, bias)
    g = problem.attrs["groups"]
    o, cg, kh, kw = w.shape
    n, _, ho, wo = problem.out_shape
    win = _windows(x, problem, kh, kw).reshape(n, g, cg, kh, kw, ho, wo)
    # columns ordered (g, c, i, j | n, y, x): the copy reads whole output rows of x at a time
    cols = np.ascontiguousarray(win.transpose(1, 2, 3, 4, 0, 5, 6)).reshape(g, cg * kh * kw, n * ho * wo)
    out = np.matmul(w.reshape(g, o // g, cg * kh * kw), cols)  # (g, og, n*ho*wo)
    out = np.ascontiguousarray(out.reshape(o, n, ho, wo).transpose(1, 0, 2, 3))
    return _finish(problem, out, bias)


def is_pointwise(problem: Problem) -> bool:
    return problem.shapes[1][2:] == (1, 1) and not any(problem.attrs["padding"])


def pointwise(problem: Problem, config: Any, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    x, w, bias = _prepare(problem, x, w, bias)
    (sh, sw), g = problem.attrs["stride"], problem.attrs["groups"]
    n, o, ho, wo = problem.out_shape
    xs = x[:, :, : sh * (ho - 1) + 1 : sh, : sw * (wo - 1) + 1 : sw]
    cg = w.shape[1]
    xs = xs.reshape(n, g, cg, ho * wo)  # a copy only when strided
    out = np.matmul(w.reshape(g, o // g, cg), xs)  # (n, g, og, ho*wo)
    return _finish(problem, out.reshape(n, o, ho, wo), bias)


def is_depthwise(problem: Problem) -> bool:
    c, g = problem.shapes[0][1], problem.attrs["groups"]
    return g == c and problem.shapes[1][1] == 1


def depthwise(problem: Problem, config: Any, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    x, w, bias = _prepare(problem, x, w, bias)
    o, _, kh, kw = w.shape
    n, _, ho, wo = problem.out_shape
    mult = o // x.shape[1]
    win = _windows(x, problem, kh, kw)  # (n, c, kh, kw, ho, wo)
    if mult > 1:
        win = np.repeat(win, mult, axis=1)
    out = np.zeros((n, o, ho, wo), x.dtype)
    for i in range(kh):  # a loop over the kernel taps only
        for j in range(kw):
            out += win[:, :, i, j] * w[:, 0, i, j].reshape(1, o, 1, 1)
    return _finish(problem, out, bias)


def _bytes(problem: Problem, extra: float = 0.0) -> float:
    n = sum(math.prod(s) for s in problem.shapes) + math.prod(problem.out_shape)
    return (n + extra) * itemsize(problem.dtype)


def _flops(problem: Problem) -> float:
    _, cg, kh, kw = problem.shapes[1]
    return 2.0 * math.prod(problem.out_shape) * cg * kh * kw


def im2col_cost(problem: Problem, config: Any) -> float:
    _, cg, kh, kw = problem.shapes[1]
    n, _, ho, wo = problem.out_shape
    cols = problem.attrs["groups"] * cg * kh * kw * n * ho * wo
    return roofline(_flops(problem), _bytes(problem, 2 * cols), CPU_FLOPS, CPU_BYTES, 1e-5)


def pointwise_cost(problem: Problem, config: Any) -> float:
    return roofline(_flops(problem), _bytes(problem), CPU_FLOPS, CPU_BYTES, 5e-6)


def depthwise_cost(problem: Problem, config: Any) -> float:
    _, _, kh, kw = problem.shapes[1]
    taps = kh * kw
    return roofline(_flops(problem), _bytes(problem, 3 * taps * math.prod(problem.out_shape)),
                    CPU_FLOPS / 4, CPU_BYTES, 5e-6)


def kernels() -> list[Kernel]:
    return [
        Kernel("conv2d", "numpy.conv2d.im2col", "cpu", FLOATS, im2col, cost=im2col_cost),
        Kernel("conv2d", "numpy.conv2d.pointwise", "cpu", FLOATS, pointwise, supports=is_pointwise,
               cost=pointwise_cost),
        Kernel("conv2d", "numpy.conv2d.depthwise", "cpu", FLOATS, depthwise, supports=is_depthwise,
               cost=depthwise_cost),
    ]
