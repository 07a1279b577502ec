"""The cpu backend's numba convolutions, flash attention and linear, on the problems that reach their
newer paths (the operators' own conformance cases are small): every config, dtype and view against
the float64 references through the conformance suite's runner.

* attention: several query and key tiles with odd remainders, causal with L != S, masks (boolean,
  additive with a NaN), GQA and broadcast batches, the heads-as-views pattern of the transformer
  block, decode steps (L = 1), and both launch paths (one thread for few flops, one range of
  tasks per thread otherwise); scipy's BLAS thread count restored after the call;
* conv2d: the four numba entry points (depthwise / direct, stride 1 (wide) / strided), ReLU fused
  and the other activations as a second pass, dilation, channel multipliers; depthwise problems
  large enough for numba's threads (3x3 in one pass, other kernels, strided);
* linear: the bias through the GEMM's beta (large problems), strided and transposed operands.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import TOLERANCE, rel_err

import opruntime as opr
from opruntime.ops import OPS
from opruntime.ops.base import Case
from opruntime.plugins import registry
from opruntime.testing import check_kernel, failures, summary

pytest.importorskip("numba")

from opruntime_numpy import _blas, attention  # noqa: E402

CPU = opr.Device("cpu")


def clean(findings) -> None:
    bad = failures(findings)
    assert not bad, f"{len(bad)} conformance failure(s):\n{summary(bad)}"


def cases(op: str, *raw: Case) -> list[Case]:
    return [Case(c.shapes, c.attrs, c.dtype, c.views, c.scale, c.bools, op) for c in raw]


def _at(q, k, v=None, mask=None, views=(), **attrs) -> Case:
    shapes = (q, k, v or k) + ((mask[1],) if mask else ())
    return Case(shapes, attrs, "float32", views, 1.0, (3,) if mask and mask[0] == "bool" else ())


ATTENTION = cases(
    "scaled_dot_product_attention",
    _at((1, 2, 300, 40), (1, 2, 300, 40), is_causal=True),  # 5 query tiles of 64, the last of 44
    _at((2, 3, 130, 16), (2, 3, 1100, 16), (2, 3, 1100, 24)),  # 2 key tiles of 1024 (5 of 256), Ev != E
    _at((1, 2, 200, 32), (1, 2, 77, 32), is_causal=True),  # L > S: rows past S see every key
    _at((1, 2, 77, 32), (1, 2, 300, 32), is_causal=True),  # L < S: top-left aligned
    _at((2, 4, 150, 16), (1, 2, 290, 16), (2, 2, 290, 8), enable_gqa=True, is_causal=True),
    _at((2, 2, 140, 16), (2, 2, 270, 16), mask=("bool", (2, 1, 140, 270))),
    _at((1, 3, 90, 16), (1, 3, 333, 16), mask=("float", (90, 333)), scale=0.3),
    _at((3, 4, 1, 64), (3, 4, 515, 64)),  # decode steps
    _at((2, 3, 129, 64), (2, 3, 129, 64), views=("T", "T", "slice")),  # strided operands
    _at((1, 1, 0, 8), (1, 1, 5, 8)),
    _at((1, 1, 3, 8), (1, 1, 1, 8), is_causal=True),
)


def test_flash_attention_every_config_dtype_view():
    k = registry().kernels["numpy.scaled_dot_product_attention.numba"]
    clean(check_kernel(k, CPU, cases=ATTENTION))


def test_flash_attention_nan_mask_all_masked_rows_and_threads():
    """Tasks split over threads (enough flops): a NaN in an additive mask gives a NaN row, a row
    with every key masked zeros, and scipy's BLAS gets its thread count back."""
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 4, 260, 32)).astype(np.float32)
    k = rng.standard_normal((2, 4, 700, 32)).astype(np.float32)
    bias = rng.standard_normal((260, 700)).astype(np.float32)
    bias[17, 650] = np.nan
    keep = rng.standard_normal((2, 1, 260, 700)) > -0.5
    keep[1, 0, 200] = False
    name = "numpy.scaled_dot_product_attention.numba"
    before = _blas._lib()[0]() if _blas.controllable() else None
    with opr.override(ops={"scaled_dot_product_attention": {"kernel": name}}, strict=True):
        out = opr.scaled_dot_product_attention(q, k, k, attn_mask=bias).numpy()
        assert np.isnan(out[:, :, 17]).all() and not np.isnan(np.delete(out, 17, axis=2)).any()
        out = opr.scaled_dot_product_attention(q, k, k, attn_mask=keep).numpy()
    assert np.array_equal(out[1, :, 200], np.zeros((4, 32), np.float32))
    ref = OPS["scaled_dot_product_attention"].reference(q.astype(np.float64), k.astype(np.float64),
                                                        k.astype(np.float64), attn_mask=keep)
    assert rel_err(out, ref) <= TOLERANCE["float32"]
    if before is not None:
        assert _blas._lib()[0]() == before


def test_flash_attention_heads_as_views_of_one_projection():
    """The transformer block's pattern: q, k, v permuted views of one (B, S, 3, H, E) array."""
    rng = np.random.default_rng(2)
    qkv = opr.tensor(rng.standard_normal((2, 200, 3, 4, 32)).astype(np.float32)).permute(2, 0, 3, 1, 4)
    out = opr.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True).numpy()
    a = qkv.numpy().astype(np.float64)
    ref = OPS["scaled_dot_product_attention"].reference(a[0], a[1], a[2], is_causal=True)
    assert rel_err(out, ref) <= TOLERANCE["float32"]


def test_flash_attention_gathers_strided_heads_and_answers_in_query_order():
    """Pinned to the numba kernel: strided q / v (gathered into one pooled block) beside a contiguous
    k, twice (the block reused), and the output in (B, L, H, E) memory, so that joining the heads
    after is a view, as torch's."""
    rng = np.random.default_rng(3)
    qkv = opr.tensor(rng.standard_normal((2, 300, 3, 4, 32)).astype(np.float32)).permute(2, 0, 3, 1, 4)
    k = opr.tensor(np.ascontiguousarray(qkv[1].numpy()))
    a = qkv.numpy().astype(np.float64)
    ref = OPS["scaled_dot_product_attention"].reference(a[0], a[1], a[2], is_causal=True)
    with opr.override(ops={"scaled_dot_product_attention": {"kernel": "numpy.scaled_dot_product_attention.numba"}},
                      strict=True):
        for _ in range(2):
            y = opr.scaled_dot_product_attention(qkv[0], k, qkv[2], is_causal=True)
            assert rel_err(y.numpy(), ref) <= TOLERANCE["float32"]
    joined = y.numpy().transpose(0, 2, 1, 3)
    assert joined.flags.c_contiguous  # (B, L, H, E) memory: reshape to (B, L, H * E) is a view


def test_flash_attention_is_chosen_on_the_cpu_suite_case():
    q = np.zeros((1, 4, 512, 64), np.float32)
    text = str(opr.explain("scaled_dot_product_attention", q, q, q, is_causal=True, device="cpu"))
    assert "chosen: numpy.scaled_dot_product_attention.numba" in text


def test_blas_one_thread_nests_and_restores():
    if not _blas.controllable():
        pytest.skip("no OpenBLAS found for numba's np.dot")
    get = _blas._lib()[0]
    before = get()
    with _blas.one_thread():
        assert get() == 1
        with _blas.one_thread():
            assert get() == 1
        assert get() == 1
    assert get() == before


def _cv(x, w, bias=True, views=(), **attrs) -> Case:
    return Case((x, w, (w[0],)) if bias else (x, w), attrs, "float32", views)


CONV = cases(
    "conv2d",
    _cv((2, 5, 23, 19), (5, 1, 3, 3), padding=1, groups=5, activation="relu"),  # depthwise wide, fused ReLU
    _cv((2, 4, 17, 21), (8, 1, 3, 5), padding=(1, 2), groups=4, activation="gelu"),  # multiplier 2, 2nd pass
    _cv((1, 6, 20, 17), (6, 1, 3, 3), stride=2, padding=1, groups=6, activation="silu"),  # depthwise strided
    _cv((1, 3, 29, 31), (8, 3, 7, 7), stride=2, padding=3, activation="relu"),  # the stem, strided
    _cv((2, 4, 15, 13), (6, 4, 3, 3), padding=2, dilation=2, activation="gelu_tanh"),  # direct wide, dilated
    _cv((1, 4, 16, 16), (6, 2, 3, 3), groups=2, stride=(1, 2), bias=False),  # direct strided, grouped
    _cv((2, 3, 18, 18), (4, 3, 5, 5), padding=2, views=("slice", "T")),  # strided operands
    _cv((1, 2, 1, 1), (2, 1, 1, 1), groups=2),
    # depthwise on numba's threads (2e6 flops and more), ranges of planes sharing one padded plane:
    _cv((4, 16, 48, 53), (16, 1, 3, 3), padding=1, groups=16, activation="relu"),  # 3x3 in one pass
    _cv((3, 8, 61, 57), (16, 1, 3, 3), padding=(2, 1), dilation=(2, 1), groups=8),  # 3x3 dilated, multiplier 2
    _cv((2, 12, 45, 50), (12, 1, 5, 5), padding=2, groups=12, views=("slice", None)),  # 5x5 by rows of taps
    _cv((4, 16, 91, 88), (16, 1, 3, 3), stride=2, padding=1, groups=16, bias=False),  # strided
)


@pytest.mark.parametrize("name", ["numpy.conv2d.numba_depthwise", "numpy.conv2d.numba_direct",
                                  "numpy.conv2d.numba_im2col", "numpy.conv2d.numba_gemm"])
def test_numba_conv_every_entry_point(name):
    clean(check_kernel(registry().kernels[name], CPU, cases=CONV))


def _ln(x, n, activation=None, views=()) -> Case:
    return Case((x, (n, x[-1]), (n,)), {"activation": activation}, "float32", views)


LINEAR = cases(
    "linear",
    _ln((517, 150), 263),  # 20 M multiply-adds: blocks of rows on the threads, the bias per block
    _ln((3, 171, 150), 263, "gelu_tanh"),
    _ln((520, 149), 261, "relu", views=("slice", "T")),
    _ln((300, 300), 300, "silu", views=("T", None)),
)


def test_linear_row_blocks_on_threads():
    clean(check_kernel(registry().kernels["numpy.linear.numba"], CPU, cases=LINEAR))


#: few rows, large weights (ResNet-50's fc): ``(w @ x.T).T``, split over numba's threads where the
#: output features divide by 8, 4 or 2 (1001 does not: one thread), the ReLU fused, gelu after
SKINNY = cases(
    "linear",
    _ln((4, 2048), 1000),
    _ln((1, 2048), 1000, "relu", views=("slice", "T")),
    _ln((3, 1, 2050), 1001, "gelu"),
    Case(((5, 1030), (1026, 1030)), {"activation": "relu"}, "float32", ()),
    Case(((4, 1030), (1000, 1030), (1000,)), {"activation": None}, "float16", ()),
)


@pytest.mark.parametrize("name", ["numpy.linear.numba", "numpy.linear.blas"])
def test_linear_few_rows_large_weights(name):
    from opruntime_numpy import linear

    fc = OPS["linear"].problem_for(CPU, [(4, 2048), (1000, 2048), (1000,)], "float32")
    assert linear.is_skinny(fc) and linear._split_groups(fc) == 8
    clean(check_kernel(registry().kernels[name], CPU, cases=SKINNY))
    assert "chosen: numpy.linear.numba" in str(opr.explain(
        "linear", np.zeros((4, 2048), np.float32), np.zeros((1000, 2048), np.float32), np.zeros(1000, np.float32),
        device="cpu"))


def test_attention_cost_prefers_flash_from_medium_sizes():
    """The cost model ranks flash above the NumPy kernel on the suite's and the GPT-2 block's shapes."""
    from opruntime.kernels import Problem  # noqa: F401  (the explain text is the check)

    for shape in [(1, 4, 512, 64), (8, 12, 1024, 64), (1, 12, 1, 64)]:
        q = np.zeros(shape, np.float32)
        kv = np.zeros((*shape[:2], 1024, 64), np.float32)
        text = str(opr.explain("scaled_dot_product_attention", q, kv, kv, device="cpu"))
        assert "chosen: numpy.scaled_dot_product_attention.numba" in text, text
    assert attention.NUMBA_CONFIGS[0] == {"qblock": 64, "kblock": 1024}
