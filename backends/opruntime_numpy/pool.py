"""max_pool2d, avg_pool2d and adaptive_avg_pool2d on the CPU, vectorized over whole planes.

* max / avg: the (N*C) planes in chunks that stay in cache, spread over the cores; per chunk the
  padded planes (-inf for max, zeros for avg) are built once, then one ``maximum`` / ``add`` per
  kernel tap runs over every output of the chunk (a strided view of the padded planes per tap:
  kh*kw Python iterations per chunk, vectorized inside). avg divides by torch's divisor, an
  (oh, ow) table made from the two dims' window extents.
* adaptive avg: separable sums (over each output row's input rows, then over each output
  column's input columns), one ``add.reduceat`` per dim where the windows tile it, else one sum
  per window; divided by the windows' sizes. The 1x1 (global) pool is one sum over H and W.

float16 is accumulated in float32 (avg), max compares in the input's dtype (exact).

With numba (:mod:`.jit`), ``numpy.max_pool2d.numba`` and ``numpy.avg_pool2d.numba`` take one
plane per parallel task, so the input is read once and the output written once (the NumPy path
passes over the outputs once per tap). Both are separable (:mod:`._nb_pool`), with no padded
copy of the plane: per output row the window's rows reduced into one row (contiguous,
vectorized: a sum, or a max that keeps NaN), then each output's columns reduced from it (the
taps of a strided window read straight from the plane did not vectorize). float16 is computed
in float32 (exact for max). ``numpy.adaptive_avg_pool2d.numba`` (:mod:`._nb_pool`) reads the input once
with the planes spread over the cores (the NumPy kernel runs on one).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from opruntime.kernels import FLOATS, Kernel, Problem, itemsize, roofline

from . import jit
from .conv import _threads
from .matmul import CPU_BYTES, CPU_FLOPS, F16

#: planes up to this many elements are summed by einsum for the 1x1 pool (its sequential SIMD
#: sums stay well inside float32's tolerance there); longer ones by NumPy's pairwise mean
GLOBAL_EINSUM = 4096
#: padded-plane bytes per chunk the tuner tries (the heuristic uses the first)
CONFIGS = ({"chunk_bytes": 1 << 20}, {"chunk_bytes": 4 << 20}, {"chunk_bytes": 256 << 10})


def _geometry(problem: Problem) -> tuple[int, ...]:
    """(kh, kw, sh, sw, ph, pw, dh, dw, bh, bw): the window, and the padding after the input
    (``bh``, ``bw``) as far as the last window reaches (with ``ceil_mode`` that may pass the
    right padding; without it, the padding a window can touch)."""
    a = problem.attrs
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = a["kernel_size"], a["stride"], a["padding"], a["dilation"]
    _, _, h, w = problem.shapes[0]
    oh, ow = problem.out_shape[2:]
    bh = max(0, (oh - 1) * sh + dh * (kh - 1) + 1 - h - ph)
    bw = max(0, (ow - 1) * sw + dw * (kw - 1) + 1 - w - pw)
    return kh, kw, sh, sw, ph, pw, dh, dw, bh, bw


def _divisors(size: int, out: int, k: int, pad: int, stride: int, include: bool) -> np.ndarray:
    start = np.arange(out) * stride - pad
    end = np.minimum(start + k, size + pad)
    return end - start if include else np.minimum(end, size) - np.maximum(start, 0)


def _pool(problem: Problem, config: Any, x: np.ndarray, mode: str) -> np.ndarray:
    n, c, h, w = x.shape
    oh, ow = problem.out_shape[2:]
    kh, kw, sh, sw, ph, pw, dh, dw, bh, bw = _geometry(problem)
    planes = n * c
    x3 = x.reshape(planes, h, w)  # a view for the usual layouts (a copy for exotic strides)
    acc_t = x.dtype if mode == "max" or x.dtype != F16 else np.dtype(np.float32)
    hp, wp = ph + h + bh, pw + w + bw
    padded = hp != h or wp != w or acc_t != x.dtype
    fill = -np.inf if mode == "max" else 0.0
    out = np.empty((planes, oh, ow), x.dtype)
    chunk = max(1, (config or CONFIGS[0])["chunk_bytes"] // (hp * wp * np.dtype(acc_t).itemsize))
    if mode == "avg":
        a = problem.attrs
        div = np.outer(_divisors(h, oh, kh, ph, sh, a["count_include_pad"]),
                       _divisors(w, ow, kw, pw, sw, a["count_include_pad"])).astype(acc_t)

    def run(start: int) -> None:
        m = min(chunk, planes - start)
        if padded:
            buf = np.full((m, hp, wp), fill, acc_t)
            buf[:, ph:ph + h, pw:pw + w] = x3[start:start + m]
        else:
            buf = x3[start:start + m]
        acc = out[start:start + m] if acc_t == x.dtype else np.empty((m, oh, ow), acc_t)
        reduce = np.maximum if mode == "max" else np.add  # maximum keeps NaN
        for t in range(kh * kw):
            i, j = divmod(t, kw)
            tap = buf[:, i * dh:i * dh + sh * (oh - 1) + 1:sh, j * dw:j * dw + sw * (ow - 1) + 1:sw]
            if t == 0:
                acc[...] = tap
            else:
                reduce(acc, tap, out=acc)
        if mode == "avg":
            np.divide(acc, div, out=acc)
            if acc_t != x.dtype:
                out[start:start + m] = acc

    starts = range(0, planes, chunk)
    if len(starts) > 1:
        list(_threads().map(run, starts))
    else:
        run(0)
    return out.reshape(problem.out_shape)


def max_pool2d(problem: Problem, config: Any, x: np.ndarray) -> np.ndarray:
    return _pool(problem, config, x, "max")


def avg_pool2d(problem: Problem, config: Any, x: np.ndarray) -> np.ndarray:
    return _pool(problem, config, x, "avg")


def _window_sums(x: np.ndarray, axis: int, size: int, out: int, acc_t: Any) -> np.ndarray:
    """Sums over the adaptive windows of one axis: one ``add.reduceat`` when the windows tile
    the axis (they do when ``size % out == 0``, and often otherwise), else one sum per window."""
    i = np.arange(out)
    start, end = (i * size) // out, -((-(i + 1) * size) // out)
    if np.array_equal(end[:-1], start[1:]):
        return np.add.reduceat(x, start, axis=axis, dtype=acc_t)
    index = [slice(None)] * x.ndim
    parts = []
    for a, b in zip(start, end):
        index[axis] = slice(a, b)
        parts.append(x[tuple(index)].sum(axis=axis, dtype=acc_t))
    return np.stack(parts, axis=axis)


def adaptive_avg_pool2d(problem: Problem, config: Any, x: np.ndarray) -> np.ndarray:
    n, c, h, w = x.shape
    oh, ow = problem.out_shape[2:]
    acc_t = np.dtype(np.float32) if x.dtype == F16 else x.dtype
    if oh == 1 and ow == 1:
        if h * w <= GLOBAL_EINSUM:  # einsum's SIMD sum: 4x NumPy's mean over two axes (4x2048x7x7)
            out = np.einsum("ncij->nc", x, dtype=acc_t).reshape(n, c, 1, 1)
            out /= acc_t.type(h * w)
        else:  # pairwise summation for long planes
            out = x.mean(axis=(2, 3), dtype=acc_t, keepdims=True)
    else:  # separable: the sums over each output row's input rows, then over its columns
        out = _window_sums(_window_sums(x, 2, h, oh, acc_t), 3, w, ow, acc_t)
        i, j = np.arange(oh), np.arange(ow)
        rows = -((-(i + 1) * h) // oh) - (i * h) // oh
        cols = -((-(j + 1) * w) // ow) - (j * w) // ow
        out /= np.outer(rows, cols).astype(acc_t)
    return out.astype(x.dtype, copy=False)


def pool_cost(problem: Problem, config: Any) -> float:
    kh, kw = problem.attrs["kernel_size"]
    n_in, n_out = math.prod(problem.shapes[0]), math.prod(problem.out_shape)
    # the padded copy written and read, and one pass over the outputs per tap
    nbytes = (3 * n_in + (kh * kw + 1) * n_out) * itemsize(problem.dtype)
    return roofline(float(n_out * kh * kw), nbytes, CPU_FLOPS / 4, CPU_BYTES, 1e-5)


def adaptive_cost(problem: Problem, config: Any) -> float:
    n_in, n_out = math.prod(problem.shapes[0]), math.prod(problem.out_shape)
    oh, ow = problem.out_shape[2:]
    return roofline(float(n_in), (2 * n_in + n_out) * itemsize(problem.dtype), CPU_FLOPS / 4, CPU_BYTES,
                    5e-6 * (oh + ow))


def prepare_numba(problem: Problem, config: Any) -> Any:
    """The launcher of ``numpy.<op>.numba`` (max or avg)."""
    nb = jit.loops("_nb_pool")
    n, c, h, w = problem.shapes[0]
    oh, ow = problem.out_shape[2:]
    kh, kw, sh, sw, ph, pw, dh, dw, bh, bw = _geometry(problem)
    is_max = problem.op == "max_pool2d"
    acc_t = np.dtype(np.float32 if problem.dtype == "float16" else problem.dtype)
    if not is_max:
        a = problem.attrs
        div = np.outer(_divisors(h, oh, kh, ph, sh, a["count_include_pad"]),
                       _divisors(w, ow, kw, pw, sw, a["count_include_pad"])).astype(acc_t)
        inv = (1.0 / div.astype(np.float64)).astype(acc_t)  # a product by the divisor's reciprocal

    def launch(x: np.ndarray) -> np.ndarray:
        x3 = x.astype(acc_t, copy=False).reshape(n * c, h, w)
        out = np.empty((n * c, oh, ow), acc_t)
        if is_max:
            jit.call(nb.maxp, x3, out, kh, kw, sh, sw, dh, dw, ph, pw, pw + w + bw)
        else:
            jit.call(nb.avg, x3, out, inv, kh, kw, sh, sw, dh, dw, ph, pw, pw + w + bw)
        return out.reshape(problem.out_shape).astype(problem.dtype, copy=False)

    return jit.first_use(f"numpy.{problem.op}.numba", launch)


def numba_cost(problem: Problem, config: Any) -> float:
    """One read of the input, one write of the output; the taps from cache."""
    kh, kw = problem.attrs["kernel_size"]
    n_in, n_out = math.prod(problem.shapes[0]), math.prod(problem.out_shape)
    return roofline(float(n_out * kh * kw), (n_in + n_out) * itemsize(problem.dtype), CPU_FLOPS, CPU_BYTES * 1.5,
                    8e-6)


def prepare_adaptive_numba(problem: Problem, config: Any) -> Any:
    """The launcher of ``numpy.adaptive_avg_pool2d.numba`` (:mod:`._nb_pool`): the global pool of
    short planes as one vectorized sum per plane, long ones through the float64 blocks of
    ``_nb_reduce.rows``; other sizes one plane per task, the input read once."""
    nb = jit.loops("_nb_pool")
    n, c, h, w = problem.shapes[0]
    oh, ow = problem.out_shape[2:]
    acc_t = np.dtype(np.float32 if problem.dtype == "float16" else problem.dtype)
    i, j = np.arange(oh), np.arange(ow)
    h0, h1 = (i * h) // oh, -((-(i + 1) * h) // oh)
    w0, w1 = (j * w) // ow, -((-(j + 1) * w) // ow)
    glob = oh == 1 and ow == 1
    red = jit.loops("_nb_reduce") if glob and h * w > nb.SHORT else None

    def launch(x: np.ndarray) -> np.ndarray:
        x = x.astype(acc_t, copy=False)
        if glob:
            x2 = x.reshape(n * c, h * w)
            if red is None:
                out = np.empty(n * c, acc_t)
                jit.call(nb.plane_means, x2, out)
            else:  # the mean in float64, rounded once by the loop
                out = np.empty(n * c, acc_t)
                jit.call(red.rows, x2, out, False, float(h * w))
        else:
            out = np.empty((n * c, oh, ow), acc_t)
            jit.call(nb.adaptive, x.reshape(n * c, h, w), out, h0, h1, w0, w1)
        return out.reshape(problem.out_shape).astype(problem.dtype, copy=False)

    return jit.first_use("numpy.adaptive_avg_pool2d.numba", launch)


def adaptive_numba_cost(problem: Problem, config: Any) -> float:
    """One read of the input across the threads."""
    n_in, n_out = math.prod(problem.shapes[0]), math.prod(problem.out_shape)
    return roofline(float(n_in), (n_in + n_out) * itemsize(problem.dtype), CPU_FLOPS, CPU_BYTES * 1.5, 6e-6)


def kernels() -> list[Kernel]:
    out = [
        Kernel("max_pool2d", "numpy.max_pool2d.taps", "cpu", FLOATS, max_pool2d, cost=pool_cost, configs=CONFIGS),
        Kernel("avg_pool2d", "numpy.avg_pool2d.taps", "cpu", FLOATS, avg_pool2d, cost=pool_cost, configs=CONFIGS),
        Kernel("adaptive_avg_pool2d", "numpy.adaptive_avg_pool2d.separable", "cpu", FLOATS, adaptive_avg_pool2d,
               cost=adaptive_cost),
    ]
    if jit.available():
        out += [Kernel(op, f"numpy.{op}.numba", "cpu", FLOATS, prepare=prepare_numba, cost=numba_cost,
                       source=jit.source("_nb_pool"), notes=jit.notes(f"numpy.{op}.numba"))
                for op in ("max_pool2d", "avg_pool2d")]
        out.append(Kernel("adaptive_avg_pool2d", "numpy.adaptive_avg_pool2d.numba", "cpu", FLOATS,
                          prepare=prepare_adaptive_numba, cost=adaptive_numba_cost,
                          source=jit.source("_nb_pool", "_nb_reduce"),
                          notes=jit.notes("numpy.adaptive_avg_pool2d.numba")))
    return out
