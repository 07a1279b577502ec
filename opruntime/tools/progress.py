"""Progress on stderr for CLI work that takes more than a second (``opruntime bench`` and ``tune``).

One implementation, on ``rich.progress``: a bar on stderr when stderr is a terminal, shown once
the work has run for ``delay`` seconds and erased when it ends. Off a terminal (a pipe, a log,
CI) it writes nothing at all, so no carriage return or control sequence ever lands in a file.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


class Progress:
    """``with Progress(n, "bench") as p: p.update(i, "what runs now")``, ``i`` items done.

    ``total`` may change while it runs (the tuner learns how many candidates it times only when
    it starts); :meth:`candidate` is the tuner's ``opruntime.tuning.reporter``.
    """

    def __init__(self, total: int, label: str = "", *, stream: TextIO | None = None, delay: float = 1.0) -> None:
        self.total, self.label, self.delay = total, label, delay
        self.stream = stream if stream is not None else sys.stderr
        self.t0 = time.perf_counter()
        #: off a terminal the bar is never made: nothing is written
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.bar: Any = None
        self.task: Any = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, done: int, what: str = "") -> None:
        """``done`` of ``total`` items are finished; ``what`` describes the one running now."""
        if not self.enabled:
            return
        if self.bar is None:
            if time.perf_counter() - self.t0 < self.delay:
                return  # short work shows no bar
            from rich.console import Console
            from rich.progress import Progress as Bar

            self.bar = Bar(*Bar.get_default_columns(), console=Console(file=self.stream), transient=True)
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=self.total)
        self.bar.update(self.task, total=self.total, completed=done, description=f"{self.label} {what[:60]}".strip())

    def candidate(self, done: int, total: int, candidate: Any) -> None:
        """The tuner's report (``opruntime.tuning.reporter``): ``done`` of ``total`` candidates
        timed, ``candidate`` (None at the end) the one it times now."""
        self.total = total
        self.update(done, candidate.label if candidate is not None else "")

    def close(self) -> None:
        """Stop and erase the bar (if one was shown)."""
        if self.bar is not None:
            self.bar.stop()
        self.bar = None
