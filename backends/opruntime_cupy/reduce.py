"""sum, mean and amax on CUDA (``reduce.cu``), over the input's ``(outer, n, inner)`` view
(:func:`layout`: one element stride each, read from the problem's strides, no copy):

* ``rows``: the reduced axis with unit stride (reductions along the last axis): a warp per
  output for short rows, a block per output for long ones; 128-bit loads when the rows start on
  16-byte boundaries (scalar loads otherwise, and for a strided reduced axis); a shuffle tree.
* ``columns``: threads across neighbouring outputs (coalesced when they are neighbours in memory:
  a reduction over an outer axis), each walking down its share of the reduced range with four
  loads in flight; the shares meet in shared memory.

Few outputs over a long axis (a full reduction, a column sum of a tall matrix) would leave the
GPU idle: the reduced range is then split over ``splits`` blocks, whose ACC partials a second
kernel (``finish``) combines: two passes, no atomics, deterministic. float16 / bfloat16
accumulate in float32 and float64 in double; the result is rounded once. A layout that does not
collapse (reduced axes apart, kept dims that do not merge) is first gathered into a contiguous
copy with the kept axes first.

``prepare`` plans the run once (compiled functions, grid, the scalar arguments packed in a
``FastLaunch``); a call allocates the output (and the partials) and launches.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from opruntime.kernels import Kernel, Problem, itemsize, reduction_plan

from . import compile as cc
from .memory import empty

DTYPE_CODE = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3}
DTYPES = frozenset(DTYPE_CODE)
OP_CODE = {"sum": 0, "mean": 1, "amax": 2}
SOURCE = "reduce.cu"
LAUNCH_S = 2.5e-6
MAX_SPLITS = 4096
ROW_CONFIGS: tuple[dict[str, Any], ...] = (dict(group="warp", threads=256), dict(group="block", threads=512),
                                           dict(group="block", threads=256), dict(group="block", threads=1024))
COLUMN_CONFIGS: tuple[dict[str, int], ...] = (dict(threads=256), dict(threads=512), dict(threads=1024))
#: fraction of the copy bandwidth each family is expected to reach on its own layouts (estimate)
EFFICIENCY = {"rows": 0.9, "columns": 0.85}


def kernels() -> list[Kernel]:
    src = cc.source(SOURCE)
    out = []
    for op in OP_CODE:
        out += [
            #      op  name                   kind    dtypes  prepare
            Kernel(op, f"cupy.{op}.rows", "cuda", DTYPES, prepare=_preparer("rows"), cost=_cost("rows"),
                   configs=ROW_CONFIGS, config_for=_row_configs, source=src),
            Kernel(op, f"cupy.{op}.columns", "cuda", DTYPES, prepare=_preparer("columns"), cost=_cost("columns"),
                   configs=COLUMN_CONFIGS, source=src),
        ]
    return out


def _vec_ok(problem: Problem, lay: Sequence[int], splits: int, chunk: int) -> bool:
    """Whether every row (chunk) starts a multiple of 16 bytes after the base: 128-bit loads
    (when the base is aligned too, which the launcher checks per call)."""
    outer, n, inner, so, sn, si = lay
    v = 16 // itemsize(problem.dtype)
    return sn == 1 and (outer == 1 or so % v == 0) and (inner == 1 or si % v == 0) and (splits == 1 or chunk % v == 0)


def _coalesced(lay: Sequence[int]) -> bool:
    outer, n, inner, so, sn, si = lay
    return (inner > 1 and si == 1) or (inner == 1 and outer > 1 and so == 1)


def _row_configs(problem: Problem) -> list[Mapping[str, Any]]:
    n = reduction_plan(problem)[0][1]
    if n <= 2048:  # a warp per row: 8 rows in flight per block
        return list(ROW_CONFIGS)
    return [ROW_CONFIGS[1], ROW_CONFIGS[2], ROW_CONFIGS[3], ROW_CONFIGS[0]]


def _row_split(problem: Problem, lay: Sequence[int], config: Mapping[str, Any]) -> tuple[int, int]:
    """(splits, chunk) of the rows kernel: enough (output, chunk) tasks to fill every SM."""
    sms = problem.device.provider.sm_count
    threads = config["threads"]
    group = 32 if config["group"] == "warp" else threads
    outputs, n = lay[0] * lay[2], lay[1]
    target = sms * (2048 // group)  # groups resident at once on the whole GPU
    v = 16 // itemsize(problem.dtype)
    want = min(-(-target // outputs), n // (group * v * 8), MAX_SPLITS)
    if want <= 1:
        return 1, n
    chunk = -(-n // want)
    chunk = -(-chunk // v) * v  # whole 128-bit words from each chunk's start
    return -(-n // chunk), chunk


def _columns_geometry(problem: Problem, lay: Sequence[int], config: Mapping[str, int]) -> tuple[int, int, int, int]:
    """(TX, TY, splits, chunk) of the columns kernel."""
    sms = problem.device.provider.sm_count
    threads = config["threads"]
    outputs, n = lay[0] * lay[2], lay[1]
    tx = 32 if outputs >= 32 else 1 << max(0, (outputs - 1).bit_length())
    ty = threads // tx
    blocks = -(-outputs // tx)
    target = sms * max(1, 2048 // threads)
    want = min(-(-target // blocks), n // (ty * 16), 65535, MAX_SPLITS)
    if want <= 1:
        return tx, ty, 1, n
    chunk = -(-n // want)
    return tx, ty, -(-n // chunk), chunk


def _cost(family: str) -> Callable[[Problem, Mapping[str, Any]], float]:
    def cost(problem: Problem, config: Mapping[str, Any]) -> float:
        lay, perm = reduction_plan(problem)
        nbytes = math.prod(problem.shapes[0]) * itemsize(problem.dtype)
        bw = problem.device.provider.figures()[2]
        eff = EFFICIENCY[family]
        if family == "rows":
            if lay[4] != 1:
                eff /= 8  # a strided reduced axis: a sector per element
            splits, chunk = _row_split(problem, lay, config)
            if lay[4] == 1 and not _vec_ok(problem, lay, splits, chunk):
                eff *= 0.8
        else:
            if not _coalesced(lay):
                eff /= 8
            splits = _columns_geometry(problem, lay, config)[2]
        copy = 2.0 * nbytes / bw if perm is not None else 0.0
        return nbytes / (bw * eff) + copy + LAUNCH_S * (2 if splits > 1 else 1)

    return cost


# -- running -----------------------------------------------------------------------------------------
def _preparer(family: str) -> Callable[[Problem, Mapping[str, Any]], Callable[[Any], Any]]:
    def prepare(problem: Problem, config: Mapping[str, Any]) -> Callable[[Any], Any]:
        return _build(family, problem, config)

    prepare.__name__ = f"prepare_{family}"
    return prepare


def _build(family: str, problem: Problem, config: Mapping[str, Any]) -> Callable[[Any], Any]:
    import cupy

    prov = problem.device.provider
    dev, name = prov.index, f"cupy.{problem.op}.{family}"
    threads = config["threads"]
    defines = {"DTYPE": DTYPE_CODE[problem.dtype], "OP": OP_CODE[problem.op], "THREADS": threads}
    acc_c = ctypes.c_double if problem.dtype == "float64" else ctypes.c_float
    acc_np = np.dtype(np.float64 if problem.dtype == "float64" else np.float32)
    lay, perm = reduction_plan(problem)
    outer, n, inner, so, sn, si = lay
    outputs = outer * inner
    scale = acc_c(1.0 / n)

    def fn(entry: str) -> Any:
        return cc.get_function(SOURCE, entry, defines, dev, kernel=name)

    if family == "rows":
        splits, chunk = _row_split(problem, lay, config)
        group = 32 if config["group"] == "warp" else threads
        tasks = outputs * splits
        grid = (max(1, min(-(-tasks // (threads // group)), prov.sm_count * max(1, 2048 // threads) * 4)),)
        block: tuple[int, ...] = (threads,)
        vec = _vec_ok(problem, lay, splits, chunk)
        entry = f"rows_{config['group']}"
        main = fn(entry + "_vec" if vec else entry)
        scalar = fn(entry) if vec else None
    else:
        tx, ty, splits, chunk = _columns_geometry(problem, lay, config)
        grid, block = (-(-outputs // tx), splits), (tx, ty)
        vec, main, scalar = False, fn("cols"), None
    scalars = [ctypes.c_int64(a) for a in (outer, inner, so, si, n, sn, chunk)] + [ctypes.c_int32(splits), scale]
    fast = cc.FastLaunch(main, grid, block, pointers=2, scalars=scalars)
    slow = cc.FastLaunch(scalar, grid, block, pointers=2, scalars=scalars) if scalar is not None else None
    finish = None
    if splits > 1:
        ftx = 32 if outputs >= 32 else 1 << max(0, (outputs - 1).bit_length())
        finish = cc.FastLaunch(fn("finish"), (-(-outputs // ftx),), (ftx, threads // ftx), pointers=2,
                               scalars=[ctypes.c_int64(outputs), ctypes.c_int64(splits), scale])
    shape, getdev = problem.out_shape, cupy.cuda.runtime.getDevice
    words = {2: np.uint16, 4: np.uint32, 8: np.uint64}[itemsize(problem.dtype)]

    def launch(x: Any) -> Any:
        if getdev() != dev:
            with cupy.cuda.Device(dev):
                return launch(x)
        if perm is not None:  # copied as unsigned words: any dtype, bfloat16 included
            x = cupy.ascontiguousarray(x.view(words).transpose(perm)).view(x.dtype)
        y = empty(shape, x.dtype, name)
        run = slow if vec and x.data.ptr & 15 else fast  # a view's offset: no 128-bit loads
        if finish is None:
            run(x.data.ptr, y.data.ptr)
        else:
            part = empty((splits * outputs,), acc_np, name)
            run(x.data.ptr, part.data.ptr)
            finish(part.data.ptr, y.data.ptr)
        return y

    return launch


def build_variants() -> list[tuple[str, dict]]:
    """(file, defines) CI compiles: every dtype, op and block size the configs use."""
    sizes = sorted({c["threads"] for c in ROW_CONFIGS + COLUMN_CONFIGS})
    return [(SOURCE, {"DTYPE": d, "OP": o, "THREADS": t}) for d in DTYPE_CODE.values() for o in OP_CODE.values()
            for t in sizes]
