"""The one timing harness: tuning and ``opruntime bench`` both time through it.

Calls are timed in batches of back-to-back calls ended by one synchronisation, so GPU launch gaps
overlap as they do in real programs; several contenders run round-robin in rounds whose order is
shuffled, so a slow spell of the machine falls on all of them alike and the ratios between them
hold (:func:`paired_ratio`).
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def back_to_back(call: Callable[[], Any], sync: Callable[[], Any], reps: int) -> float:
    """Seconds per call of ``reps`` calls issued back to back, then one ``sync()``: what a program
    sees when a kernel's launch path costs more host time than its device time (which per-launch
    device events do not show)."""
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        call()
    sync()
    return (time.perf_counter() - t0) / reps


Timed = tuple[Callable[[], Any], Callable[[], Any]]  # (call, sync)


#: seconds a host device's batch waits, untimed, before it starts (:func:`settle`): numba's OpenMP
#: workers keep spinning for up to about 0.5 ms after a parallel call (measured on the 2-core CI
#: machine: ONNX Runtime's depthwise conv took 1.55 ms alone, 2.2-3.0 ms straight after ours, and
#: was unaffected 0.5 ms later), taking a core from whoever runs next
HOST_SETTLE_S = 1e-3


def settle(provider: Any) -> Callable[[], None]:
    """The untimed wait before each batch of :func:`measure_rounds` on ``provider``'s device: its
    synchronize, and on a host device (no accelerator) a pause of :data:`HOST_SETTLE_S` in which
    the previous contender's spinning worker threads go to sleep, so that no batch runs on cores
    another runtime still holds."""
    sync = provider.synchronize
    if getattr(provider, "accelerator", True):
        return sync

    def idle() -> None:
        sync()
        time.sleep(HOST_SETTLE_S)

    return idle


def measure_rounds(contenders: Mapping[str, Timed], repeats: int = 15, batch_s: float = 2e-3,
                   idle: Callable[[], Any] | None = None,
                   deadline: float = math.inf) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Seconds per call of each contender, one sample per round, and the error of each that raised.

    Each contender is warmed up and sized to batches of about ``batch_s`` of back-to-back calls
    ended by its own sync; then the batches run round-robin, one of each contender per round, so
    a slow spell of the machine (other tenants, clocks) falls on all of them alike and the ratios
    between them hold even when the absolute times wander. The order is shuffled every round, so
    no contender always follows the same one (a runtime still freeing buffers or a GPU still hot
    from a heavy batch, a cache another has filled). ``idle()`` (the device's synchronize) runs
    before each batch, untimed: no batch starts while another's work is still queued. No round
    starts after ``deadline`` (a ``time.perf_counter()`` value).
    """
    sizes: dict[str, int] = {}
    errors: dict[str, str] = {}
    for name, (fn, sync) in contenders.items():
        try:
            sizes[name] = batch_size(fn, sync, batch_s)
        except Exception as exc:  # reported by the caller; the others are still timed
            errors[name] = f"{type(exc).__name__}: {exc}"
    samples: dict[str, list[float]] = {name: [] for name in sizes}
    names = list(sizes)
    order = random.Random(0)
    for _ in range(repeats):
        if time.perf_counter() > deadline:
            break
        order.shuffle(names)  # a new order every round: nobody always runs after the same one
        for name in names:
            if name in errors:
                continue
            (fn, sync), n = contenders[name], sizes[name]
            try:
                if idle is not None:
                    idle()
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                sync()
                samples[name].append((time.perf_counter() - t0) / n)
            except Exception as exc:
                errors[name] = f"{type(exc).__name__}: {exc}"
    return {name: t for name, t in samples.items() if t and name not in errors}, errors


def batch_size(fn: Callable[[], Any], sync: Callable[[], Any], batch_s: float) -> int:
    """How many back-to-back calls of ``fn`` take about ``batch_s``: after a warm-up call, runs of
    1, 4, 16, ... calls, from the fastest per-call time seen once two runs have lasted a quarter of
    ``batch_s``. (Sized from one call, a contender whose call met a hiccup got batches of a call or
    two, and each batch's launch and sync latency, tens of microseconds, counted as its own time
    for the whole run.)"""
    fn()
    sync()
    m, per, long_runs = 1, math.inf, 0
    while True:
        t0 = time.perf_counter()
        for _ in range(m):
            fn()
        sync()
        took = time.perf_counter() - t0
        per = min(per, took / m)
        if took >= batch_s / 4 or m >= 1024:
            long_runs += 1
            if long_runs == 2:
                return max(1, min(2000, int(batch_s / max(per, 1e-9))))
        else:
            m *= 4


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> float:
    """The median over rounds of ``a / b`` for two contenders timed in the same rounds: each
    round's ratio compares batches run moments apart, so the machine's slow spells cancel, which
    the ratio of the two medians does not do."""
    return statistics.median(x / y for x, y in zip(a, b))


def measure(fn: Callable[[], Any], sync: Callable[[], Any], repeats: int = 15, batch_s: float = 2e-3) -> float:
    """Median seconds per call over ``repeats`` batches of back-to-back calls (warm-up first)."""
    samples, errors = measure_rounds({"": (fn, sync)}, repeats, batch_s)
    if errors:
        raise RuntimeError(errors[""])
    return statistics.median(samples[""])


