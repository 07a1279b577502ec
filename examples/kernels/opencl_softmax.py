"""A softmax kernel in OpenCL C for the ``opencl`` devices that the built-in OpenCL backend
provides. The device source is ``softmax_rows.cl`` beside this file; the work-group size is a
tunable, passed as ``-DWG=...``.

A plugin module: ``run.py`` registers it with ``opr.register``; a package declares it as an
entry point instead (see ``examples/plugin_template``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

import opruntime as opr
from opruntime import Kernel, Problem, hookimpl
from opruntime.errors import KernelCompileError

NAME = "example.softmax.opencl_rows"
# In a package, read it with importlib.resources.files(__package__).joinpath("softmax_rows.cl").
SOURCE = Path(__file__).with_name("softmax_rows.cl").read_text()
_kernels: dict[tuple[int, int], Any] = {}  # (context, WG) -> built kernel (costly to create: cached)


@hookimpl
def opruntime_kernels() -> list[Kernel]:
    return [
        #      op         name  kind      dtypes        run
        Kernel("softmax", NAME, "opencl", {"float32"}, run, supports=supports, cost=cost,
               configs=({"WG": 128}, {"WG": 64}, {"WG": 256}), source=SOURCE),
    ]


def supports(problem: Problem) -> bool:
    # The last axis of a C-contiguous array; everything else is left to the backend's own kernels.
    return problem.attrs["axis"] == len(problem.shapes[0]) - 1 and problem.contiguous


def cost(problem: Problem, config: Any) -> float:
    dev = opr.Device(problem.device).provider  # the OpenCL backend's device: bandwidth, launch_s
    n = math.prod(problem.out_shape)
    return 3 * n * 4 / dev.bandwidth + dev.launch_s  # three reads of the row, one write (mostly cached)


def _kernel(dev: Any, wg: int) -> Any:
    import pyopencl as cl

    key = (dev.context.int_ptr, wg)
    if key not in _kernels:
        try:
            prg = cl.Program(dev.context, SOURCE).build(options=[f"-DWG={wg}"], devices=[dev.cl_device])
        except cl.Error as exc:  # the selector then drops this kernel for the problem and runs the next one
            raise KernelCompileError(NAME, dev.name, str(exc)) from None
        _kernels[key] = cl.Kernel(prg, "softmax_rows")
    return _kernels[key]


def run(problem: Problem, config: Any, x: Any) -> Any:
    dev = opr.Device(problem.device).provider
    cols = problem.shapes[0][-1]
    rows = math.prod(problem.shapes[0]) // cols
    wg = config["WG"]
    y = dev.empty(problem.out_shape, np.float32)  # from the device's memory pool
    # x is a pyopencl.array.Array, possibly a view with an offset into its buffer
    args = (x.base_data, np.int64(x.offset // 4), y.data, np.int32(cols))
    dev.launch(_kernel(dev, wg), (rows * wg,), (wg,), *args)  # through the device: the tuner times it
    return y
