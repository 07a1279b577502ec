"""Choosing a kernel for a problem, and the plan that runs it.

For each distinct call (operator, settings, device, operand shapes / dtypes / strides,
attributes) the selector ranks the kernels that support the problem, once, and keeps the result
as a :class:`Plan` in :data:`plans`; a repeated call goes straight to the plan. Ranking:

1. a kernel pinned in configuration (``[ops.<op>] kernel = ...``) wins;
2. a result in the persistent tuning cache (``opruntime tune`` or an earlier autotuned run) for
   this device fingerprint, kernel source and problem key (exact, or power-of-two buckets);
3. ``tune = "autotune"``: the candidates (kernel x config) are timed now (``opruntime.tuning``),
   the fastest wins and is stored in the cache;
4. ``tune = "heuristic"`` (default): the smallest cost estimate wins;
5. ``tune = "off"``: registration order, no cache.

When the chosen kernel raises, it is dropped for that problem with one ``FallbackWarning`` and
the next candidate runs; in strict mode the error is raised instead.
"""

from __future__ import annotations

import contextvars
import difflib
import logging
import math
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import tuning
from .errors import (
    ConfigError,
    DeviceUnavailableError,
    DtypeError,
    FallbackWarning,
    KernelError,
    NoKernelError,
    OutOfMemoryError,
)
from .kernels import LAUNCHES, Kernel, Problem, c_strides, itemsize, np_dtype
from .lru import LRU
from .plugins import registry, reset_listeners
from .trace import active as _tracing

if TYPE_CHECKING:
    from .config import Settings
    from .devices import Device
    from .ops.base import Normalized, Operator

log = logging.getLogger("opruntime")

#: call key -> Plan; see ``Operator.call``. Bounded: the ``cache_entries`` setting.
plans = LRU("plans")
#: (settings, op) -> the default device for host data.
defaults = LRU("default devices")

__all__ = ["Candidate", "Explanation", "Plan", "Problem", "clear_cache", "plans", "rank"]


def clear_cache() -> None:
    """Forget every decision and prepared launch (after the registry or the settings change)."""
    plans.clear()
    defaults.clear()
    LAUNCHES.clear()
    tuning.forget_devices()


reset_listeners.append(clear_cache)


@dataclass
class Candidate:
    """One kernel with one config, as ranked for one problem."""

    kernel: Kernel
    config: Mapping[str, Any] = field(default_factory=dict)
    cost: float = math.inf  # the estimate, in seconds
    measured: float | None = None  # the autotuned median, in seconds
    status: str = "ok"  # "ok", or why it is not usable

    @property
    def label(self) -> str:
        cfg = ",".join(f"{k}={v}" for k, v in self.config.items())
        return f"{self.kernel.name}[{cfg}]" if cfg else self.kernel.name


def rank(problem: Problem, device: Device, s: Settings) -> tuple[list[Candidate], list[Candidate], str]:
    """Rank the kernels for ``problem`` on ``device``.

    Returns:
        (usable candidates best first, every candidate with its status, why the first won).
    """
    reg = registry()
    if not reg.present(device):  # e.g. a Tensor made before its plugin went away
        raise DeviceUnavailableError(f"{problem.op}: device {device.name!r} is no longer available (its plugin was "
                                     f"unregistered or failed); devices here: {', '.join(d.name for d in reg.devices)}")
    kernels = reg.kernels_for(problem.op, device.kind)
    if not kernels:
        kinds = sorted({k.device_kind for k in reg.kernels.values() if k.op == problem.op})
        raise NoKernelError(f"{problem.op}: no kernel is registered for {device.name} (kind {device.kind!r}); "
                            f"{problem.op} kernels exist for: {', '.join(kinds) or 'none'}")
    rows: list[Candidate] = []
    for k in kernels:
        if problem.dtype not in k.dtypes:
            rows.append(Candidate(k, status=f"no {problem.dtype} (has {', '.join(sorted(k.dtypes))})"))
            continue
        try:
            ok = k.supports(problem)
        except Exception as exc:
            ok = False
            log.warning("kernel %s: supports() raised %r", k.name, exc)
        if not ok:  # a false str (a backend's refusal with its reason) says why
            why = str(ok) if isinstance(ok, str) and len(ok) else ""
            rows.append(Candidate(k, status="does not support this problem" + (f": {why}" if why else "")))
            continue
        for cfg in list(k.candidates(problem)) or [{}]:
            try:
                cost = k.estimate(problem, cfg)
            except Exception as exc:
                cost = math.inf
                log.warning("kernel %s: cost() raised %r", k.name, exc)
            rows.append(Candidate(k, dict(cfg), cost))
    usable = [c for c in rows if c.status == "ok"]
    if not usable:
        dtypes = sorted({d for k in kernels for d in k.dtypes})
        if problem.dtype not in dtypes:
            raise DtypeError(f"{problem.op}: no kernel computes {problem.dtype} on {device.name}; dtypes there: "
                             f"{', '.join(dtypes)}. Convert the operands or choose another device.")
        raise NoKernelError(f"{problem.op}: no kernel on {device.name} supports {problem}:\n"
                            + "\n".join(f"  {c.kernel.name}: {c.status}" for c in rows))
    if s.tune == "off":
        why = "first registered (tune=off)"
    else:
        usable.sort(key=lambda c: c.cost)
        why = "lowest cost estimate (heuristic)"
        tuned = tuning.cached_or_tuned(problem, device, s, usable)
        if tuned is not None:
            usable, why = tuned
    op_s = s.ops.get(problem.op)
    pinned = op_s.kernel if op_s else None
    if pinned:
        if pinned not in reg.kernels:
            close = difflib.get_close_matches(pinned, list(reg.kernels), n=3)
            hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
            raise ConfigError(f"{s.origin.get(f'ops.{problem.op}', 'config')}: 'ops.{problem.op}.kernel' names "
                              f"unknown kernel {pinned!r}.{hint}")
        match = [c for c in usable if c.kernel.name == pinned]
        if match:
            usable = match + [c for c in usable if c.kernel.name != pinned]
            why = f"pinned by {s.origin.get(f'ops.{problem.op}', 'config')}"
        else:
            status = next((c.status for c in rows if c.kernel.name == pinned), f"not for {device.kind}")
            announce(s, f"{problem.op}: pinned kernel {pinned!r} cannot run {problem} on {device.name} "
                     f"({status}); using {usable[0].kernel.name!r}")
    return usable, rows, why


_announced: set[str] = set()
#: True while this thread / task records a device graph (``opruntime.capture``)
capturing: contextvars.ContextVar[bool] = contextvars.ContextVar("opruntime_capturing", default=False)


def announce(s: Settings, msg: str, exc: BaseException | None = None) -> None:
    """Say a fallback once (warning and log), or raise :class:`KernelError` in strict mode."""
    if s.strict:
        raise KernelError(msg + " (strict mode: fallbacks raise)") from exc
    if msg not in _announced:
        _announced.add(msg)
        log.warning(msg)
        warnings.warn(msg, FallbackWarning, stacklevel=4)


class Plan:
    """Everything needed to answer one distinct call: the ranked kernels and the frontend's
    reshapes and casts around them. Calling it with the operands' native arrays returns the
    result's native array, from the best kernel that works.

    Every result is checked: on the first call of each kernel, that it is a new array of the
    problem's shape and dtype owned by the device and sharing no memory with an operand; on every
    later call, its class, shape and dtype (a few attribute reads) and that it is no operand itself
    (a view of one is caught on the first call only: ``shares_memory`` on every call would cost
    more than the rest of the check). A kernel that fails or gives a wrong result is dropped for
    this problem (thread-safely: only the thread that sees it fail first drops it, announced once)
    and the next candidate runs; in strict mode the error raises.
    """

    __slots__ = ("_lock", "aliasable", "casts", "device", "launch", "launch_of", "op", "order", "out_cls", "out_dtype",
                 "out_reshape", "out_shape", "plain", "problem", "reshape", "reshapes", "result_shape", "rows", "settings",
                 "trivial", "views", "why")

    def __init__(self, op: Operator, problem: Problem, device: Device, s: Settings, norm: Normalized,
                 casts: tuple[bool, ...], in_shapes: tuple[tuple[int, ...], ...]) -> None:
        self.op, self.problem, self.device, self.settings = op, problem, device, s
        self.casts = casts if any(casts) else None
        self.views = norm.shapes
        self.result_shape = norm.result_shape
        self.trivial = norm.trivial
        self.out_dtype = np_dtype(problem.out_dtype)
        self.out_shape = problem.out_shape
        #: operands that have the result's shape: a kernel could hand one back as its result
        self.aliasable = tuple(i for i, shape in enumerate(problem.shapes) if shape == problem.out_shape)
        self.order: list[Candidate] = []
        self.rows: list[Candidate] = []
        self.why = "nothing to compute" if norm.trivial else ""
        if not norm.trivial:
            check_fits(problem, device)
            self.order, self.rows, self.why = rank(problem, device, s)
        # the call's shapes are part of the plan's key, so the views it needs are known now: the hot
        # path takes a plan with no casts, reshaping operands (a linear's (B, S, d) to (B*S, d)) and
        # the result as the slow path does
        self.plain = self.casts is None and not self.trivial
        self.reshapes = None if tuple(in_shapes) == self.views else \
            tuple(None if tuple(have) == want else want for have, want in zip(in_shapes, self.views))
        self.out_reshape = None if self.result_shape == problem.out_shape else self.result_shape
        self.reshape = device.provider.reshape  # a view, or a copy where no view exists (every device)
        self.launch: Callable[..., Any] | None = None  # the hot path, armed after a checked first call
        self.launch_of: Candidate | None = None
        self.out_cls: type | None = None
        self._lock = threading.Lock()

    def placing(self, host: tuple[bool, ...]) -> Any:
        """This plan for calls whose operands marked in ``host`` are host (NumPy) arrays."""
        prov = self.device.provider
        if not any(host) or prov.placement_free:
            return self
        return _Placing(self, host, prov.from_host)

    @property
    def kernel(self) -> Kernel | None:
        """The kernel that runs now (None for a trivial problem)."""
        return self.order[0].kernel if self.order else None

    def __call__(self, datas: list[Any]) -> Any:
        launch = self.launch
        if launch is not None and not _tracing:  # the hot path: no casts, no trace
            if self.reshapes is None:
                out = self._hot(launch, datas)
            else:
                reshape = self.reshape
                out = self._hot(launch, [d if s is None else reshape(d, s) for d, s in zip(datas, self.reshapes)])
            return out if self.out_reshape is None else out.reshape(self.out_reshape)
        if _tracing:
            return self._traced(datas)
        return self._call(datas)

    def _hot(self, launch: Callable[..., Any], datas: list[Any]) -> Any:
        """The armed launch on the kernel's views, with the cheap result check (a failure or a wrong
        result falls back to :meth:`_run`, which drops the kernel)."""
        try:
            out = launch(*datas)
        except (MemoryError, DeviceUnavailableError) as exc:
            raise _fatal(self, exc)  # noqa: B904 (the error itself, or one with its cause set)
        except Exception as exc:
            return self._failed(launch, datas, exc)
        # NumPy's dtypes are singletons, so `is` is the cheap test; a miss is checked in full. An
        # operand handed back as the result is caught too (identity, for operands of its shape)
        if out.__class__ is self.out_cls and (out.dtype is self.out_dtype or out.dtype == self.out_dtype) \
                and out.shape == self.out_shape:
            for i in self.aliasable:
                if out is datas[i]:
                    break
            else:
                return out
        return self._failed(launch, datas, KernelError(self._wrong(out, datas) or "a result unlike the first"))

    def _failed(self, launch: Any, datas: list[Any], exc: Exception) -> Any:
        c = self.launch_of
        if self.launch is launch:
            self.launch = None
        if c is not None:
            self._drop(c, exc)
        return self._run(datas)

    def _traced(self, datas: list[Any]) -> Any:
        from .trace import Event

        sync = self.device.provider.synchronize
        sync()
        t0 = time.perf_counter()
        out = self._call(datas)
        sync()
        t1 = time.perf_counter()
        kernel = self.order[0].label if self.order else f"(frontend: {self.trivial})"
        event = Event(self.problem.op, kernel, str(self.problem), self.device.name, t0, t1 - t0,
                      threading.get_ident())
        for tr in list(_tracing):
            tr.record(event)
        return out

    def _call(self, datas: list[Any]) -> Any:
        prov = self.device.provider
        if self.casts is not None:
            datas = [prov.astype(d, self.out_dtype) if c else d for d, c in zip(datas, self.casts)]
        if self.trivial:
            return self.op.trivial_result(self.problem, self.result_shape, self.trivial, datas, prov)
        datas = [d if d.shape == s else self.reshape(d, s) for d, s in zip(datas, self.views)]
        out = self._run(datas)
        if self.result_shape != self.problem.out_shape:
            out = out.reshape(self.result_shape)
        return out

    def _run(self, datas: list[Any]) -> Any:
        """Run the best remaining kernel on ``datas`` (the kernel's views) with the full result
        check; dropping kernels that fail until one answers."""
        while True:
            with self._lock:
                if not self.order:
                    raise KernelError(
                        f"{self.problem.op}: every kernel failed on {self.problem} ({self.device.name}): "
                        + "; ".join(f"{c.kernel.name}: {c.status}" for c in self.rows if c.status != "ok"))
                c = self.order[0]
            try:
                launch = c.kernel.launcher(self.problem, c.config)
                out = launch(*datas)
                wrong = self._wrong(out, datas)
                if wrong is None:
                    if self.plain:
                        with self._lock:
                            if self.order and self.order[0] is c:
                                self.launch_of, self.out_cls, self.launch = c, out.__class__, launch
                    return out
                exc: Exception = KernelError(wrong)
            except (MemoryError, DeviceUnavailableError) as fatal:
                raise _fatal(self, fatal)  # noqa: B904 (the error itself, or one with its cause set)
            except Exception as failure:
                exc = failure
            self._drop(c, exc)

    def _wrong(self, out: Any, datas: list[Any]) -> str | None:
        """What is wrong with a kernel's result ``out``, or None."""
        prov, p = self.device.provider, self.problem
        if not prov.owns(out):
            return f"the result is a {type(out).__name__}, not an array of {self.device.name}"
        if tuple(out.shape) != p.out_shape or out.dtype != self.out_dtype:
            return f"the result has shape {tuple(out.shape)} {out.dtype}, not {p.out_shape} {p.out_dtype}"
        if any(prov.shares_memory(out, d) for d in datas):
            return "the result shares memory with an operand (a kernel must return a new array)"
        return None

    def _drop(self, failed: Candidate, exc: Exception) -> None:
        """Drop ``failed`` for this problem, unless another thread already did; announce it. While a
        device graph is being recorded (:func:`opruntime.capture`) nothing is dropped: the error
        ends the recording (a kernel that cannot be recorded may still be the best one eagerly)."""
        if capturing.get():
            raise exc
        with self._lock:
            if not self.order or self.order[0] is not failed:
                return  # another thread saw it fail first and moved on
            self.order.pop(0)
            if self.launch_of is failed:
                self.launch = self.launch_of = None
            failed.status = f"failed: {type(exc).__name__}: {exc}"
            nxt = self.order[0].kernel.name if self.order else None
        if nxt is None:
            if self.settings.strict:
                raise KernelError(f"{self.problem.op}: kernel {failed.kernel.name!r} failed on {self.problem} "
                                  f"({self.device.name}): {type(exc).__name__}: {exc}") from exc
            return  # _run raises "every kernel failed" with each reason
        announce(self.settings, f"{self.problem.op}: kernel {failed.kernel.name!r} failed on {self.problem} "
                 f"({self.device.name}): {type(exc).__name__}: {exc}; using {nxt!r}", exc)


def check_fits(problem: Problem, device: Device) -> None:
    """Refuse a problem whose result (and the contiguous copies of strided operands a kernel may
    make) exceeds the device's free memory, before any kernel runs.

    Raises:
        OutOfMemoryError: naming the op, the sizes and the device.
    """
    size = itemsize(problem.out_dtype)
    need = math.prod(problem.out_shape) * size
    for shape, strides in zip(problem.shapes, problem.strides):
        if strides is not None and strides != c_strides(shape):
            need += math.prod(shape) * size
    free = device.provider.free_memory()
    if free is not None and need > free:
        raise OutOfMemoryError(
            f"{problem.op}: {problem} needs {need / 2**30:.3g} GiB for its result"
            f"{' and operand copies' if need > math.prod(problem.out_shape) * size else ''}, but {device.name} has "
            f"{free / 2**30:.3g} GiB free; use smaller operands (or split the call), or another device")


def _fatal(plan: Plan, exc: BaseException) -> BaseException:
    """Failures no other kernel on the device can mend, raised as they are (no fallback): a device
    that is gone, and out of memory (a plain ``MemoryError`` becomes :class:`OutOfMemoryError`)."""
    if not isinstance(exc, MemoryError):
        return exc
    if isinstance(exc, OutOfMemoryError):  # a device's own words: with the operator named, if they lack it
        if str(exc).startswith(f"{plan.problem.op}:"):
            return exc
        err = OutOfMemoryError(f"{plan.problem.op} ({plan.problem}): {exc}")
    else:
        err = OutOfMemoryError(f"{plan.problem.op}: out of memory on {plan.device.name} for {plan.problem}: {exc}")
    err.__cause__ = exc
    return err


class _Placing:
    """A plan behind a copy of its host operands to the device (the cached form of such calls)."""

    __slots__ = ("device", "from_host", "host", "plan")

    def __init__(self, plan: Plan, host: tuple[bool, ...], from_host: Any) -> None:
        self.plan, self.host, self.from_host, self.device = plan, host, from_host, plan.device

    def __call__(self, datas: list[Any]) -> Any:
        to = self.from_host
        return self.plan([to(d) if h else d for d, h in zip(datas, self.host)])


def _notes(c: Candidate, problem: Problem) -> str:
    """``; <the kernel's notes>`` for an explanation's row, or ""."""
    try:
        note = c.kernel.notes(problem) if c.kernel.notes else ""
    except Exception as exc:  # a note must never break explain
        note = f"notes() raised {type(exc).__name__}"
    return f"; {note}" if note else ""


@dataclass
class Explanation:
    """What ``opr.explain`` returns: the problem, every candidate, the choice and why."""

    problem: Problem
    device: str
    candidates: list[Candidate]
    chosen: str | None
    why: str
    cached: bool

    def __str__(self) -> str:
        lines = [f"{self.problem} on {self.device}",
                 f"chosen: {self.chosen or '(none: nothing to compute)'} -- {self.why}"
                 + (" [cached decision]" if self.cached else "")]
        if self.candidates:
            w = max(len(c.label) for c in self.candidates)
            lines.append(f"  {'candidate':<{w}}  {'estimate':>11}  {'measured':>11}  status")
            for c in self.candidates:
                est = f"{c.cost * 1e6:9.1f}us" if math.isfinite(c.cost) else "          -"
                meas = f"{c.measured * 1e6:9.1f}us" if c.measured is not None and math.isfinite(c.measured) else "          -"
                mark = "*" if c.label == self.chosen else " "
                lines.append(f"{mark} {c.label:<{w}}  {est:>11}  {meas:>11}  {c.status}{_notes(c, self.problem)}")
        return "\n".join(lines)

    __repr__ = __str__
