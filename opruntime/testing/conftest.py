"""Parametrisation of the conformance suite: which devices, plugins and kernels to check
(options in :mod:`opruntime.testing.plugin`, or the ``OPRUNTIME_TEST_*`` environment variables)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from opruntime.plugins import registry

from .hooks import device_plugin, plugin_kernels
from .problems import CASES, QUICK_CASES


@dataclass(frozen=True)
class Selection:
    devices: tuple[str, ...]
    plugins: tuple[str, ...]
    configs: str
    cases: str


def _listed(config: pytest.Config, option: str, env: str) -> list[str]:
    values = config.getoption(option, default=None) or []
    if not values and os.environ.get(env):
        values = [os.environ[env]]
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


def selection(config: pytest.Config) -> Selection:
    reg = registry()
    devices = _listed(config, "opruntime_device", "OPRUNTIME_TEST_DEVICE")
    names = tuple(reg.device(d).name for d in devices) if devices else tuple(d.name for d in reg.devices)
    plugins = _listed(config, "opruntime_plugin", "OPRUNTIME_TEST_PLUGIN")
    if not plugins:
        plugins = list(dict.fromkeys(p for p in (device_plugin(reg.device(n)) for n in names) if p))
    configs = config.getoption("opruntime_configs", default=None) or os.environ.get("OPRUNTIME_TEST_CONFIGS", "all")
    cases = config.getoption("opruntime_cases", default=None) or os.environ.get("OPRUNTIME_TEST_CASES", "all")
    return Selection(names, tuple(plugins), configs, cases)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    sel = selection(metafunc.config)
    reg = registry()
    names = set(metafunc.fixturenames)
    if "kernel_case" in names:
        params, ids = [], []
        for dev in sel.devices:
            kind = reg.device(dev).kind
            for plugin in sel.plugins:
                for k in plugin_kernels(plugin):
                    if k.device_kind != kind:
                        continue
                    table = QUICK_CASES if sel.cases == "quick" else CASES
                    for case in table[k.op] if metafunc.function.__name__ != "test_pinned" else [None]:
                        params.append((dev, k.name, case))
                        ids.append(f"{dev}-{k.name}" + (f"-{case.id}" if case else ""))
        metafunc.parametrize("kernel_case", params, ids=ids)
    elif "plugin_name" in names:
        metafunc.parametrize("plugin_name", sel.plugins)
    elif "device_name" in names:  # memory and frontend checks: the devices the checked plugins provide
        own = [d for d in sel.devices if device_plugin(reg.device(d)) in sel.plugins]
        metafunc.parametrize("device_name", own)


@pytest.fixture
def configs(request: pytest.FixtureRequest) -> str:
    return selection(request.config).configs


@pytest.fixture
def pinned_cases(request: pytest.FixtureRequest) -> dict:
    return QUICK_CASES if selection(request.config).cases == "quick" else CASES
