"""Scale-out: one operator spread over several devices of one kind (``opr.mesh``).

The design, in the order a call meets it:

**The mesh.** ``m = opr.mesh(["jax:cpu:0", ..., "jax:cpu:7"], axis=0)`` is a :class:`Mesh`: an
ordered list of distinct devices of one kind (all ``jax``, or all ``cuda``; a one-device mesh of
any kind, ``opr.mesh(["cpu"])``, works too) and a default split axis. It is accepted wherever a
device is: ``device=m`` on operators, ``opr.tensor(x, device=m)``, ``with opr.device(m)``. Two
meshes over the same devices are the same place (the axis only says how data is placed).

**Mesh tensors.** A :class:`MeshTensor` is one piece per member, each an ordinary
:class:`~opruntime.tensor.Tensor` on that member, and a layout: *split* along one axis (piece
``i`` holds a contiguous block of that axis) or *replicated* (every member holds all of it). Data
placed on a mesh is split along the mesh's ``axis`` (``0``: the first axis, ``-1`` or ``1`` for a
matrix: its columns); uneven sizes are split as ``np.array_split`` does (the first ``n % N``
members hold one more; a member may hold an empty piece), with per-device arrays, so nothing is
padded. ``m.replicate(x)`` replicates, ``m.shard(x, axis=...)`` splits along another axis; a 0-D
value is always replicated. ``.numpy()`` gathers; ``.shape``, ``.dtype``, ``.device`` (the mesh)
read like a Tensor's.

**Operands.** An operator called with mesh tensors (or ``device=m``, or host data inside ``with
opr.device(m)``) takes host data as replicated (weights, biases, scalars), except that when no
operand is on the mesh yet the first one is split along the mesh's axis. A single-device Tensor
among mesh operands is a :class:`~opruntime.errors.DeviceMismatchError`, as ever.

**Sharding rules** (:data:`RULES`, one per operator; the strategy names are :class:`Strategy`'s):

* matmul: ``a`` split on its rows (or a batch dim) with ``b`` replicated -> split rows; ``a``
  replicated with ``b`` split on its columns -> split columns; ``a`` split on K (its last axis,
  e.g. ``opr.mesh(devs, axis=-1)``) with ``b`` split on K (its first axis) in the same counts ->
  each member multiplies its blocks and the engine's all-reduce sums the partial products
  (``"sum"``: NCCL ``allReduce``, XLA's ``psum``); the result is replicated;
* conv2d, the pools, batch_norm: by batch; linear, layer_norm, rms_norm: by any leading (not
  normalised / not contracted) axis; softmax and log_softmax: by any axis but the softmax one;
  the reductions: by an axis not reduced; the elementwise family: by any axis (the other operand
  split alike, or replicated and broadcast along it); attention: by batch or by heads (q, k and
  v split alike);
* every operand replicated: every member computes the whole (``"replicated"``);
* anything else (softmax along the split axis, a weight that is split, unequal counts): the
  pieces are gathered on the first member, which computes the whole (``"whole"``).

**Selection.** Sharding is a candidate, not a given: for ``"shards"`` and ``"sum"`` the mesh
compares the estimated time of the sharded call (the slowest member's piece, from the kernels'
own cost models as the selector ranks them, plus :data:`DISPATCH` per member for the host's
work, plus the all-reduce over the engine's link: ``2 (N-1)/N`` of the result's bytes at its
bandwidth, and its latency) with running the whole problem on the first member (its estimate
plus moving the other members' pieces there). The cheaper wins, so a 64x64 matmul on a mesh runs
on one device. A result computed whole on the first member stays there: it is split along its
first axis with every row on the first member and empty pieces on the others (a 0-D result is
replicated). ``opr.explain`` shows the strategy, both estimates and the kernel chosen per piece.

**Engines.** A mesh of several devices needs its backend's engine
(:meth:`~opruntime.hookspecs.DeviceProvider.mesh_engine`): JAX builds a ``jax.sharding.Mesh``
and sums with ``psum`` in ``shard_map``; CUDA keeps one NCCL communicator per mesh. Each member
runs its piece through the ordinary operator path, so every piece gets the kernel the selector
picks for it on its device; devices run asynchronously, so the members work at once.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import config, selector
from . import tensor as _tensor
from .config import settings
from .devices import Device
from .errors import AttributeValueError, DeviceError, DeviceMismatchError
from .kernels import itemsize
from .lru import LRU
from .ops import base
from .ops.base import Operator, result_dtype
from .ops.linear import RESIDUAL_ONLY
from .plugins import reset_listeners
from .tensor import Tensor, host_array

#: seconds of host work per member and call (validation, plan lookup, launch): what sharding
#: costs even when the pieces are tiny. Measured order of magnitude of one opruntime call.
DISPATCH = 20e-6
#: ``Mesh(policy=)``: when a call is sharded
POLICIES = ("auto", "always")
#: a nominal machine (FLOP/s, bytes/s) for problems no kernel estimates
NOMINAL = (1e11, 1e10)


class Mesh:
    """Several devices of one kind acting as one: see the module doc.

    Args:
        devices: device names or :class:`~opruntime.devices.Device` handles, distinct, of one kind.
        axis: the axis data placed on the mesh is split along (``0``: the first; ``-1``: the last).
        policy: ``"auto"`` (shard a call only when it is estimated faster than one device) or
            ``"always"`` (shard whenever a rule allows: benchmarks, tests).

    Raises:
        DeviceError: an empty list, a device listed twice, devices of several kinds, or several
            devices of a kind with no collective engine.
    """

    __slots__ = ("members", "axis", "kind", "policy", "_engine")
    spans_devices = True  # how config.device and the hooks tell a mesh from a device name

    def __init__(self, devices: Sequence[str | Device], axis: int = 0, policy: str = "auto") -> None:
        if isinstance(devices, (str, Device)) or not isinstance(devices, Sequence) or not devices:
            raise DeviceError(f"mesh: devices must be a non-empty list of device names, e.g. "
                              f"['jax:cpu:0', 'jax:cpu:1']; got {devices!r}")
        if not isinstance(axis, int) or isinstance(axis, bool):
            raise AttributeValueError(f"mesh: axis must be an int (0: split the first axis, -1: the last); "
                                      f"got {axis!r}")
        if policy not in POLICIES:
            raise AttributeValueError(f"mesh: policy must be one of {', '.join(map(repr, POLICIES))}; got {policy!r}")
        members = tuple(Device(d) for d in devices)
        names = [d.name for d in members]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise DeviceError(f"mesh: {', '.join(twice)} listed more than once; a mesh lists distinct devices")
        kinds = sorted({d.kind for d in members})
        if len(kinds) > 1:
            raise DeviceError(f"mesh: the devices must be of one kind; got {', '.join(kinds)} "
                              f"({', '.join(names)}). Use all jax devices or all cuda devices")
        self.members, self.axis, self.kind, self.policy = members, axis, kinds[0], policy
        self._engine: Any = None
        if len(members) > 1:
            self.engine  # noqa: B018  (refuse a kind without an engine now, not at the first call)

    @property
    def engine(self) -> Any:
        """The backend's :class:`~opruntime.hookspecs.MeshEngine` for these members, made once
        per list of members (meshes over the same devices share it: one NCCL communicator)."""
        if self._engine is None:
            engine = ENGINES.get(self.names)
            if engine is None:
                providers = [d.provider for d in self.members]
                engine = providers[0].mesh_engine(providers)
                if engine is None:
                    if len(providers) > 1:
                        raise DeviceError(f"mesh: {self.kind} devices have no collective engine, so a mesh of "
                                          f"several is not possible ({', '.join(self.names)}); use jax or cuda "
                                          f"devices, or a one-device mesh")
                    engine = _Alone()
                ENGINES[self.names] = engine
            self._engine = engine
        return self._engine

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.members)

    @property
    def name(self) -> str:
        """``mesh(jax:cpu:0,jax:cpu:1)``: the members, for messages and ``explain``."""
        return f"mesh({','.join(self.names)})"

    def __len__(self) -> int:
        return len(self.members)

    def __iter__(self) -> Iterator[Device]:
        return iter(self.members)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mesh) and other.names == self.names

    def __hash__(self) -> int:
        return hash(self.names)

    def __repr__(self) -> str:
        policy = "" if self.policy == "auto" else f", policy={self.policy!r}"
        return f"Mesh({list(self.names)!r}, axis={self.axis}{policy})"

    __str__ = __repr__

    def placing(self) -> contextlib.AbstractContextManager[Mesh]:
        """``with opr.device(mesh):``: host data of the block is placed on the mesh (this thread
        / task only)."""
        return _placing(self)

    # -- placing data -----------------------------------------------------------------------
    def shard(self, data: Any, axis: int | None = None, dtype: Any = None) -> MeshTensor:
        """``data`` (host data, a Tensor or a mesh tensor) split along ``axis`` (default: the
        mesh's) over the members, through the host."""
        host = _host("mesh.shard", data)
        if host.ndim == 0:
            return self.replicate(host, dtype)
        ax = _axis("mesh.shard", self.axis if axis is None else axis, host.ndim)
        bounds = np.cumsum([0, *counts(host.shape[ax], len(self))])
        pieces = [_piece(host[(slice(None),) * ax + (slice(lo, hi),)], dev, dtype)
                  for dev, lo, hi in zip(self.members, bounds[:-1], bounds[1:])]
        return MeshTensor._make(self, pieces, ax)

    def replicate(self, data: Any, dtype: Any = None) -> MeshTensor:
        """``data`` copied whole onto every member (weights, biases: what every piece needs)."""
        host = _host("mesh.replicate", data)
        return MeshTensor._make(self, [_piece(host, dev, dtype) for dev in self.members], None)


class _Alone:
    """The engine of a one-device mesh of a kind without one: nothing to move, nothing to sum."""

    bandwidth, latency = math.inf, 0.0

    def move(self, data: Any, provider: Any) -> Any:
        return data

    def all_reduce(self, datas: Sequence[Any]) -> list[Any]:
        return list(datas)


def mesh(devices: Sequence[str | Device], axis: int = 0, policy: str = "auto") -> Mesh:
    """Several devices of one kind, usable wherever a device is: one operator spread over them.

    Args:
        devices: distinct devices of one kind: ``["jax:cpu:0", ..., "jax:cpu:7"]``, ``["cuda:0",
            "cuda:1"]`` (a one-device mesh of any kind works too).
        axis: the axis data placed on the mesh is split along: ``0`` (rows, batch; the default) or
            ``-1`` (columns: with ``b`` split on rows, a matmul sharded along K).
        policy: ``"auto"`` (the default: shard a call only when estimated faster than one device)
            or ``"always"``.

    Example:
        >>> m = opr.mesh(["cuda:0", "cuda:1"])
        >>> y = opr.matmul(opr.tensor(a, device=m), b)   # a's rows over both GPUs, b on each
        >>> y.numpy()                                     # gathered
    """
    return Mesh(devices, axis, policy)


def counts(n: int, parts: int) -> list[int]:
    """How ``n`` rows are split over ``parts`` members: as ``np.array_split`` (the first
    ``n % parts`` members hold one more)."""
    return [n // parts + (i < n % parts) for i in range(parts)]


class MeshTensor:
    """A tensor spread over a :class:`Mesh`: one :class:`~opruntime.tensor.Tensor` per member
    (``pieces``), split along ``axis`` or replicated (``axis`` None). Immutable, as a Tensor;
    ``numpy()`` gathers a copy on the host."""

    __slots__ = ("_mesh", "_pieces", "_axis", "_shape")

    @classmethod
    def _make(cls, where: Mesh, pieces: Sequence[Tensor], axis: int | None) -> MeshTensor:
        t = object.__new__(cls)
        t._mesh, t._pieces, t._axis = where, tuple(pieces), axis
        shape = list(pieces[0].shape)
        if axis is not None:
            shape[axis] = sum(p.shape[axis] for p in pieces)
        t._shape = tuple(shape)
        return t

    @property
    def device(self) -> Mesh:
        """The mesh the pieces live on."""
        return self._mesh

    @property
    def pieces(self) -> tuple[Tensor, ...]:
        """One Tensor per member, in the mesh's order."""
        return self._pieces

    @property
    def axis(self) -> int | None:
        """The axis the pieces split (None: every member holds all of it)."""
        return self._axis

    @property
    def counts(self) -> tuple[int, ...] | None:
        """Each member's extent along :attr:`axis` (None when replicated)."""
        return None if self._axis is None else tuple(p.shape[self._axis] for p in self._pieces)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> np.dtype:
        return self._pieces[0].dtype

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def size(self) -> int:
        return math.prod(self._shape)

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d MeshTensor")
        return self._shape[0]

    def numpy(self) -> np.ndarray:
        """The values gathered on the host (a new array)."""
        if self._axis is None:
            return np.array(self._pieces[0].numpy())
        return np.concatenate([p.numpy() for p in self._pieces], axis=self._axis)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        out = self.numpy()
        return out if dtype is None else out.astype(dtype)

    def to(self, device: Any) -> MeshTensor | Tensor:
        """Gathered onto one device, or laid out on another mesh (through the host)."""
        if isinstance(device, Mesh):
            return self if device == self._mesh else device.shard(self)
        return Tensor(self.numpy(), device=device)

    def layout(self) -> str:
        """``split along 0 (2, 2, 1)`` or ``replicated``."""
        if self._axis is None:
            return "replicated"
        return f"split along {self._axis} {self.counts}"

    def __repr__(self) -> str:
        return (f"MeshTensor(shape={self._shape}, dtype={self.dtype}, device={self._mesh.name!r}, "
                f"{self.layout()})")

    # the arithmetic, through the operators (as a Tensor's)
    def __add__(self, o: Any) -> Any: return _op("add")(self, o)
    def __radd__(self, o: Any) -> Any: return _op("add")(o, self)
    def __sub__(self, o: Any) -> Any: return _op("sub")(self, o)
    def __rsub__(self, o: Any) -> Any: return _op("sub")(o, self)
    def __mul__(self, o: Any) -> Any: return _op("mul")(self, o)
    def __rmul__(self, o: Any) -> Any: return _op("mul")(o, self)
    def __truediv__(self, o: Any) -> Any: return _op("div")(self, o)
    def __rtruediv__(self, o: Any) -> Any: return _op("div")(o, self)
    def __matmul__(self, o: Any) -> Any: return _op("matmul")(self, o)
    def __rmatmul__(self, o: Any) -> Any: return _op("matmul")(o, self)
    def __neg__(self) -> Any: return _op("neg")(self)


def _op(name: str) -> Operator:
    return config.OPERATORS[name]


def _axis(op: str, axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise AttributeValueError(f"{op}: split axis {axis} is out of range for a {ndim}-D tensor; give an axis in "
                                  f"[{-ndim}, {ndim}) (mesh(..., axis=) or mesh.shard(x, axis=))")
    return axis % ndim


def _host(op: str, data: Any) -> np.ndarray:
    if isinstance(data, (MeshTensor, Tensor)):
        return data.numpy()
    return host_array(op, data)


def _piece(host: np.ndarray, dev: Device, dtype: Any) -> Tensor:
    return Tensor(host, device=dev, dtype=dtype)


# -- the hooks: opr.tensor, the operators, explain, opr.device ------------------------------------------
def _spread(op: str, data: Any, device: Any, dtype: Any) -> MeshTensor | Tensor | None:
    """``opr.tensor(data, device, dtype)`` when a mesh is involved (``tensor.spread``), else None."""
    if device is None:
        if data.__class__ is MeshTensor:
            if dtype is None:
                return data
            return MeshTensor._make(data.device, [Tensor(p, dtype=dtype) for p in data.pieces], data.axis)
        device = config.placement.get()
        if device is None or isinstance(data, Tensor):
            return None
    if isinstance(device, Mesh):
        if data.__class__ is MeshTensor and data.device == device and dtype is None:
            return data
        return device.shard(data, dtype=dtype)
    if data.__class__ is MeshTensor:
        return Tensor(data.numpy(), device=device, dtype=dtype)
    return None


def _mesh_of(op: Operator, inputs: Sequence[Any], device: Any) -> Mesh | None:
    """The mesh a call runs on, or None when it involves none."""
    found: Mesh | None = None
    for x in inputs:
        if x.__class__ is MeshTensor:
            if found is not None and x.device != found:
                raise DeviceMismatchError(f"{op.name}: operands live on different meshes ({found.name} and "
                                          f"{x.device.name}); lay them out on one with mesh.shard / mesh.replicate")
            found = x.device
    if isinstance(device, Mesh):
        if found is not None and device != found:
            raise DeviceMismatchError(f"{op.name}: device={device.name} was asked but the operands live on "
                                      f"{found.name}; move them with .to(mesh) first")
        return device
    if found is None and device is None:
        where = config.placement.get()
        if where is not None and any(x is not None and not isinstance(x, Tensor) for x in inputs):
            return where
    if found is not None and device is not None:
        raise DeviceMismatchError(f"{op.name}: device={str(device)!r} was asked but the operands live on "
                                  f"{found.name}; gather them first with .to({str(device)!r})")
    return found


def _operands(op: Operator, where: Mesh, inputs: Sequence[Any]) -> list[MeshTensor]:
    """Every operand on ``where``: host data replicated (the first operand split when none is on
    the mesh yet); a single-device Tensor refused."""
    lead = not any(x.__class__ is MeshTensor for x in inputs)
    out = []
    for i, x in enumerate(inputs):
        if x.__class__ is MeshTensor:
            out.append(x)
        elif isinstance(x, Tensor):
            name = op.operands[i] if i < len(op.operands) else f"operand {i}"
            raise DeviceMismatchError(f"{op.name}: {name} lives on {x.device.name!r}, the other operands on "
                                      f"{where.name}; put it on the mesh with opr.tensor(x, device=mesh) or "
                                      f"mesh.replicate(x) (opruntime never copies between devices silently)")
        elif i == 0 and lead:
            out.append(where.shard(x))
        else:
            out.append(where.replicate(x))
    return out


def run(op: Operator, inputs: tuple[Any, ...], device: Any, attrs: tuple) -> MeshTensor | None:
    """The operator's call when a mesh is involved (``ops.base`` calls it on its slow path), else
    None. ``attrs`` are the call's (name, value, type) triples."""
    where = _mesh_of(op, inputs, device)
    if where is None:
        return None
    operands = _operands(op, where, inputs)
    return decide(op, where, operands, attrs).run(op, where, operands, attrs)


def explain(op: Operator, inputs: tuple[Any, ...], device: Any, attrs: tuple) -> MeshExplanation | None:
    """What ``opr.explain`` shows for a call on a mesh (None when no mesh is involved)."""
    where = _mesh_of(op, inputs, device)
    if where is None:
        return None
    operands = _operands(op, where, inputs)
    plan = decide(op, where, operands, attrs)
    member = 0 if plan.kind in ("whole", "replicated") else \
        max(range(len(where)), key=lambda i: operands[0].pieces[i].size)
    shard = [x.pieces[member] for x in operands]
    if plan.kind == "whole":
        shard = [_gather(where, x) for x in operands]
    datas = [t.data for t in shard]
    dev = shard[0].device
    inner = op.plan(datas, dev, {k: v for k, v, _ in attrs}, settings())
    rows = inner.rows if inner.rows else inner.order
    chosen = inner.order[0].label if inner.order else None
    return MeshExplanation(plan, where, selector.Explanation(inner.problem, dev.name, rows, chosen, inner.why, False))


@contextlib.contextmanager
def _placing(where: Mesh) -> Iterator[Mesh]:
    token = config.placement.set(where)
    try:
        yield where
    finally:
        config.placement.reset(token)


# -- strategies -----------------------------------------------------------------------------------------
@dataclass
class Strategy:
    """How a call on a mesh runs.

    ``kind``: ``"shards"`` (each member computes its pieces; the result split along ``axis``),
    ``"sum"`` (each member a partial product, summed by the engine's all-reduce; replicated),
    ``"replicated"`` (each member computes the whole from its copies) or ``"whole"`` (the first
    member computes the whole from the gathered pieces). ``why`` says which rule chose it;
    ``sharded`` / ``single`` are the two estimates (seconds) when they were compared.
    """

    kind: str
    axis: int | None = None
    why: str = ""
    sharded: float | None = None
    single: float | None = None
    notes: list[str] = field(default_factory=list)

    def run(self, op: Operator, where: Mesh, operands: list[MeshTensor], attrs: tuple) -> MeshTensor:
        n = len(where)
        if self.kind == "whole":
            out = op.call(tuple(_gather(where, x) for x in operands), None, attrs)
            return _on_first(where, out)
        results = [op.call(tuple(x.pieces[i] for x in operands), None, attrs) for i in range(n)]
        if self.kind == "sum":
            summed = where.engine.all_reduce([r.data for r in results])
            results = [Tensor._wrap(d, dev) for d, dev in zip(summed, where.members)]
            return MeshTensor._make(where, results, None)
        return MeshTensor._make(where, results, self.axis if self.kind == "shards" else None)


def _gather(where: Mesh, x: MeshTensor) -> Tensor:
    """``x`` whole on the first member (its pieces moved there by the engine and joined)."""
    first = where.members[0]
    if x.axis is None:
        return x.pieces[0]
    parts = [p.data if i == 0 else where.engine.move(p.data, first.provider)
             for i, p in enumerate(x.pieces) if i == 0 or p.shape[x.axis]]
    data = parts[0] if len(parts) == 1 else first.provider.concat(parts, x.axis)
    return Tensor._wrap(data, first)


def _on_first(where: Mesh, t: Tensor) -> MeshTensor:
    """A result computed on the first member as a mesh tensor: split along its first axis with
    every row on the first member (a 0-D result: replicated)."""
    if t.ndim == 0:
        return MeshTensor._make(where, [t] + [Tensor._wrap(where.engine.move(t.data, d.provider), d)
                                              for d in where.members[1:]], None)
    empty = (0, *t.shape[1:])
    return MeshTensor._make(where, [t] + [Tensor._wrap(d.provider.empty(empty, t.dtype), d)
                                          for d in where.members[1:]], 0)


#: member names -> their engine (forgotten when the registry is rebuilt)
ENGINES: dict[tuple[str, ...], Any] = {}
reset_listeners.append(ENGINES.clear)
#: decisions, by call: (op, mesh, each operand's shape / dtype / layout, attributes, settings)
decisions = LRU("mesh decisions")
reset_listeners.append(decisions.clear)


def decide(op: Operator, where: Mesh, operands: list[MeshTensor], attrs: tuple) -> Strategy:
    """The strategy of one call: the operator's rule, then the cost comparison (cached)."""
    s = settings()
    key = (op.name, where, where.policy, tuple((x.shape, x.dtype.name, x.axis, x.counts) for x in operands), attrs, s)
    try:
        hit = decisions.get(key)
    except TypeError:  # an unhashable attribute: decide every time
        key, hit = None, None
    if hit is not None:
        return hit
    adict = {k: v for k, v, _ in attrs}
    masked = [i < len(op.operands) and op.operands[i] in op.masks and x.dtype == np.bool_
              for i, x in enumerate(operands)]
    dtype = result_dtype(op.name, [x.dtype for x, m in zip(operands, masked) if not m])
    dtypes = tuple("bool" if m else dtype for m in masked)
    norm = op.normalize_for([x.shape for x in operands], dtypes, dict(adict))  # the whole call, validated
    rule = RULES.get(op.name)
    lay = [Layout(x.shape, x.axis, x.counts) for x in operands]
    if all(x.axis is None for x in lay):
        plan = Strategy("replicated", why="every operand is replicated: each member computes the whole")
    elif rule is None:
        plan = Strategy("whole", why=f"{op.name} has no sharding rule")
    elif norm.trivial:
        plan = Strategy("whole", why="nothing to compute")
    else:
        plan = rule(lay, adict, len(norm.result_shape))
        if plan.kind in ("shards", "sum") and len(where) > 1 and where.policy == "auto":
            _compare(op, where, operands, adict, dtype, norm.result_shape, plan)
    if key is not None:
        decisions[key] = plan
    return plan


def _compare(op: Operator, where: Mesh, operands: list[MeshTensor], attrs: dict[str, Any], dtype: str,
             out_shape: tuple[int, ...], plan: Strategy) -> None:
    """Turn ``plan`` into ``"whole"`` when one device is estimated faster (see the module doc)."""
    engine = where.engine
    busy = [i for i in range(len(where)) if all(x.pieces[i].size for x in operands)]
    pieces = max((_estimate(op, [x.pieces[i].shape for x in operands], dtype, attrs, where.members[i])
                  for i in busy), default=0.0)
    sharded = pieces + DISPATCH * len(busy)
    if plan.kind == "sum":
        nbytes = math.prod(out_shape) * itemsize(dtype)
        sharded += engine.latency + 2 * (len(where) - 1) / len(where) * nbytes / engine.bandwidth
    moved = sum(p.size * p.dtype.itemsize for x in operands if x.axis is not None for p in x.pieces[1:])
    single = _estimate(op, [x.shape for x in operands], dtype, attrs, where.members[0]) + DISPATCH
    if moved:
        single += engine.latency + moved / engine.bandwidth
    plan.sharded, plan.single = sharded, single
    if single < sharded:
        plan.notes.append(f"rule: {plan.kind} ({plan.why})")
        plan.kind, plan.axis = "whole", None
        plan.why = f"one device is estimated faster ({single * 1e6:.1f}us against {sharded * 1e6:.1f}us sharded)"


def _estimate(op: Operator, shapes: Sequence[tuple[int, ...]], dtype: str, attrs: dict[str, Any], dev: Device) -> float:
    """The best kernel's estimate for ``op`` on ``dev`` (seconds), as the selector ranks them."""
    try:
        problem = op.problem_for(dev, shapes, dtype, **attrs)
    except Exception:  # a piece the operator cannot describe alone: no estimate (the call's path validates)
        return math.inf
    try:
        _, rows, _ = selector.rank(problem, dev, _heuristic())
        best = min((c.cost for c in rows if c.status == "ok" and math.isfinite(c.cost)), default=math.inf)
    except Exception:  # no kernel here: the whole call's own path raises the typed error
        best = math.inf
    if math.isfinite(best):
        return best
    return op.flops(problem) / NOMINAL[0] + op.bytes(problem) / NOMINAL[1]


def _heuristic() -> Any:
    """The settings in force with ``tune = "heuristic"`` (estimates only: deciding a layout never
    times kernels)."""
    with config.override(tune="heuristic") as s:
        return s


# -- the rules ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """One operand as the rules see it: its shape, split axis (None: replicated) and counts."""

    shape: tuple[int, ...]
    axis: int | None
    counts: tuple[int, ...] | None


Rule = Callable[[list[Layout], dict[str, Any], int], Strategy]


def _whole(why: str) -> Strategy:
    return Strategy("whole", why=why)


def _by(lead_dims: Callable[[int, dict[str, Any]], set[int]], what: str, aligned: Sequence[int] | None = (),
        out_axis: Callable[[int, int, dict[str, Any]], int] | None = None) -> Rule:
    """A rule for operators independent along some dims of their first operand (``lead_dims``).
    ``aligned`` operands (all when None) follow the first: split alike along the dim aligned from
    the right, or replicated and broadcast along it; the others (weights) must be replicated."""

    def rule(lay: list[Layout], attrs: dict[str, Any], out_ndim: int) -> Strategy:
        follow = [i for i in range(len(lay)) if aligned is None or i == 0 or i in aligned]
        for i, x in enumerate(lay):
            if i not in follow and x.axis is not None:
                return _whole(f"operand {i} (a weight) is split; weights must be replicated (mesh.replicate)")
        lead_i = next(i for i in follow if lay[i].axis is not None)  # some operand is split (decide)
        lead = lay[lead_i]
        from_right = len(lead.shape) - lead.axis  # the split dim, counted from the right
        for i in follow:
            x, at = lay[i], len(lay[i].shape) - from_right
            if x.axis is None:
                if at >= 0 and x.shape[at] != 1:
                    return _whole(f"operand {i} is replicated but not broadcast along the split dim; split it "
                                  f"as operand {lead_i}")
            elif x.axis != at or x.counts != lead.counts:
                return _whole(f"operands {lead_i} and {i} are split differently ({lead.axis} {lead.counts}, "
                              f"{x.axis} {x.counts})")
        nd = len(lay[0].shape)
        d = nd - from_right
        if d >= 0 and d not in lead_dims(nd, attrs):
            return _whole(f"split along dim {d}, which the operator computes across")
        axis = out_axis(d, nd, attrs) if out_axis else out_ndim - from_right
        return Strategy("shards", axis, f"by {what} (dim {d})")

    return rule


def _matmul(lay: list[Layout], attrs: dict[str, Any], out_ndim: int) -> Strategy:
    a, b = lay
    ka = None if a.axis is None else ("K" if a.axis == len(a.shape) - 1 else "M" if a.axis == len(a.shape) - 2
                                      else "batch")
    kb = None if b.axis is None else ("K" if b.axis == max(len(b.shape) - 2, 0) else "N"
                                      if b.axis == len(b.shape) - 1 else "batch")
    if ka == "M" and kb is None:
        return Strategy("shards", out_ndim - (2 if len(b.shape) >= 2 else 1), "by a's rows (b replicated)")
    if ka is None and kb == "N":
        return Strategy("shards", out_ndim - 1, "by b's columns (a replicated)")
    if ka == "K" and kb == "K":
        if a.counts != b.counts:
            return _whole(f"a and b are split along K in different counts ({a.counts} and {b.counts})")
        return Strategy("sum", None, "along K: partial products summed by the engine's all-reduce")
    if ka == "batch" and (kb is None and len(b.shape) <= 2 or kb == "batch" and len(a.shape) == len(b.shape)
                          and a.axis == b.axis and a.counts == b.counts):
        return Strategy("shards", a.axis + out_ndim - len(a.shape), f"by batch (dim {a.axis})")
    return _whole(f"no rule for a {ka or 'replicated'} x b {kb or 'replicated'} split; split a's rows with b "
                  f"replicated, b's columns with a replicated, or both along K")


def _reduced(ndim: int, attrs: dict[str, Any]) -> set[int]:
    ax = attrs.get("axis")
    if ax is None:
        return set(range(ndim))
    return {int(a) % ndim for a in (ax if isinstance(ax, tuple) else (ax,))}


def _reduced_out(d: int, ndim: int, attrs: dict[str, Any]) -> int:
    return d if attrs.get("keepdims") else d - sum(r < d for r in _reduced(ndim, attrs))


def _normalised(ndim: int, attrs: dict[str, Any]) -> set[int]:
    ns = attrs.get("normalized_shape")
    k = 1 if isinstance(ns, int) else len(ns) if ns is not None else 1
    return set(range(ndim - k))


def _leading(nd: int, attrs: dict[str, Any]) -> set[int]:
    return set(range(nd - 1))


#: linear by rows of x: the weight and the bias replicated; a residual (operand 3, or 2 without a
#: bias) split as x is, by the rule of that many operands
_LINEAR = {2: _by(_leading, "rows"), 3: _by(_leading, "rows", aligned=(2,)), 4: _by(_leading, "rows", aligned=(3,))}


def _linear(lay: list[Layout], attrs: dict[str, Any], out_ndim: int) -> Strategy:
    if len(lay) == 3 and not attrs.get(RESIDUAL_ONLY):  # x, weight, bias
        return _LINEAR[2](lay, attrs, out_ndim)
    return _LINEAR[len(lay)](lay, attrs, out_ndim)


_BATCH = _by(lambda nd, a: {0}, "batch")
_CHANNELS = _by(lambda nd, a: set(range(nd - 2)), "batch / channels")
_ANY = _by(lambda nd, a: set(range(nd)), "elements", aligned=None)
_SOFTMAX = _by(lambda nd, a: set(range(nd)) - {int(a.get("axis", -1)) % nd}, "rows")
_REDUCE = _by(lambda nd, a: set(range(nd)) - _reduced(nd, a), "rows", out_axis=_reduced_out)

#: operator name -> its sharding rule (module doc); an operator without one runs whole
RULES: dict[str, Rule] = {
    "matmul": _matmul,
    "linear": _linear,
    "conv2d": _BATCH,
    "batch_norm": _by(lambda nd, a: set(range(nd)) - {1}, "batch"),
    "layer_norm": _by(_normalised, "rows"),
    "rms_norm": _by(_normalised, "rows"),
    "max_pool2d": _CHANNELS, "avg_pool2d": _CHANNELS, "adaptive_avg_pool2d": _CHANNELS,
    "softmax": _SOFTMAX, "log_softmax": _SOFTMAX,
    "sum": _REDUCE, "mean": _REDUCE, "amax": _REDUCE,
    "scaled_dot_product_attention": _by(lambda nd, a: set(range(nd - 2)), "batch x heads", aligned=(1, 2, 3)),
    **{name: _ANY for name in ("add", "sub", "mul", "div", "neg", "relu", "gelu", "silu", "sigmoid", "tanh")},
}


@dataclass
class MeshExplanation:
    """What ``opr.explain`` returns for a call on a mesh: the strategy, the estimates compared,
    and the selector's explanation of the piece the largest member computes."""

    strategy: Strategy
    mesh: Mesh
    piece: selector.Explanation

    def __str__(self) -> str:
        s = self.strategy
        lines = [f"on {self.mesh.name}: {s.kind}"
                 + (f" (result split along {s.axis})" if s.kind == "shards" else "") + f" -- {s.why}"]
        lines += [f"  {note}" for note in s.notes]
        if s.sharded is not None:
            lines.append(f"  estimates: sharded {s.sharded * 1e6:.1f}us, one device {s.single * 1e6:.1f}us "
                         f"(dispatch {DISPATCH * 1e6:.0f}us per member)")
        where = "the first member" if s.kind in ("whole", "replicated") else "the largest piece"
        lines.append(f"{where}: {self.piece}")
        return "\n".join(lines)

    __repr__ = __str__


# the layers below reach this module through registration (it sits above them): the operators'
# call and explain, opr.tensor
base.mesh = sys.modules[__name__]
_tensor.spread = _spread
