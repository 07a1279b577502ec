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

from opruntime import Kernel, Problem, hookimpl
from opruntime.errors import KernelCompileError

NAME = "cuda_softmax.softmax.rows"  # <plugin name>.<op>.<variant>: run.py registers this module as "cuda_softmax"
SOURCE = Path(__file__).with_name("softmax_rows.cu").read_text()


@hookimpl
def opruntime_kernels() -> list[Kernel]:
    return [
        #      op         name  kind    dtypes
        Kernel("softmax", NAME, "cuda", {"float32"}, prepare=prepare, supports=supports, cost=cost,
               configs=({"BLOCK": 256}, {"BLOCK": 128}, {"BLOCK": 512}, {"BLOCK": 1024}), source=SOURCE),
    ]


def supports(problem: Problem) -> bool:
    return problem.attrs["axis"] == len(problem.shapes[0]) - 1 and problem.contiguous


def cost(problem: Problem, config: Any) -> float:
    bandwidth = problem.device.provider.figures()[2]  # the CuPy backend's device figures
    return 2 * math.prod(problem.out_shape) * 4 / (0.7 * bandwidth) + 3e-6  # one read + one write (L2 hits)


def prepare(problem: Problem, config: Any) -> Any:
    """Compile for the problem's device and bind the launch; the runtime keeps what this returns
    (one bounded cache for every kernel), so nothing is cached here."""
    import cupy

    device, block = problem.device.provider.index, config["BLOCK"]
    cols = problem.shapes[0][-1]
    rows = math.prod(problem.shapes[0]) // cols
    with cupy.cuda.Device(device):
        major, minor = cupy.cuda.Device(device).compute_capability
        code = f"#define BLOCK {block}\n#line 1 \"softmax_rows.cu\"\n{SOURCE}"
        try:
            fn = cupy.RawModule(code=code, options=("--std=c++17", f"-arch=sm_{major}{minor}")).get_function(
                "softmax_rows")  # compiles here
        except cupy.cuda.compiler.CompileException as exc:  # the selector then runs the next candidate
            raise KernelCompileError(NAME, problem.device.name, str(exc)) from None

    def launch(x: Any) -> Any:
        with cupy.cuda.Device(device):  # launches go to the current stream, which the device's timer records
            y = cupy.empty(problem.out_shape, cupy.float32)
            fn((rows,), (block,), (x, y, cupy.int32(cols)))
        return y

    return launch
