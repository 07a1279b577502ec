"""Selection with the fake backend: cost ranking, pins, cached decisions, fallback, explain."""

from __future__ import annotations

import numpy as np
import pytest

import opruntime as opr
from opruntime.errors import ConfigError, FallbackWarning, KernelError, NoKernelError


def operands(rng, device="fake:0", m=4, k=5, n=3):
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    return a, b, opr.tensor(a, device=device), opr.tensor(b, device=device)


def test_lowest_cost_wins(fake, rng):
    a, b, ta, tb = operands(rng)
    out = opr.matmul(ta, tb)
    assert fake.calls["run:a"] == 1 and fake.calls["run:b"] == 0
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5)
    fake.knobs["a"].cost, fake.knobs["c"].cost = 10.0, 0.5  # a new problem sees the new costs
    opr.matmul(opr.tensor(a[:3], device="fake:0"), tb)
    assert fake.calls["run:c"] == 1


def test_decision_is_cached(fake, rng):
    _, _, ta, tb = operands(rng)
    for _ in range(5):
        opr.matmul(ta, tb)
    assert fake.calls["run:a"] == 5
    assert fake.calls["cost:a"] == 1 and fake.calls["supports:a"] == 1  # one search for five calls


def test_unsupported_kernel_skipped(fake, rng):
    fake.knobs["a"].supports = False
    _, _, ta, tb = operands(rng)
    opr.matmul(ta, tb)
    assert fake.calls["run:b"] == 1 and fake.calls["run:a"] == 0


def test_no_kernel_supports(fake, rng):
    for k in fake.knobs.values():
        k.supports = False
    _, _, ta, tb = operands(rng)
    with pytest.raises(NoKernelError, match="fake.matmul.a: does not support"):
        opr.matmul(ta, tb)


def test_pinned_kernel_wins(fake, rng):
    opr.configure(ops={"matmul": {"kernel": "fake.matmul.c"}})
    _, _, ta, tb = operands(rng)
    opr.matmul(ta, tb)
    assert fake.calls["run:c"] == 1
    assert "pinned by configure()" in str(opr.explain("matmul", ta, tb))


def test_pinned_unknown_kernel_suggests(fake, rng):
    opr.configure(ops={"matmul": {"kernel": "fake.matmul.cc"}})
    _, _, ta, tb = operands(rng)
    with pytest.raises(ConfigError, match="Did you mean 'fake.matmul.c'"):
        opr.matmul(ta, tb)


def test_pinned_kernel_that_cannot_run_is_announced(fake, rng):
    fake.knobs["c"].supports = False
    opr.configure(ops={"matmul": {"kernel": "fake.matmul.c"}})
    _, _, ta, tb = operands(rng)
    with pytest.warns(FallbackWarning, match="pinned kernel 'fake.matmul.c' cannot run"):
        opr.matmul(ta, tb)
    assert fake.calls["run:a"] == 1


def test_failing_kernel_falls_back_once(fake, rng):
    fake.knobs["a"].fail = RuntimeError("launch failed")
    a, b, ta, tb = operands(rng)
    with pytest.warns(FallbackWarning, match="kernel 'fake.matmul.a' failed .* launch failed; using 'fake.matmul.b'"):
        out = opr.matmul(ta, tb)
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5)
    opr.matmul(ta, tb)  # the failed kernel is dropped for this problem: no second warning, no retry
    assert fake.calls["run:a"] == 1 and fake.calls["run:b"] == 2


def test_strict_mode_raises_instead_of_falling_back(fake, rng):
    fake.knobs["a"].fail = RuntimeError("launch failed")
    opr.configure(strict=True)
    _, _, ta, tb = operands(rng)
    with pytest.raises(KernelError, match="strict mode"):
        opr.matmul(ta, tb)


def test_every_kernel_failing_raises(fake, rng):
    for k in fake.knobs.values():
        k.fail = RuntimeError("broken")
    _, _, ta, tb = operands(rng)
    with pytest.warns(FallbackWarning), pytest.raises(KernelError, match="every kernel failed"):
        opr.matmul(ta, tb)


def test_explain_lists_candidates(fake, rng):
    fake.knobs["b"].supports = False
    _, _, ta, tb = operands(rng)
    text = str(opr.explain("matmul", ta, tb))
    assert "chosen: fake.matmul.a -- lowest cost estimate" in text
    assert "fake.matmul.b" in text and "does not support this problem" in text
    assert "[cached decision]" not in text
    opr.matmul(ta, tb)
    assert "[cached decision]" in str(opr.explain("matmul", ta, tb))


def test_tune_off_uses_registration_order(fake, rng):
    fake.knobs["a"].cost, fake.knobs["b"].cost = 5.0, 1.0
    opr.configure(tune="off")
    _, _, ta, tb = operands(rng)
    opr.matmul(ta, tb)
    assert fake.calls["run:a"] == 1


def test_autotune_picks_the_fastest_measured(fake, rng):
    fake.knobs["a"].delay, fake.knobs["b"].delay, fake.knobs["c"].delay = 0.004, 0.0, 0.002
    opr.configure(tune="autotune")
    _, _, ta, tb = operands(rng)
    e = opr.explain("matmul", ta, tb)
    assert e.chosen == "fake.matmul.b" and "tuned now: fastest of 3 timed" in e.why


def test_unknown_op_in_explain():
    with pytest.raises(NoKernelError, match="did you mean 'softmax'"):
        opr.explain("sofmax", np.ones(3))
