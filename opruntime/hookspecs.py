"""The plugin contract: every hook an opruntime backend may implement.

A backend is any importable object (usually a module) whose functions are marked with
``opruntime.hookimpl`` and named like the hooks below. It is registered through the
entry-point group ``opruntime.backends`` in its package's ``pyproject.toml``::

    [project.entry-points."opruntime.backends"]
    acme = "opruntime_acme"

The runtime calls each plugin's hooks separately, so a plugin that fails to import, names a
hook that does not exist (``pm.check_pending()``), or raises from a hook is reported by name
(``opruntime info`` and a ``FallbackWarning``) while the others keep working. Configuration can
block a plugin by name (``OPRUNTIME_PLUGINS="-opencl"`` or ``plugins = ["-opencl"]``).

Import your device stack (cupy, pyopencl, jax, ...) inside the hooks, never at module import:
``import opruntime`` must stay free of GPU stacks, and the registry is only built on first use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from .devices import DeviceProvider
    from .kernels import Kernel

hookspec = pluggy.HookspecMarker("opruntime")
hookimpl = pluggy.HookimplMarker("opruntime")


@hookspec
def opruntime_devices() -> Sequence[DeviceProvider]:
    """Return the devices this backend can run on, best first.

    Each is a :class:`opruntime.devices.DeviceProvider` subclass instance with a unique
    ``name`` (``"cuda:0"``); it owns the memory of that device (host copies, allocation,
    DLPack, synchronisation, a timer and a fingerprint).

    When the backend's stack or hardware is missing, raise
    :class:`opruntime.errors.BackendUnavailable` with the reason and the device kinds it would
    have provided (``BackendUnavailable("pyopencl not installed", kinds=["opencl"])``): users
    then get "device 'opencl:0' is not available: pyopencl not installed" instead of
    "unknown device". Return ``[]`` for a backend that only adds kernels.

    Called once per process, when the registry is first built.
    """


@hookspec
def opruntime_kernels() -> Sequence[Kernel]:
    """Return the :class:`opruntime.kernels.Kernel` records this backend supplies.

    Kernels may target any device kind, including kinds another plugin provides: a plugin
    may add a single faster ``softmax`` for ``"cuda"``. Kernel names must be unique across
    all plugins (``backend.op.variant``). Kernels for device kinds with no present device are
    kept but never selected.

    Building the record must be cheap: compile device code lazily on the first ``run``.
    Called once per process, after ``opruntime_devices``.
    """
