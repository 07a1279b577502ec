"""How the CUDA conv2d kernels of :mod:`opruntime_cupy.conv` see a problem and launch on it.

:class:`Conv` is the kernels' view of one problem (sizes, the ``ConvParams`` block, the offset
table of the implicit GEMM's gather); :func:`preparer` makes each kernel's ``prepare(problem,
config)``, which compiles what the kernel needs and lays out its launches once and returns
``launch(x, w, b=None) -> y``, the function the runtime keeps in its one launch cache. The table
of kernels, their configs, ``supports`` and cost models are in ``conv.py``, which imports this
module (never the other way).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from opruntime.kernels import Attrs, Problem, c_strides, itemsize

from . import compile as cc
from .epilogue import ACT
from .memory import empty

DTYPE_CODE = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3}
#: cudaDataType and cuBLAS compute type of each dtype: fp32 accumulation (fp64 for fp64), no TF32
CUBLAS_TYPES = {"float32": (0, 68), "float64": (1, 70), "float16": (2, 68), "bfloat16": (14, 68)}
TAB_INVALID = 1 << 29


# -- the problem as the kernels see it --------------------------------------------------------------


INT_MAX = 2**31 - 1


def int32_ok(cv: Conv, problem: Problem) -> bool:
    """Every extent and count a convolution's 32-bit index arithmetic meets is below 2**31 (the own
    kernels index in int; cuDNN's engines crashed the context on a padding of 2**40)."""
    return (cv.x_extent() < INT_MAX and math.prod(problem.out_shape) < INT_MAX and cv.npq < INT_MAX
            and cv.groups <= 65535 and all(abs(v) < 2**28 for v in cv.sx))


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


def wino_tiles(cv: Conv, m: int) -> int:
    """Output tiles of m x m pixels over the batch (Winograd F(m x m, 3 x 3))."""
    return cv.n * -(-cv.p // m) * -(-cv.q // m)


def wino_gemm(problem: Problem, m: int) -> Problem:
    """The (m+2)^2 Winograd products as a grouped 1x1 convolution: (1, a2 C, 1, T) x (a2 K, C, 1, 1)."""
    cv, a2 = Conv(problem), (m + 2) ** 2
    t = wino_tiles(cv, m)
    shapes = ((1, a2 * cv.c, 1, t), (a2 * cv.k, cv.c, 1, 1))
    attrs = Attrs(stride=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=a2, bias=False)
    return Problem("conv2d", problem.device, shapes, problem.dtypes[:2], tuple(c_strides(s) for s in shapes), attrs,
                   (1, a2 * cv.k, 1, t), problem.dtype)


def act_define(problem: Problem) -> dict[str, int]:
    """The ACT define of the problem's activation (conv_types.cuh), none without one."""
    act = problem.attrs.get("activation")
    return {} if act is None else {"ACT": ACT[act]}


def _blocks_per_sm(kind: str, cfg: Mapping[str, Any], dtype: str) -> int:
    """The MINB the registers are cut for (float64 needs twice the registers: one block)."""
    return 1 if dtype == "float64" else cfg["minb"]


# -- running ------------------------------------------------------------------------------------------


def preparer(kind: str) -> Callable[[Problem, Mapping[str, Any]], Callable[..., Any]]:
    """The ``prepare(problem, config) -> launch(x, w, b=None)`` of one kernel (``simt``, ``mma``,
    ``tma``, ``winograd2``, ``winograd4``, ``depthwise`` or ``vendor``)."""
    build = {"simt": _build_igemm, "mma": _build_igemm, "winograd2": _build_winograd, "winograd4": _build_winograd,
             "depthwise": _build_depthwise, "vendor": _build_vendor, "tma": _build_tma}[kind]

    def prepare(problem: Problem, config: Mapping[str, Any]) -> Callable[..., Any]:
        return build(kind, problem, config)

    prepare.__name__ = f"prepare_conv2d_{kind}"
    return prepare


def _operands(cv: Conv, need_aligned_w: bool = False, weight: bool = True) -> Callable[[Any, Any], tuple[Any, Any]]:
    """Make the weight (unless not ``weight``: the kernel copies it itself) and the bias
    contiguous where the problem says they are not."""
    import cupy

    def fix(w: Any, b: Any) -> tuple[Any, Any]:
        if weight and (not cv.w_contig or (need_aligned_w and w.data.ptr & 15)):
            w = cupy.array(w, order="C", copy=True)
        if b is not None and not cv.b_contig:
            b = cupy.ascontiguousarray(b)
        return w, b

    return fix


def _launcher(dev: int, fix: Callable[[Any, Any], tuple[Any, Any]], body: Callable[[Any, Any, Any], Any]) \
        -> Callable[..., Any]:
    """``launch(x, w, b=None)`` (the operands as the runtime passes them: no bias, no third
    array): on device ``dev`` (made current when another one is), the weight and bias made as the
    kernel needs them (``fix``), then ``body(x, w, b) -> y``."""
    import cupy

    getdev = cupy.cuda.runtime.getDevice

    def launch(x: Any, w: Any, b: Any = None) -> Any:
        if getdev() != dev:
            with cupy.cuda.Device(dev):
                return launch(x, w, b)
        w, b = fix(w, b)
        return body(x, w, b)

    return launch


def _build_igemm(kind: str, problem: Problem, config: Mapping[str, Any]) -> Callable[..., Any]:
    import cupy

    cv, dev = Conv(problem), problem.device.provider.index
    name = f"cupy.conv2d.igemm_{kind}"
    d = {"DTYPE": DTYPE_CODE[problem.dtype], "BM": config["bm"], "BN": config["bn"], **act_define(problem)}
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


# -- the TMA implicit GEMM (matmul_tma.cu, CONV 1) -----------------------------------------------------

#: ConvGemm of matmul_tma.cu, passed by value
CONV_GEMM = ("k", "npq", "pq", "q", "str_h", "str_w", "pad_t", "pad_l", "dil_h", "dil_w", "s", "chunks", "ktiles")
CHUNK = 64  # input channels a k step takes (one 128-byte swizzled row)


def channels_last(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether an NCHW / KCRS operand of this shape is a contiguous channels-last array seen
    through its strides (an NHWC array passed as ``x.transpose(0, 3, 1, 2)``), with channel rows of
    16-byte multiples: what the tensor maps read in place. Exactly that layout, so that the copy a
    base off 16 bytes gets (contiguous channels-last) has the strides the plan's maps were made for.
    Dims of size 1 may have any stride."""
    n, c, h, w = shape
    want = (h * w * c, 1, w * c, c)
    return c % 8 == 0 and all(d == 1 or st == wt for d, st, wt in zip(shape, strides, want))


def tma_corners(cv: Conv) -> tuple[tuple[int, int], tuple[int, int]]:
    """The im2col map's bounding box (W first, then H): the input pixels where the filter windows
    of the output positions start, [-pad, dim + upper) per dim, stepped by the stride."""
    lower = (-cv.pad_l, -cv.pad_t)
    upper = ((cv.q - 1) * cv.str_w + 1 - cv.w - cv.pad_l, (cv.p - 1) * cv.str_h + 1 - cv.h - cv.pad_t)
    return lower, upper


def tma_pointwise(cv: Conv) -> bool:
    """Whether the TMA kernel runs this problem as a per-image GEMM on the input itself (``CONV 2``):
    a 1x1, stride-1, unpadded convolution of a contiguous NCHW input whose rows of H*W pixels
    are 16-byte multiples."""
    return (cv.r == cv.s == 1 and cv.str_h == cv.str_w == 1 and cv.pad_t == cv.pad_l == 0 and cv.p == cv.h
            and cv.q == cv.w and tuple(cv.sx) == c_strides((cv.n, cv.c, cv.h, cv.w)) and (cv.h * cv.w) % 8 == 0)


def tma_tiles(cv: Conv, bm: int, bn: int) -> int:
    """The C tiles the TMA kernel walks: per image in the pointwise mode (none spans two)."""
    if tma_pointwise(cv):
        return cv.n * -(-cv.k // bm) * -(-(cv.h * cv.w) // bn)
    return -(-cv.k // bm) * -(-cv.npq // bn)


def tma_copied(cv: Conv, problem: Problem) -> int:
    """Elements the TMA kernel's call copies to channels-last first: the input unless it already
    is (the pointwise mode reads NCHW), the weight unless it already is."""
    ws = problem.strides[1] or c_strides(problem.shapes[1])
    x = 0 if tma_pointwise(cv) or channels_last((cv.n, cv.c, cv.h, cv.w), tuple(cv.sx)) else cv.n * cv.c * cv.h * cv.w
    return x + (0 if channels_last(problem.shapes[1], tuple(ws)) else cv.k * cv.crs)


def tma_conv_gemm(cv: Conv) -> np.void:
    """The ``ConvGemm`` block of a problem."""
    chunks = -(-cv.cg // CHUNK)
    vals = (cv.k, cv.npq, cv.p * cv.q, cv.q, cv.str_h, cv.str_w, cv.pad_t, cv.pad_l, cv.dil_h, cv.dil_w, cv.s,
            chunks, cv.r * cv.s * chunks)
    return np.array(vals, np.dtype([(f, "<i4") for f in CONV_GEMM]))[()]


def _build_tma(kind: str, problem: Problem, config: Mapping[str, Any]) -> Callable[..., Any]:
    """conv2d on ``matmul_tma.cu``'s warp-specialised GEMM: the input as NHWC (copied so by
    ``layout.cu`` unless it already is), the weight as (K, R*S, C), the NCHW output written by the
    kernel; a pointwise convolution (:func:`tma_pointwise`) as a GEMM per image on the NCHW input
    itself. A call's three tensor maps are one encoded map each with the call's address written in
    (:class:`tma.TileMaps`), launched through one parameter block (:class:`compile.FastLaunch`)."""
    import ctypes

    import cupy

    from . import layout, tma
    from .matmul_launch import tma_smem

    cv, dev, dt = Conv(problem), problem.device.provider.index, problem.dtype
    name = "cupy.conv2d.igemm_tma"
    bm, bn, st = config["bm"], config["bn"], config["stages"]
    pq = cv.p * cv.q
    store_tma = int(pq % 8 == 0)  # the output map's rows (P*Q pixels) are 16-byte multiples
    pointwise = tma_pointwise(cv)
    d = {"CONV": 2 if pointwise else 1, "BM": bm, "BN": bn, "STAGES": st, "STORE_TMA": store_tma, "BF16": int(dt == "bfloat16"),
         "BIAS": int(cv.has_bias), **act_define(problem)}
    fn = cc.get_function("matmul_tma.cu", "hgemm_tma", d, dev, kernel=name, arch="90a")
    smem = tma_smem({"BM": bm, "BN": bn, "STAGES": st, "BK": CHUNK}, store_tma)
    with cupy.cuda.Device(dev):
        fn.max_dynamic_shared_size_bytes = smem
    tiles = tma_tiles(cv, bm, bn)
    grid, block = (min(tiles, problem.device.provider.sm_count),), ((bm // 64 + 1) * 128,)
    c, isz = cv.c, 2
    # the input: used in place when channels-last already (or pointwise), else copied to NHWC each call
    x_direct = pointwise or channels_last((cv.n, c, cv.h, cv.w), tuple(cv.sx))
    to_nhwc = None if x_direct else layout.to_channels_last(isz, dev, (cv.n, c, cv.h, cv.w), tuple(cv.sx))
    ws = problem.strides[1] or c_strides(problem.shapes[1])
    # the weight: in place when it is channels-last already (a 1x1's KC11 weight is), else copied
    w_direct = channels_last(problem.shapes[1], tuple(ws))
    to_krsc = None if w_direct else layout.to_channels_last(isz, dev, (cv.k, c, cv.r, cv.s), tuple(ws))
    # every map below is of the contiguous layout: NCHW (pointwise) or channels-last
    if pointwise:  # the weight as a GEMM's A (C, K); each image's X as an n-contiguous B (H*W, C)
        maps_w = tma.tiles(dt, (c, cv.k), (c * isz,), (CHUNK, bm))
        maps_x = tma.tiles(dt, (pq, c, cv.n), (pq * isz, c * pq * isz), (64, CHUNK, 1))
    else:
        lower, upper = tma_corners(cv)
        maps_w = tma.tiles(dt, (c, cv.r * cv.s, cv.k), (c * isz, cv.r * cv.s * c * isz), (CHUNK, 1, bm))
        maps_x = tma.TileMaps(lambda ptr: tma.im2col_map(ptr, dt, (c, cv.w, cv.h, cv.n),
                                                         (c * isz, cv.w * c * isz, cv.h * cv.w * c * isz), lower,
                                                         upper, CHUNK, bn, (1, cv.str_w, cv.str_h, 1)),
                              f"im2col {problem}")
    maps_y = tma.tiles(dt, (pq, cv.k, cv.n), (pq * isz, cv.k * pq * isz), (64, 64, 1)) if store_tma else maps_w
    params = tma_conv_gemm(cv)
    has_bias = cv.has_bias
    quick = None
    if maps_w.patched and maps_x.patched and maps_y.patched:
        words = [(ctypes.c_uint64 * 16)(*m.words.tolist()) for m in (maps_w, maps_x, maps_y)]
        block_params = (ctypes.c_int32 * len(CONV_GEMM))(*params.tolist())
        quick = cc.FastLaunch(fn, grid, block, pointers=1 + has_bias, scalars=[*words, block_params],
                              shared_mem=smem, patches=[(i, m.slot) for i, m in enumerate((maps_w, maps_x, maps_y))])
    shape, xshape, wshape = problem.out_shape, (cv.n, cv.h, cv.w, c), (cv.k, cv.r, cv.s, c)

    def body(x: Any, w: Any, b: Any) -> Any:
        px, pw = x.data.ptr, w.data.ptr
        if pointwise and px & 15:  # a view's offset: an aligned copy (contiguous, as the plan's strides)
            xt = x.copy()
            px = xt.data.ptr
        elif to_nhwc is not None or px & 15:
            xt = empty(xshape, x.dtype, f"{name} channels-last input")
            if to_nhwc is None:  # in place but off 16 bytes (a view's offset): a contiguous copy
                xt[...] = x.transpose(0, 2, 3, 1)
            else:
                to_nhwc(px, xt.data.ptr)
            px = xt.data.ptr  # xt lives to the return: the pool may reuse it after (stream-ordered)
        if to_krsc is not None or pw & 15:
            wt = empty(wshape, w.dtype, f"{name} channels-last weight")
            if to_krsc is None:
                wt[...] = w.transpose(0, 2, 3, 1)
            else:
                to_krsc(pw, wt.data.ptr)
            pw = wt.data.ptr
        y = empty(shape, x.dtype, name)
        if quick is not None:
            quick(*((y.data.ptr, b.data.ptr) if has_bias else (y.data.ptr,)), pw, px, y.data.ptr)
        else:
            maps = (maps_w(pw), maps_x(px), maps_y(y.data.ptr), params)
            fn(grid, block, (y, b, *maps) if has_bias else (y, *maps), shared_mem=smem)
        return y

    return _launcher(dev, _operands(cv, weight=False), body)


def _build_winograd(kind: str, problem: Problem, config: Mapping[str, Any]) -> Callable[..., Any]:
    cv, dev, m = Conv(problem), problem.device.provider.index, int(kind[-1])
    a2 = (m + 2) ** 2
    name = f"cupy.conv2d.winograd_f{m}x3"
    th, tw = -(-cv.p // m), -(-cv.q // m)
    tiles = cv.n * th * tw
    threads = 256
    d = {"DTYPE": DTYPE_CODE[problem.dtype], "THREADS": threads, "WINO_M": m, **act_define(problem)}
    f_filter, f_input, f_output = (cc.get_function("conv_winograd.cu", f, d, dev, kernel=name)
                                   for f in ("wino_filter", "wino_input", "wino_output"))
    gemm = _build_igemm("simt", wino_gemm(problem, m), config)  # the a2 products: one grouped GEMM
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
    cv, dev = Conv(problem), problem.device.provider.index
    name = "cupy.conv2d.depthwise"
    total = math.prod(problem.out_shape)
    threads = config["threads"]
    small = cv.r <= 7 and cv.s <= 7  # unroll the taps of the usual kernel sizes
    d = {"DTYPE": DTYPE_CODE[problem.dtype], "THREADS": threads, "KH": cv.r if small else 0,
         "KW": cv.s if small else 0, "IDX": "int" if total < 2**30 else "long long", **act_define(problem)}
    fn = cc.get_function("conv_depthwise.cu", "conv_depthwise", d, dev, kernel=name)
    grid = min(-(-total // threads), 2**30 // threads if total < 2**30 else 1 << 20)
    params, fix, shape = cv.params(), _operands(cv), problem.out_shape

    def body(x: Any, w: Any, b: Any) -> Any:
        y = empty(shape, x.dtype, name)
        fn((grid,), (threads,), (x, w, b, y, params, total))
        return y

    return _launcher(dev, fix, body)


def pointwise(cv: Conv) -> bool:
    """A 1x1, stride-1, unpadded convolution of a contiguous input without bias: a GEMM on the
    input itself (a bias needs the column buffer's row of ones)."""
    return (not cv.has_bias and cv.r == cv.s == 1 and cv.str_h == cv.str_w == 1 and cv.pad_t == cv.pad_l == 0
            and cv.p == cv.h and cv.q == cv.w and tuple(cv.sx) == c_strides((cv.n, cv.c, cv.h, cv.w)))


def _batched_gemm(dtype: str, n: int, g: int, kg: int, k: int, pq: int) -> Callable[[Any, Any, Any], None]:
    """``gemm(w, cols, y)``: ``y[i, gi] = w[gi] @ cols[i, gi]`` for every image i and group gi, with
    w (g, kg, k), cols (n, g, k, pq) and y (n, g * kg, pq) contiguous: one strided-batched cuBLAS
    call per group, the weight shared by the batch (stride 0). ``cupy.matmul`` broadcasts a
    shared operand with ~200 us of host work per call on the H100's host, more than the GEMM."""
    from cupy.cuda import cublas, device, stream

    dt, compute = CUBLAS_TYPES[dtype]
    isz = itemsize(dtype)
    scale = np.float64 if dtype == "float64" else np.float32
    one, zero = np.ones(1, scale), np.zeros(1, scale)  # alpha and beta, read by cuBLAS from the host

    def gemm(w: Any, cols: Any, y: Any) -> None:
        handle = device.get_cublas_handle()
        cublas.setStream(handle, stream.get_current_stream().ptr)  # CuPy's shared handle: its last stream
        alpha, beta = one.ctypes.data, zero.ctypes.data  # (naming the arrays here keeps them alive)
        a, b, c = cols.data.ptr, w.data.ptr, y.data.ptr
        for gi in range(g):  # column-major: y^T (pq x kg) = cols^T (pq x k) . w^T (k x kg)
            cublas.gemmStridedBatchedEx(handle, 0, 0, pq, kg, k, alpha, a + gi * k * pq * isz, dt, pq, g * k * pq,
                                        b + gi * kg * k * isz, dt, k, 0, beta, c + gi * kg * pq * isz, dt, pq,
                                        g * kg * pq, n, compute, -1)

    return gemm


def _build_vendor(kind: str, problem: Problem, config: Mapping[str, Any]) -> Callable[..., Any]:
    import cupy

    cv, dev = Conv(problem), problem.device.provider.index
    name = "cupy.conv2d.im2col_cublas"
    n, g, kg, pq = cv.n, cv.groups, cv.kg, cv.p * cv.q
    shape = problem.out_shape
    fix = _operands(cv)
    act = problem.attrs.get("activation")
    activate = None
    if act is not None:  # cuBLAS has no epilogue here: one in-place pass (linear.cu) after the GEMM
        from .linear import epilogue_pass

        activate = epilogue_pass(problem, shape, pq, cv.k, False, act, name)
    if pointwise(cv):
        on_input = _batched_gemm(problem.dtype, n, g, kg, cv.cg, pq)

        def gemm(x: Any, w: Any, b: Any) -> Any:
            y = empty(shape, x.dtype, name)
            on_input(w, x, y)
            if activate is not None:
                activate(y, None)
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
        if activate is not None:
            activate(y, None)
        return y

    return _launcher(dev, fix, body)
