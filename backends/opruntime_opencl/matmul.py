"""matmul on OpenCL devices (``matmul.cl``): a register-blocked, local-memory-tiled GEMM for
GPUs, a SIMD-vector GEMM for CPUs (no local memory: the caches block) and a plain
one-output-per-work-item tiled kernel; all batched with broadcast batch dims.

Operands are read in place when each matrix is row-major (unit column stride) at any row stride
and batch strides; other views (a transpose) are first gathered into a contiguous copy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from opruntime.kernels import Kernel, Problem, itemsize

from . import compile as cl_compile
from .memory import OpenCLDevice, elem_strides, element_offset, kernel_dtypes, provider


def kernels() -> list[Kernel]:
    src, dtypes = cl_compile.source("matmul.cl"), kernel_dtypes()
    return [
        #       op        name                         kind      dtypes  run
        Kernel("matmul", "opencl.matmul.tiled", "opencl", dtypes, run_tiled, supports=supports_tiled,
               cost=tiled_cost, configs=TILED_CONFIGS, config_for=tiled_configs, source=src),
        Kernel("matmul", "opencl.matmul.vector", "opencl", dtypes, run_vector, supports=supports_vector,
               cost=vector_cost, configs=VECTOR_CONFIGS, config_for=vector_configs, source=src),
        Kernel("matmul", "opencl.matmul.simple", "opencl", dtypes, run_simple, supports=supports_simple,
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


def defines(dtype: str, config: Mapping[str, int]) -> dict[str, Any]:
    t, acc, ext = TYPES[dtype]
    return {"T": t, "ACC": acc, **ext, **config}


# -- operands --------------------------------------------------------------------------------
_offsets: dict[tuple, Any] = {}


def _matrix(dev: OpenCLDevice, x: Any) -> tuple[Any, int]:
    """``x`` (..., R, C) readable as row-major matrices: (array, row stride in elements)."""
    r, c = x.shape[-2:]
    st = elem_strides(x)
    if c > 1 and st[-1] != 1:
        x = dev.contiguous(x)
        st = elem_strides(x)
    return x, (st[-2] if r > 1 else max(c, 1))


def _batch_offsets(dev: OpenCLDevice, x: Any, batch: tuple[int, ...]) -> tuple[Any, np.ndarray]:
    """Each output batch's element offset into ``x`` (broadcast dims repeat), as a device array."""
    bshape, bstr = x.shape[:-2], elem_strides(x)[:-2]
    offs = np.full(max(math.prod(batch), 1), element_offset(x), np.int64)
    if batch:
        idx = np.indices(batch).reshape(len(batch), -1)
        lead = len(batch) - len(bshape)  # batch dims align from the right, as in broadcasting
        for d, (n, s) in enumerate(zip(bshape, bstr)):
            if n != 1:
                offs += idx[lead + d] * s
    key = (dev.name, offs.tobytes())
    buf = _offsets.get(key)
    if buf is None:
        if len(_offsets) > 256:
            _offsets.clear()
        buf = _offsets[key] = dev.from_host(offs)
    return buf, offs


def _prepare(problem: Problem, a: Any, b: Any) -> tuple:
    dev = provider(problem.device)
    (m, k), n = problem.shapes[0][-2:], problem.shapes[1][-1]
    batch = problem.out_shape[:-2]
    a, lda = _matrix(dev, a)
    b, ldb = _matrix(dev, b)
    aoff, ha = _batch_offsets(dev, a, batch)
    boff, hb = _batch_offsets(dev, b, batch)
    out = dev.empty(problem.out_shape, np.dtype(problem.dtype))
    return dev, m, n, k, max(math.prod(batch), 1), a, lda, aoff, ha, b, ldb, boff, hb, out


def run_tiled(problem: Problem, config: Mapping[str, int], a: Any, b: Any) -> Any:
    dev, m, n, k, nb, a, lda, aoff, ha, b, ldb, boff, hb, out = _prepare(problem, a, b)
    vw = config["VW"]
    a_vec = lda % vw == 0 and not (ha % vw).any()
    b_vec = ldb % vw == 0 and not (hb % vw).any()
    knl = cl_compile.kernel(dev, cl_compile.source("matmul.cl"), defines(problem.dtype, config), "gemm_tiled",
                       label="opencl.matmul.tiled")
    rtsm, rtsn = config["TSM"] // config["WPTM"], config["TSN"] // config["WPTN"]
    gsize = (-(-n // config["TSN"]) * rtsn, -(-m // config["TSM"]) * rtsm, nb)
    i32 = np.int32
    dev.launch(knl, gsize, (rtsn, rtsm, 1), i32(m), i32(n), i32(k),
               a.base_data, aoff.base_data, i32(lda), i32(a_vec),
               b.base_data, boff.base_data, i32(ldb), i32(b_vec), out.base_data, i32(n % vw == 0))
    return out


def run_simple(problem: Problem, config: Mapping[str, int], a: Any, b: Any) -> Any:
    dev, m, n, k, nb, a, lda, aoff, _, b, ldb, boff, _, out = _prepare(problem, a, b)
    ts = config["TS"]
    knl = cl_compile.kernel(dev, cl_compile.source("matmul.cl"), defines(problem.dtype, config), "gemm_simple",
                       label="opencl.matmul.simple")
    i32 = np.int32
    dev.launch(knl, (n, m, nb), (ts, ts, 1), i32(m), i32(n), i32(k), a.base_data, aoff.base_data, i32(lda),
               b.base_data, boff.base_data, i32(ldb), out.base_data)
    return out


def run_vector(problem: Problem, config: Mapping[str, int], a: Any, b: Any) -> Any:
    dev, m, n, k, nb, a, lda, aoff, _, b, ldb, boff, _, out = _prepare(problem, a, b)
    vw = vector_width(problem.dtype)
    defines_ = {**defines(problem.dtype, {}), "MR": config["MR"], "NRV": config["NRV"], "VW": vw}
    knl = cl_compile.kernel(dev, cl_compile.source("matmul.cl"), defines_, "gemm_vector", label="opencl.matmul.vector")
    i32 = np.int32
    dev.launch(knl, (-(-n // (config["NRV"] * vw)), -(-m // config["MR"]), nb), (config["WGX"], config["WGY"], 1),
               i32(m), i32(n), i32(k), a.base_data, aoff.base_data, i32(lda), b.base_data, boff.base_data, i32(ldb),
               out.base_data)
    return out


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
    compute = waves * tile_flops * slots / (eff * dev.flops * (1.0 if dev.is_gpu else 2.0 / slots_per_cu))
    nbytes = (m * k + k * n + m * n) * nb * itemsize(problem.dtype)
    copies = 0.0 if problem.contiguous else nbytes / dev.bandwidth
    dt = 2.0 if problem.dtype == "float64" else 1.0
    return max(compute * dt, nbytes / dev.bandwidth) + copies + dev.launch_s


def tiled_cost(problem: Problem, cfg: Mapping[str, int]) -> float:
    dev = provider(problem.device)
    area = cfg["TSM"] * cfg["TSN"]
    eff = (0.55 if dev.is_gpu else 0.08) * min(1.0, 0.55 + area / 36000) * (1.0 if cfg["VW"] == 4 else 0.8)
    slots = max(1, min(4, 512 // ((cfg["TSM"] // cfg["WPTM"]) * (cfg["TSN"] // cfg["WPTN"])))) if dev.is_gpu else 1
    return _gemm_time(problem, dev, cfg["TSM"], cfg["TSN"], cfg["TSK"], eff, slots)


def simple_cost(problem: Problem, cfg: Mapping[str, int]) -> float:
    dev = provider(problem.device)
    ts = cfg["TS"]
    return _gemm_time(problem, dev, ts, ts, ts, 0.1 if dev.is_gpu else 0.08, 4 if dev.is_gpu else 1)


def vector_cost(problem: Problem, cfg: Mapping[str, int]) -> float:
    """SIMD code without local memory: near a CPU's peak, poor on a GPU (uncoalesced, no reuse)."""
    dev = provider(problem.device)
    m, n, k, nb = _dims(problem)
    vw = vector_width(problem.dtype)
    rows, cols = cfg["MR"], cfg["NRV"] * vw
    waste = (-(-m // rows) * rows * -(-n // cols) * cols) / (m * n)
    ragged = 1.0 + 4.0 * (n % cols) / max(n, 1)  # the last column block runs scalar
    eff = 0.01 if dev.is_gpu else 0.8 * (1.0 if rows * cfg["NRV"] >= 8 else 0.8)
    dt = 2.0 if problem.dtype == "float64" else 1.0
    flops = 2.0 * m * n * k * nb * waste * ragged * dt
    nbytes = (m * k + k * n + m * n) * nb * itemsize(problem.dtype)
    copies = 0.0 if problem.contiguous else nbytes / dev.bandwidth
    return max(flops / (eff * dev.flops), nbytes / dev.bandwidth) + copies + dev.launch_s


def vector_configs(problem: Problem) -> Sequence[Mapping[str, int]]:
    dev = provider(problem.device)
    fit = [c for c in VECTOR_CONFIGS if c["WGX"] * c["WGY"] <= dev.max_wg]
    return sorted(fit, key=lambda c: vector_cost(problem, c))


def supports_vector(problem: Problem) -> bool:
    """CPU devices only: on a GPU it reads uncoalesced and reuses nothing (the tiled kernel is
    the GPU one)."""
    dev = provider(problem.device)
    return dev.type == "cpu" and dev.dtype_ok(problem.dtype) and bool(vector_configs(problem))


def tiled_configs(problem: Problem) -> Sequence[Mapping[str, int]]:
    dev = provider(problem.device)
    fit = [c for c in (CPU_TILED if dev.type == "cpu" else GPU_TILED) if tiled_fits(dev, c, problem.dtype)]
    return sorted(fit, key=lambda c: tiled_cost(problem, c))


def simple_configs(problem: Problem) -> Sequence[Mapping[str, int]]:
    dev = provider(problem.device)
    return [c for c in SIMPLE_CONFIGS if simple_fits(dev, c, problem.dtype)]


def supports_tiled(problem: Problem) -> bool:
    return provider(problem.device).dtype_ok(problem.dtype) and bool(tiled_configs(problem))


def supports_simple(problem: Problem) -> bool:
    return provider(problem.device).dtype_ok(problem.dtype) and bool(simple_configs(problem))
