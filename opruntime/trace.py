"""Tracing: which kernel ran for each call, and how long it took on the device.

    with opr.trace() as t:
        model(x)
    print(t.summary())
    t.save("trace.json")      # Chrome trace format: open in Perfetto or chrome://tracing

While a trace is active every operator call synchronises its device before and after the kernel,
so the times are the device's (and asynchronous overlap is lost): trace to understand, not to
benchmark.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: the traces recording now (process-wide); the plan's hot path only checks that this is empty.
active: list[Trace] = []
_lock = threading.Lock()


@dataclass
class Event:
    op: str
    kernel: str
    problem: str
    device: str
    start_s: float  # perf_counter at the start
    duration_s: float
    thread: int


@dataclass
class Trace:
    """The calls made while it was active (see the module doc)."""

    events: list[Event] = field(default_factory=list)
    t0: float = field(default_factory=time.perf_counter)

    def __enter__(self) -> Trace:
        with _lock:
            active.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        with _lock:
            active.remove(self)

    def record(self, event: Event) -> None:
        with _lock:
            self.events.append(event)

    def to_chrome(self) -> dict[str, Any]:
        """The trace in Chrome's trace-event format."""
        pid = os.getpid()
        return {"traceEvents": [
            {"name": e.kernel, "cat": e.op, "ph": "X", "pid": pid, "tid": e.thread,
             "ts": (e.start_s - self.t0) * 1e6, "dur": e.duration_s * 1e6,
             "args": {"problem": e.problem, "device": e.device}}
            for e in self.events], "displayTimeUnit": "ms"}

    def save(self, path: str | Path) -> None:
        """Write Chrome trace JSON (opens in https://ui.perfetto.dev or chrome://tracing)."""
        Path(path).write_text(json.dumps(self.to_chrome()))

    def summary(self) -> str:
        """Total device time per (op, kernel, device), largest first."""
        total: dict[tuple[str, str, str], list[float]] = defaultdict(list)
        for e in self.events:
            total[e.op, e.kernel, e.device].append(e.duration_s)
        rows = sorted(total.items(), key=lambda kv: -sum(kv[1]))
        lines = [f"{'op':<12} {'kernel':<40} {'device':<10} {'calls':>6} {'total':>12} {'mean':>12}"]
        for (op, kernel, device), ts in rows:
            lines.append(f"{op:<12} {kernel:<40} {device:<10} {len(ts):>6} {sum(ts) * 1e3:>10.3f}ms "
                         f"{sum(ts) / len(ts) * 1e6:>10.1f}us")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Trace({len(self.events)} calls)"


def trace() -> Trace:
    """Record every operator call made while the returned context is active (all threads)."""
    return Trace()
