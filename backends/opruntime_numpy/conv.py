"""conv2d on the CPU: an im2col + GEMM path over a strided window view (any attributes; the
columns are built per cache-sized chunk of the batch), a 1x1 path (one batched GEMM, no column
buffer) and a depthwise path (one multiply-add per kernel tap over the whole batch). No Python
loop runs over single images or channels."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from opruntime.kernels import FLOATS, Kernel, Problem, itemsize, roofline

from .matmul import CPU_BYTES, CPU_FLOPS
from .memory import compute_dtype


def _prepare(problem: Problem, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, slack: int = 0):
    """Operands in the compute dtype, ``x`` zero-padded. With ``slack``, ``x`` is always a view of
    the first elements of a contiguous flat buffer (returned too) that has ``slack`` more."""
    dt = compute_dtype(problem.dtype)
    x, w = x.astype(dt, copy=False), w.astype(dt, copy=False)
    pt, pb, pl, pr = problem.attrs["padding"]
    flat = None
    if pt or pb or pl or pr or slack:
        n, c, h, wd = x.shape
        shape = (n, c, h + pt + pb, wd + pl + pr)
        flat = np.zeros(math.prod(shape) + slack, dt)
        xp = flat[: math.prod(shape)].reshape(shape)
        xp[:, :, pt : pt + h, pl : pl + wd] = x
        x = xp
    return x, w, (None if bias is None else bias.astype(dt, copy=False)), flat


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


#: Column-buffer budgets (bytes) the tuner tries; the heuristic takes the first. A budget that
#: keeps one chunk's columns in the last-level cache lets the GEMM read them from cache; ``None``
#: builds the columns of the whole batch at once.
IM2COL_CONFIGS = ({"cols_bytes": 4 << 20}, {"cols_bytes": 1 << 20}, {"cols_bytes": 16 << 20}, {"cols_bytes": None})


def im2col(problem: Problem, config: Any, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """im2col + GEMM over a chunk of images at a time.

    The columns are copied tap by tap from a window view of the padded input, into a buffer of at
    most ``config["cols_bytes"]`` (one image when a single image is larger), and each chunk's GEMM
    writes straight into the output. The loop runs over cache-sized chunks of the batch, not over
    images or channels: for a batch that fits the budget it runs once.

    With stride 1 the columns are *wide*: output row ``y`` is computed at every column of the
    padded row (``Wp`` of them, of which the first ``Wo`` are kept), so each tap's columns are one
    contiguous run of the flattened padded image, shifted by the tap's offset, and the copy is a
    plain memcpy per channel. The ``Wp - Wo`` extra columns cost that fraction of extra GEMM
    work and a crop; their values (read past a row's end) never reach a kept column.
    """
    g = problem.attrs["groups"]
    (sh, sw), (dh, dw) = problem.attrs["stride"], problem.attrs["dilation"]
    o, cg, kh, kw = problem.shapes[1]
    n, _, ho, wo = problem.out_shape
    wide = sh == sw == 1 and kw > 1
    x, w, bias, flat = _prepare(problem, x, w, bias, slack=(kw - 1) * dw if wide else 0)
    taps, og = kh * kw, o // g
    # weights ordered (g, og | tap, c) to match the columns (tap, c | y, x)
    wm = np.ascontiguousarray(w.reshape(g, og, cg, taps).transpose(0, 1, 3, 2)).reshape(g, og, taps * cg)
    hp, wp = x.shape[2:]
    span = ho * wp if wide else ho * wo  # columns per image and row of the column buffer
    if wide:  # tap t's columns: the flattened padded planes shifted by the tap's offset
        it = x.itemsize
        strides = (x.strides[0], cg * hp * wp * it, hp * wp * it, it)
        tap_cols = [as_strided(flat[i * dh * wp + j * dw :], (n, g, cg, span), strides, writeable=False)
                    for i in range(kh) for j in range(kw)]
    else:  # tap t's columns: the window view at (i, j), (Ho, Wo) planes
        win = _windows(x, problem, kh, kw).reshape(n, g, cg, kh, kw, ho, wo)
        tap_cols = [win[:, :, :, i, j] for i in range(kh) for j in range(kw)]
    budget = config.get("cols_bytes") if config else None
    per_image = max(1, g * taps * cg * span * x.itemsize)
    chunk = n if budget is None else max(1, min(n, budget // per_image))
    cols = np.empty((chunk, g, taps, cg, span), x.dtype)
    planes = cols.reshape(chunk, g, taps, cg, *((span,) if wide else (ho, wo)))
    out = np.empty((n, o, ho, wo), x.dtype)
    wide_out = np.empty((chunk, g, og, span), x.dtype) if wide else None
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        for t in range(taps):
            planes[:m, :, t] = tap_cols[t][start : start + m]
        dest = wide_out[:m] if wide else out[start : start + m].reshape(m, g, og, span)
        np.matmul(wm, cols[:m].reshape(m, g, taps * cg, span), out=dest)
        if wide:
            out[start : start + m] = dest.reshape(m, o, ho, wp)[..., :wo]
    return _finish(problem, out, bias)


def is_pointwise(problem: Problem) -> bool:
    return problem.shapes[1][2:] == (1, 1) and not any(problem.attrs["padding"])


def pointwise(problem: Problem, config: Any, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    x, w, bias, _ = _prepare(problem, x, w, bias)
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
    x, w, bias, _ = _prepare(problem, x, w, bias)
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
        Kernel("conv2d", "numpy.conv2d.im2col", "cpu", FLOATS, im2col, cost=im2col_cost, configs=IM2COL_CONFIGS),
        Kernel("conv2d", "numpy.conv2d.pointwise", "cpu", FLOATS, pointwise, supports=is_pointwise,
               cost=pointwise_cost),
        Kernel("conv2d", "numpy.conv2d.depthwise", "cpu", FLOATS, depthwise, supports=is_depthwise,
               cost=depthwise_cost),
    ]
