"""Concurrency: 8 threads call every operator on different devices under different configuration
contexts (``opr.device`` / ``opr.override``) at once. Every result is right, lands on the thread's
own device, and no thread ever sees another thread's settings (or runs the kernel another
thread pinned)."""

# ruff: noqa: BLE001 - whatever a plugin (or a thread) raises is reported, never let through

from __future__ import annotations

import asyncio
import threading
import types
from collections import defaultdict

import numpy as np
import pytest

import opruntime as opr
from opruntime import selector
from opruntime.config import settings
from opruntime.ops import OPS
from opruntime.plugins import registry
from opruntime.testing import TOLERANCE, rel_err

THREADS = 8
ROUNDS = 12
SHAPES = {"matmul": [((5, 7), (7, 3)), ((2, 4, 6), (6, 5)), ((9,), (9, 4))],
          "softmax": [((4, 9),), ((3, 2, 5),), ((17,),)],
          "log_softmax": [((4, 9),), ((3, 2, 5),), ((17,),)],
          "conv2d": [((1, 3, 6, 6), (4, 3, 3, 3)), ((2, 2, 5, 5), (2, 1, 3, 3))]}
CONV_ATTRS = [{"padding": 1}, {"groups": 2, "stride": 2}]


@pytest.fixture
def spy():
    """A cpu softmax that records which threads ran it; it never wins unless pinned (cost 1 s)."""
    calls: dict[int, int] = defaultdict(int)

    def run(problem, config, x):
        calls[threading.get_ident()] += 1
        return OPS["softmax"].reference(x, axis=problem.attrs["axis"]).astype(x.dtype)

    kernel = opr.Kernel("softmax", "spy.softmax.counting", "cpu", frozenset({"float32", "float64"}), run,
                        cost=lambda p, c: 1.0)

    @opr.hookimpl
    def opruntime_kernels():
        return [kernel]

    opr.register(types.SimpleNamespace(opruntime_kernels=opruntime_kernels, __name__="spy"), name="spy")
    yield calls
    opr.unregister("spy")


def _plans(names: list[str]) -> list[dict]:
    """One context per thread: a device each (round robin over those present), and a mix of
    ``opr.device``, ``opr.override`` with tune / strict / a pinned kernel, and no context at all."""
    out = []
    for i in range(THREADS):
        dev = names[i % len(names)]
        kind = ["device", "override", "override-pinned", "none"][i % 4]
        if kind == "none":
            dev = registry().devices[0].name  # the default device
        elif kind == "override-pinned":
            dev = "cpu"  # where the pinned spy kernel runs
        out.append({"device": dev, "context": kind})
    return out


def _worker(i: int, plan: dict, barrier: threading.Barrier, errors: list, seen: dict) -> None:
    rng = np.random.default_rng(i)
    dev = plan["device"]
    kind = registry().device(dev).kind
    ops = [op for op in SHAPES if registry().kernels_for(op, kind)]
    if plan["context"] == "device":
        ctx = opr.device(dev)
    elif plan["context"] == "override":
        ctx = opr.override(device=dev, tune="off", strict=True)
    elif plan["context"] == "override-pinned":
        ctx = opr.override(device=dev, ops={"softmax": {"kernel": "spy.softmax.counting"}})
    else:
        ctx = _Nothing()
    try:
        barrier.wait(timeout=60)
        with ctx:
            mine = settings()
            for r in range(ROUNDS):
                op = ops[r % len(ops)]
                case = r // len(ops) % len(SHAPES[op])
                shapes = SHAPES[op][case]
                attrs = CONV_ATTRS[case] if op == "conv2d" else {}
                xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
                out = getattr(opr, op)(*xs, **attrs)
                if settings() is not mine:
                    errors.append(f"thread {i}: settings changed under it: {settings()!r} != {mine!r}")
                if out.device.name != dev:
                    errors.append(f"thread {i} ({plan}): {op} ran on {out.device.name}, expected {dev}")
                err = rel_err(out.numpy(), OPS[op].reference(*xs, **attrs))
                if not err <= TOLERANCE["float32"]:
                    errors.append(f"thread {i} on {dev}: {op} {shapes} relative error {err:.2e}")
            seen[i] = mine
        if plan["context"] != "none" and settings().device:
            errors.append(f"thread {i}: its context outlived the with block: {settings()!r}")
    except Exception as exc:  # report, do not hang the barrier
        barrier.abort()
        errors.append(f"thread {i} ({plan}): {type(exc).__name__}: {exc}")


class _Nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def test_eight_threads_different_devices_and_contexts(spy):
    names = [d.name for d in registry().devices if not d.name.startswith("cuda")] or [registry().devices[0].name]
    plans = _plans(names)
    barrier = threading.Barrier(THREADS)
    errors: list[str] = []
    seen: dict[int, object] = {}
    threads = [threading.Thread(target=_worker, args=(i, p, barrier, errors, seen)) for i, p in enumerate(plans)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, "\n".join(errors)
    assert len(seen) == THREADS
    for i, p in enumerate(plans):
        s = seen[i]
        want = () if p["context"] == "none" else (p["device"],)
        assert s.device == want, (i, p, s)
        assert s.strict == (p["context"] == "override")
        assert (s.tune == "off") == (p["context"] == "override")
        assert ("softmax" in s.ops) == (p["context"] == "override-pinned")
    # the spy kernel ran in (and only in) the threads that pinned it on the cpu
    pinned_cpu = {t.ident for t, p in zip(threads, plans) if p["context"] == "override-pinned" and p["device"] == "cpu"}
    ran = {ident for ident, n in spy.items() if n}
    assert ran == pinned_cpu, f"spy kernel ran in threads {ran}, pinned in {pinned_cpu}"


def test_a_new_thread_does_not_inherit_the_starting_threads_context(rng):
    default = registry().devices[0].name
    other = next((d.name for d in registry().devices if d.name != default), None)
    if other is None:
        pytest.skip("needs two devices")
    got = {}

    def child():
        got["device"] = opr.softmax(rng.standard_normal(5).astype(np.float32)).device.name
        got["settings"] = settings().device

    with opr.device(other):
        t = threading.Thread(target=child)
        t.start()
        t.join()
        assert opr.softmax(rng.standard_normal(5).astype(np.float32)).device.name == other
    assert got == {"device": default, "settings": ()}


def test_asyncio_tasks_keep_their_own_device(rng):
    names = [d.name for d in registry().devices][:3]

    async def task(dev: str) -> list[str]:
        out = []
        with opr.device(dev):
            for _ in range(5):
                await asyncio.sleep(0)  # let the other tasks run inside their own contexts
                out.append(opr.matmul(rng.standard_normal((3, 4)).astype(np.float32),
                                      rng.standard_normal((4, 2)).astype(np.float32)).device.name)
        return out

    async def main():
        return await asyncio.gather(*(task(d) for d in names))

    results = asyncio.run(main())
    for dev, got in zip(names, results):
        assert got == [dev] * 5


def test_concurrent_first_calls_share_one_plan_per_problem(rng):
    """Threads racing on a problem nobody has seen: every result right, one plan cached."""
    barrier = threading.Barrier(THREADS)
    a, b = rng.standard_normal((31, 17)).astype(np.float32), rng.standard_normal((17, 13)).astype(np.float32)
    outs, errors = [None] * THREADS, []
    selector.plans.clear()

    def call(i):
        try:
            barrier.wait(timeout=30)
            outs[i] = opr.matmul(opr.tensor(a, device="cpu"), opr.tensor(b, device="cpu")).numpy()
        except Exception as exc:
            errors.append(repr(exc))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for out in outs:
        np.testing.assert_allclose(out, a @ b, rtol=1e-5)
    key = OPS["matmul"].key(settings(), opr.Device("cpu"), [a, b], {})
    assert key in selector.plans and len(selector.plans) == 1  # one plan for the problem, nothing else


@pytest.mark.parametrize("op", list(OPS))
def test_eight_threads_one_device_same_kernel(device, op):
    """Every thread runs the same kernel on the same device with its own data: a kernel object or
    buffer shared between threads (e.g. OpenCL arguments set on one cl.Kernel) shows up as a
    wrong result. Every operator: the shapes above, else the operator's first quick case."""
    if not registry().kernels_for(op, device.kind):
        pytest.skip(f"no {op} kernel for {device.kind}")
    if op in SHAPES:
        shapes, attrs = SHAPES[op][0], (CONV_ATTRS[0] if op == "conv2d" else {})
    else:
        case = OPS[op].cases[OPS[op].quick[0]]
        shapes, attrs = case.shapes, dict(case.attrs)
    barrier = threading.Barrier(THREADS)
    errors: list[str] = []

    def work(i):
        rng = np.random.default_rng(100 + i)
        try:
            barrier.wait(timeout=60)
            for _ in range(25):
                xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
                # operands by name: layer_norm's normalized_shape comes before its weight (torch's order)
                out = getattr(opr, op)(**dict(zip(OPS[op].operands, [opr.tensor(x, device=device) for x in xs])),
                                       **attrs)
                err = rel_err(out.numpy(), OPS[op].reference(*xs, **attrs))
                if not err <= TOLERANCE["float32"]:
                    errors.append(f"thread {i}: relative error {err:.2e}")
        except Exception as exc:
            barrier.abort()
            errors.append(f"thread {i}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, "\n".join(errors[:10])


def test_finding_10_a_kernel_failing_under_eight_threads_is_dropped_once(fake, rng):
    """Finding 10: a kernel that starts failing while 8 threads use its plan. Every thread gets a
    right result (from the next kernel), the failure is announced exactly once, the healthy
    kernel is not blamed for it (it stays in the plan, its status "ok"), and the plan keeps
    answering afterwards."""
    import warnings

    a, b = rng.standard_normal((6, 5)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
    ta, tb = opr.tensor(a, device="fake:0"), opr.tensor(b, device="fake:0")
    opr.matmul(ta, tb)  # the plan, with fake.matmul.a first and armed
    knob = fake.knobs["a"]
    turn = threading.Barrier(THREADS, action=lambda: setattr(knob, "fail", RuntimeError("ECC error")))
    errors: list[str] = []

    def work(i):
        try:
            for n in range(30):
                if n == 10:
                    turn.wait(timeout=60)  # everyone is mid-use of the plan when the kernel turns bad
                out = opr.matmul(ta, tb).numpy()
                if not rel_err(out, a @ b) <= TOLERANCE["float32"]:
                    errors.append(f"thread {i} call {n}: wrong result")
        except Exception as exc:
            turn.abort()
            errors.append(f"thread {i}: {type(exc).__name__}: {exc}")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, "\n".join(errors[:10])
    said = [str(w.message) for w in caught if issubclass(w.category, opr.errors.FallbackWarning)]
    assert len(said) == 1 and "kernel 'fake.matmul.a' failed" in said[0] and "using 'fake.matmul.b'" in said[0], said
    assert not [w for w in caught if not issubclass(w.category, opr.errors.FallbackWarning)]
    plan = selector.plans.get(OPS["matmul"].key(settings(), opr.Device("fake:0"), [ta.data, tb.data], {}))
    assert [c.kernel.name for c in plan.order] == ["fake.matmul.b", "fake.matmul.c"]  # b not blamed, not dropped
    status = {c.kernel.name: c.status for c in plan.rows}
    assert status["fake.matmul.a"].startswith("failed: RuntimeError: ECC error")
    assert status["fake.matmul.b"] == status["fake.matmul.c"] == "ok"
    ran_a = fake.calls["run:a"]
    assert ran_a <= 11 + THREADS * 10  # the calls before the turn, and at most one failing call per thread
    for _ in range(5):  # not poisoned: the next calls take b's armed launch, a is never tried again
        np.testing.assert_allclose(opr.matmul(ta, tb).numpy(), a @ b, rtol=1e-5)
    assert fake.calls["run:a"] == ran_a and fake.calls["run:c"] == 0
