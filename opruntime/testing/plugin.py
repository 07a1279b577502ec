"""The pytest options and fixture of the conformance suite: load with ``-p opruntime.testing.plugin``
or ``pytest_plugins = ["opruntime.testing.plugin"]`` in your top-level conftest.

``--opruntime-device NAME`` (repeatable, or comma-separated): the devices to check; default:
every device present. ``--opruntime-plugin NAME`` (repeatable): check this plugin's hooks and
kernels; default: the plugins that provide the chosen devices. ``--opruntime-configs first``:
only the heuristic's config of each kernel (default ``all``). ``--opruntime-cases quick``: three
problems per operator instead of the whole table (default ``all``). The environment variables
``OPRUNTIME_TEST_DEVICE`` / ``_PLUGIN`` / ``_CONFIGS`` / ``_CASES`` do the same when the plugin is
not loaded.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

from opruntime.plugins import registry


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("opruntime", "opruntime backend conformance")
    group.addoption("--opruntime-device", action="append", default=[], metavar="NAME",
                    help="device(s) to check, e.g. acme:0 (default: every device present)")
    group.addoption("--opruntime-plugin", action="append", default=[], metavar="NAME",
                    help="plugin(s) whose hooks and kernels to check (default: those providing the devices)")
    group.addoption("--opruntime-configs", choices=("all", "first"), default=None,
                    help="run every config of each kernel (all, the default) or the heuristic's first")
    group.addoption("--opruntime-cases", choices=("all", "quick"), default=None,
                    help="the whole problem table (all, the default) or three problems per operator")


@dataclass(frozen=True)
class Selection:
    """What to check: device names, plugin names, ``"all"`` / ``"first"`` configs, ``"all"`` / ``"quick"`` cases."""

    devices: tuple[str, ...]
    plugins: tuple[str, ...]
    configs: str
    cases: str

    @property
    def own_devices(self) -> list[str]:
        """The chosen devices that the chosen plugins provide (their memory is theirs to check)."""
        from .hooks import device_plugin

        reg = registry()
        return [d for d in self.devices if device_plugin(reg.device(d)) in self.plugins]


def _listed(config: pytest.Config, option: str, env: str) -> list[str]:
    values = config.getoption(option, default=None) or []
    if not values and os.environ.get(env):
        values = [os.environ[env]]
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


def selection(config: pytest.Config) -> Selection:
    """The selection from the command-line options, else the ``OPRUNTIME_TEST_*`` variables."""
    from .hooks import device_plugin

    reg = registry()
    devices = _listed(config, "opruntime_device", "OPRUNTIME_TEST_DEVICE")
    names = tuple(reg.device(d).name for d in devices) if devices else tuple(d.name for d in reg.devices)
    plugins = _listed(config, "opruntime_plugin", "OPRUNTIME_TEST_PLUGIN")
    if not plugins:
        plugins = list(dict.fromkeys(p for p in (device_plugin(reg.device(n)) for n in names) if p))
    configs = config.getoption("opruntime_configs", default=None) or os.environ.get("OPRUNTIME_TEST_CONFIGS", "all")
    cases = config.getoption("opruntime_cases", default=None) or os.environ.get("OPRUNTIME_TEST_CASES", "all")
    return Selection(names, tuple(plugins), configs, cases)


@pytest.fixture
def opruntime_selection(request: pytest.FixtureRequest) -> Selection:
    """The devices, plugins, configs and cases the options (or environment) chose."""
    return selection(request.config)
