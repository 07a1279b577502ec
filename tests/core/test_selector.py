"""Selection with the fake backend: cost ranking, pins, cached decisions, fallback, explain."""

from __future__ import annotations

import numpy as np
import pytest

import opruntime as opr
from opruntime.errors import ConfigError, FallbackWarning, KernelError, NoKernelError
from opruntime.ops import OPS


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
    from opruntime import ops

    assert opr.explain is ops.explain  # explain lives with the operators, re-exported
    with pytest.raises(NoKernelError, match="did you mean 'softmax'"):
        opr.explain("sofmax", np.ones(3))


# -- finding 3: a kernel whose result breaks the contract is caught, never returned ---------------------
from fake_backend import WRONG_RESULTS, wrong_result  # noqa: E402


@pytest.mark.parametrize("how", WRONG_RESULTS)
def test_finding_3_wrong_result_on_the_first_call_falls_back(fake, rng, how):
    """Finding 3: a result of the wrong shape or dtype, or the operand itself (or a view of it),
    is a failure of the kernel: the next kernel answers, announced once."""
    fake.knobs["a"].result = how
    a, b, ta, tb = operands(rng, m=4, k=4, n=4)  # square: the operand itself has the result's shape
    with pytest.warns(FallbackWarning, match="kernel 'fake.matmul.a' failed .*KernelError: .*using 'fake.matmul.b'"):
        out = opr.matmul(ta, tb)
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5)
    assert out.data is not ta.data and not np.shares_memory(out.data.a, ta.data.a)
    opr.matmul(ta, tb)  # dropped for this problem: no second warning
    assert fake.calls["run:a"] == 1 and fake.calls["run:b"] == 2


VIEW_LATER = pytest.mark.xfail(strict=True, reason=(
    "known limit, reported: after a checked first call the plan's hot path checks class, shape, "
    "dtype and operand identity, not shares_memory (a view of an operand) -- it would cost more "
    "than the rest of the check"))


@pytest.mark.parametrize("how", [pytest.param(h, marks=VIEW_LATER) if h == "view" else h for h in WRONG_RESULTS])
def test_finding_3_wrong_result_after_good_calls_falls_back(fake, rng, how):
    """The plan's hot path (armed after a checked first call) catches a kernel that turns bad."""
    a, b, ta, tb = operands(rng, m=4, k=4, n=4)
    for _ in range(3):
        np.testing.assert_allclose(opr.matmul(ta, tb).numpy(), a @ b, rtol=1e-5)
    fake.knobs["a"].result = how
    with pytest.warns(FallbackWarning, match="kernel 'fake.matmul.a' failed"):
        out = opr.matmul(ta, tb)
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5)
    assert out.data is not ta.data and not np.shares_memory(out.data.a, ta.data.a)
    assert fake.calls["run:b"] == 1


@pytest.mark.parametrize("how", WRONG_RESULTS)
def test_finding_3_wrong_result_in_strict_mode_raises(fake, rng, how):
    fake.knobs["a"].result = how
    opr.configure(strict=True)
    _, _, ta, tb = operands(rng, m=4, k=4, n=4)
    with pytest.raises(KernelError, match="fake.matmul.a.*strict mode"):
        opr.matmul(ta, tb)
    assert fake.calls["run:b"] == 0


@pytest.mark.parametrize("how,later", [
    pytest.param(h, later, id=f"{h}-{'later' if later else 'first'}-call",
                 marks=VIEW_LATER if (h, later) == ("view", True) else ())
    for h in WRONG_RESULTS for later in (False, True)])
def test_finding_3_cpu_kernel_returning_its_input_or_a_view(kernel_plugin, rng, how, later):
    """The same on the cpu device, where a view shares the caller's memory: a softmax kernel that
    returns ``x`` itself, or a view of it, or a wrong shape / dtype, is never the answer."""
    mode = {"how": "ok" if later else how}

    def run(problem, config, x):
        if mode["how"] != "ok":
            return wrong_result(mode["how"], problem, x)
        return OPS["softmax"].reference(x, axis=problem.attrs["axis"]).astype(x.dtype)

    kernel_plugin("bad", opr.Kernel("softmax", "bad.softmax.k", "cpu", frozenset({"float32"}), run,
                                    cost=lambda p, c: 0.0))
    x = rng.standard_normal((5, 7)).astype(np.float32)
    t = opr.tensor(x, device="cpu")
    if later:
        for _ in range(2):
            opr.softmax(t)
        mode["how"] = how
    with pytest.warns(FallbackWarning, match="kernel 'bad.softmax.k' failed .*using 'numpy.softmax.fused'"):
        out = opr.softmax(t)
    assert not np.shares_memory(out.data, t.data)
    np.testing.assert_allclose(out.numpy(), OPS["softmax"].reference(x), rtol=1e-5)
    opr.configure(strict=True)
    with pytest.raises(KernelError, match="bad.softmax.k"):
        opr.softmax(opr.tensor(x[:3], device="cpu"))


# -- plans, keys and the launch cache --------------------------------------------------------------------
def test_a_plan_returns_the_native_array_and_the_public_function_a_tensor(rng):
    from opruntime import selector
    from opruntime.config import settings

    x = rng.standard_normal((3, 5)).astype(np.float32)
    cpu = opr.Device("cpu")
    plan = OPS["softmax"].plan([x], cpu, {"axis": 0}, settings())
    out = plan([x])
    assert type(out) is np.ndarray and plan.problem.device is cpu and plan.kernel.name == "numpy.softmax.fused"
    np.testing.assert_allclose(out, OPS["softmax"].reference(x, axis=0), rtol=1e-5)
    t = opr.softmax(x, axis=0, device="cpu")
    assert isinstance(t, opr.Tensor) and t.device is cpu
    key = OPS["softmax"].key(settings(), cpu, [x], {"axis": 0})
    assert key[2] == (("axis", 0, int),)  # (name, value, type) triples
    assert key in selector.plans and isinstance(selector.plans.get(key), selector.Plan)
    assert OPS["softmax"].key(settings(), cpu, [x], {"axis": np.int64(0)}) != key  # the type is part of it
    assert len(selector.plans) >= 1
    selector.plans.clear()
    assert key not in selector.plans and len(selector.plans) == 0


def test_kernel_call_and_launcher_share_one_prepared_launch(kernel_plugin, rng):
    from opruntime.kernels import LAUNCHES

    prepared = []

    def prepare(problem, config):
        prepared.append((problem, dict(config)))
        axis = problem.attrs["axis"]
        return lambda x: OPS["softmax"].reference(x, axis=axis).astype(x.dtype)

    (k,) = kernel_plugin("prep", opr.Kernel("softmax", "prep.softmax.k", "cpu", frozenset({"float32"}),
                                            prepare=prepare, cost=lambda p, c: 0.0))
    assert k.run is None
    problem = OPS["softmax"].problem_for("cpu", [(4, 6)], "float32", axis=1)
    assert problem.device is opr.Device("cpu") and OPS["softmax"].problem_for(opr.Device("cpu"), [(4, 6)], "float32",
                                                                              axis=1) == problem
    x = rng.standard_normal((4, 6)).astype(np.float32)
    np.testing.assert_allclose(k(problem, {}, x), OPS["softmax"].reference(x, axis=1), rtol=1e-5)
    launch = k.launcher(problem, {})
    assert launch is k.launcher(problem, {}) and len(prepared) == 1  # prepared once, kept in LAUNCHES
    assert (k, problem, ()) in LAUNCHES
    out = opr.softmax(opr.tensor(x, device="cpu"), axis=1)  # the frontend's Problem is equal: the same launch
    np.testing.assert_allclose(out.numpy(), OPS["softmax"].reference(x, axis=1), rtol=1e-5)
    assert len(prepared) == 1
