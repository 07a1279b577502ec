"""Progress on stderr for CLI work that takes more than a second (``opruntime bench`` and ``tune``).

On a terminal: a tqdm bar when tqdm is installed, else a rich bar when rich is, else one line
rewritten in place; each appears only once the work has run for a second. Elsewhere (logs, CI,
a pipe): plain ``[i/n] what`` lines, one per item, so a log shows what ran and in which order, and
never a carriage return.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from typing import Any, TextIO


class Progress:
    """``with Progress(n, "bench") as p: p.update(i, "what runs now")``, ``i`` items done.

    ``total`` may change while it runs (the tuner learns how many candidates it times only when
    it starts); :meth:`candidate` is the tuner's ``opruntime.tuning.reporter``.
    """

    def __init__(self, total: int, label: str = "", *, stream: TextIO | None = None, delay: float = 1.0) -> None:
        self.total, self.label, self.stream, self.delay = total, label, stream or sys.stderr, delay
        self.t0 = time.perf_counter()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.kind = "lines"
        if self.tty:
            self.kind = next((m for m in ("tqdm", "rich") if importlib.util.find_spec(m)), "counter")
        self.bar: Any = None
        self.task: Any = None
        self.shown = False  # the counter has written a line that close() must end

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, done: int, what: str = "") -> None:
        """``done`` of ``total`` items are finished; ``what`` describes the one running now."""
        if self.kind == "lines":
            if done < self.total:
                print(f"[{done + 1}/{self.total}] {what}", file=self.stream, flush=True)
        elif self.kind == "counter":
            if time.perf_counter() - self.t0 >= self.delay or (self.shown and done >= self.total):
                self.shown = True
                print(f"\r{self.label} [{done}/{self.total}] {what[:70]:<70}", end="", file=self.stream, flush=True)
        elif self.kind == "tqdm":
            if self.bar is None:
                from tqdm import tqdm

                self.bar = tqdm(total=self.total, desc=self.label, file=self.stream, delay=self.delay, leave=False)
            self.bar.total = self.total
            self.bar.n = done
            self.bar.set_postfix_str(what[:60])
        elif self.bar is None and time.perf_counter() - self.t0 < self.delay:
            pass  # rich: start the bar only after the first second
        else:
            if self.bar is None:
                from rich.console import Console
                from rich.progress import Progress as Bar

                self.bar = Bar(*Bar.get_default_columns(), console=Console(file=self.stream), transient=True)
                self.bar.start()
                self.task = self.bar.add_task(self.label, total=self.total)
            self.bar.update(self.task, total=self.total, completed=done, description=f"{self.label} {what[:60]}")

    def candidate(self, done: int, total: int, candidate: Any) -> None:
        """The tuner's report (``opruntime.tuning.reporter``): ``done`` of ``total`` candidates
        timed, ``candidate`` (None at the end) the one it times now."""
        self.total = total
        self.update(done, f"{self.label}: {candidate.label}" if candidate is not None else self.label)

    def close(self) -> None:
        if self.kind == "counter" and self.shown:
            print(file=self.stream, flush=True)
        elif self.bar is not None:
            if self.kind == "tqdm":
                self.bar.close()
            else:
                self.bar.stop()
        self.bar = None
        self.shown = False
