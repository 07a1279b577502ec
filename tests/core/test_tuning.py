"""Autotuning and selection from the persistent tuning cache, with the fake backend's controllable
timings (the cache file itself: ``test_cache.py``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import opruntime as opr
from opruntime import cache, selector, tuning


def operands(rng, m=4, k=5, n=3, device="fake:0"):
    return (opr.tensor(rng.standard_normal((m, k)).astype(np.float32), device=device),
            opr.tensor(rng.standard_normal((k, n)).astype(np.float32), device=device))


def delays(fake, **d):
    for name, delay in d.items():
        fake.knobs[name].delay = delay


def forget_decisions():
    """A fresh process as far as the in-memory decisions go (the sqlite file stays)."""
    selector.clear_cache()


def test_fastest_wins_and_is_stored(fake, rng):
    delays(fake, a=0.003, b=0.0, c=0.001)
    opr.configure(tune="autotune")
    a, b = operands(rng)
    opr.matmul(a, b)
    assert fake.calls["run:b"] >= 2
    entries = list(cache.tuning_cache().entries())
    assert len(entries) == 1 and entries[0].kernel == "fake.matmul.b" and entries[0].device_name == "fake:0"
    assert {c["kernel"] for c in entries[0].candidates} == {"fake.matmul.a", "fake.matmul.b", "fake.matmul.c"}


def test_cached_result_is_reused_without_timing(fake, rng):
    delays(fake, a=0.003, b=0.0, c=0.001)
    opr.configure(tune="autotune")
    a, b = operands(rng)
    opr.matmul(a, b)
    forget_decisions()
    runs = lambda: {k: v for k, v in fake.calls.items() if k.startswith("run:")}  # noqa: E731
    before = runs()
    e = opr.explain("matmul", a, b)
    assert e.chosen == "fake.matmul.b" and "tuned earlier" in e.why
    assert runs() == before  # no kernel ran: the answer came from the file
    opr.configure(tune="heuristic")  # the heuristic mode reads the cache too
    forget_decisions()
    assert "tuned earlier" in opr.explain("matmul", a, b).why


def test_source_change_invalidates(fake, rng):
    delays(fake, a=0.003, b=0.0, c=0.001)
    opr.configure(tune="autotune")
    a, b = operands(rng)
    opr.matmul(a, b)
    fake.knobs["b"].source = "v2"  # a new kernel source: the old result must not be trusted
    opr.unregister("fake")
    opr.register(fake, name="fake")
    a, b = operands(rng)
    runs = fake.calls["run:b"]
    assert "tuned now" in opr.explain("matmul", a, b).why
    assert fake.calls["run:b"] > runs


def test_failing_candidate_scores_unusable(fake, rng):
    fake.knobs["b"].fail = RuntimeError("bad launch")
    delays(fake, a=0.002, c=0.0)
    opr.configure(tune="autotune")
    a, b = operands(rng)
    e = opr.explain("matmul", a, b)
    assert e.chosen == "fake.matmul.c"
    status = {c.kernel.name: c.status for c in e.candidates}
    assert status["fake.matmul.b"].startswith("failed while tuning: RuntimeError: bad launch")
    stored = next(cache.tuning_cache().entries())
    assert any(c["status"].startswith("failed") and c["time_s"] is None for c in stored.candidates)


def test_early_stop_and_budget(fake, rng):
    delays(fake, a=0.0, b=0.02, c=0.0)
    opr.configure(tune="autotune")
    a, b = operands(rng)
    e = opr.explain("matmul", a, b)
    status = {c.kernel.name: c.status for c in e.candidates}
    assert status["fake.matmul.b"].startswith("stopped early")
    assert fake.calls["run:b"] == 2  # one warm-up, one timed run, then dropped
    opr.configure(tune_budget=0.05)
    delays(fake, a=0.03, b=0.03, c=0.03)
    a, b = operands(rng, m=6)
    e = opr.explain("matmul", a, b)
    assert any(c.status.startswith("not timed: the 0.05 s tuning budget") for c in e.candidates)


def test_top_k_keeps_vendor(fake, rng):
    fake.knobs["c"].vendor = True  # the highest estimate, but the vendor baseline
    opr.unregister("fake")
    opr.register(fake, name="fake")
    opr.configure(tune="autotune", tune_top_k=1)
    a, b = operands(rng)
    status = {c.kernel.name: c.status for c in opr.explain("matmul", a, b).candidates}
    assert status["fake.matmul.b"].startswith("pruned")
    assert status["fake.matmul.a"] == "ok" and status["fake.matmul.c"] == "ok"


def test_vendor_is_timed_first(fake, rng, monkeypatch):
    fake.knobs["c"].vendor = True  # the highest estimate: timed first all the same, as the baseline
    opr.unregister("fake")
    opr.register(fake, name="fake")
    seen = []
    monkeypatch.setattr(tuning, "reporter", lambda i, n, c: seen.append(c and c.kernel.name))
    opr.configure(tune="autotune")
    opr.matmul(*operands(rng))
    assert seen == ["fake.matmul.c", "fake.matmul.a", "fake.matmul.b", None]


def test_budget_stops_before_a_candidate_that_would_overrun_it(fake, rng):
    # each candidate takes ~8 runs of 30 ms (warm-up, first, 3 timed, 3 back to back): 0.24 s;
    # with 0.3 s the second would end at ~0.5 s, so it is not started
    delays(fake, a=0.03, b=0.03, c=0.03)
    opr.configure(tune="autotune", tune_budget=0.3)
    status = {c.kernel.name: c.status for c in opr.explain("matmul", *operands(rng)).candidates}
    assert status["fake.matmul.a"] == "ok"
    assert status["fake.matmul.b"].startswith("not timed: the 0.3 s tuning budget was spent")
    assert status["fake.matmul.c"].startswith("not timed")


def test_first_use_in_autotune_mode_retimes_near_ties(fake, rng, monkeypatch):
    # a and b 2% apart: a near tie, with room for this machine's jitter on 10 ms sleeps
    monkeypatch.setattr(tuning, "REFINE_WITHIN", 0.3)
    delays(fake, a=0.010, b=0.0102, c=0.05)
    opr.configure(tune="autotune")
    a, b = operands(rng)
    assert opr.explain("matmul", a, b).chosen == "fake.matmul.a"
    forget_decisions()  # a new process, where b happens to be the faster one
    delays(fake, a=0.02, b=0.010)
    runs_c = fake.calls["run:c"]
    e = opr.explain("matmul", a, b)
    assert e.chosen == "fake.matmul.b" and "tuned earlier" in e.why and "2 near ties re-timed here" in e.why
    assert "fake.matmul.b faster by" in e.why
    assert fake.calls["run:c"] == runs_c  # the far candidate is not timed again
    assert next(cache.tuning_cache().entries()).kernel == "fake.matmul.a"  # the cache keeps its entry
    forget_decisions()
    opr.configure(tune="heuristic")  # no timing outside autotune mode: the cached winner
    e = opr.explain("matmul", a, b)
    assert e.chosen == "fake.matmul.a" and "re-timed" not in e.why


def test_recheck_that_cannot_run_keeps_the_cached_choice(fake, rng, monkeypatch):
    delays(fake, a=0.010, b=0.0102, c=0.05)
    opr.configure(tune="autotune")
    a, b = operands(rng)
    assert opr.explain("matmul", a, b).chosen == "fake.matmul.a"
    forget_decisions()

    def no_room(*args, **kwargs):
        raise MemoryError("no room for the operands")

    monkeypatch.setattr(tuning, "random_inputs", no_room)
    e = opr.explain("matmul", a, b)
    assert e.chosen == "fake.matmul.a" and "tuned earlier" in e.why and "re-timed" not in e.why


def test_no_room_to_tune_falls_back_to_the_estimates(fake, rng, monkeypatch):
    def no_room(*args, **kwargs):
        raise MemoryError("no room for the operands")

    monkeypatch.setattr(tuning, "random_inputs", no_room)
    opr.configure(tune="autotune")
    a, b = operands(rng)
    e = opr.explain("matmul", a, b)
    assert e.chosen == "fake.matmul.a" and "heuristic" in e.why  # the lowest estimate, nothing stored
    assert not list(cache.tuning_cache().entries())
    assert np.allclose(np.asarray(opr.matmul(a, b)), np.asarray(a) @ np.asarray(b), rtol=1e-5)


def test_ties_give_a_stable_choice(fake, rng, monkeypatch):
    # the re-check of near ties on first use keeps the cached winner unless another is faster by
    # the margin; a wide margin here, so that the VM's jitter between equal kernels stays inside it
    monkeypatch.setattr(tuning, "RECHECK_MARGIN", 0.5)
    opr.configure(tune="autotune")
    a, b = operands(rng)
    first = opr.explain("matmul", a, b).chosen
    forget_decisions()
    assert opr.explain("matmul", a, b).chosen == first


@pytest.mark.parametrize("n,bucketed", [(0, 0), (1, 1), (2, 2), (3, 4), (64, 64), (65, 128), (1000, 1024)])
def test_bucket(n, bucketed):
    assert tuning.bucket(n) == bucketed


def test_pow2_buckets_share_results(fake, rng):
    opr.configure(tune="autotune", ops={"matmul": {"bucket": "pow2"}})
    delays(fake, a=0.002, b=0.0, c=0.002)
    opr.matmul(*operands(rng, m=5, k=6, n=7))
    delays(fake, a=0.0, b=0.002, c=0.002)  # would now tune differently...
    e = opr.explain("matmul", *operands(rng, m=7, k=8, n=5))  # ...but (7,8,5) shares (5,6,7)'s bucket
    assert e.chosen == "fake.matmul.b" and "tuned earlier" in e.why
    assert len(list(cache.tuning_cache().entries())) == 1


def test_trace_records_calls(tmp_path, rng):
    x = rng.standard_normal((8, 16)).astype(np.float32)
    with opr.trace() as t:
        opr.softmax(opr.matmul(x, x.T))
        opr.softmax(np.zeros((0, 3), np.float32))
    assert [e.op for e in t.events] == ["matmul", "softmax", "softmax"]
    assert t.events[0].kernel == "numpy.matmul.blas" and t.events[0].duration_s > 0
    assert t.events[2].kernel == "(frontend: empty)"
    path = tmp_path / "trace.json"
    t.save(path)
    data = json.loads(path.read_text())
    assert data["traceEvents"][0]["ph"] == "X" and data["traceEvents"][0]["name"] == "numpy.matmul.blas"
    assert "numpy.softmax.fused" in t.summary()
    opr.matmul(x, x.T)
    assert len(t.events) == 3  # inactive after the block


def test_host_bound_kernel_is_not_chosen_on_device_time_alone(fake, rng, monkeypatch):
    from fake_backend import FakeDevice

    monkeypatch.setattr(FakeDevice, "time", lambda self, fn, repeats=20, warmup=3: [fn(), 1e-7][1:] * repeats)
    delays(fake, a=0.003, b=0.0, c=0.003)  # every kernel shows 0.1 us of "device time"; a and c sleep on the host
    opr.configure(tune="autotune")
    e = opr.explain("matmul", *operands(rng))
    assert e.chosen == "fake.matmul.b"
    measured = {c.kernel.name: c.measured for c in e.candidates}
    assert measured["fake.matmul.a"] >= 0.003


def test_refine_retimes_near_ties_together():
    """Candidates within 5% of the best after the first pass are timed again in shuffled rounds,
    and those scores decide: here the first pass had them the wrong way round."""
    import time as _time
    from types import SimpleNamespace

    class Prov:
        def synchronize(self):
            pass

    slow, fast, far = SimpleNamespace(measured=1.00e-3), SimpleNamespace(measured=1.03e-3), SimpleNamespace(measured=5e-3)
    calls = {id(slow): lambda: _time.sleep(3e-3), id(fast): lambda: _time.sleep(1e-3), id(far): lambda: None}
    timed = [slow, fast, far]
    assert tuning.refine(Prov(), timed, calls, deadline=_time.perf_counter() + 5)
    assert fast.measured < slow.measured
    assert far.measured == 5e-3  # not close to the best: not timed again
    assert not tuning.refine(Prov(), [far], calls, deadline=_time.perf_counter() + 5)  # nothing to break a tie with
    spent = SimpleNamespace(measured=1e-3), SimpleNamespace(measured=1e-3)
    assert not tuning.refine(Prov(), list(spent), {id(c): (lambda: None) for c in spent}, deadline=0.0)  # no budget left


def test_each_tuning_decision_is_logged(fake, rng, caplog):
    """``log_tuning`` (OPRUNTIME_LOG_TUNING=1) shows the problem, every candidate with its time, the
    winner and the time spent; a cached decision is not re-announced."""
    delays(fake, a=0.003, b=0.0, c=0.001)
    opr.configure(tune="autotune", log_tuning=True)
    a, b = operands(rng)
    with caplog.at_level("INFO", logger="opruntime.tuning"):
        opr.matmul(a, b)
        opr.matmul(a, b)
    lines = [r.getMessage() for r in caplog.records if r.name == "opruntime.tuning"]
    assert len(lines) == 1
    text = lines[0]
    assert text.startswith("matmul 4x5 x 5x3 float32 on fake:0: ") and " of 3 candidates timed in " in text
    chosen = [ln for ln in text.splitlines() if ln.endswith("<- chosen")]
    assert len(chosen) == 1 and "fake.matmul.b" in chosen[0]
    assert all(f"fake.matmul.{k}" in text for k in "abc")


def test_log_tuning_is_a_setting_with_an_environment_variable(monkeypatch):
    monkeypatch.setenv("OPRUNTIME_LOG_TUNING", "1")
    opr.configure()  # re-read
    from opruntime.config import settings

    assert settings().log_tuning is True
    monkeypatch.setenv("OPRUNTIME_LOG_TUNING", "maybe")
    with pytest.raises(opr.errors.ConfigError, match="log_tuning"):
        opr.configure()
        settings()
