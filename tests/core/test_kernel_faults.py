"""Kernel and device faults below the operators: kernels that fail to build or to launch (the
next kernel answers, announced once; strict mode raises; out of memory is no fallback), and a
device that disappears between calls (typed errors, never a wrong result)."""

from __future__ import annotations

import contextlib
import logging
import types

import numpy as np
import pytest
from fake_backend import FakeBackend, FakeDevice

import opruntime as opr
from opruntime.errors import (
    DeviceUnavailableError,
    FallbackWarning,
    KernelCompileError,
    KernelError,
    OutOfMemoryError,
    PluginError,
    UnknownDeviceError,
)
from opruntime.plugins import reset

F32 = frozenset({"float32", "float64"})


def operands(rng, m=5, k=7, n=3):
    return rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)


@pytest.fixture
def cpu_kernel(kernel_plugin):
    """Register a kernel-only plugin whose cpu matmul wins the ranking (cost 0) and runs ``run``."""
    def add(run, name="faulty", supports=None, cost=lambda p, c: 0.0):
        kernel = opr.Kernel("matmul", f"{name}.matmul.k", "cpu", F32, run, cost=cost,
                            **({"supports": supports} if supports else {}))
        return kernel_plugin(name, kernel)[0]

    return add


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
    backend = FakeBackend(plugin="flaky")
    backend.opruntime_devices = opr.hookimpl(lambda: [Flaky(0)])
    Flaky.lost = False
    opr.register(backend, name="flaky")
    yield backend
    Flaky.lost = False
    with contextlib.suppress(PluginError):  # the tests that unregister it themselves
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


# -- a device whose memory is full ---------------------------------------------------------------------------
def test_fake_device_out_of_memory_in_from_host(rng):
    from fake_backend import FakeArray

    class Tiny(FakeDevice):
        def from_host(self, array):
            if array.nbytes > 1024:
                raise OutOfMemoryError(f"{self.name}: 1 KiB device, {array.nbytes} bytes asked")
            return FakeArray(np.array(array), self.name)

    backend = FakeBackend(plugin="tiny")
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
