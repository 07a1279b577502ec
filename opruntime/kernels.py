"""The records a backend hands to the runtime: :class:`Problem` and :class:`Kernel`.

A :class:`Problem` is what the selector keys on: the operator, the device, and the exact
operands (shapes, dtypes, strides) and attributes of one call. A :class:`Kernel` is one way to
solve problems of one operator on one device kind.

Registration reads like a table; a backend's ``opruntime_kernels`` hook returns, e.g.::

    Kernel("matmul", "numpy.matmul.blas", "cpu", FLOATS, run=matmul_blas, cost=gemm_cost)
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import math
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .lru import LRU

if TYPE_CHECKING:
    from .devices import Device

#: The floating dtypes of NumPy. bfloat16 is named by string: NumPy itself lacks it.
FLOATS = frozenset({"float16", "float32", "float64"})


class Attrs(dict):
    """A read-only, hashable dict of an operator's normalised attributes."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))

    def _readonly(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("Problem attributes are read-only")

    __setitem__ = __delitem__ = update = pop = clear = setdefault = _readonly  # type: ignore

    def __repr__(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self.items())


@dataclass(frozen=True)
class Problem:
    """One call of an operator, as the selector and the kernels see it.

    Attributes:
        op: operator name (``"matmul"``).
        device: the :class:`~opruntime.devices.Device` the call runs on; its ``provider`` is the
            backend's :class:`~opruntime.hookspecs.DeviceProvider` (kernels take everything they
            need about the device from it, never from parsing its name).
        shapes: each operand's shape, after the frontend's normalisation (see each op's module:
            matmul operands are at least 2-D; conv2d input is 4-D; a missing bias is absent).
        dtypes: each operand's dtype name; the frontend has already cast operands to the
            computation dtype, so they are all equal, except a boolean mask operand (an operator's
            ``masks``: attention's ``attn_mask``), which stays ``"bool"``.
        strides: each operand's strides in elements, or ``None`` where the array type has none.
        attrs: the normalised attributes (conv2d: ``stride``, ``padding`` as 4 ints top, bottom,
            left, right, ``dilation``, ``groups``, ``bias``; softmax: ``axis`` as a
            non-negative int).
        out_shape: the result's shape.
        out_dtype: the result's dtype name.

    Kernels never see an empty problem: the frontend answers size-0 results itself.
    """

    op: str
    device: Device
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    strides: tuple[tuple[int, ...] | None, ...]
    attrs: Attrs = field(default_factory=Attrs)
    out_shape: tuple[int, ...] = ()
    out_dtype: str = "float32"

    @property
    def dtype(self) -> str:
        """The computation dtype (all operands share it)."""
        return self.out_dtype

    @property
    def contiguous(self) -> bool:
        """True when every operand is C-contiguous (or has no strides to speak of)."""
        return all(s is None or s == c_strides(shape) for shape, s in zip(self.shapes, self.strides))

    @property
    def key(self) -> str:
        """A stable text key for persistent caches (no device: the cache is per device)."""
        parts = [self.op, repr(self.shapes), ",".join(self.dtypes), repr(self.strides)]
        parts.append(repr(sorted(self.attrs.items())))
        return "|".join(parts)

    def __str__(self) -> str:
        ops = " x ".join(f"{'x'.join(map(str, s)) or 'scalar'}" for s in self.shapes)
        attrs = f" ({self.attrs!r})" if self.attrs else ""
        return f"{self.op} {ops} {self.out_dtype}{attrs}"

    def __repr__(self) -> str:
        return f"Problem({self} on {self.device})"


def c_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """C-contiguous strides in elements for ``shape``."""
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


class Refusal(str):
    """A ``supports`` answer that is false but says why (a reason string whose truth value is
    False): the selector sees a refusal, a person reading ``explain`` sees the reason."""

    def __bool__(self) -> bool:
        return False


def _always(problem: Problem) -> bool:
    return True


@dataclass(frozen=True, eq=False)
class Kernel:
    """One implementation of one operator for one device kind.

    A kernel gives ``run`` (a plain function called with the problem on every call) or
    ``prepare`` (called once per problem and config; returns the launcher that every call of that
    problem then runs), or both. ``prepare`` is where a kernel keeps what it would otherwise look
    up per call (compiled code, grid, scalar arguments, a jitted function): the runtime keeps the
    launchers it returns in one bounded cache (:func:`launcher`), so backends keep no per-problem
    caches of their own.

    Attributes:
        op: the operator it implements (``"matmul"``; ``opruntime.ops.OPS`` lists them).
        name: unique dotted name ``plugin.op.variant`` (``"cupy.matmul.simt"``), in the
            namespace of the plugin that registers it; the name users pin in configuration.
        device_kind: the device kind it runs on (``"cuda"``); may be a kind another plugin
            provides.
        dtypes: the computation dtypes it supports (names, e.g. ``FLOATS``).
        run: ``run(problem, config, *arrays) -> array``. ``arrays`` are native device arrays
            in the problem's operand order; ``config`` is one entry of ``configs``. It returns
            a new native array of ``problem.out_shape`` and ``problem.out_dtype``.
        prepare: ``prepare(problem, config) -> launch``, ``launch(*arrays) -> array`` as ``run``.
            Compiling happens here: an error raised here counts as the kernel failing on the
            problem (the selector runs the next candidate).
        supports: ``supports(problem) -> bool``: whether it can solve this problem (beyond
            op, device kind and dtype, which the selector checks itself).
        cost: ``cost(problem, config) -> seconds``: a heuristic estimate used to rank
            candidates when nothing is tuned; lower wins.
        configs: tunable parameter sets (plain JSON data); the heuristic uses the first, the tuner
            times them all. ``config_for(problem)`` may narrow them per problem.
        vendor: True for vendor-library baselines (cuBLAS, XLA's own ops).
        source: the device source text or anything that identifies the implementation
            version; its hash invalidates tuning results when the kernel changes.
        notes: ``notes(problem) -> str``: a note ``explain`` shows beside the candidate (e.g. a
            compiled kernel's compile time), "" for none.
    """

    op: str
    name: str
    device_kind: str
    dtypes: frozenset[str]
    run: Callable[..., Any] | None = None
    supports: Callable[[Problem], bool] = _always
    cost: Callable[[Problem, Mapping[str, Any]], float] | None = None
    configs: tuple[Mapping[str, Any], ...] = ({},)
    config_for: Callable[[Problem], Sequence[Mapping[str, Any]]] | None = None
    prepare: Callable[[Problem, Mapping[str, Any]], Callable[..., Any]] | None = None
    vendor: bool = False
    source: str = ""
    notes: Callable[[Problem], str] | None = None

    def __post_init__(self) -> None:
        if self.run is None and self.prepare is None:
            raise TypeError(f"Kernel {self.name!r}: give run=, prepare= or both")

    def candidates(self, problem: Problem) -> Sequence[Mapping[str, Any]]:
        """The configs that apply to ``problem``."""
        return self.config_for(problem) if self.config_for else self.configs

    def estimate(self, problem: Problem, config: Mapping[str, Any]) -> float:
        """The cost estimate in seconds (``inf`` when the kernel gives none)."""
        return self.cost(problem, config) if self.cost else math.inf

    def launcher(self, problem: Problem, config: Mapping[str, Any]) -> Callable[..., Any]:
        """``launch(*arrays)`` for ``problem`` and ``config``: what ``prepare`` returned (kept in
        the runtime's one bounded launch cache, :data:`LAUNCHES`), or ``run`` bound to them."""
        key = (self, problem, frozen(config))
        launch = LAUNCHES.get(key)
        if launch is None:
            if self.prepare is not None:
                launch = self.prepare(problem, config)
            else:
                launch = functools.partial(self.run, problem, config)  # type: ignore[arg-type]
            LAUNCHES[key] = launch
        return launch

    def __call__(self, problem: Problem, config: Mapping[str, Any], *arrays: Any) -> Any:
        """Solve ``problem`` once: ``launcher(problem, config)(*arrays)``."""
        return self.launcher(problem, config)(*arrays)

    @property
    def plugin(self) -> str:
        """The namespace of the name: the plugin that registers the kernel."""
        return self.name.split(".", 1)[0]

    @property
    def source_hash(self) -> str:
        """A short hash of ``source`` and ``name`` for cache keys."""
        return hashlib.sha256(f"{self.name}\n{self.source}".encode()).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"Kernel({self.name!r}, {self.op}, {self.device_kind}, {sorted(self.dtypes)})"


#: The launchers :meth:`Kernel.launcher` made, by (kernel, problem, config): the one launch cache.
LAUNCHES = LRU("prepared launches")


def frozen(value: Any) -> Any:
    """``value`` (a config: plain JSON data) as a hashable key."""
    if isinstance(value, Mapping):
        return tuple(sorted((k, frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(frozen(v) for v in value)
    return value


def families(package: str) -> list[Any]:
    """The kernel families of a backend package: each of its modules that defines ``kernels()``
    (one module per operator family, ``softmax.py``, ``norm.py``...), imported in name order.

    A backend's hooks gather from these, so adding a family is adding its module::

        FAMILIES = families(__name__)  # in the backend's __init__.py
    """
    path = importlib.import_module(package).__path__
    found = []
    for info in sorted(pkgutil.iter_modules(path), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package}.{info.name}")
        if callable(getattr(module, "kernels", None)):
            found.append(module)
    return found



def strided_run(dims: Sequence[tuple[int, int]]) -> tuple[int, int] | None:
    """(size, stride) of (size, stride) dims (outermost first) merged into one strided run, size-1
    dims ignored; ``(1, 0)`` for none, and None when they do not form one run."""
    dims = [(n, s) for n, s in dims if n != 1]
    if not dims:
        return 1, 0
    size, stride = dims[-1]
    for n, s in reversed(dims[:-1]):
        if s != stride * size:
            return None
        size *= n
    return size, stride


def reduction_layout(shape: Sequence[int], strides: Sequence[int], axes: Sequence[int]) -> tuple[int, ...] | None:
    """``(outer, n, inner, so, sn, si)``: an input of ``shape`` / element ``strides`` reduced over
    ``axes``, seen as ``outer x n x inner`` elements with one element stride each (``n`` reduced;
    a missing part is 1 with stride 0), or None when the layout does not collapse so (reduced
    axes apart, or dims that do not merge). Reduced dims merge in any order, kept dims in theirs."""
    red = sorted(((n, s) for i, (n, s) in enumerate(zip(shape, strides)) if i in axes and n != 1),
                 key=lambda d: -abs(d[1]))
    n_run = strided_run(red)
    live = [i for i in axes if shape[i] != 1]
    first, last = (min(live), max(live)) if live else (len(shape), len(shape) - 1)
    if n_run is None or any(i not in axes and shape[i] != 1 for i in range(first, last + 1)):
        return None
    outer = strided_run([(shape[i], strides[i]) for i in range(first)])
    inner = strided_run([(shape[i], strides[i]) for i in range(last + 1, len(shape))])
    if outer is None or inner is None:
        return None
    return outer[0], n_run[0], inner[0], outer[1], n_run[1], inner[1]


def reduction_plan(problem: Problem) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """What a reduction kernel reads for ``problem`` (``attrs["axis"]`` the reduced axes):
    :func:`reduction_layout` of its operand, and None; or, when that does not collapse, the
    layout of a transposed contiguous copy (kept axes, then reduced) and that transpose."""
    shape, axes = problem.shapes[0], problem.attrs["axis"]
    lay = reduction_layout(shape, problem.strides[0] or c_strides(shape), axes)
    if lay is not None:
        return lay, None
    kept = tuple(i for i in range(len(shape)) if i not in axes)
    outer, n = math.prod(shape[i] for i in kept), math.prod(shape[i] for i in axes)
    return (outer, n, 1, n, 1, 0), kept + tuple(axes)

def roofline(flops: float, nbytes: float, flops_per_s: float, bytes_per_s: float, launch: float = 0.0) -> float:
    """A simple roofline estimate in seconds: the larger of compute and memory time plus launch."""
    return max(flops / flops_per_s, nbytes / bytes_per_s) + launch


def itemsize(dtype: str) -> int:
    """Bytes per element of a dtype name (bfloat16 included)."""
    return 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize


def np_dtype(name: str) -> np.dtype:
    """The NumPy dtype of a dtype name; ``bfloat16`` through ml_dtypes (imported on demand)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)
