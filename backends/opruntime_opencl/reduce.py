"""sum, mean and amax on OpenCL devices (``reduce.cl``), over the input's ``(outer, n, inner)``
view (:func:`layout`: one element stride each, taken from the problem's strides, no copy):

* ``rows``: a work-group per output (per chunk of it), 4-wide ``vload4`` along a unit-stride
  reduced axis, a tree in local memory: reductions along the last axis;
* ``columns``: a work-item per output walking down its reduced range, neighbouring work-items on
  neighbouring outputs: reductions along an outer axis, coalesced.

Few outputs over a long axis (a full reduction, a column sum of a tall matrix) split the
reduced range over ``splits`` work-groups (work-items), whose float partials a second kernel
combines: two passes, no atomics. float16 accumulates in float32, float64 in double. A layout
that does not collapse (reduced axes apart, kept dims that do not merge) is first gathered into
a contiguous copy with the kept axes first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from opruntime.kernels import Kernel, Problem, itemsize, reduction_plan

from . import compile as cl_compile
from .compile import BUFFER
from .matmul import TYPES
from .memory import kernel_dtypes

SOURCE = "reduce.cl"
OP_CODE = {"sum": 0, "mean": 1, "amax": 2}
ROW_CONFIGS: tuple[dict[str, int], ...] = (dict(WG=256), dict(WG=64), dict(WG=16))
COLUMN_CONFIGS: tuple[dict[str, int], ...] = (dict(WG=128), dict(WG=64))
MAX_SPLITS = 1024


def kernels() -> list[Kernel]:
    src, dtypes = cl_compile.source(SOURCE), kernel_dtypes()
    out = []
    for op in OP_CODE:
        out += [
            #      op  name                      kind      dtypes  prepare
            Kernel(op, f"opencl.{op}.rows", "opencl", dtypes, prepare=_preparer("rows"), supports=supports,
                   cost=_cost("rows"), configs=ROW_CONFIGS, config_for=_configs(ROW_CONFIGS), source=src),
            Kernel(op, f"opencl.{op}.columns", "opencl", dtypes, prepare=_preparer("columns"), supports=supports,
                   cost=_cost("columns"), configs=COLUMN_CONFIGS, config_for=_configs(COLUMN_CONFIGS), source=src),
        ]
    return out


def supports(problem: Problem) -> bool:
    return problem.device.provider.dtype_ok(problem.dtype)


def _coalesced(lay: Sequence[int]) -> bool:
    """Whether neighbouring outputs are neighbours in memory (the columns kernel's case)."""
    outer, n, inner, so, sn, si = lay
    return (inner > 1 and si == 1) or (inner == 1 and outer > 1 and so == 1)


def _splits(problem: Problem, lay: Sequence[int], family: str, wg: int) -> tuple[int, int]:
    """(splits, chunk): how the reduced range is cut when there are too few outputs to fill the device."""
    dev = problem.device.provider
    outer, n, inner = lay[:3]
    outputs = outer * inner
    if family == "rows":
        target, least = dev.compute_units * (8 if dev.accelerator else 2), wg * 16
    else:
        target, least = dev.compute_units * (2048 if dev.accelerator else 16), 64
    want = min(-(-target // outputs), n // least, MAX_SPLITS)
    if want <= 1:
        return 1, n
    chunk = -(-n // want)
    chunk = -(-chunk // 4) * 4  # whole vload4s from each chunk's start
    return -(-n // chunk), chunk


# -- configs and costs -------------------------------------------------------------------------
def _configs(menu: tuple[dict[str, int], ...]) -> Callable[[Problem], Sequence[Mapping[str, int]]]:
    def config_for(problem: Problem) -> Sequence[Mapping[str, int]]:
        dev = problem.device.provider
        fit = [c for c in menu if c["WG"] <= dev.max_wg]
        # a CPU runs a work-group's items in one thread: small groups spread rows over the cores
        return sorted(fit, key=lambda c: c["WG"] if dev.type == "cpu" else -c["WG"])

    return config_for


def _cost(family: str) -> Callable[[Problem, Mapping[str, int]], float]:
    def cost(problem: Problem, config: Mapping[str, int]) -> float:
        dev = problem.device.provider
        lay, perm = reduction_plan(problem)
        nbytes = math.prod(problem.shapes[0]) * itemsize(problem.dtype)
        if family == "rows":
            access = 1.0 if lay[4] == 1 else (8.0 if dev.accelerator else 2.0)
        else:
            access = 1.0 if _coalesced(lay) else (16.0 if dev.accelerator else 3.0)
            if not dev.accelerator and lay[4] == 1:
                access *= 2.0  # a CPU work-item walking a contiguous row gets no SIMD
        splits = _splits(problem, lay, family, config.get("WG", 64))[0]
        copy = 2.0 * nbytes / dev.bandwidth if perm is not None else 0.0
        return nbytes * access / dev.bandwidth + copy + dev.launch_s * (2 if splits > 1 else 1)

    return cost


# -- running ----------------------------------------------------------------------------------------
#: reduce_rows / reduce_cols: x, its element offset, y, part, outer, inner, so, si, n, sn, chunk, splits,
#: scale (the ACC type: appended per dtype)
SIGNATURE = (BUFFER, np.int64, BUFFER, BUFFER) + (np.int64,) * 7 + (np.int32,)
#: reduce_finish: part, y, outputs, splits, scale
FINISH = (BUFFER, BUFFER, np.int64, np.int32)


def _preparer(family: str) -> Callable[[Problem, Mapping[str, int]], Callable[[Any], Any]]:
    def prepare(problem: Problem, config: Mapping[str, int]) -> Callable[[Any], Any]:
        return _build(family, problem, config)

    prepare.__name__ = f"prepare_{family}"
    return prepare


def _build(family: str, problem: Problem, config: Mapping[str, int]) -> Callable[[Any], Any]:
    dev = problem.device.provider
    t, acc, ext = TYPES[problem.dtype]
    acc_dtype = np.dtype(np.float64 if acc == "double" else np.float32)
    wg = config["WG"]
    defines = {"T": t, "ACC": acc, **ext, "OP": OP_CODE[problem.op], "WG": wg}
    label = f"opencl.{problem.op}.{family}"
    text = cl_compile.source(SOURCE)
    lay, perm = reduction_plan(problem)
    outer, n, inner, so, sn, si = lay
    outputs = outer * inner
    splits, chunk = _splits(problem, lay, family, wg)
    scale = acc_dtype.type(1.0 / n)
    entry = "reduce_rows" if family == "rows" else "reduce_cols"
    knl = cl_compile.kernel(dev, text, defines, entry, label=label)
    if family == "rows":
        run = cl_compile.Launch(dev, knl, (wg,), SIGNATURE + (acc_dtype,), (outputs * splits * wg,))
    else:
        run = cl_compile.Launch(dev, knl, (wg, 1), SIGNATURE + (acc_dtype,), (outputs, splits))
    finish = None
    if splits > 1:
        finish = cl_compile.Launch(dev, cl_compile.kernel(dev, text, defines, "reduce_finish", label=label),
                                   (min(64, dev.max_wg),), FINISH + (acc_dtype,), (outputs,))
    shape, dtype = problem.out_shape, np.dtype(problem.dtype)
    args = (np.int64(outer), np.int64(inner), np.int64(so), np.int64(si), np.int64(n), np.int64(sn),
            np.int64(chunk), np.int32(splits), scale)

    def launch(x: Any) -> Any:
        if perm is not None:  # reduced axes apart: the kept axes first, gathered contiguous
            x = dev.contiguous(x.transpose(perm))
        out = dev.empty(shape, dtype)
        if finish is None:
            run(x.base_data, np.int64(x.offset // x.dtype.itemsize), out.base_data, out.base_data, *args)
        else:
            part = dev.empty((splits * outputs,), acc_dtype)
            run(x.base_data, np.int64(x.offset // x.dtype.itemsize), out.base_data, part.base_data, *args)
            finish(part.base_data, out.base_data, np.int64(outputs), np.int32(splits), scale)
        return out

    return launch
