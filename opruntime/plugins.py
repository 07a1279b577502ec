"""Loading backend plugins and building the registry of devices and kernels.

The registry is built once, on first use: the built-in and third-party backends are found
through the entry-point group ``opruntime.backends``; each is imported, checked against the
contract (:func:`opruntime.hookspecs.contract_errors`) and asked for its devices and kernels
through pluggy (``pm.hook``), one plugin at a time, so that a broken plugin is reported by name
and the others keep working. Kernel names live in their plugin's namespace, and a kernel or
device name is owned by the first plugin that registers it: a later claim refuses the plugin,
with an error naming both.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import threading
import warnings
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pluggy

from . import hookspecs
from .config import Settings, settings
from .config import listeners as config_listeners
from .devices import Device, resolve_name
from .errors import (
    BackendUnavailable,
    DeviceUnavailableError,
    FallbackWarning,
    PluginError,
    UnknownDeviceError,
)
from .hookspecs import DeviceProvider
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
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.records: dict[str, PluginRecord] = {}
        self.devices: list[Device] = []
        self.unavailable: dict[str, str] = {}  # device kind -> reason
        self.kernels: dict[str, Kernel] = {}
        self._by_op: dict[tuple[str, str], list[Kernel]] = defaultdict(list)
        self._device_cache: dict[str, Device] = {}
        self._solo: dict[int, tuple[Any, pluggy.PluginManager]] = {}
        found = list(_entry_point_plugins()) if entry_points else []
        for name, target in [*found, *plugins]:
            if name in blocked or (allowed and name not in allowed):
                self.records[name] = PluginRecord(name, status="blocked", reason="blocked by configuration (plugins)")
                continue
            self._load(name, target)
        self.devices.sort(key=lambda d: -d.provider.priority)

    # -- loading --------------------------------------------------------------------------
    def _load(self, name: str, target: Any) -> None:
        if name in self.records:  # two entry points (or a register()) under one name: the first keeps it
            msg = (f"opruntime plugin {name!r} ({target!r}) refused: the name is taken by the plugin loaded first "
                   f"({self.records[name].module or name}); register it under another name")
            log.warning(msg)
            warnings.warn(msg, FallbackWarning, stacklevel=3)
            return
        rec = self.records[name] = PluginRecord(name)
        try:
            plugin = importlib.import_module(target) if isinstance(target, str) else target
            rec.module = getattr(plugin, "__name__", type(plugin).__name__)
            rec.version = str(getattr(plugin, "__version__", ""))
            broken = hookspecs.contract_errors(plugin)
            if broken:
                raise PluginError("; ".join(broken))
            self.pm.register(plugin, name=name)
            self.pm.check_pending()
        except Exception as exc:  # isolate: one broken plugin must not take the others down
            self._fail(rec, f"failed to load: {type(exc).__name__}: {exc}")
            return
        self._collect(rec, plugin)

    def _call(self, hook: str, plugin: Any) -> list[Any]:
        """The results of ``hook`` from ``plugin`` alone, called through pluggy (a plugin manager
        of its own: pluggy's subset callers need hashable plugins, and plugin objects may not be)."""
        solo = self._solo.get(id(plugin))
        if solo is None or solo[0] is not plugin:
            pm = pluggy.PluginManager(hookspecs.PROJECT)
            pm.add_hookspecs(hookspecs)
            pm.register(plugin)
            solo = self._solo[id(plugin)] = (plugin, pm)
        results = getattr(solo[1].hook, hook)()
        return [x for result in results for x in (result or ())]

    def _collect(self, rec: PluginRecord, plugin: Any) -> None:
        try:
            providers = self._call("opruntime_devices", plugin)
        except BackendUnavailable as exc:
            providers = []
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
        for p in providers:
            owner = next((r for r in self.records.values() if p.name in r.devices), None)
            if owner is not None:
                self._refuse(rec, f"device {p.name!r} is already provided by plugin {owner.name!r}")
                return
        try:
            kernels = self._call("opruntime_kernels", plugin)
        except Exception as exc:
            self._fail(rec, f"opruntime_kernels raised {type(exc).__name__}: {exc}")
            return
        wrong = [k for k in kernels if not isinstance(k, Kernel)]
        if wrong:
            self._fail(rec, f"opruntime_kernels returned {wrong[0]!r}, not an opruntime.Kernel")
            return
        names: set[str] = set()
        for k in kernels:
            if k.plugin != rec.name:
                self._refuse(rec, f"kernel {k.name!r} is outside its namespace: kernels of plugin {rec.name!r} "
                             f"are named '{rec.name}.<op>.<variant>'")
                return
            if k.name in self.kernels or k.name in names:  # twice in this plugin's list: one would hide the other
                self._refuse(rec, f"kernel {k.name!r} is registered twice")
                return
            names.add(k.name)
        for p in providers:
            self.devices.append(Device._make(p))
            rec.devices.append(p.name)
        rec.device_kinds = rec.device_kinds or tuple(dict.fromkeys(p.kind for p in providers))
        for k in kernels:
            self.kernels[k.name] = k
            self._by_op[k.op, k.device_kind].append(k)
            rec.kernels += 1

    def _refuse(self, rec: PluginRecord, reason: str) -> None:
        self._fail(rec, f"refused: {reason}")

    def _fail(self, rec: PluginRecord, reason: str) -> None:
        rec.status, rec.reason = "failed", reason
        msg = f"opruntime plugin {rec.name!r} {reason}; it is disabled, other plugins keep working"
        log.warning(msg)
        warnings.warn(msg, FallbackWarning, stacklevel=4)
        if self.pm.has_plugin(rec.name):
            self.pm.unregister(name=rec.name)

    # -- queries --------------------------------------------------------------------------
    def device(self, name: str) -> Device:
        """The present device called ``name`` (see :func:`opruntime.devices.resolve_name`)."""
        dev = self._device_cache.get(name)
        if dev is None:
            if not isinstance(name, str):
                return Device(name)  # a Device itself, or the typed error for anything else
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

    def build_variants(self) -> list[tuple[str, dict[str, Any]]]:
        """Every plugin's ``opruntime_build_variants``, paths made absolute."""
        import os

        out = []
        for plugin in self.pm.get_plugins():
            base = os.path.dirname(getattr(plugin, "__file__", "") or ".")
            for path, defines in self._call("opruntime_build_variants", plugin):
                out.append((os.path.join(base, path), dict(defines)))
        return out


def _entry_point_plugins() -> list[tuple[str, str]]:
    eps = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    return sorted({(ep.name, ep.value) for ep in eps})


_lock = threading.RLock()
_registry: Registry | None = None
_extra: list[tuple[str, Any]] = []
#: called after the registry is forgotten (the plan cache drops its plans); layers above add theirs
reset_listeners: list[Callable[[], None]] = []


def registry() -> Registry:
    """The process-wide registry, built on first use from entry points and config."""
    global _registry
    reg = _registry
    if reg is None:
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
    """Register a plugin object in this process (tests, notebooks) and rebuild the registry.

    Raises:
        PluginError: the plugin breaks the contract, claims a name another plugin owns, or is
            blocked by the ``plugins`` setting (it is not kept).
    """
    name = name or getattr(plugin, "__name__", repr(plugin))
    with _lock:
        records = registry().records
        if name in records or any(n == name for n, _ in _extra):
            owner = records[name].module if name in records else name
            raise PluginError(f"register: the plugin name {name!r} is taken (by plugin {owner!r}); give another name=")
        _extra.append((name, plugin))
        reset()
        rec = None
        try:
            with warnings.catch_warnings():  # this plugin's refusal is raised below, not announced
                warnings.simplefilter("ignore", FallbackWarning)
                rec = registry().records.get(name)
        finally:  # blocked counts as refused: the plugin would do nothing, silently
            refused = rec is None or rec.status in ("failed", "blocked")
            if refused:
                _extra.remove((name, plugin))
                reset()
        if refused:
            raise PluginError(f"plugin {name!r} {rec.reason if rec is not None else 'failed to register'}")


def unregister(plugin: Any) -> None:
    """Remove a plugin given to :func:`register`, by the object or by its name; rebuilds the registry.

    Raises:
        PluginError: nothing registered under that object or name.
    """
    with _lock:
        kept = [(n, p) for n, p in _extra if p is not plugin and n != plugin]
        if len(kept) == len(_extra):
            raise PluginError(f"unregister: {plugin!r} was not registered with opruntime.register(); "
                              f"registered: {', '.join(n for n, _ in _extra) or 'none'}")
        _extra[:] = kept
    reset()


def reset() -> None:
    """Forget the registry and every cached decision; the next call rebuilds them."""
    global _registry
    with _lock:
        _registry = None
    for listener in reset_listeners:
        listener()


# -- device resolution ------------------------------------------------------------------------
_announced: set[tuple[str, ...]] = set()


def resolve_device(s: Settings, op: str, wanted: Any = None) -> Device:
    """The device for host data of ``op``: the call's ``wanted`` (a name, a list, a Device), else
    the op's setting, else the global one, else the best present device."""
    reg = registry()
    if wanted is not None:
        if isinstance(wanted, Device):
            return wanted
        if isinstance(wanted, str):
            names = (wanted,)
        elif isinstance(wanted, (list, tuple)) and all(isinstance(w, (str, Device)) for w in wanted):
            names = tuple(str(w) for w in wanted)
        else:
            raise UnknownDeviceError(f"{op}: device= takes a name such as 'cpu' or 'cuda:0', an opr.Device or a "
                                     f"list of them; got {wanted!r} ({type(wanted).__name__})")
        source = "the device= argument"
    else:
        op_s = s.ops.get(op)
        if op_s and op_s.device:
            names, source = op_s.device, s.origin.get(f"ops.{op}", "config")
        elif s.device:
            names, source = s.device, s.origin.get("device", "config")
        else:
            if not reg.devices:
                raise DeviceUnavailableError("no device is available: no backend plugin loaded (see `opruntime info`)")
            return reg.devices[0]
    errors = []
    for name in names:
        try:
            dev = reg.device(name)
        except DeviceUnavailableError as exc:
            errors.append(str(exc))
            continue
        if errors:
            _announce_fallback(s, names, dev.name, errors, source)
        return dev
    raise DeviceUnavailableError(
        f"{op}: none of the devices {list(names)} (from {source}) is available:\n  " + "\n  ".join(errors)
    )


def _announce_fallback(s: Settings, names: tuple[str, ...], chosen: str, errors: list[str], source: str) -> None:
    msg = f"opruntime: falling back to {chosen!r} from {source} {list(names)}: " + "; ".join(errors)
    if s.strict:
        raise DeviceUnavailableError(msg + " (strict mode: fallbacks raise)")
    key = (*names, chosen)
    if key not in _announced:
        _announced.add(key)
        log.warning(msg)
        warnings.warn(msg, FallbackWarning, stacklevel=4)


def _settings_changed(old: Settings | None, new: Settings) -> None:
    if old is not None and old.plugins != new.plugins:  # a different plugin set: rebuild the registry
        reset()


config_listeners.append(_settings_changed)
Device.lookup = lambda name: registry().device(name)
