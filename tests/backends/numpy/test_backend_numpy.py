"""The NumPy backend's conv2d im2col path at every column-buffer budget: one chunk, several
chunks with a remainder, and chunks of one image, with every attribute, against float64."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import TOLERANCE, random, rel_err
from opruntime_numpy import conv

from opruntime.ops import OPS


def _problem(shapes, dtype, **attrs):
    return OPS["conv2d"].problem_for("cpu", shapes, dtype, **attrs)


ATTRS = [
    dict(),
    dict(stride=2, padding=1),
    dict(stride=(2, 1), padding=(0, 2), dilation=(1, 2), groups=3),
    dict(padding="same", dilation=2),
]


@pytest.mark.parametrize("attrs", ATTRS, ids=lambda a: ",".join(f"{k}={v}" for k, v in a.items()) or "plain")
@pytest.mark.parametrize("images_per_chunk", [1, 2, 5, None])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_im2col_chunks(rng, attrs, images_per_chunk, dtype):
    x = random(rng, (5, 6, 11, 9), dtype)
    w = random(rng, (9, 6 // attrs.get("groups", 1), 3, 3), dtype)
    b = random(rng, (9,), dtype)
    p = _problem([x.shape, w.shape, b.shape], dtype, **attrs)
    n, _, ho, wo = p.out_shape
    per_image = 6 * 9 * ho * wo * np.dtype(conv.compute_dtype(dtype)).itemsize
    budget = None if images_per_chunk is None else images_per_chunk * per_image + per_image // 2
    out = conv.im2col(p, {"cols_bytes": budget}, x, w, b)
    assert out.dtype == np.dtype(dtype) and out.shape == p.out_shape
    assert rel_err(out, OPS["conv2d"].reference(x, w, b, **attrs)) < TOLERANCE[dtype]


def test_im2col_budget_smaller_than_one_image(rng):
    x, w = random(rng, (3, 4, 7, 7), "float32"), random(rng, (2, 4, 3, 3), "float32")
    p = _problem([x.shape, w.shape], "float32", padding=1)
    out = conv.im2col(p, {"cols_bytes": 1}, x, w)
    assert rel_err(out, OPS["conv2d"].reference(x, w, padding=1)) < TOLERANCE["float32"]


def test_im2col_configs_offered():
    kernel = next(k for k in conv.kernels() if k.name == "numpy.conv2d.im2col")
    assert {c["cols_bytes"] for c in kernel.configs} >= {None, 4 << 20}


@pytest.mark.parametrize("attrs", [dict(padding=1), dict(stride=2, padding=(1, 0)), dict(dilation=2, padding="same")],
                         ids=["same3x3", "strided", "dilated"])
@pytest.mark.parametrize("chunk_images", [1, 3, None])
@pytest.mark.parametrize("mult", [1, 2])
def test_depthwise_chunks_and_threads(rng, attrs, chunk_images, mult):
    """The depthwise path over several chunks (run on the thread pool), one chunk, and with a
    channel multiplier, against float64."""
    x, w, b = random(rng, (7, 4, 9, 10), "float32"), random(rng, (4 * mult, 1, 3, 3), "float32"), random(rng, (4 * mult,), "float32")
    p = _problem([x.shape, w.shape, b.shape], "float32", groups=4, **attrs)
    assert conv.is_depthwise(p)
    n, o, ho, wo = p.out_shape
    per_image = 2 * o * ho * (x.shape[3] + 2 * 2) * 4  # an upper bound of one image's accumulators
    budget = None if chunk_images is None else chunk_images * per_image
    out = conv.depthwise(p, {"chunk_bytes": budget}, x, w, b)
    assert rel_err(out, OPS["conv2d"].reference(x, w, b, groups=4, **attrs)) < TOLERANCE["float32"]


def test_depthwise_is_chosen_for_depthwise_layers():
    p = _problem([(8, 64, 56, 56), (64, 1, 3, 3)], "float32", padding=1, groups=64)
    costs = {k.name: min(k.estimate(p, c) for c in k.candidates(p)) for k in conv.kernels() if k.supports(p)}
    assert min(costs, key=costs.get) in ("numpy.conv2d.depthwise", "numpy.conv2d.numba_depthwise")


@pytest.mark.parametrize("dtype, big, small", [("float32", 1e8, 1.0), ("float16", 65504.0, 2.0 ** -24)])
def test_ufunc_sum_and_mean_accumulate_wider_than_float32(dtype, big, small):
    """``numpy.sum.ufunc`` / ``numpy.mean.ufunc`` accumulate float16 and float32 in float64: terms
    that cancel leave the small one (accumulated in float32, ``big + small`` rounds to ``big`` and
    the result is 0), rounded once; the conformance cases' sums that cancelled failed so."""
    import opruntime as opr

    x = np.array([big, small, -big], dtype)
    for op, want in (("sum", small), ("mean", small / 3)):
        with opr.override(ops={op: {"kernel": f"numpy.{op}.ufunc"}}, strict=True):
            got = getattr(opr, op)(x).numpy()
        assert got.dtype == np.dtype(dtype) and got.item() == np.array(want, dtype).item(), (op, got)
