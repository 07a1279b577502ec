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

from opruntime import Kernel, Problem, hookimpl
from opruntime.errors import KernelCompileError

NAME = "opencl_softmax.softmax.rows"  # <plugin name>.<op>.<variant>
# In a package, read it with importlib.resources.files(__package__).joinpath("softmax_rows.cl").
SOURCE = Path(__file__).with_name("softmax_rows.cl").read_text()


@hookimpl
def opruntime_kernels() -> list[Kernel]:
    return [
        #      op         name  kind      dtypes
        Kernel("softmax", NAME, "opencl", {"float32"}, prepare=prepare, supports=supports, cost=cost,
               configs=({"WG": 128}, {"WG": 64}, {"WG": 256}), source=SOURCE),
    ]


def supports(problem: Problem) -> bool:
    # The last axis of a C-contiguous array; everything else is left to the backend's own kernels.
    return problem.attrs["axis"] == len(problem.shapes[0]) - 1 and problem.contiguous


def cost(problem: Problem, config: Any) -> float:
    dev = problem.device.provider  # the OpenCL backend's device: bandwidth, launch_s
    n = math.prod(problem.out_shape)
    return 3 * n * 4 / dev.bandwidth + dev.launch_s  # three reads of the row, one write (mostly cached)


def prepare(problem: Problem, config: Any) -> Any:
    """Build the program for the problem's device and bind the launch (the runtime keeps what this
    returns in its one bounded launch cache: nothing is cached here)."""
    import threading

    import pyopencl as cl

    dev = problem.device.provider
    cols = problem.shapes[0][-1]
    rows = math.prod(problem.shapes[0]) // cols
    wg = config["WG"]
    try:
        prg = cl.Program(dev.context, SOURCE).build(options=[f"-DWG={wg}"], devices=[dev.cl_device])
    except cl.Error as exc:  # the selector then drops this kernel for the problem and runs the next one
        raise KernelCompileError(NAME, dev.name, str(exc)) from None
    knl, lock = cl.Kernel(prg, "softmax_rows"), threading.Lock()  # a kernel object holds its arguments

    def launch(x: Any) -> Any:
        y = dev.empty(problem.out_shape, np.float32)  # from the device's memory pool
        # x is a pyopencl.array.Array, possibly a view with an offset into its buffer
        with lock:
            dev.launch(knl, (rows * wg,), (wg,), x.base_data, np.int64(x.offset // 4), y.data, np.int32(cols))
        return y

    return launch
