"""Fault injection: every broken part ends in a typed error or an announced fallback, never in a
wrong result: kernels that fail to build or to launch, plugins that fail to import, hooks that
raise or return junk, a device that disappears between calls, a corrupt tuning cache and an
allocation larger than the device's memory."""

from __future__ import annotations

import contextlib
import glob
import logging
import sqlite3
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest
from fake_backend import FakeArray, FakeBackend, FakeDevice

import opruntime as opr
from opruntime import selector, tuning
from opruntime.config import settings
from opruntime.errors import (
    DeviceUnavailableError,
    FallbackWarning,
    KernelCompileError,
    KernelError,
    OpRuntimeError,
    OutOfMemoryError,
    UnknownDeviceError,
)
from opruntime.plugins import registry, reset

F32 = frozenset({"float32", "float64"})


def operands(rng, m=5, k=7, n=3):
    return rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)


@pytest.fixture
def cpu_kernel():
    """Register a kernel-only plugin whose cpu matmul wins the ranking (cost 0) and runs ``run``."""
    names = []

    def add(run, name="faulty", supports=None, cost=lambda p, c: 0.0):
        kernel = opr.Kernel("matmul", f"{name}.matmul.k", "cpu", F32, run, cost=cost,
                            **({"supports": supports} if supports else {}))

        @opr.hookimpl
        def opruntime_kernels():
            return [kernel]

        opr.register(types.SimpleNamespace(opruntime_kernels=opruntime_kernels, __name__=name), name=name)
        names.append(name)
        return kernel

    yield add
    for n in names:
        opr.unregister(n)


# -- kernels that fail to build or to launch ------------------------------------------------------------
LOG = "acme_matmul.cl:12:5: error: use of undeclared identifier 'TSK'"


def test_kernel_that_fails_to_compile_falls_back_announced(cpu_kernel, rng):
    def run(problem, config, a, b):
        raise KernelCompileError("faulty.matmul.k", "cpu", LOG)

    cpu_kernel(run)
    a, b = operands(rng)
    with pytest.warns(FallbackWarning, match=r"(?s)'faulty.matmul.k' failed .*undeclared identifier 'TSK'.*using 'numpy"):
        out = opr.matmul(a, b, device="cpu")
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5)
    assert "failed: KernelCompileError" in str(opr.explain("matmul", a, b, device="cpu"))  # the plan remembers


def test_compile_failure_in_strict_mode_raises_with_the_log(cpu_kernel, rng):
    cpu_kernel(lambda problem, config, a, b: (_ for _ in ()).throw(KernelCompileError("faulty.matmul.k", "cpu", LOG)))
    opr.configure(strict=True)
    with pytest.raises(KernelError, match="(?s)undeclared identifier.*strict mode"):
        opr.matmul(*operands(rng), device="cpu")


@pytest.mark.parametrize("exc", [RuntimeError("CUDA_ERROR_LAUNCH_FAILED"), ValueError("bad work-group size"),
                                 ZeroDivisionError("grid of 0 blocks")], ids=lambda e: type(e).__name__)
def test_kernel_that_raises_at_launch_falls_back_announced(cpu_kernel, rng, exc):
    calls = []

    def run(problem, config, a, b):
        calls.append(problem)
        raise exc

    cpu_kernel(run)
    a, b = operands(rng)
    with pytest.warns(FallbackWarning, match=f"'faulty.matmul.k' failed .*{type(exc).__name__}"):
        out = opr.matmul(a, b, device="cpu")
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5)
    out = opr.matmul(a, b, device="cpu")  # dropped for this problem: no second try, no second warning
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5)
    assert len(calls) == 1


def test_kernel_failing_for_one_shape_still_serves_others(cpu_kernel, rng):
    def run(problem, config, a, b):
        if problem.shapes[0][0] == 5:
            raise RuntimeError("too few rows for a tile")
        return np.matmul(a, b)

    k = cpu_kernel(run)
    with pytest.warns(FallbackWarning):
        opr.matmul(*operands(rng), device="cpu")
    a, b = operands(rng, m=64)
    assert opr.explain("matmul", a, b, device="cpu").chosen == k.name
    np.testing.assert_allclose(opr.matmul(a, b, device="cpu").numpy(), a @ b, rtol=1e-5)


def test_every_kernel_failing_stays_a_typed_error(fake, rng):
    for knob in fake.knobs.values():
        knob.fail = KernelCompileError("fake.matmul.x", "fake:0", "syntax error")
    ta, tb = (opr.tensor(x, device="fake:0") for x in operands(rng))
    for attempt in range(3):  # the failure is remembered: the same typed error every time, never IndexError
        warned = pytest.warns(FallbackWarning) if attempt == 0 else contextlib.nullcontext()
        with warned, pytest.raises(KernelError, match="every kernel failed"):
            opr.matmul(ta, tb)


def test_supports_or_cost_that_raises_is_logged_and_skipped(cpu_kernel, rng, caplog):
    def boom(problem, *args):
        raise AttributeError("'Problem' object has no attribute 'layout'")

    cpu_kernel(lambda p, c, a, b: np.zeros(p.out_shape, a.dtype), name="badsupports", supports=boom)
    cpu_kernel(lambda p, c, a, b: np.zeros(p.out_shape, a.dtype), name="badcost", cost=boom)
    a, b = operands(rng)
    with caplog.at_level(logging.WARNING, logger="opruntime"):
        out = opr.matmul(a, b, device="cpu")
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5)  # neither wrong kernel ran
    assert "badsupports.matmul.k: supports() raised" in caplog.text
    assert "badcost.matmul.k: cost() raised" in caplog.text


def test_kernel_raising_memory_error_is_out_of_memory_not_a_fallback(cpu_kernel, rng):
    calls = []

    def run(problem, config, a, b):
        calls.append(1)
        raise MemoryError("Unable to allocate 4.00 TiB")

    cpu_kernel(run)
    with pytest.raises(OutOfMemoryError, match="matmul: out of memory on cpu .*4.00 TiB"):
        opr.matmul(*operands(rng), device="cpu")
    assert len(calls) == 1  # no other kernel is tried: it would need the same memory


# -- plugins that fail to load, hooks that raise or return junk -------------------------------------------
def _ok_after(rng):
    a, b = operands(rng)
    np.testing.assert_allclose(opr.matmul(a, b, device="cpu").numpy(), a @ b, rtol=1e-5)


def test_plugin_that_fails_to_import_is_isolated_and_announced(rng):
    opr.register("opruntime_no_such_backend_xyz", name="ghost")  # an entry point naming a missing module
    try:
        with pytest.warns(FallbackWarning, match="plugin 'ghost' failed to load: ModuleNotFoundError"):
            reg = registry()
        assert reg.records["ghost"].status == "failed"
        _ok_after(rng)
    finally:
        opr.unregister("ghost")


def test_plugin_module_that_raises_at_import(tmp_path, monkeypatch, rng):
    (tmp_path / "opruntime_explodes.py").write_text("raise RuntimeError('libacme.so: cannot open shared object')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    opr.register("opruntime_explodes", name="explodes")
    try:
        with pytest.warns(FallbackWarning, match="'explodes' failed to load: RuntimeError: libacme.so"):
            registry()
        _ok_after(rng)
    finally:
        opr.unregister("explodes")


@pytest.mark.parametrize("hook,result,match", [
    ("opruntime_devices", RuntimeError("driver exploded"), "opruntime_devices raised RuntimeError: driver exploded"),
    ("opruntime_kernels", RuntimeError("no"), "opruntime_kernels raised RuntimeError: no"),
    ("opruntime_devices", ["cpu"], "opruntime_devices returned 'cpu', not a DeviceProvider"),
    ("opruntime_devices", 5, "opruntime_devices raised TypeError"),
    ("opruntime_kernels", [None], "opruntime_kernels returned None, not an opruntime.Kernel"),
    ("opruntime_kernels", 5, "opruntime_kernels raised TypeError"),
])
def test_hook_that_raises_or_returns_junk_is_isolated(rng, hook, result, match):
    def impl():
        if isinstance(result, Exception):
            raise result
        return result

    def no_kernels():
        return []

    hooks = {"opruntime_devices": lambda: [FakeDevice(7)], "opruntime_kernels": no_kernels}
    hooks[hook] = impl
    plugin = types.SimpleNamespace(__name__="junk", **{k: opr.hookimpl(v) for k, v in hooks.items()})
    opr.register(plugin, name="junk")
    try:
        with pytest.warns(FallbackWarning, match=f"plugin 'junk' {match}"):
            reg = registry()
        assert reg.records["junk"].status == "failed"
        assert "fake:7" not in [d.name for d in reg.devices]  # a disabled plugin offers no devices
        _ok_after(rng)
    finally:
        opr.unregister("junk")


# -- a device that disappears between calls ---------------------------------------------------------------
class Flaky(FakeDevice):
    """fake:0 that can be lost: then its memory raises DeviceUnavailableError, as a driver reset would."""

    lost = False

    def from_host(self, array):
        if Flaky.lost:
            raise DeviceUnavailableError(f"{self.name}: device lost (driver reset)")
        return super().from_host(array)


@pytest.fixture
def flaky():
    backend = FakeBackend()
    backend.opruntime_devices = opr.hookimpl(lambda: [Flaky(0)])
    Flaky.lost = False
    opr.register(backend, name="flaky")
    yield backend
    Flaky.lost = False
    opr.unregister("flaky")


def test_unregistered_device_tensor_gives_device_unavailable(flaky, rng):
    a, b = operands(rng)
    ta, tb = opr.tensor(a, device="fake:0"), opr.tensor(b, device="fake:0")
    np.testing.assert_allclose(opr.matmul(ta, tb).numpy(), a @ b, rtol=1e-5)
    opr.unregister("flaky")
    with pytest.raises(DeviceUnavailableError, match="'fake:0' is no longer available"):
        opr.matmul(ta, tb)


def test_unregistered_device_by_name_is_an_unknown_device(flaky, rng):
    a, b = operands(rng)
    with opr.device("fake:0"):
        assert opr.matmul(a, b).device == "fake:0"
    opr.unregister("flaky")
    for names in ("fake:0", ["fake:0", "cpu"]):  # nobody knows the kind now: a typo as far as anyone can tell
        with opr.device(names), pytest.raises(UnknownDeviceError, match="unknown device 'fake:0'"):
            opr.matmul(a, b)


def test_device_lost_between_calls_raises_device_unavailable(flaky, rng):
    a, b = operands(rng)
    ta, tb = opr.tensor(a, device="fake:0"), opr.tensor(b, device="fake:0")
    opr.matmul(ta, tb)
    Flaky.lost = True
    for knob in flaky.knobs.values():
        knob.fail = DeviceUnavailableError("fake:0: device lost (driver reset)")
    with pytest.raises(DeviceUnavailableError, match="device lost"):  # from the kernel: no futile fallback
        opr.matmul(ta, tb)
    assert flaky.calls["run:b"] == 0
    with opr.device("fake:0"), pytest.raises(DeviceUnavailableError, match="device lost"):  # from placement
        opr.matmul(a, b)


def test_device_whose_kernels_start_failing_gives_kernel_error_not_garbage(flaky, rng):
    ta, tb = (opr.tensor(x, device="fake:0") for x in operands(rng))
    opr.matmul(ta, tb)
    for knob in flaky.knobs.values():
        knob.fail = RuntimeError("CL_OUT_OF_RESOURCES")  # what a driver says, untyped
    with pytest.warns(FallbackWarning), pytest.raises(KernelError, match="every kernel failed"):
        opr.matmul(ta, tb)
    with pytest.raises(KernelError):
        opr.matmul(ta, tb)


def test_backend_that_becomes_unavailable_on_rebuild(rng):
    state = {"present": True}

    @opr.hookimpl
    def opruntime_devices():
        if not state["present"]:
            raise opr.errors.BackendUnavailable("no Acme card found (was it unplugged?)", kinds=["fake"])
        return [FakeDevice(0)]

    opr.register(types.SimpleNamespace(opruntime_devices=opruntime_devices, __name__="acme"), name="acme")
    try:
        t = opr.tensor([1.0], device="fake:0")
        state["present"] = False
        reset()  # the registry is rebuilt (a new process, opr.reload() after a config change, ...)
        with pytest.raises(DeviceUnavailableError, match="no Acme card found"):
            opr.tensor([1.0], device="fake:0")
        with pytest.raises(DeviceUnavailableError, match="'fake:0' is no longer available"):
            opr.softmax(t)
        a, b = operands(rng)
        with opr.device(["fake:0", "cpu"]), pytest.warns(FallbackWarning, match="falling back to 'cpu'.*no Acme card"):
            out = opr.matmul(a, b)
        assert out.device == "cpu"
        np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5)
    finally:
        opr.unregister("acme")


# -- a corrupt tuning cache -----------------------------------------------------------------------------------
@pytest.fixture
def cache_dir(tmp_path):
    opr.configure(cache_dir=str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("content", [b"this is not a database\n" * 100, b"SQLite format 3\x00" + b"\xff" * 4000, b""],
                         ids=["garbage", "bad-pages", "empty"])
@pytest.mark.parametrize("tune", ["heuristic", "autotune"])
def test_corrupt_cache_file_is_announced_and_replaced(cache_dir, rng, content, tune):
    (cache_dir / "tuning.sqlite").write_bytes(content)
    opr.configure(tune=tune, tune_budget=0.2)
    a, b = operands(rng)
    ctx = pytest.warns(FallbackWarning, match="not a valid cache") if content else contextlib.nullcontext()
    with ctx:
        out = opr.matmul(a, b, device="cpu")
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5)
    if content:
        assert glob.glob(str(cache_dir / "tuning.sqlite.corrupt-*"))


def _poison(cache_dir, rng, **row):
    """A valid cache holding one row for the cpu matmul problem of ``operands``, with ``row`` overriding fields."""
    a, b = operands(rng)
    problem = opr.explain("matmul", a, b, device="cpu").problem
    values = {"device": tuning.device_key(opr.Device("cpu")),
              "problem": tuning.problem_key(problem, settings().bucket_for("matmul")),
              "kernel": "numpy.matmul.blas", "config": "{}",
              "source_hash": registry().kernels["numpy.matmul.blas"].source_hash, "time_s": 1e-6,
              "candidates": "[]", "device_name": "cpu", "created": 0.0}
    values.update(row)
    from opruntime import cache

    store = cache.TuningCache(cache_dir / "tuning.sqlite")
    store._connect()  # creates the schema
    store.close()
    with sqlite3.connect(cache_dir / "tuning.sqlite") as conn:
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


def test_unwritable_cache_dir_falls_back_to_selecting_without_it(tmp_path, rng, caplog):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the cache directory should be")
    opr.configure(cache_dir=str(blocker), tune="autotune", tune_budget=0.2)
    a, b = operands(rng)
    with caplog.at_level(logging.WARNING, logger="opruntime"):
        out = opr.matmul(a, b, device="cpu")
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5)
    assert "tuning cache" in caplog.text


# -- an allocation larger than device memory ---------------------------------------------------------------------
HUGE = (1 << 42,)  # 16 TiB of float32


def test_huge_allocation_is_out_of_memory(device):
    with pytest.raises(OutOfMemoryError):
        device.provider.empty(HUGE, np.dtype(np.float32))
    with pytest.raises(OutOfMemoryError):
        device.provider.zeros(HUGE, np.dtype(np.float32))


def test_operator_whose_result_does_not_fit_is_out_of_memory(device):
    """A 4 TiB matmul result, in a child process (a backend that aborts must not take the suite down)."""
    code = textwrap.dedent(f"""
        import numpy as np, opruntime as opr
        from opruntime.errors import OutOfMemoryError
        a = np.ones((1 << 20, 1), np.float32)
        try:
            out = opr.matmul(a, a.T, device={device.name!r})
            out.numpy()
        except OutOfMemoryError as exc:
            print("TYPED", exc)
        except Exception as exc:
            print("NOT-OOM", type(exc).__module__, type(exc).__name__, exc)
        else:
            print("NO ERROR")
    """)
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=300,
                          check=False)
    tail = (proc.stdout + proc.stderr)[-1500:]
    assert proc.returncode == 0, f"the process died (rc {proc.returncode}):\n{tail}"
    assert proc.stdout.startswith("TYPED"), tail


def test_fake_device_out_of_memory_in_from_host(rng):
    class Tiny(FakeDevice):
        def from_host(self, array):
            if array.nbytes > 1024:
                raise OutOfMemoryError(f"{self.name}: 1 KiB device, {array.nbytes} bytes asked")
            return FakeArray(np.array(array), self.name)

    backend = FakeBackend()
    backend.opruntime_devices = opr.hookimpl(lambda: [Tiny(0)])
    opr.register(backend, name="tiny")
    try:
        a, b = operands(rng)
        with opr.device("fake:0"):
            np.testing.assert_allclose(opr.matmul(a, b).numpy(), a @ b, rtol=1e-5)
            with pytest.raises(OutOfMemoryError, match="1 KiB device"):
                opr.matmul(*operands(rng, m=100))
    finally:
        opr.unregister("tiny")
