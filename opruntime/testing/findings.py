"""The findings every conformance check returns: a failure breaks the plugin contract or gives a
wrong result; a note is worth knowing but allowed (a view the native array type cannot make, a
kernel that declines a problem)."""

from __future__ import annotations

import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    check: str  # "hooks", "memory", "kernel", "pinned", "frontend"
    subject: str  # what was checked: a plugin, device, kernel and problem
    message: str
    failed: bool = True

    def __str__(self) -> str:
        return f"[{self.check}] {'FAIL' if self.failed else 'note'}: {self.subject}: {self.message}"


def failures(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if f.failed]


def summary(findings: Sequence[Finding]) -> str:
    """Failures first, then notes, one per line."""
    return "\n".join(map(str, sorted(findings, key=lambda f: not f.failed)))


def _exc(exc: BaseException) -> str:
    where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    at = f" (at {where[0].filename.rsplit('/', 1)[-1]}:{where[0].lineno})" if where else ""
    return f"{type(exc).__name__}: {exc}{at}"
