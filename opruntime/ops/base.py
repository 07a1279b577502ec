"""What every operator shares: the :class:`Operator` unit, dtype rules, placement, and the call path.

An operator is one file in ``opruntime/ops/``: an :class:`Operator` subclass (validation and shape
/ dtype inference in ``normalize``, the float64 ``reference``, ``flops`` / ``bytes`` and whether
it is memory- or compute-bound, trivial results, the conformance ``cases``, the ``bench`` shapes
and how each ``peers`` library computes it) and its public function, made from the operator by
:meth:`Operator.function`. ``opruntime.ops`` finds the files itself; nothing else in the frontend
names an operator.

The call path is the same for all: place the operands on one device, look the exact call up in
the plan cache (its key holds each attribute's value *and type*, so a key is found only for a call
that validates as the one that made it), and on a miss validate, build the
:class:`~opruntime.kernels.Problem` and let the selector rank kernels (``opruntime.selector``).
"""

from __future__ import annotations

import abc
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .. import selector
from ..config import placement, settings
from ..devices import Device
from ..errors import AttributeValueError, DeviceMismatchError, DtypeError
from ..kernels import Attrs, Problem, c_strides, itemsize
from ..plugins import resolve_device
from ..tensor import NATIVE, Tensor, adopt, host_array, signature_id

#: Computation dtypes, narrow to wide. Mixed operands promote to the widest; float16 with
#: bfloat16 promotes to float32 (neither holds the other). Integer and bool arrays are rejected;
#: Python lists and scalars of integers become float32.
FLOAT_ORDER = ("float16", "bfloat16", "float32", "float64")


#: The activations an epilogue (``linear``'s, ``conv2d``'s, ``add``'s... ``activation=``) or an elementwise
#: operator applies, as float64 references. Backends map the same names to their code
#: (``epilogue.cuh`` / ``epilogue.cl`` / ``epilogue.py`` of each backend). Both GELUs are written
#: without cancellation for negative x: ``1 + erf(t)`` as ``erfc(-t)``, ``0.5 (1 + tanh(u))`` as
#: ``1 / (1 + exp(-2u))`` (the same functions; at x = -5 the textbook forms lose all digits of a
#: float32 result but one and 6 of a float64 one).
ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "relu": lambda x: np.where(np.isnan(x), x, np.maximum(x, 0.0)),
    "gelu": lambda x: 0.5 * x * _erfc(-x / math.sqrt(2.0)),
    "gelu_tanh": lambda x: x / (1.0 + np.exp(-2.0 * math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3))),
    "silu": lambda x: x / (1.0 + np.exp(-x)),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "tanh": np.tanh,
}
#: The activations ``activation=`` takes (the others are operators of their own).
EPILOGUES = ("relu", "gelu", "gelu_tanh", "silu")


def _erfc(x: np.ndarray) -> np.ndarray:
    from scipy.special import erfc

    return erfc(x)


def activation_attr(op: str, value: Any) -> str | None:
    """Validate an ``activation=`` attribute: None or one of :data:`EPILOGUES`."""
    if value is None or (isinstance(value, str) and value in EPILOGUES):
        return value
    raise AttributeValueError(f"{op}: activation must be None or one of {', '.join(map(repr, EPILOGUES))}; "
                              f"got {value!r}")


def torch_activation(torch: Any, name: str | None, y: Any) -> Any:
    """A peer's activation after its arithmetic, as a torch user writes it: ``F.relu(y)``."""
    if name is None:
        return y
    f = torch.nn.functional
    return f.gelu(y, approximate="tanh") if name == "gelu_tanh" else getattr(f, name)(y)


def jax_activation(jax: Any, name: str | None, y: Any) -> Any:
    """A JAX peer's activation inside its jitted function (XLA fuses it with the arithmetic)."""
    if name is None:
        return y
    if name in ("gelu", "gelu_tanh"):
        return jax.nn.gelu(y, approximate=name == "gelu_tanh")
    return getattr(jax.nn, name)(y)


#: ``opruntime.mesh`` once imported (it sits above the operators and registers itself here): a
#: call that involves a mesh is its ``run``'s, ``explain`` of one its ``explain``'s
mesh: Any = None

_plans_get = selector.plans.get  # the plan cache is one LRU for the process (cleared, never replaced)


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
    trivial: str | None = None  # "empty" (nothing to compute), "zeros" (an empty reduction) or the op's own


@dataclass(frozen=True)
class Case:
    """One problem of an operator, as a user passes it: for the conformance suite and the bench.

    Attributes:
        shapes: the operands' shapes as the user passes them.
        attrs: the operator's keyword attributes.
        dtype: the computation dtype (the bench's; the conformance suite tries every dtype).
        views: per operand, ``None`` (contiguous), ``"T"`` (the last two dims swapped on the device)
            or ``"slice"`` (every other element of the last dim, a strided device view).
        scale: the operands' standard deviation (softmax wants a spread of values).
        bools: the operands drawn as booleans (attention's mask): True where the normal draw
            is above -0.5, about 70% of the elements.
        op: the operator's name (filled in by the operator).
    """

    shapes: tuple[tuple[int, ...], ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    dtype: str = "float32"
    views: tuple[str | None, ...] = ()
    scale: float = 1.0
    bools: tuple[int, ...] = ()
    op: str = ""

    @property
    def id(self) -> str:
        """A test id: ``(7,13)x(13,5)-stride=2-0T``."""
        ops = "x".join("(" + ",".join(map(str, s)) + ")" for s in self.shapes)
        views = "".join(f"-{i}{v}" for i, v in enumerate(self.views) if v)
        attrs = "".join(f"-{k}={v}" for k, v in self.attrs.items()).replace(" ", "")
        return f"{ops}{attrs}{views}"

    @property
    def label(self) -> str:
        """A bench label: ``1024x1024 x 1024x1024 padding=1``."""
        s = " x ".join("x".join(map(str, sh)) for sh in self.shapes)
        a = ",".join(f"{k}={v}" for k, v in self.attrs.items())
        return f"{s} {a}".strip()


#: ``peer(lib, *arrays, **attrs) -> result``: the operator computed by another library, given that
#: library's module and the operands already placed for it: ``"numpy"`` (the bench passes CuPy as
#: ``lib`` on CUDA devices), ``"torch"`` (and ``"triton"``: torch tensors), ``"jax"``. ``"onnx"``
#: is ``onnx(**attrs) -> (op_type, attributes[, opset])``: the one ONNX node that computes it (or a
#: list of such nodes, a chain: each takes the one before's result, as ``Add`` then ``Relu``).
Peer = Callable[..., Any]


class Operator(abc.ABC):
    """One operator: everything the runtime, the conformance suite, the bench, the peers and the
    docs know about it.

    A subclass sets ``name``, ``operands`` (and ``required`` when trailing operands are optional),
    ``bound`` (``"memory"`` or ``"compute"``: which roof the bench reports), implements
    ``normalize`` and ``reference``, and fills the tables:

    * ``cases``: conformance problems (odd sizes, size-1 dims, strided views, every attribute);
      ``quick`` picks the indices a quick run takes;
    * ``empty``: size-0 problems (the frontend answers them itself: kernels never see them);
    * ``bench``: suite name -> cases (``opruntime bench --suite <name>``);
    * ``peers``: library -> :data:`Peer`.

    The public function is the operator's :meth:`function` applied to a stub that gives the
    signature, the types and the docstring.
    """

    name: str = ""
    operands: tuple[str, ...] = ()  # names for messages: ("a", "b")
    required: int | None = None  # operands that must be given (default: all of them)
    bound: str = "compute"  # "memory" or "compute"
    cases: Sequence[Case] = ()
    quick: Sequence[int] = (0,)
    empty: Sequence[Case] = ()
    bench: Mapping[str, Sequence[Case]] = {}
    peers: Mapping[str, Peer] = {}
    masks: tuple[str, ...] = ()  # operands that may be boolean (attention's attn_mask)

    def __init__(self) -> None:
        # the tables name this operator (one class may serve two: softmax and log_softmax)
        self.cases = [replace(c, op=self.name) for c in self.cases]
        self.empty = [replace(c, op=self.name) for c in self.empty]
        self.bench = {suite: [replace(c, op=self.name) for c in cs] for suite, cs in self.bench.items()}
        self.attributes: tuple[str, ...] = ()  # in the public signature's order (see function)

    @abc.abstractmethod
    def normalize(self, shapes: Sequence[tuple[int, ...]], attrs: dict[str, Any]) -> Normalized:
        """Validate shapes and attributes, raising typed errors; infer the result."""

    @abc.abstractmethod
    def reference(self, *arrays: np.ndarray, **attrs: Any) -> np.ndarray:
        """The float64 result, computed plainly with NumPy."""

    def sample(self, arrays: list[np.ndarray], case: Case | None = None) -> list[np.ndarray]:
        """Random host operands (normal draws) of ``case`` moved into the operator's domain, for
        the conformance suite and the bench: e.g. a variance made positive. The default makes the
        operands ``case.bools`` names boolean and keeps the others."""
        if case is None or not case.bools:
            return arrays
        return [a > -0.5 if i in case.bools else a for i, a in enumerate(arrays)]

    def flops(self, problem: Problem) -> float:
        """Floating-point operations of one call (the bench's and the cost models' numerator)."""
        return float(math.prod(problem.out_shape))

    def bytes(self, problem: Problem) -> float:
        """Bytes read and written once: every operand and the result."""
        n = sum(math.prod(s) for s in problem.shapes) + math.prod(problem.out_shape)
        return float(n * itemsize(problem.out_dtype))

    def trivial_result(self, problem: Problem, result_shape: tuple[int, ...], trivial: str, datas: Sequence[Any],
                       provider: Any) -> Any:
        """The result of a problem with nothing to compute (``trivial`` is ``"empty"``: a size-0
        result, or ``"zeros"``: a sum over nothing), as a new array of the device."""
        dt = np.dtype(datas[0].dtype) if datas else np.dtype(problem.out_dtype)
        return (provider.empty if trivial == "empty" else provider.zeros)(result_shape, dt)

    # -- the public function --------------------------------------------------------------------
    def function(self, stub: Callable[..., Any]) -> Callable[..., Any]:
        """The public function of this operator, with ``stub``'s signature, types and docstring.

        The stub names the operands (as ``operands``), the attributes and a keyword-only
        ``device``; its body is never run. The function made here passes the operands present (a
        trailing optional operand given as None is left out) and the attributes, each with its
        type (part of the plan-cache key), to :meth:`call`.
        """
        sig = inspect.signature(stub)
        names = list(sig.parameters)
        if "device" not in names or not set(self.operands) <= set(names):
            raise TypeError(f"{self.name}: the public stub must take the operands {self.operands} and device=")
        self.attributes = tuple(n for n in names if n not in self.operands and n != "device")
        need = self.operands[: self.required if self.required is not None else len(self.operands)]
        expr = "(" + "".join(f"{n}, " for n in need) + ")"
        for i in range(len(need), len(self.operands)):  # trailing optional operands, when given
            upto = self.operands[: i + 1]
            expr = f"({expr} if {self.operands[i]} is None else ({''.join(f'{n}, ' for n in upto)}))"
        scalar = {"int", "str", "bool", "float"}
        attrs = "".join(f"({n!r}, {n}, {n}.__class__), " if str(sig.parameters[n].annotation) in scalar
                        else f"({n!r}, {n}, _tag({n})), " for n in self.attributes)
        ns: dict[str, Any] = {"_call": self.call, "_tag": attr_tag}
        params, star = [], False
        for p in sig.parameters.values():
            if p.kind is p.KEYWORD_ONLY and not star:
                params.append("*")
                star = True
            if p.default is p.empty:
                params.append(p.name)
            else:
                ns[f"_default_{p.name}"] = p.default
                params.append(f"{p.name}=_default_{p.name}")
        src = f"def {stub.__name__}({', '.join(params)}):\n    return _call({expr}, device, ({attrs}))\n"
        exec(compile(src, f"<opruntime.ops: {self.name}>", "exec"), ns)  # as dataclasses makes __init__
        fn = ns[stub.__name__]
        fn.__doc__, fn.__module__, fn.__qualname__ = stub.__doc__, stub.__module__, stub.__qualname__
        fn.__annotations__ = dict(stub.__annotations__)
        fn.__wrapped__ = stub  # type: ignore[attr-defined]  # typing.get_type_hints reads the stub module's names
        fn.operator = self  # type: ignore[attr-defined]
        return fn

    def attr_key(self, attrs: Mapping[str, Any]) -> tuple:
        """The attributes as the plan-cache key holds them: (name, value, type) in the public
        signature's order (as the public function builds them)."""
        order = {n: i for i, n in enumerate(self.attributes)}
        items = sorted(attrs.items(), key=lambda kv: order.get(kv[0], len(order)))
        return tuple((k, v, attr_tag(v)) for k, v in items)

    # -- the call path ----------------------------------------------------------------------
    def __call__(self, *inputs: Any, device: Any = None, **attrs: Any) -> Tensor:
        inputs, attrs = self.operands_by_name(inputs, attrs)
        return self.call(inputs, device, self.attr_key(attrs))

    def operands_by_name(self, inputs: Sequence[Any], attrs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Operands passed by keyword (``residual=r``, as the public function takes a keyword-only
        operand) moved to their places among ``inputs`` (None filling the gaps; trailing ones
        left out, as the public function does)."""
        named = [n for n in self.operands if n in attrs]
        if not named:
            return tuple(inputs), attrs
        attrs = dict(attrs)
        args = list(inputs) + [None] * (len(self.operands) - len(inputs))
        for n in named:
            args[self.operands.index(n)] = attrs.pop(n)
        while args and args[-1] is None:
            args.pop()
        return tuple(args), attrs

    def adapt(self, inputs: tuple[Any, ...], attrs: tuple[tuple[str, Any, Any], ...]) -> tuple[tuple[Any, ...], tuple]:
        """Rewrite a call's operands and attributes ((name, value, type) triples) before anything
        else sees them: a weak Python scalar, a middle operand given as None. An operator that
        overrides it calls it from its :meth:`call`; :func:`~opruntime.ops.explain` calls it too,
        so that it explains the call that runs. The default keeps them."""
        return inputs, attrs

    def call(self, inputs: tuple[Any, ...], device: Any, attrs: tuple[tuple[str, Any, Any], ...]) -> Tensor:
        """Run the operator on ``inputs`` with attributes ``attrs`` ((name, value, type) triples).

        The hot path (no ``device=``, every operand a Tensor, a NumPy array or a device's native
        array of a class adopted before, a plan cached) builds the key from each Tensor's kept
        signature id (an array's class, DLPack device, shape, dtype and strides) and calls the plan;
        anything else places the operands, validates and plans (once per distinct call)."""
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
                        t = _new(Tensor)
                        t._data, t._device, t._key = plan([a._data] if n == 1 else [a._data, b._data]), plan.device, None
                        return t
            key: list[Any] = [self.name, s, attrs]
            datas = []
            for x in inputs:
                cls = x.__class__
                if cls is Tensor:
                    k = x._key
                    key.append(k if k is not None else x._signature())
                    datas.append(x._data)
                elif cls is np.ndarray and x.dtype.isnative and _placement() is None:
                    key.append((None, x.shape, x.dtype, x.strides))  # host data: placed by the plan
                    datas.append(x)
                elif cls in NATIVE:  # a device's own array (adopted once): where it lives, its layout
                    key.append((cls, x.__dlpack_device__(), x.shape, x.dtype, getattr(x, "strides", None)))
                    datas.append(x)
                else:
                    break
            else:
                try:
                    plan = _plans_get(key := tuple(key))
                except TypeError:
                    plan = key = None
                if plan is not None:
                    t = _new(Tensor)
                    t._data, t._device, t._key = plan(datas), plan.device, None
                    return t
                fast_key = key
        if mesh is not None and (spread := mesh.run(self, inputs, device, attrs)) is not None:
            return spread
        adict = {k: v for k, v, _ in attrs}
        datas, dev = place(self.name, self.operands, inputs, device, s, self.masks)
        key = self.key(s, dev, datas, attrs)
        try:
            plan = selector.plans.get(key)
        except TypeError:  # an unhashable attribute (a list): validate and normalise every time
            return Tensor._wrap(self.plan(datas, dev, adict, s)(datas), dev)
        if plan is None:
            plan = self.plan(datas, dev, adict, s)
            selector.plans[key] = plan
        if fast_key is not None and fast_key != key:  # host operands: remember how they are placed
            selector.plans[fast_key] = plan.placing(tuple(x.__class__ is np.ndarray for x in inputs))
        return Tensor._wrap(plan(datas), dev)

    def key(self, s: Any, dev: Device, datas: list[Any], attrs: tuple | Mapping[str, Any]) -> tuple:
        """The plan-cache key of a call on device arrays (hashing it raises TypeError for
        unhashable attributes); the same key as the hot path builds from Tensors."""
        if isinstance(attrs, Mapping):
            attrs = self.attr_key(attrs)
        key = [self.name, s, attrs]
        for d in datas:
            key.append(signature_id(dev.name, d))
        return tuple(key)

    def problem(self, datas: list[Any], dev: Device, attrs: dict[str, Any]) -> tuple[Problem, Normalized, tuple[bool, ...]]:
        """Validate a call and build its Problem (with the normalisation and the casts it needs)."""
        shapes = [tuple(d.shape) for d in datas]
        # a mask operand (``masks``) takes no part in the promotion: a boolean one stays boolean, a
        # float one is cast to the computation dtype, any other dtype is the dtype error
        masked = [i < len(self.operands) and self.operands[i] in self.masks for i in range(len(datas))]
        dtype = result_dtype(self.name, [d.dtype for d, m in zip(datas, masked) if not m])
        kept = [m and np.dtype(d.dtype) == np.bool_ for d, m in zip(datas, masked)]
        for d, m, k in zip(datas, masked, kept):
            if m and not k:
                result_dtype(self.name, [d.dtype])
        dtypes = tuple("bool" if k else dtype for k in kept)
        norm = self.normalize_for(shapes, dtypes, dict(attrs))
        casts = tuple(not k and np.dtype(d.dtype).name != dtype for d, k in zip(datas, kept))
        strides = []
        for d, shape, cast in zip(datas, norm.shapes, casts):
            st = getattr(d, "strides", None)
            if st is None:
                strides.append(None)
            elif cast:  # the kernel gets the cast copy: C order (DeviceProvider.astype)
                strides.append(c_strides(shape))
            else:
                if tuple(d.shape) != shape:  # the kernel gets the operand reshaped: its strides (a view
                    st = dev.provider.reshape(d, shape).strides  # keeps a strided operand's steps; a copy is C order)
                strides.append(tuple(x // d.dtype.itemsize for x in st))
        problem = Problem(self.name, dev, norm.shapes, dtypes, tuple(strides), norm.attrs, norm.out_shape, dtype)
        return problem, norm, casts

    def normalize_for(self, shapes: Sequence[tuple[int, ...]], dtypes: tuple[str, ...],
                      attrs: dict[str, Any]) -> Normalized:
        """:meth:`normalize`, for an operator whose kernels must also know an operand's dtype
        (``"bool"`` for a boolean mask). The default ignores the dtypes."""
        return self.normalize(shapes, attrs)

    def problem_for(self, device: Device | str, shapes: Sequence[Sequence[int]], dtype: str, **attrs: Any) -> Problem:
        """The Problem the frontend builds for C-contiguous operands of ``shapes`` in ``dtype`` on
        ``device``: for tests, benchmarks and tools that have shapes, not arrays."""
        norm = self.normalize([tuple(s) for s in shapes], dict(attrs))
        return Problem(self.name, Device(device), norm.shapes, (dtype,) * len(shapes),
                       tuple(c_strides(s) for s in norm.shapes), norm.attrs, norm.out_shape, dtype)

    def plan(self, datas: list[Any], dev: Device, attrs: dict[str, Any], s: Any) -> selector.Plan:
        """Validate the call and ask the selector for a plan (the slow path of a call)."""
        problem, norm, casts = self.problem(datas, dev, attrs)
        return selector.Plan(self, problem, dev, s, norm, casts, tuple(tuple(d.shape) for d in datas))

    def __repr__(self) -> str:
        return f"<operator {self.name}({', '.join(self.operands + self.attributes)})>"


_new = object.__new__
_placement = placement.get


def attr_tag(value: Any) -> Any:
    """The type part of an attribute's key: its class, or its elements' classes for a tuple (so
    ``1``, ``1.0`` and ``True`` never share a plan, whose validation differs)."""
    cls = value.__class__
    return tuple(v.__class__ for v in value) if cls is tuple else cls


def place(op: str, names: Sequence[str], inputs: Sequence[Any], wanted: Any, s: Any,
          masks: Sequence[str] = ()) -> tuple[list[Any], Device]:
    """Put every operand on one device: the Tensors' device, else the configured one.

    Host data (NumPy arrays, lists, scalars) joins the Tensors' device; Tensors on two devices,
    or a ``device=`` that differs from the Tensors', raise :class:`DeviceMismatchError`. Host
    data must be floating point, except a boolean array for an operand named in ``masks``.
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
    if not on_device:  # native arrays and DLPack objects on a device become Tensors there (tensor.adopt)
        inputs = [adopt(op, x, n) for n, x in zip(names, inputs)]
        for x in inputs:
            if x.__class__ is Tensor:
                if dev is not None and x.device.name != dev.name:
                    _mismatch(op, names, inputs)
                dev = x.device
    if wanted is not None:
        want = resolve_device(s, op, wanted)
        if dev is not None and want.name != dev.name:
            raise DeviceMismatchError(
                f"{op}: device={str(wanted)!r} was asked but the operands live on {dev.name!r}; "
                f"move them first with .to({want.name!r}) (opruntime never copies between devices silently)"
            )
        dev = want
    elif dev is None:
        dev = _default_device(s, op)
    out = []
    for name, x in zip(names, inputs):
        if x.__class__ is Tensor:
            out.append(x.data)
        elif not isinstance(x, np.ndarray) and dev.provider.owns(x):
            out.append(x)
        else:
            out.append(dev.provider.from_host(_checked(op, host_array(op, x), name in masks)))
    return out, dev


def _checked(op: str, arr: np.ndarray, mask: bool = False) -> np.ndarray:
    """Reject non-float host data before it is placed: a device may convert what it cannot hold
    (JAX turns int64 into int32), and the error must name the dtype the caller passed. A mask
    operand may be boolean."""
    if arr.dtype.kind != "f" and not (mask and arr.dtype.kind == "b"):
        result_dtype(op, [arr.dtype])
    return arr


def wide(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Host operands as the float64 references take them: floats widened, booleans (masks) kept."""
    return [a if a is None or a.dtype.kind == "b" else np.asarray(a, np.float64) for a in arrays]


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
