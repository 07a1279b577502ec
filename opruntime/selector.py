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

import difflib
import functools
import logging
import math
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

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
from .kernels import Kernel, Problem
from .tensor import Tensor
from .trace import active as _tracing

if TYPE_CHECKING:
    from .config import Settings
    from .devices import Device
    from .ops.base import Normalized, Operator

log = logging.getLogger("opruntime")
_new_tensor = object.__new__

#: call key -> Plan; see ``Operator.__call__``.
plans: dict[tuple, Plan] = {}
#: (settings, op) -> the default device for host data.
defaults: dict[tuple, Device] = {}

__all__ = ["Candidate", "Plan", "Problem", "rank", "make_plan", "explain", "clear_cache", "plans"]


def clear_cache() -> None:
    """Forget every decision (after the registry or the settings change)."""
    plans.clear()
    defaults.clear()
    tuning.forget_devices()


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
    from .plugins import registry

    reg = registry()
    if all(d.name != device.name for d in reg.devices):  # e.g. a Tensor made before its plugin went away
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
        if not ok:
            rows.append(Candidate(k, status="does not support this problem"))
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
    reshapes and casts around them. Calling it runs the best kernel that works."""

    __slots__ = ("op", "problem", "device", "order", "rows", "why", "settings", "casts", "views",
                 "result_shape", "trivial", "fast")

    def __init__(self, op: Operator, problem: Problem, device: Device, s: Settings, norm: Normalized,
                 casts: tuple[bool, ...], in_shapes: tuple[tuple[int, ...], ...]) -> None:
        self.op, self.problem, self.device, self.settings = op, problem, device, s
        self.casts = casts if any(casts) else None
        self.views = norm.shapes
        self.result_shape = norm.result_shape
        self.trivial = norm.trivial
        self.order: list[Candidate] = []
        self.rows: list[Candidate] = []
        self.why = "nothing to compute" if norm.trivial else ""
        if not norm.trivial:
            self.order, self.rows, self.why = rank(problem, device, s)
        # the call's shapes are part of the plan's key, so whether views are needed is known now
        plain = (self.casts is None and not self.trivial and self.result_shape == problem.out_shape
                 and tuple(in_shapes) == self.views)
        self.fast = self._fast() if plain else None

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

    def _fast(self) -> Callable[..., Any] | None:
        """The hot path's ``launch(*arrays)``: the first kernel's ``run`` bound to the problem and
        config, swapped after its first success for what the kernel's ``prepare`` returns."""
        if not self.order:
            return None
        c = self.order[0]
        kernel, problem, config = c.kernel, self.problem, c.config
        plain = functools.partial(kernel.run, problem, config)
        if kernel.prepare is None:
            return plain

        def first(*datas: Any) -> Any:
            out = plain(*datas)  # compiles and checks as every first call does
            if self.fast is first:
                try:
                    self.fast = kernel.prepare(problem, config)
                except Exception as exc:  # a backend bug: the plain path still answers right
                    log.warning("%s: prepare failed (%s: %s); calls go through run", kernel.name,
                                type(exc).__name__, exc)
                    self.fast = plain
            return out

        return first

    def __call__(self, datas: list[Any]) -> Tensor:
        fast = self.fast
        if fast is not None and not _tracing:  # the hot path: no casts, no reshapes, no trace
            try:
                out = fast(*datas)
            except (MemoryError, DeviceUnavailableError) as exc:
                raise _fatal(self, exc)  # noqa: B904 (the error itself, or one with its cause set)
            except Exception as exc:
                out = self._fallback(datas, exc)
            t = _new_tensor(Tensor)
            t._data, t._device, t._key = out, self.device, None
            return t
        if _tracing:
            return self._traced(datas)
        return self._call(datas)

    def _traced(self, datas: list[Any]) -> Tensor:
        import threading

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

    def _call(self, datas: list[Any]) -> Tensor:
        dev = self.device
        if self.casts is not None:
            dt = np.dtype(self.problem.out_dtype)
            datas = [dev.provider.astype(d, dt) if c else d for d, c in zip(datas, self.casts)]
        if self.trivial:
            return Tensor._wrap(self._trivial(datas), dev)
        datas = [d if d.shape == s else d.reshape(s) for d, s in zip(datas, self.views)]
        if not self.order:  # every kernel failed on an earlier call
            raise KernelError(f"{self.problem.op}: every kernel failed earlier on {self.problem} ({self.device.name}): "
                              + "; ".join(f"{c.kernel.name}: {c.status}" for c in self.rows if c.status != "ok"))
        c = self.order[0]
        try:
            out = c.kernel.run(self.problem, c.config, *datas)
        except (MemoryError, DeviceUnavailableError) as exc:
            raise _fatal(self, exc)  # noqa: B904 (the error itself, or one with its cause set)
        except Exception as exc:
            out = self._fallback(datas, exc)
        if self.result_shape != self.problem.out_shape:
            out = out.reshape(self.result_shape)
        return Tensor._wrap(out, dev)

    def _fallback(self, datas: list[Any], exc: Exception) -> Any:
        errors = []
        while True:
            failed = self.order.pop(0)
            self.fast = self._fast() if self.fast is not None else None
            failed.status = f"failed: {type(exc).__name__}: {exc}"
            errors.append(f"{failed.kernel.name}: {type(exc).__name__}: {exc}")
            if not self.order:
                raise KernelError(f"{self.problem.op}: every kernel failed on {self.problem} ({self.device.name}):\n  "
                                  + "\n  ".join(errors)) from exc
            nxt = self.order[0]
            announce(self.settings, f"{self.problem.op}: kernel {failed.kernel.name!r} failed on {self.problem} "
                     f"({self.device.name}): {type(exc).__name__}: {exc}; using {nxt.kernel.name!r}", exc)
            try:
                return nxt.kernel.run(self.problem, nxt.config, *datas)
            except (MemoryError, DeviceUnavailableError) as fatal:
                raise _fatal(self, fatal)  # noqa: B904 (the error itself, or one with its cause set)
            except Exception as again:
                exc = again

    def _trivial(self, datas: list[Any]) -> Any:
        prov, dt = self.device.provider, np.dtype(self.problem.out_dtype)
        if self.trivial == "empty" or self.problem.attrs.get("bias") is not True:
            out = prov.empty if self.trivial == "empty" else prov.zeros
            return out(self.result_shape, dt)
        bias = prov.to_host(datas[2]).reshape(1, -1, 1, 1)  # conv2d over zero input channels: the bias
        out = np.broadcast_to(bias, self.problem.out_shape).reshape(self.result_shape)
        return prov.from_host(np.ascontiguousarray(out))


def _fatal(plan: Plan, exc: BaseException) -> BaseException:
    """Failures no other kernel on the device can mend, raised as they are (no fallback): a device
    that is gone, and out of memory (a plain ``MemoryError`` becomes :class:`OutOfMemoryError`)."""
    if not isinstance(exc, MemoryError) or isinstance(exc, OutOfMemoryError):
        return exc
    err = OutOfMemoryError(f"{plan.problem.op}: out of memory on {plan.device.name} for {plan.problem}: {exc}")
    err.__cause__ = exc
    return err


class _Placing:
    """A plan behind a copy of its host operands to the device (the cached form of such calls)."""

    __slots__ = ("plan", "host", "from_host")

    def __init__(self, plan: Plan, host: tuple[bool, ...], from_host: Any) -> None:
        self.plan, self.host, self.from_host = plan, host, from_host

    def __call__(self, datas: list[Any]) -> Tensor:
        to = self.from_host
        return self.plan([to(d) if h else d for d, h in zip(datas, self.host)])


def make_plan(op: Operator, problem: Problem, device: Device, s: Settings, norm: Normalized,
              casts: tuple[bool, ...], in_shapes: tuple[tuple[int, ...], ...]) -> Plan:
    """Build the plan for a call the cache has not seen."""
    return Plan(op, problem, device, s, norm, casts, in_shapes)


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
                lines.append(f"{mark} {c.label:<{w}}  {est:>11}  {meas:>11}  {c.status}")
        return "\n".join(lines)

    __repr__ = __str__


def explain(op: str, *args: Any, device: Any = None, **attrs: Any) -> Explanation:
    """Which kernel ``opr.<op>(*args, **attrs)`` would run, the candidates, and why.

    Example:
        >>> print(opr.explain("matmul", a, b))
    """
    from .config import settings
    from .ops import OPS
    from .ops.base import place

    if op not in OPS:
        close = difflib.get_close_matches(op, list(OPS), n=2)
        raise NoKernelError(f"explain: unknown operator {op!r}" + (f"; did you mean {close[0]!r}?" if close else "")
                            + f" Operators: {', '.join(OPS)}")
    operator = OPS[op]
    s = settings()
    datas, dev = place(op, operator.operands, args, device, s)
    try:
        key = operator.key(s, dev, datas, attrs)
        cached = key in plans
    except TypeError:
        cached = False
    # a cached plan shows what calls really run (kernels that failed since are marked so)
    plan = getattr(plans[key], "plan", plans[key]) if cached else operator.plan(datas, dev, attrs, s)
    rows = plan.rows if plan.rows else plan.order
    chosen = plan.order[0].label if plan.order else None
    return Explanation(plan.problem, dev.name, rows, chosen, plan.why, cached)
