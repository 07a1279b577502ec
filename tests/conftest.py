"""Shared fixtures: ``device`` runs a test on every device present; skips say why.

Tests live in the layers of the code they test (``core/``, ``ops/``, ``backends/<x>/``,
``system/``); this file and ``fake_backend.py`` stay here and are importable from every layer
(``from conftest import ...``, ``from fake_backend import ...``).
"""

from __future__ import annotations

import numpy as np
import pytest

import opruntime as opr
from opruntime.plugins import registry
from opruntime.testing.numerics import TOLERANCE, rel_err  # noqa: F401  (the one definition, re-exported to tests)
from opruntime.testing.numerics import random_array as random  # noqa: F401


def _devices() -> list[str]:
    return [d.name for d in registry().devices]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "device" in metafunc.fixturenames:
        names = _devices()
        metafunc.parametrize("device", names, ids=names, indirect=True)


def pytest_report_header(config: pytest.Config) -> list[str]:
    reg = registry()
    lines = [f"opruntime devices: {', '.join(_devices()) or 'none'}"]
    for rec in reg.records.values():
        if rec.status != "ok":
            lines.append(f"opruntime plugin {rec.name}: {rec.status}: {rec.reason}")
    return lines


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # tests on a GPU device are GPU tests, whatever file they are in
        callspec = getattr(item, "callspec", None)
        dev = callspec.params.get("device") if callspec else None
        if isinstance(dev, str) and (dev.startswith("cuda") or ":gpu" in dev or ":tpu" in dev
                                     or _is_opencl_gpu(dev)):
            item.add_marker(pytest.mark.gpu)


def _is_opencl_gpu(name: str) -> bool:
    if not name.startswith("opencl"):
        return False
    provider = registry().device(name).provider
    return provider.accelerator or "opencl:gpu" in provider.aliases


@pytest.fixture
def device(request: pytest.FixtureRequest) -> opr.Device:
    return registry().device(request.param)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng()  # fresh inputs every run: the kernel must be right on any valid input


def dtypes_on(device: opr.Device, op: str) -> set[str]:
    """The dtypes some kernel of ``op`` computes on ``device``."""
    return {d for k in registry().kernels_for(op, device.kind) for d in k.dtypes}


def skip_unless_dtype(device: opr.Device, op: str, dtype: str) -> None:
    if dtype not in dtypes_on(device, op):
        pytest.skip(f"no {op} kernel computes {dtype} on {device.name}")


@pytest.fixture
def fake():
    """The fake backend registered for one test (and the registry rebuilt around it)."""
    from fake_backend import FakeBackend

    backend = FakeBackend()
    opr.register(backend, name="fake")
    yield backend
    opr.unregister("fake")


@pytest.fixture
def kernel_plugin():
    """``add(name, *kernels, devices=())`` registers a plugin named ``name`` supplying ``kernels``
    (and device providers ``devices``) for one test; unregistered after it."""
    import types

    names = []

    def add(name, *kernels, devices=()):
        hooks = {}
        if kernels:
            hooks["opruntime_kernels"] = opr.hookimpl(lambda: list(kernels))
        if devices:
            hooks["opruntime_devices"] = opr.hookimpl(lambda: list(devices))
        opr.register(types.SimpleNamespace(__name__=name, **hooks), name=name)
        names.append(name)
        return [registry().kernels[k.name] for k in kernels]

    yield add
    for n in names:
        opr.unregister(n)


@pytest.fixture(autouse=True)
def _clean_config(monkeypatch, tmp_path):
    """Each test starts from defaults: no config file, no OPRUNTIME_* variables, no configure(),
    no plugin registered at run time (one a failing test left behind is removed, so that its
    failure cannot spread to the tests after it), no open tuning-cache connection."""
    from opruntime import cache, config, plugins, selector

    for var in list(config.ENV) + ["OPRUNTIME_CONFIG"]:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OPRUNTIME_CACHE_DIR", str(tmp_path / "cache"))  # never the user's tuning cache
    monkeypatch.chdir(tmp_path)
    config._code.clear()
    config.reload()
    selector.clear_cache()
    selector._announced.clear()
    plugins._announced.clear()
    yield
    config._code.clear()
    left = [name for name, _ in plugins._extra]
    if left:
        plugins._extra.clear()
        plugins.reset()
    config.reload()
    selector.clear_cache()
    for store in cache._caches.values():
        store.close()
    cache._caches.clear()
    assert not left, f"the test left plugins registered: {left} (removed)"
