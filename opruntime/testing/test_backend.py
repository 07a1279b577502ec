"""The conformance tests a backend runs against its plugin (see ``docs/conformance.md``)."""

from __future__ import annotations

import numpy as np
import pytest

from opruntime.ops import OPS
from opruntime.plugins import registry

from .findings import failures, summary
from .hooks import check_hooks, check_lazy_import
from .kernels import check_frontend_edges, check_kernel, check_pinned
from .memory import check_memory


def _assert_clean(findings) -> None:
    bad = failures(findings)
    if findings:
        print(summary(findings))
    assert not bad, f"{len(bad)} conformance failure(s):\n{summary(bad)}"


def test_hooks(plugin_name):
    """The plugin loaded, its hookimpls match the hookspecs and return well-formed records."""
    _assert_clean(check_hooks(plugin_name))


def test_import_loads_no_device_stack(plugin_name):
    rec = registry().records.get(plugin_name)
    if rec is None or not rec.module or rec.module not in __import__("sys").modules:
        pytest.skip(f"plugin {plugin_name!r} is not an importable module")
    _assert_clean(check_lazy_import(rec.module))


def test_memory(device_name):
    """Every supported dtype and shape (size 0 included) round-trips; allocation, casts, DLPack, timer."""
    _assert_clean(check_memory(registry().device(device_name)))


@pytest.mark.parametrize("op", list(OPS))
def test_size_zero_results(device_name, op):
    _assert_clean(check_frontend_edges(registry().device(device_name), op))


def test_kernel(kernel_case, configs):
    """One kernel on one generated problem: every dtype it declares, every config."""
    dev, name, case = kernel_case
    reg = registry()
    findings = check_kernel(reg.kernels[name], reg.device(dev), [case], configs=configs,
                            rng=np.random.default_rng())
    _assert_clean([f for f in findings if f.failed or "supports none" not in f.message])


def test_pinned(kernel_case, pinned_cases):
    """Pinned in configuration, the kernel is the one the frontend runs, and its results are right."""
    dev, name, _ = kernel_case
    reg = registry()
    kernel = reg.kernels[name]
    _assert_clean(check_pinned(kernel, reg.device(dev), pinned_cases[kernel.op]))
