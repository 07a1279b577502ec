"""Loading backend plugins and building the registry of devices and kernels.

The registry is built once, on first use: the built-in and third-party backends are found
through the entry-point group ``opruntime.backends``; each is imported, checked against the
hookspecs and asked for its devices and kernels, one plugin at a time so that a broken plugin is
reported by name and the others keep working.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import threading
import warnings
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pluggy

from . import hookspecs
from .devices import Device, resolve_name
from .hookspecs import DeviceProvider
from .errors import BackendUnavailable, DeviceUnavailableError, FallbackWarning, PluginError, UnknownDeviceError
from .kernels import Kernel

log = logging.getLogger("opruntime")
ENTRY_POINT_GROUP = "opruntime.backends"


@dataclass
class PluginRecord:
    """What ``opruntime info`` shows about one plugin."""

    name: str
    module: str = ""
    version: str = ""
    status: str = "ok"  # ok | unavailable | failed | blocked
    reason: str = ""
    device_kinds: tuple[str, ...] = ()
    devices: list[str] = field(default_factory=list)
    kernels: int = 0


class Registry:
    """Every present device and every registered kernel, by name and by (op, device kind)."""

    def __init__(self, plugins: Sequence[tuple[str, Any]] = (), *, entry_points: bool = True,
                 blocked: Sequence[str] = (), allowed: Sequence[str] = ()) -> None:
        self.plugin_setting = (tuple(blocked), tuple(allowed))
        self.pm = pluggy.PluginManager("opruntime")
        self.pm.add_hookspecs(hookspecs)
        self.records: dict[str, PluginRecord] = {}
        self.devices: list[Device] = []
        self.unavailable: dict[str, str] = {}  # device kind -> reason
        self.kernels: dict[str, Kernel] = {}
        self._by_op: dict[tuple[str, str], list[Kernel]] = defaultdict(list)
        self._device_cache: dict[str, Device] = {}
        found = list(_entry_point_plugins()) if entry_points else []
        for name, target in [*found, *plugins]:
            if name in blocked or (allowed and name not in allowed):
                self.records[name] = PluginRecord(name, status="blocked", reason="blocked by configuration (plugins)")
                continue
            self._load(name, target)
        self.devices.sort(key=lambda d: -d.provider.priority)

    # -- loading --------------------------------------------------------------------------
    def _load(self, name: str, target: Any) -> None:
        rec = self.records[name] = PluginRecord(name)
        try:
            plugin = importlib.import_module(target) if isinstance(target, str) else target
            rec.module = getattr(plugin, "__name__", type(plugin).__name__)
            rec.version = str(getattr(plugin, "__version__", ""))
            unknown = [a for a in dir(plugin) if a.startswith("opruntime_")
                       and not hasattr(self.pm.hook, a)]
            if unknown:
                raise PluginError(f"unknown hook(s) {', '.join(unknown)}; the hooks are "
                                  f"{', '.join(h for h in dir(hookspecs) if h.startswith('opruntime_'))}")
            self.pm.register(plugin, name=name)
        except Exception as exc:  # isolate: one broken plugin must not take the others down
            self._fail(rec, f"failed to load: {type(exc).__name__}: {exc}")
            return
        self.pm.check_pending()
        self._collect(rec, plugin)

    def _collect(self, rec: PluginRecord, plugin: Any) -> None:
        providers: Sequence[DeviceProvider] = ()
        impl = getattr(plugin, "opruntime_devices", None)
        if impl is not None:
            try:
                providers = list(impl() or ())
            except BackendUnavailable as exc:
                rec.status, rec.reason, rec.device_kinds = "unavailable", exc.reason, exc.kinds
                for kind in exc.kinds:
                    self.unavailable.setdefault(kind, f"{exc.reason} (plugin {rec.name!r})")
            except Exception as exc:
                self._fail(rec, f"opruntime_devices raised {type(exc).__name__}: {exc}")
                return
            wrong = [p for p in providers if not isinstance(p, DeviceProvider)]
            if wrong:  # checked here, or one bad record would break the registry for every plugin
                self._fail(rec, f"opruntime_devices returned {wrong[0]!r}, not a DeviceProvider")
                return
        known = {d.name for d in self.devices}
        for p in providers:
            if p.name in known:
                warnings.warn(f"plugin {rec.name!r}: device {p.name!r} already provided; ignored",
                              FallbackWarning, stacklevel=3)
                continue
            self.devices.append(Device._make(p))
            rec.devices.append(p.name)
        rec.device_kinds = rec.device_kinds or tuple(dict.fromkeys(p.kind for p in providers))
        impl = getattr(plugin, "opruntime_kernels", None)
        if impl is None:
            return
        try:
            kernels = list(impl() or ())
        except Exception as exc:
            self._fail(rec, f"opruntime_kernels raised {type(exc).__name__}: {exc}")
            return
        wrong = [k for k in kernels if not isinstance(k, Kernel)]
        if wrong:
            self._fail(rec, f"opruntime_kernels returned {wrong[0]!r}, not an opruntime.Kernel")
            return
        for k in kernels:
            if k.name in self.kernels:
                warnings.warn(f"plugin {rec.name!r}: kernel {k.name!r} already registered; ignored",
                              FallbackWarning, stacklevel=3)
                continue
            self.kernels[k.name] = k
            self._by_op[k.op, k.device_kind].append(k)
            rec.kernels += 1

    def _fail(self, rec: PluginRecord, reason: str) -> None:
        rec.status, rec.reason = "failed", reason
        if rec.devices:  # a disabled plugin offers no devices (they would have no kernels)
            self.devices = [d for d in self.devices if d.name not in rec.devices]
            rec.devices = []
        msg = f"opruntime plugin {rec.name!r} {reason}; it is disabled, other plugins keep working"
        log.warning(msg)
        warnings.warn(msg, FallbackWarning, stacklevel=4)
        try:
            if self.pm.has_plugin(rec.name):
                self.pm.unregister(name=rec.name)
        except Exception:  # pragma: no cover - pluggy internals
            pass

    # -- queries --------------------------------------------------------------------------
    def device(self, name: str) -> Device:
        """The present device called ``name`` (see :func:`opruntime.devices.resolve_name`)."""
        dev = self._device_cache.get(name)
        if dev is None:
            try:
                dev = self._device_cache[name] = resolve_name(name, self.devices, self.unavailable)
            except UnknownDeviceError as exc:
                off = [f"{r.name} ({r.status}: {r.reason})" for r in self.records.values()
                       if r.status in ("blocked", "failed")]
                if not off:
                    raise
                # a blocked or broken plugin may be the one that provides it: unavailable, not unknown
                raise DeviceUnavailableError(f"{exc} Plugins not loaded here: {'; '.join(off)}") from exc
        return dev

    def plugin_of(self, device_name: str) -> PluginRecord | None:
        """The record of the plugin that provides ``device_name``."""
        return next((r for r in self.records.values() if device_name in r.devices), None)

    def kernels_for(self, op: str, device_kind: str) -> list[Kernel]:
        """Every kernel of ``op`` registered for ``device_kind``."""
        return self._by_op.get((op, device_kind), [])

    def device_of(self, data: Any) -> Device | None:
        """The device whose provider owns the native array ``data``, if any."""
        for dev in self.devices:
            if dev.provider.owns(data):
                return dev
        return None


def _entry_point_plugins() -> list[tuple[str, str]]:
    eps = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    return sorted({(ep.name, ep.value) for ep in eps})


_lock = threading.RLock()
_registry: Registry | None = None
_extra: list[tuple[str, Any]] = []


def registry() -> Registry:
    """The process-wide registry, built on first use from entry points and config."""
    global _registry
    reg = _registry
    if reg is None:
        from .config import settings

        with _lock:
            if _registry is None:
                s = settings()
                _registry = Registry(_extra, blocked=s.blocked_plugins, allowed=s.allowed_plugins)
            reg = _registry
    return reg


def available_devices() -> list[Device]:
    """The devices present on this machine, best first (the default device is the first)."""
    return list(registry().devices)


def register(plugin: Any, name: str | None = None) -> None:
    """Register a plugin object in this process (tests, notebooks); rebuilds the registry."""
    with _lock:
        _extra.append((name or getattr(plugin, "__name__", repr(plugin)), plugin))
    reset()


def unregister(name: str) -> None:
    """Remove a plugin registered with :func:`register`; rebuilds the registry."""
    with _lock:
        _extra[:] = [(n, p) for n, p in _extra if n != name]
    reset()


def reset() -> None:
    """Forget the registry and every cached decision; the next call rebuilds them."""
    global _registry
    with _lock:
        _registry = None
        from . import selector

        selector.clear_cache()
