"""layer_norm, rms_norm and batch_norm on OpenCL devices (``norm.cl``).

* ``rows`` (layer_norm, rms_norm): a work-group per row; the row's sum and then its centred sum
  of squares (an exact two-pass variance; the second pass reads the row from cache) reduced in
  local memory, then one pass that writes.
* ``elementwise`` (batch_norm): one work-item per element over (S, N * C), the channel's scale
  ``weight / sqrt(var + eps)`` computed from its vectors.

Which of weight and bias are present is a kernel argument (an absent one is passed as ``x``'s
buffer and never read), so one program per dtype and work-group size serves every call.
Non-contiguous operands are gathered into a contiguous copy first.
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

ROW_CONFIGS: tuple[dict[str, int], ...] = (dict(WG=256), dict(WG=64), dict(WG=16), dict(WG=1024))
BATCH_CONFIGS: tuple[dict[str, int], ...] = (dict(WG=256), dict(WG=64), dict(WG=16), dict(WG=1))
DEFAULT_EPS = {"float16": 2.0 ** -10, "float32": 2.0 ** -23, "float64": 2.0 ** -52}  # rms_norm's eps=None


def kernels() -> list[Kernel]:
    src, dtypes = cl_compile.source("norm.cl"), kernel_dtypes()
    return [
        #      op           name                              kind      dtypes
        Kernel("layer_norm", "opencl.layer_norm.rows", "opencl", dtypes, prepare=prepare_rows, supports=supports,
               cost=rows_cost, configs=ROW_CONFIGS, config_for=row_configs, source=src),
        Kernel("rms_norm", "opencl.rms_norm.rows", "opencl", dtypes, prepare=prepare_rows, supports=supports,
               cost=rows_cost, configs=ROW_CONFIGS, config_for=row_configs, source=src),
        Kernel("batch_norm", "opencl.batch_norm.elementwise", "opencl", dtypes, prepare=prepare_batch,
               supports=supports, cost=batch_cost, configs=BATCH_CONFIGS, config_for=batch_configs, source=src),
    ]


def supports(problem: Problem) -> bool:
    return problem.device.provider.dtype_ok(problem.dtype)


def _scalar(problem: Problem) -> Any:
    """The NumPy type of the ``ACC`` kernel arguments."""
    return np.float64 if problem.dtype == "float64" else np.float32


def _operand(dev: Any, a: Any) -> tuple[Any, np.int64]:
    """(buffer, element offset) of ``a``, gathered first when strided."""
    if not a.flags.c_contiguous:
        a = dev.contiguous(a)
    return a.base_data, np.int64(a.offset // a.dtype.itemsize)


# -- layer_norm / rms_norm ------------------------------------------------------------------------------
#: x, offset, w, offset, b, offset, y, cols, has_w, has_b, eps (the last: ACC, set per dtype)
ROW_SIGNATURE = (BUFFER, np.int64, BUFFER, np.int64, BUFFER, np.int64, BUFFER, np.int32, np.int32, np.int32)


def rows_cols(problem: Problem) -> tuple[int, int]:
    """(rows, cols): the normalized trailing dims of x are a row."""
    shape = problem.shapes[0]
    cols = math.prod(shape[len(shape) - problem.attrs["dims"]:])
    return math.prod(shape) // cols, cols


def prepare_rows(problem: Problem, config: Mapping[str, int]) -> Callable[..., Any]:
    dev = problem.device.provider
    rows, cols = rows_cols(problem)
    t, acc, ext = TYPES[problem.dtype]
    defines = {"T": t, "ACC": acc, **ext, "WG": config["WG"], "RMS": int(problem.op == "rms_norm")}
    knl = cl_compile.kernel(dev, cl_compile.source("norm.cl"), defines, "norm_rows", label=f"opencl.{problem.op}.rows")
    scalar = _scalar(problem)
    run = cl_compile.Launch(dev, knl, (config["WG"],), (*ROW_SIGNATURE, scalar), (rows * config["WG"],))
    eps = problem.attrs["eps"]
    eps = scalar(DEFAULT_EPS[problem.dtype] if eps is None else eps)
    has_w, has_b = problem.attrs["weight"], problem.attrs["bias"]
    shape, dtype = problem.out_shape, np.dtype(problem.dtype)
    flags = (np.int32(cols), np.int32(has_w), np.int32(has_b), eps)

    def launch(x: Any, *vecs: Any) -> Any:
        xb, xo = _operand(dev, x)
        wb, wo = _operand(dev, vecs[0]) if has_w else (xb, np.int64(0))
        bb, bo = _operand(dev, vecs[-1]) if has_b else (xb, np.int64(0))
        out = dev.empty(shape, dtype)
        run(xb, xo, wb, wo, bb, bo, out.base_data, *flags)
        return out

    return launch


def row_configs(problem: Problem) -> Sequence[Mapping[str, int]]:
    dev = problem.device.provider
    fit = [c for c in ROW_CONFIGS if c["WG"] <= min(dev.max_wg, dev.cl_device.max_work_item_sizes[0])]
    return sorted(fit, key=lambda c: rows_cost(problem, c))


def rows_cost(problem: Problem, config: Mapping[str, int]) -> float:
    dev = problem.device.provider
    rows, cols = rows_cols(problem)
    n = rows * cols * itemsize(problem.dtype)
    wg = config["WG"]
    # idle work-items when the row is shorter than the work-group; barriers per reduction step
    idle = max(1.0, wg / max(cols, 1))
    steps = 2 * math.log2(wg) * rows * (1e-9 if dev.accelerator else 2e-8)
    serial = 1.0 if dev.accelerator else 1.0 + 0.02 * math.log2(wg)
    copy = 0.0 if problem.contiguous else 2 * n / dev.bandwidth
    return 3.0 * n * idle * serial / dev.bandwidth + steps + copy + dev.launch_s


# -- batch_norm ----------------------------------------------------------------------------------------
#: x, mean, var, w, b (each with its offset), y, channels, spatial, has_w, has_b, eps
BATCH_SIGNATURE = (BUFFER, np.int64, BUFFER, np.int64, BUFFER, np.int64, BUFFER, np.int64, BUFFER, np.int64, BUFFER,
                   np.int32, np.int64, np.int32, np.int32)


def _ncs(problem: Problem) -> tuple[int, int, int]:
    """(N, C, S): S the product of the spatial dims (1 when there are none)."""
    shape = problem.shapes[0]
    return shape[0], shape[1], math.prod(shape[2:])


def prepare_batch(problem: Problem, config: Mapping[str, int]) -> Callable[..., Any]:
    dev = problem.device.provider
    n, c, s = _ncs(problem)
    t, acc, ext = TYPES[problem.dtype]
    wg = config["WG"]
    knl = cl_compile.kernel(dev, cl_compile.source("norm.cl"), {"T": t, "ACC": acc, **ext, "BATCH": 1},
                            "batch_norm", label="opencl.batch_norm.elementwise")
    scalar = _scalar(problem)
    run = cl_compile.Launch(dev, knl, (wg, 1), (*BATCH_SIGNATURE, scalar), (s, n * c))
    has_w, has_b = problem.attrs["weight"], problem.attrs["bias"]
    shape, dtype = problem.out_shape, np.dtype(problem.dtype)
    tail = (np.int32(c), np.int64(s), np.int32(has_w), np.int32(has_b), scalar(problem.attrs["eps"]))

    def launch(x: Any, mean: Any, var: Any, *vecs: Any) -> Any:
        xb, xo = _operand(dev, x)
        wb, wo = _operand(dev, vecs[0]) if has_w else (xb, np.int64(0))
        bb, bo = _operand(dev, vecs[-1]) if has_b else (xb, np.int64(0))
        out = dev.empty(shape, dtype)
        run(xb, xo, *_operand(dev, mean), *_operand(dev, var), wb, wo, bb, bo, out.base_data, *tail)
        return out

    return launch


def batch_configs(problem: Problem) -> Sequence[Mapping[str, int]]:
    dev = problem.device.provider
    fit = [c for c in BATCH_CONFIGS if c["WG"] <= dev.max_wg]
    return sorted(fit, key=lambda c: batch_cost(problem, c))


def batch_cost(problem: Problem, config: Mapping[str, int]) -> float:
    dev = problem.device.provider
    n, c, s = _ncs(problem)
    nbytes = 2.0 * n * c * s * itemsize(problem.dtype)
    idle = -(-s // config["WG"]) * config["WG"] / s  # the spatial dim rounded up to the work-group
    copy = 0.0 if problem.contiguous else nbytes / dev.bandwidth
    return nbytes * idle / dev.bandwidth + copy + dev.launch_s
