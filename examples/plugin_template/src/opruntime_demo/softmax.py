"""softmax and log_softmax on the demo device, and a multi-threaded softmax for ``cpu``.

``demo.softmax.threaded`` runs on the ``cpu`` device, which the NumPy backend provides: a plugin
may add kernels for any device kind. It splits the rows into blocks of about ``block_bytes``
(small enough to stay in the cache between the passes) and hands the blocks to a thread pool;
NumPy releases the GIL inside its loops, so the blocks run on all cores. The selector weighs its
``cost`` against ``numpy.softmax.fused``'s and picks it only where it should be faster: large
inputs. With ``tune = "autotune"`` the block sizes in ``configs`` are timed and the best kept.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from opruntime import Kernel, Problem
from opruntime.kernels import itemsize, roofline

from .matmul import BYTES, DTYPES, FLOPS, LAUNCH
from .memory import DemoArray

BLOCKS = ({"block_bytes": 1 << 20}, {"block_bytes": 256 << 10}, {"block_bytes": 4 << 20})
#: The figures NumPy's own cost model uses for the cpu device, so that the two estimates compare.
CPU_FLOPS, CPU_BYTES = 50e9, 10e9
WORKERS = os.cpu_count() or 1
HANDOFF = 50e-6  # seconds to hand one block to a worker and collect it (measured, roughly)
CACHE = 1 << 20  # bytes of cache per core: a block that fits is read from memory once, not four times
EFFICIENCY = 0.75  # of a perfect speed-up over the workers (measured: memory bandwidth is shared)


def kernels() -> list[Kernel]:
    return [
        #      op             name                        kind    dtypes  run
        Kernel("softmax", "demo.softmax.fused", "demo", DTYPES, _on_demo(_softmax), cost=demo_cost),
        Kernel("log_softmax", "demo.log_softmax.fused", "demo", DTYPES, _on_demo(_log_softmax), cost=demo_cost),
        # one kernel for a device kind this plugin does not provide:
        Kernel("softmax", "demo.softmax.threaded", "cpu", DTYPES, threaded, supports=last_axis_rows,
               cost=threaded_cost, configs=BLOCKS),
    ]


# -- the math, shared -------------------------------------------------------------------------------
def _softmax(x: np.ndarray, axis: int, out: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        np.subtract(x, x.max(axis=axis, keepdims=True), out=out)  # rows of -inf give NaN, as the reference
        np.exp(out, out=out)
        out /= out.sum(axis=axis, keepdims=True)
    return out


def _log_softmax(x: np.ndarray, axis: int, out: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        np.subtract(x, x.max(axis=axis, keepdims=True), out=out)
        out -= np.log(np.exp(out).sum(axis=axis, keepdims=True))
    return out


# -- the demo device ----------------------------------------------------------------------------------
def _on_demo(fn: Callable[[np.ndarray, int, np.ndarray], np.ndarray]) -> Callable[..., DemoArray]:
    def run(problem: Problem, config: Any, x: DemoArray) -> DemoArray:
        return DemoArray(fn(x.buf, problem.attrs["axis"], np.empty(problem.out_shape, problem.dtype)))

    return run


def demo_cost(problem: Problem, config: Any) -> float:
    n = math.prod(problem.out_shape)
    return roofline(5.0 * n, 4.0 * n * itemsize(problem.dtype), FLOPS, BYTES, LAUNCH)


# -- cpu: blocks of rows on a thread pool --------------------------------------------------------------
_pool: ThreadPoolExecutor | None = None


def _workers() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:  # created on the first run, not at import
        _pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="opruntime-demo")
    return _pool


def last_axis_rows(problem: Problem) -> bool:
    """Softmax over the last axis of a C-contiguous array; other problems are left to NumPy."""
    return problem.attrs["axis"] == len(problem.shapes[0]) - 1 and problem.contiguous


def _rows_per_block(problem: Problem, config: Any) -> tuple[int, int]:
    length = problem.shapes[0][-1]
    rows = math.prod(problem.shapes[0]) // length
    per_block = max(1, config["block_bytes"] // (length * itemsize(problem.dtype)))
    return rows, per_block


def threaded(problem: Problem, config: Any, x: np.ndarray) -> np.ndarray:
    rows, per_block = _rows_per_block(problem, config)
    x2 = x.reshape(rows, -1)
    out = np.empty_like(x2)
    starts = range(0, rows, per_block)
    if len(starts) == 1:
        return _softmax(x2, 1, out).reshape(x.shape)

    def block(i: int) -> None:
        _softmax(x2[i : i + per_block], 1, out[i : i + per_block])

    for f in [_workers().submit(block, i) for i in starts]:
        f.result()  # re-raises a worker's exception here
    return out.reshape(x.shape)


def threaded_cost(problem: Problem, config: Any) -> float:
    rows, per_block = _rows_per_block(problem, config)
    blocks = -(-rows // per_block)
    n = math.prod(problem.out_shape)
    if blocks == 1:  # the same work as NumPy's fused kernel: let it win the tie
        return roofline(5.0 * n, 4.0 * n * itemsize(problem.dtype), CPU_FLOPS, CPU_BYTES, 2e-6) + 1e-6
    passes = 2.0 if config["block_bytes"] <= CACHE else 4.0  # in cache: one read and one write
    one_thread = roofline(5.0 * n, passes * n * itemsize(problem.dtype), CPU_FLOPS, CPU_BYTES, 2e-6)
    return one_thread / (EFFICIENCY * min(WORKERS, blocks)) + blocks * HANDOFF
