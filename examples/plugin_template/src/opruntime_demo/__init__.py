"""opruntime_demo: an example third-party opruntime backend.

It adds one new device kind, ``demo`` (device ``demo:0``: memory held in :class:`DemoArray`
buffers, kernels computed with NumPy), with kernels for every operator, and one kernel for a
device another plugin provides: a multi-threaded softmax for ``cpu`` (``demo.softmax.threaded``).

opruntime finds this module through the entry point in ``pyproject.toml`` and calls the two hooks
below. Everything else is ordinary Python.
"""

from __future__ import annotations

from opruntime import Kernel, hookimpl

from . import conv, matmul, softmax
from .memory import DemoArray, DemoDevice

__version__ = "0.1.0"
__all__ = ["DemoArray", "DemoDevice", "opruntime_devices", "opruntime_kernels"]


@hookimpl
def opruntime_devices() -> list[DemoDevice]:
    # A backend whose stack or hardware is missing raises instead:
    #     raise opruntime.errors.BackendUnavailable("libacme not found", kinds=["demo"])
    # so that users asking for "demo:0" learn why it is absent.
    return [DemoDevice(0)]


@hookimpl
def opruntime_kernels() -> list[Kernel]:
    return [*matmul.kernels(), *conv.kernels(), *softmax.kernels()]
