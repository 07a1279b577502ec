"""layer_norm, rms_norm and batch_norm on the CPU, vectorized over blocks of rows.

A block of rows (about :data:`BLOCK_BYTES` of the computation dtype) is copied into a C-ordered
working buffer (the output itself when no cast is needed), and every pass over it (mean, centre,
variance, scale, weight, bias) runs while it is in cache. float16 is computed in float32;
float32 and float64 in their own precision (the row sums are NumPy's pairwise sums).
batch_norm folds the running variance and the weight into one scale per channel and computes
``y = (x - mean) * scale + bias`` in float64, rounded once to the result's dtype.

With numba (:mod:`.jit`), ``numpy.layer_norm.numba`` and ``numpy.rms_norm.numba`` read the input
once: rows run in parallel, and each row, in cache, takes its statistics (float32: the sum and
sum of squares in float64, one pass; float64: the mean, then the mean square of the centred row,
as the float64 reference computes it) and one output pass ``(x - mean) * rstd * w + b``;
``numpy.batch_norm.numba`` applies the folded scale and shift with one (image, channel) plane
per parallel task (the NumPy kernel runs on one core). float16 is computed in float32.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from opruntime.kernels import FLOATS, Kernel, Problem, itemsize, roofline

from . import buffers, jit
from .matmul import CPU_BYTES, CPU_FLOPS

#: bytes of the computation dtype per block of rows: a working set that stays in L2
BLOCK_BYTES = 256 * 1024
DEFAULT_EPS = {"float16": 2.0 ** -10, "float32": 2.0 ** -23, "float64": 2.0 ** -52}  # rms_norm's eps=None
_quiet = np.errstate(invalid="ignore", divide="ignore", over="ignore")


def _acc(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float32) if dtype == np.float16 else dtype


def _vectors(problem: Problem, vecs: tuple[np.ndarray, ...], acc: np.dtype) -> tuple[Any, Any]:
    """(weight, bias) in the computation dtype, each None when absent."""
    vecs = tuple(v.reshape(-1).astype(acc, copy=False) for v in vecs)
    w = vecs[0] if problem.attrs["weight"] else None
    b = vecs[-1] if problem.attrs["bias"] else None
    return w, b


@_quiet
def _rows(problem: Problem, x: np.ndarray, *vecs: np.ndarray) -> np.ndarray:
    shape = x.shape
    cols = math.prod(shape[len(shape) - problem.attrs["dims"]:])
    rows = x.size // cols
    x = x.reshape(rows, cols)  # a copy only where the view cannot be one
    rms = problem.op == "rms_norm"
    eps = problem.attrs["eps"]
    if eps is None:
        eps = DEFAULT_EPS[problem.dtype]
    acc = _acc(x.dtype)
    w, b = _vectors(problem, vecs, acc)
    out = np.empty((rows, cols), x.dtype)
    step = max(1, BLOCK_BYTES // (cols * acc.itemsize))
    work = None if acc == x.dtype else np.empty((min(step, rows), cols), acc)
    inv_n = acc.type(1.0 / cols)
    for r0 in range(0, rows, step):  # a Python step per block of rows; the work inside is vectorized
        r1 = min(rows, r0 + step)
        t = out[r0:r1] if work is None else work[:r1 - r0]
        t[...] = x[r0:r1]
        if not rms:
            mean = t.sum(axis=1, keepdims=True)
            mean *= inv_n
            t -= mean
        sq = np.square(t)
        ms = sq.sum(axis=1, keepdims=True)
        ms *= inv_n
        ms += acc.type(eps)
        np.sqrt(ms, out=ms)
        np.divide(acc.type(1), ms, out=ms)
        t *= ms
        if w is not None:
            t *= w
        if b is not None:
            t += b
        if work is not None:
            out[r0:r1] = t
    return out.reshape(shape)


def layer_norm(problem: Problem, config: Any, x: np.ndarray, *vecs: np.ndarray) -> np.ndarray:
    return _rows(problem, x, *vecs)


def rms_norm(problem: Problem, config: Any, x: np.ndarray, *vecs: np.ndarray) -> np.ndarray:
    return _rows(problem, x, *vecs)


def _fold(problem: Problem, mean: np.ndarray, var: np.ndarray, vecs: tuple[np.ndarray, ...],
          acc: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """batch_norm's variance and weight as one ``scale`` per channel (made in float64), and the
    bias (zeros when absent), both in ``acc`` (float64): the kernels compute ``(x - mean) * scale +
    bias`` in float64 and round once, since the scaled term and the bias cancel where the output is
    near zero (float32 arithmetic lost up to 1e-4 of relative accuracy on 1x1 problems)."""
    w, b = _vectors(problem, vecs, np.dtype(np.float64))
    scale = 1.0 / np.sqrt(var.astype(np.float64) + problem.attrs["eps"])
    if w is not None:
        scale = scale * w
    shift = np.zeros_like(scale) if b is None else b
    return scale.astype(acc), shift.astype(acc)


@_quiet
def batch_norm(problem: Problem, config: Any, x: np.ndarray, mean: np.ndarray, var: np.ndarray,
               *vecs: np.ndarray) -> np.ndarray:
    shape = x.shape
    n, c = shape[:2]
    s = math.prod(shape[2:])
    x = x.reshape(n, c, s)
    acc = np.dtype(np.float64)  # rounded once at the end: the scaled term and the bias may cancel
    scale, shift = _fold(problem, mean, var, vecs, acc)
    centre = mean.astype(acc)[:, None]
    scale = scale[:, None]
    shift = shift[:, None]
    out = np.empty((n, c, s), x.dtype)
    step = max(1, BLOCK_BYTES // (c * s * acc.itemsize))
    for n0 in range(0, n, step):  # blocks of whole images
        n1 = min(n, n0 + step)
        t = np.subtract(x[n0:n1], centre, dtype=acc)
        t *= scale
        t += shift
        out[n0:n1] = t
    return out.reshape(shape)


def cost(problem: Problem, config: Any) -> float:
    n = math.prod(problem.out_shape)
    return roofline(6.0 * n, 2.0 * n * itemsize(problem.dtype), CPU_FLOPS, CPU_BYTES, 3e-6)


def prepare_numba(problem: Problem, config: Any) -> Any:
    """The launcher of ``numpy.<op>.numba``: the input as (rows, cols) (a view where NumPy can make
    one: numba reads strided rows in place), weight and bias in the computation dtype."""
    nb = jit.loops("_nb_rows")
    shape = problem.shapes[0]
    cols = math.prod(shape[len(shape) - problem.attrs["dims"]:])
    rows = math.prod(shape) // cols
    rms = problem.op == "rms_norm"
    eps = problem.attrs["eps"]
    eps = DEFAULT_EPS[problem.dtype] if eps is None else eps
    acc = _acc(np.dtype(problem.dtype))
    absent = np.zeros(1, acc)
    onepass = acc == np.float32  # layer_norm's statistics in one float64 pass (see _nb_rows.norm_rows)

    @_quiet
    def launch(x: np.ndarray, *vecs: np.ndarray) -> np.ndarray:
        w, b = _vectors(problem, vecs, acc)
        x2 = x.reshape(rows, cols).astype(acc, copy=False)
        out = buffers.empty((rows, cols), acc)
        jit.call(nb.norm_rows, x2, out, absent if w is None else w, absent if b is None else b, w is not None,
                 b is not None, rms, eps, onepass)
        return out.reshape(shape).astype(x.dtype, copy=False)

    return jit.first_use(f"numpy.{problem.op}.numba", launch)


def prepare_batch_norm(problem: Problem, config: Any) -> Any:
    """The launcher of ``numpy.batch_norm.numba``: one parallel pass over the (N, C, spatial)
    planes, each folding its channel's statistics, weight and bias (operands) first."""
    nb = jit.loops("_nb_rows")
    shape = problem.shapes[0]
    n, c = shape[:2]
    s = math.prod(shape[2:])
    acc = _acc(np.dtype(problem.dtype))

    has_w, has_b = bool(problem.attrs["weight"]), bool(problem.attrs["bias"])
    absent = np.zeros(1, np.float64)
    f16 = problem.dtype == "float16"

    @_quiet
    def launch(x: np.ndarray, mean: np.ndarray, var: np.ndarray, *vecs: np.ndarray) -> np.ndarray:
        w = vecs[0] if has_w else absent
        b = vecs[-1] if has_b else absent
        if f16:  # numba takes no float16 arrays
            mean, var, w, b = (v.astype(np.float32) for v in (mean, var, w, b))
        x3 = x.reshape(n, c, s).astype(acc, copy=False)
        out = buffers.empty((n, c, s), acc)
        jit.call(nb.channel_affine, x3, out, mean, var, w, b, has_w, has_b, float(problem.attrs["eps"]))
        return out.reshape(shape).astype(x.dtype, copy=False)

    return jit.first_use("numpy.batch_norm.numba", launch)


def numba_cost(problem: Problem, config: Any) -> float:
    """One read and one write (float16: and the float32 copies), across the threads."""
    n = math.prod(problem.out_shape)
    moved = 2.0 * n * (6 if problem.dtype == "float16" else itemsize(problem.dtype))
    return roofline(6.0 * n, moved, CPU_FLOPS * 4, CPU_BYTES * 1.5, 6e-6)


def kernels() -> list[Kernel]:
    out = [
        Kernel("layer_norm", "numpy.layer_norm.blocked", "cpu", FLOATS, layer_norm, cost=cost),
        Kernel("rms_norm", "numpy.rms_norm.blocked", "cpu", FLOATS, rms_norm, cost=cost),
        Kernel("batch_norm", "numpy.batch_norm.affine", "cpu", FLOATS, batch_norm, cost=cost),
    ]
    if jit.available():
        src = jit.source("_nb_rows")
        out += [Kernel(op, f"numpy.{op}.numba", "cpu", FLOATS, prepare=prepare_numba, cost=numba_cost, source=src,
                          notes=jit.notes(f"numpy.{op}.numba"))
                for op in ("layer_norm", "rms_norm")]
        out.append(Kernel("batch_norm", "numpy.batch_norm.numba", "cpu", FLOATS, prepare=prepare_batch_norm,
                          cost=numba_cost, source=src, notes=jit.notes("numpy.batch_norm.numba")))
    return out
