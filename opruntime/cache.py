"""The persistent tuning cache: one sqlite file (WAL mode) per user.

A row is one tuned problem on one device: the winning kernel and config and every candidate's
measured time (or the reason it was unusable). Rows are keyed by the device fingerprint and the
problem key; each row also keeps the winner's source hash, so a changed kernel invalidates its
entries. Values are plain JSON, never pickles: a cache file cannot run code.

Several processes may tune into one file at once (sqlite locking, WAL, a busy timeout). A file
that is not a valid cache is reported, moved aside (``*.corrupt-<time>``) and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import FallbackWarning

log = logging.getLogger("opruntime")
SCHEMA_VERSION = 1
FILENAME = "tuning.sqlite"


def default_dir() -> Path:
    """``OPRUNTIME_CACHE_DIR`` / ``cache_dir`` setting, else the user cache dir (platformdirs)."""
    from .config import settings

    configured = settings().cache_dir
    if configured:
        return Path(configured)
    try:
        import platformdirs

        return Path(platformdirs.user_cache_dir("opruntime"))
    except ImportError:  # platformdirs is a dependency, but stay usable without it
        return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "opruntime"


def fingerprint_key(fingerprint: Mapping[str, Any]) -> str:
    """A short stable key for a device fingerprint."""
    text = json.dumps(dict(fingerprint), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


@dataclass
class Entry:
    """One tuned problem."""

    device: str  # the device's fingerprint key
    problem: str  # the (bucketed) problem key
    kernel: str
    config: dict[str, Any]
    source_hash: str
    time_s: float
    candidates: list[dict[str, Any]] = field(default_factory=list)  # {kernel, config, time_s, status}
    device_name: str = ""
    created: float = 0.0

    @property
    def vendor_time(self) -> float | None:
        times = [c["time_s"] for c in self.candidates if c.get("vendor") and c.get("time_s") is not None]
        return min(times) if times else None


class TuningCache:
    """A sqlite-backed store of :class:`Entry`, safe for concurrent processes."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._local = threading.local()

    # -- connection -------------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = self._open()
        except sqlite3.DatabaseError as exc:
            self._move_aside(exc)
            conn = self._open()
        self._local.conn = conn
        return conn

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA busy_timeout=30000")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS tuned ("
                " device TEXT NOT NULL, problem TEXT NOT NULL, kernel TEXT NOT NULL, config TEXT NOT NULL,"
                " source_hash TEXT NOT NULL, time_s REAL NOT NULL, candidates TEXT NOT NULL,"
                " device_name TEXT NOT NULL, created REAL NOT NULL, PRIMARY KEY (device, problem))")
            conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            if row is None or row[0] != str(SCHEMA_VERSION):
                raise sqlite3.DatabaseError(f"schema version {row and row[0]!r}, expected {SCHEMA_VERSION}")
            conn.execute("SELECT count(*) FROM tuned").fetchone()
        except sqlite3.DatabaseError:
            conn.close()
            raise
        return conn

    def _move_aside(self, exc: Exception) -> None:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        for suffix in ("", "-wal", "-shm"):
            p = Path(str(self.path) + suffix)
            if p.exists():
                os.replace(p, Path(str(aside) + suffix))
        msg = (f"opruntime: the tuning cache {self.path} is not a valid cache ({exc}); "
               f"moved it to {aside.name} and started a new one")
        log.warning(msg)
        warnings.warn(msg, FallbackWarning, stacklevel=4)

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # -- entries ----------------------------------------------------------------------------
    def get(self, device: str, problem: str) -> Entry | None:
        try:
            row = self._connect().execute(
                "SELECT device, problem, kernel, config, source_hash, time_s, candidates, device_name, created "
                "FROM tuned WHERE device = ? AND problem = ?", (device, problem)).fetchone()
        except sqlite3.DatabaseError as exc:  # damaged after opening: rebuild once
            self.close()
            self._move_aside(exc)
            return None
        if not row:
            return None
        try:
            return _entry(row)
        except (ValueError, TypeError) as exc:  # a damaged or hand-edited row: drop it, select without it
            log.warning("opruntime: dropping a malformed tuning-cache row for %s in %s: %s", problem, self.path, exc)
            self.delete(device, problem)
            return None

    def put(self, entry: Entry) -> None:
        entry.created = entry.created or time.time()
        values = (entry.device, entry.problem, entry.kernel, json.dumps(entry.config), entry.source_hash,
                  entry.time_s, json.dumps(entry.candidates), entry.device_name, entry.created)
        self._connect().execute("INSERT OR REPLACE INTO tuned VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", values)

    def delete(self, device: str, problem: str) -> None:
        self._connect().execute("DELETE FROM tuned WHERE device = ? AND problem = ?", (device, problem))

    def entries(self) -> Iterator[Entry]:
        rows = self._connect().execute(
            "SELECT device, problem, kernel, config, source_hash, time_s, candidates, device_name, created "
            "FROM tuned ORDER BY device_name, problem").fetchall()
        return (_entry(r) for r in rows)

    def clear(self) -> int:
        return self._connect().execute("DELETE FROM tuned").rowcount

    def export(self, path: Path | str) -> int:
        """Write every entry to a JSON file; returns how many."""
        data = [asdict(e) for e in self.entries()]
        Path(path).write_text(json.dumps({"opruntime_tuning_cache": SCHEMA_VERSION, "entries": data}, indent=1))
        return len(data)

    def import_(self, path: Path | str) -> int:
        """Add the entries of an exported JSON file (newer entries win); returns how many."""
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict) or data.get("opruntime_tuning_cache") != SCHEMA_VERSION:
            raise ValueError(f"{path}: not an opruntime tuning-cache export (version {SCHEMA_VERSION})")
        n = 0
        for raw in data["entries"]:
            entry = Entry(**raw)
            old = self.get(entry.device, entry.problem)
            if old is None or old.created <= entry.created:
                self.put(entry)
                n += 1
        return n


def _entry(row: tuple) -> Entry:
    """An Entry from a row; ValueError when a field is not what :meth:`TuningCache.put` writes."""
    device, problem, kernel, config, source_hash, time_s, candidates, device_name, created = row
    config, candidates = json.loads(config), json.loads(candidates)
    ok = (isinstance(kernel, str) and isinstance(config, dict) and isinstance(source_hash, str)
          and isinstance(time_s, (int, float)) and isinstance(created, (int, float)) and isinstance(candidates, list)
          and all(isinstance(c, dict) and isinstance(c.get("kernel"), str) and isinstance(c.get("config"), dict)
                  for c in candidates))
    if not ok:
        raise ValueError(f"malformed entry {row!r}")
    return Entry(device, problem, kernel, config, source_hash, time_s, candidates, device_name, created)


_caches: dict[Path, TuningCache] = {}


def tuning_cache() -> TuningCache:
    """The cache for the directory the settings in force name."""
    path = default_dir() / FILENAME
    cache = _caches.get(path)
    if cache is None:
        cache = _caches[path] = TuningCache(path)
    return cache
