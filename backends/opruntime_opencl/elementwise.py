"""The elementwise family on OpenCL devices (``elementwise.cl`` after ``epilogue.cl``): ``add``,
``sub``, ``mul``, ``div``, ``neg`` and the activations, each computed in the accumulator type
(float for half) with the activation of ``epilogue.cl`` in the same kernel (a binary operator's
``activation=``: ``act(a op b)``, one rounding at the end). Paths, chosen from
the operands' layout (``opruntime.ops.elementwise.layout``):

* ``vector``: every operand C-contiguous in the output's shape: VW elements per work-item
  through ``vloadn`` (element alignment is enough, so views at any offset take it too);
* ``broadcast`` (binary): one operand C-contiguous in the output's shape, the other repeated
  (a scalar, a row, a column, a channel bias): element ``i`` reads ``g[(i / div) % mod]``;
* ``strided``: any element strides (0 where an operand repeats) over up to 6 merged dims: views
  and two-sided broadcasting read in place, no gather first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from opruntime.kernels import Kernel, Problem, itemsize
from opruntime.ops.elementwise import BINARY_OPS, UNARY_OPS, Layout, activation, layout

from . import compile as cl_compile
from .compile import BUFFER
from .epilogue import ACT
from .matmul import TYPES
from .memory import kernel_dtypes

SOURCE = ("elementwise.cl", "epilogue.cl")
OP_CODE: dict[str | None, int] = {None: 0, "add": 1, "sub": 2, "mul": 3, "div": 4, "neg": 5}
CONFIGS: tuple[dict[str, int], ...] = (dict(VW=4, WG=256), dict(VW=16, WG=64), dict(VW=1, WG=256))
STRIDED_CONFIGS: tuple[dict[str, int], ...] = (dict(VW=1, WG=256), dict(VW=1, WG=64))
#: per kernel argument: buffers with their element offsets, then the sizes
_OPERANDS = (BUFFER, np.int64, BUFFER, np.int64, BUFFER)
SIGNATURE = {
    "vector": (*_OPERANDS, np.int64),
    "broadcast": (*_OPERANDS, np.int64, np.int64, np.int64),
    "strided": (*_OPERANDS, *(np.int64,) * 19),
}
ENTRY = {"vector": "ew_contig", "broadcast": "ew_bcast", "strided": "ew_strided"}
#: how far below the bandwidth each path runs (the estimate only ranks them)
SLOWDOWN = {"vector": 1.0, "broadcast": 1.2, "strided": 2.0}


def kernels() -> list[Kernel]:
    src, dtypes = cl_compile.source(*SOURCE), kernel_dtypes()
    out = []
    for op in (*BINARY_OPS, *UNARY_OPS):
        paths = ("vector", "broadcast", "strided") if op in BINARY_OPS else ("vector", "strided")
        for path in paths:
            out.append(Kernel(op, f"opencl.{op}.{path}", "opencl", dtypes, prepare=_preparer(path),
                              supports=_supports(path), cost=_cost(path),
                              configs=STRIDED_CONFIGS if path == "strided" else CONFIGS, source=src))
    return out


def _layout(problem: Problem, strided: bool = False) -> Layout:
    return layout(problem.shapes, problem.strides, problem.out_shape, strided=strided)


def _supports(path: str) -> Callable[[Problem], bool]:
    def supports(problem: Problem) -> bool:
        if not problem.device.provider.dtype_ok(problem.dtype):
            return False
        return _layout(problem, strided=True).fits if path == "strided" else _layout(problem).path == path

    supports.__name__ = f"supports_{path}"
    return supports


def _cost(path: str) -> Callable[[Problem, Mapping[str, int]], float]:
    def cost(problem: Problem, config: Mapping[str, int]) -> float:
        dev = problem.device.provider
        nbytes = float(sum(math.prod(s) for s in problem.shapes) + math.prod(problem.out_shape)) * itemsize(problem.dtype)
        width = {16: 1.0, 8: 1.1, 4: 1.3, 2: 1.6, 1: 2.0}[config["VW"]] if not dev.accelerator else 1.0
        return nbytes * width * SLOWDOWN[path] / dev.bandwidth + dev.launch_s

    return cost


def _preparer(path: str) -> Callable[[Problem, Mapping[str, int]], Callable[..., Any]]:
    def prepare(problem: Problem, config: Mapping[str, int]) -> Callable[..., Any]:
        return _build(path, problem, config)

    prepare.__name__ = f"prepare_{path}"
    return prepare


def _build(path: str, problem: Problem, config: Mapping[str, int]) -> Callable[..., Any]:
    dev = problem.device.provider
    binary = problem.op in BINARY_OPS
    op = problem.op if binary or problem.op == "neg" else None
    act = activation(problem)  # a binary operator's activation= too: act(a op b) in one kernel
    lay = _layout(problem, strided=path == "strided")
    t, acc, ext = TYPES[problem.dtype]
    vw = config["VW"]
    defines = {"T": t, "ACC": acc, **ext, "VW": vw, "ARITY": 2 if binary else 1, "OP": OP_CODE[op], "ACT": ACT[act],
               "SWAP": int(path == "broadcast" and lay.full == 1)}
    label = f"opencl.{problem.op}.{path}"
    knl = cl_compile.kernel(dev, cl_compile.source(*SOURCE), defines, ENTRY[path], label=label)
    n, shape, dtype = lay.n, problem.out_shape, np.dtype(problem.dtype)
    run = cl_compile.Launch(dev, knl, (min(config["WG"], dev.max_wg),), SIGNATURE[path], (-(-n // vw),))
    if path == "vector":
        tail: tuple[Any, ...] = (np.int64(n),)
    elif path == "broadcast":
        tail = (np.int64(n), np.int64(lay.div), np.int64(lay.mod))
    else:
        sb = lay.strides[1] if binary else (0,) * len(lay.dims)
        tail = tuple(np.int64(v) for v in (n, *lay.dims, *lay.strides[0], *sb))
    swap = path == "broadcast" and lay.full == 1

    def launch(*xs: Any) -> Any:
        a, b = (xs[1], xs[0]) if swap else (xs[0], xs[-1])  # the broadcast kernel takes the full one first
        out = dev.empty(shape, dtype)
        run(a.base_data, np.int64(a.offset // a.dtype.itemsize), b.base_data, np.int64(b.offset // b.dtype.itemsize),
            out.base_data, *tail)
        return out

    return launch
