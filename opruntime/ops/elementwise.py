"""The elementwise operators: binary ``add``, ``sub``, ``mul``, ``div`` and unary ``neg``, ``relu``,
``gelu``, ``silu``, ``sigmoid``, ``tanh`` (``torch`` / ``torch.nn.functional`` semantics).

Binary operators broadcast as NumPy does (a :class:`~opruntime.errors.ShapeError` naming both
shapes otherwise) and take ``activation`` (None or one of :data:`~opruntime.ops.base.EPILOGUES`,
validated as ``linear``'s and ``conv2d``'s): ``activation(a op b)`` computed by one kernel, the
activation applied to each element as it is made (no second pass, no intermediate array; ResNet's
residual ``relu(out + identity)`` is one read of each operand and one write); the result dtype follows ``result_dtype``, except that a Python ``int`` or
``float`` operand is *weak*, as in NumPy 2 and torch: it takes the other operand's dtype
(``t + 1.0`` and ``t * 2`` keep a float16 ``t`` float16). ``bool`` operands are refused. ``div``
by zero follows IEEE 754 (``inf`` / ``nan``, no error). Kernels see each operand in its own shape
and strides (broadcasting is theirs to do, with no copy) and return a new C-contiguous array of
the broadcast shape.

The unary operators keep the input's shape and dtype; NaN stays NaN. The activations' float64
references are :data:`~opruntime.ops.base.ACTIVATIONS`; a kernel finds its activation name with
:func:`activation` (a binary operator's ``activation`` attribute; ``gelu`` with
``approximate="tanh"`` is ``"gelu_tanh"``; ``neg`` and a binary operator without one have none).
``neg`` is the Tensor's unary minus (``-0.0`` gives ``0.0`` and back).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import AttributeValueError, DtypeError, ShapeError, UnknownAttributeError
from ..kernels import Attrs, Problem, c_strides
from ..tensor import Tensor
from ..typing import ArrayLike, DeviceLike
from .base import ACTIVATIONS, Case, Normalized, Operator, activation_attr, jax_activation, torch_activation

BINARY_OPS = ("add", "sub", "mul", "div")
UNARY_OPS = ("neg", "relu", "gelu", "silu", "sigmoid", "tanh")
#: the arithmetic of each binary operator on float64 arrays (the references)
ARITHMETIC: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
}


def activation(problem: Problem) -> str | None:
    """The activation name (a key of ``ACTIVATIONS``) a problem of the family applies last: a binary
    operator's ``activation`` attribute (None: none), the unary operator's own; None for ``neg``."""
    if problem.op in ARITHMETIC:
        return problem.attrs.get("activation")
    if problem.op == "neg":
        return None
    if problem.op == "gelu":
        return "gelu_tanh" if problem.attrs.get("approximate") == "tanh" else "gelu"
    return problem.op


# -- how kernels read the operands (shared by the backends' elementwise families) --------------------

#: the most dims the strided kernels index (after merging the dims every operand allows)
MAX_DIMS = 6


@dataclass(frozen=True)
class Layout:
    """How the operands are read. ``path`` is ``"vector"``, ``"broadcast"`` or ``"strided"``.

    broadcast: ``full`` is the index of the C-contiguous operand, the other's element for output
    element ``i`` is ``(i // div) % mod``. strided: ``dims`` (at most 6) and each operand's
    element ``strides`` over them (0 where it repeats); ``fits`` is False when more than 6 dims
    remain (the launcher then makes contiguous copies first).
    """

    path: str
    n: int
    full: int = 0
    div: int = 1
    mod: int = 1
    dims: tuple[int, ...] = ()
    strides: tuple[tuple[int, ...], ...] = ()
    fits: bool = True


def layout(shapes: Sequence[tuple[int, ...]], strides: Sequence[tuple[int, ...] | None],
           out_shape: tuple[int, ...], *, strided: bool = False) -> Layout:
    """The path and its parameters for operands of ``shapes`` / element ``strides`` broadcast to
    ``out_shape``: the fastest that applies, or with ``strided`` the strided form (which every
    layout has)."""
    nd, n = len(out_shape), math.prod(out_shape)
    keep = [i for i in range(nd) if out_shape[i] > 1]  # size-1 output dims say nothing
    dims = [out_shape[i] for i in keep]
    ops = []
    for shape, st in zip(shapes, strides):
        pad = nd - len(shape)
        sh = (1,) * pad + tuple(shape)
        st = (0,) * pad + tuple(c_strides(shape) if st is None else st)
        ops.append([0 if sh[i] == 1 else st[i] for i in keep])  # repeated dims read with stride 0
    cs = list(c_strides(dims))
    full = [s == cs for s in ops]
    if all(full) and not strided:
        return Layout("vector", n)
    if len(ops) == 2 and any(full) and not strided:
        f = full.index(True)
        g = ops[1 - f]
        present = [i for i, s in enumerate(g) if s != 0]
        p, q = (present[0], present[-1] + 1) if present else (len(dims), len(dims))
        if present == list(range(p, q)) and g[p:q] == list(c_strides(dims[p:q])):
            return Layout("broadcast", n, full=f, div=math.prod(dims[q:]), mod=math.prod(dims[p:q]))
    # strided: merge a dim into its inner neighbour where every operand allows it
    merged_dims, merged = [], [[] for _ in ops]
    for i, d in enumerate(dims):
        if merged_dims and all(m[-1] == s[i] * d for m, s in zip(merged, ops)):
            merged_dims[-1] *= d
            for m, s in zip(merged, ops):
                m[-1] = s[i]
        else:
            merged_dims.append(d)
            for m, s in zip(merged, ops):
                m.append(s[i])
    fits = len(merged_dims) <= MAX_DIMS
    if not fits:
        return Layout("strided", n, fits=False)
    pad = MAX_DIMS - len(merged_dims)
    return Layout("strided", n, dims=(1,) * pad + tuple(merged_dims),
                  strides=tuple((0,) * pad + tuple(m) for m in merged), fits=True)


# -- binary -------------------------------------------------------------------------------------------

def _b(a: tuple[int, ...], b: tuple[int, ...], views: tuple[str | None, ...] = (), dtype: str = "float32",
       activation: str | None = None) -> Case:
    return Case((a, b), {} if activation is None else {"activation": activation}, dtype, views)


#: 0-D, size-1, odd lengths; broadcasting of a scalar, a row, a column, a channel (NCHW bias),
#: both sides at once; strided views on either side
BINARY_CASES = [
    _b((), ()), _b((1,), (1,)), _b((7,), (7,)), _b((1031,), (1031,)), _b((33, 65), (65,)), _b((33, 65), ()),
    _b((), (5, 3)), _b((33, 1), (33, 65)), _b((3, 1, 5), (4, 5)), _b((2, 3, 4, 5), (3, 1, 1)),
    _b((24, 40), (24, 40), ("T", None)), _b((6, 40), (6, 40), (None, "slice")), _b((6, 40), (40,), ("slice", None)),
]
#: the fused activation (cases 13-): each activation on each kernel path: equal shapes (odd and
#: past any vector width), an NCHW channel bias, a row, a scalar on the left, both sides
#: broadcast, transposed and sliced views; 0-D and size 1 with relu and silu only (one element
#: is judged on its own value: a gelu deep in its tail is float16 subnormal, or, in float32, within
#: the erf approximation's absolute error of zero)
ACTIVATION_CASES = [
    _b((2, 3, 4, 5), (3, 1, 1), activation="gelu"), _b((1031,), (1031,), activation="relu"),
    _b((33, 65), (65,), activation="gelu_tanh"), _b((), (5, 3), activation="silu"),
    _b((3, 1, 5), (4, 5), activation="relu"), _b((24, 40), (24, 40), ("T", None), activation="silu"),
    _b((6, 40), (40,), ("slice", None), activation="gelu"), _b((33, 65), (33, 65), activation="gelu_tanh"),
    _b((33, 1), (33, 65), activation="relu"), _b((), (), activation="silu"), _b((1,), (1,), activation="relu"),
]
_GPU = [_b((8192, 8192), (8192, 8192)), _b((8192, 8192), (8192, 8192), dtype="float16"),
        _b((8192, 8192), (8192,)), _b((8192, 8192), (8192,), dtype="float16")]


class Binary(Operator):
    """``add``, ``sub``, ``mul``, ``div``: one class, four operators."""

    operands = ("a", "b")
    bound = "memory"
    cases = BINARY_CASES + ACTIVATION_CASES
    #: the first quick case is the one CI also runs in every other dtype: a fused activation
    quick = (13, 2, 4, 8, 10, 18)
    empty = [_b((0,), (0,)), _b((3, 0), (1,)), _b((0, 4), (4,)), _b((0,), (0,), activation="relu"),
             _b((3, 0), (1,), activation="gelu")]

    def __init__(self, name: str, torch_name: str, onnx_name: str, python: Callable[[Any, Any], Any]) -> None:
        self.name = name
        cpu, gpu = [_b((4096, 1024), (4096, 1024))], _GPU if name in ("add", "mul") else _GPU[:2]
        if name == "add":  # ResNet's residual, relu(out + identity): one pass
            cpu = cpu + [_b((4, 256, 56, 56), (4, 256, 56, 56), activation="relu")]
            gpu = gpu + [_b((8192, 8192), (8192, 8192), dtype="float16", activation="gelu")]
        self.bench = {"cpu": cpu, "overhead": [_b((16,), (16,))], "gpu": gpu}
        self.peers = {
            "numpy": lambda np, a, b, activation=None: _numpy_act(np, activation, python(a, b)),
            "torch": lambda torch, a, b, activation=None: torch_activation(torch, activation,
                                                                     getattr(torch, torch_name)(a, b)),
            "jax": lambda jax, a, b, activation=None: jax_activation(jax, activation, python(a, b)),
            "onnx": lambda activation=None: _onnx_chain((onnx_name, {}), activation),
        }
        super().__init__()

    def normalize(self, shapes: Sequence[tuple[int, ...]], attrs: dict[str, Any]) -> Normalized:
        act = activation_attr(self.name, attrs.pop("activation", None))
        if attrs:
            raise UnknownAttributeError(f"{self.name}() got unexpected keyword argument(s) {', '.join(attrs)}; "
                                        f"it takes {', '.join(self.attributes) or 'activation'}")
        a, b = (tuple(s) for s in shapes)
        out = broadcast_shape(self.name, a, b)
        return Normalized((a, b), Attrs(activation=act), out, out, "empty" if math.prod(out) == 0 else None)

    def reference(self, a: np.ndarray, b: np.ndarray, activation: str | None = None) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            y = ARITHMETIC[self.name](np.asarray(a, np.float64), np.asarray(b, np.float64))
            if activation is not None:
                y = ACTIVATIONS[activation](np.asarray(y, np.float64))
            return np.asarray(y, np.float64)

    def flops(self, problem: Problem) -> float:
        """One operation an element, plus the activation's (as its unary operator counts them)."""
        return (1.0 + ACTIVATION_FLOPS.get(problem.attrs.get("activation"), 0.0)) * math.prod(problem.out_shape)

    def sample(self, arrays: list[np.ndarray], case: Case | None = None) -> list[np.ndarray]:
        """For ``div``: divisors kept at least 0.5 from zero (a tiny divisor overflows float16)."""
        if self.name != "div":
            return arrays
        a, b = arrays
        b = np.asarray(np.where(b < 0, b - 0.5, b + 0.5), b.dtype)
        return [a, b]

    def call(self, inputs: tuple[Any, ...], device: Any, attrs: tuple[tuple[str, Any, Any], ...]) -> Tensor:
        a, b = inputs
        if a.__class__ in _SCALARS or b.__class__ in _SCALARS:
            inputs, attrs = self.adapt(inputs, attrs)
        return Operator.call(self, inputs, device, attrs)

    def adapt(self, inputs: tuple[Any, ...], attrs: tuple[tuple[str, Any, Any], ...]) -> tuple[tuple[Any, ...], tuple]:
        """A Python scalar operand made a 0-D array of the other operand's dtype (a weak scalar)."""
        return weak_scalars(self.name, *inputs), attrs


_SCALARS = (int, float, bool)
#: operations per element of each activation (the unary operators' ``flops``)
ACTIVATION_FLOPS: dict[str | None, float] = {"relu": 1.0, "gelu": 10.0, "gelu_tanh": 10.0, "silu": 4.0}


def _numpy_act(np: Any, name: str | None, y: Any) -> Any:
    """The NumPy (CuPy) peer's activation: a pass of its own, as a NumPy user writes it."""
    if name is None:
        return y
    if name == "relu":
        return np.maximum(y, 0)
    if name == "silu":
        return _silu_np(np, y)
    return _gelu_np(np, y, "tanh" if name == "gelu_tanh" else "none")


def _onnx_chain(node: tuple[str, dict], activation: str | None) -> Any:
    """ONNX Runtime's nodes: the arithmetic, then the activation's node on its result (``Add`` +
    ``Relu``; ``Gelu`` needs opset 20); None for silu (no one node computes it)."""
    if activation is None:
        return node
    act = {"relu": ("Relu", {}), "gelu": ("Gelu", {"approximate": "none"}, 20),
           "gelu_tanh": ("Gelu", {"approximate": "tanh"}, 20)}.get(activation)
    return None if act is None else [node, act]


def weak_scalars(op: str, a: Any, b: Any) -> tuple[Any, Any]:
    """``(a, b)`` with a Python ``int`` / ``float`` operand turned into a 0-D NumPy array of the
    other operand's float dtype (when it has one; two scalars keep the usual host-data rule).

    Raises:
        DtypeError: a ``bool`` operand.
    """
    for name, x in zip(("a", "b"), (a, b)):
        if isinstance(x, (bool, np.bool_)):
            raise DtypeError(f"{op}: operand {name} is a bool ({x!r}); booleans are not numbers here. "
                             f"Pass a float, e.g. {op}(x, {float(x)!r})")
    out = [a, b]
    for i, (x, other) in enumerate(((a, b), (b, a))):
        if x.__class__ not in (int, float):
            continue
        dt = getattr(other, "dtype", None)
        try:
            dt = np.dtype(dt) if dt is not None else None
        except TypeError:  # a foreign dtype object NumPy does not know
            dt = None
        if dt is not None and (dt.kind == "f" or dt.name == "bfloat16"):
            with np.errstate(over="ignore"):  # 1e6 in float16 is inf, as torch gives
                out[i] = np.asarray(float(x), np.float64).astype(dt)
    return out[0], out[1]


def broadcast_shape(op: str, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """The NumPy broadcast of shapes ``a`` and ``b``.

    Raises:
        ShapeError: naming both shapes and the dims that differ.
    """
    n = max(len(a), len(b))
    pa, pb = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for i, (x, y) in enumerate(zip(pa, pb)):
        if x != y and x != 1 and y != 1:
            raise ShapeError(f"{op}: shapes {a} and {b} do not broadcast: dim {i - n} is {x} in a and {y} in b "
                             f"(each dim must match or be 1, counted from the last). Reshape one operand, e.g. "
                             f"b.reshape(...) with a 1 where it should repeat")
        out.append(x if y == 1 else y)
    return tuple(out)


ADD = Binary("add", "add", "Add", lambda a, b: a + b)
SUB = Binary("sub", "sub", "Sub", lambda a, b: a - b)
MUL = Binary("mul", "mul", "Mul", lambda a, b: a * b)
DIV = Binary("div", "div", "Div", lambda a, b: a / b)


# -- unary --------------------------------------------------------------------------------------------

def _u(shape: tuple[int, ...], views: tuple[str | None, ...] = (), dtype: str = "float32", scale: float = 2.0,
       **attrs: Any) -> Case:
    return Case((shape,), attrs, dtype, views, scale=scale)


def _unary_cases(scale: float = 2.0, **attrs: Any) -> list[Case]:
    """0-D, size-1 and odd sizes, lengths past any vector width, and strided views. Values of
    standard deviation 2 reach the activations' tails (tanh, sigmoid saturated)."""
    return [_u((), scale=scale, **attrs), _u((1,), scale=scale, **attrs), _u((7,), scale=scale, **attrs),
            _u((3, 5), scale=scale, **attrs), _u((2, 3, 1, 5), scale=scale, **attrs), _u((1031,), scale=scale, **attrs),
            _u((33, 65), scale=scale, **attrs), _u((24, 40), ("T",), scale=scale, **attrs),
            _u((6, 40), ("slice",), scale=scale, **attrs)]


#: both approximations, alternating. Standard deviation 1: gelu(x) for x below -4.5 is below
#: float16's normal range (a one-element case would then be judged on a subnormal's few bits).
GELU_CASES = [c if i % 2 else Case(c.shapes, {"approximate": "tanh"}, c.dtype, c.views, c.scale)
              for i, c in enumerate(_unary_cases(scale=1.0, approximate="none"))]


class Unary(Operator):
    """``neg`` and the activations ``relu``, ``gelu``, ``silu``, ``sigmoid``, ``tanh``: one class."""

    operands = ("x",)
    bound = "memory"
    quick = (2, 4, 8)

    def __init__(self, name: str, peers: dict[str, Any], flops: float = 1.0) -> None:
        self.name, self.peers, self.per_element = name, peers, flops
        self.cases = GELU_CASES if name == "gelu" else _unary_cases()
        attrs = {"approximate": "none"} if name == "gelu" else {}
        self.empty = [_u((0,), **attrs), _u((3, 0, 2), **attrs)]
        gpu = [_u((8192, 8192), **attrs), _u((8192, 8192), dtype="float16", **attrs)]
        if name == "gelu":
            gpu += [_u((8192, 8192), approximate="tanh"), _u((8192, 8192), dtype="float16", approximate="tanh")]
        self.bench = {"cpu": [_u((4096, 1024), **attrs)], "overhead": [_u((16,), **attrs)], "gpu": gpu}
        super().__init__()

    def normalize(self, shapes: Sequence[tuple[int, ...]], attrs: dict[str, Any]) -> Normalized:
        normal = Attrs()
        if self.name == "gelu":
            approximate = attrs.pop("approximate", "none")
            if approximate not in ("none", "tanh") or not isinstance(approximate, str):
                raise AttributeValueError(f"gelu: approximate must be 'none' or 'tanh' (as torch); got {approximate!r}")
            normal = Attrs(approximate=approximate)
        if attrs:
            takes = "approximate" if self.name == "gelu" else "none"
            raise UnknownAttributeError(f"{self.name}() got unexpected keyword argument(s) {', '.join(attrs)}; "
                                        f"it takes {takes}")
        (shape,) = shapes
        shape = tuple(shape)
        return Normalized((shape,), normal, shape, shape, "empty" if math.prod(shape) == 0 else None)

    def reference(self, x: np.ndarray, approximate: str = "none") -> np.ndarray:
        x = np.asarray(x, np.float64)
        if self.name == "neg":
            return np.negative(x)
        name = "gelu_tanh" if self.name == "gelu" and approximate == "tanh" else self.name
        with np.errstate(over="ignore", invalid="ignore"):
            return np.asarray(ACTIVATIONS[name](x), np.float64)

    def flops(self, problem: Problem) -> float:
        return self.per_element * math.prod(problem.out_shape)


def _silu_np(np: Any, x: Any) -> Any:
    return x / (1 + np.exp(-x))


def _gelu_np(np: Any, x: Any, approximate: str = "none") -> Any:
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
    if np.__name__ == "numpy":
        from scipy.special import erf
    else:  # CuPy on CUDA devices
        from cupyx.scipy.special import erf
    return 0.5 * x * (1 + erf(x * 0.7071067811865476))


NEG = Unary("neg", {
    "numpy": lambda np, x: np.negative(x),
    "torch": lambda torch, x: torch.neg(x),
    "jax": lambda jax, x: -x,
    "onnx": lambda: ("Neg", {}),
})
RELU = Unary("relu", {
    "numpy": lambda np, x: np.maximum(x, 0),
    "torch": lambda torch, x: torch.nn.functional.relu(x),
    "jax": lambda jax, x: jax.nn.relu(x),
    "onnx": lambda: ("Relu", {}),
})
GELU = Unary("gelu", {
    "numpy": _gelu_np,
    "torch": lambda torch, x, approximate="none": torch.nn.functional.gelu(x, approximate=approximate),
    "jax": lambda jax, x, approximate="none": jax.nn.gelu(x, approximate=approximate == "tanh"),
    "onnx": lambda approximate="none": ("Gelu", {"approximate": approximate}, 20),
}, flops=10.0)
SILU = Unary("silu", {
    "numpy": _silu_np,
    "torch": lambda torch, x: torch.nn.functional.silu(x),
    "jax": lambda jax, x: jax.nn.silu(x),
}, flops=4.0)
SIGMOID = Unary("sigmoid", {
    "numpy": lambda np, x: 1 / (1 + np.exp(-x)),
    "torch": lambda torch, x: torch.sigmoid(x),
    "jax": lambda jax, x: jax.nn.sigmoid(x),
    "onnx": lambda: ("Sigmoid", {}),
}, flops=4.0)
TANH = Unary("tanh", {
    "numpy": lambda np, x: np.tanh(x),
    "torch": lambda torch, x: torch.tanh(x),
    "jax": lambda jax, x: jax.numpy.tanh(x),
    "onnx": lambda: ("Tanh", {}),
}, flops=4.0)


# -- the public functions ----------------------------------------------------------------------------

@ADD.function
def add(a: ArrayLike, b: ArrayLike, *, activation: str | None = None, device: DeviceLike = None) -> Tensor:
    """``a + b`` elementwise with NumPy broadcasting, as ``torch.add``, then ``activation``: one
    kernel computes ``activation(a + b)`` (``add(out, identity, activation="relu")`` is
    ``torch.nn.functional.relu(out + identity)`` in one pass over the data).

    Args:
        a: a Tensor, a native device array, host data, or a Python int / float (weak: it takes
            the other operand's dtype, so ``add(t16, 1.0)`` stays float16).
        b: the same kinds as ``a``; the two broadcast as NumPy.
        activation: None, ``"relu"``, ``"gelu"`` (exact, erf), ``"gelu_tanh"`` (the tanh
            approximation) or ``"silu"``: applied to each sum as the kernel writes it (float16
            sums are activated before their one rounding).
        device: run here.

    Returns:
        A Tensor of the broadcast shape, in the operands' common dtype.

    Raises:
        ShapeError: shapes that do not broadcast.
        DtypeError: integer or bool operands.
        AttributeValueError: an unknown activation.
        DeviceMismatchError: operands on different devices.
    """


@SUB.function
def sub(a: ArrayLike, b: ArrayLike, *, activation: str | None = None, device: DeviceLike = None) -> Tensor:
    """``a - b`` elementwise with NumPy broadcasting, as ``torch.sub``, then ``activation`` in the
    same kernel. Arguments and errors as :func:`add`."""


@MUL.function
def mul(a: ArrayLike, b: ArrayLike, *, activation: str | None = None, device: DeviceLike = None) -> Tensor:
    """``a * b`` elementwise with NumPy broadcasting, as ``torch.mul``, then ``activation`` in the
    same kernel. Arguments and errors as :func:`add`."""


@DIV.function
def div(a: ArrayLike, b: ArrayLike, *, activation: str | None = None, device: DeviceLike = None) -> Tensor:
    """``a / b`` elementwise with NumPy broadcasting, as ``torch.div`` (true division), then
    ``activation`` in the same kernel. Division by zero gives ``inf`` or ``nan`` as IEEE 754 says,
    with no error. Arguments and errors as :func:`add`."""


@NEG.function
def neg(x: ArrayLike, *, device: DeviceLike = None) -> Tensor:
    """``-x`` elementwise, as ``torch.neg`` (the Tensor's unary minus).

    Raises:
        DtypeError: integer input or a dtype no kernel on the device computes.
    """


@RELU.function
def relu(x: ArrayLike, *, device: DeviceLike = None) -> Tensor:
    """``max(x, 0)`` elementwise, as ``torch.nn.functional.relu`` (NaN stays NaN).

    Args:
        x: any shape: a Tensor, a native device array or host data.
        device: run here.

    Returns:
        A Tensor of ``x``'s shape and dtype.

    Raises:
        DtypeError: integer input or a dtype no kernel on the device computes.
    """


@GELU.function
def gelu(x: ArrayLike, approximate: str = "none", *, device: DeviceLike = None) -> Tensor:
    """``x * Phi(x)`` elementwise, as ``torch.nn.functional.gelu``.

    Args:
        x: any shape: a Tensor, a native device array or host data.
        approximate: ``"none"`` (exact, with ``erf``) or ``"tanh"`` (the tanh approximation).
        device: run here.

    Returns:
        A Tensor of ``x``'s shape and dtype.

    Raises:
        AttributeValueError: another ``approximate``.
        DtypeError: integer input or a dtype no kernel on the device computes.
    """


@SILU.function
def silu(x: ArrayLike, *, device: DeviceLike = None) -> Tensor:
    """``x * sigmoid(x)`` elementwise, as ``torch.nn.functional.silu``. Errors as :func:`relu`."""


@SIGMOID.function
def sigmoid(x: ArrayLike, *, device: DeviceLike = None) -> Tensor:
    """``1 / (1 + exp(-x))`` elementwise, as ``torch.sigmoid``. Errors as :func:`relu`."""


@TANH.function
def tanh(x: ArrayLike, *, device: DeviceLike = None) -> Tensor:
    """``tanh(x)`` elementwise, as ``torch.tanh``. Errors as :func:`relu`."""
