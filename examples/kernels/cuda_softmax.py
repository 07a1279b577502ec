"""A softmax kernel in CUDA C for the ``cuda`` devices that the built-in CuPy backend provides,
following that backend's conventions: the source (``softmax_rows.cu``) sits beside its launcher;
tunables go in as ``#define`` lines in front of it; NVRTC compiles it for the device's own
architecture (``-arch=sm_XX``); a build failure raises ``KernelCompileError`` with the log, so
the selector falls back to the next candidate; CuPy is imported only inside functions.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import opruntime as opr
from opruntime import Kernel, Problem, hookimpl
from opruntime.errors import KernelCompileError

NAME = "example.softmax.cuda_rows"
SOURCE = Path(__file__).with_name("softmax_rows.cu").read_text()
_functions: dict[tuple[int, int], Any] = {}  # (device, BLOCK) -> cupy.RawKernel


@hookimpl
def opruntime_kernels() -> list[Kernel]:
    return [
        #      op         name  kind    dtypes        run
        Kernel("softmax", NAME, "cuda", {"float32"}, run, supports=supports, cost=cost,
               configs=({"BLOCK": 256}, {"BLOCK": 128}, {"BLOCK": 512}, {"BLOCK": 1024}), source=SOURCE),
    ]


def supports(problem: Problem) -> bool:
    return problem.attrs["axis"] == len(problem.shapes[0]) - 1 and problem.contiguous


def cost(problem: Problem, config: Any) -> float:
    bandwidth = opr.Device(problem.device).provider.figures()[2]  # the CuPy backend's device figures
    return 2 * math.prod(problem.out_shape) * 4 / (0.7 * bandwidth) + 3e-6  # one read + one write (L2 hits)


def _function(device: int, block: int) -> Any:
    import cupy

    key = (device, block)
    if key not in _functions:
        with cupy.cuda.Device(device):
            major, minor = cupy.cuda.Device(device).compute_capability
            code = f"#define BLOCK {block}\n#line 1 \"softmax_rows.cu\"\n{SOURCE}"
            try:
                mod = cupy.RawModule(code=code, options=("--std=c++17", f"-arch=sm_{major}{minor}"))
                _functions[key] = mod.get_function("softmax_rows")  # compiles here
            except cupy.cuda.compiler.CompileException as exc:
                raise KernelCompileError(NAME, f"cuda:{device}", str(exc)) from None
    return _functions[key]


def run(problem: Problem, config: Any, x: Any) -> Any:
    import cupy

    device = int(problem.device.split(":")[1])
    cols = problem.shapes[0][-1]
    rows = math.prod(problem.shapes[0]) // cols
    with cupy.cuda.Device(device):  # launches go to the current stream, which the device's timer records
        y = cupy.empty(problem.out_shape, cupy.float32)
        _function(device, config["BLOCK"])((rows,), (config["BLOCK"],), (x, y, cupy.int32(cols)))
    return y
