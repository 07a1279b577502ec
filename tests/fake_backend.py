"""A fake in-memory backend for testing the registry, selector and configuration without hardware.

Devices ``fake:0`` and ``fake:1`` hold :class:`FakeArray` (a NumPy array in a wrapper, so that
ownership is checkable). Its matmul kernels are controllable: cost, supported shapes, a delay, and
failure on demand; every call is counted.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import opruntime as opr
from opruntime import DeviceProvider, Kernel, hookimpl


class FakeArray:
    def __init__(self, a: np.ndarray, device: str) -> None:
        self.a, self.device = a, device

    shape = property(lambda self: self.a.shape)
    dtype = property(lambda self: self.a.dtype)
    strides = property(lambda self: self.a.strides)

    def reshape(self, *shape: Any) -> FakeArray:
        return FakeArray(self.a.reshape(*shape), self.device)

    def astype(self, dtype: Any) -> FakeArray:
        return FakeArray(self.a.astype(dtype), self.device)

    @property
    def T(self) -> FakeArray:  # noqa: N802
        return FakeArray(self.a.T, self.device)


class FakeDevice(DeviceProvider):
    kind = "fake"
    priority = -10  # never the default

    def __init__(self, index: int) -> None:
        self.name = f"fake:{index}"
        self.description = f"Fake device {index}"
        self.aliases = ("fake:gpu",) if index == 1 else ()

    def from_host(self, array: np.ndarray) -> FakeArray:
        return FakeArray(np.array(array), self.name)

    def to_host(self, data: FakeArray) -> np.ndarray:
        return np.array(data.a)

    def owns(self, data: Any) -> bool:
        return isinstance(data, FakeArray) and data.device == self.name

    def dlpack_device(self, data: FakeArray) -> tuple[int, int]:
        return (1, 0)

    def to_dlpack(self, data: FakeArray, **kwargs: Any) -> Any:
        return data.a.__dlpack__(**kwargs)


@dataclass
class Knob:
    """How one fake kernel behaves; tests change these between calls."""

    cost: float = 1.0
    fail: Exception | None = None
    delay: float = 0.0
    supports: bool = True
    vendor: bool = False
    source: str = "v1"


@dataclass
class FakeBackend:
    """The plugin object. ``knobs[name]`` controls kernel ``fake.matmul.<name>``."""

    names: tuple[str, ...] = ("a", "b", "c")
    knobs: dict[str, Knob] = field(default_factory=dict)
    calls: Counter = field(default_factory=Counter)
    __name__: str = "fake"

    def __post_init__(self) -> None:
        for n in self.names:
            self.knobs.setdefault(n, Knob(cost=float(self.names.index(n) + 1)))

    @hookimpl
    def opruntime_devices(self) -> list[FakeDevice]:
        return [FakeDevice(0), FakeDevice(1)]

    @hookimpl
    def opruntime_kernels(self) -> list[Kernel]:
        return [self._kernel(n) for n in self.names] + [
            Kernel("softmax", "fake.softmax.plain", "fake", opr.FLOATS, self._softmax),
        ]

    def _kernel(self, n: str) -> Kernel:
        knob = self.knobs[n]

        def run(problem: opr.Problem, config: Any, a: FakeArray, b: FakeArray) -> FakeArray:
            self.calls[f"run:{n}"] += 1
            if knob.fail is not None:
                raise knob.fail
            if knob.delay:
                time.sleep(knob.delay)
            return FakeArray(np.matmul(a.a, b.a), a.device)

        def supports(problem: opr.Problem) -> bool:
            self.calls[f"supports:{n}"] += 1
            return knob.supports

        def cost(problem: opr.Problem, config: Any) -> float:
            self.calls[f"cost:{n}"] += 1
            return knob.cost

        return Kernel("matmul", f"fake.matmul.{n}", "fake", frozenset({"float32", "float64"}), run,
                      supports=supports, cost=cost, vendor=knob.vendor, source=knob.source)

    def _softmax(self, problem: opr.Problem, config: Any, x: FakeArray) -> FakeArray:
        from opruntime.ops import OPS

        return FakeArray(OPS["softmax"].reference(x.a, **problem.attrs).astype(x.dtype), x.device)
