"""conv2d on OpenCL devices (``conv.cl``): an implicit-GEMM kernel (the im2col matrix is
gathered tile by tile, never stored) and a direct one-output-per-work-item baseline. Both take
every attribute: stride, 4-sided padding, dilation, groups, bias and the activation (applied to
each output in the accumulator, after the bias, before its one rounding)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from opruntime.kernels import Kernel, Problem, itemsize

from . import compile as cl_compile
from .compile import BUFFER
from .epilogue import ACT
from .matmul import TYPES
from .memory import OpenCLDevice, kernel_dtypes

#: The program: conv.cl after epilogue.cl (the activation epilogue, ACT).
SOURCE = ("conv.cl", "epilogue.cl")
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
    src, dtypes = cl_compile.source(*SOURCE), kernel_dtypes()
    return [
        #       op        name                        kind      dtypes
        Kernel("conv2d", "opencl.conv2d.igemm", "opencl", dtypes, prepare=prepare_igemm, supports=supports_igemm,
               cost=igemm_cost, configs=IGEMM_CONFIGS, config_for=igemm_configs, source=src),
        Kernel("conv2d", "opencl.conv2d.direct", "opencl", dtypes, prepare=prepare_direct, supports=supports,
               cost=direct_cost, configs=DIRECT_CONFIGS, config_for=direct_configs, source=src),
    ]


#: The arguments both kernels share (CONV_ARGS in conv.cl): x, xoff, w, woff, bias, boff, has_bias,
#: y, then N C H W O Ho Wo Og Cg sh sw pt pl.
SIGNATURE = (BUFFER, np.int64, BUFFER, np.int64, BUFFER, np.int64, np.int32, BUFFER) + (np.int32,) * 13


def _shape_args(problem: Problem) -> tuple[int, ...]:
    """N C H W O Ho Wo Og Cg sh sw pt pl: the problem's part of the shared arguments."""
    n, c, h, wd = problem.shapes[0]
    o, cg = problem.shapes[1][:2]
    _, _, ho, wo = problem.out_shape
    (sh, sw), (pt, _, pl, _) = problem.attrs["stride"], problem.attrs["padding"]
    return n, c, h, wd, o, ho, wo, o // problem.attrs["groups"], cg, sh, sw, pt, pl


def _launcher(problem: Problem, run: cl_compile.Launch, tail: tuple[Any, ...]) -> Callable[..., Any]:
    """``launch(x, w, bias=None)``: gather strided operands, allocate the result, enqueue ``run``
    with the shared arguments and the kernel's own ``tail``."""
    dev = problem.device.provider
    shape, dtype, dims = problem.out_shape, np.dtype(problem.dtype), _shape_args(problem)

    def launch(x: Any, w: Any, bias: Any = None) -> Any:
        x = x if x.flags.c_contiguous else dev.contiguous(x)
        w = w if w.flags.c_contiguous else dev.contiguous(w)
        if bias is not None and not bias.flags.c_contiguous:
            bias = dev.contiguous(bias)
        b = bias if bias is not None else w  # a valid buffer the kernel never reads
        out = dev.empty(shape, dtype)
        size = x.dtype.itemsize
        run(x.base_data, x.offset // size, w.base_data, w.offset // size, b.base_data, b.offset // size,
            bias is not None, out.base_data, *dims, *tail)
        return out

    return launch


def _defines(problem: Problem, extra: Mapping[str, int]) -> dict[str, Any]:
    t, acc, ext = TYPES[problem.dtype]
    act = problem.attrs.get("activation")
    return {"T": t, "ACC": acc, **ext, **extra, **({"ACT": ACT[act]} if act is not None else {})}


def prepare_igemm(problem: Problem, config: Mapping[str, int]) -> Callable[..., Any]:
    """Build the implicit GEMM for ``problem`` with tile ``config``, and its gather table."""
    dev = problem.device.provider
    o, cg, kh, kw = problem.shapes[1]
    g = problem.attrs["groups"]
    n, _, ho, wo = problem.out_shape
    knl = cl_compile.kernel(dev, cl_compile.source(*SOURCE), _defines(problem, config), "conv_igemm",
                            label="opencl.conv2d.igemm")
    rtm, rtn = config["TM"] // config["WPTM"], config["TN"] // config["WPTN"]
    gsize = (-(-n * ho * wo // config["TN"]) * rtn, -(-(o // g) // config["TM"]) * rtm, g)
    run = cl_compile.Launch(dev, knl, (rtn, rtm, 1), (*SIGNATURE, BUFFER, np.int32), gsize)
    table = _table(dev, problem)  # the launcher keeps it alive (and frees it with itself)
    return _launcher(problem, run, (table.base_data, cg * kh * kw))


def _table(dev: OpenCLDevice, problem: Problem) -> Any:
    """Per reduction index k = (c, i, j): (c*H*W + i*dh*W + j*dw, i*dh, j*dw, 0), on the device."""
    _, cg, kh, kw = problem.shapes[1]
    h, wd = problem.shapes[0][2:]
    dh, dw = problem.attrs["dilation"]
    c, i, j = np.meshgrid(np.arange(cg), np.arange(kh), np.arange(kw), indexing="ij")
    tab = np.stack([c * h * wd + i * dh * wd + j * dw, i * dh, j * dw, np.zeros_like(c)], -1)
    return dev.from_host(np.ascontiguousarray(tab.reshape(-1, 4), np.int32))


def prepare_direct(problem: Problem, config: Mapping[str, int]) -> Callable[..., Any]:
    """Build the one-output-per-work-item kernel for ``problem``."""
    dev = problem.device.provider
    kh, kw = problem.shapes[1][2:]
    dh, dw = problem.attrs["dilation"]
    knl = cl_compile.kernel(dev, cl_compile.source(*SOURCE), _defines(problem, {"DIRECT": 1}), "conv_direct",
                            label="opencl.conv2d.direct")
    run = cl_compile.Launch(dev, knl, (config["WG"],), (*SIGNATURE, *(np.int32,) * 4),
                            (math.prod(problem.out_shape),))
    return _launcher(problem, run, (kh, kw, dh, dw))


# -- configs and costs -------------------------------------------------------------------------
def igemm_fits(dev: OpenCLDevice, cfg: Mapping[str, int], dtype: str) -> bool:
    rtm, rtn = cfg["TM"] // cfg["WPTM"], cfg["TN"] // cfg["WPTN"]
    wg = rtm * rtn
    limits = dev.cl_device.max_work_item_sizes
    return (wg <= dev.max_wg and rtn <= limits[0] and rtm <= limits[1] and wg % cfg["TN"] == 0
            and cfg["TK"] * (cfg["TM"] + 1 + cfg["TN"]) * itemsize(dtype) <= dev.local_mem - 256)


def supports(problem: Problem) -> bool:
    return problem.device.provider.dtype_ok(problem.dtype)


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
    dev = problem.device.provider
    g, og, kc, p = _sizes(problem)
    def up(n: int, t: int) -> int:
        return -(-n // t) * t

    padded = g * up(og, cfg["TM"]) * up(kc, cfg["TK"]) * up(p, cfg["TN"])
    area = cfg["TM"] * cfg["TN"]
    eff = (0.3 if dev.accelerator else 0.12) * min(1.0, 0.5 + area / 16384)
    tiles = g * -(-og // cfg["TM"]) * -(-p // cfg["TN"])
    fill = max(1.0, dev.compute_units * (2 if dev.accelerator else 1) / tiles)
    dt = 2.0 if problem.dtype == "float64" else 1.0
    return max(2.0 * padded * dt * fill / (eff * dev.flops), _bytes(problem) / dev.bandwidth) + dev.launch_s


def direct_cost(problem: Problem, cfg: Mapping[str, int]) -> float:
    dev = problem.device.provider
    eff = 0.04 if dev.accelerator else 0.03
    return max(_flops(problem) / (eff * dev.flops), _bytes(problem) / dev.bandwidth) + dev.launch_s


def igemm_configs(problem: Problem) -> Sequence[Mapping[str, int]]:
    dev = problem.device.provider
    cpu_menu = IGEMM_CONFIGS[:1] + IGEMM_CONFIGS[3:4]  # a wide and a narrow tile: each is a slow PoCL compile
    menu = cpu_menu if dev.type == "cpu" else IGEMM_CONFIGS
    fit = [c for c in menu if igemm_fits(dev, c, problem.dtype)]
    return sorted(fit, key=lambda c: igemm_cost(problem, c))


def direct_configs(problem: Problem) -> Sequence[Mapping[str, int]]:
    dev = problem.device.provider
    return [c for c in DIRECT_CONFIGS if c["WG"] <= dev.max_wg]
