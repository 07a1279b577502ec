"""The cpu backend's GEMM convolutions (``numpy.conv2d.numba_gemm``, ``numba_im2col``, ``numba_batch``,
``numba_winograd`` in both tile sizes) and its register-blocked direct one (``numba_direct``)
on problems that reach every branch of their task loops: several blocks of rows or positions with
a short last one (the cache budgets of every config), groups, padding wider than the kernel,
dilation, a 1x1 conv with padding (the shifted-taps path, not the pointwise one), float64, strided
and transposed operands, the fused ReLU and a second-pass activation; then the cost models' picks
on ResNet-50's layers, and the BLAS thread counts restored after a call."""

from __future__ import annotations

import numpy as np
import pytest

import opruntime as opr
from opruntime.ops.base import Case
from opruntime.plugins import registry
from opruntime.testing import check_kernel, failures, summary

pytest.importorskip("numba")

from opruntime_numpy import _blas  # noqa: E402

CPU = opr.Device("cpu")


def clean(findings) -> None:
    bad = failures(findings)
    assert not bad, f"{len(bad)} conformance failure(s):\n{summary(bad)}"


def _cv(x, w, bias=True, views=(), dtype="float32", **attrs) -> Case:
    return Case((x, w, (w[0],)) if bias else (x, w), attrs, dtype, views, op="conv2d")


GEMM = [
    _cv((3, 40, 37, 29), (48, 40, 3, 3), padding=1, activation="relu"),  # several row blocks, short last
    _cv((2, 96, 45, 11), (160, 96, 1, 1), activation="relu"),  # pointwise: several position blocks
    _cv((2, 12, 9, 10), (9, 4, 3, 3), padding=(2, 1), groups=3, bias=False),  # grouped, shifted taps
    _cv((2, 12, 9, 10), (9, 4, 1, 1), groups=3, activation="gelu"),  # grouped pointwise, 2nd pass
    _cv((1, 8, 11, 13), (5, 8, 1, 1), padding=1),  # 1x1 with padding: shifted taps
    _cv((2, 7, 16, 15), (6, 7, 3, 3), padding=2, dilation=2, activation="relu"),  # dilated
    _cv((2, 8, 12, 10), (6, 8, 3, 5), padding=(0, 2), dtype="float64"),  # float64, no row padding
    _cv((2, 6, 10, 9), (4, 6, 3, 3), padding=1, views=("slice", "T")),  # strided operands
    _cv((1, 4, 1, 1), (3, 4, 1, 1)),  # one position
    _cv((1, 64, 7, 7), (64, 64, 3, 3), padding=1, activation="relu"),  # fewer tasks than threads x 2
]

#: numba_gemm's register-blocked 1x1 path (configs ``strips``, _nb_conv.pointwise_strips), run on
#: maps of any size (its configs are offered from 512 positions): a partial block of output channels,
#: positions short of one strip, whole strips and a zero-padded last one, several blocks of an image
#: with a short last one, groups, float64, strided operands, no bias, a second-pass activation
STRIPS = [c for c in GEMM if c.shapes[1][2:] == (1, 1) and not c.attrs.get("padding")] + [
    _cv((2, 20, 7, 9), (13, 20, 1, 1), dtype="float64", activation="relu"),
    _cv((2, 16, 10, 12), (8, 16, 1, 1), views=("slice", "T")),
    _cv((2, 7, 50, 3), (17, 7, 1, 1), bias=False),
    _cv((1, 3, 2, 5), (24, 3, 1, 1), activation="relu"),
    _cv((3, 64, 37, 29), (40, 64, 1, 1), activation="relu"),  # 1073 positions: blocks of every config
    _cv((2, 24, 13, 11), (18, 8, 1, 1), groups=3, activation="gelu_tanh"),
]
IM2COL = [
    _cv((2, 40, 23, 21), (32, 40, 3, 3), stride=2, padding=1, activation="relu"),  # ResNet's stride-2 3x3
    _cv((2, 48, 15, 13), (40, 48, 1, 1), stride=2),  # the downsample's strided 1x1
    _cv((2, 12, 17, 14), (8, 6, 3, 3), stride=(2, 3), padding=(1, 2), groups=2, dilation=(1, 2)),
    _cv((1, 3, 29, 31), (8, 3, 7, 7), stride=2, padding=3, activation="gelu_tanh", dtype="float64"),
    # each strided path is its own loop (phase_1x1, phase_taps, phase_gemm): groups and dilation on the first two
    _cv((2, 12, 11, 9), (9, 4, 1, 1), stride=2, groups=3, activation="relu"),  # grouped 1x1, odd map
    _cv((2, 64, 13, 12), (24, 32, 3, 3), stride=2, padding=(2, 1), dilation=2, groups=2),  # taps: groups, dilation
    _cv((1, 32, 9, 10), (8, 32, 3, 3), stride=(2, 3), padding=1, dtype="float64", views=("slice",)),  # taps, strided x
]


#: numba_im2col's blocks of whole images (config ``images``, :func:`._nb_conv.images_gemm`): a short
#: last block (odd batch), groups, dilation, strides, strided operands, a 1x1, one image
IMAGES = [
    _cv((3, 16, 7, 7), (24, 16, 3, 3), padding=1, activation="relu"),
    _cv((5, 12, 9, 8), (8, 6, 3, 3), stride=(2, 1), padding=(2, 1), dilation=(1, 2), groups=2, activation="gelu"),
    _cv((3, 8, 10, 9), (6, 8, 3, 3), stride=2, padding=1, dtype="float64", views=("slice", "T")),
    _cv((3, 10, 5, 6), (7, 10, 1, 1), bias=False),
    _cv((1, 4, 1, 1), (3, 4, 3, 3), padding=1),
    _cv((3, 6, 5, 4), (5, 6, 3, 2), padding=(3, 0), activation="relu"),  # padding past the taps' rows, none across
    _cv((2, 5, 9, 11), (4, 5, 3, 3), stride=2),  # no padding, odd maps: the last input row and column unread
]


@pytest.mark.parametrize("case", IMAGES, ids=lambda c: f"{c.shapes[0]}x{c.shapes[1]}")
@pytest.mark.parametrize("images", [2, 3])
def test_numba_im2col_blocks_of_images(case, images):
    import dataclasses

    k = registry().kernels["numpy.conv2d.numba_im2col"]
    clean(check_kernel(dataclasses.replace(k, configs=({"images": images},)), CPU, cases=[case]))


@pytest.mark.parametrize("case", GEMM, ids=lambda c: f"{c.shapes[0]}x{c.shapes[1]}")
def test_numba_gemm_every_branch(case):
    clean(check_kernel(registry().kernels["numpy.conv2d.numba_gemm"], CPU, cases=[case]))


@pytest.mark.parametrize("case", STRIPS, ids=lambda c: f"{c.shapes[0]}x{c.shapes[1]}")
def test_numba_gemm_strips(case):
    import dataclasses

    from opruntime_numpy.conv import NUMBA_STRIPS_CONFIGS

    k = registry().kernels["numpy.conv2d.numba_gemm"]
    clean(check_kernel(dataclasses.replace(k, configs=NUMBA_STRIPS_CONFIGS, config_for=None), CPU, cases=[case]))


def test_numba_gemm_offers_strips_on_large_maps_only():
    from opruntime_numpy.conv import NUMBA_STRIPS_CONFIGS, STRIPS_POSITIONS

    from opruntime.ops.conv import CONV2D

    k = registry().kernels["numpy.conv2d.numba_gemm"]
    for hw, offered in ((STRIPS_POSITIONS, True), (STRIPS_POSITIONS - 1, False)):
        p = CONV2D.problem_for("cpu", [(1, 8, 1, hw), (8, 8, 1, 1)], "float32")
        assert (NUMBA_STRIPS_CONFIGS[0] in list(k.candidates(p))) == offered
    p = CONV2D.problem_for("cpu", [(1, 8, 32, 32), (8, 8, 3, 3)], "float32", padding=1)
    assert not any(c.get("strips") for c in k.candidates(p))


@pytest.mark.parametrize("case", IM2COL, ids=lambda c: f"{c.shapes[0]}x{c.shapes[1]}")
def test_numba_im2col_wide_and_strided(case):
    clean(check_kernel(registry().kernels["numpy.conv2d.numba_im2col"], CPU, cases=[case]))


BATCH = [c for c in GEMM + IM2COL + IMAGES if c.attrs.get("groups", 1) == 1] + [
    _cv((3, 16, 7, 7), (200, 16, 1, 1), activation="relu"),  # blocks of channels with a short last one
]


WINOGRAD = [c for c in GEMM if c.shapes[1][2:] == (3, 3) and c.attrs.get("groups", 1) == 1
            and c.attrs.get("dilation", 1) == 1] + [
    _cv((2, 16, 9, 8), (200, 16, 3, 3), padding=(1, 0), activation="relu"),  # odd maps: cut tiles
    _cv((1, 8, 3, 3), (4, 8, 3, 3)),  # one output position
    _cv((2, 8, 12, 10), (6, 8, 3, 3), padding=2, dtype="float64"),
    # F(4x4) (the configs with tile=4; every config runs each case): maps of 4k + 1 .. 4k + 3 (the
    # last row and column of tiles cut), no padding, a 1 x 1 map, the second-pass activations, no
    # bias, strided operands, many input channels (the transforms' rounding on long sums)
    _cv((2, 5, 13, 10), (7, 5, 3, 3), padding=1, activation="gelu"),
    _cv((1, 6, 11, 15), (5, 6, 3, 3), activation="silu", bias=False),
    _cv((3, 4, 1, 1), (3, 4, 3, 3), padding=1, activation="gelu_tanh"),
    _cv((2, 9, 7, 10), (4, 9, 3, 3), padding=(0, 1), views=("T", "slice"), activation="relu"),
    _cv((1, 512, 6, 9), (8, 512, 3, 3), padding=1),
    _cv((3, 16, 41, 9), (24, 16, 3, 3), padding=1, activation="relu"),  # F(4x4): several blocks of tile rows
]


@pytest.mark.parametrize("case", WINOGRAD, ids=lambda c: f"{c.shapes[0]}x{c.shapes[1]}")
def test_numba_winograd_every_branch(case):
    clean(check_kernel(registry().kernels["numpy.conv2d.numba_winograd"], CPU, cases=[case]))


#: numba_direct (:func:`._nb_conv.direct_strips`): odd maps, strides 2 and 3, padding past the
#: kernel, asymmetric ("same" with an even kernel), dilation, groups, size-1 dims, strided and
#: transposed inputs, float64 (8 lanes), output channels past one block of 8 and not a multiple
#: of it, several blocks of rows with a short last one, rows wider than a strip, one row a task
#: (a tile budget that holds one), no bias, the fused ReLU and second-pass activations
DIRECT = [
    _cv((1, 3, 29, 31), (8, 3, 7, 7), stride=2, padding=3, activation="relu"),  # the stem, small
    _cv((2, 3, 13, 17), (7, 3, 3, 3), stride=3, padding=4),  # padding past the kernel
    _cv((2, 3, 9, 8), (4, 3, 4, 2), padding="same", activation="gelu"),  # asymmetric padding
    _cv((2, 4, 15, 13), (10, 4, 3, 3), padding=2, dilation=2, activation="gelu_tanh"),
    _cv((2, 3, 16, 15), (6, 3, 3, 5), stride=(2, 3), padding=(3, 1), dilation=(2, 1), activation="silu"),
    _cv((2, 6, 11, 10), (12, 2, 3, 3), stride=(2, 1), padding=1, groups=3, activation="relu"),  # grouped
    _cv((1, 1, 1, 1), (1, 1, 1, 1)),
    _cv((3, 2, 1, 9), (5, 2, 1, 3), padding=(0, 1)),  # one input row
    _cv((1, 3, 7, 1), (4, 3, 3, 1), stride=2, padding=(1, 0)),  # one input column
    _cv((2, 3, 12, 11), (6, 3, 3, 3), padding=1, views=("T", "slice")),  # strided operands
    _cv((2, 3, 14, 13), (9, 3, 5, 5), stride=2, padding=2, views=("slice",), activation="relu"),
    _cv((2, 3, 20, 19), (20, 3, 5, 5), stride=2, padding=2, dtype="float64", activation="relu"),
    _cv((1, 3, 40, 45), (19, 3, 7, 7), stride=2, padding=3, bias=False),  # 3 blocks of channels, short last
    _cv((1, 2, 150, 20), (9, 2, 3, 3), padding=1, activation="relu"),  # 8 blocks of 19 rows, the last 17
    _cv((1, 3, 9, 200), (8, 3, 3, 3), stride=(1, 2), padding=1),  # rows of several strips
    _cv((1, 3, 4, 3000), (8, 3, 3, 3), padding=1, activation="relu"),  # one row a task
    _cv((5, 16, 9, 10), (24, 16, 3, 3), padding=1, dtype="float64"),  # 16 channels, whole images a task
]


@pytest.mark.parametrize("case", DIRECT, ids=lambda c: f"{c.shapes[0]}x{c.shapes[1]}-{c.dtype}")
def test_numba_direct_every_branch(case):
    clean(check_kernel(registry().kernels["numpy.conv2d.numba_direct"], CPU, cases=[case]))


def test_numba_direct_plans_cover_every_row():
    """The plan's tiles hold every phase row a block reads, and its tasks cover the output rows."""
    from opruntime_numpy.conv import _direct_plan

    from opruntime.ops.conv import CONV2D

    for xs, ws, attrs in [((1, 3, 224, 224), (64, 3, 7, 7), dict(stride=2, padding=3)),
                          ((8, 3, 224, 224), (64, 3, 7, 7), dict(stride=2, padding=3)),
                          ((1, 3, 4, 3000), (8, 3, 3, 3), dict(padding=1)),
                          ((2, 3, 13, 17), (7, 3, 3, 3), dict(stride=3, padding=4, dilation=2))]:
        p = CONV2D.problem_for("cpu", [xs, ws], "float32", **attrs)
        kv, rows, rt, wq, tasks = _direct_plan(p)
        (sh, sw), (dh, dw) = p.attrs["stride"], p.attrs["dilation"]
        n, _, ho, wo = p.out_shape
        assert kv in (4, 8) and 1 <= rows <= ho and tasks == n * -(-ho // rows)
        assert rt == rows + dh * (ws[2] - 1) // sh and wo + dw * (ws[3] - 1) // sw <= wq


@pytest.mark.parametrize("case", BATCH, ids=lambda c: f"{c.shapes[0]}x{c.shapes[1]}")
def test_numba_batch_every_branch(case):
    clean(check_kernel(registry().kernels["numpy.conv2d.numba_batch"], CPU, cases=[case]))


def test_numba_gemm_refuses_strided_and_depthwise():
    k = registry().kernels["numpy.conv2d.numba_gemm"]
    x, w = np.zeros((1, 8, 9, 9), np.float32), np.zeros((8, 8, 3, 3), np.float32)
    text = str(opr.explain("conv2d", x, w, stride=2, device="cpu"))
    assert "numpy.conv2d.numba_gemm" in text and "strided" in text
    assert k.name in str(opr.explain("conv2d", x, w, padding=1, device="cpu"))


#: ResNet-50's layers at batch 4 (224 x 224) and the kernel the cost models must give each: no
#: NumPy BLAS inside the model (its threads' spinning slows the kernels after it)
RESNET = [
    ((4, 64, 56, 56), (64, 64, 3, 3), 1, 1, "numpy.conv2d.numba_winograd[tile=4"),
    ((8, 64, 56, 56), (64, 64, 3, 3), 1, 1, "numpy.conv2d.numba_winograd[tile=4"),  # the cpu suite's
    ((4, 256, 14, 14), (256, 256, 3, 3), 1, 1, "numpy.conv2d.numba_winograd[channels=256,tile=2]"),
    ((4, 128, 28, 28), (128, 128, 3, 3), 1, 1, "numpy.conv2d.numba_winograd[tile=4"),
    ((4, 64, 56, 56), (256, 64, 1, 1), 1, 0, "numpy.conv2d.numba_gemm"),
    ((4, 1024, 14, 14), (256, 1024, 1, 1), 1, 0, "numpy.conv2d.numba_gemm"),
    ((4, 2048, 7, 7), (512, 2048, 1, 1), 1, 0, "numpy.conv2d.numba_gemm"),
    ((4, 512, 7, 7), (2048, 512, 1, 1), 1, 0, "numpy.conv2d.numba_batch"),
    ((4, 1024, 14, 14), (2048, 1024, 1, 1), 2, 0, "numpy.conv2d.numba_batch"),
    ((4, 512, 7, 7), (512, 512, 3, 3), 1, 1, "numpy.conv2d.numba_im2col[images=2]"),
    ((4, 512, 14, 14), (512, 512, 3, 3), 2, 1, "numpy.conv2d.numba_im2col[images=2]"),
    ((4, 256, 28, 28), (256, 256, 3, 3), 2, 1, "numpy.conv2d.numba_im2col[images=2]"),
    ((4, 128, 56, 56), (128, 128, 3, 3), 2, 1, "numpy.conv2d.numba_im2col"),
    ((4, 256, 56, 56), (512, 256, 1, 1), 2, 0, "numpy.conv2d.numba_im2col"),
    ((4, 512, 28, 28), (1024, 512, 1, 1), 2, 0, "numpy.conv2d.numba_im2col[images=2]"),
    ((4, 3, 224, 224), (64, 3, 7, 7), 2, 3, "numpy.conv2d.numba_direct"),  # the stem: 2.8 ms (numba_im2col 4.5)
    ((1, 3, 224, 224), (64, 3, 7, 7), 2, 3, "numpy.conv2d.numba_direct"),  # 0.72 ms (1.26)
    ((8, 3, 224, 224), (64, 3, 7, 7), 2, 3, "numpy.conv2d.numba_direct"),  # 6.0 ms (9.3)
]


@pytest.mark.parametrize("x,w,stride,padding,want", RESNET, ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v))
def test_cost_models_pick_the_numba_kernels_on_resnet(x, w, stride, padding, want):
    text = str(opr.explain("conv2d", np.zeros(x, np.float32), np.zeros(w, np.float32), np.zeros(w[0], np.float32),
                           stride=stride, padding=padding, activation="relu", device="cpu"))
    assert f"chosen: {want}" in text, text


def test_blas_threads_restored():
    before = [get() for get, _ in _blas._libs()]
    x = np.random.default_rng(0).standard_normal((2, 64, 20, 20)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((64, 64, 3, 3)).astype(np.float32)
    with opr.override(ops={"conv2d": {"kernel": "numpy.conv2d.numba_gemm"}}, strict=True):
        opr.conv2d(x, w, padding=1)
    assert [get() for get, _ in _blas._libs()] == before
