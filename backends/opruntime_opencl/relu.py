"""relu on OpenCL devices (``relu.cl``): one pass, VW elements per work-item through ``vloadn``
(which needs only element alignment, so a view at any offset takes the same kernel); a strided
input is gathered first."""

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

CONFIGS: tuple[dict[str, int], ...] = (dict(VW=4, WG=256), dict(VW=16, WG=64), dict(VW=1, WG=256))
#: x, its element offset, y, n
SIGNATURE = (BUFFER, np.int64, BUFFER, np.int64)


def kernels() -> list[Kernel]:
    return [Kernel("relu", "opencl.relu.vector", "opencl", kernel_dtypes(), prepare=prepare, supports=supports,
                   cost=cost, configs=CONFIGS, source=cl_compile.source("relu.cl"))]


def supports(problem: Problem) -> bool:
    return problem.device.provider.dtype_ok(problem.dtype)


def prepare(problem: Problem, config: Mapping[str, int]) -> Callable[[Any], Any]:
    dev = problem.device.provider
    n, vw, wg = math.prod(problem.out_shape), config["VW"], config["WG"]
    shape, dtype = problem.out_shape, np.dtype(problem.dtype)
    t, _, ext = TYPES[problem.dtype]

    knl = cl_compile.kernel(dev, cl_compile.source("relu.cl"), {"T": t, **ext, "VW": vw}, "relu",
                            label="opencl.relu.vector")
    run = cl_compile.Launch(dev, knl, (wg,), SIGNATURE, (-(-n // vw),))

    def launch(x: Any) -> Any:
        if not x.flags.c_contiguous:
            x = dev.contiguous(x)
        out = dev.empty(shape, dtype)
        run(x.base_data, np.int64(x.offset // x.dtype.itemsize), out.base_data, np.int64(n))
        return out

    return launch


def cost(problem: Problem, config: Mapping[str, int]) -> float:
    dev = problem.device.provider
    nbytes = 2.0 * math.prod(problem.out_shape) * itemsize(problem.dtype)
    width = {16: 1.0, 8: 1.1, 4: 1.3, 1: 2.0}[config["VW"]] if not dev.accelerator else 1.0
    copy = 0.0 if problem.contiguous else nbytes / dev.bandwidth
    return nbytes * width / dev.bandwidth + copy + dev.launch_s
