"""matmul through BLAS: ``numpy.matmul.blas`` is NumPy's ``matmul``; with numba (:mod:`.jit`),
``numpy.matmul.numba`` cuts the product into tasks (batch items, blocks of rows) that numba's
threads run, each one BLAS call in its thread (:func:`._nb_gemm.matmul_rows`, BLAS held to one
thread). NumPy's ``matmul`` loops over a batch calling a multi-threaded GEMM per item (its
threads woken and synchronized 32 times for 32 x 128 x 128 x 128: 0.83-0.97 ms, the tasks 0.58-0.60
on 2 cores), and its OpenBLAS threads keep spinning after a call, taking a core from the next
kernel's threads (see :mod:`._nb_gemm`)."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import numpy as np

from opruntime.kernels import FLOATS, Kernel, Problem, itemsize, roofline

from . import jit
from .memory import compute_dtype

F16 = np.dtype(np.float16)
CPU_FLOPS, CPU_BYTES = 50e9, 10e9  # rough 2-core figures: the estimate only ranks CPU kernels

#: below this many flops a single product runs in the calling thread (BLAS held to one thread:
#: waking its threads costs more than half of such a product)
SERIAL_FLOPS = 4e6
#: ``numpy.matmul.numba``'s configs: tasks per thread where a batch gives too few (the first is
#: the heuristic's); a task's BLAS call packs the whole of ``b``, so few large ones
NUMBA_CONFIGS = ({"tasks_per_thread": 1}, {"tasks_per_thread": 4})


def run(problem: Problem, config: Any, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype is F16:  # computed in float32
        return np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(np.float16)
    return np.matmul(a, b)


def cost(problem: Problem, config: Any) -> float:
    k = problem.shapes[0][-1]
    flops = 2.0 * math.prod(problem.out_shape) * k
    nbytes = (sum(math.prod(s) for s in problem.shapes) + math.prod(problem.out_shape)) * itemsize(problem.dtype)
    return roofline(flops, nbytes, CPU_FLOPS, CPU_BYTES, 1e-6)


def _batched(problem: Problem) -> bool:
    """Whether ``numpy.matmul.numba`` computes this problem as tasks: each operand's batch is the
    output's or a single item (repeated), the reduction not empty, BLAS holdable to one thread."""
    from . import _blas

    batch = problem.out_shape[:-2]
    return problem.shapes[0][-1] > 0 and _blas.controllable() and all(
        s[:-2] == batch or math.prod(s[:-2]) == 1 for s in problem.shapes)


def _plan(problem: Problem, config: Any) -> tuple[int, int]:
    """(rows per task, tasks): a batch's items whole where there are enough of them for the
    threads, otherwise each item's rows in ``tasks_per_thread`` blocks a thread; a single product
    (no batch) is one task, which BLAS spreads itself (:func:`prepare_numba`)."""
    m = problem.out_shape[-2]
    items = math.prod(problem.out_shape[:-2])
    if items == 1:
        return max(1, m), 1
    want = jit.threads() * (config or NUMBA_CONFIGS[0])["tasks_per_thread"]
    rows = max(1, m) if items >= want else max(1, -(-m * items // want))
    return rows, items * -(-m // rows)


def prepare_numba(problem: Problem, config: Any) -> Any:
    """The launcher of ``numpy.matmul.numba``: :func:`._nb_gemm.matmul_rows` over the tasks of
    :func:`_plan` on numba's threads (one task: in the calling thread); NumPy's ``matmul`` for
    the cases :func:`_batched` leaves out (batch dims that broadcast both ways, k = 0)."""
    from . import _blas

    dt = compute_dtype(problem.dtype)
    sa, out_shape = problem.shapes[0], problem.out_shape
    m, n, k = out_shape[-2], out_shape[-1], sa[-1]
    items = math.prod(out_shape[:-2])
    tasks_path = _batched(problem)
    rows, tasks = _plan(problem, config)
    small = 2.0 * items * m * n * k < SERIAL_FLOPS

    def launch(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a, b = a.astype(dt, copy=False), b.astype(dt, copy=False)
        if not tasks_path or not items * m * n:
            return np.matmul(a, b).astype(problem.dtype, copy=False)
        nbg = jit.loops("_nb_gemm")
        a3 = np.ascontiguousarray(a).reshape(-1, m, k)
        b3 = np.ascontiguousarray(b).reshape(-1, k, n)
        out = np.empty(out_shape, dt)
        args = (a3, b3, out.reshape(items, m, n), rows)
        if tasks == 1:  # one product: scipy's BLAS spreads it (its threads spin briefly: see .jit)
            with _blas.one_thread() if small else contextlib.nullcontext():
                jit.call(nbg.matmul_rows, *args, 0, 1)
        else:
            with _blas.one_thread():
                jit.run_dynamic(nbg.par_matmul, jit.task(nbg.matmul_rows, *args), *args, tasks, tasks)
        return out.astype(problem.dtype, copy=False)

    return jit.first_use("numpy.matmul.numba", launch)


def numba_cost(problem: Problem, config: Any) -> float:
    """BLAS in each thread on its tasks, one pool of threads: a fifth faster than NumPy's per-item
    multi-threaded calls (the batched suite case: 1.4x), more fixed cost (a parallel region)."""
    k = problem.shapes[0][-1]
    flops = 2.0 * math.prod(problem.out_shape) * k
    nbytes = (sum(math.prod(s) for s in problem.shapes) + math.prod(problem.out_shape)) * itemsize(problem.dtype)
    return roofline(flops, nbytes, 1.2 * CPU_FLOPS, CPU_BYTES, 3e-6)


def kernels() -> list[Kernel]:
    out = [Kernel("matmul", "numpy.matmul.blas", "cpu", FLOATS, run, cost=cost)]
    if jit.available():
        out.append(Kernel("matmul", "numpy.matmul.numba", "cpu", FLOATS, prepare=prepare_numba, cost=numba_cost,
                          configs=NUMBA_CONFIGS, source=jit.source("_nb_elementwise", "_nb_conv", "_nb_gemm"),
                          notes=jit.notes("numpy.matmul.numba")))
    return out
