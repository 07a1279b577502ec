"""The records a backend hands to the runtime: :class:`Problem` and :class:`Kernel`.

A :class:`Problem` is what the selector keys on: the operator, the device, and the exact
operands (shapes, dtypes, strides) and attributes of one call. A :class:`Kernel` is one way to
solve problems of one operator on one device kind.

Registration reads like a table; a backend's ``opruntime_kernels`` hook returns, e.g.::

    Kernel("matmul", "numpy.matmul.blas", "cpu", FLOATS, run=matmul_blas, cost=gemm_cost)
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

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
        device: the device name the call runs on (``"cuda:0"``).
        shapes: each operand's shape, after the frontend's normalisation (see each op's module:
            matmul operands are at least 2-D; conv2d input is 4-D; a missing bias is absent).
        dtypes: each operand's dtype name; the frontend has already cast operands to the
            computation dtype, so they are all equal.
        strides: each operand's strides in elements, or ``None`` where the array type has none.
        attrs: the normalised attributes (conv2d: ``stride``, ``padding`` as 4 ints top, bottom,
            left, right, ``dilation``, ``groups``, ``bias``; softmax: ``axis`` as a
            non-negative int).
        out_shape: the result's shape.
        out_dtype: the result's dtype name.

    Kernels never see an empty problem: the frontend answers size-0 results itself.
    """

    op: str
    device: str
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


def c_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """C-contiguous strides in elements for ``shape``."""
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


def _always(problem: Problem) -> bool:
    return True


@dataclass(frozen=True, eq=False)
class Kernel:
    """One implementation of one operator for one device kind.

    Attributes:
        op: the operator it implements (``"matmul"``, ``"conv2d"``, ``"softmax"``,
            ``"log_softmax"``).
        name: unique dotted name ``backend.op.variant`` (``"cupy.matmul.tiled_128x128"``);
            the name users pin in configuration.
        device_kind: the device kind it runs on (``"cuda"``); may be a kind another plugin
            provides.
        dtypes: the computation dtypes it supports (names, e.g. ``FLOATS``).
        run: ``run(problem, config, *arrays) -> array``. ``arrays`` are native device arrays
            in the problem's operand order; ``config`` is one entry of ``configs``. It returns
            a new native array of ``problem.out_shape`` and ``problem.out_dtype``.
        supports: ``supports(problem) -> bool``: whether it can solve this problem (beyond
            op, device kind and dtype, which the selector checks itself).
        cost: ``cost(problem, config) -> seconds``: a heuristic estimate used to rank
            candidates when nothing is tuned; lower wins.
        configs: tunable parameter sets; the heuristic uses the first, the tuner times them all.
            ``config_for(problem)`` may narrow them per problem.
        prepare: optional ``prepare(problem, config) -> launch``: what ``run`` would look up on
            every call, done once. ``launch(*arrays)`` must return what ``run(problem, config,
            *arrays)`` returns and raise what it raises. The plan calls it after ``run`` first
            succeeded on the problem (so compiling stays in ``run``); without it the plan calls
            ``run`` with the problem and config bound.
        vendor: True for vendor-library baselines (cuBLAS, XLA's own ops).
        source: the device source text or anything that identifies the implementation
            version; its hash invalidates tuning results when the kernel changes.
    """

    op: str
    name: str
    device_kind: str
    dtypes: frozenset[str]
    run: Callable[..., Any]
    supports: Callable[[Problem], bool] = _always
    cost: Callable[[Problem, Mapping[str, Any]], float] | None = None
    configs: tuple[Mapping[str, Any], ...] = ({},)
    config_for: Callable[[Problem], Sequence[Mapping[str, Any]]] | None = None
    prepare: Callable[[Problem, Mapping[str, Any]], Callable[..., Any]] | None = None
    vendor: bool = False
    source: str = ""

    def candidates(self, problem: Problem) -> Sequence[Mapping[str, Any]]:
        """The configs that apply to ``problem``."""
        return self.config_for(problem) if self.config_for else self.configs

    def estimate(self, problem: Problem, config: Mapping[str, Any]) -> float:
        """The cost estimate in seconds (``inf`` when the kernel gives none)."""
        return self.cost(problem, config) if self.cost else math.inf

    @property
    def source_hash(self) -> str:
        """A short hash of ``source`` and ``name`` for cache keys."""
        return hashlib.sha256(f"{self.name}\n{self.source}".encode()).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"Kernel({self.name!r}, {self.op}, {self.device_kind}, {sorted(self.dtypes)})"


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
