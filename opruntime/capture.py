"""``opr.capture``: a function of opruntime calls recorded once as a device graph, then replayed.

A model's forward pass is dozens of operator calls, most of them short kernels; on a GPU each call
costs tens of microseconds of Python on the host, and a small model is then host-bound: the GPU
waits for the next launch. Capturing records the device work of one call of the function (a CUDA
graph on the ``cuda`` device) and replays it with one launch, so the host cost per call no longer
grows with the number of operators::

    forward = opr.capture(block)          # or @opr.capture on a function
    y = forward(x)                        # first call per signature: runs, then records
    y = forward(x2)                       # later calls: x2 copied in, the graph replayed

The function must be a pure function of its Tensor arguments: the same operator calls for the
same shapes, dtypes and settings, and no reading of results on the host inside it (``.numpy()``,
``float(t)``: the recording cannot wait for the device, and :class:`~opruntime.errors.CaptureError`
says so). It returns a Tensor or a tuple / list of Tensors. A *signature* (each Tensor argument's
device, shape, dtype and strides, the other arguments' values, the settings in force) is recorded
once; a new signature records again. Each call copies its Tensor arguments into the graph's own
buffers and returns new Tensors (a later call never changes an earlier result): the two copies are
device copies, a few microseconds for a model's activations. A kernel that cannot be recorded (on
``cuda``: CuPy refuses cuBLAS calls under capture, which the im2col convolutions use) ends the
recording with :class:`~opruntime.errors.CaptureError`; no kernel is dropped from the selection.

On a device without graphs (``cpu``, OpenCL, JAX: JAX's own ``jit`` is its capture) the function
runs eagerly, with the same results; ``forward.captured`` tells which.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Hashable
from typing import Any

from .config import settings
from .errors import CaptureError
from .selector import capturing
from .tensor import Tensor

#: eager runs before recording a signature: the first plans every call (validation, selection,
#: compilation, the kernels' first-call checks), the second runs the armed hot paths
WARMUP = 2
_EAGER = object()  # a signature this device cannot capture: run the function as it is


class Captured:
    """The callable :func:`capture` returns (``functools.wraps`` of the function)."""

    def __init__(self, fn: Callable[..., Any], warmup: int = WARMUP) -> None:
        functools.update_wrapper(self, fn)
        self._fn, self._warmup = fn, warmup
        self._graphs: dict[Hashable, Any] = {}
        self._lock = threading.Lock()

    @property
    def captured(self) -> int:
        """How many signatures run as recorded graphs (0: every call so far ran eagerly)."""
        return sum(g is not _EAGER for g in self._graphs.values())

    def __repr__(self) -> str:
        name = getattr(self._fn, "__qualname__", repr(self._fn))
        return f"<opr.capture of {name}: {self.captured} graph(s), {len(self._graphs)} signature(s)>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        slots = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        key = _signature(args, kwargs, slots)
        entry = self._graphs.get(key) if key is not None else _EAGER
        if entry is None:
            with self._lock:
                entry = self._graphs.get(key)
                if entry is None:
                    entry = self._graphs[key] = self._record(args, kwargs, slots)
        if entry is _EAGER:
            return self._fn(*args, **kwargs)
        graph, device, shape = entry
        outs = [Tensor._wrap(d, device) for d in graph.run([args[i]._data for i in slots])]
        return outs[0] if shape is None else shape(outs)

    def _record(self, args: tuple, kwargs: dict, slots: list[int]) -> Any:
        """Warm up, then ask the device to record one call; _EAGER where it has no graphs."""
        devices = {args[i]._device for i in slots}
        for _ in range(self._warmup):
            result = self._fn(*args, **kwargs)
        if len(devices) != 1:
            return _EAGER  # no Tensor, or several devices: nothing one graph could hold
        (device,) = devices
        outs, shape = _results(self._fn, result if self._warmup else self._fn(*args, **kwargs))
        if any(t._device != device for t in outs):
            return _EAGER

        def run(static: list[Any]) -> list[Any]:
            call = list(args)
            for i, d in zip(slots, static):
                call[i] = Tensor._wrap(d, device)
            got, _ = _results(self._fn, self._fn(*call, **kwargs))
            return [t._data for t in got]

        token = capturing.set(True)  # a kernel failing while recorded ends the recording, unchanged
        try:
            graph = device.provider.capture(run, [args[i]._data for i in slots])
        except CaptureError:
            raise
        except Exception as exc:
            name = getattr(self._fn, "__qualname__", repr(self._fn))
            raise CaptureError(
                f"opr.capture({name}): recording on {device.name} failed ({type(exc).__name__}: {exc}). A captured "
                f"function may only queue opruntime calls on one device: no .numpy(), float(t) or printing of results "
                f"inside it; call the function itself (not the captured one) for such code") from exc
        finally:
            capturing.reset(token)
        return _EAGER if graph is None else (graph, device, shape)


def _signature(args: tuple, kwargs: dict, slots: list[int]) -> Hashable | None:
    """The recording's key: Tensors by device, shape, dtype and strides, other arguments by value,
    and the settings in force; None when an argument is unhashable (such calls run eagerly)."""
    parts: list[Any] = [settings()]
    for i, a in enumerate(args):
        if i in slots:
            d = a._data
            parts.append((a._device.name, tuple(d.shape), d.dtype, getattr(d, "strides", None)))
        else:
            parts.append(("value", type(a), a))
    parts.append(tuple(sorted(kwargs.items())))
    key = tuple(parts)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _results(fn: Callable[..., Any], result: Any) -> tuple[list[Tensor], Callable[[list[Tensor]], Any] | None]:
    """The Tensors a call returned, and how to rebuild the returned structure (None: one Tensor)."""
    if isinstance(result, Tensor):
        return [result], None
    if isinstance(result, (tuple, list)) and result and all(isinstance(t, Tensor) for t in result):
        return list(result), type(result)
    name = getattr(fn, "__qualname__", repr(fn))
    raise CaptureError(f"opr.capture({name}): the function must return a Tensor or a tuple / list of Tensors, "
                       f"got {type(result).__name__}")


def capture(fn: Callable[..., Any] | None = None, *, warmup: int = WARMUP) -> Captured | Callable[[Callable[..., Any]], Captured]:
    """Record ``fn`` (a function of opruntime calls) as a device graph per signature, and replay it.

    Use as ``fast = opr.capture(fn)`` or as the decorator ``@opr.capture``. ``warmup`` eager calls
    precede each recording. See :mod:`opruntime.capture` for what a captured function may do.

    Returns:
        A :class:`Captured` callable with ``fn``'s signature and docstring.
    """
    if fn is None:
        return lambda f: Captured(f, warmup)
    return Captured(fn, warmup)
