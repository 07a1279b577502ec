"""The persistent tuning cache (``opruntime.cache``): one sqlite file shared by processes; a file
that is not a valid cache moved aside and announced; poisoned rows never break a call; exports
validated before anything is imported; a directory that is a file or read-only is a CacheError,
and a read-only one holding a valid cache is read and never written."""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import opruntime as opr
from opruntime import cache, selector, tuning
from opruntime.config import settings
from opruntime.errors import CacheError, FallbackWarning, OpRuntimeError
from opruntime.plugins import registry

TESTS = str(Path(__file__).resolve().parents[1])  # where fake_backend.py lives, for child processes


def operands(rng, m=4, k=5, n=3, device="fake:0"):
    return (opr.tensor(rng.standard_normal((m, k)).astype(np.float32), device=device),
            opr.tensor(rng.standard_normal((k, n)).astype(np.float32), device=device))


def host_operands(rng, m=5, k=7, n=3):
    return rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)


def entry(problem: str, time_s: float = 1e-6) -> cache.Entry:
    return cache.Entry("dev", problem, "fake.matmul.a", {}, "hash", time_s, [], "fake:0")


@pytest.fixture
def cache_dir(tmp_path):
    opr.configure(cache_dir=str(tmp_path / "cache"))
    return tmp_path / "cache"


# -- files that are not a valid cache --------------------------------------------------------------------
def test_corrupt_cache_is_moved_aside(fake, rng):
    path = cache.tuning_cache().path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"this is not a database" * 100)
    cache._caches.clear()
    opr.configure(tune="autotune")
    with pytest.warns(FallbackWarning, match="is not a valid cache .* moved it to"):
        opr.matmul(*operands(rng))
    assert list(path.parent.glob("tuning.sqlite.corrupt-*"))
    assert len(list(cache.tuning_cache().entries())) == 1


def test_truncated_cache_is_moved_aside(fake, rng):
    opr.configure(tune="autotune")
    opr.matmul(*operands(rng))
    store = cache.tuning_cache()
    store.close()
    for extra in ("-wal", "-shm"):
        p = store.path.with_name(store.path.name + extra)
        if p.exists():
            p.unlink()
    data = store.path.read_bytes()
    store.path.write_bytes(data[: len(data) // 3])
    cache._caches.clear()
    selector.clear_cache()
    with pytest.warns(FallbackWarning, match="not a valid cache"):
        opr.matmul(*operands(rng, m=9))
    assert cache.tuning_cache().get(tuning.device_key(opr.Device("fake:0")), "nothing") is None


@pytest.mark.parametrize("content", [b"this is not a database\n" * 100, b"SQLite format 3\x00" + b"\xff" * 4000, b""],
                         ids=["garbage", "bad-pages", "empty"])
@pytest.mark.parametrize("tune", ["heuristic", "autotune"])
def test_corrupt_cache_file_is_announced_and_replaced(cache_dir, rng, content, tune):
    cache_dir.mkdir()
    (cache_dir / "tuning.sqlite").write_bytes(content)
    opr.configure(tune=tune, tune_budget=0.2)
    a, b = host_operands(rng)
    ctx = pytest.warns(FallbackWarning, match="not a valid cache") if content else contextlib.nullcontext()
    with ctx:
        out = opr.matmul(a, b, device="cpu")
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5)
    if content:
        assert glob.glob(str(cache_dir / "tuning.sqlite.corrupt-*"))


def _poison(cache_dir, rng, **row):
    """A valid cache holding one row for the cpu matmul problem of ``host_operands``, with ``row``
    overriding fields."""
    a, b = host_operands(rng)
    problem = opr.explain("matmul", a, b, device="cpu").problem
    values = {"device": tuning.device_key(opr.Device("cpu")),
              "problem": tuning.problem_key(problem, settings().bucket_for("matmul")),
              "kernel": "numpy.matmul.blas", "config": "{}",
              "source_hash": registry().kernels["numpy.matmul.blas"].source_hash, "time_s": 1e-6,
              "candidates": "[]", "device_name": "cpu", "created": 0.0}
    values.update(row)
    store = cache.TuningCache(cache_dir / "tuning.sqlite")
    store._connect()  # creates the schema
    store.close()
    with contextlib.closing(sqlite3.connect(cache_dir / "tuning.sqlite")) as conn, conn:
        conn.execute("INSERT INTO tuned VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", tuple(values.values()))
    selector.clear_cache()
    cache._caches.clear()
    return a, b


@pytest.mark.parametrize("row", [
    {"kernel": "acme.matmul.gone"},  # a kernel no longer installed
    {"kernel": "opencl.matmul.tiled"},  # a kernel of another device kind
    {"config": '{"TSM": 64}'},  # a config the kernel does not offer
    {"source_hash": "0123456789abcdef"},  # the kernel changed since
    {"config": "{not json"},
    {"config": "[1, 2]"},
    {"candidates": "5"},
    {"candidates": '[{"kernel": 1}]'},
    {"candidates": "[null]"},
    {"time_s": "fast"},
    {"created": "yesterday"},
], ids=lambda r: "-".join(f"{k}={v}" for k, v in r.items()))
def test_poisoned_cache_rows_never_break_a_call(cache_dir, rng, row):
    a, b = _poison(cache_dir, rng, **row)
    try:
        out = opr.matmul(a, b, device="cpu")
    except OpRuntimeError:  # a typed error is allowed; an untyped crash or a wrong result is not
        return
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5)
    assert opr.explain("matmul", a, b, device="cpu").chosen == "numpy.matmul.blas"


# -- processes sharing one file (finding 5) ----------------------------------------------------------------
WRITER = textwrap.dedent("""
    import sys, time, warnings
    from pathlib import Path
    warnings.simplefilter("error")  # any warning (a cache moved aside, ...) fails the child
    from opruntime import cache
    root, me, rounds, n = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    for r in range(rounds):
        (root / f"ready-{r}-{me}").touch()
        go, deadline = root / f"go-{r}", time.monotonic() + 60
        while not go.exists() or not go.read_text():
            if time.monotonic() > deadline:
                sys.exit(f"round {r}: never started")
            time.sleep(0.0005)
        start = float(go.read_text())  # one moment on the machine's monotonic clock for all six
        while time.monotonic() < start:
            pass
        store = cache.TuningCache(root / f"round{r}" / cache.FILENAME)
        for i in range(n):
            store.put(cache.Entry("dev", f"p{me}-{i}", "k", {}, "h", 1e-6 * (i + 1), [], "fake:0"))
        missing = {f"p{me}-{i}" for i in range(n)} - {e.problem for e in store.entries()}
        store.close()
        if missing:
            sys.exit(f"round {r}: lost {sorted(missing)}")
    print("ok")
""")


def test_finding_5_six_processes_create_one_cache_at_once(tmp_path):
    """Finding 5: processes opening a fresh cache together took the file another was creating
    ("database is locked" while it switched to WAL) for a corrupt one and moved it aside, losing
    the others' entries. Six processes, six rounds, each round a fresh directory, the six
    starting at one instant of the monotonic clock (the code before the fix moved a cache aside
    in 5 of 5 such runs of 5 rounds): no entry lost, nothing moved aside, no warning."""
    procs_n, rounds, per = 6, 6, 4
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(i), str(rounds), str(per)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(procs_n)]
    try:
        for r in range(rounds):
            for _ in range(6000):
                if all((tmp_path / f"ready-{r}-{i}").exists() for i in range(procs_n)) or \
                        any(p.poll() is not None for p in procs):
                    break
                time.sleep(0.01)
            (tmp_path / f"go-{r}.tmp").write_text(str(time.monotonic() + 0.05))  # start together, 50 ms from now
            os.replace(tmp_path / f"go-{r}.tmp", tmp_path / f"go-{r}")
        results = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0 and out.strip() == "ok" and not err.strip(), f"rc {p.returncode}: {out}{err[-2000:]}"
    for r in range(rounds):
        problems = {e.problem for e in cache.TuningCache(tmp_path / f"round{r}" / cache.FILENAME).entries()}
        assert problems == {f"p{i}-{j}" for i in range(procs_n) for j in range(per)}, f"round {r}"
    assert not list(tmp_path.rglob("*.corrupt-*"))


def test_two_processes_tune_into_one_file(tmp_path):
    script = textwrap.dedent("""
        import sys, numpy as np, opruntime as opr
        sys.path.insert(0, sys.argv[1])
        from fake_backend import FakeBackend
        opr.register(FakeBackend(), name="fake")
        opr.configure(tune="autotune", cache_dir=sys.argv[2])
        rng = np.random.default_rng(int(sys.argv[3]))
        for m in range(1, 25):
            a = opr.tensor(rng.standard_normal((m, 4)).astype(np.float32), device="fake:0")
            opr.matmul(a, np.ones((4, 3), np.float32))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, TESTS, str(tmp_path / "shared"), str(i)],
                              stderr=subprocess.PIPE, text=True) for i in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    entries = list(cache.TuningCache(tmp_path / "shared" / cache.FILENAME).entries())
    assert len(entries) == 24  # both wrote the same 24 problems; no error, no lost or broken row
    assert all(e.kernel.startswith("fake.matmul.") for e in entries)


# -- export and import (finding 13) ------------------------------------------------------------------------
def test_export_import(fake, rng, tmp_path):
    opr.configure(tune="autotune")
    opr.matmul(*operands(rng))
    out = tmp_path / "tuned.json"
    assert cache.tuning_cache().export(out) == 1
    assert json.loads(out.read_text())["entries"][0]["kernel"].startswith("fake.matmul.")
    cache.tuning_cache().clear()
    assert cache.tuning_cache().import_(out) == 1
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(CacheError, match="not an opruntime tuning-cache export"):
        cache.tuning_cache().import_(tmp_path / "bad.json")
    (tmp_path / "bad.json").write_bytes(b"\xff\xfe not json")
    with pytest.raises(CacheError, match="cannot import"):
        cache.tuning_cache().import_(tmp_path / "bad.json")
    with pytest.raises(CacheError, match="cannot import"):
        cache.tuning_cache().import_(tmp_path / "missing.json")


def _export(path, *entries):
    path.write_text(json.dumps({"opruntime_tuning_cache": cache.SCHEMA_VERSION, "entries": list(entries)}))


@pytest.mark.parametrize("damage", [
    {"time_s": "1e-6"}, {"time_s": None}, {"time_s": float("nan")}, {"time_s": -1.0}, {"time_s": True},
    {"config": "{}"}, {"candidates": "[]"}, {"candidates": [{"kernel": 3, "config": {}}]}, {"created": "today"},
    {"kernel": None}, {"extra": 1}, "drop:time_s", "drop:candidates", "drop:device",
], ids=str)
def test_finding_13_a_malformed_export_imports_nothing(cache_dir, tmp_path, damage):
    """Finding 13: ``cache import`` of an export with a string ``time_s`` (or a missing field)
    stored the row, and every later lookup of it raised; the whole file is refused with a
    CacheError before anything is written, and the cache keeps working."""
    store = cache.tuning_cache()
    store.put(entry("kept"))
    good = {k: v for k, v in json.loads(json.dumps(entry("new-good").__dict__)).items()}
    bad = dict(good, problem="new-bad")
    if isinstance(damage, str):
        del bad[damage.split(":", 1)[1]]
    else:
        bad.update(damage)
    _export(tmp_path / "e.json", good, bad)  # a good entry first: it must not be imported either
    with pytest.raises(CacheError, match=r"e.json: entry 1 is malformed .*nothing was imported"):
        store.import_(tmp_path / "e.json")
    assert {e.problem for e in store.entries()} == {"kept"}
    store.put(entry("after"))
    assert store.get("dev", "after").time_s == 1e-6 and len(list(store.entries())) == 2


# -- directories that cannot hold a cache (findings 14 and 16) ---------------------------------------------------
def test_finding_14_a_cache_dir_that_is_a_file_is_a_cache_error(tmp_path, rng, caplog):
    """Finding 14: a cache directory that is a file raised FileExistsError / NotADirectoryError
    from the cache; it is a CacheError saying what to set. Calls still run, without the cache."""
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the cache directory should be")
    opr.configure(cache_dir=str(blocker))
    store = cache.tuning_cache()
    with pytest.raises(CacheError, match="tuning cache directory .*not_a_dir is a file; set OPRUNTIME_CACHE_DIR"):
        list(store.entries())
    with pytest.raises(CacheError, match="is a file"):
        store.put(entry("x"))
    opr.configure(cache_dir=str(blocker / "sub"))  # a directory below a file cannot be made either
    with pytest.raises(CacheError, match="not_a_dir"):
        list(cache.tuning_cache().entries())
    opr.configure(tune="autotune", tune_budget=0.2)
    a, b = host_operands(rng)
    with caplog.at_level(logging.WARNING, logger="opruntime"):
        out = opr.matmul(a, b, device="cpu")
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5)
    assert "tuning cache unusable" in caplog.text


@pytest.fixture
def read_only(monkeypatch):
    """``read_only(folder)``: the cache sees ``folder`` and what is in it as not writable.

    Simulated: the tests run as root, for whom ``os.access`` is always true whatever the mode
    bits (and chmod cannot take a directory away from root), so ``os.access`` is answered False
    for write access below ``folder``, as ``opruntime.cache`` asks it."""
    def make(folder):
        real = os.access
        folder = str(folder)

        def access(path, mode, *args, **kwargs):
            if mode & os.W_OK and str(path).startswith(folder):
                return False
            return real(path, mode, *args, **kwargs)

        monkeypatch.setattr(cache.os, "access", access)
        cache._caches.clear()

    return make


def test_finding_14_a_read_only_cache_dir_without_a_cache_is_a_cache_error(cache_dir, read_only):
    cache_dir.mkdir()
    read_only(cache_dir)
    store = cache.tuning_cache()
    with pytest.raises(CacheError, match="is read-only and holds no cache; set OPRUNTIME_CACHE_DIR"):
        list(store.entries())
    with pytest.raises(CacheError, match="read-only"):
        store.put(entry("x"))
    assert not list(cache_dir.iterdir())


def test_finding_16_a_read_only_cache_dir_with_a_valid_cache_is_read_not_written(fake, rng, cache_dir, read_only,
                                                                                  caplog):
    """Finding 16: a valid cache in a read-only directory was taken for a corrupt one ("moved it
    to ... corrupt", which then failed); it is opened read-only: entries are read and used,
    nothing is written, nothing is moved. (The read-only directory is simulated: see the
    ``read_only`` fixture.)"""
    opr.configure(tune="autotune")
    a, b = operands(rng)
    first = opr.explain("matmul", a, b).chosen
    opr.configure(tune="heuristic")
    store = cache.tuning_cache()
    store.put(entry("extra"))
    store.close()
    before = {p.name: p.read_bytes() for p in cache_dir.iterdir()}
    read_only(cache_dir)
    selector.clear_cache()
    store = cache.tuning_cache()
    with caplog.at_level(logging.WARNING, logger="opruntime"):
        assert {e.problem for e in store.entries()} >= {"extra"} and len(list(store.entries())) == 2
        assert store.read_only
        e = opr.explain("matmul", a, b)  # the tuned entry is used
        assert e.chosen == first and "tuned earlier" in e.why
        opr.configure(tune="autotune", tune_budget=0.2)
        opr.matmul(*operands(rng, m=7))  # a new problem: tuned, but not stored
        with pytest.raises(CacheError, match="read-only directory; nothing is written"):
            store.put(entry("y"))
    assert "moved it to" not in caplog.text and "corrupt" not in caplog.text
    assert {p.name: p.read_bytes() for p in cache_dir.iterdir()} == before  # not a byte written
    assert not list(cache_dir.glob("*.corrupt-*"))
