"""The persistent tuning cache: one sqlite file (WAL mode) per user.

A row is one tuned problem on one device: the winning kernel and config and every candidate's
measured time (or the reason it was unusable). Rows are keyed by the device fingerprint and the
problem key; each row also keeps the winner's source hash, so a changed kernel invalidates its
entries. Values are plain JSON, never pickles: a cache file cannot run code.

Several processes may tune into one file at once (sqlite locking, WAL, a busy file waited for).
A file that is not a valid cache is reported, moved aside (``*.corrupt-<time>``) and rebuilt; a
cache in a read-only directory is read and never written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sqlite3
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .config import settings
from .errors import CacheError, FallbackWarning

log = logging.getLogger("opruntime")
SCHEMA_VERSION = 1
FILENAME = "tuning.sqlite"


def default_dir() -> Path:
    """``OPRUNTIME_CACHE_DIR`` / ``cache_dir`` setting, else the user cache dir (platformdirs)."""
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


class _NotACache(sqlite3.DatabaseError):
    """A readable sqlite file whose schema is not ours."""


#: sqlite errors that mean another process holds the file for a moment: wait and retry
_BUSY = {"SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_BUSY_RECOVERY", "SQLITE_BUSY_SNAPSHOT", "SQLITE_LOCKED_SHAREDCACHE"}
#: sqlite errors that mean the file is not a valid database: moved aside and started anew
_CORRUPT = {"SQLITE_NOTADB", "SQLITE_CORRUPT"}
BUSY_WAIT_S = 30.0


def _kind(exc: BaseException) -> str:
    if isinstance(exc, _NotACache):
        return "corrupt"
    name = getattr(exc, "sqlite_errorname", "") or ""
    if name in _BUSY or "locked" in str(exc) or "busy" in str(exc):
        return "busy"
    if name in _CORRUPT or "not a database" in str(exc) or "malformed" in str(exc):
        return "corrupt"
    return "other"


class TuningCache:
    """A sqlite-backed store of :class:`Entry`, safe for concurrent processes.

    Several processes may open, create and write one file at once: a busy file is waited for (up
    to :data:`BUSY_WAIT_S`), never taken for a damaged one. Only a file that is not a valid cache
    is moved aside (``*.corrupt-<time>``), and only when its directory is writable. A cache in a
    read-only directory is read as it is (opened immutable) and nothing is written to it.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._local = threading.local()
        self.read_only = False

    # -- connection -------------------------------------------------------------------------
    def _connect(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        folder = self.path.parent
        if folder.exists() and not folder.is_dir():
            raise CacheError(f"the tuning cache directory {folder} is a file; set OPRUNTIME_CACHE_DIR (or "
                             f"cache_dir) to a directory")
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheError(f"cannot create the tuning cache directory {folder}: {exc}; set OPRUNTIME_CACHE_DIR "
                             f"(or cache_dir) to a writable directory") from exc
        self.read_only = not os.access(folder, os.W_OK) or (self.path.exists() and not os.access(self.path, os.W_OK))
        if self.read_only and not self.path.exists():
            raise CacheError(f"the tuning cache directory {folder} is read-only and holds no cache; set "
                             f"OPRUNTIME_CACHE_DIR (or cache_dir) to a writable directory")
        deadline = time.monotonic() + BUSY_WAIT_S
        delay = 0.01
        while True:
            try:
                conn = self._open()
                break
            except sqlite3.DatabaseError as exc:
                kind = _kind(exc)
                if kind == "busy" and time.monotonic() < deadline:
                    time.sleep(delay)  # another process is creating or switching the file to WAL
                    delay = min(delay * 2, 0.5)
                    continue
                if kind != "corrupt":
                    raise CacheError(f"the tuning cache {self.path} cannot be opened: {exc}") from exc
                if self.read_only:
                    raise CacheError(f"the tuning cache {self.path} is not a valid cache ({exc}) and its directory "
                                     f"is read-only, so it is left as it is; it is not used") from exc
                self._move_aside(exc)
        self._local.conn = conn
        return conn

    def _open(self) -> sqlite3.Connection:
        if self.read_only:
            conn = sqlite3.connect(f"file:{self.path}?immutable=1", uri=True, isolation_level=None)
        else:
            conn = sqlite3.connect(self.path, timeout=BUSY_WAIT_S, isolation_level=None)
        try:
            if not self.read_only:
                conn.execute(f"PRAGMA busy_timeout={int(BUSY_WAIT_S * 1000)}")
                conn.execute("PRAGMA journal_mode=WAL")
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
                raise _NotACache(f"schema version {row and row[0]!r}, expected {SCHEMA_VERSION}")
            conn.execute("SELECT count(*) FROM tuned").fetchone()
        except sqlite3.DatabaseError as exc:
            conn.close()
            if self.read_only and "no such table" in str(exc):
                raise _NotACache(str(exc)) from exc
            raise
        return conn

    def _move_aside(self, exc: Exception) -> None:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
        moved = False
        for suffix in ("", "-wal", "-shm"):
            p = Path(str(self.path) + suffix)
            if p.exists():
                os.replace(p, Path(str(aside) + suffix))
                moved = moved or suffix == ""
        if moved:
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
            if _kind(exc) != "corrupt" or self.read_only:
                raise CacheError(f"the tuning cache {self.path} cannot be read: {exc}") from exc
            self._move_aside(exc)
            return None
        if not row:
            return None
        try:
            return _entry(row)
        except (ValueError, TypeError) as exc:  # a damaged or hand-edited row: drop it, select without it
            log.warning("opruntime: dropping a malformed tuning-cache row for %s in %s: %s", problem, self.path, exc)
            if not self.read_only:
                self.delete(device, problem)
            return None

    def _write(self, sql: str, args: tuple = ()) -> sqlite3.Cursor:
        conn = self._connect()
        if self.read_only:
            raise CacheError(f"the tuning cache {self.path} is in a read-only directory; nothing is written to it "
                             f"(set OPRUNTIME_CACHE_DIR to a writable directory to keep new tuning results)")
        try:
            return conn.execute(sql, args)
        except sqlite3.DatabaseError as exc:
            raise CacheError(f"cannot write the tuning cache {self.path}: {exc}") from exc

    def put(self, entry: Entry) -> None:
        entry.created = entry.created or time.time()
        values = (entry.device, entry.problem, entry.kernel, json.dumps(entry.config), entry.source_hash,
                  entry.time_s, json.dumps(entry.candidates), entry.device_name, entry.created)
        self._write("INSERT OR REPLACE INTO tuned VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", values)

    def delete(self, device: str, problem: str) -> None:
        self._write("DELETE FROM tuned WHERE device = ? AND problem = ?", (device, problem))

    def entries(self) -> Iterator[Entry]:
        rows = self._connect().execute(
            "SELECT device, problem, kernel, config, source_hash, time_s, candidates, device_name, created "
            "FROM tuned ORDER BY device_name, problem").fetchall()
        return (_entry(r) for r in rows)

    def clear(self) -> int:
        return self._write("DELETE FROM tuned").rowcount

    def export(self, path: Path | str) -> int:
        """Write every entry to a JSON file; returns how many."""
        data = [asdict(e) for e in self.entries()]
        try:
            Path(path).write_text(json.dumps({"opruntime_tuning_cache": SCHEMA_VERSION, "entries": data}, indent=1))
        except OSError as exc:
            raise CacheError(f"cannot write the export {path}: {exc}") from exc
        return len(data)

    def import_(self, path: Path | str) -> int:
        """Add the entries of an exported JSON file (newer entries win); returns how many.

        Raises:
            CacheError: the file is missing or not an export, or an entry is malformed (then
                nothing is imported).
        """
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CacheError(f"cannot import {path}: {exc}") from exc
        if not isinstance(data, dict) or data.get("opruntime_tuning_cache") != SCHEMA_VERSION \
                or not isinstance(data.get("entries"), list):
            raise CacheError(f"{path}: not an opruntime tuning-cache export (version {SCHEMA_VERSION}); make one "
                             f"with `opruntime cache export PATH`")
        entries = []
        for i, raw in enumerate(data["entries"]):
            try:
                if not isinstance(raw, dict) or set(raw) != {f.name for f in fields(Entry)}:
                    raise ValueError(f"fields {sorted(raw) if isinstance(raw, dict) else type(raw).__name__}")
                entries.append(_entry((raw["device"], raw["problem"], raw["kernel"], json.dumps(raw["config"]),
                                       raw["source_hash"], raw["time_s"], json.dumps(raw["candidates"]),
                                       raw["device_name"], raw["created"])))
            except (ValueError, TypeError) as exc:
                raise CacheError(f"{path}: entry {i} is malformed ({exc}); nothing was imported") from exc
        n = 0
        for entry in entries:
            old = self.get(entry.device, entry.problem)
            if old is None or old.created <= entry.created:
                self.put(entry)
                n += 1
        return n


def _entry(row: tuple) -> Entry:
    """An Entry from a row; ValueError when a field is not what :meth:`TuningCache.put` writes."""
    device, problem, kernel, config, source_hash, time_s, candidates, device_name, created = row
    config, candidates = json.loads(config), json.loads(candidates)
    number = (int, float)
    ok = (all(isinstance(v, str) for v in (device, problem, kernel, source_hash, device_name))
          and isinstance(config, dict) and isinstance(time_s, number) and not isinstance(time_s, bool)
          and math.isfinite(time_s) and time_s >= 0 and isinstance(created, number) and isinstance(candidates, list)
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
