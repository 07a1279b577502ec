"""Plugin loading: isolation of broken plugins, blocking by configuration, the hook contract."""

from __future__ import annotations

import types

import numpy as np
import pytest

import opruntime as opr
from opruntime.errors import BackendUnavailable, FallbackWarning
from opruntime.plugins import Registry


def _registry(*plugins):
    return Registry(list(plugins), entry_points=False)


def test_builtin_backends_come_from_entry_points():
    reg = opr.registry()
    assert {"numpy", "cupy", "opencl", "jax"} <= set(reg.records)
    assert reg.records["numpy"].status == "ok" and "cpu" in reg.records["numpy"].devices


def test_plugin_that_fails_to_import_is_isolated():
    with pytest.warns(FallbackWarning, match="plugin 'broken' failed to load: ModuleNotFoundError"):
        reg = _registry(("broken", "opruntime_no_such_module"), ("numpy", "opruntime_numpy"))
    assert reg.records["broken"].status == "failed"
    assert [d.name for d in reg.devices] == ["cpu"]


def test_misspelled_hook_is_reported():
    @opr.hookimpl
    def opruntime_kernals():
        return []

    plugin = types.SimpleNamespace(opruntime_kernals=opruntime_kernals, __name__="typo")
    with pytest.warns(FallbackWarning, match="unknown hook\\(s\\) opruntime_kernals"):
        reg = _registry(("typo", plugin))
    assert reg.records["typo"].status == "failed"


def test_hook_that_raises_is_isolated():
    @opr.hookimpl
    def opruntime_devices():
        raise RuntimeError("driver exploded")

    plugin = types.SimpleNamespace(opruntime_devices=opruntime_devices, __name__="boom")
    with pytest.warns(FallbackWarning, match="opruntime_devices raised RuntimeError: driver exploded"):
        reg = _registry(("boom", plugin), ("numpy", "opruntime_numpy"))
    assert reg.records["boom"].status == "failed" and reg.records["numpy"].status == "ok"


def test_unavailable_backend_gives_reason():
    @opr.hookimpl
    def opruntime_devices():
        raise BackendUnavailable("acmelib not installed", kinds=["acme"])

    reg = _registry(("acme", types.SimpleNamespace(opruntime_devices=opruntime_devices)))
    assert reg.records["acme"].status == "unavailable"
    with pytest.raises(opr.errors.DeviceUnavailableError, match="acmelib not installed"):
        reg.device("acme:0")


def test_block_plugin_by_config(monkeypatch):
    monkeypatch.setenv("OPRUNTIME_PLUGINS", "-opencl,-jax")
    opr.reload()
    try:
        reg = opr.registry()
        assert reg.records["opencl"].status == "blocked" and reg.records["jax"].status == "blocked"
        assert not any(d.kind in ("opencl", "jax") for d in reg.devices)
    finally:
        monkeypatch.delenv("OPRUNTIME_PLUGINS")
        opr.reload()
    assert opr.registry().records["numpy"].status == "ok"


def test_kernel_only_plugin_adds_a_kernel_for_an_existing_device(rng):
    calls = []

    def run(problem, config, x):
        calls.append(problem)
        e = np.exp(x - x.max(axis=problem.attrs["axis"], keepdims=True))
        return e / e.sum(axis=problem.attrs["axis"], keepdims=True)

    @opr.hookimpl
    def opruntime_kernels():
        return [opr.Kernel("softmax", "acme.softmax.fast", "cpu", frozenset({"float32"}), run, cost=lambda p, c: 0.0)]

    opr.register(types.SimpleNamespace(opruntime_kernels=opruntime_kernels), name="acme")
    try:
        x = rng.standard_normal((3, 4)).astype(np.float32)
        out = opr.softmax(x)
        assert len(calls) == 1
        np.testing.assert_allclose(out.numpy().sum(axis=-1), 1, rtol=1e-6)
    finally:
        opr.unregister("acme")
    assert "acme.softmax.fast" not in opr.registry().kernels


def test_device_of_a_blocked_plugin_falls_back(monkeypatch):
    monkeypatch.setenv("OPRUNTIME_PLUGINS", "-cupy")
    monkeypatch.setenv("OPRUNTIME_DEVICE", "cuda:0,cpu")
    opr.reload()
    try:
        with pytest.warns(FallbackWarning, match="falling back to 'cpu'.*Plugins not loaded here: cupy \\(blocked"):
            out = opr.softmax(np.ones(3, np.float32))
        assert out.device.name == "cpu"
    finally:
        monkeypatch.delenv("OPRUNTIME_PLUGINS")
        monkeypatch.delenv("OPRUNTIME_DEVICE")
        opr.reload()
