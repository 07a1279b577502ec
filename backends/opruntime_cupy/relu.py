"""relu on CUDA (``relu.cu``): one read and one write, 128-bit loads and stores when the operand
and the result start on a 16-byte boundary (scalar access otherwise), a grid-stride loop over a
grid of a few waves. A strided operand is made contiguous first."""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable, Mapping
from typing import Any

from opruntime.kernels import Kernel, Problem, itemsize

from . import compile as cc
from .memory import empty

DTYPE_CODE = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3}
SOURCE = "relu.cu"
#: threads per block, and resident blocks per SM the grid is sized to (a grid-stride loop)
CONFIGS: tuple[dict[str, int], ...] = (dict(THREADS=256, WAVES=8), dict(THREADS=512, WAVES=4),
                                       dict(THREADS=128, WAVES=16))
EFFICIENCY = 0.85  # of the copy bandwidth, for the estimate
LAUNCH_S = 2.5e-6


def kernels() -> list[Kernel]:
    return [Kernel("relu", "cupy.relu.vector", "cuda", frozenset(DTYPE_CODE), prepare=prepare, cost=cost,
                   configs=CONFIGS, source=cc.source(SOURCE))]


def prepare(problem: Problem, config: Mapping[str, int]) -> Callable[[Any], Any]:
    """Compile both access widths' launch for ``problem`` and return ``launch(x)``."""
    import cupy

    prov = problem.device.provider
    dev, n, shape, name = prov.index, math.prod(problem.out_shape), problem.out_shape, "cupy.relu.vector"
    threads = config["THREADS"]
    words = -(-n // (16 // itemsize(problem.dtype)))
    grid = max(1, min(-(-words // threads), prov.sm_count * config["WAVES"]))
    launches = [cc.FastLaunch(cc.get_function(SOURCE, "relu", {"DTYPE": DTYPE_CODE[problem.dtype], "VEC": vec},
                                              dev, kernel=name),
                              (grid,), (threads,), pointers=2, scalars=[ctypes.c_int64(n)]) for vec in (0, 1)]
    getdev = cupy.cuda.runtime.getDevice

    def launch(x: Any) -> Any:
        if getdev() != dev:
            with cupy.cuda.Device(dev):
                return launch(x)
        if not x.flags.c_contiguous:
            x = cupy.ascontiguousarray(x)
        y = empty(shape, x.dtype, name)
        launches[not x.data.ptr & 15](x.data.ptr, y.data.ptr)  # y is always aligned
        return y

    return launch


def cost(problem: Problem, config: Mapping[str, int]) -> float:
    nbytes = 2.0 * math.prod(problem.out_shape) * itemsize(problem.dtype)
    copy = 1.0 if problem.contiguous else 2.0
    return copy * nbytes / (problem.device.provider.figures()[2] * EFFICIENCY) + LAUNCH_S


def build_variants() -> list[tuple[str, dict]]:
    """(file, defines) CI compiles: every dtype, both access widths."""
    return [(SOURCE, {"DTYPE": code, "VEC": vec}) for code in DTYPE_CODE.values() for vec in (0, 1)]
