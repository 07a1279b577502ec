"""linear on the CPU: BLAS GEMM ``x @ w.T`` written into the output, the bias added and the
activation applied in place (``epilogue.activate``), per block of rows, so that the epilogue runs
over a block while it is still in cache. float16 is computed in float32.

With numba (:mod:`.jit`), ``numpy.linear.numba`` is the same GEMM (one call: BLAS spreads it over
the cores) followed by one parallel pass of bias and activation with the vectorized exp / erfc
of :mod:`._nb_math` (NumPy's activations call libm per element: gelu's erfc costs more than a
1024-wide GEMM's share of the work)."""

from __future__ import annotations

import contextlib
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


def run(problem: Problem, config: Any, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    dt = compute_dtype(problem.dtype)
    x, w = x.astype(dt, copy=False), w.astype(dt, copy=False)
    b = None if bias is None else bias.astype(dt, copy=False)
    act = problem.attrs["activation"]
    m, n = problem.out_shape
    out = np.empty((m, n), dt)
    budget = config.get("block_bytes") if config else None
    rows = m if budget is None else max(1, min(m, budget // max(1, n * dt.itemsize)))
    wt = w.T
    with np.errstate(over="ignore", invalid="ignore"), _threads(problem):
        for start in range(0, m, rows):  # cache-sized blocks of rows, not single rows
            y = out[start : start + rows]
            np.matmul(x[start : start + rows], wt, out=y)
            if b is not None:
                y += b
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


#: from this many multiply-adds, the numba kernel's bias goes in through the GEMM's beta
#: (scipy's BLAS, C = bias rows): measured 4 % off an 8192 x 768 x 2304 linear (about the bias pass)
BETA_GEMM_FLOPS = 1 << 24


def prepare_numba(problem: Problem, config: Any) -> Any:
    """The launcher of ``numpy.linear.numba``: one GEMM into the output (for large problems with
    a bias, the output filled with the bias rows and the GEMM accumulating into it), then the
    activation (and the bias, otherwise) in one parallel pass."""
    nb = jit.loops("_nb_elementwise")
    code = nb.CODES[problem.attrs["activation"]]
    dt = compute_dtype(problem.dtype)
    m, n = problem.out_shape

    k = problem.shapes[0][1]
    gemm = None
    if problem.attrs["bias"] and m * n * k >= BETA_GEMM_FLOPS:
        from scipy.linalg import blas

        gemm = blas.dgemm if dt == np.float64 else blas.sgemm

    @np.errstate(over="ignore", invalid="ignore")
    def launch(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        x, w = x.astype(dt, copy=False), w.astype(dt, copy=False)
        b = np.zeros(0, dt) if bias is None else np.ascontiguousarray(bias, dt)
        if gemm is not None and m and n:
            # the bias rows first, then C = x @ w.T + C (beta 1): the GEMM reads C as it writes
            # it, where a separate pass would read and write the whole output again. In Fortran
            # order out.T (n, m) = w (n, k) @ x.T (k, m): no copy of any C-contiguous operand.
            out = np.empty((m, n), dt)
            out[...] = b
            out = gemm(1.0, w.T, x.T, beta=1.0, c=out.T, trans_a=1, overwrite_c=1).T
            if code:
                jit.call(nb.bias_act_rows, out, b[:0], code)
            return out.astype(problem.dtype, copy=False)
        with _threads(problem):
            out = np.matmul(x, w.T, out=np.empty((m, n), dt))
        if code or b.size:
            jit.call(nb.bias_act_rows, out, b, code)
        return out.astype(problem.dtype, copy=False)

    return jit.first_use("numpy.linear.numba", launch)


def numba_cost(problem: Problem, config: Any) -> float:
    """The GEMM, and one vectorized parallel pass for the bias and activation (if any)."""
    m, k = problem.shapes[0]
    n = problem.shapes[1][0]
    nbytes = (m * k + n * k + m * n) * itemsize(problem.dtype)
    fused = problem.attrs["bias"] or problem.attrs["activation"] is not None
    epilogue = 2.0 * m * n * itemsize(problem.dtype) / (CPU_BYTES * 1.5) + 6e-6 if fused else 0.0
    return roofline(2.0 * m * n * k, nbytes, CPU_FLOPS, CPU_BYTES, 4e-6) + epilogue


def kernels() -> list[Kernel]:
    out = [Kernel("linear", "numpy.linear.blas", "cpu", FLOATS, run, cost=cost, configs=CONFIGS)]
    if jit.available():
        out.append(Kernel("linear", "numpy.linear.numba", "cpu", FLOATS, prepare=prepare_numba, cost=numba_cost,
                          source=jit.source("_nb_elementwise"), notes=jit.notes("numpy.linear.numba")))
    return out
