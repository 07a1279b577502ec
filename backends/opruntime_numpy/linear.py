"""linear on the CPU: BLAS GEMM ``x @ w.T`` written into the output, the bias added and the
activation applied in place (``epilogue.activate``), per block of rows, so that the epilogue runs
over a block while it is still in cache. float16 is computed in float32.

With numba (:mod:`.jit`), ``numpy.linear.numba`` runs the GEMM in blocks of rows on numba's
threads, each block one BLAS call in its thread followed by the bias and activation over the
block while it is in cache, with the vectorized exp / erf of :mod:`._nb_math`
(:func:`._nb_gemm.linear_rows`; NumPy's activations call libm per element).

Both compute a product of few rows (a classifier's batch of features) as ``(w @ x.T).T``
(:func:`skinny`), split over two threads when the weights are large."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import numpy as np

from opruntime.kernels import FLOATS, Kernel, Problem, itemsize, roofline

from . import jit
from .epilogue import activate
from .matmul import CPU_BYTES, CPU_FLOPS
from .memory import compute_dtype

#: Output bytes per row block the tuner tries (the heuristic takes the first): a block that stays
#: in the L2 cache while its bias and activation are applied; None: the whole output at once.
CONFIGS = ({"block_bytes": 1 << 20}, {"block_bytes": 256 << 10}, {"block_bytes": 4 << 20}, {"block_bytes": None})


#: below this many flops the GEMM runs in the calling thread (about 0.2 ms there): BLAS threads
#: woken for it would keep spinning for ~0.1 s after it (see :mod:`._blas`), on 2 cores taking a
#: core from the next kernel (the fc layer of ResNet-50 slowed the next forward's first layers)
ONE_THREAD_FLOPS = 32e6


def _threads(problem: Problem) -> Any:
    """The BLAS threads' context for this problem's GEMM: one thread for small products."""
    m, k = problem.shapes[0]
    if 2.0 * m * k * problem.shapes[1][0] < ONE_THREAD_FLOPS:
        from . import _blas

        return _blas.one_thread()
    return contextlib.nullcontext()


#: rows of x up to which a product in the one-thread range (:data:`ONE_THREAD_FLOPS`) runs as
#: ``w @ x.T`` into an (n, m) buffer, transposed into the output after (:func:`skinny`)
SKINNY_ROWS = 32
#: weight bytes from which :func:`skinny` splits the product over two threads (BLAS held to one
#: thread in each): the product then streams the weights, and two cores read them faster
SPLIT_WEIGHT_BYTES = 4 << 20


def is_skinny(problem: Problem) -> bool:
    """Whether :func:`skinny` computes this problem's GEMM: few rows, in the one-thread range."""
    m, k = problem.shapes[0]
    return 0 < m <= SKINNY_ROWS and 2.0 * m * k * problem.shapes[1][0] < ONE_THREAD_FLOPS


def skinny(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """``out = x @ w.T`` for few rows of x (:data:`SKINNY_ROWS`) as ``(w @ x.T).T``: OpenBLAS runs
    the product with the small dimension as N twice as fast as with it as M (ResNet-50's fc,
    4 x 2048 @ 2048 x 1000, one thread: 0.58 ms against 1.07; ``out=out.T`` gets the slow one
    back, so the (n, m) result is a buffer, transposed after: m * n values). Weights of
    :data:`SPLIT_WEIGHT_BYTES` or more are split in two halves of rows, one per thread, BLAS held
    to one thread in each (no BLAS threads left spinning): 0.43 ms for the fc (torch: 0.31)."""
    from . import _blas
    from .conv import _threads

    n = w.shape[0]
    tmp = np.empty((n, x.shape[0]), out.dtype)
    xt = x.T

    def part(lo: int, hi: int) -> None:
        np.matmul(w[lo:hi], xt, out=tmp[lo:hi])

    with _blas.one_thread():
        if w.nbytes >= SPLIT_WEIGHT_BYTES and n >= 2 and (os.cpu_count() or 1) > 1:
            half = n // 2
            other = _threads().submit(part, half, n)
            part(0, half)
            other.result()
        else:
            part(0, n)
    out[...] = tmp.T


def extras(problem: Problem, rest: tuple[Any, ...]) -> tuple[Any, Any]:
    """(bias, residual) of a linear call from the operands after ``x, w`` (each None when absent)."""
    a = problem.attrs
    return (rest[0] if a["bias"] else None), (rest[-1] if a["residual"] else None)


def run(problem: Problem, config: Any, x: np.ndarray, w: np.ndarray, *rest: np.ndarray) -> np.ndarray:
    dt = compute_dtype(problem.dtype)
    x, w = x.astype(dt, copy=False), w.astype(dt, copy=False)
    bias, res = extras(problem, rest)
    b = None if bias is None else bias.astype(dt, copy=False)
    act = problem.attrs["activation"]
    m, n = problem.out_shape
    out = np.empty((m, n), dt)
    budget = config.get("block_bytes") if config else None
    rows = m if budget is None else max(1, min(m, budget // max(1, n * dt.itemsize)))
    wt = w.T
    if is_skinny(problem):  # one block: the GEMM, then the epilogue
        skinny(x, w, out)
        with np.errstate(over="ignore", invalid="ignore"):
            if b is not None:
                out += b
            if res is not None:
                out += res
            activate(act, out)
        return out.astype(problem.dtype, copy=False)
    with np.errstate(over="ignore", invalid="ignore"), _threads(problem):
        for start in range(0, m, rows):  # cache-sized blocks of rows, not single rows
            y = out[start : start + rows]
            np.matmul(x[start : start + rows], wt, out=y)
            if b is not None:
                y += b
            if res is not None:
                y += res[start : start + rows]
            activate(act, y)
    return out.astype(problem.dtype, copy=False)


def _epilogue_s(problem: Problem) -> float:
    """NumPy's bias and activation passes: ufuncs, libm per element for the activations."""
    from .elementwise import NUMPY_RATE

    m, n = problem.out_shape
    act = problem.attrs["activation"]
    passes = (problem.attrs["bias"] + (act is not None)) * 2.0 * m * n * itemsize(problem.dtype) / CPU_BYTES
    return passes + (0.0 if act is None else m * n / NUMPY_RATE.get(act, 1e9))


def cost(problem: Problem, config: Any) -> float:
    m, k = problem.shapes[0]
    n = problem.shapes[1][0]
    nbytes = (m * k + n * k + m * n) * itemsize(problem.dtype)
    return roofline(2.0 * m * n * k, nbytes, CPU_FLOPS, CPU_BYTES, 2e-6) + _epilogue_s(problem)


#: ``numpy.linear.numba``'s configs: tasks (blocks of rows, each one BLAS call and its epilogue)
#: per thread; the first is the heuristic's. Few large tasks: each BLAS call packs the whole
#: weight matrix (1024^3 with gelu in 2 tasks 5.7 ms, 8 tasks 6.9)
NUMBA_CONFIGS = ({"tasks_per_thread": 1}, {"tasks_per_thread": 4})


def _split_groups(problem: Problem) -> int:
    """Parts (8, 4 or 2, dividing the output features) in which ``numpy.linear.numba`` splits a
    :func:`is_skinny` product with large weights over numba's threads; 0: not split."""
    n, k = problem.shapes[1]
    if jit.threads() < 2 or n * k * itemsize(compute_dtype(problem.dtype)) < SPLIT_WEIGHT_BYTES:
        return 0
    return next((g for g in (8, 4, 2) if n % g == 0), 0)


def _rows_on_numba(x: np.ndarray, w: np.ndarray, b: np.ndarray, code: int, groups: int) -> np.ndarray:
    """``activation(x @ w.T + b)`` for few rows of x, as ``(w @ x.T).T`` (see :func:`skinny`) on
    numba's threads: the 1x1 conv loop (:func:`._nb_conv.pointwise_gemm`, already compiled for
    the convolutions) run as a grouped 1x1 conv of one image, ``groups`` groups, each group a
    block of ``n / groups`` rows of ``w`` applied to its own copy of ``x.T`` (``groups`` x k x m
    values, a few hundred KB at most), BLAS held to one thread, bias and ReLU fused. numba's
    threads, not a Python pool: after the convolutions they are the ones spinning on the cores
    (ResNet-50's fc inside the model: 1.79 ms with one BLAS thread, 1.56 split over a Python pool)."""
    from . import _blas
    from .conv import run_tasks

    nbc = jit.loops("_nb_conv")
    fused = code if code in nbc.FUSED else 0
    m, k = x.shape
    n = w.shape[0]
    xs = np.empty((1, groups * k, m), x.dtype)
    xs.reshape(groups, k, m)[...] = x.T
    tmp = np.empty((1, n, m), x.dtype)
    with _blas.one_thread():
        run_tasks(nbc, nbc.par_pointwise, nbc.pointwise_gemm,
                  (xs, np.ascontiguousarray(w).reshape(-1), b, tmp, groups, m, fused), groups, groups)
    out = np.ascontiguousarray(tmp.reshape(n, m).T)
    if code != fused:
        jit.call(jit.loops("_nb_elementwise").bias_act_rows, out, b[:0], code)
    return out


def _gemm_tasks(problem: Problem, config: Any) -> tuple[int, int]:
    """(rows per task, tasks) of ``numpy.linear.numba``'s GEMM: ``tasks_per_thread`` (config)
    blocks of rows a thread, one task (run in the calling thread) for products in the one-thread
    range (:data:`ONE_THREAD_FLOPS`) or where BLAS cannot be held to one thread."""
    from . import _blas

    m, k = problem.shapes[0]
    n = problem.shapes[1][0]
    per = (config or NUMBA_CONFIGS[0])["tasks_per_thread"]
    if 2.0 * m * n * k < ONE_THREAD_FLOPS or not _blas.controllable() or jit.threads() < 2:
        return max(1, m), 1
    rows = max(1, -(-m // (jit.threads() * per)))
    return rows, -(-m // rows)


def prepare_numba(problem: Problem, config: Any) -> Any:
    """The launcher of ``numpy.linear.numba``: blocks of rows on numba's threads, each one BLAS
    call in its thread (BLAS held to one thread) followed by the bias and activation over the
    block while it is in cache (:func:`._nb_gemm.linear_rows`): one pool of threads for the GEMM
    and its epilogue (BLAS's own threads and numba's, taking turns on the cores, slowed each
    other: see :mod:`._nb_gemm`). A few rows with large weights: :func:`skinny` /
    :func:`_rows_on_numba`."""
    from . import _blas

    nb = jit.loops("_nb_elementwise")
    code = nb.CODES[problem.attrs["activation"]]
    dt = compute_dtype(problem.dtype)
    m, n = problem.out_shape
    few_rows = is_skinny(problem)
    groups = _split_groups(problem) if few_rows else 0
    rows, tasks = _gemm_tasks(problem, config)
    no_res = np.empty((0, n), dt)

    @np.errstate(over="ignore", invalid="ignore")
    def launch(x: np.ndarray, w: np.ndarray, *rest: np.ndarray) -> np.ndarray:
        x, w = x.astype(dt, copy=False), w.astype(dt, copy=False)
        bias, res = extras(problem, rest)
        b = np.zeros(0, dt) if bias is None else np.ascontiguousarray(bias, dt)
        if groups and res is None:
            return _rows_on_numba(x, w, b, code, groups).astype(problem.dtype, copy=False)
        if groups or few_rows:  # the residual added after the product, before the activation
            if groups:
                out = _rows_on_numba(x, w, b, 0, groups)
                b = b[:0]
            else:
                out = np.empty((m, n), dt)
                skinny(x, w, out)
            if res is not None:
                out += res
            if code or b.size:
                jit.call(nb.bias_act_rows, out, b, code)
            return out.astype(problem.dtype, copy=False)
        nbg = jit.loops("_nb_gemm")
        out = np.empty((m, n), dt)
        if not out.size:
            return out.astype(problem.dtype, copy=False)
        x = np.ascontiguousarray(x)
        w_kn = not w.flags.c_contiguous and w.T.flags.c_contiguous  # a transposed view: its base
        w = w.T if w_kn else np.ascontiguousarray(w)
        r = no_res if res is None else np.ascontiguousarray(res, dt)
        args = (x, w, w_kn, b, r, out, rows, code)
        with _blas.one_thread():
            if tasks == 1:
                jit.call(nbg.linear_rows, *args, 0, 1)
            else:
                jit.run_dynamic(nbg.par_linear, jit.task(nbg.linear_rows, *args), *args, tasks, tasks)
        return out.astype(problem.dtype, copy=False)

    return jit.first_use("numpy.linear.numba", launch)


def numba_cost(problem: Problem, config: Any) -> float:
    """The GEMM, and one vectorized parallel pass for the bias and activation (if any). Split
    over the threads (:func:`_split_groups`), the weights stream at both cores' rate, the bias and
    ReLU in the GEMM's loop: ResNet-50's fc measured 0.43 ms alone, 0.89 inside the model (the
    NumPy path: 0.49 and 1.56)."""
    m, k = problem.shapes[0]
    n = problem.shapes[1][0]
    nbytes = (m * k + n * k + m * n) * itemsize(problem.dtype)
    if is_skinny(problem) and _split_groups(problem):
        return roofline(2.0 * m * n * k, nbytes, CPU_FLOPS, 2 * CPU_BYTES, 1e-5)
    fused = problem.attrs["bias"] or problem.attrs["activation"] is not None
    epilogue = 2.0 * m * n * itemsize(problem.dtype) / (CPU_BYTES * 1.5) + 6e-6 if fused else 0.0
    return roofline(2.0 * m * n * k, nbytes, CPU_FLOPS, CPU_BYTES, 4e-6) + epilogue


def kernels() -> list[Kernel]:
    out = [Kernel("linear", "numpy.linear.blas", "cpu", FLOATS, run, cost=cost, configs=CONFIGS)]
    if jit.available():
        out.append(Kernel("linear", "numpy.linear.numba", "cpu", FLOATS, prepare=prepare_numba, cost=numba_cost,
                          configs=NUMBA_CONFIGS, source=jit.source("_nb_elementwise", "_nb_conv", "_nb_gemm"),
                          notes=jit.notes("numpy.linear.numba")))
    return out
