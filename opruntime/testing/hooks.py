"""Conformance of a plugin's hooks: it loaded, its hookimpls match the hookspecs, the records it
returns are well formed, and importing it loads no device stack."""

# ruff: noqa: BLE001 - whatever a plugin (or a thread) raises is reported, never let through

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from .. import hookspecs
from ..devices import Device
from ..hookspecs import DeviceProvider
from ..kernels import Kernel
from ..ops import OPS
from ..ops.base import FLOAT_ORDER
from ..plugins import Registry, registry
from .findings import Finding, _exc

#: Device stacks a plugin must not import at module import time (``import opruntime`` stays light).
STACKS = ("cupy", "pyopencl", "jax", "jaxlib", "torch", "tensorflow", "triton", "pycuda")
NAME = re.compile(r"^[A-Za-z0-9_]+\.(?P<op>[a-z_0-9]+)\.[A-Za-z0-9_.\-]+$")


def check_hooks(name: str, reg: Registry | None = None) -> list[Finding]:
    """The plugin ``name`` loaded, its hookimpls match the hookspecs, and what they return is well formed."""
    reg = reg or registry()
    out: list[Finding] = []

    def fail(msg: str, failed: bool = True) -> None:
        out.append(Finding("hooks", f"plugin {name!r}", msg, failed))

    rec = reg.records.get(name)
    if rec is None:
        fail(f"not loaded; plugins here: {', '.join(reg.records) or 'none'} (is its entry point in the "
             f"'opruntime.backends' group, and the package installed?)")
        return out
    if rec.status == "failed":
        fail(rec.reason)
        return out
    if rec.status == "blocked":
        fail(f"blocked by configuration ({rec.reason}); nothing checked", failed=False)
        return out
    if rec.status == "unavailable":
        fail(f"reports no devices here: {rec.reason}", failed=False)
        if not rec.device_kinds:
            fail("BackendUnavailable carries no kinds=[...]: users get 'unknown device' instead of the reason")
    plugin = reg.pm.get_plugin(name)
    for problem in hookspecs.contract_errors(plugin):  # the rule the registry refuses plugins by
        fail(problem)
    implemented = {caller.name for caller in reg.pm.get_hookcallers(plugin) or []}
    if not implemented:
        fail(f"implements none of the hooks {', '.join(hookspecs.HOOKS)}")
    for dev_name in rec.devices:
        out += _check_provider(reg.device(dev_name).provider, name)
    if "opruntime_kernels" in implemented:
        out += _check_kernel_records(plugin, name, reg)
    return out


def _check_provider(p: DeviceProvider, plugin: str) -> list[Finding]:
    out: list[Finding] = []
    subject = f"plugin {plugin!r} device {getattr(p, 'name', p)!r}"

    def fail(msg: str) -> None:
        out.append(Finding("hooks", subject, msg))

    if not isinstance(p, DeviceProvider):
        fail(f"opruntime_devices returned {type(p).__name__}, not a DeviceProvider subclass instance")
        return out
    if not p.kind or p.kind != p.kind.lower() or ":" in p.kind:
        fail(f"kind {p.kind!r} must be a non-empty lower-case word")
    if p.name != p.kind and not p.name.startswith(p.kind + ":"):
        fail(f"name {p.name!r} must be {p.kind!r} or start with {p.kind + ':'!r}")
    if not isinstance(p.priority, int):
        fail(f"priority {p.priority!r} must be an int")
    if not isinstance(p.array_types, tuple) or not all(isinstance(t, type) for t in p.array_types):
        fail(f"array_types {p.array_types!r} must be a tuple of classes")
    try:
        fp = p.fingerprint()
        if not fp or not all(isinstance(k, str) and isinstance(v, str) for k, v in fp.items()):
            fail(f"fingerprint() must be a non-empty dict of str to str (it keys the tuning cache), got {fp!r}")
        json.dumps(fp)
    except Exception as exc:
        fail(f"fingerprint() raised {_exc(exc)}")
    try:
        info = p.info()
        if not isinstance(info, Mapping):
            fail(f"info() must return a dict, got {type(info).__name__}")
    except Exception as exc:
        fail(f"info() raised {_exc(exc)}")
    return out


def _check_kernel_records(plugin: Any, name: str, reg: Registry) -> list[Finding]:
    out: list[Finding] = []
    try:
        records = reg._call("opruntime_kernels", plugin)
    except Exception as exc:
        return [Finding("hooks", f"plugin {name!r}", f"opruntime_kernels raised {_exc(exc)}")]
    known_kinds = {d.kind for d in reg.devices} | set(reg.unavailable)
    seen: set[str] = set()
    for k in records:
        subject = f"plugin {name!r} kernel {getattr(k, 'name', k)!r}"

        def fail(msg: str, failed: bool = True, subject: str = subject) -> None:
            out.append(Finding("hooks", subject, msg, failed))

        if not isinstance(k, Kernel):
            fail(f"opruntime_kernels returned {type(k).__name__}, not an opruntime.Kernel")
            continue
        if k.name in seen:
            fail("the name appears twice in this plugin's kernels")
        seen.add(k.name)
        if k.op not in OPS:
            fail(f"op {k.op!r} is not an operator; operators: {', '.join(OPS)}")
        m = NAME.match(k.name)
        if not m or m["op"] != k.op:
            fail(f"name must read '{name}.{k.op}.<variant>'")
        elif not k.name.startswith(name + "."):
            fail(f"name is outside the plugin's namespace {name + '.'!r}: the registry refuses the plugin")
        if not k.dtypes or not set(k.dtypes) <= set(FLOAT_ORDER):
            fail(f"dtypes {sorted(k.dtypes)} must be a non-empty subset of {', '.join(FLOAT_ORDER)}")
        if not isinstance(k.dtypes, frozenset):
            fail(f"dtypes must be a frozenset of names, got {type(k.dtypes).__name__}")
        if not (callable(k.run) or callable(k.prepare)) or not callable(k.supports):
            fail("run or prepare, and supports, must be callables")
        if k.cost is None:
            fail("has no cost(): it ranks after every kernel that has one", failed=False)
        elif not callable(k.cost):
            fail("cost must be a callable cost(problem, config) -> seconds")
        if k.config_for is not None and not callable(k.config_for):
            fail("config_for must be a callable config_for(problem) -> configs")
        if not k.configs or not all(isinstance(c, Mapping) for c in k.configs):
            fail(f"configs must be a non-empty tuple of mappings (use ({{}},) for none), got {k.configs!r}")
        else:
            try:
                json.dumps([dict(c) for c in k.configs])
            except (TypeError, ValueError):
                fail("configs must hold plain data (the tuning cache stores them as JSON)")
        if not k.device_kind:
            fail("device_kind is empty")
        elif k.device_kind not in known_kinds:
            fail(f"device kind {k.device_kind!r} is provided by no plugin here", failed=False)
        if not isinstance(k.source, str):
            fail("source must be a str (its hash invalidates tuning results)")
        owner = reg.kernels.get(k.name)
        if owner is None or owner.op != k.op or owner.device_kind != k.device_kind:
            fail("is not in the registry (another plugin registered the same name first)")
    return out


def check_lazy_import(module: str, stacks: Sequence[str] = STACKS) -> list[Finding]:
    """Importing the plugin's module in a fresh interpreter loads no device stack."""
    code = ("import importlib, sys; importlib.import_module(sys.argv[1]); "
            "print(' '.join(m for m in sys.argv[2:] if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code, module, *stacks], capture_output=True, text=True, timeout=120,
                          check=False)
    if proc.returncode:
        return [Finding("hooks", f"module {module!r}", f"failed to import: {proc.stderr.strip()[-500:]}")]
    loaded = proc.stdout.split()
    if loaded:
        return [Finding("hooks", f"module {module!r}", f"importing it loads {', '.join(loaded)}: import device "
                        "stacks inside the hooks and kernels, not at module level")]
    return []


def plugin_kernels(name: str, reg: Registry | None = None) -> list[Kernel]:
    """The registered kernels that plugin ``name`` supplies."""
    reg = reg or registry()
    return [k for k in reg.kernels.values() if k.plugin == name]


def device_plugin(device: Device, reg: Registry | None = None) -> str | None:
    """The plugin that provides ``device``."""
    reg = reg or registry()
    return next((r.name for r in reg.records.values() if device.name in r.devices), None)
