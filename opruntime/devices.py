"""Devices as the frontend sees them: the :class:`Device` handle users hold, and device names.

A backend describes each device it can run on with a
:class:`~opruntime.hookspecs.DeviceProvider` (the contract). The registry wraps each provider in a
:class:`Device`, the handle users see (``opr.Device("cuda:0")``, ``opr.devices()``) and the one a
:class:`~opruntime.kernels.Problem` carries.

Names are ``kind[:rest]``: ``"cpu"``, ``"cuda:0"``, ``"opencl:1"``, ``"jax:gpu:0"``. A bare kind
(``"cuda"``) means that kind's first device; providers may add aliases (``"opencl:gpu"``).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from .errors import DeviceUnavailableError, UnknownDeviceError

if TYPE_CHECKING:
    from .hookspecs import DeviceProvider


def host_normal(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Random normal host values for ``dtype``: float64 for float64, float16 for float16, else
    float32 (bfloat16 has no NumPy generator: convert on the device). Drawn in float32 directly,
    4x faster than drawing float64 and casting."""
    host = rng.standard_normal(shape, dtype=np.float64 if dtype == np.float64 else np.float32)
    return host.astype(np.float16) if dtype == np.float16 else host


class Device:
    """A device the runtime can place data on and run kernels on.

    ``Device("cuda:0")`` returns the one handle for that device (names as in the module doc).
    Equality and hashing go by name, so ``Device("cuda") == "cuda:0"``.
    """

    __slots__ = ("name", "kind", "provider", "__weakref__")
    #: ``lookup(name) -> Device``: set by the registry (the layer above) when it is imported
    lookup: Callable[[str], Device] | None = None

    def __new__(cls, name: str | Device) -> Device:
        if isinstance(name, Device):
            return name
        if not isinstance(name, str):
            raise UnknownDeviceError(f"a device is a name such as 'cpu' or 'cuda:0', or an opr.Device; "
                                     f"got {name!r} ({type(name).__name__})")
        return Device.lookup(name)  # type: ignore[misc]  (importing opruntime imports the registry)

    @classmethod
    def _make(cls, provider: DeviceProvider) -> Device:
        dev = object.__new__(cls)
        dev.name, dev.kind, dev.provider = provider.name, provider.kind, provider
        return dev

    def __repr__(self) -> str:
        desc = f", {self.provider.description!r}" if self.provider.description else ""
        return f"Device({self.name!r}{desc})"

    def __str__(self) -> str:
        return self.name

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Device):
            return other.name == self.name
        if isinstance(other, str):
            try:
                return Device(other).name == self.name
            except Exception:
                return False
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.name)


def resolve_name(
    name: str,
    devices: Sequence[Device],
    unavailable: dict[str, str],
) -> Device:
    """Find the device for ``name`` among ``devices``.

    Args:
        name: a device name, alias or bare kind.
        devices: the present devices, best first.
        unavailable: device kind -> reason, for kinds a backend knows but cannot run here.

    Raises:
        DeviceUnavailableError: the kind is known but not present here (with the reason).
        UnknownDeviceError: nobody knows the name; suggests the closest names.
    """
    key = name.strip().lower()
    for dev in devices:
        if dev.name == key:
            return dev
    for dev in devices:
        if key in dev.provider.aliases or key == dev.kind:
            return dev
    kind = key.split(":", 1)[0]
    present_kinds = {d.kind for d in devices}
    if kind in present_kinds:
        names = ", ".join(d.name for d in devices if d.kind == kind)
        raise DeviceUnavailableError(f"device {name!r} is not present; {kind} devices here: {names}")
    if kind in unavailable:
        raise DeviceUnavailableError(
            f"device {name!r} is not available: {unavailable[kind]}. "
            f"Devices here: {', '.join(d.name for d in devices) or 'none'}"
        )
    known = [d.name for d in devices] + [a for d in devices for a in d.provider.aliases]
    known += sorted(present_kinds | set(unavailable))
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.5)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    raise UnknownDeviceError(
        f"unknown device {name!r}.{hint} Known devices: {', '.join(known) or 'none'}"
    )
