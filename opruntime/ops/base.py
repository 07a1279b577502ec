"""What every operator shares: dtype rules, placement, and the per-call path.

An operator module defines an :class:`Operator` subclass with ``normalize`` (validation and
shape / dtype inference) and ``reference`` (the float64 result tests compare against). The call
path is the same for all: place the operands on one device, look the exact call up in the plan
cache, and on a miss validate, build the :class:`~opruntime.kernels.Problem` and let the
selector rank kernels (``opruntime.selector``).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import selector
from ..config import resolve_device, settings
from ..devices import Device
from ..errors import DeviceMismatchError, DtypeError
from ..kernels import Attrs, Problem, c_strides
from ..plugins import registry
from ..tensor import Tensor, signature_id

#: Computation dtypes, narrow to wide. Mixed operands promote to the widest; float16 with
#: bfloat16 promotes to float32 (neither holds the other). Integer and bool arrays are rejected;
#: Python lists and scalars of integers become float32.
FLOAT_ORDER = ("float16", "bfloat16", "float32", "float64")


_plans_get = selector.plans.get  # the plan cache is one dict for the process (cleared, never replaced)


def result_dtype(op: str, dtypes: Sequence[np.dtype]) -> str:
    """The dtype the operator computes in and returns, by the rule above."""
    names = []
    for dt in dtypes:
        name = np.dtype(dt).name
        if name not in FLOAT_ORDER:
            raise DtypeError(
                f"{op}: dtype {name} is not supported; operators compute in {', '.join(FLOAT_ORDER)}. "
                f"Convert first, e.g. x.astype(np.float32) or opr.tensor(x, dtype='float32')"
            )
        names.append(name)
    if not names:
        return "float32"
    if {"float16", "bfloat16"} <= set(names):
        names.append("float32")
    return max(names, key=FLOAT_ORDER.index)


@dataclass
class Normalized:
    """What ``Operator.normalize`` returns: the kernel's view of one call."""

    shapes: tuple[tuple[int, ...], ...]  # operand shapes the kernel sees (views of the inputs)
    attrs: Attrs
    out_shape: tuple[int, ...]  # the kernel's output shape
    result_shape: tuple[int, ...]  # the shape the user gets (a view of the kernel output)
    trivial: str | None = None  # "empty" (nothing to compute) or "zeros" (an empty reduction)


class Operator(abc.ABC):
    """Base of the operators. Subclasses set ``name``, ``operands`` and implement
    ``normalize`` and ``reference``; ``flops`` and ``bytes`` feed the cost models and the bench."""

    name: str = ""
    operands: tuple[str, ...] = ()  # names for messages: ("a", "b")
    required: int | None = None  # operands that must be given (default: all of them)

    @abc.abstractmethod
    def normalize(self, shapes: Sequence[tuple[int, ...]], attrs: dict[str, Any]) -> Normalized:
        """Validate shapes and attributes, raising typed errors; infer the result."""

    @abc.abstractmethod
    def reference(self, *arrays: np.ndarray, **attrs: Any) -> np.ndarray:
        """The float64 result, computed plainly with NumPy."""

    def flops(self, problem: Any) -> float:
        return 0.0

    def bytes(self, problem: Any) -> float:
        from ..kernels import itemsize

        n = sum(math.prod(s) for s in problem.shapes) + math.prod(problem.out_shape)
        return float(n * itemsize(problem.out_dtype))

    # -- the call path ----------------------------------------------------------------------
    def __call__(self, *inputs: Any, device: Any = None, **attrs: Any) -> Tensor:
        return self.call(inputs, device, tuple(attrs.items()))

    def call(self, inputs: tuple[Any, ...], device: Any, attrs: tuple[tuple[str, Any], ...]) -> Tensor:
        """Run the operator on ``inputs`` with attributes ``attrs`` (name, value pairs).

        The hot path (no ``device=``, every operand a Tensor or a NumPy array, a plan cached) builds
        the key from each Tensor's kept signature id and calls the plan; anything else places the
        operands, validates and plans (once per distinct call)."""
        s = settings()
        fast_key = None
        if device is None:
            n = len(inputs)  # one or two Tensors with kept keys: the key tuple built at once
            if n == 1 or n == 2:
                a = inputs[0]
                b = inputs[n - 1]
                if a.__class__ is Tensor and b.__class__ is Tensor and (ka := a._key) is not None \
                        and (kb := b._key) is not None:
                    try:
                        plan = _plans_get((self.name, s, attrs, ka) if n == 1 else (self.name, s, attrs, ka, kb))
                    except TypeError:  # an unhashable attribute: the path below says how to go on
                        plan = None
                    if plan is not None:
                        return plan([a._data] if n == 1 else [a._data, b._data])
            key: list[Any] = [self.name, s, attrs]
            datas = []
            for x in inputs:
                cls = x.__class__
                if cls is Tensor:
                    k = x._key
                    key.append(k if k is not None else x._signature())
                    datas.append(x._data)
                elif cls is np.ndarray:
                    key.append((None, x.shape, x.dtype, x.strides))  # host data: placed by the plan
                    datas.append(x)
                else:
                    break
            else:
                try:
                    plan = _plans_get(key := tuple(key))
                except TypeError:
                    plan = key = None
                if plan is not None:
                    return plan(datas)
                fast_key = key
        adict = dict(attrs)
        datas, dev = place(self.name, self.operands, inputs, device, s)
        key = self.key(s, dev, datas, adict)
        try:
            plan = selector.plans.get(key)
        except TypeError:  # an unhashable attribute (a list): validate and normalise every time
            return self.plan(datas, dev, adict, s)(datas)
        if plan is None:
            plan = selector.plans[key] = self.plan(datas, dev, adict, s)
        if fast_key is not None and fast_key != key:  # host operands: remember how they are placed
            selector.plans[fast_key] = plan.placing(tuple(x.__class__ is np.ndarray for x in inputs))
        return plan(datas)

    def key(self, s: Any, dev: Device, datas: list[Any], attrs: dict[str, Any]) -> tuple:
        """The plan-cache key of a call on device arrays (hashing it raises TypeError for
        unhashable attributes); the same key as the hot path builds from Tensors."""
        key = [self.name, s, tuple(attrs.items())]
        for d in datas:
            key.append(signature_id(dev.name, d))
        return tuple(key)

    def problem(self, datas: list[Any], dev: Device, attrs: dict[str, Any]) -> tuple[Problem, Normalized, tuple[bool, ...]]:
        """Validate a call and build its Problem (with the normalisation and the casts it needs)."""
        shapes = [tuple(d.shape) for d in datas]
        dtype = result_dtype(self.name, [d.dtype for d in datas])
        norm = self.normalize(shapes, dict(attrs))
        strides = []
        for d, shape in zip(datas, norm.shapes):
            st = getattr(d, "strides", None)
            if st is not None and tuple(d.shape) != shape:  # the kernel gets d.reshape(shape): its strides
                st = d.reshape(shape).strides  # (a view keeps a strided operand's steps; a copy is C order)
            strides.append(None if st is None else tuple(x // d.dtype.itemsize for x in st))
        problem = Problem(self.name, dev.name, norm.shapes, (dtype,) * len(datas), tuple(strides), norm.attrs,
                          norm.out_shape, dtype)
        casts = tuple(np.dtype(d.dtype).name != dtype for d in datas)
        return problem, norm, casts

    def problem_for(self, device: str, shapes: Sequence[Sequence[int]], dtype: str, **attrs: Any) -> Problem:
        """The Problem the frontend builds for C-contiguous operands of ``shapes`` in ``dtype`` on
        ``device`` (a name): for tests, benchmarks and tools that have shapes, not arrays."""
        norm = self.normalize([tuple(s) for s in shapes], dict(attrs))
        return Problem(self.name, device, norm.shapes, (dtype,) * len(shapes), tuple(c_strides(s) for s in norm.shapes),
                       norm.attrs, norm.out_shape, dtype)

    def plan(self, datas: list[Any], dev: Device, attrs: dict[str, Any], s: Any) -> selector.Plan:
        """Validate the call and ask the selector for a plan (the slow path of a call)."""
        problem, norm, casts = self.problem(datas, dev, attrs)
        return selector.make_plan(self, problem, dev, s, norm, casts, tuple(tuple(d.shape) for d in datas))


def place(op: str, names: Sequence[str], inputs: Sequence[Any], wanted: Any, s: Any) -> tuple[list[Any], Device]:
    """Put every operand on one device: the Tensors' device, else the configured one.

    Host data (NumPy arrays, lists, scalars) joins the Tensors' device; Tensors on two devices,
    or a ``device=`` that differs from the Tensors', raise :class:`DeviceMismatchError`.
    """
    dev = None
    on_device = True  # every operand a Tensor: the common fast path
    for x in inputs:
        if x.__class__ is Tensor:
            d = x.device
            if dev is None:
                dev = d
            elif d is not dev and d.name != dev.name:
                _mismatch(op, names, inputs)
        else:
            on_device = False
    if on_device and wanted is None and dev is not None:
        return [x.data for x in inputs], dev
    if dev is None:
        for x in inputs:
            if x is not None and not isinstance(x, (np.ndarray, list, tuple, int, float)):
                owner = registry().device_of(x)
                if owner is not None:
                    if dev is not None and owner.name != dev.name:
                        _mismatch(op, names, inputs)
                    dev = owner
    if wanted is not None:
        want = wanted if isinstance(wanted, Device) else resolve_device(s, op, wanted)
        if dev is not None and want.name != dev.name:
            raise DeviceMismatchError(
                f"{op}: device={str(wanted)!r} was asked but the operands live on {dev.name!r}; "
                f"move them first with .to({want.name!r}) (opruntime never copies between devices silently)"
            )
        dev = want
    elif dev is None:
        dev = _default_device(s, op)
    out = []
    for x in inputs:
        if x.__class__ is Tensor:
            out.append(x.data)
        elif isinstance(x, np.ndarray):
            out.append(dev.provider.from_host(_checked(op, x)))
        elif dev.provider.owns(x):
            out.append(x)
        else:
            out.append(dev.provider.from_host(_checked(op, _host(x))))
    return out, dev


def _checked(op: str, arr: np.ndarray) -> np.ndarray:
    """Reject non-float host data before it is placed: a device may convert what it cannot hold
    (JAX turns int64 into int32), and the error must name the dtype the caller passed."""
    if arr.dtype.kind != "f":
        result_dtype(op, [arr.dtype])
    return arr


def _host(x: Any) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype.kind in "biu" and not isinstance(x, np.generic):
        arr = arr.astype(np.float32)  # Python lists / scalars of ints: float32 (documented rule)
    return arr


def _default_device(s: Any, op: str) -> Device:
    key = (s, op)
    dev = selector.defaults.get(key)
    if dev is None:
        dev = selector.defaults[key] = resolve_device(s, op)
    return dev


def _mismatch(op: str, names: Sequence[str], inputs: Sequence[Any]) -> None:
    where = ", ".join(
        f"{n} on {x.device.name!r}" for n, x in zip(names, inputs) if isinstance(x, Tensor)
    )
    raise DeviceMismatchError(
        f"{op}: operands live on different devices ({where}); move them to one device with "
        f".to(...) first (opruntime never copies between devices silently)"
    )


def pair(op: str, name: str, value: Any, minimum: int) -> tuple[int, int]:
    """An int or a pair of ints, each at least ``minimum``, as a pair."""
    from ..errors import AttributeValueError

    vals = (value, value) if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else value
    try:
        a, b = vals
        ok = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= minimum for v in (a, b))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise AttributeValueError(
            f"{op}: {name} must be an int or a pair of ints, each >= {minimum}; got {value!r}"
        )
    return int(a), int(b)
