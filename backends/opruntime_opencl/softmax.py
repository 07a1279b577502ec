"""softmax / log_softmax on OpenCL devices (``softmax.cl``).

* ``rows``: one row per TPR work-items (several rows per work-group when rows are short), the
  row held in registers when it fits (one read, one write), reductions in local memory, NVIDIA
  warp shuffles or sub-groups. Any axis: a non-last axis is read with stride ``inner``.
* ``columns``: one work-item per row walking down the column with an online max / sum: reads
  coalesce across work-items when the axis is not the last one.

Non-contiguous inputs are gathered into a contiguous copy first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from opruntime.kernels import Kernel, Problem, itemsize

from . import compile as cl_compile
from .compile import BUFFER
from .matmul import TYPES
from .memory import kernel_dtypes

#: The rows kernel's menu: work-items per row and the widest vector; ``config_for`` completes
#: each into a concrete config (rows per work-group, vectors per work-item, reduction).
GPU_ROWS = tuple(dict(TPR=t, VW=4) for t in (256, 128, 512, 1024, 64, 32))  # many work-items per row
CPU_ROWS = (dict(TPR=1, VW=16), dict(TPR=1, VW=8), dict(TPR=4, VW=16))  # a row per work-item, SIMD vectors
ROW_CONFIGS: tuple[dict[str, int], ...] = (*GPU_ROWS, *CPU_ROWS)
COLUMN_CONFIGS: tuple[dict[str, int], ...] = (dict(WG=128, VW=4), dict(WG=64, VW=16), dict(WG=256, VW=1))
MAX_NV = 16  # vectors per work-item held for a one-pass row; longer rows take the re-reading path


def kernels() -> list[Kernel]:
    src, dtypes = cl_compile.source("softmax.cl"), kernel_dtypes()
    out = []
    for op in ("softmax", "log_softmax"):
        out += [
            #      op  name                        kind      dtypes
            Kernel(op, f"opencl.{op}.rows", "opencl", dtypes, prepare=prepare_rows, supports=supports,
                   cost=rows_cost, configs=ROW_CONFIGS, config_for=row_configs, source=src),
            Kernel(op, f"opencl.{op}.columns", "opencl", dtypes, prepare=prepare_columns, supports=supports,
                   cost=columns_cost, configs=COLUMN_CONFIGS, config_for=column_configs, source=src),
        ]
    return out


#: Both kernels' arguments: x, its element offset, y, rows, L, inner.
SIGNATURE = (BUFFER, np.int64, BUFFER, np.int32, np.int32, np.int32)


def _geometry(problem: Problem) -> tuple[int, int, int]:
    """(rows, L, inner) of the (outer, L, inner) view."""
    shape, axis = problem.shapes[0], problem.attrs["axis"]
    inner = math.prod(shape[axis + 1:])
    length = shape[axis]
    return math.prod(shape) // length, length, inner


def _defines(problem: Problem, config: Mapping[str, int]) -> dict[str, Any]:
    t, acc, ext = TYPES[problem.dtype]
    return {"T": t, "ACC": acc, **ext, "LOG": int(problem.op == "log_softmax"), **config}


def prepare_rows(problem: Problem, config: Mapping[str, int]) -> Callable[[Any], Any]:
    """Build ``config`` (a completed one: :func:`complete`) of the rows kernel for ``problem``."""
    dev = problem.device.provider
    rows, length, inner = _geometry(problem)
    tpr, rpw, vw = config["TPR"], config["RPW"], config["VW"]

    def build(cfg: Mapping[str, int]) -> cl_compile.Launch:
        knl = cl_compile.kernel(dev, cl_compile.source("softmax.cl"), _defines(problem, cfg), "softmax_rows",
                                label=f"opencl.{problem.op}.rows")
        return cl_compile.Launch(dev, knl, (tpr, rpw), SIGNATURE, (tpr, -(-rows // rpw) * rpw))

    # a view starting off a vector boundary: scalar loads, the same registers per work-item
    scalar = {**config, "NV": config["NV"] * vw, "VW": 1}
    return _launcher(problem, build(config), vw, lambda: build(scalar), rows, length, inner)


def prepare_columns(problem: Problem, config: Mapping[str, int]) -> Callable[[Any], Any]:
    """Build ``config`` of the columns kernel for ``problem``."""
    dev = problem.device.provider
    rows, length, inner = _geometry(problem)

    def build(vw: int) -> cl_compile.Launch:
        defines = {**_defines(problem, {"VW": vw}), "COLUMNS": 1}
        knl = cl_compile.kernel(dev, cl_compile.source("softmax.cl"), defines, "softmax_columns",
                                label=f"opencl.{problem.op}.columns")
        return cl_compile.Launch(dev, knl, (config["WG"],), SIGNATURE, (rows // vw,))

    vw = config["VW"]
    return _launcher(problem, build(vw), vw, lambda: build(1), rows, length, inner)


def _launcher(problem: Problem, aligned: cl_compile.Launch, vw: int, build_scalar: Callable[[], cl_compile.Launch],
              rows: int, length: int, inner: int) -> Callable[[Any], Any]:
    """``launch(x)``: gather a strided ``x``, allocate the result, enqueue.

    The element offset of ``x`` is not part of the problem (views at any offset share it), so a
    view whose start is off a ``vw`` boundary takes the scalar-load variant. That one is built on
    first need, the only build outside ``prepare``: such views are rare, and building both
    variants up front would double every problem's compile time on PoCL.
    """
    dev = problem.device.provider
    shape, dtype = problem.out_shape, np.dtype(problem.dtype)
    scalar = [aligned if vw == 1 else None]

    def launch(x: Any) -> Any:
        if not x.flags.c_contiguous:
            x = dev.contiguous(x)
        xoff = x.offset // x.dtype.itemsize
        run = aligned
        if xoff % vw:
            run = scalar[0]
            if run is None:
                run = scalar[0] = build_scalar()
        out = dev.empty(shape, dtype)
        run(x.base_data, xoff, out.base_data, rows, length, inner)
        return out

    return launch


# -- configs and costs -------------------------------------------------------------------------
def _pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def complete(problem: Problem, menu: Mapping[str, int]) -> dict[str, int] | None:
    """A menu entry made concrete for ``problem``, or None when it does not fit the device."""
    dev = problem.device.provider
    rows, length, inner = _geometry(problem)
    tpr = menu["TPR"]
    limits = dev.cl_device.max_work_item_sizes
    if tpr > dev.max_wg or tpr > limits[0]:
        return None
    vw = menu["VW"] if inner == 1 and length % menu["VW"] == 0 else 1
    nv = _pow2(-(-length // (tpr * vw)))
    onepass = nv <= MAX_NV
    target = 256 if dev.accelerator else 16
    rpw = max(1, min(target // tpr, _pow2(rows), limits[1], dev.max_wg // tpr))
    red = 0
    if dev.is_nvidia and problem.dtype != "float64":
        red = 1
    elif dev.has_subgroups and rpw == 1:
        red = 2
    acc = 8 if problem.dtype == "float64" else 4
    if 4 * rpw * (tpr + 32) * acc > dev.local_mem - 256:
        return None
    return dict(TPR=tpr, RPW=rpw, VW=vw, NV=nv if onepass else 1, ONEPASS=int(onepass), RED=red)


def row_configs(problem: Problem) -> Sequence[Mapping[str, int]]:
    dev = problem.device.provider
    menu = CPU_ROWS if dev.type == "cpu" else GPU_ROWS
    out = [c for c in (complete(problem, m) for m in menu) if c is not None]
    unique = list({tuple(sorted(c.items())): c for c in out}.values())
    return sorted(unique, key=lambda c: rows_cost(problem, c))


def column_configs(problem: Problem) -> Sequence[Mapping[str, int]]:
    dev = problem.device.provider
    inner = _geometry(problem)[2]
    fit = [{**c, "VW": c["VW"] if inner % c["VW"] == 0 else 1} for c in COLUMN_CONFIGS if c["WG"] <= dev.max_wg]
    unique = list({tuple(sorted(c.items())): c for c in fit}.values())
    return sorted(unique, key=lambda c: columns_cost(problem, c))


def supports(problem: Problem) -> bool:
    return problem.device.provider.dtype_ok(problem.dtype)


def _bytes(problem: Problem) -> float:
    return math.prod(problem.out_shape) * itemsize(problem.dtype)


def rows_cost(problem: Problem, cfg: Mapping[str, int]) -> float:
    dev = problem.device.provider
    rows, length, inner = _geometry(problem)
    if "RPW" not in cfg:
        cfg = complete(problem, cfg) or {**cfg, "RPW": 1, "NV": 1, "ONEPASS": 0, "RED": 0}
    tpr, vw, nv = cfg["TPR"], cfg["VW"], cfg["NV"]
    n = _bytes(problem)
    passes = 2.0 if cfg["ONEPASS"] else 4.0
    if dev.accelerator:  # coalesced only with many work-items per row along a contiguous axis
        access = 8.0 if inner > 1 else (1.0 if tpr >= 32 else 4.0)
        fill = min(8.0, max(1.0, dev.compute_units * 4 / -(-rows // cfg["RPW"])))
        used = length / (tpr * vw * nv) if cfg["ONEPASS"] else 1.0
        shape = (1.0 + 0.3 * (1.0 - used) + 0.05 * abs(math.log2(max(nv, 1) / 4))) * fill
        # every launched work-item costs a slot, busy or idle: ~2 us per device-full wave (H200:
        # 1024 work-items per 1024-element row ran 4x slower than 64 work-items with 4 vectors each)
        slots = -(-rows // cfg["RPW"]) * cfg["RPW"] * tpr
        waves = 2e-6 * slots / (dev.compute_units * 2048)
    else:  # a CPU wants SIMD-wide vectors (exp and max on them) and no barriers
        access = {16: 1.0, 8: 1.3, 4: 2.0, 2: 3.5}.get(vw, 5.0) * (1.0 if tpr == 1 else 1.2 + 0.05 * tpr)
        shape = 1.0 if cfg["ONEPASS"] else 1.2
        passes = 2.0
        waves = 0.0
    copy = 0.0 if problem.contiguous else 2 * n / dev.bandwidth
    return passes * n * access * shape / dev.bandwidth + waves + copy + dev.launch_s


def columns_cost(problem: Problem, cfg: Mapping[str, int]) -> float:
    dev = problem.device.provider
    rows, length, inner = _geometry(problem)
    vw = cfg.get("VW", 1) if inner % cfg.get("VW", 1) == 0 else 1
    n = _bytes(problem)
    if dev.accelerator:
        access = 1.0 if inner * itemsize(problem.dtype) >= 128 else 8.0
        lanes = dev.compute_units * 2048
    else:
        access = {16: 1.0, 8: 1.3, 4: 2.0, 2: 3.5}.get(vw, 5.0)
        lanes = dev.compute_units
    # one pass reads and one reads and writes; few columns leave the device idle
    busy = min(1.0, (rows / vw) / lanes)
    copy = 0.0 if problem.contiguous else 2 * n / dev.bandwidth
    return 3.0 * n * access / (dev.bandwidth * busy) + copy + dev.launch_s
