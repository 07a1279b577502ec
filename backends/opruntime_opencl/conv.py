"""conv2d on OpenCL devices (``conv.cl``): an implicit-GEMM kernel (the im2col matrix is
gathered tile by tile, never stored) and a direct one-output-per-work-item baseline. Both take
every attribute: stride, 4-sided padding, dilation, groups and bias."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from opruntime.kernels import Kernel, Problem, itemsize

from . import compile as cl_compile
from .matmul import TYPES
from .memory import OpenCLDevice, element_offset, kernel_dtypes, provider

#: Implicit-GEMM tiles: TM output channels x TN output pixels x TK reduction, WPTM x WPTN
#: outputs per work-item. Narrow-TM tiles serve depthwise / few-channel groups.
IGEMM_CONFIGS: tuple[dict[str, int], ...] = (
    dict(TM=64, TN=64, TK=16, WPTM=4, WPTN=4),
    dict(TM=128, TN=64, TK=16, WPTM=8, WPTN=4),
    dict(TM=32, TN=128, TK=16, WPTM=4, WPTN=4),
    dict(TM=8, TN=128, TK=16, WPTM=1, WPTN=4),
    dict(TM=16, TN=64, TK=8, WPTM=2, WPTN=4),
)
DIRECT_CONFIGS: tuple[dict[str, int], ...] = (dict(WG=128),)


def kernels() -> list[Kernel]:
    src, dtypes = cl_compile.source("conv.cl"), kernel_dtypes()
    return [
        #       op        name                        kind      dtypes  run
        Kernel("conv2d", "opencl.conv2d.igemm", "opencl", dtypes, run_igemm, supports=supports_igemm,
               cost=igemm_cost, configs=IGEMM_CONFIGS, config_for=igemm_configs, source=src),
        Kernel("conv2d", "opencl.conv2d.direct", "opencl", dtypes, run_direct, supports=supports,
               cost=direct_cost, configs=DIRECT_CONFIGS, config_for=direct_configs, source=src),
    ]


def _common(problem: Problem, x: Any, w: Any, bias: Any) -> tuple[OpenCLDevice, Any, list[Any]]:
    """Contiguous operands, the output, and the arguments both kernels share."""
    dev = provider(problem.device)
    n, c, h, wd = problem.shapes[0]
    o, cg = problem.shapes[1][:2]
    _, _, ho, wo = problem.out_shape
    g = problem.attrs["groups"]
    (sh, sw), (pt, _, pl, _) = problem.attrs["stride"], problem.attrs["padding"]
    x = x if x.flags.c_contiguous else dev.contiguous(x)
    w = w if w.flags.c_contiguous else dev.contiguous(w)
    if bias is not None and not bias.flags.c_contiguous:
        bias = dev.contiguous(bias)
    out = dev.empty(problem.out_shape, np.dtype(problem.dtype))
    b = bias if bias is not None else w
    i32 = np.int32
    args = [x.base_data, np.int64(element_offset(x)), w.base_data, np.int64(element_offset(w)), b.base_data,
            np.int64(element_offset(b)), i32(bias is not None), out.base_data,
            *map(i32, (n, c, h, wd, o, ho, wo, o // g, cg, sh, sw, pt, pl))]
    return dev, out, args


_tables: dict[tuple, Any] = {}


def _table(dev: OpenCLDevice, problem: Problem) -> Any:
    """Per reduction index k = (c, i, j): (c*H*W + i*dh*W + j*dw, i*dh, j*dw, 0), on the device."""
    _, cg, kh, kw = problem.shapes[1]
    h, wd = problem.shapes[0][2:]
    dh, dw = problem.attrs["dilation"]
    key = (dev.name, cg, kh, kw, h, wd, dh, dw)
    buf = _tables.get(key)
    if buf is None:
        c, i, j = np.meshgrid(np.arange(cg), np.arange(kh), np.arange(kw), indexing="ij")
        tab = np.stack([c * h * wd + i * dh * wd + j * dw, i * dh, j * dw, np.zeros_like(c)], -1)
        if len(_tables) > 256:
            _tables.clear()
        buf = _tables[key] = dev.from_host(np.ascontiguousarray(tab.reshape(-1, 4), np.int32))
    return buf


def run_igemm(problem: Problem, config: Mapping[str, int], x: Any, w: Any, bias: Any = None) -> Any:
    dev, out, args = _common(problem, x, w, bias)
    o, cg, kh, kw = problem.shapes[1]
    g = problem.attrs["groups"]
    n, _, ho, wo = problem.out_shape
    defines = {"T": TYPES[problem.dtype][0], "ACC": TYPES[problem.dtype][1], **TYPES[problem.dtype][2], **config}
    knl = cl_compile.kernel(dev, cl_compile.source("conv.cl"), defines, "conv_igemm", label="opencl.conv2d.igemm")
    rtm, rtn = config["TM"] // config["WPTM"], config["TN"] // config["WPTN"]
    gsize = (-(-n * ho * wo // config["TN"]) * rtn, -(-(o // g) // config["TM"]) * rtm, g)
    dev.launch(knl, gsize, (rtn, rtm, 1), *args, _table(dev, problem).base_data, np.int32(cg * kh * kw))
    return out


def run_direct(problem: Problem, config: Mapping[str, int], x: Any, w: Any, bias: Any = None) -> Any:
    dev, out, args = _common(problem, x, w, bias)
    kh, kw = problem.shapes[1][2:]
    dh, dw = problem.attrs["dilation"]
    defines = {"T": TYPES[problem.dtype][0], "ACC": TYPES[problem.dtype][1], **TYPES[problem.dtype][2], "DIRECT": 1}
    knl = cl_compile.kernel(dev, cl_compile.source("conv.cl"), defines, "conv_direct", label="opencl.conv2d.direct")
    dev.launch(knl, (math.prod(problem.out_shape),), (config["WG"],), *args, *map(np.int32, (kh, kw, dh, dw)))
    return out


# -- configs and costs -------------------------------------------------------------------------
def igemm_fits(dev: OpenCLDevice, cfg: Mapping[str, int], dtype: str) -> bool:
    rtm, rtn = cfg["TM"] // cfg["WPTM"], cfg["TN"] // cfg["WPTN"]
    wg = rtm * rtn
    limits = dev.cl_device.max_work_item_sizes
    return (wg <= dev.max_wg and rtn <= limits[0] and rtm <= limits[1] and wg % cfg["TN"] == 0
            and cfg["TK"] * (cfg["TM"] + 1 + cfg["TN"]) * itemsize(dtype) <= dev.local_mem - 256)


def supports(problem: Problem) -> bool:
    return provider(problem.device).dtype_ok(problem.dtype)


def supports_igemm(problem: Problem) -> bool:
    n, c, h, w = problem.shapes[0]
    small = n * c * h * w < 2**31 and math.prod(problem.out_shape) < 2**31  # int indices inside a group
    return supports(problem) and small and bool(igemm_configs(problem))


def _sizes(problem: Problem) -> tuple[int, int, int, int]:
    """(groups, Og, Kc, pixels)."""
    o, cg, kh, kw = problem.shapes[1]
    g = problem.attrs["groups"]
    n, _, ho, wo = problem.out_shape
    return g, o // g, cg * kh * kw, n * ho * wo


def _flops(problem: Problem) -> float:
    g, og, kc, p = _sizes(problem)
    return 2.0 * g * og * kc * p


def _bytes(problem: Problem) -> float:
    return (sum(math.prod(s) for s in problem.shapes) + math.prod(problem.out_shape)) * itemsize(problem.dtype)


def igemm_cost(problem: Problem, cfg: Mapping[str, int]) -> float:
    dev = provider(problem.device)
    g, og, kc, p = _sizes(problem)
    def up(n: int, t: int) -> int:
        return -(-n // t) * t

    padded = g * up(og, cfg["TM"]) * up(kc, cfg["TK"]) * up(p, cfg["TN"])
    area = cfg["TM"] * cfg["TN"]
    eff = (0.3 if dev.is_gpu else 0.12) * min(1.0, 0.5 + area / 16384)
    tiles = g * -(-og // cfg["TM"]) * -(-p // cfg["TN"])
    fill = max(1.0, dev.compute_units * (2 if dev.is_gpu else 1) / tiles)
    dt = 2.0 if problem.dtype == "float64" else 1.0
    return max(2.0 * padded * dt * fill / (eff * dev.flops), _bytes(problem) / dev.bandwidth) + dev.launch_s


def direct_cost(problem: Problem, cfg: Mapping[str, int]) -> float:
    dev = provider(problem.device)
    eff = 0.04 if dev.is_gpu else 0.03
    return max(_flops(problem) / (eff * dev.flops), _bytes(problem) / dev.bandwidth) + dev.launch_s


def igemm_configs(problem: Problem) -> Sequence[Mapping[str, int]]:
    dev = provider(problem.device)
    cpu_menu = IGEMM_CONFIGS[:1] + IGEMM_CONFIGS[3:4]  # a wide and a narrow tile: each is a slow PoCL compile
    menu = cpu_menu if dev.type == "cpu" else IGEMM_CONFIGS
    fit = [c for c in menu if igemm_fits(dev, c, problem.dtype)]
    return sorted(fit, key=lambda c: igemm_cost(problem, c))


def direct_configs(problem: Problem) -> Sequence[Mapping[str, int]]:
    dev = provider(problem.device)
    return [c for c in DIRECT_CONFIGS if c["WG"] <= dev.max_wg]
