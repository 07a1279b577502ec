"""The CUDA backend's softmax / log_softmax and conv2d kernels, each kernel x config directly.

CPU part (runs everywhere): the layout logic that decides which softmax family may run, and a
NumPy emulation of the implicit GEMM's gather (offset table, pixel bases, bounds), checked
against the float64 reference, so the index arithmetic the CUDA kernels share is tested in CI.

GPU part (``-m gpu``, skipped with the reason without CuPy or a CUDA device): every kernel and
every config against the float64 reference, at odd sizes, every axis, rows of -inf,
non-contiguous and misaligned inputs, and every conv attribute combination.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from cupy_stand_in import StandInDevice
from opruntime_cupy import conv, softmax

from opruntime.kernels import Attrs, Problem
from opruntime.ops import OPS
from opruntime.testing.numerics import TOLERANCE, rel_err

STAND_IN = StandInDevice()


def make_problem(op: str, arrays: list, dtype: str, device=STAND_IN, **attrs) -> Problem:
    """The Problem the frontend would build for these (host or device) arrays on ``device`` (an
    ``opr.Device`` for the GPU tests)."""
    shapes = [tuple(a.shape) for a in arrays]
    norm = OPS[op].normalize(shapes, dict(attrs))
    strides = tuple(tuple(s // a.dtype.itemsize for s in a.strides) for a in arrays)
    return Problem(op, device, norm.shapes, (dtype,) * len(arrays), strides, norm.attrs, norm.out_shape, dtype)


# -- CPU: layouts ---------------------------------------------------------------------------------


def softmax_problem(shape, strides, axis) -> Problem:
    return Problem("softmax", STAND_IN, (shape,), ("float32",), (strides,), Attrs(axis=axis), shape, "float32")


def test_layout_rows_and_columns():
    assert softmax.layout(softmax_problem((8, 16), (16, 1), 1)) == (8, 16, 1, 16, 1, 0)
    assert softmax.layout(softmax_problem((8, 16), (16, 1), 0)) == (1, 8, 16, 0, 16, 1)
    # a column slice x[:, :10] of an (8, 16) array: rows of 10 with row stride 16
    assert softmax._rows(softmax_problem((8, 10), (16, 1), 1)) == (8, 10, 16)
    # a transposed view: the reduced axis has stride 8, so no row family applies
    assert softmax._rows(softmax_problem((16, 8), (1, 16), 1)) is None
    # outer dims (2, 3) of a (2, 6, 5) array sliced to (2, 3, 5) do not collapse
    assert softmax.layout(softmax_problem((2, 3, 5), (30, 5, 1), 2)) is None
    # size-1 dims never block collapsing
    assert softmax._rows(softmax_problem((4, 1, 3, 7), (21, 99, 7, 1), 3)) == (12, 7, 7)


def test_softmax_families_cover_every_row_length():
    for cols in (1, 16, 1000, 1024, 1025, 4096, 32768, 40000):
        p = softmax_problem((3, cols), (cols, 1), 1)
        usable = [k.name.split(".")[-1] for k in softmax.kernels()
                  if k.op == "softmax" and _supports_here(k, p)]
        assert "online" in usable and "strided" in usable
        assert ("warp" in usable) == (cols <= 1024)
        assert ("block" in usable) == (256 < cols <= 32768), (cols, usable)
        for k in softmax.kernels():
            if k.op == "softmax" and _supports_here(k, p):
                assert list(k.candidates(p)), k.name


def _supports_here(kernel, problem) -> bool:
    if kernel.name.endswith("cluster"):
        return False  # needs the device's compute capability
    return kernel.supports(problem)


def test_every_kernel_is_prepared_and_costed_from_the_provider():
    """Compiled kernels give ``prepare`` only (the runtime keeps the launchers); the cost models
    read the device's figures from ``problem.device.provider`` (the stand-in's name is no
    ``cuda:N``), and rank the configs."""
    kernels = softmax.kernels() + conv.kernels()
    assert all(k.prepare is not None and k.run is None and k.name.startswith("cupy.") for k in kernels)
    p = softmax_problem((64, 4096), (4096, 1), 1)
    for k in softmax.kernels():
        if _supports_here(k, p):
            costs = [k.estimate(p, c) for c in k.candidates(p)]
            assert costs and all(0 < c < 1e-3 for c in costs), k.name
    x, w = np.zeros((8, 64, 28, 28), np.float32), np.zeros((64, 64, 3, 3), np.float32)
    pc = make_problem("conv2d", [x, w], "float32", padding=1)
    for k in conv.kernels():
        if "float32" in k.dtypes and k.supports(pc):
            costs = [k.estimate(pc, c) for c in k.candidates(pc)]
            assert costs == sorted(costs) and all(0 < c < 1e-2 for c in costs), k.name


def test_tensor_core_conv_tiles_rank_for_short_reductions():
    """The fp16 7x7 stem (C R S = 147) ranks the 64x64 tile first (measured on the H100: 181 us,
    64x128 220 us), while the 3x3 layer of 64 channels (C R S = 576) keeps the ranking fitted
    there, 64x128 before 64x64 (101 against 105 us)."""
    mma = next(k for k in conv.kernels() if k.name == "cupy.conv2d.igemm_mma")
    stem = make_problem("conv2d", [np.zeros((32, 3, 224, 224), np.float16), np.zeros((64, 3, 7, 7), np.float16)],
                        "float16", stride=2, padding=3)
    first = mma.candidates(stem)[0]
    assert (first["bm"], first["bn"]) == (64, 64)
    layer = make_problem("conv2d", [np.zeros((32, 64, 56, 56), np.float16), np.zeros((64, 64, 3, 3), np.float16)],
                         "float16", padding=1)
    ranked = [(c["bm"], c["bn"]) for c in mma.candidates(layer)]
    assert ranked.index((64, 128)) < ranked.index((64, 64))


def test_simt_conv_tiles_rank_for_the_stem_and_keep_winograds_gemm():
    """The fp32 7x7 stem ranks the SIMT kernel's 64x64 tile first (H100: 318 us, 64x128 349 us);
    Winograd's products (1x1 GEMMs of 64 channels) keep the SIMT_EFF ranking, 64x128 first (225
    against 256 us for 64x64 on the 64-channel 3x3 layer)."""
    simt = next(k for k in conv.kernels() if k.name == "cupy.conv2d.igemm_simt")
    stem = make_problem("conv2d", [np.zeros((32, 3, 224, 224), np.float32), np.zeros((64, 3, 7, 7), np.float32)],
                        "float32", stride=2, padding=3)
    first = simt.candidates(stem)[0]
    assert (first["bm"], first["bn"]) == (64, 64)
    wino = next(k for k in conv.kernels() if k.name == "cupy.conv2d.winograd_f4x3")
    layer = make_problem("conv2d", [np.zeros((32, 64, 56, 56), np.float32), np.zeros((64, 64, 3, 3), np.float32)],
                         "float32", padding=1)
    first = wino.candidates(layer)[0]
    assert (first["bm"], first["bn"]) == (64, 128)


# -- CPU: the implicit GEMM's gather, emulated --------------------------------------------------------

CONV_CASES = [
    # (x shape, w shape, attrs)
    ((2, 3, 9, 11), (4, 3, 3, 3), {}),
    ((2, 3, 9, 11), (5, 3, 3, 3), {"stride": 2, "padding": 1}),
    ((1, 4, 10, 7), (6, 4, 3, 2), {"stride": (2, 1), "padding": (1, 2), "dilation": (1, 2)}),
    ((2, 4, 8, 8), (4, 2, 3, 3), {"groups": 2, "padding": "same"}),
    ((2, 4, 8, 9), (5, 4, 2, 4), {"padding": "same", "dilation": 2}),  # 4-sided: (1, 1, 3, 3) / (1,2,1,2)
    ((1, 3, 9, 8), (3, 3, 4, 4), {"padding": "same"}),  # even kernel: top 1, bottom 2, left 1, right 2
    ((2, 6, 7, 7), (6, 1, 3, 3), {"groups": 6, "padding": 1}),  # depthwise
    ((1, 3, 7, 8), (6, 1, 3, 3), {"groups": 3, "stride": 2, "dilation": 2, "padding": 2}),  # multiplier 2
    ((2, 8, 5, 6), (4, 8, 1, 1), {}),  # pointwise
    ((2, 8, 9, 6), (4, 2, 1, 1), {"groups": 4, "stride": 2}),  # grouped pointwise, strided
    ((1, 3, 13, 17), (7, 3, 5, 5), {"stride": 3, "padding": 2}),
    ((1, 1, 1, 1), (1, 1, 1, 1), {}),
    ((3, 5, 23, 19), (70, 5, 3, 3), {"padding": 1}),  # more than one tile of output channels / pixels
]
CASE_IDS = [f"{x}*{w}-{a}" for x, w, a in CONV_CASES]


def emulate_igemm(problem: Problem, x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    """The implicit GEMM as the kernels compute it, in NumPy: the same table, bases and checks."""
    cv = conv.Conv(problem)
    tab = cv.table()
    flat = np.lib.stride_tricks.as_strided(x, (cv.x_extent(),), (x.dtype.itemsize,))  # x's memory
    pix = np.arange(cv.npq)
    img, pq = pix // (cv.p * cv.q), pix % (cv.p * cv.q)
    ih0, iw0 = (pq // cv.q) * cv.str_h - cv.pad_t, (pq % cv.q) * cv.str_w - cv.pad_l
    base = img * cv.sx[0] + ih0 * cv.sx[2] + iw0 * cv.sx[3]
    y = np.zeros(problem.out_shape)
    for g in range(cv.groups):
        t = tab[: -(-cv.crs // 8) * 8]  # a padded reduction, as the kernels run it
        ih, iw = ih0[None, :] + t[:, 1:2], iw0[None, :] + t[:, 2:3]
        ok = (ih >= 0) & (ih < cv.h) & (iw >= 0) & (iw < cv.w)
        off = np.where(ok, g * cv.cg * cv.sx[1] + base[None, :] + t[:, 0:1], 0)
        bmat = np.where(ok, flat[off], 0.0)  # (crs padded, npq)
        wg = np.zeros((cv.kg, t.shape[0]))
        wg[:, : cv.crs] = w.reshape(cv.k, cv.crs)[g * cv.kg:(g + 1) * cv.kg]
        out = wg @ bmat  # (kg, npq)
        y[:, g * cv.kg:(g + 1) * cv.kg] = out.reshape(cv.kg, cv.n, cv.p * cv.q).transpose(1, 0, 2).reshape(
            cv.n, cv.kg, cv.p, cv.q)
    if b is not None:
        y += b.reshape(1, -1, 1, 1)
    return y


@pytest.mark.parametrize("xs,ws,attrs", CONV_CASES, ids=CASE_IDS)
def test_igemm_gather_emulated(xs, ws, attrs):
    rng = np.random.default_rng()
    for view in ("contiguous", "transposed"):
        host = rng.standard_normal(xs)
        x = host if view == "contiguous" else np.ascontiguousarray(host.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
        w, b = rng.standard_normal(ws), rng.standard_normal(ws[0])
        p = make_problem("conv2d", [x, w, b], "float64", **attrs)
        got = emulate_igemm(p, x, w, b)
        assert rel_err(got, OPS["conv2d"].reference(host, w, b, **attrs)) < 1e-12


def test_conv_params_block_matches_the_struct():
    src = conv.cc.source("conv_types.cuh")
    body = src[src.index("struct ConvParams"):src.index("};", src.index("struct ConvParams"))]
    names = [n.strip() for line in body.splitlines()[1:] for n in line.split("//")[0].replace("int ", "").split(";")[0]
             .split(",") if n.strip()]
    assert tuple(names) == conv.Conv.FIELDS
    p = make_problem("conv2d", [np.zeros((2, 3, 9, 11)), np.zeros((4, 3, 3, 3))], "float32", padding=1)
    assert conv.Conv(p).params().dtype.itemsize == 4 * len(names)


# -- GPU ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cp():
    cupy = pytest.importorskip("cupy", reason="cupy not installed: the CUDA kernels cannot run")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no CUDA device")
    except Exception as exc:  # noqa: BLE001 - any CUDA failure here means: no device to test on
        pytest.skip(f"no CUDA device: {exc}")
    return cupy


@pytest.fixture(scope="module")
def cuda(cp):
    """The runtime's device ``cuda:0`` (a Problem carries the Device, not its name)."""
    import opruntime as opr

    return opr.Device("cuda:0")


def dtypes_here(cp) -> list[str]:
    from opruntime_cupy.memory import bfloat16

    return ["float32", "float16", "float64"] + (["bfloat16"] if bfloat16() is not None else [])


def np_dtype(dtype: str):
    if dtype == "bfloat16":
        from opruntime_cupy.memory import bfloat16

        return bfloat16()
    return np.dtype(dtype)


SOFTMAX_SHAPES = [  # (shape, axes)
    ((1,), (0,)), ((7,), (0,)), ((3, 1), (0, 1)), ((5, 33), (0, 1)), ((129, 1000), (1,)), ((17, 1024), (1,)),
    ((9, 1025), (1,)), ((3, 4097), (1,)), ((2, 8192), (1,)), ((2, 32768), (1,)), ((3, 40001), (1,)),
    ((4, 5, 3), (0, 1, 2)), ((6, 7, 9, 11), (0, 1, 2, 3)), ((33, 257), (0, 1)),
]


def softmax_inputs(cp, rng, shape, dtype):
    """Random rows, one row of -inf, one row with some -inf, as the given dtype on the device."""
    x = rng.standard_normal(shape) * 4
    if len(shape) >= 2 and shape[0] >= 3:
        x[1] = -np.inf
        x[2, ..., ::3] = -np.inf
    host = x.astype(np_dtype(dtype))
    return host, cp.asarray(host)


def views(cp, host, dev):
    """(name, host view, device view): contiguous, strided, transposed, misaligned, uncollapsible."""
    out = [("contiguous", host, dev)]
    if host.ndim >= 2 and host.shape[-1] > 2:
        out.append(("every-other-column", host[..., ::2], dev[..., ::2]))
        out.append(("offset-by-one", host[..., 1:], dev[..., 1:]))  # base address not 16-byte aligned
    if host.ndim >= 2:
        out.append(("transposed", host.swapaxes(-1, -2), dev.swapaxes(-1, -2)))
    if host.ndim >= 3 and host.shape[1] > 1:
        out.append(("uncollapsible", host[:, : host.shape[1] - 1], dev[:, : host.shape[1] - 1]))
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("family", ["warp", "block", "cluster", "online", "strided"])
def test_softmax_every_config(cp, cuda, op, family):
    rng = np.random.default_rng()
    kernel = next(k for k in softmax.kernels() if k.name == f"cupy.{op}.{family}")
    ran, failures = 0, []
    for dtype in dtypes_here(cp):
        for shape, axes in SOFTMAX_SHAPES:
            if dtype != "float32" and math.prod(shape) > 300_000:
                continue
            host, dev = softmax_inputs(cp, rng, shape, dtype)
            for name, hv, dv in views(cp, host, dev) if dtype in ("float32", "float16") else [("contiguous", host, dev)]:
                for axis in axes:
                    if axis >= hv.ndim:
                        continue
                    p = make_problem(op, [dv], dtype, cuda, axis=axis)
                    if not kernel.supports(p):
                        continue
                    ref = OPS[op].reference(hv.astype(np.float64), axis=axis)
                    configs = kernel.candidates(p) if dtype == "float32" else kernel.candidates(p)[:1]
                    for cfg in configs:
                        out = kernel(p, cfg, dv)
                        ran += 1
                        assert out.shape == p.out_shape and out.dtype == dv.dtype
                        assert out.flags.c_contiguous
                        try:
                            err = rel_err(cp.asnumpy(out).astype(np.float64), ref)
                        except AssertionError as exc:
                            err = f"{exc}"
                        if not (isinstance(err, float) and err <= TOLERANCE[dtype]):
                            failures.append(f"{dtype} {shape} {name} axis={axis} {cfg}: {err}")
    if family == "cluster" and ran == 0:
        pytest.skip("the cluster family needs sm_90")
    assert ran > 0
    assert not failures, "\n".join(failures[:20])


@pytest.mark.gpu
def test_softmax_poisoned_output_is_fully_written(cp, cuda):
    """Every element of the output is written (a pre-filled pool block must not show through)."""
    rng = np.random.default_rng()
    for family in ("warp", "block", "online", "strided"):
        kernel = next(k for k in softmax.kernels() if k.name == f"cupy.softmax.{family}")
        for shape in ((31, 999), (5, 4096)):
            host, dev = softmax_inputs(cp, rng, shape, "float32")
            p = make_problem("softmax", [dev], "float32", cuda, axis=1)
            if not kernel.supports(p):
                continue
            cfg = kernel.candidates(p)[0]
            for _ in range(3):  # the pool hands back the poisoned block
                poison = cp.full(shape, cp.nan, cp.float32)
                del poison
                out = kernel(p, cfg, dev)
                assert rel_err(cp.asnumpy(out), OPS["softmax"].reference(host, axis=1)) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("kernel_name", ["igemm_simt", "igemm_mma", "igemm_tma", "winograd_f2x3", "winograd_f4x3",
                                         "depthwise", "im2col_cublas"])
def test_conv2d_every_config(cp, cuda, kernel_name):
    rng = np.random.default_rng()
    kernel = next(k for k in conv.kernels() if k.name == f"cupy.conv2d.{kernel_name}")
    ran, failures = 0, []
    for dtype in dtypes_here(cp):
        if dtype not in kernel.dtypes:
            continue
        for xs, ws, attrs in CONV_CASES:
            for bias in (False, True):
                xh = rng.standard_normal(xs).astype(np_dtype(dtype))
                wh = rng.standard_normal(ws).astype(np_dtype(dtype))
                bh = rng.standard_normal(ws[0]).astype(np_dtype(dtype)) if bias else None
                xd = cp.asarray(xh)
                cases = [("contiguous", xd)]
                if dtype == "float32":
                    t = cp.asarray(np.ascontiguousarray(xh.transpose(0, 1, 3, 2))).transpose(0, 1, 3, 2)
                    cases.append(("transposed", t))
                for view, xv in cases:
                    arrays = [xv, cp.asarray(wh)] + ([cp.asarray(bh)] if bias else [])
                    p = make_problem("conv2d", arrays, dtype, cuda, **attrs)
                    if not kernel.supports(p):
                        continue
                    ref = OPS["conv2d"].reference(xh.astype(np.float64), wh.astype(np.float64),
                                                  None if bh is None else bh.astype(np.float64), **attrs)
                    configs = kernel.candidates(p) if (dtype in ("float32", "float16") or view != "contiguous") \
                        else kernel.candidates(p)[:1]
                    for cfg in configs:
                        out = kernel(p, cfg, *arrays)
                        ran += 1
                        assert out.shape == p.out_shape and out.dtype == xv.dtype
                        err = rel_err(cp.asnumpy(out).astype(np.float64), ref)
                        if not err <= TOLERANCE[dtype]:
                            failures.append(f"{dtype} {xs}*{ws} {attrs} bias={bias} {view} {cfg}: {err:.2e}")
    assert ran > 0
    assert not failures, "\n".join(failures[:20])


#: cases of the TMA kernel (input channels a multiple of 8): partial tiles of output channels, tiles
#: spanning images (P*Q below a tile, below a 64-pixel atom), P*Q not a multiple of 8 (stores from
#: registers) and a multiple (TMA stores), channels below, at and past a 64-channel chunk, strides,
#: dilation, 4-sided and large padding, even kernels, size-1 dims
TMA_CASES = [
    ((2, 64, 9, 11), (70, 64, 3, 3), {"padding": 1}),
    ((3, 8, 12, 10), (16, 8, 3, 3), {"padding": 1}),
    ((5, 16, 4, 4), (8, 16, 3, 3), {"padding": 1}),
    ((2, 72, 7, 7), (64, 72, 1, 1), {}),
    ((2, 32, 15, 16), (24, 32, 3, 3), {"stride": 2, "padding": 1}),
    ((1, 16, 10, 9), (8, 16, 3, 3), {"padding": "same", "dilation": 2}),
    ((2, 16, 9, 8), (12, 16, 4, 4), {"padding": "same"}),
    ((1, 8, 5, 5), (8, 8, 3, 3), {"padding": 3}),
    ((1, 24, 13, 17), (7, 24, 5, 5), {"stride": 3, "padding": 2}),
    ((1, 8, 1, 1), (1, 8, 1, 1), {}),
    ((4, 128, 28, 28), (136, 128, 3, 3), {"padding": 1}),
    ((3, 72, 8, 6), (70, 72, 1, 1), {}),  # pointwise, per image: two channel chunks, a partial K tile
    ((2, 16, 4, 4), (8, 16, 1, 1), {}),  # pointwise, images of 16 pixels
    ((2, 256, 28, 28), (64, 256, 1, 1), {}),  # pointwise, the bottleneck's shape
]


@pytest.mark.parametrize("xs,ws,attrs", TMA_CASES + [c for c in CONV_CASES if c[0][1] % 8 == 0],
                         ids=lambda v: str(v))
def test_tma_im2col_box_walks_the_output_positions(xs, ws, attrs):
    """The im2col map's bounding box, stepped by the stride, holds exactly the input pixels where
    the output positions' filter windows start (q * stride - pad), per spatial dim."""
    from opruntime_cupy.conv_launch import tma_corners

    cv = conv.Conv(make_problem("conv2d", [np.zeros(xs, np.float16), np.zeros(ws, np.float16)], "float16",
                                **attrs))
    (lw, lh), (uw, uh) = tma_corners(cv)
    assert list(range(lw, cv.w + uw, cv.str_w)) == [q * cv.str_w - cv.pad_l for q in range(cv.q)]
    assert list(range(lh, cv.h + uh, cv.str_h)) == [p * cv.str_h - cv.pad_t for p in range(cv.p)]


def _tma_problem(xs, ws, x_strides=None, w_strides=None, **attrs) -> Problem:
    p = make_problem("conv2d", [np.zeros(xs, np.float16), np.zeros(ws, np.float16)], "float16", **attrs)
    if x_strides or w_strides:
        p = Problem("conv2d", p.device, p.shapes, p.dtypes, (x_strides or p.strides[0], w_strides or p.strides[1]),
                    p.attrs, p.out_shape, p.dtype)
    return p


def test_tma_conv_modes_and_refusals():
    """Which operands the TMA kernel reads in place (channels-last views with 16-byte steps), when
    a 1x1 runs per image on the NCHW input (CONV 2), its ConvGemm block, and what it refuses (with
    the reason explain shows)."""
    from opruntime_cupy.conv_launch import channels_last, tma_conv_gemm, tma_pointwise, tma_tiles

    nchw = (32, 64, 56, 56)
    assert channels_last(nchw, (56 * 56 * 64, 1, 56 * 64, 64))  # an NHWC array seen as NCHW
    assert not channels_last(nchw, (64 * 56 * 56, 56 * 56, 56, 1))  # NCHW
    assert not channels_last(nchw, (56 * 56 * 128, 1, 56 * 128, 128))  # every other channel of a wider array
    assert not channels_last((2, 12, 5, 5), (12 * 5 * 5, 1, 5 * 12, 12))  # 12 channels: 24-byte pixel steps
    assert channels_last((64, 64, 1, 1), (64, 1, 1, 1)) and channels_last((64, 64, 1, 1), (64, 1, 99, 7))  # a 1x1 KC11
    layer = _tma_problem((32, 256, 56, 56), (64, 256, 1, 1))
    cv = conv.Conv(layer)
    assert tma_pointwise(cv) and tma_tiles(cv, 64, 256) == 32 * 1 * 13  # per image: 3136 pixels in 13 tiles
    g = tma_conv_gemm(cv)
    assert (g["k"], g["npq"], g["pq"], g["chunks"], g["ktiles"]) == (64, 32 * 3136, 3136, 4, 4)
    assert not tma_pointwise(conv.Conv(_tma_problem((2, 16, 7, 7), (8, 16, 1, 1))))  # 49 pixels: rows off 16 bytes
    assert not tma_pointwise(conv.Conv(_tma_problem((2, 16, 8, 8), (8, 16, 1, 1), stride=2)))
    g = tma_conv_gemm(conv.Conv(_tma_problem((2, 72, 9, 11), (70, 72, 3, 3), padding=1, dilation=1)))
    assert (g["chunks"], g["ktiles"], g["s"]) == (2, 18, 3)  # 72 channels: a full and a partial chunk a tap
    tma = next(k for k in conv.kernels() if k.name == "cupy.conv2d.igemm_tma")
    refusals = {"a grouped convolution": _tma_problem((2, 16, 8, 8), (16, 8, 3, 3), groups=2),
                "not a multiple of 8": _tma_problem((2, 12, 8, 8), (16, 12, 3, 3)),
                "beyond the im2col map's range": _tma_problem((1, 8, 300, 8), (8, 8, 3, 3), padding=200)}
    for why, p in refusals.items():
        answer = tma.supports(p)
        assert not answer and why in answer, (why, answer)


def test_tma_conv_cost_ranks_tiles_as_measured():
    """The TMA conv's cost model on the stand-in H100: 64x256 first on the 64-channel 3x3 layer
    (measured 45.2 us, the slowest config 57.2), and the channels-last copies count only where made."""
    tma = next(k for k in conv.kernels() if k.name == "cupy.conv2d.igemm_tma")
    layer = _tma_problem((32, 64, 56, 56), (64, 64, 3, 3), padding=1)
    first = tma.candidates(layer)[0]
    assert (first["bm"], first["bn"]) == (64, 256)
    nhwc = _tma_problem((32, 64, 56, 56), (64, 64, 3, 3), x_strides=(56 * 56 * 64, 1, 56 * 64, 64), padding=1)
    assert tma.estimate(nhwc, first) < tma.estimate(layer, first)


@pytest.mark.gpu
@pytest.mark.parametrize("itemsize", [2, 4, 8])
def test_layout_copies_both_ways(cp, itemsize):
    """layout.py's channels-last copies (the word-wide 16-bit kernel on contiguous planes, the
    generic one on any strides) and back, bit for bit, at odd sizes and views."""
    from opruntime_cupy import layout

    dt = {2: np.float16, 4: np.float32, 8: np.float64}[itemsize]
    rng = np.random.default_rng()
    for shape in [(2, 8, 5, 7), (3, 70, 9, 11), (1, 2, 1, 1), (2, 130, 65, 3)]:
        host = rng.standard_normal(shape).astype(dt)
        views = {"nchw": cp.asarray(host),
                 "hw-transposed": cp.asarray(np.ascontiguousarray(host.transpose(0, 1, 3, 2))).transpose(0, 1, 3, 2),
                 "channel slice": cp.asarray(np.concatenate([host, host], axis=1))[:, ::2]}
        for name, x in views.items():
            y = cp.empty((shape[0], shape[2], shape[3], shape[1]), x.dtype)
            layout.to_channels_last(itemsize, 0, shape, tuple(v // itemsize for v in x.strides))(x.data.ptr, y.data.ptr)
            assert cp.array_equal(y, x.transpose(0, 2, 3, 1)), (shape, name)
            back = cp.empty(shape, x.dtype)
            layout.to_channels_first(itemsize, 0, shape)(y.data.ptr, back.data.ptr)
            assert cp.array_equal(back, x), (shape, name)


@pytest.mark.gpu
def test_conv2d_tma_every_config_layout_and_epilogue(cp, cuda):
    """The TMA kernel on every case, config, 16-bit dtype, bias / activation, and the input as
    NCHW, as a channels-last view (read in place), as another strided view, and at a base off
    16 bytes; the weight also as a channels-last view."""
    rng = np.random.default_rng()
    kernel = next(k for k in conv.kernels() if k.name == "cupy.conv2d.igemm_tma")
    ran, failures = 0, []
    for ci, (xs, ws, attrs) in enumerate(TMA_CASES):
        for dtype in [d for d in dtypes_here(cp) if d in kernel.dtypes]:
            npd = np_dtype(dtype)
            xh = rng.standard_normal(xs).astype(npd)
            wh = rng.standard_normal(ws).astype(npd)
            bh = rng.standard_normal(ws[0]).astype(npd)
            flat = cp.empty(xh.size + 1, xh.dtype)
            flat[1:] = cp.asarray(xh).ravel()
            views = {"nchw": cp.asarray(xh),
                     "channels-last": cp.asarray(np.ascontiguousarray(xh.transpose(0, 2, 3, 1))).transpose(0, 3, 1, 2),
                     "hw-transposed": cp.asarray(np.ascontiguousarray(xh.transpose(0, 1, 3, 2))).transpose(0, 1, 3, 2),
                     "off 16 bytes": flat[1:].reshape(xs)}
            w_views = {"kcrs": cp.asarray(wh),
                       "krsc": cp.asarray(np.ascontiguousarray(wh.transpose(0, 2, 3, 1))).transpose(0, 3, 1, 2)}
            for bias, act in ((False, None), (True, None), (True, "gelu"), (False, "relu")):
                if (bias, act) != (True, None) and ci % 3:
                    continue  # every epilogue on a third of the cases
                ref = OPS["conv2d"].reference(xh.astype(np.float64), wh.astype(np.float64),
                                              bh.astype(np.float64) if bias else None, **attrs, activation=act)
                if act is not None and ref.size < 64:
                    continue  # a lone gelu output may sit in float16's subnormals: no relative accuracy to check
                for vname, xv in views.items():
                    for wname, wv in w_views.items():
                        if wname != "kcrs" and vname != "nchw":
                            continue
                        arrays = [xv, wv] + ([cp.asarray(bh)] if bias else [])
                        extra = {"activation": act} if act else {}
                        p = make_problem("conv2d", arrays, dtype, cuda, **attrs, **extra)
                        if not kernel.supports(p):
                            failures.append(f"refused {xs}*{ws} {attrs} {vname}: {kernel.supports(p)!r}")
                            continue
                        configs = kernel.candidates(p) if (vname, wname, bias, act) == ("nchw", "kcrs", True, None) \
                            else kernel.candidates(p)[:1]
                        for cfg in configs:
                            out = kernel(p, cfg, *arrays)
                            ran += 1
                            err = rel_err(cp.asnumpy(out).astype(np.float64), ref)
                            if not (out.shape == p.out_shape and err <= TOLERANCE[dtype]):
                                failures.append(f"{dtype} {xs}*{ws} {attrs} bias={bias} act={act} x {vname} "
                                                f"w {wname} {cfg}: {err:.2e}")
    assert ran > 0
    assert not failures, "\n".join(failures[:20])


@pytest.mark.gpu
def test_conv2d_strided_weight_and_misaligned_weight(cp, cuda):
    rng = np.random.default_rng()
    xh = rng.standard_normal((2, 16, 9, 9)).astype(np.float16)
    wbig = rng.standard_normal((9, 16, 3, 3)).astype(np.float16)
    for name, wd, wh in (("sliced", cp.asarray(wbig)[1:], wbig[1:]),  # contiguous view, base not 16-byte aligned
                         ("transposed", cp.asarray(np.ascontiguousarray(wbig[:8].transpose(1, 0, 2, 3))).transpose(1, 0, 2, 3),
                          wbig[:8])):
        for kname in ("igemm_mma", "igemm_simt"):
            kernel = next(k for k in conv.kernels() if k.name == f"cupy.conv2d.{kname}")
            p = make_problem("conv2d", [cp.asarray(xh), wd], "float16", cuda, padding=1)
            out = kernel(p, kernel.candidates(p)[0], cp.asarray(xh), wd)
            ref = OPS["conv2d"].reference(xh.astype(np.float64), wh.astype(np.float64), padding=1)
            assert rel_err(cp.asnumpy(out), ref) <= TOLERANCE["float16"], (name, kname)


@pytest.mark.gpu
def test_selector_uses_these_kernels_through_the_frontend(cp):
    import opruntime as opr

    rng = np.random.default_rng()
    x = rng.standard_normal((64, 512)).astype(np.float32)
    out = opr.softmax(x, device="cuda:0")
    assert rel_err(out.numpy(), OPS["softmax"].reference(x)) < 1e-5
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    xc = rng.standard_normal((2, 4, 10, 10)).astype(np.float32)
    assert rel_err(opr.conv2d(xc, w, padding=1, device="cuda:0").numpy(),
                   OPS["conv2d"].reference(xc, w, padding=1)) < 1e-5


# -- CPU: the Winograd transforms with conv_winograd.cu's matrices ----------------------------------

WINO = {  # (B^T, G, A^T) as conv_winograd.cu writes them
    2: (np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]),
        np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]]),
        np.array([[1, 1, 1, 0], [0, 1, -1, -1]])),
    4: (np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
                  [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]),
        np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
                  [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]]),
        np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]])),
}


def winograd_emulated(x, w, b, pad_t: int, pad_l: int, p: int, q: int, m: int, dtype=np.float64):
    """The three transforms and the grouped GEMM of conv_winograd.cu, in NumPy (in ``dtype``)."""
    bt, at = WINO[m][0].astype(dtype), WINO[m][2].astype(dtype)
    alpha = m + 2
    n = x.shape[0]
    u = np.einsum("ai,kcij,bj->kcab", WINO[m][1], w.astype(np.float64), WINO[m][1]).astype(dtype)  # in double
    th, tw = -(-p // m), -(-q // m)
    src = np.pad(x, ((0, 0), (0, 0), (pad_t, m * th + alpha), (pad_l, m * tw + alpha))).astype(dtype)
    d = np.stack([np.stack([src[:, :, i: i + m * th: m, j: j + m * tw: m] for j in range(alpha)], -1)
                  for i in range(alpha)], -2)  # (n, c, th, tw, alpha, alpha)
    v = np.einsum("ai,nctsij,bj->nctsab", bt, d, bt)
    mm = np.einsum("kcab,nctsab->nktsab", u, v)  # the alpha^2 products (the grouped GEMM)
    r = np.einsum("ia,nktsab,jb->nktsij", at, mm, at)  # (n, k, th, tw, m, m)
    y = r.transpose(0, 1, 2, 4, 3, 5).reshape(n, w.shape[0], m * th, m * tw)[:, :, :p, :q]
    return y + (0 if b is None else b.reshape(1, -1, 1, 1))


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("xs,ws,attrs", [((2, 3, 9, 11), (4, 3, 3, 3), {"padding": 1}),
                                         ((1, 5, 8, 7), (2, 5, 3, 3), {}),
                                         ((2, 2, 6, 6), (3, 2, 3, 3), {"padding": (0, 2)})])
def test_winograd_transforms_emulated(m, xs, ws, attrs):
    rng = np.random.default_rng()
    x, w, b = rng.standard_normal(xs), rng.standard_normal(ws), rng.standard_normal(ws[0])
    p = make_problem("conv2d", [x, w, b], "float32", **attrs)
    assert conv._winograd_ok(p)
    pt, _, pl, _ = p.attrs["padding"]
    got = winograd_emulated(x, w, b, pt, pl, p.out_shape[2], p.out_shape[3], m)
    assert rel_err(got, OPS["conv2d"].reference(x, w, b, **attrs)) < 1e-12


@pytest.mark.parametrize("m", [2, 4])
def test_winograd_float32_error_is_within_tolerance(m):
    """Transforms and products in float32, as on the GPU: the error stays under float32's 1e-5."""
    rng = np.random.default_rng()
    x, w = rng.standard_normal((2, 128, 14, 14)), rng.standard_normal((16, 128, 3, 3))
    got = winograd_emulated(x.astype(np.float32), w.astype(np.float32), None, 1, 1, 14, 14, m, np.float32)
    ref = OPS["conv2d"].reference(x.astype(np.float32), w.astype(np.float32), padding=1)
    assert rel_err(got, ref) < 1e-5 / 2
