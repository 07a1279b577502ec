"""Parametrisation of the conformance suite: which devices, plugins and kernels to check
(options in :mod:`opruntime.testing.plugin`, or the ``OPRUNTIME_TEST_*`` environment variables)."""

from __future__ import annotations

import pytest

from opruntime.plugins import registry

from .hooks import plugin_kernels
from .plugin import selection
from .problems import CASES, QUICK_CASES


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
        metafunc.parametrize("device_name", sel.own_devices)


@pytest.fixture
def configs(request: pytest.FixtureRequest) -> str:
    return selection(request.config).configs


@pytest.fixture
def pinned_cases(request: pytest.FixtureRequest) -> dict:
    return QUICK_CASES if selection(request.config).cases == "quick" else CASES
