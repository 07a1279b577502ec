"""Devices: the memory contract a backend implements, and device names.

A backend describes each device it can run on with a :class:`DeviceProvider` (memory in and out,
allocation, DLPack, synchronisation, a timer, a fingerprint). The frontend wraps each provider in
a :class:`Device`, the handle users see: ``opr.Device("cuda:0")``, ``opr.devices()``.

Names are ``kind[:rest]``: ``"cpu"``, ``"cuda:0"``, ``"opencl:1"``, ``"jax:gpu:0"``. A bare kind
(``"cuda"``) means that kind's first device; providers may add aliases (``"opencl:gpu"``).
"""

from __future__ import annotations

import abc
import difflib
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .errors import DeviceUnavailableError, UnknownDeviceError


def host_normal(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Random normal host values for ``dtype``: float64 for float64, float16 for float16, else
    float32 (bfloat16 has no NumPy generator: convert on the device). Drawn in float32 directly,
    4x faster than drawing float64 and casting."""
    host = rng.standard_normal(shape, dtype=np.float64 if dtype == np.float64 else np.float32)
    return host.astype(np.float16) if dtype == np.float16 else host


class DeviceProvider(abc.ABC):
    """What a backend implements for one device. Subclass it and override what differs.

    Class attributes a provider sets:
        kind: the device kind, the part of the name before the first colon (``"cuda"``).
        name: the device's full name (``"cuda:0"``); unique across all backends.
        description: a human-readable model name (``"NVIDIA H100 80GB HBM3"``).
        priority: default-device order, highest first. Built-ins use cuda 100, jax:tpu 90,
            jax:gpu 80, opencl gpu 70, cpu 50, opencl cpu 20, jax:cpu 10.
        aliases: extra names that select this device (``("opencl:gpu",)``); the first device
            claiming an alias wins.
        array_types: native array classes whose instances may live on this device; used to
            adopt arrays passed to an operator without an ``opr.Tensor`` wrapper.
        placement_free: True when ``from_host`` returns a NumPy array unchanged (the ``cpu``
            device), so calls with NumPy operands skip placement.

    Native data ("data" below) is whatever array type the backend computes on (a NumPy array,
    a CuPy array, a ``pyopencl.array.Array``, a ``jax.Array``). It must have ``shape`` and
    ``dtype`` (a NumPy dtype); ``strides`` in bytes where the type has them.
    """

    kind: str = ""
    name: str = ""
    description: str = ""
    priority: int = 0
    aliases: tuple[str, ...] = ()
    array_types: tuple[type, ...] = ()
    #: True when ``from_host`` returns NumPy arrays unchanged (host memory is device memory)
    placement_free: bool = False

    # -- memory ---------------------------------------------------------------------------
    @abc.abstractmethod
    def from_host(self, array: np.ndarray) -> Any:
        """Copy a host array to the device; may return ``array`` itself on a host device."""

    @abc.abstractmethod
    def to_host(self, data: Any) -> np.ndarray:
        """Copy device data to a host NumPy array (blocking)."""

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        """Allocate uninitialised device data. Raise ``OutOfMemoryError`` when it cannot."""
        return self.from_host(np.empty(shape, dtype))

    def zeros(self, shape: tuple[int, ...], dtype: np.dtype) -> Any:
        """Allocate zero-filled device data."""
        return self.from_host(np.zeros(shape, dtype))

    def astype(self, data: Any, dtype: np.dtype) -> Any:
        """Convert device data to ``dtype`` on the device."""
        return data.astype(dtype)

    def owns(self, data: Any) -> bool:
        """True when ``data`` is a native array living on this device."""
        return isinstance(data, self.array_types)

    def random_normal(self, shape: tuple[int, ...], dtype: np.dtype, seed: int) -> Any:
        """Random normal device data of ``dtype`` (operands for tuning: never zeros, any values).

        The default draws float32 on the host (float64 for float64) and copies; a backend with a
        device generator overrides it: drawing two 4096x4096 operands on the host costs the
        autotuner a tenth of a second."""
        data = self.from_host(host_normal(np.random.default_rng(seed), shape, dtype))
        return data if data.dtype == dtype else self.astype(data, dtype)  # bfloat16: on the device

    # -- DLPack ---------------------------------------------------------------------------
    def from_dlpack(self, obj: Any) -> Any:
        """Import any ``__dlpack__`` object onto this device (default: through the host)."""
        return self.from_host(np.from_dlpack(obj))

    def to_dlpack(self, data: Any, **kwargs: Any) -> Any:
        """Export device data as a DLPack capsule (the ``__dlpack__`` protocol)."""
        return data.__dlpack__(**kwargs)

    def dlpack_device(self, data: Any) -> tuple[int, int]:
        """The ``(device_type, device_id)`` pair of the ``__dlpack_device__`` protocol."""
        return data.__dlpack_device__()

    # -- execution ------------------------------------------------------------------------
    def synchronize(self) -> None:  # noqa: B027 (a no-op default: synchronous devices keep it)
        """Block until all work queued on the device has finished."""

    def wait(self, data: Any) -> None:
        """Block until ``data`` (a result of this device) is computed. The default synchronizes
        the device; a backend whose arrays can be waited on one by one (JAX) overrides it."""
        self.synchronize()

    def time(self, fn: Callable[[], Any], *, repeats: int = 20, warmup: int = 3) -> list[float]:
        """Run ``fn`` ``warmup`` times untimed, then ``repeats`` times; seconds per run.

        The default times with the host clock around ``synchronize()``; GPU backends override
        it with device events so that launch gaps are not counted.
        """
        for _ in range(warmup):
            fn()
        self.synchronize()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            self.synchronize()
            times.append(time.perf_counter() - t0)
        return times

    def fingerprint(self) -> dict[str, str]:
        """What identifies this device for the tuning cache: model, driver, runtime versions."""
        return {"name": self.name, "description": self.description}

    def info(self) -> dict[str, str]:
        """Extra facts for ``opruntime info`` (memory, compute capability, extensions...)."""
        return {}


class Device:
    """A device the runtime can place data on and run kernels on.

    ``Device("cuda:0")`` returns the one handle for that device (names as in the module doc).
    Equality and hashing go by name, so ``Device("cuda") == "cuda:0"``.
    """

    __slots__ = ("name", "kind", "provider", "__weakref__")

    def __new__(cls, name: str | Device) -> Device:
        if isinstance(name, Device):
            return name
        from .plugins import registry

        return registry().device(name)

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
