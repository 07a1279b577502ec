"""scaled_dot_product_attention: the errors, torch's answers (semantics the float64 reference must
share: masks, causal alignment, GQA, broadcasting, fully masked rows), the edges the frontend answers
(S = 0, E = 0), masks as users pass them, long sequences without an L x S buffer, and every kernel
on the whole case table (the conformance suite's CI slice takes four cases)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from conftest import TOLERANCE, random, rel_err, skip_unless_dtype

import opruntime as opr
from opruntime.errors import AttributeValueError, DtypeError, ShapeError, UnknownAttributeError
from opruntime.ops import OPS
from opruntime.ops.base import wide
from opruntime.plugins import registry
from opruntime.testing import CASES, check_kernel, failures, summary

OP = "scaled_dot_product_attention"
SDPA = OPS[OP]
sdpa = opr.scaled_dot_product_attention


def check(out: opr.Tensor, ref: np.ndarray, dtype: str, device: opr.Device) -> None:
    assert isinstance(out, opr.Tensor) and out.device == device
    assert out.shape == ref.shape
    err = rel_err(np.asarray(out.numpy(), np.float64), ref)
    assert err <= TOLERANCE[dtype], f"relative error {err:.2e} > {TOLERANCE[dtype]:.0e} ({dtype})"


# -- errors ----------------------------------------------------------------------------------------------
Q = np.ones((2, 4, 5, 8), np.float32)
K = np.ones((2, 4, 6, 8), np.float32)


@pytest.mark.parametrize("call,error,match", [
    (lambda: sdpa(Q[0, 0, 0], K, K), ShapeError, r"q must be at least 2-D \(\.\.\., L, E\), got shape \(8,\)"),
    (lambda: sdpa(Q, K[..., :7], K), ShapeError, r"q \(2, 4, 5, 8\) and k \(2, 4, 6, 7\) must have the same last dim"),
    (lambda: sdpa(Q, K, K[..., :5, :]), ShapeError, "k .* and v .* must have the same number of keys"),
    (lambda: sdpa(Q, K[:, :2], K[:, :2]), ShapeError, "heads .* do not broadcast; for grouped-query attention .* "
     "enable_gqa=True"),
    (lambda: sdpa(Q, K[:, :3], K[:, :3], enable_gqa=True), ShapeError, "must be a multiple of k's and v's"),
    (lambda: sdpa(Q, K[:, :2], K[:, :1], enable_gqa=True), ShapeError, "k .* and v .* must have the same number of heads"),
    (lambda: sdpa(Q, K, K, np.ones((5, 5), bool)), ShapeError, r"attn_mask \(5, 5\) does not broadcast to .* \(\.\.\., 5, 6\)"),
    (lambda: sdpa(Q, K, K, np.ones((3, 1, 5, 6), bool)), ShapeError, "batch dims .* do not broadcast"),
    (lambda: sdpa(Q, K, K, np.ones((2, 3, 5, 6), bool)), ShapeError, "attn_mask .* does not broadcast to the 4 heads"),
    (lambda: sdpa(Q, K, K, np.ones((5, 6), bool), is_causal=True), AttributeValueError, "not both"),
    (lambda: sdpa(Q, K, K, scale=float("inf")), AttributeValueError, "scale must be None .* or a finite number"),
    (lambda: sdpa(Q, K, K, scale="1"), AttributeValueError, "scale must be"),
    (lambda: sdpa(Q, K, K, is_causal=1), AttributeValueError, "is_causal must be a bool"),
    (lambda: sdpa(Q, K, K, enable_gqa="yes"), AttributeValueError, "enable_gqa must be a bool"),
    (lambda: sdpa(Q.astype(np.int32), K, K), DtypeError, "scaled_dot_product_attention: dtype int32"),
    (lambda: sdpa(Q, K, K, np.ones((5, 6), np.int64)), DtypeError, "dtype int64"),
    (lambda: sdpa(np.ones((2, 3, 4, 5, 8), np.float32), np.ones((2, 1, 4, 6, 8), np.float32),
                  np.ones((2, 1, 4, 6, 8), np.float32)), ShapeError, "broadcast to .* only partly .* repeat k"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_errors_name_the_op_the_operand_and_the_fix(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_unknown_attribute():
    with pytest.raises(UnknownAttributeError, match=r"scaled_dot_product_attention\(\) got unexpected keyword "
                                                    r"argument\(s\) dropout_p"):
        SDPA(Q, K, K, dropout_p=0.1)


# -- the reference is torch's function -----------------------------------------------------------------------
@pytest.mark.parametrize("case", SDPA.cases + SDPA.empty, ids=lambda c: c.id)
def test_reference_agrees_with_torch(case, rng):
    torch = pytest.importorskip("torch")
    arrays = SDPA.sample([random(rng, s, "float64") for s in case.shapes], case)
    want_kw = dict(case.attrs)
    if len(arrays) > 3:
        want_kw["attn_mask"] = torch.from_numpy(arrays[3])
    want = torch.nn.functional.scaled_dot_product_attention(*map(torch.from_numpy, arrays[:3]), **want_kw).numpy()
    got = SDPA.reference(*wide(arrays), **case.attrs)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


# -- masks: fully masked rows, NaN, the forms users pass ------------------------------------------------------
def test_fully_masked_rows_give_zeros_and_nan_gives_nan(device, rng):
    q, k, v = random(rng, (2, 3, 5, 16), "float32"), random(rng, (2, 3, 7, 16), "float32"), random(rng, (2, 3, 7, 8), "float32")
    keep = rng.random((5, 7)) > 0.3
    keep[1] = False
    keep[3, 0] = True
    bias = np.where(keep, 0.0, -np.inf).astype(np.float32)
    want = SDPA.reference(*wide([q, k, v]), keep)
    assert (want[:, :, 1] == 0).all()
    for mask in (keep, bias):
        out = sdpa(q, k, v, mask, device=device)
        check(out, want, "float32", device)
        assert (out.numpy()[:, :, 1] == 0).all()
    bias[2, 4] = np.nan
    got = sdpa(q, k, v, bias, device=device).numpy()
    assert np.isnan(got[:, :, 2]).all() and not np.isnan(np.delete(got, 2, axis=2)).any()


def test_a_boolean_mask_as_python_lists_stays_boolean(device, rng):
    q, k = random(rng, (3, 4), "float32"), random(rng, (5, 4), "float32")
    mask = [[True, False, True, True, False]] * 3
    want = SDPA.reference(*wide([q, k, k]), np.array(mask))
    check(sdpa(q, k, k, mask, device=device), want, "float32", device)


def test_a_float32_mask_with_float16_operands_gives_float16(device, rng):
    skip_unless_dtype(device, OP, "float16")
    q, k = random(rng, (2, 6, 16), "float16"), random(rng, (2, 9, 16), "float16")
    mask = random(rng, (6, 9), "float32")
    out = sdpa(q, k, k, mask, device=device)
    assert out.dtype == np.float16
    check(out, SDPA.reference(*wide([q, k, k, mask.astype(np.float16)])), "float16", device)


def test_causal_is_top_left_for_every_l_and_s(device, rng):
    for L, S in ((1, 9), (9, 1), (4, 11), (11, 4), (8, 8)):
        q, k, v = random(rng, (2, L, 8), "float32"), random(rng, (2, S, 8), "float32"), random(rng, (2, S, 3), "float32")
        check(sdpa(q, k, v, is_causal=True, device=device),
              SDPA.reference(*wide([q, k, v]), is_causal=True), "float32", device)


# -- edges the frontend answers ------------------------------------------------------------------------------
def test_no_keys_gives_zeros_and_no_features_gives_the_mean(device, rng):
    q, v = random(rng, (2, 3, 0), "float32"), random(rng, (2, 4, 5), "float32")
    out = sdpa(q, np.ones((2, 4, 0), np.float32), v, device=device)
    check(out, np.broadcast_to(v.astype(np.float64).mean(axis=1, keepdims=True), (2, 3, 5)), "float32", device)
    mask = np.array([True, False, True, True])
    out = sdpa(q, np.ones((2, 4, 0), np.float32), v, mask, device=device)
    check(out, np.broadcast_to(v[:, mask].astype(np.float64).mean(axis=1, keepdims=True), (2, 3, 5)), "float32",
          device)
    out = sdpa(random(rng, (2, 3, 4), "float32"), np.ones((2, 0, 4), np.float32), np.ones((2, 0, 6), np.float32),
               device=device)
    assert out.shape == (2, 3, 6) and (out.numpy() == 0).all() and out.device == device


def test_scale_none_is_one_over_sqrt_e(device, rng):
    q, k, v = (random(rng, (4, 6, 32), "float32") for _ in range(3))
    base = sdpa(q, k, v, device=device).numpy()
    np.testing.assert_allclose(base, sdpa(q, k, v, scale=32 ** -0.5, device=device).numpy(), rtol=1e-5, atol=1e-6)
    assert rel_err(sdpa(q, k, v, scale=1.0, device=device).numpy(), base) > 1e-2


# -- long sequences: no L x S buffer ------------------------------------------------------------------------
def test_a_long_sequence_needs_no_l_by_s_buffer():
    """S = 32768 keys for 8 heads: an L x S float32 score buffer would be 256 MB; the CPU kernel's
    peak allocation during the call stays under a tenth of it (its inputs are 48 MB each)."""
    rng = np.random.default_rng()
    B, H, L, S, E = 1, 8, 256, 32768, 128
    q, k, v = (random(rng, (B, H, n, E), "float32") for n in (L, S, S))
    tracemalloc.start()
    try:
        out = sdpa(q, k, v, is_causal=False, device="cpu").numpy()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < H * L * S * 4 / 10, f"peak {peak / 2**20:.0f} MiB"
    rows = [0, 97, L - 1]
    want = SDPA.reference(q[:, :, rows].astype(np.float64), k.astype(np.float64), v.astype(np.float64))
    assert rel_err(out[:, :, rows], want) <= TOLERANCE["float32"]


# -- every kernel on every case ------------------------------------------------------------------------------
def test_every_kernel_on_every_case(device):
    """The whole case table (the CI conformance slice takes four): on accelerators in every dtype, on
    CPU-side devices in float32 and float16."""
    kernels = registry().kernels_for(OP, device.kind)
    if not kernels:
        pytest.skip(f"no {OP} kernel for {device.kind}")
    rng = np.random.default_rng()
    dtypes = None if device.provider.accelerator else ["float32", "float16"]
    findings = []
    for k in kernels:
        findings += check_kernel(k, device, CASES[OP], dtypes=dtypes, configs="first", rng=rng)
    bad = failures(findings)
    assert not bad, summary(bad)
