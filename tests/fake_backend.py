"""A fake in-memory backend for testing the registry, selector and configuration without hardware.

Devices ``fake:0`` and ``fake:1`` hold :class:`FakeArray` (a NumPy array in a wrapper, so that
ownership is checkable). Its matmul kernels are controllable: cost, supported shapes, a delay,
failure on demand and a wrong result on demand; every call is counted. Kernels are named in the
plugin's namespace, ``<plugin>.matmul.<name>`` (``FakeBackend(plugin="flaky")`` registers
``flaky.matmul.a`` ...), as the registry requires.
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

    def astype(self, dtype: Any, order: str = "K") -> FakeArray:
        return FakeArray(self.a.astype(dtype, order=order), self.device)

    def copy(self) -> FakeArray:
        return FakeArray(self.a.copy(), self.device)

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

    def shares_memory(self, a: Any, b: Any) -> bool:
        return a is b or np.may_share_memory(a.a, b.a)

    def dlpack_device(self, data: FakeArray) -> tuple[int, int]:
        return (1, 0)

    def to_dlpack(self, data: FakeArray, **kwargs: Any) -> Any:
        return data.a.__dlpack__(**kwargs)


#: what a kernel with ``Knob.result`` set returns instead of the right answer
WRONG_RESULTS = ("shape", "dtype", "input", "view")


@dataclass
class Knob:
    """How one fake kernel behaves; tests change these between calls (threads see a change at
    their next call).

    ``result``: ``"ok"``, or one of :data:`WRONG_RESULTS`: a result of the wrong shape, of the
    wrong dtype, the first operand itself, or a view of it.
    """

    cost: float = 1.0
    fail: Exception | None = None
    delay: float = 0.0
    supports: bool = True
    vendor: bool = False
    source: str = "v1"
    result: str = "ok"


@dataclass
class FakeBackend:
    """The plugin object. ``knobs[name]`` controls kernel ``<plugin>.matmul.<name>``."""

    names: tuple[str, ...] = ("a", "b", "c")
    knobs: dict[str, Knob] = field(default_factory=dict)
    calls: Counter = field(default_factory=Counter)
    plugin: str = "fake"

    def __post_init__(self) -> None:
        self.__name__ = self.plugin  # the name opr.register() takes by default
        for n in self.names:
            self.knobs.setdefault(n, Knob(cost=float(self.names.index(n) + 1)))

    @hookimpl
    def opruntime_devices(self) -> list[FakeDevice]:
        return [FakeDevice(0), FakeDevice(1)]

    @hookimpl
    def opruntime_kernels(self) -> list[Kernel]:
        return [self._kernel(n) for n in self.names] + [
            Kernel("softmax", f"{self.plugin}.softmax.plain", "fake", opr.FLOATS, self._softmax),
        ]

    def _kernel(self, n: str) -> Kernel:
        knob = self.knobs[n]

        def run(problem: opr.Problem, config: Any, a: FakeArray, b: FakeArray) -> FakeArray:
            self.calls[f"run:{n}"] += 1
            if knob.fail is not None:
                raise knob.fail
            if knob.delay:
                time.sleep(knob.delay)
            if knob.result != "ok":
                return wrong_result(knob.result, problem, a)
            return FakeArray(np.matmul(a.a, b.a), a.device)

        def supports(problem: opr.Problem) -> bool:
            self.calls[f"supports:{n}"] += 1
            return knob.supports

        def cost(problem: opr.Problem, config: Any) -> float:
            self.calls[f"cost:{n}"] += 1
            return knob.cost

        return Kernel("matmul", f"{self.plugin}.matmul.{n}", "fake", frozenset({"float32", "float64"}), run,
                      supports=supports, cost=cost, vendor=knob.vendor, source=knob.source)

    def _softmax(self, problem: opr.Problem, config: Any, x: FakeArray) -> FakeArray:
        from opruntime.ops import OPS

        return FakeArray(OPS["softmax"].reference(x.a, **problem.attrs).astype(x.dtype), x.device)


def wrong_result(how: str, problem: opr.Problem, a: Any) -> Any:
    """A result that breaks the kernel contract in one way (:data:`WRONG_RESULTS`), for a
    FakeArray or a NumPy operand ``a``."""
    wrap = (lambda x: FakeArray(x, a.device)) if isinstance(a, FakeArray) else (lambda x: x)
    host = a.a if isinstance(a, FakeArray) else a
    if how == "shape":
        return wrap(np.zeros((*problem.out_shape, 2), host.dtype))
    if how == "dtype":
        return wrap(np.zeros(problem.out_shape, np.float16 if host.dtype != np.float16 else np.float32))
    if how == "input":
        return a
    if how == "view":  # a view of the operand with the result's shape and dtype
        return wrap(np.lib.stride_tricks.as_strided(host, problem.out_shape, (0,) * len(problem.out_shape)))
    raise ValueError(f"unknown wrong result {how!r}")
