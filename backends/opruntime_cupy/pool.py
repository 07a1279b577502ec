"""max_pool2d, avg_pool2d and adaptive_avg_pool2d on CUDA (``pool.cu``).

* ``direct`` (all three): a thread per OPT outputs along W, blocks tiling (W, OH, planes), the
  input read in place through its strides and the read-only cache (views need no copy), fp32
  accumulation for 16-bit types. For max / avg the first configs compile the window in
  (``FIXED``: unrolled taps, one build per window geometry, cached on disk); the last takes it
  as arguments (one build per dtype).
* ``global`` (adaptive_avg_pool2d to 1x1, ResNet's head): a reduction per plane: GROUP lanes of a
  warp per plane with 128-bit loads where the planes allow, or a block per plane for large planes
  when there are few of them.

Each ``prepare`` compiles, sizes the grid to the SMs and packs the scalar arguments once
(``FastLaunch``); a call allocates the output and launches.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from opruntime.kernels import Kernel, Problem, c_strides, itemsize

from . import compile as cc
from .memory import empty

DTYPE_CODE = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3}
DTYPES = frozenset(DTYPE_CODE)
SOURCE = "pool.cu"
LAUNCH_S = 2.5e-6
#: waves of resident blocks the grids are sized to (threads loop over more planes)
WAVES = 4

WINDOW_CONFIGS: tuple[dict[str, int], ...] = (
    dict(threads=256, opt=2, fixed=1), dict(threads=256, opt=1, fixed=1), dict(threads=128, opt=4, fixed=1),
    dict(threads=256, opt=1, fixed=0),
)
ADAPTIVE_CONFIGS: tuple[dict[str, int], ...] = (dict(threads=256, opt=1), dict(threads=128, opt=2))
GLOBAL_CONFIGS: tuple[dict[str, int], ...] = (dict(threads=256), dict(threads=512), dict(threads=128))
#: relative efficiency by outputs per thread (unmeasured: two outputs give more loads in flight
#: at a moderate register count; four hold 4 x the accumulators and lower the occupancy)
OPT_EFF = {1: 1.0, 2: 1.05, 4: 1.0}
#: a plane of at least this many elements, with fewer planes than SMs x this factor, takes a block
BLOCK_PLANE, BLOCK_FEW = 4096, 16


def kernels() -> list[Kernel]:
    src = cc.source(SOURCE)
    return [
        Kernel("max_pool2d", "cupy.max_pool2d.direct", "cuda", DTYPES, prepare=_prepare_direct, cost=_direct_cost,
               configs=WINDOW_CONFIGS, source=src),
        Kernel("avg_pool2d", "cupy.avg_pool2d.direct", "cuda", DTYPES, prepare=_prepare_direct, cost=_direct_cost,
               configs=WINDOW_CONFIGS, source=src),
        Kernel("adaptive_avg_pool2d", "cupy.adaptive_avg_pool2d.direct", "cuda", DTYPES, prepare=_prepare_direct,
               cost=_direct_cost, configs=ADAPTIVE_CONFIGS, source=src),
        Kernel("adaptive_avg_pool2d", "cupy.adaptive_avg_pool2d.global", "cuda", DTYPES, prepare=_prepare_global,
               supports=_is_global, cost=_global_cost, configs=GLOBAL_CONFIGS, source=src),
    ]


# -- geometry ------------------------------------------------------------------------------------------
def _strides(problem: Problem) -> tuple[int, int, int, int]:
    """The input's element strides (n, c, h, w), size-1 dims given their C-order stride."""
    shape = problem.shapes[0]
    st = problem.strides[0] or c_strides(shape)
    return tuple(s if n > 1 else cs for s, n, cs in zip(st, shape, c_strides(shape)))  # type: ignore[return-value]


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _block(problem: Problem, threads: int, opt: int) -> tuple[int, int, int]:
    """(TX, TY, TZ): along W (OPT outputs a thread) first, then output rows, then planes."""
    n, c = problem.shapes[0][:2]
    oh, ow = problem.out_shape[2:]
    tx = min(32, _pow2(_cdiv(ow, opt)))
    ty = min(max(1, threads // tx), _pow2(oh))
    tz = min(max(1, threads // (tx * ty)), _pow2(n * c), 64)
    return tx, ty, tz


def _grid(problem: Problem, block: tuple[int, int, int], opt: int) -> tuple[int, int, int]:
    """Every W tile, and the rows and planes up to the grid's limits and a few waves of the SMs'
    resident blocks (threads loop over the remaining rows and planes)."""
    tx, ty, tz = block
    n, c = problem.shapes[0][:2]
    oh, ow = problem.out_shape[2:]
    gx = _cdiv(_cdiv(ow, opt), tx)
    gy = min(_cdiv(oh, ty), 65535)
    resident = problem.device.provider.sm_count * max(1, 2048 // (tx * ty * tz))
    gz = max(1, min(_cdiv(n * c, tz), 65535, resident * WAVES // (gx * gy)))
    return gx, gy, gz


def _defines(problem: Problem, config: Mapping[str, int]) -> dict[str, int]:
    d = {"DTYPE": DTYPE_CODE[problem.dtype], "OPT": config.get("opt", 1), "FIXED": config.get("fixed", 0)}
    if d["FIXED"]:
        a = problem.attrs
        (d["KH"], d["KW"]), (d["SH"], d["SW"]), (d["DH"], d["DW"]) = a["kernel_size"], a["stride"], a["dilation"]
    return d


def _scalars(problem: Problem) -> list[Any]:
    """The kernels' scalar arguments after (x, y): C, H, W, OH, OW, planes, strides, and for max /
    avg the window (kh, kw, stride, padding, dilation, include)."""
    n, c, h, w = problem.shapes[0]
    oh, ow = problem.out_shape[2:]
    out = [ctypes.c_int(v) for v in (c, h, w, oh, ow)]
    out += [ctypes.c_int64(n * c), *(ctypes.c_int64(s) for s in _strides(problem))]
    if problem.op != "adaptive_avg_pool2d":
        a = problem.attrs
        out += [ctypes.c_int(v) for v in (*a["kernel_size"], *a["stride"], *a["padding"], *a["dilation"],
                                          int(a.get("count_include_pad", True)))]
    return out


def _byte_strides(problem: Problem) -> tuple[int, ...]:
    return tuple(s * itemsize(problem.dtype) for s in (problem.strides[0] or c_strides(problem.shapes[0])))


# -- direct ---------------------------------------------------------------------------------------------
def _prepare_direct(problem: Problem, config: Mapping[str, int]) -> Callable[[Any], Any]:
    """``launch(x)`` of the direct kernel of ``problem.op`` in ``config``."""
    dev = problem.device.provider.index
    name = f"cupy.{problem.op}.direct"
    opt = config.get("opt", 1)
    fn = cc.get_function(SOURCE, problem.op, _defines(problem, config), dev, kernel=name)
    block = _block(problem, config["threads"], opt)
    fast = cc.FastLaunch(fn, _grid(problem, block, opt), block, pointers=2, scalars=_scalars(problem))
    return _launcher(problem, name, fast, lambda p, scalar: _prepare_direct(p, config))


def _contiguous(problem: Problem) -> Problem:
    return replace(problem, strides=(c_strides(problem.shapes[0]),))


def _launcher(problem: Problem, name: str, fast: Any, remake: Callable[[Problem, bool], Callable[[Any], Any]],
              aligned: bool = False) -> Callable[[Any], Any]:
    """``launch(x)``: allocate, launch ``fast``. Two rare operands go elsewhere, to launchers made
    on first need by ``remake(problem, scalar)``: one whose strides are not the problem's (never
    from the frontend, whose plans are keyed on strides) is copied to C order first; and, for
    ``aligned`` (128-bit) kernels, one whose base is off a 16-byte boundary (a view's offset)
    takes scalar loads."""
    import cupy

    dev, shape = problem.device.provider.index, problem.out_shape
    strides = _byte_strides(problem)
    used = [i for i, n in enumerate(problem.shapes[0]) if n > 1]  # a size-1 dim's stride is never used
    getdev = cupy.cuda.runtime.getDevice
    other: dict[str, Callable[[Any], Any]] = {}

    def launch(x: Any) -> Any:
        if getdev() != dev:
            with cupy.cuda.Device(dev):
                return launch(x)
        if x.strides != strides and any(x.strides[i] != strides[i] for i in used):
            if "copy" not in other:
                other["copy"] = remake(_contiguous(problem), False)
            return other["copy"](cupy.ascontiguousarray(x))
        if aligned and x.data.ptr & 15:
            if "scalar" not in other:
                other["scalar"] = remake(problem, True)
            return other["scalar"](x)
        y = empty(shape, x.dtype, name)
        fast(x.data.ptr, y.data.ptr)
        return y

    return launch


# -- global ---------------------------------------------------------------------------------------------
def _is_global(problem: Problem) -> bool:
    return problem.out_shape[2:] == (1, 1)


def _global_layout(problem: Problem) -> tuple[bool, bool, int]:
    """(flat: the plane's rows follow each other; vec: 128-bit words fit the planes; group: lanes
    per plane, or 0 for a block per plane)."""
    n, c, h, w = problem.shapes[0]
    sn, sc, sh, sw = _strides(problem)
    count = h * w
    flat = h == 1 or sh == w * sw
    words = 16 // itemsize(problem.dtype)
    vec = flat and sw == 1 and count % words == 0 and sn % words == 0 and sc % words == 0
    if count >= BLOCK_PLANE and n * c < problem.device.provider.sm_count * BLOCK_FEW:
        return flat, False, 0
    group = min(32, _pow2(_cdiv(count, 4 * (words if vec else 1))))  # about 4 loads per lane
    return flat, vec, group


def _prepare_global(problem: Problem, config: Mapping[str, int], scalar: bool = False) -> Callable[[Any], Any]:
    """``launch(x)`` of the per-plane reduction: warp groups (128-bit loads unless ``scalar`` or
    the layout forbids them), or a block per plane."""
    dev = problem.device.provider.index
    name = "cupy.adaptive_avg_pool2d.global"
    flat, vec, group = _global_layout(problem)
    vec = vec and not scalar
    n, c, h, w = problem.shapes[0]
    sn, sc, sh, sw = _strides(problem)
    threads, sms, planes = config["threads"], problem.device.provider.sm_count, n * c
    resident = sms * max(1, 2048 // threads)  # blocks the SMs hold at once
    if group == 0:
        entry, grid = "global_avg_pool2d_block", min(planes, resident)
    else:
        entry = "global_avg_pool2d_vec" if vec else "global_avg_pool2d"
        grid = max(1, min(_cdiv(planes, threads // 32 * (32 // group)), resident * WAVES))
    fn = cc.get_function(SOURCE, entry, {"DTYPE": DTYPE_CODE[problem.dtype]}, dev, kernel=name)
    args = [ctypes.c_int(c), ctypes.c_int(w), *(ctypes.c_int64(v) for v in (planes, h * w, sn, sc, sh, sw)),
            ctypes.c_int(int(flat)), ctypes.c_int(max(group, 1))]
    fast = cc.FastLaunch(fn, (grid,), (threads,), pointers=2, scalars=args)
    return _launcher(problem, name, fast, lambda p, s: _prepare_global(p, config, s), aligned=vec)


# -- cost -----------------------------------------------------------------------------------------------
def _io_bytes(problem: Problem) -> float:
    return float((math.prod(problem.shapes[0]) + math.prod(problem.out_shape)) * itemsize(problem.dtype))


def _direct_cost(problem: Problem, config: Mapping[str, Any]) -> float:
    """Bytes over the bandwidth; the windows' overlapping reads come from the caches. Instructions
    per tap make small-output pools slower (fixed windows unroll them)."""
    bw = problem.device.provider.figures()[2]
    eff = 0.7 if config.get("fixed") else 0.55
    taps = math.prod(problem.attrs["kernel_size"]) if "kernel_size" in problem.attrs else 1
    if problem.op == "adaptive_avg_pool2d":
        eff = 0.5
        if _is_global(problem):  # one thread walking a whole plane
            eff = 0.1
    eff *= OPT_EFF.get(config.get("opt", 1), 1.0) / (1.0 + 0.02 * taps)
    if _strides(problem)[3] != 1:
        eff *= 0.5  # uncoalesced loads along W
    return _io_bytes(problem) / (bw * eff) + LAUNCH_S


def _global_cost(problem: Problem, config: Mapping[str, Any]) -> float:
    bw = problem.device.provider.figures()[2]
    flat, vec, group = _global_layout(problem)
    eff = 0.85 if vec else (0.7 if flat else 0.5)
    if config["threads"] != GLOBAL_CONFIGS[0]["threads"]:
        eff *= 0.98  # the tuner's alternatives
    return _io_bytes(problem) / (bw * eff) + LAUNCH_S


def build_variants() -> list[tuple[str, dict]]:
    """(file, defines) CI compiles: every dtype with the window as arguments at each OPT, and with
    ResNet's fixed 3x3 / 2 window (max) and a fixed 2x2 / 2 one (avg)."""
    out: list[tuple[str, dict]] = []
    for code in DTYPE_CODE.values():
        out += [(SOURCE, {"DTYPE": code, "OPT": opt, "FIXED": 0}) for opt in (1, 2, 4)]
        out += [(SOURCE, {"DTYPE": code, "OPT": opt, "FIXED": 1, "KH": 3, "KW": 3, "SH": 2, "SW": 2, "DH": 1, "DW": 1})
                for opt in (1, 2, 4)]
        out.append((SOURCE, {"DTYPE": code, "OPT": 1, "FIXED": 1, "KH": 2, "KW": 2, "SH": 2, "SW": 2, "DH": 1,
                             "DW": 1}))
    return out

