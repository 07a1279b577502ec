"""matmul on OpenCL devices (``matmul.cl``): a register-blocked, local-memory-tiled GEMM for
GPUs, a SIMD-vector GEMM for CPUs (no local memory: the caches block) and a plain
one-output-per-work-item tiled kernel; all batched with broadcast batch dims.

Operands are read in place when each matrix is row-major (unit column stride) at any row stride
and batch strides; other views (a transpose) are first gathered into a contiguous copy.

The three kernels take an epilogue (:class:`Epilogue`: a bias per output column and an
activation of ``epilogue.cl``, applied before the one rounding to the output type): ``linear``
(``linear.py``) builds them with it; matmul builds them without.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from opruntime.kernels import Kernel, Problem, c_strides, itemsize

from . import compile as cl_compile
from .compile import BUFFER
from .epilogue import ACT
from .memory import OpenCLDevice, elem_strides, kernel_dtypes

#: The program text of every GEMM: matmul.cl after epilogue.cl (ACTIVATE; identity without ACT).
SOURCE = ("matmul.cl", "epilogue.cl")


def kernels() -> list[Kernel]:
    src, dtypes = cl_compile.source(*SOURCE), kernel_dtypes()
    return [
        #       op        name                         kind      dtypes
        Kernel("matmul", "opencl.matmul.tiled", "opencl", dtypes, prepare=prepare_tiled, supports=supports_tiled,
               cost=tiled_cost, configs=TILED_CONFIGS, config_for=tiled_configs, source=src),
        Kernel("matmul", "opencl.matmul.vector", "opencl", dtypes, prepare=prepare_vector, supports=supports_vector,
               cost=vector_cost, configs=VECTOR_CONFIGS, config_for=vector_configs, source=src),
        Kernel("matmul", "opencl.matmul.simple", "opencl", dtypes, prepare=prepare_simple, supports=supports_simple,
               cost=simple_cost, configs=SIMPLE_CONFIGS, config_for=simple_configs, source=src),
    ]


#: The tuned kernel's variants: tile (TSM x TSN x TSK), outputs per work-item (WPTM x WPTN),
#: vector width VW, A tile k-major in local memory (AT), two local stages (DB). ``config_for``
#: keeps those of the device's menu that fit its limits, cheapest first. GPU menu measured on an
#: H200 (docs/notes-opencl.md): the 128x128x16 tiles reach 40 TFLOP/s, 0.80x cuBLAS, at 4096.
GPU_TILED = (
    dict(TSM=128, TSN=128, TSK=16, WPTM=8, WPTN=8, VW=4, AT=1, DB=0),
    dict(TSM=128, TSN=128, TSK=16, WPTM=8, WPTN=8, VW=4, AT=1, DB=1),
    dict(TSM=128, TSN=128, TSK=8, WPTM=8, WPTN=8, VW=4, AT=1, DB=1),
    dict(TSM=128, TSN=128, TSK=16, WPTM=8, WPTN=8, VW=4, AT=0, DB=0),
    dict(TSM=128, TSN=64, TSK=16, WPTM=8, WPTN=4, VW=4, AT=1, DB=1),
    dict(TSM=64, TSN=128, TSK=16, WPTM=4, WPTN=8, VW=4, AT=1, DB=1),
    dict(TSM=64, TSN=64, TSK=16, WPTM=4, WPTN=4, VW=4, AT=1, DB=1),
    dict(TSM=32, TSN=64, TSK=16, WPTM=4, WPTN=4, VW=4, AT=1, DB=0),
    dict(TSM=32, TSN=32, TSK=16, WPTM=2, WPTN=2, VW=2, AT=0, DB=0),
)
#: CPUs (PoCL): small work-groups, no register caps; the fastest three on a 2-core AVX-512 host.
CPU_TILED = (
    dict(TSM=32, TSN=64, TSK=16, WPTM=4, WPTN=4, VW=4, AT=1, DB=0),
    dict(TSM=64, TSN=64, TSK=16, WPTM=8, WPTN=4, VW=4, AT=0, DB=0),
    dict(TSM=64, TSN=64, TSK=16, WPTM=4, WPTN=4, VW=4, AT=1, DB=1),
)
TILED_CONFIGS: tuple[dict[str, int], ...] = (*GPU_TILED, *(c for c in CPU_TILED if c not in GPU_TILED))
SIMPLE_CONFIGS: tuple[dict[str, int], ...] = (dict(TS=16), dict(TS=8))
#: The vector kernel (for CPUs): MR rows x NRV vectors per work-item, a WGX x WGY work-group;
#: the vector width is the dtype's 512-bit width (16 floats, 8 doubles).
VECTOR_CONFIGS: tuple[dict[str, int], ...] = (
    dict(MR=8, NRV=2, WGX=2, WGY=8), dict(MR=4, NRV=2, WGX=4, WGY=4), dict(MR=4, NRV=4, WGX=2, WGY=8),
)

TYPES = {"float32": ("float", "float", {}), "float64": ("double", "double", {"USE_FP64": 1}),
         "float16": ("half", "float", {"USE_FP16": 1})}


@dataclass(frozen=True)
class Epilogue:
    """What a GEMM does to each output before storing it: add ``bias[n]`` and ``residual[m, n]``
    (extra operands of the launch; a residual only on an unbatched product: linear's) and apply
    ``activation`` (a name of ``epilogue.ACT``, or None)."""

    bias: bool = False
    activation: str | None = None
    residual: bool = False

    def defines(self) -> dict[str, int]:
        out = {"BIAS": 1} if self.bias else {}
        if self.residual:
            out["RESID"] = 1
        if self.activation is not None:
            out["ACT"] = ACT[self.activation]
        return out

    def signature(self) -> tuple[Any, ...]:
        """The kernel arguments it adds: the bias buffer and its element offset, the residual's
        buffer, element offset and row stride."""
        return ((BUFFER, np.int64) if self.bias else ()) + ((BUFFER, np.int64, np.int64) if self.residual else ())


NO_EPILOGUE = Epilogue()


def defines(dtype: str, config: Mapping[str, int], epilogue: Epilogue = NO_EPILOGUE) -> dict[str, Any]:
    t, acc, ext = TYPES[dtype]
    return {"T": t, "ACC": acc, **ext, **config, **epilogue.defines()}


# -- operands --------------------------------------------------------------------------------
class _Layout:
    """How the kernels read an operand (..., R, C) of one layout (its strides; not where it
    starts, which varies per call): as row-major matrices with row stride ``ld``, batch ``b``
    at ``steps[b]`` elements from the view's start.

    Attributes:
        strides: the layout's strides in bytes (what a call's array is compared with).
        copy: the matrices are not row-major (a transpose): gather a contiguous copy first.
        ld: row stride in elements (of the copy when ``copy``).
        steps: each output batch's element offset from the view's start, on the device
            (broadcast dims repeat one).
        align: gcd of ``ld`` and the steps: loads are ``vw``-wide when ``vw`` divides it and the
            view's start.
    """

    __slots__ = ("align", "copy", "ld", "steps", "strides")

    def __init__(self, dev: OpenCLDevice, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int,
                 batch: tuple[int, ...]) -> None:
        self.strides = tuple(s * itemsize for s in strides)
        r, c = shape[-2:]
        self.copy = c > 1 and strides[-1] != 1
        if self.copy:
            strides = c_strides(shape)
        self.ld = strides[-2] if r > 1 else max(c, 1)
        steps = np.zeros(max(math.prod(batch), 1), np.int64)
        if batch:
            idx = np.indices(batch).reshape(len(batch), -1)
            lead = len(batch) - len(shape[:-2])  # batch dims align from the right, as in broadcasting
            for d, (n, st) in enumerate(zip(shape[:-2], strides[:-2])):
                if n != 1:
                    steps += idx[lead + d] * st
        self.align = math.gcd(self.ld, *map(int, np.unique(steps)))
        self.steps = dev.from_host(steps)


def _launcher(problem: Problem, body: Callable[..., None]) -> Callable[..., Any]:
    """``launch(a, b, bias=None, residual=None)``: each operand read in place or gathered, the
    result allocated, then ``body(a, a0, la, b, b0, lb, out, *extra)`` enqueues the kernel
    (``a0``: the view's start in elements, ``la``: its :class:`_Layout`; ``extra``: the bias
    buffer and its element offset when a bias is given (a contiguous copy of a strided one), the
    residual's buffer, element offset and row stride when one is given (a copy of one whose rows
    are not unit-stride)).

    The layouts come from the problem's strides, once; an array whose strides differ from the
    problem's (an operand the frontend cast: a contiguous copy of a strided view) gets its own
    layout worked out for that call.
    """
    dev = problem.device.provider
    shape, dtype = problem.out_shape, np.dtype(problem.dtype)
    batch, size = shape[:-2], dtype.itemsize
    layouts = [_Layout(dev, s, st if st is not None else c_strides(s), size, batch)
               for s, st in zip(problem.shapes, problem.strides)]

    def operand(i: int, x: Any) -> tuple[Any, int, _Layout]:
        lay = layouts[i]
        if x.strides != lay.strides:
            lay = _Layout(dev, x.shape, elem_strides(x), size, batch)
        if lay.copy:
            x = dev.contiguous(x)
        return x, x.offset // size, lay

    def launch(a: Any, b: Any, bias: Any = None, residual: Any = None) -> Any:
        a, a0, la = operand(0, a)
        b, b0, lb = operand(1, b)
        out = dev.empty(shape, dtype)
        extra: list[Any] = []
        if bias is not None:
            if not bias.flags.c_contiguous:
                bias = dev.contiguous(bias)
            extra += [bias.base_data, bias.offset // size]
        if residual is not None:
            st = elem_strides(residual)
            if residual.shape[1] > 1 and st[1] != 1:
                residual, st = dev.contiguous(residual), c_strides(residual.shape)
            extra += [residual.base_data, residual.offset // size, st[0] if residual.shape[0] > 1 else 0]
        body(a, a0, la, b, b0, lb, out, *extra)
        return out

    return launch


#: gemm_simple's and gemm_vector's arguments: M N K, A aoff a0 lda, B boff b0 ldb, C.
SIGNATURE = (np.int32,) * 3 + (BUFFER, BUFFER, np.int64, np.int32) * 2 + (BUFFER,)
#: gemm_tiled's: M N K, A aoff a0 lda a_vec, B boff b0 ldb b_vec, C c_vec.
TILED_SIGNATURE = (np.int32,) * 3 + (BUFFER, BUFFER, np.int64, np.int32, np.int32) * 2 + (BUFFER, np.int32)


def prepare_tiled(problem: Problem, config: Mapping[str, int], epilogue: Epilogue = NO_EPILOGUE,
                  label: str = "opencl.matmul.tiled") -> Callable[..., Any]:
    """Build tile ``config`` of the tiled GEMM (with ``epilogue``) for ``problem``."""
    dev = problem.device.provider
    m, n, k, nb = _dims(problem)
    knl = cl_compile.kernel(dev, cl_compile.source(*SOURCE), defines(problem.dtype, config, epilogue), "gemm_tiled",
                            label=label)
    rtsm, rtsn = config["TSM"] // config["WPTM"], config["TSN"] // config["WPTN"]
    gsize = (-(-n // config["TSN"]) * rtsn, -(-m // config["TSM"]) * rtsm, nb)
    run = cl_compile.Launch(dev, knl, (rtsn, rtsm, 1), TILED_SIGNATURE + epilogue.signature(), gsize)
    vw = config["VW"]
    c_vec = n % vw == 0

    def body(a: Any, a0: int, la: _Layout, b: Any, b0: int, lb: _Layout, out: Any, *extra: Any) -> None:
        run(m, n, k, a.base_data, la.steps.base_data, a0, la.ld, la.align % vw == 0 and a0 % vw == 0,
            b.base_data, lb.steps.base_data, b0, lb.ld, lb.align % vw == 0 and b0 % vw == 0, out.base_data, c_vec,
            *extra)

    return _launcher(problem, body)


def prepare_simple(problem: Problem, config: Mapping[str, int], epilogue: Epilogue = NO_EPILOGUE,
                   label: str = "opencl.matmul.simple") -> Callable[..., Any]:
    """Build the one-output-per-work-item GEMM (tile ``config["TS"]``, with ``epilogue``) for ``problem``."""
    dev = problem.device.provider
    m, n, k, nb = _dims(problem)
    ts = config["TS"]
    knl = cl_compile.kernel(dev, cl_compile.source(*SOURCE), defines(problem.dtype, config, epilogue), "gemm_simple",
                            label=label)
    run = cl_compile.Launch(dev, knl, (ts, ts, 1), SIGNATURE + epilogue.signature(), (n, m, nb))
    return _launcher(problem, _plain(run, m, n, k))


def prepare_vector(problem: Problem, config: Mapping[str, int], epilogue: Epilogue = NO_EPILOGUE,
                   label: str = "opencl.matmul.vector") -> Callable[..., Any]:
    """Build the SIMD-vector GEMM (``config``: MR x NRV vectors per work-item; with ``epilogue``)
    for ``problem``."""
    dev = problem.device.provider
    m, n, k, nb = _dims(problem)
    vw = vector_width(problem.dtype)
    defines_ = {**defines(problem.dtype, {}, epilogue), "MR": config["MR"], "NRV": config["NRV"], "VW": vw}
    knl = cl_compile.kernel(dev, cl_compile.source(*SOURCE), defines_, "gemm_vector", label=label)
    gsize = (-(-n // (config["NRV"] * vw)), -(-m // config["MR"]), nb)
    run = cl_compile.Launch(dev, knl, (config["WGX"], config["WGY"], 1), SIGNATURE + epilogue.signature(), gsize)
    return _launcher(problem, _plain(run, m, n, k))


def _plain(run: cl_compile.Launch, m: int, n: int, k: int) -> Callable[..., None]:
    """The body of a kernel with :data:`SIGNATURE` arguments (and an epilogue's ``extra``)."""
    def body(a: Any, a0: int, la: _Layout, b: Any, b0: int, lb: _Layout, out: Any, *extra: Any) -> None:
        run(m, n, k, a.base_data, la.steps.base_data, a0, la.ld, b.base_data, lb.steps.base_data, b0, lb.ld,
            out.base_data, *extra)

    return body


def vector_width(dtype: str) -> int:
    return 8 if dtype == "float64" else 16


# -- which configs fit, and what they cost ------------------------------------------------------
def tiled_fits(dev: OpenCLDevice, cfg: Mapping[str, int], dtype: str) -> bool:
    tsm, tsn, tsk, wm, wn, vw = (cfg[x] for x in ("TSM", "TSN", "TSK", "WPTM", "WPTN", "VW"))
    if tsm % wm or tsn % wn or wm % vw or wn % vw or tsk % vw:
        return False
    wg = (tsm // wm) * (tsn // wn)
    limits = dev.cl_device.max_work_item_sizes
    return (wg <= dev.max_wg and tsn // wn <= limits[0] and tsm // wm <= limits[1]
            and (tsm * tsk // vw) % wg == 0 and (tsk * tsn // vw) % wg == 0
            and (tsm + tsn) * tsk * itemsize(dtype) * (2 if cfg.get("DB") else 1) <= dev.local_mem - 256)


def simple_fits(dev: OpenCLDevice, cfg: Mapping[str, int], dtype: str) -> bool:
    return cfg["TS"] ** 2 <= dev.max_wg and 2 * cfg["TS"] ** 2 * itemsize(dtype) <= dev.local_mem - 256


def _dims(problem: Problem) -> tuple[int, int, int, int]:
    (m, k), n = problem.shapes[0][-2:], problem.shapes[1][-1]
    return m, n, k, max(math.prod(problem.out_shape[:-2]), 1)


def _gemm_time(problem: Problem, dev: OpenCLDevice, tm: int, tn: int, tk: int, eff: float, slots_per_cu: int) -> float:
    """Waves of tiles at ``eff`` of peak, plus the unavoidable memory traffic and a launch."""
    m, n, k, nb = _dims(problem)
    tiles = -(-m // tm) * -(-n // tn) * nb
    slots = dev.compute_units * slots_per_cu
    waves = -(-tiles // slots)
    tile_flops = 2.0 * tm * tn * -(-k // tk) * tk
    compute = waves * tile_flops * slots / (eff * dev.flops * (1.0 if dev.accelerator else 2.0 / slots_per_cu))
    nbytes = (m * k + k * n + m * n) * nb * itemsize(problem.dtype)
    copies = 0.0 if problem.contiguous else nbytes / dev.bandwidth
    dt = 2.0 if problem.dtype == "float64" else 1.0
    return max(compute * dt, nbytes / dev.bandwidth) + copies + dev.launch_s


def tiled_cost(problem: Problem, cfg: Mapping[str, int]) -> float:
    dev = problem.device.provider
    area = cfg["TSM"] * cfg["TSN"]
    eff = (0.55 if dev.accelerator else 0.08) * min(1.0, 0.55 + area / 36000) * (1.0 if cfg["VW"] == 4 else 0.8)
    slots = max(1, min(4, 512 // ((cfg["TSM"] // cfg["WPTM"]) * (cfg["TSN"] // cfg["WPTN"])))) if dev.accelerator else 1
    return _gemm_time(problem, dev, cfg["TSM"], cfg["TSN"], cfg["TSK"], eff, slots)


def simple_cost(problem: Problem, cfg: Mapping[str, int]) -> float:
    dev = problem.device.provider
    ts = cfg["TS"]
    return _gemm_time(problem, dev, ts, ts, ts, 0.1 if dev.accelerator else 0.08, 4 if dev.accelerator else 1)


def vector_cost(problem: Problem, cfg: Mapping[str, int]) -> float:
    """SIMD code without local memory: near a CPU's peak, poor on a GPU (uncoalesced, no reuse)."""
    dev = problem.device.provider
    m, n, k, nb = _dims(problem)
    vw = vector_width(problem.dtype)
    rows, cols = cfg["MR"], cfg["NRV"] * vw
    waste = (-(-m // rows) * rows * -(-n // cols) * cols) / (m * n)
    ragged = 1.0 + 4.0 * (n % cols) / max(n, 1)  # the last column block runs scalar
    eff = 0.01 if dev.accelerator else 0.8 * (1.0 if rows * cfg["NRV"] >= 8 else 0.8)
    dt = 2.0 if problem.dtype == "float64" else 1.0
    flops = 2.0 * m * n * k * nb * waste * ragged * dt
    nbytes = (m * k + k * n + m * n) * nb * itemsize(problem.dtype)
    copies = 0.0 if problem.contiguous else nbytes / dev.bandwidth
    return max(flops / (eff * dev.flops), nbytes / dev.bandwidth) + copies + dev.launch_s


def vector_configs(problem: Problem) -> Sequence[Mapping[str, int]]:
    dev = problem.device.provider
    fit = [c for c in VECTOR_CONFIGS if c["WGX"] * c["WGY"] <= dev.max_wg]
    return sorted(fit, key=lambda c: vector_cost(problem, c))


def supports_vector(problem: Problem) -> bool:
    """CPU devices only: on a GPU it reads uncoalesced and reuses nothing (the tiled kernel is
    the GPU one)."""
    dev = problem.device.provider
    return dev.type == "cpu" and dev.dtype_ok(problem.dtype) and bool(vector_configs(problem))


def tiled_configs(problem: Problem) -> Sequence[Mapping[str, int]]:
    dev = problem.device.provider
    fit = [c for c in (CPU_TILED if dev.type == "cpu" else GPU_TILED) if tiled_fits(dev, c, problem.dtype)]
    return sorted(fit, key=lambda c: tiled_cost(problem, c))


def simple_configs(problem: Problem) -> Sequence[Mapping[str, int]]:
    dev = problem.device.provider
    return [c for c in SIMPLE_CONFIGS if simple_fits(dev, c, problem.dtype)]


def supports_tiled(problem: Problem) -> bool:
    return problem.device.provider.dtype_ok(problem.dtype) and bool(tiled_configs(problem))


def supports_simple(problem: Problem) -> bool:
    return problem.device.provider.dtype_ok(problem.dtype) and bool(simple_configs(problem))
