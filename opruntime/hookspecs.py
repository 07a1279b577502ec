"""The plugin contract: every hook and every extension point an opruntime backend may offer.

A backend is any importable object (usually a module) whose hook functions are marked with
``opruntime.hookimpl`` and named like the hooks below. It is registered through the entry-point
group ``opruntime.backends`` in its package's ``pyproject.toml``::

    [project.entry-points."opruntime.backends"]
    acme = "opruntime_acme"

The runtime calls the hooks through pluggy only (``pm.hook``), one plugin at a time, so a plugin
that fails to import, raises from a hook or breaks the contract is reported by name (``opruntime
info`` and a ``FallbackWarning``) while the others keep working. What breaks the contract, for
the runtime and the conformance suite alike (:func:`contract_errors`):

* a module-level function named ``opruntime_*`` that is not marked ``@opruntime.hookimpl``
  (pluggy would never call it), or that names no hook here;
* a hook taking arguments its spec does not provide;
* a kernel name outside the plugin's namespace (``<plugin>.<op>.<variant>``), or a kernel or
  device name another plugin registered first: the later plugin is refused, the error names both.

Configuration can block a plugin by name (``OPRUNTIME_PLUGINS="-opencl"`` or
``plugins = ["-opencl"]``). Import your device stack (cupy, pyopencl, jax, ...) inside the hooks,
never at module import: ``import opruntime`` must stay free of GPU stacks.

Besides the hooks, a backend implements one :class:`DeviceProvider` per device (memory, DLPack,
timing, free memory, fingerprint) and describes each kernel with an
:class:`opruntime.kernels.Kernel` record (``run`` and/or ``prepare``, ``supports``, ``cost``,
``configs``). Every method a provider may override is declared below, with its default.
"""

from __future__ import annotations

import abc
import inspect
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pluggy

from .devices import host_normal

if TYPE_CHECKING:
    from .kernels import Kernel

PROJECT = "opruntime"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


# -- the hooks ----------------------------------------------------------------------------------
@hookspec
def opruntime_devices() -> Sequence[DeviceProvider]:
    """Return the devices this backend can run on, best first.

    Each is a :class:`DeviceProvider` subclass instance with a unique ``name`` (``"cuda:0"``);
    it owns the memory of that device. A device name another plugin already provides is refused
    (the error names both plugins).

    When the backend's stack or hardware is missing, raise
    :class:`opruntime.errors.BackendUnavailable` with the reason and the device kinds it would
    have provided (``BackendUnavailable("pyopencl not installed", kinds=["opencl"])``): users
    then get "device 'opencl:0' is not available: pyopencl not installed" instead of
    "unknown device". Return ``[]`` for a backend that only adds kernels.

    Called once per registry build (per process, unless plugins are registered at run time).
    """


@hookspec
def opruntime_kernels() -> Sequence[Kernel]:
    """Return the :class:`opruntime.kernels.Kernel` records this backend supplies.

    Kernels may target any device kind, including kinds another plugin provides: a plugin may
    add a single faster ``softmax`` for ``"cuda"``. Names read ``<plugin>.<op>.<variant>`` with
    the name the plugin is registered under (its entry-point name): a kernel outside that
    namespace, or a name registered before, refuses the plugin. Kernels for device kinds with no
    present device are kept but never selected.

    Building the records must be cheap: compile device code in ``prepare`` (or the first
    ``run``), never here. Called once per registry build, after ``opruntime_devices``.
    """


@hookspec
def opruntime_build_variants() -> Sequence[tuple[str, Mapping[str, Any]]]:
    """Return the device sources CI compiles without the device: ``(path, defines)`` pairs, one
    per variant worth checking (every config the kernels register, each layout flag).

    ``path`` is a ``.cu`` (or ``.cl``) file, absolute or relative to the plugin module's folder;
    ``defines`` are the ``-D`` macros of that variant. A source no pair names is compiled once
    with no defines. ``scripts/compile_cu.py`` (``make compile-cu``) calls this hook.
    """


@hookspec
def opruntime_device_kinds() -> Mapping[str, Sequence[str]]:
    """Declare, cheaply, the device kinds this backend serves and the top-level modules whose
    arrays its devices own: ``{"cuda": ["cupy"]}``, ``{"jax": ["jax", "jaxlib"]}``.

    Optional, and what makes the backend load lazily: the registry then calls
    ``opruntime_devices`` and ``opruntime_kernels`` only when a device of one of these kinds is
    needed (a device name of that kind is resolved, an operand is an array of one of the modules,
    a DLPack array lives on a device the backend may hold, or every device is listed). A backend
    without this hook is loaded when the registry is built. "Serves" includes kinds the backend
    only adds kernels for: its kernels are collected when a device of that kind is first used.

    Must not import the device stack (it runs in every process that calls an operator). Return
    ``{}`` for a backend to be loaded at once.
    """



# -- the device a backend provides --------------------------------------------------------------
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
        placement_free: True when ``from_host`` returns the host array itself (the ``cpu``
            device): calls with NumPy operands skip placement, and ``opr.tensor`` copies.
        accelerator: True for a device with its own memory and clock (a GPU, a TPU); tests
            on it carry the ``gpu`` marker.

    Native data ("data" below) is whatever array type the backend computes on (a NumPy array,
    a CuPy array, a ``pyopencl.array.Array``, a ``jax.Array``). It must have ``shape`` and
    ``dtype`` (a NumPy dtype in native byte order); ``strides`` in bytes where the type has them.
    """

    kind: str = ""
    name: str = ""
    description: str = ""
    priority: int = 0
    aliases: tuple[str, ...] = ()
    array_types: tuple[type, ...] = ()
    placement_free: bool = False
    accelerator: bool = False

    # -- memory ---------------------------------------------------------------------------
    @abc.abstractmethod
    def from_host(self, array: np.ndarray) -> Any:
        """Copy a host array (native byte order, any strides) to the device; may return
        ``array`` itself on a host device (then set ``placement_free``)."""

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
        """Convert device data to ``dtype`` as a new C-contiguous array (the Problem describes a
        cast operand with C strides). The default goes through the host (a host device: one NumPy
        pass); an accelerator overrides it to convert on the device."""
        return self.from_host(np.array(self.to_host(data), dtype=dtype, order="C"))

    def copy(self, data: Any) -> Any:
        """A new device array with ``data``'s values (``opr.tensor`` of a native array copies: a
        Tensor never changes because the caller changed an array). The default goes through the
        host; an accelerator overrides it to copy on the device."""
        return self.from_host(np.array(self.to_host(data), order="C"))

    def owns(self, data: Any) -> bool:
        """True when ``data`` is a native array living on this device."""
        return isinstance(data, self.array_types)

    def shares_memory(self, a: Any, b: Any) -> bool:
        """True when native arrays ``a`` and ``b`` may overlap in memory (a result must never
        alias an operand). The default knows only identity; backends with views override it."""
        return a is b

    def free_memory(self) -> int | None:
        """Bytes a new allocation can take now, or None when unknown. The frontend refuses a call
        whose result does not fit with :class:`~opruntime.errors.OutOfMemoryError`, before any
        kernel runs."""
        return None

    def random_normal(self, shape: tuple[int, ...], dtype: np.dtype, seed: int) -> Any:
        """Random normal device data of ``dtype`` (operands for tuning and the bench: never
        zeros). The default draws float32 on the host (float64 for float64) and copies; a
        backend with a device generator overrides it."""
        data = self.from_host(host_normal(np.random.default_rng(seed), shape, dtype))
        return data if data.dtype == dtype else self.astype(data, dtype)  # bfloat16: on the device

    # -- views ----------------------------------------------------------------------------
    # The Tensor's views (``t.reshape``, ``t.permute``, ``t[...]``) and ``opr.concat`` call these
    # with arguments the frontend has validated and normalised. A view may share ``data``'s memory
    # (Tensors are immutable, so neither can change); the defaults use the array's own methods
    # (NumPy, CuPy and JAX arrays: views where the type has them, JAX's are new arrays by nature)
    # and go through the host for an array type that lacks them.
    def reshape(self, data: Any, shape: tuple[int, ...]) -> Any:
        """``data`` with ``shape`` (the same size; no -1): a view when ``data``'s strides allow one,
        else a new C-contiguous array, as NumPy's ``reshape``."""
        if hasattr(data, "reshape"):
            return data.reshape(shape)
        return self.from_host(np.array(self.to_host(data), order="C").reshape(shape))

    def permute(self, data: Any, axes: tuple[int, ...]) -> Any:
        """``data`` with its dims reordered: result dim ``i`` is ``data``'s dim ``axes[i]`` (a
        permutation of ``range(ndim)``), as NumPy's ``transpose(axes)``; a view where the type has
        strides."""
        if hasattr(data, "transpose"):
            return data.transpose(axes)
        return self.from_host(np.array(self.to_host(data).transpose(axes), order="C"))

    def getitem(self, data: Any, index: tuple[int | slice, ...]) -> Any:
        """Basic indexing, ``data[index]``: ``index`` has one entry per dim, an int in
        ``[0, n)`` or a ``slice(start, stop, step)`` with ``0 <= start <= stop <= n`` and
        ``step >= 1`` (the frontend resolves negative and missing bounds, ``...`` and ``None``, and
        refuses advanced indexing). A view where the type has strides; an array, also when every dim
        is indexed by an int (a 0-d one: the trailing ``...`` keeps NumPy from giving a scalar)."""
        if hasattr(data, "__getitem__"):
            return data[(*index, Ellipsis)]
        return self.from_host(np.array(self.to_host(data)[(*index, Ellipsis)], order="C"))

    def concat(self, datas: Sequence[Any], axis: int) -> Any:
        """A new C-contiguous array: ``datas`` (one or more, one dtype and rank, shapes equal but
        on ``axis``, any strides) joined along ``axis`` (``0 <= axis < ndim``), as
        ``np.concatenate``. The default uses the arrays' array-API namespace
        (``__array_namespace__``: NumPy, CuPy, JAX), else goes through the host."""
        space = getattr(datas[0], "__array_namespace__", None)
        if space is not None:
            xp = space()
            return xp.concat(list(datas), axis=axis)
        return self.from_host(np.concatenate([self.to_host(d) for d in datas], axis=axis))

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

    def holds_dlpack(self, device_type: int, device_id: int) -> bool:
        """True when memory that DLPack calls ``(device_type, device_id)`` is this device's, so
        that :meth:`from_dlpack` imports such an array without a copy (a CUDA device: kDLCUDA
        with its ordinal). A foreign array (torch, ...) in device memory lands on the best device
        that holds it; host memory (kDLCPU) is host data, placed as a NumPy array. Default: False."""
        return False

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

    def roofline(self) -> Mapping[str, Any] | None:
        """The device's roofs for ``opruntime bench --plot``: ``{"bytes_per_s": B, "flops_per_s":
        {dtype: F}}``, or None to have them measured (a copy and the best matmul)."""
        return None

    def fingerprint(self) -> dict[str, str]:
        """What identifies this device for the tuning cache: model, driver, runtime versions."""
        return {"name": self.name, "description": self.description}

    # -- graphs ---------------------------------------------------------------------------
    def capture(self, fn: Callable[[list[Any]], list[Any]], inputs: Sequence[Any]) -> DeviceGraph | None:
        """Record the device work of ``fn(static)`` once as a graph that replays without the host
        (:func:`opruntime.capture`): ``static`` are the device's own copies of ``inputs`` and
        ``fn`` returns its result arrays. Return the :class:`DeviceGraph`, or None where the device
        has no graphs (the default; the caller then runs eagerly). ``fn`` has run eagerly before
        (plans made, kernels compiled); it queues work and never waits on it. Import the graph's
        stack inside this method."""
        return None

    # -- scale-out ------------------------------------------------------------------------
    def mesh_engine(self, members: Sequence[DeviceProvider]) -> MeshEngine | None:
        """The engine that moves data between ``members`` (this device first, then the others of a
        mesh, all of this provider's kind) and sums across them, or None when the kind has none
        (then only one-device meshes are possible). ``opr.mesh`` asks once per mesh; an engine
        holds what is costly to make (a ``jax.sharding.Mesh``, an NCCL communicator). Import the
        engine's stack inside this method."""
        return None

    def info(self) -> dict[str, str]:
        """Extra facts for ``opruntime info`` (memory, compute capability, extensions...)."""
        return {}


class DeviceGraph(Protocol):
    """What :meth:`DeviceProvider.capture` returns: recorded device work and the memory it owns."""

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        """Copy ``inputs`` (arrays of the captured shapes and dtypes, any strides) into the graph's
        own input buffers, replay the work on the device's current queue, and return new arrays
        holding the results (copies: a later replay must not change a returned result)."""
        ...


class MeshEngine(Protocol):
    """What :meth:`DeviceProvider.mesh_engine` returns: a backend's own transport between the
    devices of a mesh (``opruntime.mesh``), never a home-made one.

    Attributes:
        bandwidth: bytes per second between two members (the cost model's link).
        latency: seconds a transfer or a collective costs before any byte moves.
    """

    bandwidth: float
    latency: float

    def move(self, data: Any, provider: DeviceProvider) -> Any:
        """``data`` (an array of one member) as a new array on member ``provider``."""

    def all_reduce(self, datas: Sequence[Any]) -> list[Any]:
        """The elementwise sum of ``datas`` (one array per member, in the mesh's order, one shape
        and dtype) as a new array on every member, in the same order."""


# -- enforcing it ---------------------------------------------------------------------------------
HOOKS = tuple(name for name, fn in list(globals().items()) if name.startswith("opruntime_") and callable(fn))


def contract_errors(plugin: Any) -> list[str]:
    """What in ``plugin`` (a module or object) breaks the hook contract: unmarked or unknown
    ``opruntime_*`` functions, and hooks taking arguments their spec does not give. The runtime
    refuses a plugin with any; the conformance suite reports the same list."""
    errors = []
    for attr in dir(plugin):
        if not attr.startswith("opruntime_"):
            continue
        fn = getattr(plugin, attr, None)
        if not callable(fn):
            continue
        if attr not in HOOKS:
            errors.append(f"{attr} is not a hook; the hooks are {', '.join(HOOKS)}")
        elif getattr(fn, f"{PROJECT}_impl", None) is None:
            errors.append(f"{attr} is not marked @opruntime.hookimpl: pluggy would never call it")
        else:
            extra = set(inspect.signature(fn).parameters) - set(inspect.signature(globals()[attr]).parameters)
            if extra:
                errors.append(f"{attr} takes {sorted(extra)}, which the hookspec does not provide")
    return errors
