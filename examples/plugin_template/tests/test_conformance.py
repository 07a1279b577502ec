"""opruntime's conformance suite on this plugin: the hooks, the demo device's memory, and every
kernel of the plugin (the demo device's and the one for ``cpu``) on the generated problem table
(odd sizes, size-1 dims, strided views, every conv2d attribute), called directly in every config
and through the frontend with the kernel pinned.

The same from the command line: ``python -m opruntime.testing --device demo:0 --plugin demo``.
"""

from __future__ import annotations

import pytest

testing = pytest.importorskip("opruntime.testing", reason="this opruntime has no conformance suite (opruntime.testing)")

from opruntime.ops import OPS  # noqa: E402
from opruntime.plugins import registry  # noqa: E402

PLUGIN = "demo"


def assert_clean(findings: list) -> None:
    bad = testing.failures(findings)
    assert not bad, f"{len(bad)} conformance failure(s):\n{testing.summary(bad)}"


def kernels() -> list[str]:
    return sorted(k.name for k in testing.plugin_kernels(PLUGIN))


def device_for(kernel_name: str):  # noqa: ANN201
    kind = registry().kernels[kernel_name].device_kind
    return next(d for d in registry().devices if d.kind == kind)


def test_hooks() -> None:
    assert_clean(testing.check_hooks(PLUGIN))


def test_memory() -> None:
    assert_clean(testing.check_memory(registry().device("demo:0")))


@pytest.mark.parametrize("op", list(OPS))
def test_size_zero_results(op: str) -> None:
    assert_clean(testing.check_frontend_edges(registry().device("demo:0"), op))


@pytest.mark.parametrize("name", kernels())
def test_kernel(name: str) -> None:
    assert_clean(testing.check_kernel(registry().kernels[name], device_for(name)))


@pytest.mark.parametrize("name", kernels())
def test_pinned(name: str) -> None:
    assert_clean(testing.check_pinned(registry().kernels[name], device_for(name)))
