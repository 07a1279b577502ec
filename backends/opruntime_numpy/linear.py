"""linear on the CPU: BLAS GEMM ``x @ w.T`` written into the output, the bias added and the
activation applied in place (``epilogue.activate``), per block of rows, so that the epilogue runs
over a block while it is still in cache. float16 is computed in float32."""

from __future__ import annotations

from typing import Any

import numpy as np

from opruntime.kernels import FLOATS, Kernel, Problem, itemsize, roofline

from .epilogue import activate
from .matmul import CPU_BYTES, CPU_FLOPS
from .memory import compute_dtype

#: Output bytes per row block the tuner tries (the heuristic takes the first): a block that stays
#: in the L2 cache while its bias and activation are applied; None: the whole output at once.
CONFIGS = ({"block_bytes": 1 << 20}, {"block_bytes": 256 << 10}, {"block_bytes": 4 << 20}, {"block_bytes": None})


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
    with np.errstate(over="ignore", invalid="ignore"):
        for start in range(0, m, rows):  # cache-sized blocks of rows, not single rows
            y = out[start : start + rows]
            np.matmul(x[start : start + rows], wt, out=y)
            if b is not None:
                y += b
            activate(act, y)
    return out.astype(problem.dtype, copy=False)


def cost(problem: Problem, config: Any) -> float:
    m, k = problem.shapes[0]
    n = problem.shapes[1][0]
    nbytes = (m * k + n * k + m * n) * itemsize(problem.dtype)
    epilogue = 0.0 if problem.attrs["activation"] is None else 8.0 * m * n  # erf / tanh / exp per element
    return roofline(2.0 * m * n * k + epilogue, nbytes, CPU_FLOPS, CPU_BYTES, 2e-6)


def kernels() -> list[Kernel]:
    return [Kernel("linear", "numpy.linear.blas", "cpu", FLOATS, run, cost=cost, configs=CONFIGS)]
