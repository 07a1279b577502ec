"""conv2d on CUDA: implicit GEMM kernels (no column buffer), a depthwise path, and the vendor
baseline im2col + cuBLAS.

* ``igemm_simt`` (``conv_simt.cu``): the GEMM (M = output channels per group, N = output pixels,
  K = C/groups * kH * kW) on the CUDA cores; every dtype (16-bit ones accumulate in float32, no
  TF32 anywhere). The B tile is gathered from the input on the fly through a per-problem offset
  table, so stride, 4-sided padding, dilation, groups and strided inputs cost nothing extra.
* ``igemm_mma`` (``conv_mma.cu``): the same on the tensor cores for float16 / bfloat16
  (mma.sync m16n8k16, ldmatrix, float32 accumulation).
* ``winograd_f2x3`` / ``winograd_f4x3`` (``conv_winograd.cu`` + ``conv_simt.cu``): 3x3 stride-1
  float32 convolutions by Winograd F(2x2, 3x3) / F(4x4, 3x3): filter and input transforms, the
  16 / 36 products as one grouped GEMM on the SIMT kernel above (2.25x / 4x fewer multiplies
  than the direct GEMM), an output transform.
* ``depthwise`` (``conv_depthwise.cu``): groups == C (one input channel per group, any channel
  multiplier): a direct kernel, one thread per output element.
* ``im2col_cublas`` (vendor): a column buffer from ``conv_im2col.cu``, then cuBLAS
  (cuBLAS, one strided-batched GEMM per group); a 1x1 stride-1 unpadded convolution without bias
  is that GEMM on the input itself. A bias is a row of ones in the column buffer and a column of
  the weights, so the GEMM adds it before its one rounding.

The selector ranks them by ``cost``: roofline times from the device's figures, scaled by the
efficiency each kernel reached when measured (docs/notes-cuda-softmax-conv.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from opruntime.kernels import Kernel, Problem, c_strides, itemsize

from . import compile as cc
from .memory import empty, provider
from .softmax import per_problem

DTYPE_CODE = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3}
DTYPES = frozenset(DTYPE_CODE)
HALVES = frozenset({"float16", "bfloat16"})
WINO_DTYPES = frozenset({"float32"})
VENDOR_DTYPES = DTYPES
#: cudaDataType and cuBLAS compute type of each dtype: fp32 accumulation (fp64 for fp64), no TF32
CUBLAS_TYPES = {"float32": (0, 68), "float64": (1, 70), "float16": (2, 68), "bfloat16": (14, 68)}
LAUNCH_S = 4e-6
TAB_INVALID = 1 << 29
INT_MAX = 2**31 - 1

# -- the table ------------------------------------------------------------------------------------


def kernels() -> list[Kernel]:
    return [
        #      op        name                            kind    dtypes  run          supports / cost / configs
        Kernel("conv2d", "cupy.conv2d.igemm_simt", "cuda", DTYPES, _run("simt"), supports=_igemm_ok,
               cost=_cost("simt"), config_for=_configs("simt"), configs=SIMT_CONFIGS, source=_src("conv_simt.cu")),
        Kernel("conv2d", "cupy.conv2d.igemm_mma", "cuda", HALVES, _run("mma"), supports=_igemm_ok,
               cost=_cost("mma"), config_for=_configs("mma"), configs=MMA_CONFIGS, source=_src("conv_mma.cu")),
        Kernel("conv2d", "cupy.conv2d.winograd_f2x3", "cuda", WINO_DTYPES, _run("winograd2"), supports=_winograd_ok,
               cost=_cost("winograd2"), config_for=_configs("winograd2"), configs=SIMT_CONFIGS,
               source=_src("conv_winograd.cu") + _src("conv_simt.cu")),
        Kernel("conv2d", "cupy.conv2d.winograd_f4x3", "cuda", WINO_DTYPES, _run("winograd4"), supports=_winograd_ok,
               cost=_cost("winograd4"), config_for=_configs("winograd4"), configs=SIMT_CONFIGS,
               source=_src("conv_winograd.cu") + _src("conv_simt.cu")),
        Kernel("conv2d", "cupy.conv2d.depthwise", "cuda", DTYPES, _run("depthwise"), supports=_depthwise_ok,
               cost=_cost("depthwise"), configs=({"threads": 256},), source=_src("conv_depthwise.cu")),
        Kernel("conv2d", "cupy.conv2d.im2col_cublas", "cuda", VENDOR_DTYPES, _run("vendor"), supports=_vendor_ok,
               cost=_cost("vendor"), vendor=True, configs=({"threads": 256},), source=_src("conv_im2col.cu")),
    ]


#: block tiles (output channels x output pixels) and blocks per SM the registers are cut for;
#: the SIMT threads compute 8x8 each.
SIMT_CONFIGS = ({"bm": 64, "bn": 128, "bk": 16, "minb": 3}, {"bm": 64, "bn": 128, "bk": 8, "minb": 3},
                {"bm": 128, "bn": 128, "bk": 8, "minb": 2}, {"bm": 64, "bn": 64, "bk": 8, "minb": 8},
                {"bm": 128, "bn": 64, "bk": 8, "minb": 4})
#: tensor-core tiles with their warp grids (each warp a (bm/wm) x (bn/wn) tile of 16x8 mmas).
MMA_CONFIGS = ({"bm": 128, "bn": 128, "wm": 2, "wn": 4, "minb": 2}, {"bm": 64, "bn": 128, "wm": 2, "wn": 2, "minb": 3},
               {"bm": 128, "bn": 64, "wm": 2, "wn": 2, "minb": 3}, {"bm": 64, "bn": 64, "wm": 2, "wn": 2, "minb": 4})


def _src(name: str) -> str:
    return cc.source(name)


# -- the problem as the kernels see it --------------------------------------------------------------


class Conv:
    """The sizes of one conv2d problem, and the kernel argument block (``ConvParams``)."""

    FIELDS = ("npq", "pq", "q", "h", "w", "sx_n", "sx_c", "sx_h", "sx_w", "str_h", "str_w", "pad_t", "pad_l",
              "dil_h", "dil_w", "k", "kg", "cg", "crs", "r", "s", "has_bias", "mult")

    def __init__(self, problem: Problem) -> None:
        a = problem.attrs
        self.n, self.c, self.h, self.w = problem.shapes[0]
        self.k, self.cg, self.r, self.s = problem.shapes[1]
        _, _, self.p, self.q = problem.out_shape
        self.groups = a["groups"]
        self.kg = self.k // self.groups
        self.crs = self.cg * self.r * self.s
        self.npq = self.n * self.p * self.q
        (self.str_h, self.str_w), (self.dil_h, self.dil_w) = a["stride"], a["dilation"]
        self.pad_t, _, self.pad_l, _ = a["padding"]
        self.sx = problem.strides[0] or c_strides(problem.shapes[0])
        self.w_contig = problem.strides[1] in (None, c_strides(problem.shapes[1]))
        self.b_contig = not a["bias"] or problem.strides[2] in (None, (1,))
        self.has_bias = bool(a["bias"])
        self.flops = 2.0 * self.npq * self.k * self.crs

    def params(self) -> np.ndarray:
        sn, sc, sh, sw = self.sx
        vals = {"npq": self.npq, "pq": self.p * self.q, "q": self.q, "h": self.h, "w": self.w, "sx_n": sn,
                "sx_c": sc, "sx_h": sh, "sx_w": sw, "str_h": self.str_h, "str_w": self.str_w, "pad_t": self.pad_t,
                "pad_l": self.pad_l, "dil_h": self.dil_h, "dil_w": self.dil_w, "k": self.k, "kg": self.kg,
                "cg": self.cg, "crs": self.crs, "r": self.r, "s": self.s, "has_bias": int(self.has_bias),
                "mult": self.k // self.c}
        dt = np.dtype([(f, "<i4") for f in self.FIELDS])
        return np.array([tuple(vals[f] for f in self.FIELDS)], dt)  # passed by value (size-1 array)

    def table(self, pad_to: int = 32) -> np.ndarray:
        """Per reduction index crs: (input offset, row shift, column shift, 0); padded rows invalid."""
        _, sc, sh, sw = self.sx
        crs = np.arange(self.crs)
        c, r, s = crs // (self.r * self.s), (crs // self.s) % self.r, crs % self.s
        rows = -(-self.crs // pad_to) * pad_to + pad_to
        tab = np.zeros((rows, 4), np.int32)
        tab[:, 1:3] = TAB_INVALID
        tab[: self.crs, 0] = c * sc + r * self.dil_h * sh + s * self.dil_w * sw
        tab[: self.crs, 1] = r * self.dil_h
        tab[: self.crs, 2] = s * self.dil_w
        return tab

    def x_extent(self) -> int:
        """One past the largest |offset| the kernels form into x, in elements."""
        return sum((n - 1) * abs(st) for n, st in zip((self.n, self.c, self.h, self.w), self.sx)) + 1


def _int32_ok(cv: Conv, problem: Problem) -> bool:
    return (cv.x_extent() < INT_MAX and math.prod(problem.out_shape) < INT_MAX and cv.npq < INT_MAX
            and cv.groups <= 65535 and all(abs(v) < 2**28 for v in cv.sx))


def _igemm_ok(problem: Problem) -> bool:
    cv = Conv(problem)
    return _int32_ok(cv, problem) and -(-cv.kg // 64) <= 65535


def _depthwise_ok(problem: Problem) -> bool:
    cv = Conv(problem)
    return cv.groups == cv.c and cv.cg == 1 and _int32_ok(cv, problem)


def _vendor_ok(problem: Problem) -> bool:
    return _int32_ok(Conv(problem), problem)


def _winograd_ok(problem: Problem) -> bool:
    cv = Conv(problem)
    return (cv.r == cv.s == 3 and cv.str_h == cv.str_w == 1 and cv.dil_h == cv.dil_w == 1 and cv.groups == 1
            and _int32_ok(cv, problem) and 36 * max(cv.c, cv.k) * _wino_tiles(cv, 2) < INT_MAX)


def _wino_tiles(cv: Conv, m: int) -> int:
    return cv.n * -(-cv.p // m) * -(-cv.q // m)


def _wino_gemm(problem: Problem, m: int) -> Problem:
    """The (m+2)^2 Winograd products as a grouped 1x1 convolution: (1, a2 C, 1, T) x (a2 K, C, 1, 1)."""
    from opruntime.kernels import Attrs

    cv, a2 = Conv(problem), (m + 2) ** 2
    t = _wino_tiles(cv, m)
    shapes = ((1, a2 * cv.c, 1, t), (a2 * cv.k, cv.c, 1, 1))
    attrs = Attrs(stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=a2, bias=False)
    return Problem("conv2d", problem.device, shapes, problem.dtypes[:2], tuple(c_strides(s) for s in shapes), attrs,
                   (1, a2 * cv.k, 1, t), problem.dtype)


# -- cost models --------------------------------------------------------------------------------------

#: Fraction of the device's peak each kernel reached on the ResNet-50 layers (H200 runs 1-3, see
#: docs/notes-cuda-softmax-conv.md), per block tile; times the useful fraction of the launched
#: tiles and of the last wave. "gemm*" are cuBLAS (strided-batched), "cols" the im2col pass and
#: "transform" the Winograd transforms, as fractions of the memory bandwidth. With these, run 3
#: predicted 200 / 147 / 143 us for Winograd F(4x4) on layers 1 / 3 / 4 and measured 192 / 158 / 166.
SIMT_EFF = {(64, 128, 16, 3): 0.40, (64, 128, 8, 3): 0.38, (128, 128, 8, 2): 0.35, (64, 64, 8, 8): 0.27,
            (128, 64, 8, 4): 0.27}
MMA_EFF = {(128, 64): 0.105, (128, 128): 0.10, (64, 128): 0.09, (64, 64): 0.08}
# gemm32 / gemm16: the 1x1 layer (32,256,56,64) through one strided-batched cuBLAS call, timed by
# `opruntime bench --suite gpu --kernels` on an H100 (docs/data/h100-cuda-tuned-3.json): 93 us fp32
# (35 TFLOP/s, 0.53 of the fp32 peak) and 30 us fp16 (110 TFLOP/s, 0.11 of the dense fp16 peak).
# Through cupy.matmul, which broadcast the shared weight with ~200 us of host work, they had been
# 0.23 and 0.013.
EFFICIENCY = {"depthwise": 0.5, "gemm32": 0.5, "gemm16": 0.11, "cols": 0.3, "transform": 0.6}


def _fill(cv: Conv, bm: int, bn: int, sms: int) -> float:
    """Useful fraction of the launched tiles: edge waste in M and N, and the last partial wave
    (counting a wave as one block per SM: more resident blocks share the SM's issue slots)."""
    tm, tn = -(-cv.kg // bm), -(-cv.npq // bn)
    useful = (cv.kg / (tm * bm)) * (cv.npq / (tn * bn))
    waves = tm * tn * cv.groups / sms
    return useful * (waves / math.ceil(waves) if waves < 4 else 1.0)


def _blocks_per_sm(kind: str, cfg: Mapping[str, Any], dtype: str) -> int:
    return 1 if dtype == "float64" else cfg["minb"]


def _figures(problem: Problem) -> tuple[float, float, float, int]:
    prov = provider(cc.device_id(problem.device))
    f32, f16, bw = prov.figures()
    return f32 / (2 if problem.dtype == "float64" else 1), f16, bw, prov.sm_count


def _cost(kind: str) -> Callable[[Problem, Mapping[str, Any]], float]:
    def cost(problem: Problem, config: Mapping[str, Any]) -> float:
        cv = Conv(problem)
        peak, f16, bw, sms = _figures(problem)
        isz = itemsize(problem.dtype)
        io = (cv.x_extent() + cv.k * cv.crs + math.prod(problem.out_shape)) * isz
        if kind == "simt":
            tile = (config["bm"], config["bn"])
            eff = SIMT_EFF[(*tile, config["bk"], config["minb"])] * _fill(cv, *tile, sms)
            return max(cv.flops / (peak * eff), io / bw) + LAUNCH_S
        if kind == "mma":
            eff = MMA_EFF[(config["bm"], config["bn"])] * _fill(cv, config["bm"], config["bn"], sms)
            return max(cv.flops / (f16 * eff), io / bw) + LAUNCH_S
        if kind.startswith("winograd"):
            m = int(kind[-1])
            moved = (2 * (m + 2) ** 2 * (cv.c + cv.k) * _wino_tiles(cv, m)) * 4 + io  # V and M written, read back
            return (_cost("simt")(_wino_gemm(problem, m), config) + moved / (bw * EFFICIENCY["transform"])
                    + 3 * LAUNCH_S)
        if kind == "depthwise":
            return max(cv.flops / (peak * 0.25), io / (bw * EFFICIENCY["depthwise"])) + LAUNCH_S
        # vendor: the column buffer (with the bias row) written and read back, then the GEMM
        rows = cv.crs + cv.has_bias
        cols = 0 if _pointwise(cv) else cv.n * cv.groups * rows * cv.p * cv.q * isz
        gemm = cv.flops / ((f16 * EFFICIENCY["gemm16"]) if problem.dtype in HALVES else peak * EFFICIENCY["gemm32"])
        return max(gemm, io / bw) + 2 * cols / (bw * EFFICIENCY["cols"]) + 2 * LAUNCH_S

    return cost


def _configs(kind: str) -> Callable[[Problem], list[Mapping[str, Any]]]:
    table = MMA_CONFIGS if kind == "mma" else SIMT_CONFIGS
    cost = _cost(kind)

    def config_for(problem: Problem) -> list[Mapping[str, Any]]:
        return sorted(table, key=lambda c: cost(problem, c))

    return config_for


# -- running ------------------------------------------------------------------------------------------


def _run(kind: str) -> Callable[..., Any]:
    build = {"simt": _build_igemm, "mma": _build_igemm, "winograd2": _build_winograd, "winograd4": _build_winograd,
             "depthwise": _build_depthwise, "vendor": _build_vendor}[kind]

    tag = f"conv2d.{kind}"

    def run(problem: Problem, config: Mapping[str, Any], x: Any, w: Any, bias: Any = None) -> Any:
        return per_problem(tag, problem, config, lambda: build(kind, problem, config))(x, w, bias)

    run.__name__ = f"conv2d_{kind}"
    return run


def _operands(cv: Conv, need_aligned_w: bool = False) -> Callable[[Any, Any], tuple[Any, Any]]:
    """Make the weight (and bias) contiguous where the problem says they are not."""
    import cupy

    def fix(w: Any, b: Any) -> tuple[Any, Any]:
        if not cv.w_contig or (need_aligned_w and w.data.ptr & 15):
            w = cupy.array(w, order="C", copy=True)
        if b is not None and not cv.b_contig:
            b = cupy.ascontiguousarray(b)
        return w, b

    return fix


def _launcher(dev: int, fix: Callable[[Any, Any], tuple[Any, Any]], body: Callable[[Any, Any, Any], Any]) \
        -> Callable[[Any, Any, Any], Any]:
    """``launch(x, w, b)``: on device ``dev`` (made current when another one is), the weight and
    bias made as the kernel needs them (``fix``), then ``body(x, w, b) -> y``."""
    import cupy

    getdev = cupy.cuda.runtime.getDevice

    def launch(x: Any, w: Any, b: Any) -> Any:
        if getdev() != dev:
            with cupy.cuda.Device(dev):
                return launch(x, w, b)
        w, b = fix(w, b)
        return body(x, w, b)

    return launch


def _build_igemm(kind: str, problem: Problem, config: Mapping[str, Any]) -> Callable[..., Any]:
    import cupy

    cv, dev = Conv(problem), cc.device_id(problem.device)
    name = f"cupy.conv2d.igemm_{kind}"
    d = {"DTYPE": DTYPE_CODE[problem.dtype], "BM": config["bm"], "BN": config["bn"]}
    if kind == "simt":
        d.update(BK=config["bk"], MINB=_blocks_per_sm(kind, config, problem.dtype))
        fn = cc.get_function("conv_simt.cu", "conv_simt", d, dev, kernel=name)
        threads = config["bm"] * config["bn"] // 64
    else:
        d.update(WARPS_M=config["wm"], WARPS_N=config["wn"], AVEC=int(cv.crs % 8 == 0), MINB=config["minb"])
        fn = cc.get_function("conv_mma.cu", "conv_mma", d, dev, kernel=name)
        threads = 32 * config["wm"] * config["wn"]
    with cupy.cuda.Device(dev):
        tab = cupy.asarray(cv.table())
    params = cv.params()
    grid = (-(-cv.npq // config["bn"]), -(-cv.kg // config["bm"]), cv.groups)
    fix = _operands(cv, need_aligned_w=kind == "mma")
    shape = problem.out_shape

    def body(x: Any, w: Any, b: Any) -> Any:
        y = empty(shape, x.dtype, name)
        fn(grid, (threads,), (x, w, b, y, tab, params))
        return y

    return _launcher(dev, fix, body)


def _build_winograd(kind: str, problem: Problem, config: Mapping[str, Any]) -> Callable[..., Any]:

    cv, dev, m = Conv(problem), cc.device_id(problem.device), int(kind[-1])
    a2 = (m + 2) ** 2
    name = f"cupy.conv2d.winograd_f{m}x3"
    th, tw = -(-cv.p // m), -(-cv.q // m)
    tiles = cv.n * th * tw
    threads = 256
    d = {"DTYPE": DTYPE_CODE[problem.dtype], "THREADS": threads, "WINO_M": m}
    f_filter, f_input, f_output = (cc.get_function("conv_winograd.cu", f, d, dev, kernel=name)
                                   for f in ("wino_filter", "wino_input", "wino_output"))
    gemm = _build_igemm("simt", _wino_gemm(problem, m), config)  # the a2 products: one grouped GEMM
    params, fix, shape = cv.params(), _operands(cv), problem.out_shape
    kc, ct, kt = cv.k * cv.c, cv.c * tiles, cv.k * tiles
    dt = np.dtype(problem.dtype)

    def body(x: Any, w: Any, b: Any) -> Any:
        u = empty((a2 * cv.k, cv.c, 1, 1), dt, f"{name} filter transform")
        f_filter((-(-kc // threads),), (threads,), (w, u, kc))
        v = empty((1, a2 * cv.c, 1, tiles), dt, f"{name} input transform")
        f_input((-(-ct // threads),), (threads,), (x, v, params, tiles, th, tw, cv.c))
        mm = gemm(v, u, None)
        y = empty(shape, x.dtype, name)
        f_output((-(-kt // threads),), (threads,), (mm, b, y, params, tiles, th, tw))
        return y

    return _launcher(dev, fix, body)


def _build_depthwise(kind: str, problem: Problem, config: Mapping[str, Any]) -> Callable[..., Any]:

    cv, dev = Conv(problem), cc.device_id(problem.device)
    name = "cupy.conv2d.depthwise"
    total = math.prod(problem.out_shape)
    threads = config["threads"]
    small = cv.r <= 7 and cv.s <= 7  # unroll the taps of the usual kernel sizes
    d = {"DTYPE": DTYPE_CODE[problem.dtype], "THREADS": threads, "KH": cv.r if small else 0,
         "KW": cv.s if small else 0, "IDX": "int" if total < 2**30 else "long long"}
    fn = cc.get_function("conv_depthwise.cu", "conv_depthwise", d, dev, kernel=name)
    grid = min(-(-total // threads), 2**30 // threads if total < 2**30 else 1 << 20)
    params, fix, shape = cv.params(), _operands(cv), problem.out_shape

    def body(x: Any, w: Any, b: Any) -> Any:
        y = empty(shape, x.dtype, name)
        fn((grid,), (threads,), (x, w, b, y, params, total))
        return y

    return _launcher(dev, fix, body)


def _pointwise(cv: Conv) -> bool:
    """A 1x1, stride-1, unpadded convolution of a contiguous input without bias: a GEMM on the
    input itself (a bias needs the column buffer's row of ones)."""
    return (not cv.has_bias and cv.r == cv.s == 1 and cv.str_h == cv.str_w == 1 and cv.pad_t == cv.pad_l == 0
            and cv.p == cv.h and cv.q == cv.w and tuple(cv.sx) == c_strides((cv.n, cv.c, cv.h, cv.w)))


def _batched_gemm(dtype: str, n: int, g: int, kg: int, k: int, pq: int) -> Callable[[Any, Any, Any], None]:
    """``gemm(w, cols, y)``: ``y[i, gi] = w[gi] @ cols[i, gi]`` for every image i and group gi, with
    w (g, kg, k), cols (n, g, k, pq) and y (n, g * kg, pq) contiguous: one strided-batched cuBLAS
    call per group, the weight shared by the batch (stride 0). ``cupy.matmul`` broadcasts a
    shared operand with ~200 us of host work per call on the H100's host, more than the GEMM."""
    from cupy.cuda import cublas, device

    dt, compute = CUBLAS_TYPES[dtype]
    isz = itemsize(dtype)
    scale = np.float64 if dtype == "float64" else np.float32
    one, zero = np.ones(1, scale), np.zeros(1, scale)  # alpha and beta, read by cuBLAS from the host

    def gemm(w: Any, cols: Any, y: Any) -> None:
        handle = device.get_cublas_handle()
        alpha, beta = one.ctypes.data, zero.ctypes.data  # (naming the arrays here keeps them alive)
        a, b, c = cols.data.ptr, w.data.ptr, y.data.ptr
        for gi in range(g):  # column-major: y^T (pq x kg) = cols^T (pq x k) . w^T (k x kg)
            cublas.gemmStridedBatchedEx(handle, 0, 0, pq, kg, k, alpha, a + gi * k * pq * isz, dt, pq, g * k * pq,
                                        b + gi * kg * k * isz, dt, k, 0, beta, c + gi * kg * pq * isz, dt, pq,
                                        g * kg * pq, n, compute, -1)

    return gemm


def _build_vendor(kind: str, problem: Problem, config: Mapping[str, Any]) -> Callable[..., Any]:
    import cupy

    cv, dev = Conv(problem), cc.device_id(problem.device)
    name = "cupy.conv2d.im2col_cublas"
    n, g, kg, pq = cv.n, cv.groups, cv.kg, cv.p * cv.q
    shape = problem.out_shape
    fix = _operands(cv)
    if _pointwise(cv):
        pointwise = _batched_gemm(problem.dtype, n, g, kg, cv.cg, pq)

        def gemm(x: Any, w: Any, b: Any) -> Any:
            y = empty(shape, x.dtype, name)
            pointwise(w, x, y)
            return y

        return _launcher(dev, fix, gemm)
    threads = config["threads"]
    rows = cv.crs + cv.has_bias  # with a bias, a row of ones: see conv_im2col.cu
    total = n * g * rows * pq
    d = {"DTYPE": DTYPE_CODE[problem.dtype], "THREADS": threads, "IDX": "int" if total < 2**30 else "long long"}
    fn = cc.get_function("conv_im2col.cu", "conv_im2col", d, dev, kernel=name)
    grid = min(-(-total // threads), 2**30 // threads if total < 2**30 else 1 << 20)
    with cupy.cuda.Device(dev):
        tab = cupy.asarray(cv.table())
    params = cv.params()

    gemm = _batched_gemm(problem.dtype, n, g, kg, rows, pq)

    def body(x: Any, w: Any, b: Any) -> Any:
        cols = empty((n, g, rows, pq), x.dtype, f"{name} column buffer")
        fn((grid,), (threads,), (x, cols, tab, params, total, g, rows))
        y = empty(shape, x.dtype, name)
        wk = w.reshape(g, kg, cv.crs)
        if b is not None:
            wk = cupy.concatenate([wk, b.reshape(g, kg, 1)], axis=2)
        gemm(wk, cols, y)
        return y

    return _launcher(dev, fix, body)


def build_variants() -> list[tuple[str, dict]]:
    """(file, defines) that CI compiles (scripts/compile_cu.py): every tile config in float32 and
    float16, the other dtypes once, both weight-load widths of the tensor-core kernel."""
    out = []
    for cfg in SIMT_CONFIGS:
        for dt in ("float32", "float16"):
            out.append(("conv_simt.cu", {"DTYPE": DTYPE_CODE[dt], "BM": cfg["bm"], "BN": cfg["bn"], "BK": cfg["bk"],
                                         "MINB": cfg["minb"]}))
    out += [("conv_simt.cu", {"DTYPE": DTYPE_CODE[dt], "BM": 64, "BN": 64, "BK": 8, "MINB": 1})
            for dt in ("float64", "bfloat16")]
    for cfg in MMA_CONFIGS:
        for avec in (0, 1):
            out.append(("conv_mma.cu", {"DTYPE": 1, "BM": cfg["bm"], "BN": cfg["bn"], "WARPS_M": cfg["wm"],
                                        "WARPS_N": cfg["wn"], "AVEC": avec, "MINB": cfg["minb"]}))
    out.append(("conv_mma.cu", {"DTYPE": 2, "BM": 128, "BN": 128, "WARPS_M": 2, "WARPS_N": 4, "AVEC": 1, "MINB": 2}))
    for code in DTYPE_CODE.values():
        out.append(("conv_depthwise.cu", {"DTYPE": code, "THREADS": 256, "KH": 3, "KW": 3, "IDX": "int"}))
        out.append(("conv_im2col.cu", {"DTYPE": code, "THREADS": 256, "IDX": "long long"}))
    out.append(("conv_depthwise.cu", {"DTYPE": 0, "THREADS": 256, "KH": 0, "KW": 0, "IDX": "long long"}))
    out += [("conv_winograd.cu", {"DTYPE": code, "THREADS": 256, "WINO_M": m}) for code in (0, 3) for m in (2, 4)]
    return out
