"""max_pool2d, avg_pool2d and adaptive_avg_pool2d on OpenCL devices (``pool.cl``): one
work-item per output over an (OW, OH, planes) NDRange, work-groups spanning a tile of one plane
(consecutive work-items along W, so reads coalesce where the input's W stride is 1). The input is
read in place through its strides: transposed and sliced views need no copy. One program per
dtype serves every geometry (the window is a run-time argument)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from opruntime.kernels import Kernel, Problem, itemsize

from . import compile as cl_compile
from .compile import BUFFER
from .matmul import TYPES
from .memory import kernel_dtypes

SOURCE = "pool.cl"
CONFIGS: tuple[dict[str, int], ...] = (dict(WG=256), dict(WG=64), dict(WG=128))
I32, I64 = np.int32, np.int64
#: x, its element offset, y, C, H, W, OH, OW, planes, the input's element strides (n, c, h, w)
COMMON = (BUFFER, I64, BUFFER, I32, I32, I32, I32, I32, I64, I64, I64, I64, I64)
#: max / avg: the common arguments, then kh, kw, stride h / w, padding h / w, dilation h / w, include
WINDOW = (*COMMON, *(I32,) * 9)


def kernels() -> list[Kernel]:
    src, dtypes = cl_compile.source(SOURCE), kernel_dtypes()
    return [
        Kernel(op, f"opencl.{op}.direct", "opencl", dtypes, prepare=_preparer(op), supports=supports, cost=cost,
               configs=CONFIGS, config_for=configs, source=src)
        for op in ("max_pool2d", "avg_pool2d", "adaptive_avg_pool2d")
    ]


def supports(problem: Problem) -> bool:
    return problem.device.provider.dtype_ok(problem.dtype)


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _local(problem: Problem, wg: int) -> tuple[int, int, int]:
    """The work-group (LX, LY, 1): along W first, then H, within the device's limits."""
    dev = problem.device.provider
    lim = dev.cl_device.max_work_item_sizes
    wg = min(wg, dev.max_wg)
    oh, ow = problem.out_shape[2:]
    lx = max(1, min(_pow2(ow), 32, wg, lim[0]))
    ly = max(1, min(_pow2(oh), wg // lx, lim[1]))
    return lx, ly, 1


def configs(problem: Problem) -> list[Mapping[str, int]]:
    fits = [c for c in CONFIGS if c["WG"] <= problem.device.provider.max_wg]
    return fits or [dict(WG=problem.device.provider.max_wg)]


def _preparer(op: str) -> Callable[[Problem, Mapping[str, int]], Callable[[Any], Any]]:
    def prepare(problem: Problem, config: Mapping[str, int]) -> Callable[[Any], Any]:
        dev = problem.device.provider
        t, acc, ext = TYPES[problem.dtype]
        knl = cl_compile.kernel(dev, cl_compile.source(SOURCE), {"T": t, "ACC": acc, **ext}, op,
                                label=f"opencl.{op}.direct")
        n, c, h, w = problem.shapes[0]
        oh, ow = problem.out_shape[2:]
        planes = n * c
        window: tuple[Any, ...] = ()
        if op != "adaptive_avg_pool2d":
            a = problem.attrs
            window = tuple(I32(v) for v in (*a["kernel_size"], *a["stride"], *a["padding"], *a["dilation"],
                                            int(a.get("count_include_pad", True))))
        run = cl_compile.Launch(dev, knl, _local(problem, config["WG"]), WINDOW if window else COMMON,
                                (ow, oh, planes))
        dims = (I32(c), I32(h), I32(w), I32(oh), I32(ow), I64(planes))
        shape, dtype, size = problem.out_shape, np.dtype(problem.dtype), np.dtype(problem.dtype).itemsize

        def launch(x: Any) -> Any:
            out = dev.empty(shape, dtype)
            strides = (I64(s // size) for s in x.strides)
            run(x.base_data, I64(x.offset // size), out.base_data, *dims, *strides, *window)
            return out

        return launch

    prepare.__name__ = f"prepare_{op}"
    return prepare


def cost(problem: Problem, config: Mapping[str, int]) -> float:
    dev = problem.device.provider
    taps = math.prod(problem.attrs["kernel_size"]) if "kernel_size" in problem.attrs else 1
    n_in, n_out = math.prod(problem.shapes[0]), math.prod(problem.out_shape)
    # every input element read once (more where windows overlap, from cache), every output written
    nbytes = (n_in + n_out) * itemsize(problem.dtype)
    flops = float(max(n_in, n_out * taps))
    return max(nbytes / dev.bandwidth, flops / dev.flops) * (1.0 if problem.contiguous else 1.3) + dev.launch_s
