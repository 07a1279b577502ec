"""The bench's measurement: rounds, paired ratios (the runtime's one harness, ``opruntime.timing``,
which the bench times through) and the selection and result checks, on controlled contenders."""

from __future__ import annotations

import math
import re
import statistics

import numpy as np
import pytest

from opruntime import timing
from opruntime.ops.base import Case
from opruntime.tools import bench


def test_paired_ratio_cancels_slow_spells():
    # a is 2% slower than b; a slow spell (1.5x) starts in round 1 just after a's batch, so b meets it
    # in four rounds and a in three: the ratio of medians says a is faster, the per-round ratios do not
    spell_a = [1, 1, 1.5, 1.5, 1.5, 1, 1]
    spell_b = [1, 1.5, 1.5, 1.5, 1.5, 1, 1]
    a = [1.02 * s for s in spell_a]
    b = [1.00 * s for s in spell_b]
    assert statistics.median(a) / statistics.median(b) == pytest.approx(0.68)
    assert timing.paired_ratio(a, b) == pytest.approx(1.02)


def test_measure_rounds_one_sample_per_round_and_idle_before_each_batch():
    calls = {"x": 0, "y": 0, "idle": 0}

    def make(name):
        def fn():
            calls[name] += 1
        return fn, (lambda: None)

    def idle():
        calls["idle"] += 1

    def broken():
        raise RuntimeError("no")

    samples, errors = timing.measure_rounds({"x": make("x"), "y": make("y"), "z": (broken, lambda: None)},
                                            repeats=5, batch_s=1e-4, idle=idle)
    assert set(samples) == {"x", "y"} and all(len(s) == 5 for s in samples.values())
    assert errors["z"] == "RuntimeError: no"
    assert calls["idle"] == 10  # before every timed batch of every contender that works


def result(gap_pairs: dict[str, float], problem="8x8") -> bench.Result:
    r = bench.Result("matmul", problem, "float32", "cpu", kernel="k.chosen", time_s=1e-3, direct_s=1e-3)
    r.vs_chosen = {"k.chosen": 1.0, **gap_pairs}
    r.selection_gap = max(0.0, 1 / min(r.vs_chosen.values()) - 1)
    r.candidates = {k: 1e-3 * v for k, v in r.vs_chosen.items()}
    return r


def test_settle_pauses_between_batches_on_a_host_device_only(monkeypatch):
    """A host device's batches start after a pause (the previous contender's spinning worker
    threads go to sleep: numba's OpenMP workers slowed the peer run after them by up to 2x on 2
    cores); an accelerator's start at its synchronize."""
    calls, pauses = [], []
    monkeypatch.setattr(timing.time, "sleep", pauses.append)

    class Host:
        accelerator = False

        def synchronize(self):
            calls.append("sync")

    class Gpu(Host):
        accelerator = True

    timing.settle(Host())()
    assert calls == ["sync"] and pauses == [timing.HOST_SETTLE_S] and timing.HOST_SETTLE_S >= 5e-4
    timing.settle(Gpu())()
    assert calls == ["sync", "sync"] and len(pauses) == 1


def test_selection_summary_counts_cases_over_two_percent():
    fine, close, over = result({"k.b": 1.2}, "a"), result({"k.b": 0.99}, "b"), result({"k.b": 0.95, "k.c": 1.1}, "c")
    assert fine.selection_gap == 0.0 and close.selection_gap == pytest.approx(1 / 0.99 - 1)
    lines = bench.selection_summary([fine, close, over, bench.Result("softmax", "16", "float32", "cpu")])
    assert lines[0].startswith("selection: the chosen kernel is within 2% of the fastest candidate in 2 of 3 cases")
    assert "worst 5.3%: matmul c float32" in lines[0]
    assert lines[1:] == ["  over: matmul c float32 on cpu: 5.3%"]
    assert bench.selection_summary([bench.Result("softmax", "16", "float32", "cpu")]) == []


def test_table_shows_candidates_against_the_chosen_and_paired_peer_ratios():
    r = result({"k.b": 0.97})
    r.peers, r.peer_ratios = {"numpy": 2e-3}, {"numpy": 1.9}
    assert r.ratios() == {"numpy": 1.9}  # the paired figure, not 2e-3 / 1e-3
    table = bench.format_table([r])
    assert "0.970x chosen" in table and "1.90x" in table and "selection:" in table
    assert math.isnan(bench.Result("matmul", "8x8", "float32", "cpu").selection_gap)


def test_spread_and_paired_difference():
    assert bench.spread([5.0]) == (5.0, 5.0) and all(math.isnan(x) for x in bench.spread([]))
    lo, hi = bench.spread([float(i) for i in range(1, 12)])  # 1..11: p10 = 2, p90 = 10
    assert (lo, hi) == pytest.approx((2.0, 10.0))
    assert not bench.is_noisy([1.0, 1.1, 1.2, 1.3]) and bench.is_noisy([1.0, 1.0, 3.0, 3.0])
    # a slow spell in rounds 2 and 3 falls on both: the paired differences stay 1 us
    ours, direct = [11e-6, 31e-6, 31e-6, 11e-6], [10e-6, 30e-6, 30e-6, 10e-6]
    median, (p10, p90) = bench.paired_difference(ours, direct)
    assert median == pytest.approx(1e-6) and p10 == pytest.approx(1e-6) and p90 == pytest.approx(1e-6)


def test_noisy_rounds_and_overhead_below_the_noise_are_flagged_never_negative():
    r = result({})
    r.candidates = r.vs_chosen = {}
    r.overhead_s, r.noisy = 0.0, ["opruntime", "overhead"]
    r.spread_s = {"opruntime": (0.5e-3, 2e-3), "overhead": (-3e-6, 2e-6)}
    r.rate, r.unit = 1.0, "GB/s"
    text = bench.format_table([r])
    row = next(line for line in text.splitlines() if line.startswith("matmul"))
    assert "~0 (noise)" in row and "0.5-2 ms !" in row and not re.search(r"(?<![\w.])-\d", row)  # nothing negative
    assert "! = noisy" in text and "~0 (noise) = the overhead came out at or below zero" in text
    quiet = result({})
    quiet.candidates = quiet.vs_chosen = {}
    quiet.overhead_s, quiet.spread_s = 2e-6, {"opruntime": (0.99e-3, 1.01e-3)}
    quiet_text = bench.format_table([quiet])
    assert "2.00 us" in quiet_text and "!" not in quiet_text and "noise" not in quiet_text
    quiet.spread_s["overhead"] = (-1e-6, 4e-6)  # positive, but some rounds' differences were not
    assert "2.00 us !" in bench.format_table([quiet])


def test_run_case_keeps_the_spread_of_each_timing():
    import opruntime as opr

    r = bench.run_case(Case(((8, 16),), op="softmax"), opr.Device("cpu"), repeats=5, peers=["numpy"])
    assert not r.error and set(r.spread_s) == {"opruntime", "direct", "overhead", "peer:numpy"}
    lo, hi = r.spread_s["opruntime"]
    assert lo <= r.time_s <= hi and r.overhead_s >= 0
    assert ("overhead" in r.noisy) == (r.overhead_s == 0.0)
    assert all(n in {"opruntime", "direct", "peer:numpy", "overhead"} for n in r.noisy)


def test_graphs_are_refused_where_the_device_records_none():
    import opruntime as opr

    r = bench.run_case(Case(((8, 16),), op="softmax"), opr.Device("cpu"), repeats=3, peers=["numpy"], graphs=True)
    assert r.graphs and "records no device graphs" in r.error and "CUDA device" in r.error


def test_graphs_record_each_contender_once_and_count_a_replay_as_its_calls(monkeypatch):
    """``--graphs``: every contender that has graphs is recorded once as GRAPH_CALLS calls through
    the device's ``capture`` (opruntime's call, its chosen kernel, the copy), one without graphs
    (NumPy) is left out, and each timed replay counts as GRAPH_CALLS calls."""
    import opruntime as opr
    from opruntime.tools import peers

    dev = opr.Device("cpu")
    recorded, replays = [], []

    class Graph:  # a stand-in device graph: recording runs the function once, a replay runs it again
        def __init__(self, fn, inputs):
            self.fn = fn
            recorded.append(fn(list(inputs)))
            assert timed["calls"] == 3  # the recording made GRAPH_CALLS calls of the contender

        def run(self, inputs):
            replays.append(1)
            return self.fn(list(inputs))

    timed = {"calls": 0}
    real = peers.graphed

    def counting(name, contender, device, at, calls):
        call, sync = contender

        def counted():
            timed["calls"] += 1
            return call()

        timed["calls"] = 0
        return real(name, (counted, sync), device, at, calls)

    monkeypatch.setattr(dev.provider, "capture", lambda fn, inputs: Graph(fn, inputs), raising=False)
    monkeypatch.setattr(peers, "GRAPH_CALLS", 3)
    monkeypatch.setattr(peers, "graphed", counting)
    case = Case(((64, 256),), op="softmax")
    r = bench.run_case(case, dev, repeats=3, peers=["numpy", "copy"], graphs=True)
    assert not r.error and r.graphs and recorded == [[], [], []]  # opruntime, direct, copy; NumPy has none
    assert set(r.peers) == {"copy"} and math.isfinite(r.time_s) and replays
    assert "(graphs)" in bench.format_table([r])

    def rounds(contenders, repeats, idle=None):  # every replay took 6 ms
        return {name: [6e-3] * repeats for name in contenders}, {}

    monkeypatch.setattr(bench, "measure_rounds", rounds)
    r = bench.run_case(case, dev, repeats=3, peers=["copy"], graphs=True)
    assert r.time_s == pytest.approx(2e-3) and r.peers["copy"] == pytest.approx(2e-3)  # three calls a replay


def test_kernels_run_checks_selection():
    import opruntime as opr

    res = bench.run_case(Case(((2, 3, 9, 9), (4, 3, 3, 3)), {"padding": 1}, op="conv2d"),
                         opr.Device("cpu"), repeats=3, kernels=True, peers=[])
    assert not res.error and res.kernel in res.vs_chosen and res.vs_chosen[res.kernel] == 1.0
    assert len(res.vs_chosen) >= 2 and math.isfinite(res.selection_gap) and res.selection_gap >= 0


def test_check_result_catches_drift_and_wrong_answers(rng):
    from opruntime.ops import OPS

    case = Case(((3, 7),), op="softmax")
    x = rng.standard_normal((3, 7)).astype(np.float32)
    right = OPS["softmax"].reference(x.astype(np.float64)).astype(np.float32)
    assert bench.check_result(OPS["softmax"], case, [x], 1e3, right, right.copy()) == ""
    drifted = bench.check_result(OPS["softmax"], case, [x], 1e3, right, np.zeros_like(right))
    assert drifted.startswith("wrong result: after the timing, opruntime's answer differs from its first")
    wrong = bench.check_result(OPS["softmax"], case, [x], 1e3, right[::-1].copy(), right[::-1].copy())
    assert wrong.startswith("wrong result:") and "float64 reference" in wrong
    nan = right.copy()
    nan[1, 2] = np.nan  # a NaN is reported, not raised
    assert bench.check_result(OPS["softmax"], case, [x], 1e3, right, nan).startswith("wrong result: after the timing")
    lost = bench.check_result(OPS["softmax"], case, [x], 1e3, nan, right)
    assert lost.startswith("wrong result: after the timing") and "NaN positions differ" in lost
    assert bench.check_result(OPS["softmax"], case, [x], 1e3, nan, nan) == \
        "wrong result: inf from the float64 reference (relative; tolerance 1e-05)"
    # too big for the host reference: only the drift is checked
    assert bench.check_result(OPS["softmax"], case, [x], 1e12, right[::-1].copy(), right[::-1].copy()) == ""


def test_batch_size_is_not_fooled_by_one_slow_call():
    import time

    calls = [0]

    def fn():
        calls[0] += 1
        if calls[0] == 2:  # the call a one-call sizing would have timed
            time.sleep(0.01)

    assert timing.batch_size(fn, lambda: None, 2e-3) > 100  # sized from the runs after the hiccup
    slow = timing.batch_size(lambda: time.sleep(0.003), lambda: None, 2e-3)
    assert slow == 1


def test_document_records_the_command_line():
    r = bench.Result("matmul", "8x8", "float32", "cpu", kernel="k", time_s=1e-3)
    assert bench.document([r], command="opruntime bench matmul --shape 8x8,8x8")["command"] == (
        "opruntime bench matmul --shape 8x8,8x8")
    assert "command" not in bench.document([r])  # none given (an API caller): no key, not an empty one

