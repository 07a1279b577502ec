"""Measured selection: time the candidates of a problem on its device and keep the fastest.

Used by the selector when ``tune = "autotune"`` and by ``opruntime tune``. For one problem:

1. prune by the cost estimate to the ``tune_top_k`` cheapest candidates (vendor kernels always
   stay, so a tuned choice is never slower than the vendor baseline beyond noise);
2. time each with the device's own timer (``DeviceProvider.time``) on random normal inputs,
   rotating several input sets when the problem fits in a cache, and once more back to back
   on the host clock; a candidate scores the larger of the two (a kernel whose launch path is
   slower than its device time is slow in a program too);
3. stop timing a candidate after one run when it is 3x slower than the best so far;
4. stop the search when the per-problem budget (``tune_budget`` seconds) is spent.

A candidate that fails to build or run scores as unusable, with the reason kept.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import statistics
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from . import cache
from .errors import CacheError
from .kernels import Problem, c_strides, itemsize, np_dtype
from .plugins import registry
from .timing import back_to_back, measure_rounds

if TYPE_CHECKING:
    from .config import Settings
    from .devices import Device
    from .selector import Candidate

log = logging.getLogger("opruntime")
#: every tuning decision at INFO (the ``log_tuning`` setting / ``OPRUNTIME_LOG_TUNING=1`` prints it)
decisions = logging.getLogger("opruntime.tuning")

ROTATE_BELOW = 64 << 20  # problems smaller than this (bytes) fit in some cache: rotate input sets
EARLY_STOP = 3.0  # stop timing a candidate this many times slower than the best so far
REFINE_WITHIN = 0.05  # candidates this close to the best are timed again, together (refine)
REFINE_TOP = 4  # at most this many of them
REFINE_ROUNDS = 7
#: a re-check replaces the cached winner only with a candidate this much faster here: a tie
#: keeps the cached choice (and its numerics) from one process to the next
RECHECK_MARGIN = 0.015
#: ``reporter(i, n, candidate)`` is told about each candidate timed (``opruntime tune``'s progress bar)
reporter: Any = None


def bucket(n: int) -> int:
    """The power-of-two bucket of one dimension (0 and 1 stay themselves)."""
    return n if n <= 1 else 1 << (n - 1).bit_length()


def problem_key(problem: Problem, mode: str = "exact") -> str:
    """The cache key of a problem: exact, or with each dim rounded up to a power of two (and
    strides reduced to contiguous / strided), so that changing shapes share tuning results."""
    if mode == "exact":
        return problem.key
    shapes = tuple(tuple(bucket(n) for n in s) for s in problem.shapes)
    layout = ",".join("c" if st is None or st == c_strides(sh) else "s"
                      for sh, st in zip(problem.shapes, problem.strides))
    attrs = repr(sorted(problem.attrs.items()))
    return f"{problem.op}|pow2{shapes}|{','.join(problem.dtypes)}|{layout}|{attrs}"


def random_inputs(problem: Problem, device: Device, sets: int = 1, seed: int = 0) -> list[list[Any]]:
    """``sets`` lists of random normal (never zero) operands for ``problem`` on ``device``,
    drawn by the device (``DeviceProvider.random_normal``)."""
    dtype = np_dtype(problem.dtype)
    draw = device.provider.random_normal
    return [[draw(shape, dtype, seed + i * len(problem.shapes) + j) for j, shape in enumerate(problem.shapes)]
            for i in range(sets)]


def input_sets(problem: Problem) -> int:
    """How many input sets to rotate so repeated runs do not time a warm cache."""
    nbytes = sum(math.prod(s) for s in problem.shapes) * itemsize(problem.dtype)
    if nbytes == 0 or nbytes >= ROTATE_BELOW:
        return 1
    return int(min(4, math.ceil(ROTATE_BELOW / nbytes)))


def autotune(problem: Problem, device: Device, candidates: Sequence[Candidate], *, budget_s: float = 2.0,
             top_k: int = 8, target_s: float = 0.02, progress: Any = None) -> list[Candidate]:
    """Time ``candidates`` (mutated: ``measured`` and ``status`` set) and return them fastest first;
    untimed or failed candidates follow in estimate order.

    The budget covers the whole search, drawing the inputs included: a candidate is not started
    when the time left is less than the longest a candidate has taken so far, so the search ends
    within the budget even when each candidate is compiled first. Vendor kernels are timed
    first: the baseline is always measured, and sets the early-stop bar from the start."""
    start = time.perf_counter()
    ranked = sorted(candidates, key=lambda c: c.cost)
    keep = ranked[:top_k] + [c for c in ranked[top_k:] if c.kernel.vendor]
    for c in ranked:
        if c not in keep:
            c.status = f"pruned: not in the {top_k} lowest estimates"
    keep.sort(key=lambda c: not c.kernel.vendor)  # stable: vendor first, then by estimate
    progress = progress or reporter
    prov = device.provider
    sets = random_inputs(problem, device, input_sets(problem))
    best = math.inf
    calls: dict[int, Any] = {}
    spent: list[float] = []  # wall seconds of each candidate timed so far
    for i, c in enumerate(keep):
        if progress is not None:
            progress(i, len(keep), c)
        began = time.perf_counter()
        if began - start + max(spent, default=0.0) > budget_s:
            c.status = f"not timed: the {budget_s:g} s tuning budget was spent"
            continue
        call = calls[id(c)] = _caller(problem, c, sets)
        try:
            first = min(prov.time(call, repeats=1, warmup=1))  # the warm-up builds and caches
            if first > EARLY_STOP * best:
                c.measured, c.status = first, f"stopped early: {first / best:.1f}x slower than the best so far"
                continue
            reps = max(3, min(25, int(target_s / max(first, 1e-7))))
            remaining = budget_s - (time.perf_counter() - start)
            reps = max(1, min(reps, int(remaining / max(first, 1e-7)))) if remaining > 0 else 1
            device_s = statistics.median(prov.time(call, repeats=reps, warmup=0))
            c.measured = max(device_s, back_to_back(call, prov.synchronize, reps))
            best = min(best, c.measured)
        except Exception as exc:
            c.measured, c.status = math.inf, f"failed while tuning: {type(exc).__name__}: {exc}"
        finally:
            spent.append(time.perf_counter() - began)
    if progress is not None:
        progress(len(keep), len(keep), None)
    timed = sorted((c for c in keep if c.measured is not None and math.isfinite(c.measured) and c.status == "ok"),
                   key=lambda c: c.measured)
    if refine(prov, timed, calls, deadline=start + budget_s):
        timed.sort(key=lambda c: c.measured)
    rest = [c for c in ranked if c not in timed]
    return timed + rest


def _caller(problem: Problem, c: Candidate, sets: list[list[Any]]) -> Any:
    """``call()``: one run of candidate ``c`` through its prepared launcher (prepared on the first
    call, so a build counts as the first run's time), rotating through the input sets."""
    turn = [0]
    launch: list[Any] = []

    def call() -> Any:
        if not launch:
            launch.append(c.kernel.launcher(problem, c.config))
        arrays = sets[turn[0] % len(sets)]
        turn[0] += 1
        return launch[0](*arrays)

    return call


def near_ties(ranked: Sequence[Candidate]) -> list[Candidate]:
    """The first of ``ranked`` (measured, best first) and those within :data:`REFINE_WITHIN` of
    it, :data:`REFINE_TOP` at most."""
    if not ranked or ranked[0].measured is None or not math.isfinite(ranked[0].measured):
        return []
    bar = ranked[0].measured * (1 + REFINE_WITHIN)
    return [c for c in ranked[:REFINE_TOP] if c.measured is not None and c.measured <= bar]


def refine(prov: Any, timed: Sequence[Candidate], calls: dict[int, Any], *, deadline: float) -> bool:
    """Time the candidates within :data:`REFINE_WITHIN` of the best again, together, and keep
    those scores; returns whether it did.

    One after the other, each candidate meets the device in its own state (clocks, temperature,
    what the previous one left in the caches): a few percent, as much as the gap between the best
    configs. Here they run through the bench's harness (:func:`opruntime.timing.measure_rounds`):
    rounds of one back-to-back batch (~5 ms) each, in an order shuffled every round, each score
    the median of its batches. Stops at ``deadline`` (the tuning budget).
    """
    close = near_ties(timed)
    if len(close) < 2:
        return False
    sync = prov.synchronize
    samples, errors = measure_rounds({str(id(c)): (calls[id(c)], sync) for c in close}, REFINE_ROUNDS, 5e-3,
                                     idle=sync, deadline=deadline)
    if errors or len(samples) < len(close):  # they all ran before; keep the first scores
        return False
    for c in close:
        c.measured = statistics.median(samples[str(id(c))])
    return True


def recheck(problem: Problem, device: Device, order: list[Candidate], why: str, *,
            budget_s: float) -> tuple[list[Candidate], str]:
    """In autotune mode, the first use of a cached result in a process times the cached winner
    and the candidates whose cached times were within :data:`REFINE_WITHIN` of it again, here and
    together (:func:`refine`), and runs the fastest: configs a percent or two apart can swap
    places from one process to the next (which buffers, clocks, what else the device runs), more
    than the 2% a choice should be within. One that is :data:`RECHECK_MARGIN` faster here runs
    instead; a tie keeps the cached choice. About a tenth of a second, once per problem and
    process; the cache keeps its entry."""
    close = near_ties(order)
    if len(close) < 2:
        return order, why
    try:
        sets = random_inputs(problem, device, input_sets(problem))
        calls = {id(c): _caller(problem, c, sets) for c in close}
        for c in close:
            calls[id(c)]()  # builds (from the disk cache) and warms up
    except Exception as exc:  # no room for the inputs, or a candidate broke since it was tuned: keep
        log.info("opruntime: %s: near ties not re-timed (%s: %s)", problem.op, type(exc).__name__, exc)
        return order, why  # the cached order (the plan falls back from a broken kernel as usual)
    if not refine(device.provider, close, calls, deadline=time.perf_counter() + budget_s):
        return order, why
    cached, fastest = close[0], min(close, key=lambda c: c.measured)
    why = f"{why}; {len(close)} near ties re-timed here"
    if fastest.measured * (1 + RECHECK_MARGIN) < cached.measured:
        return [fastest, *(c for c in order if c is not fastest)], \
            f"{why}, {fastest.label} faster by {cached.measured / fastest.measured - 1:.1%}"
    return order, f"{why}, the cached choice holds"


def report(problem: Problem, device: Device, order: Sequence[Candidate], spent_s: float, show: bool) -> None:
    """Log one tuning decision at INFO on ``opruntime.tuning``: the problem, every candidate
    timed (fastest first, with its time) or skipped (with why), the winner and the time spent.
    ``show`` (the ``log_tuning`` setting) makes sure it reaches stderr."""
    if show and not decisions.isEnabledFor(logging.INFO):
        decisions.setLevel(logging.INFO)
    if show and not decisions.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        decisions.addHandler(handler)
    if not decisions.isEnabledFor(logging.INFO):
        return
    timed = [c for c in order if c.measured is not None and math.isfinite(c.measured) and c.status == "ok"]
    lines = [f"{problem} on {device.name}: {len(timed)} of {len(order)} candidates timed in {spent_s:.2f} s"]
    for c in order:
        if c in timed:
            lines.append(f"  {c.measured * 1e6:10.1f} us  {c.label}{'  <- chosen' if c is order[0] else ''}")
        elif c.measured is not None and math.isfinite(c.measured):  # stopped after one run
            lines.append(f"  {c.measured * 1e6:10.1f} us  {c.label}: {c.status}")
        else:
            lines.append(f"  {'':>10}     {c.label}: {c.status}")
    decisions.info("\n".join(lines))


def cached_or_tuned(problem: Problem, device: Device, s: Settings, usable: list[Candidate]) -> tuple[list[Candidate], str] | None:
    """The order from the tuning cache, or (autotune) from timing the candidates now; None when neither."""
    key = problem_key(problem, s.bucket_for(problem.op))
    fp = device_key(device)
    store = entry = None
    try:
        store = cache.tuning_cache()
        if s.tune == "autotune" or store.path.exists():
            entry = store.get(fp, key)
    except (OSError, sqlite3.Error, CacheError) as exc:
        _cache_unusable(exc)
    if entry is not None:
        match = [c for c in usable if c.kernel.name == entry.kernel and c.config == entry.config]
        if match and match[0].kernel.source_hash == entry.source_hash:
            times = {(r["kernel"], json.dumps(r["config"], sort_keys=True)): r for r in entry.candidates}
            for c in usable:
                r = times.get((c.kernel.name, json.dumps(c.config, sort_keys=True)))
                if r is not None:
                    c.measured = r.get("time_s")
            rest = sorted((c for c in usable if c is not match[0]),
                          key=lambda c: (c.measured if c.measured is not None else math.inf, c.cost))
            when = time.strftime("%Y-%m-%d", time.localtime(entry.created))
            order, why = [match[0], *rest], f"tuned earlier ({when}; cached, {entry.time_s * 1e6:.1f} us)"
            if s.tune == "autotune":
                order, why = recheck(problem, device, order, why, budget_s=s.tune_budget)
            return order, why
    if s.tune != "autotune":
        return None
    began = time.perf_counter()
    try:
        order = autotune(problem, device, usable, budget_s=s.tune_budget, top_k=s.tune_top_k)
        report(problem, device, order, time.perf_counter() - began, s.log_tuning)
    except MemoryError as exc:  # no room for the random operands beside the caller's data
        log.warning("opruntime: %s on %s not tuned: %s; the cost estimates choose", problem, device.name, exc)
        return None
    best = order[0] if order and order[0].measured is not None and math.isfinite(order[0].measured) else None
    if best is None or best.status != "ok":
        return None
    n = sum(1 for c in order if c.measured is not None and math.isfinite(c.measured))
    if store is not None:
        try:
            store.put(cache.Entry(fp, key, best.kernel.name, dict(best.config), best.kernel.source_hash, best.measured,
                                  [_record(c) for c in order], device.name))
        except (OSError, sqlite3.Error, CacheError) as exc:
            _cache_unusable(exc)
    usable_order = [c for c in order if not c.status.startswith("failed")]
    return usable_order, f"tuned now: fastest of {n} timed ({best.measured * 1e6:.1f} us)"


_said: set[str] = set()


def _cache_unusable(exc: BaseException) -> None:
    """Say once per reason that the tuning cache cannot be used; selection goes on without it."""
    if str(exc) not in _said:
        _said.add(str(exc))
        log.warning("opruntime: tuning cache unusable (%s); selecting without it", exc)


def _record(c: Candidate) -> dict[str, Any]:
    measured = c.measured if c.measured is not None and math.isfinite(c.measured) else None
    return {"kernel": c.kernel.name, "config": dict(c.config), "time_s": measured, "status": c.status,
            "vendor": c.kernel.vendor}


_device_keys: dict[str, str] = {}


def forget_devices() -> None:
    """Forget the device keys (the registry was rebuilt)."""
    _device_keys.clear()


def device_key(device: Device) -> str:
    """The tuning-cache key of a device: its fingerprint plus the providing backend's version."""
    key = _device_keys.get(device.name)
    if key is None:
        rec = registry().plugin_of(device.name)
        fp = {**device.provider.fingerprint(), "kind": device.kind,
              "backend": f"{rec.name} {rec.version}" if rec else ""}
        key = _device_keys[device.name] = cache.fingerprint_key(fp)
    return key
