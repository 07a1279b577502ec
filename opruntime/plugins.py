"""Loading backend plugins and building the registry of devices and kernels.

The registry is built once, on first use: the built-in and third-party backends are found
through the entry-point group ``opruntime.backends``; each is imported, checked against the
contract (:func:`opruntime.hookspecs.contract_errors`) and asked for its devices and kernels
through pluggy (``pm.hook``), one plugin at a time, so that a broken plugin is reported by name
and the others keep working. Kernel names live in their plugin's namespace, and a kernel or
device name is owned by the first plugin that registers it: a later claim refuses the plugin,
with an error naming both.

Loading is lazy: a plugin that declares its device kinds (the ``opruntime_device_kinds`` hook)
is imported and checked when the registry is built, but its devices and kernels are collected
(``opruntime_devices``, ``opruntime_kernels``: where the device stacks are imported) only when a
device of one of those kinds is needed: a name of that kind is resolved, a native array of one of
its modules or a DLPack array on a device it may hold is an operand, or the full view is asked
(``devices``, ``records``, ``kernels``, ``unavailable``: ``opr.devices()``, ``opruntime info``,
the default device when none is configured). A plugin that declares nothing is loaded at once.
So ``OPRUNTIME_DEVICE=cpu`` imports neither JAX nor pyopencl nor CuPy.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import threading
import warnings
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pluggy

from . import config, hookspecs
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
    status: str = "ok"  # ok | unavailable | failed | blocked | deferred (declared, not loaded yet)
    reason: str = ""
    device_kinds: tuple[str, ...] = ()
    devices: list[str] = field(default_factory=list)
    kernels: int = 0


class Registry:
    """Every present device and every registered kernel, by name and by (op, device kind).

    ``devices``, ``records``, ``kernels`` and ``unavailable`` are the full view: reading one loads
    every deferred plugin first. The queries the calls use (:meth:`device`, :meth:`kernels_for`,
    :meth:`device_of`, :meth:`dlpack_holder`) load only the plugins they need.
    """

    def __init__(self, plugins: Sequence[tuple[str, Any]] = (), *, entry_points: bool = True,
                 blocked: Sequence[str] = (), allowed: Sequence[str] = ()) -> None:
        self.plugin_setting = (tuple(blocked), tuple(allowed))
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self._records: dict[str, PluginRecord] = {}
        self._devices: list[Device] = []
        self._unavailable: dict[str, str] = {}  # device kind -> reason
        self._kernels: dict[str, Kernel] = {}
        self._by_op: dict[tuple[str, str], list[Kernel]] = defaultdict(list)
        self._device_cache: dict[str, Device] = {}
        self._solo: dict[int, tuple[Any, pluggy.PluginManager]] = {}
        #: plugin name -> (its record, the plugin, its declaration: kind -> module names), until loaded
        self._pending: dict[str, tuple[PluginRecord, Any, dict[str, tuple[str, ...]]]] = {}
        self._declared: set[str] = set()  # every kind some plugin declared
        self._loading = threading.RLock()
        found = list(_entry_point_plugins()) if entry_points else []
        for name, target in [*found, *plugins]:
            if name in blocked or (allowed and name not in allowed):
                self._records[name] = PluginRecord(name, status="blocked", reason="blocked by configuration (plugins)")
                continue
            self._load(name, target)
        self._devices.sort(key=lambda d: -d.provider.priority)

    # -- the full view: every plugin loaded ------------------------------------------------
    @property
    def records(self) -> dict[str, PluginRecord]:
        """Plugin name -> what ``opruntime info`` shows about it (every plugin loaded first)."""
        self.load()
        return self._records

    @property
    def devices(self) -> list[Device]:
        """The present devices, best first (every plugin loaded first)."""
        self.load()
        return self._devices

    @property
    def kernels(self) -> dict[str, Kernel]:
        """Kernel name -> Kernel, of every plugin (every plugin loaded first)."""
        self.load()
        return self._kernels

    @property
    def unavailable(self) -> dict[str, str]:
        """Device kind -> why no device of that kind is here (every plugin loaded first)."""
        self.load()
        return self._unavailable

    def load(self, kinds: Sequence[str] | None = None, module: str | None = None) -> None:
        """Load the deferred plugins that declared one of ``kinds``, or a device for arrays of
        ``module`` (a top-level module name); every deferred plugin when both are None."""
        if not self._pending:
            return
        with self._loading:
            for name, (_, _, declared) in list(self._pending.items()):
                wanted = (kinds is None and module is None) or bool(kinds and set(kinds) & set(declared)) or \
                    any(module in mods for mods in declared.values())
                if wanted:
                    self._complete(name)
            self._devices.sort(key=lambda d: -d.provider.priority)

    def present(self, device: Device) -> bool:
        """True when ``device`` is one of this registry's devices (a Device exists only once its
        plugin is loaded, so no plugin is loaded to answer)."""
        return any(d is device or d.name == device.name for d in self._devices)

    # -- loading --------------------------------------------------------------------------
    def _load(self, name: str, target: Any) -> None:
        if name in self._records:  # two entry points (or a register()) under one name: the first keeps it
            msg = (f"opruntime plugin {name!r} ({target!r}) refused: the name is taken by the plugin loaded first "
                   f"({self._records[name].module or name}); register it under another name")
            log.warning(msg)
            warnings.warn(msg, FallbackWarning, stacklevel=3)
            return
        rec = self._records[name] = PluginRecord(name)
        try:
            plugin = importlib.import_module(target) if isinstance(target, str) else target
            rec.module = getattr(plugin, "__name__", type(plugin).__name__)
            rec.version = str(getattr(plugin, "__version__", ""))
            broken = hookspecs.contract_errors(plugin)
            if broken:
                raise PluginError("; ".join(broken))
            self.pm.register(plugin, name=name)
            self.pm.check_pending()
            declared = self._declaration(plugin)
        except Exception as exc:  # isolate: one broken plugin must not take the others down
            self._fail(rec, f"failed to load: {type(exc).__name__}: {exc}")
            return
        if declared:
            self._declared |= set(declared)
            rec.status, rec.device_kinds = "deferred", tuple(declared)
            rec.reason = f"loaded when a {' or '.join(declared)} device is first needed"
            self._pending[name] = (rec, plugin, declared)
            return
        self._collect(rec, plugin)

    def _declaration(self, plugin: Any) -> dict[str, tuple[str, ...]]:
        """The plugin's ``opruntime_device_kinds`` (kind -> module names), validated; empty when it
        does not implement the hook (it is then loaded at once)."""
        results = self._solo_pm(plugin).hook.opruntime_device_kinds()
        out: dict[str, tuple[str, ...]] = {}
        for result in results:
            ok = isinstance(result, Mapping) and all(
                isinstance(k, str) and isinstance(m, (list, tuple)) and all(isinstance(x, str) for x in m)
                for k, m in result.items())
            if not ok:
                raise PluginError(f"opruntime_device_kinds returned {result!r}, not a mapping of device kind -> "
                                  f"module names, e.g. {{'cuda': ['cupy']}}")
            out.update({k: tuple(m) for k, m in result.items()})
        return out

    def _solo_pm(self, plugin: Any) -> pluggy.PluginManager:
        """A plugin manager holding ``plugin`` alone (pluggy's subset callers need hashable
        plugins, and plugin objects may not be)."""
        solo = self._solo.get(id(plugin))
        if solo is None or solo[0] is not plugin:
            pm = pluggy.PluginManager(hookspecs.PROJECT)
            pm.add_hookspecs(hookspecs)
            pm.register(plugin)
            solo = self._solo[id(plugin)] = (plugin, pm)
        return solo[1]

    def _call(self, hook: str, plugin: Any) -> list[Any]:
        """The results of ``hook`` from ``plugin`` alone, called through pluggy, flattened."""
        results = getattr(self._solo_pm(plugin).hook, hook)()
        return [x for result in results for x in (result or ())]

    def _collect(self, rec: PluginRecord, plugin: Any) -> None:
        try:
            providers = self._call("opruntime_devices", plugin)
        except BackendUnavailable as exc:
            providers = []
            rec.status, rec.reason, rec.device_kinds = "unavailable", exc.reason, exc.kinds
            for kind in exc.kinds:
                self._unavailable.setdefault(kind, f"{exc.reason} (plugin {rec.name!r})")
        except Exception as exc:
            self._fail(rec, f"opruntime_devices raised {type(exc).__name__}: {exc}")
            return
        wrong = [p for p in providers if not isinstance(p, DeviceProvider)]
        if wrong:  # checked here, or one bad record would break the registry for every plugin
            self._fail(rec, f"opruntime_devices returned {wrong[0]!r}, not a DeviceProvider")
            return
        self._load_earlier(rec.name, {p.kind for p in providers})
        for p in providers:
            owner = next((r for r in self._records.values() if p.name in r.devices), None)
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
            if k.name in self._kernels or k.name in names:  # twice in this plugin's list: one would hide the other
                self._refuse(rec, f"kernel {k.name!r} is registered twice")
                return
            names.add(k.name)
        for p in providers:
            self._devices.append(Device._make(p))
            rec.devices.append(p.name)
        rec.device_kinds = rec.device_kinds or tuple(dict.fromkeys(p.kind for p in providers))
        for k in kernels:
            self._kernels[k.name] = k
            self._by_op[k.op, k.device_kind].append(k)
            rec.kernels += 1

    def _load_earlier(self, name: str, kinds: set[str]) -> None:
        """Load the deferred plugins registered before ``name`` that declared one of ``kinds``: a
        device name belongs to the plugin registered first, whichever is loaded first."""
        order = list(self._records)
        earlier = [n for n, (_, _, declared) in self._pending.items()
                   if order.index(n) < order.index(name) and kinds & set(declared)]
        for n in earlier:
            self._complete(n)

    def _complete(self, name: str) -> None:
        """Collect the devices and kernels of the deferred plugin ``name`` (once)."""
        entry = self._pending.pop(name, None)
        if entry is not None:
            entry[0].status, entry[0].reason = "ok", ""
            self._collect(entry[0], entry[1])

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
        """The present device called ``name`` (see :func:`opruntime.devices.resolve_name`),
        loading the plugins that declared its kind (every plugin for a kind nobody declared)."""
        dev = self._device_cache.get(name)
        if dev is None:
            if not isinstance(name, str):
                return Device(name)  # a Device itself, or the typed error for anything else
            kind = name.strip().lower().split(":", 1)[0]
            self.load([kind] if kind in self._declared else None)
            try:
                try:
                    dev = resolve_name(name, self._devices, self._unavailable)
                except UnknownDeviceError:
                    if not self._pending:
                        raise
                    self.load()  # an alias, or a kind of a plugin that declared others: ask every plugin
                    dev = resolve_name(name, self._devices, self._unavailable)
            except UnknownDeviceError as exc:
                off = [f"{r.name} ({r.status}: {r.reason})" for r in self._records.values()
                       if r.status in ("blocked", "failed")]
                if not off:
                    raise
                # a blocked or broken plugin may be the one that provides it: unavailable, not unknown
                raise DeviceUnavailableError(f"{exc} Plugins not loaded here: {'; '.join(off)}") from exc
            self._device_cache[name] = dev
        return dev

    def plugin_of(self, device_name: str) -> PluginRecord | None:
        """The record of the plugin that provides ``device_name``."""
        return next((r for r in self._records.values() if device_name in r.devices), None)

    def kernels_for(self, op: str, device_kind: str) -> list[Kernel]:
        """Every kernel of ``op`` registered for ``device_kind``."""
        if self._pending:
            self.load([device_kind] if device_kind in self._declared else None)
        return self._by_op.get((op, device_kind), [])

    def device_of(self, data: Any) -> Device | None:
        """The device whose provider owns the native array ``data``, if any (loading the deferred
        plugins that declared the module ``data``'s type comes from)."""
        for attempt in range(2):
            for dev in self._devices:
                if dev.provider.owns(data):
                    return dev
            if attempt or not self._pending:
                return None
            self.load(module=type(data).__module__.partition(".")[0])
        return None

    def dlpack_holder(self, where: tuple[int, int]) -> Device | None:
        """The best device whose memory DLPack calls ``where`` (``(device_type, device_id)``), which
        imports such an array without a copy (:meth:`DeviceProvider.holds_dlpack`), or None."""
        for attempt in range(2):
            dev = next((d for d in self._devices if d.provider.holds_dlpack(*where)), None)
            if dev is not None or attempt or not self._pending:
                return dev
            self.load()
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


def plugin_names() -> set[str]:
    """Every plugin name the ``plugins`` setting may use: the installed entry points and the
    plugins given to :func:`register`."""
    return {name for name, _ in _entry_point_plugins()} | {name for name, _ in _extra}


config_listeners.append(_settings_changed)
config.PLUGIN_NAMES = plugin_names
Device.lookup = lambda name: registry().device(name)
