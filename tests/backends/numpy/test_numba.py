"""The cpu backend's numba kernels (``numpy.<op>.numba``): every one through the conformance suite
(every case of its operator, every dtype and config, called directly and pinned through the
frontend), the edge values pinned (NaN, infinities, rows of -inf, length-1 rows), the disk cache
reused by a second process, and the NumPy kernels alone when numba is missing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import TOLERANCE, rel_err

import opruntime as opr
from opruntime.ops import OPS
from opruntime.plugins import registry
from opruntime.testing import check_kernel, check_pinned, failures, summary

pytest.importorskip("numba")

from opruntime_numpy import jit

#: every numba kernel the backend registers (a kernel missing from the registry fails its tests)
NUMBA_KERNELS = [
    "numpy.softmax.numba", "numpy.log_softmax.numba", "numpy.layer_norm.numba", "numpy.rms_norm.numba",
    *(f"numpy.{op}.numba" for op in ("add", "sub", "mul", "div", "neg", "relu", "gelu", "silu", "sigmoid", "tanh")),
    "numpy.conv2d.numba_depthwise", "numpy.conv2d.numba_direct", "numpy.conv2d.numba_im2col", "numpy.conv2d.numba_gemm",
    "numpy.conv2d.numba_batch", "numpy.conv2d.numba_winograd",
    "numpy.max_pool2d.numba", "numpy.avg_pool2d.numba",
    "numpy.scaled_dot_product_attention.numba", "numpy.linear.numba", "numpy.matmul.numba",
    "numpy.sum.numba", "numpy.mean.numba", "numpy.amax.numba", "numpy.batch_norm.numba",
    "numpy.adaptive_avg_pool2d.numba",
]


def clean(findings) -> None:
    bad = failures(findings)
    assert not bad, f"{len(bad)} conformance failure(s):\n{summary(bad)}"


def kernel(name: str) -> opr.Kernel:
    assert name in registry().kernels, f"{name} is not registered (numba {jit.missing() or 'present'})"
    return registry().kernels[name]


def test_every_numba_kernel_is_registered():
    have = {k for k in registry().kernels if ".numba" in k}
    assert have == set(NUMBA_KERNELS)


@pytest.mark.parametrize("name", NUMBA_KERNELS)
def test_conformance_every_case_dtype_config(name):
    clean(check_kernel(kernel(name), opr.Device("cpu")))


@pytest.mark.parametrize("name", NUMBA_KERNELS)
def test_conformance_pinned(name):
    k = kernel(name)
    for dtype in ("float32", "float64", "float16"):
        clean(check_pinned(k, opr.Device("cpu"), dtype=dtype))


def pinned(name: str):
    return opr.override(ops={name.split(".")[1]: {"kernel": name}}, strict=True)


# -- edge values, pinned ---------------------------------------------------------------------------------

HUGE = {"float16": 6e4, "float32": 3e38, "float64": 1e308}


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_softmax_special_rows(op, dtype):
    inf, nan, big = np.inf, np.nan, HUGE[dtype]
    x = np.array([
        [-inf, -inf, -inf, -inf], [0.5, -inf, 2.0, -inf], [big, big, -big, 0.0], [-big, -big, -big, -big],
        [1.0, nan, 2.0, 3.0], [1.0, inf, 2.0, 3.0], [big, -big, big / 2, 1.0], [0.0, 0.0, 0.0, 0.0],
    ], np.float64).astype(dtype)
    for axis in (1, 0):
        with pinned(f"numpy.{op}.numba"):
            out = getattr(opr, op)(x, axis=axis).numpy()
        with np.errstate(over="ignore"):
            ref = OPS[op].reference(x.astype(np.float64), axis=axis).astype(dtype).astype(np.float64)
        assert rel_err(out, ref) <= TOLERANCE[dtype]


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("n", [5, 70_000])  # in cache, and online over blocks
def test_softmax_rows_of_specials_long_and_short(op, n):
    """Rows with -inf before the first finite value, NaN, +inf, all -inf, and huge values, in the
    in-cache path and in the online path (rows past ``ROW_BLOCK``, -inf blocks before finite ones)."""
    rng = np.random.default_rng()
    x = rng.standard_normal((6, n)).astype(np.float32)
    x[0, : n - 2] = -np.inf  # -inf first (whole blocks of it in the online path), then finite
    x[1, n // 2] = np.nan
    x[2, n - 1] = np.inf
    x[3] = -np.inf
    x[4] *= 1e37  # huge, finite: the max is subtracted first
    x[5, : n // 3] = np.nan
    with pinned(f"numpy.{op}.numba"):
        out = getattr(opr, op)(x).numpy()
    ref = OPS[op].reference(x.astype(np.float64), axis=-1)
    assert rel_err(out, ref) <= TOLERANCE["float32"]


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_length_one_is_exact(op):
    x = (np.random.default_rng().standard_normal((5, 1)) * 100).astype(np.float32)
    with pinned(f"numpy.{op}.numba"):
        out = getattr(opr, op)(x, axis=1).numpy()
    assert np.array_equal(out, np.zeros_like(x) if op == "log_softmax" else np.ones_like(x))


@pytest.mark.parametrize("shape,axis", [((4096, 33), 0), ((3, 700, 5), 1), ((2, 3, 40, 7), 2)])
def test_softmax_strided_axis_tiles(shape, axis):
    """The strided-axis path over several column blocks and outer indices."""
    x = np.random.default_rng().standard_normal(shape).astype(np.float32)
    for op in ("softmax", "log_softmax"):
        with pinned(f"numpy.{op}.numba"):
            out = getattr(opr, op)(x, axis=axis).numpy()
        assert rel_err(out, OPS[op].reference(x.astype(np.float64), axis=axis)) <= TOLERANCE["float32"]


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_norm_specials_and_constant_rows(op):
    x = np.random.default_rng().standard_normal((5, 300)).astype(np.float32)
    x[1, 7] = np.nan
    x[2, 9] = np.inf
    x[3] = 2.5  # a constant row: layer_norm gives exactly 0 (times w, plus b)
    w = np.random.default_rng().standard_normal(300).astype(np.float32)
    with pinned(f"numpy.{op}.numba"):
        out = getattr(opr, op)(x, (300,), w).numpy()
    ref = OPS[op].reference(x.astype(np.float64), w.astype(np.float64), normalized_shape=(300,))
    assert rel_err(out, ref) <= TOLERANCE["float32"]


#: float32 gelu's tail, where results are small against x, and the rest of its range
GELU_X = np.concatenate([np.linspace(-13.1, -3.0, 4001), np.linspace(-3.0, 5.0, 801)]).astype(np.float32)


@pytest.mark.parametrize("call", ["gelu", "add", "linear_few_rows", "linear_rows"])
def test_float32_gelu_is_accurate_relative_to_each_result(call):
    """float32 gelu within 1e-6 of gelu at x or at one of x's float32 neighbours, for every result in
    float32's normal range, the tail (x < -3, results down to 1e-38) too, in each numba kernel that
    applies it: the operator, an add's activation and linear's epilogue (few rows: after the
    product; more: per block of rows). So the error is at most the input's own rounding (gelu's
    condition number is about x^2 in the tail). An erf of absolute accuracy (torch's) makes results
    below 1e-7 all error: a linear's output lying wholly in the tail came out 0."""
    gelu64 = lambda x: OPS["gelu"].reference(x.astype(np.float64))  # noqa: E731
    ref = gelu64(GELU_X)
    near = [gelu64(np.nextafter(GELU_X, np.float32(s))) for s in (-np.inf, np.inf)]
    ones = np.ones((1, 1), np.float32)
    calls = {
        "gelu": ("numpy.gelu.numba", lambda: opr.gelu(GELU_X).numpy()),
        "add": ("numpy.add.numba", lambda: opr.add(GELU_X, np.zeros_like(GELU_X), activation="gelu").numpy()),
        "linear_few_rows": ("numpy.linear.numba", lambda: np.concatenate(
            [opr.linear(GELU_X[i:i + 4, None], ones, activation="gelu").numpy()[:, 0] for i in range(0, GELU_X.size, 4)])),
        "linear_rows": ("numpy.linear.numba", lambda: opr.linear(GELU_X[:, None], ones, activation="gelu").numpy()[:, 0]),
    }
    name, fn = calls[call]
    with pinned(name):
        got = fn().astype(np.float64)
    normal = np.abs(ref) >= np.finfo(np.float32).tiny
    assert normal.sum() > 4700
    slack = 1e-6 * np.abs(ref)
    low, high = np.minimum(ref, np.minimum(*near)) - slack, np.maximum(ref, np.maximum(*near)) + slack
    outside = normal & ((got < low) | (got > high))
    assert not outside.any(), (GELU_X[outside][:5], got[outside][:5], ref[outside][:5])


def test_float32_gelu_specials():
    """NaN, +-inf, -0.0 and the far tail as the float64 reference (gelu(-inf) is -inf * 0: NaN);
    below -13.15, where the exact result is subnormal or 0, within the smallest normal float32."""
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, -20.0, 20.0, 3e38, -3e38, 1e-30, -1e-30], np.float32)
    with pinned("numpy.gelu.numba"):
        got = opr.gelu(x).numpy()
    with np.errstate(invalid="ignore"):
        ref = OPS["gelu"].reference(x.astype(np.float64)).astype(np.float32)
    tiny = np.finfo(np.float32).tiny
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=tiny)  # NaN where the reference has NaN, infs equal
    assert np.signbit(got[4]) and not np.signbit(got[3])
    assert got[5] <= 0 and got[8] <= 0


# -- the disk cache and first use ------------------------------------------------------------------------

def _first_use(cache: str) -> float:
    code = textwrap.dedent("""
        import numpy as np, opruntime as opr
        from opruntime_numpy import jit
        x = np.ones((8, 100), np.float32)
        with opr.override(ops={"softmax": {"kernel": "numpy.softmax.numba"}}, strict=True):
            opr.softmax(x)
        print(jit.COMPILE_S["numpy.softmax.numba"])
    """)
    env = {**os.environ, "OPRUNTIME_CACHE_DIR": cache}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return float(proc.stdout.split()[-1])


@pytest.mark.slow
def test_compiled_kernels_are_cached_across_processes(tmp_path):
    cache = str(tmp_path / "c")
    first = _first_use(cache)
    files = list((tmp_path / "c" / "numba").rglob("*.nbi"))
    assert files, "numba wrote no cache index beside the tuning cache"
    second = _first_use(cache)
    assert second < first / 3 and second < 1.0, (first, second)


# -- without numba ------------------------------------------------------------------------------------------

def test_without_numba_the_numpy_kernels_remain(monkeypatch):
    from opruntime_numpy.memory import CpuDevice

    from opruntime import plugins

    monkeypatch.setattr(jit, "missing", lambda: "numba is not installed (test)")
    plugins.reset()
    try:
        names = set(registry().kernels)
        assert not any(n.endswith(".numba") for n in names)
        assert {"numpy.softmax.fused", "numpy.layer_norm.blocked"} <= names
        x = np.random.default_rng().standard_normal((4, 9)).astype(np.float32)
        assert opr.explain("softmax", x).chosen == "numpy.softmax.fused"
        assert rel_err(opr.softmax(x).numpy(), OPS["softmax"].reference(x.astype(np.float64))) <= 1e-5
        assert "numba is not installed (test)" in CpuDevice().info()["numba"]
    finally:
        monkeypatch.undo()
        plugins.reset()
    assert "numpy.softmax.numba" in registry().kernels


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("name,groups", [("numpy.conv2d.numba_direct", 1), ("numpy.conv2d.numba_depthwise", 2)])
@pytest.mark.parametrize("attrs", [{"padding": 1}, {"padding": 2, "stride": 2}, {"padding": "same", "dilation": 2},
                                   {"padding": (0, 2)}], ids=str)
@pytest.mark.parametrize("special", [np.inf, np.nan], ids=["inf", "nan"])
def test_conv_specials_at_padded_taps(name, groups, attrs, special):
    """An inf or NaN weight over the zero padding gives NaN exactly where the float64 reference
    does (the padded taps are multiplied, not skipped), wide (stride 1) and strided."""
    rng = np.random.default_rng()
    x = rng.uniform(0.5, 2.0, (1, 2, 6, 7)).astype(np.float32)
    w = rng.uniform(0.5, 2.0, (2 * (groups == 2) + 2 * (groups == 1), 2 // groups, 3, 3)).astype(np.float32)
    w[0, 0, 0, 0] = special
    w[-1, -1, 2, 1] = special
    with pinned(name):
        out = opr.conv2d(x, w, groups=groups, **attrs).numpy()
    ref = OPS["conv2d"].reference(x.astype(np.float64), w.astype(np.float64), groups=groups, **attrs)
    assert np.isnan(ref).any()
    assert rel_err(out, ref) <= TOLERANCE["float32"]


@pytest.mark.parametrize("op", ["max_pool2d", "avg_pool2d"])
def test_pool_nan_and_inf(op):
    x = np.random.default_rng().standard_normal((2, 3, 9, 11)).astype(np.float32)
    x[0, 1, 4, 4], x[1, 2, 0, 0], x[1, 0, 8, 10] = np.nan, np.inf, -np.inf
    with pinned(f"numpy.{op}.numba"):
        out = getattr(opr, op)(x, kernel_size=3, stride=2, padding=1).numpy()
    ref = OPS[op].reference(x.astype(np.float64), kernel_size=3, stride=2, padding=1)
    assert rel_err(out, ref) <= TOLERANCE["float32"]


POOL_GEOMETRIES = [  # output heights across _nb_pool.RB (8): one block, a part, several; stride 2 and not
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 0)),
    dict(kernel_size=(3, 2), stride=(3, 1), padding=(1, 1)),
    dict(kernel_size=1, stride=1),
    dict(kernel_size=(5, 4), stride=(2, 3), padding=2, ceil_mode=True),
]


@pytest.mark.parametrize("op", ["max_pool2d", "avg_pool2d"])
@pytest.mark.parametrize("hw", [(1, 1), (2, 19), (17, 16), (40, 9), (33, 40)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_pool_row_blocks(op, hw, dtype):
    """Pinned to the numba kernel over several blocks of output rows and every geometry that fits
    (strides 1-3, dilation for max, count_include_pad for avg): random values with a NaN and
    infinities, a non-contiguous input (every other column of a wider array), against the float64
    reference."""
    rng = np.random.default_rng()
    h, w = hw
    wide = rng.standard_normal((2, 3, h, 2 * w)).astype(dtype)
    x = wide[..., ::2]
    if h * w > 2:
        x[0, 1, h // 2, w // 2], x[1, 2, 0, w - 1], x[1, 0, h - 1, 0] = np.nan, np.inf, -np.inf
    variants = [{}, {"dilation": 2}] if op == "max_pool2d" else [{}, {"count_include_pad": False}]
    ran = 0
    for geometry in POOL_GEOMETRIES:
        for extra in variants:
            attrs = dict(geometry, **extra)
            k = np.broadcast_to(attrs["kernel_size"], 2)
            d = np.broadcast_to(attrs.get("dilation", 1), 2)
            p = np.broadcast_to(attrs.get("padding", 0), 2)
            if (d * (k - 1) + 1 > np.array(hw) + 2 * p).any() or (2 * p > k).any():
                continue  # a window larger than the padded input, or padding past half the window
            with pinned(f"numpy.{op}.numba"):
                out = getattr(opr, op)(x, **attrs).numpy()
            ref = OPS[op].reference(x.astype(np.float64), **attrs)
            assert out.shape == ref.shape, attrs
            assert np.array_equal(np.isnan(out), np.isnan(ref)), attrs
            assert rel_err(out, ref) <= TOLERANCE[dtype], attrs
            ran += 1
    assert ran >= (2 if hw == (1, 1) else 6)


@pytest.mark.parametrize("op", ["max_pool2d", "avg_pool2d"])
def test_pool_empty_batch(op):
    x = np.zeros((0, 3, 9, 10), np.float32)
    with pinned(f"numpy.{op}.numba"):
        out = getattr(opr, op)(x, kernel_size=3, stride=2, padding=1).numpy()
    assert out.shape == (0, 3, 5, 5)


def test_attention_masked_rows_nan_mask_and_blocks():
    """Over several query and key blocks: a row with every key masked gives zeros, a NaN in an
    additive mask a NaN row, GQA heads and broadcast batches read in place; pinned."""
    rng = np.random.default_rng()
    q = rng.standard_normal((2, 4, 70, 16)).astype(np.float32)
    k = rng.standard_normal((1, 2, 300, 16)).astype(np.float32)
    v = rng.standard_normal((2, 2, 300, 8)).astype(np.float32)
    keep = rng.standard_normal((2, 1, 70, 300)) > -0.5
    keep[0, 0, 5] = False  # every key masked for row 5 of batch 0
    name = "numpy.scaled_dot_product_attention.numba"
    op = OPS["scaled_dot_product_attention"]
    with pinned(name):
        out = opr.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True).numpy()
    ref = op.reference(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), attn_mask=keep,
                       enable_gqa=True)
    assert np.array_equal(out[0, :, 5], np.zeros((4, 8), np.float32))
    assert rel_err(out, ref) <= TOLERANCE["float32"]
    bias = rng.standard_normal((70, 300)).astype(np.float32)
    bias[9, 250] = np.nan
    with pinned(name):
        out = opr.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True).numpy()
    assert np.isnan(out[:, :, 9]).all() and not np.isnan(np.delete(out, 9, axis=2)).any()
    with pinned(name):
        out = opr.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).numpy()
    ref = op.reference(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), is_causal=True,
                       enable_gqa=True)
    assert rel_err(out, ref) <= TOLERANCE["float32"]


def test_explain_shows_the_first_use_time():
    x = np.ones((3, 50), np.float32)
    with pinned("numpy.softmax.numba"):
        opr.softmax(x)
        text = str(opr.explain("softmax", x))
    assert "numpy.softmax.numba" in text and "numba: first call" in text and " s, compiling" in text


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("n", [5000, 70_000])
@pytest.mark.parametrize("axis", [1, 0])
def test_softmax_rows_of_huge_values(op, n, axis):
    """log(sum) is not absorbed by a huge max: (x - max) - log(sum), in every path."""
    x = np.full((2, n), 3e38, np.float32)
    x[1, ::7] = -3e38
    x = x if axis == 1 else np.ascontiguousarray(x.T)
    with pinned(f"numpy.{op}.numba"):
        out = getattr(opr, op)(x, axis=axis).numpy()
    with np.errstate(over="ignore"):
        ref = OPS[op].reference(x.astype(np.float64), axis=axis).astype(np.float32).astype(np.float64)
    assert rel_err(out, ref) <= TOLERANCE["float32"]


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("rows", [100, 4099])
def test_softmax_strided_axis_max_rising_across_blocks(op, rows):
    """The strided-axis statistics over many blocks of rows (each block's max first, the sums so far
    rescaled to it): columns whose max rises in every block, -inf before the first finite values,
    all -inf, a NaN or +inf in a later block, huge values, and a row count that ends in a partial block."""
    rng = np.random.default_rng()
    x = rng.standard_normal((rows, 37)).astype(np.float32)
    x[:, 0] = np.linspace(-50, 50, rows)  # rising: the max is raised by every block
    x[:, 1] = np.linspace(50, -50, rows)  # falling: the first block holds it
    x[: rows // 2, 2] = -np.inf  # -inf blocks, then finite ones
    x[:, 3] = -np.inf
    x[rows - 3, 4] = np.nan
    x[rows - 5, 5] = np.inf
    x[:, 6] *= 1e37
    with pinned(f"numpy.{op}.numba"):
        out = getattr(opr, op)(x, axis=0).numpy()
    ref = OPS[op].reference(x.astype(np.float64), axis=0)
    assert rel_err(out, ref) <= TOLERANCE["float32"]
