"""The pytest options of the conformance suite (load with ``-p opruntime.testing.plugin``).

``--opruntime-device NAME`` (repeatable, or comma-separated): the devices to check; default:
every device present. ``--opruntime-plugin NAME`` (repeatable): check this plugin's hooks and
kernels; default: the plugins that provide the chosen devices. ``--opruntime-configs first``:
only the heuristic's config of each kernel (default ``all``). ``--opruntime-cases quick``: three
problems per operator instead of the whole table (default ``all``). The environment variables
``OPRUNTIME_TEST_DEVICE`` / ``_PLUGIN`` / ``_CONFIGS`` / ``_CASES`` do the same when the plugin is
not loaded.
"""

from __future__ import annotations

import pytest


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
