"""The conformance checks. Each returns a list of :class:`Finding`: a failure breaks the plugin
contract or gives a wrong result; a note is worth knowing but allowed (a view the native array
type cannot make, a kernel that declines a problem).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import traceback
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import hookspecs
from ..devices import Device, DeviceProvider
from ..errors import DtypeError, NoKernelError
from ..kernels import Kernel
from ..ops import OPS
from ..ops.base import FLOAT_ORDER
from ..plugins import Registry, registry
from .numerics import compare, np_dtype, random_array, same_bits, with_specials
from .problems import CASES, EMPTY, Case, Unsupported, build, kernel_views, plan_for

#: Device stacks a plugin must not import at module import time (``import opruntime`` stays light).
STACKS = ("cupy", "pyopencl", "jax", "jaxlib", "torch", "tensorflow", "triton", "pycuda")
#: Shapes every device must round-trip, size 0 included.
SHAPES = [(), (0,), (1,), (7,), (1031,), (3, 0, 2), (5, 13), (1, 1, 1, 1), (2, 3, 4, 5)]
NAME = re.compile(r"^[A-Za-z0-9_]+\.(?P<op>[a-z_0-9]+)\.[A-Za-z0-9_.\-]+$")


@dataclass(frozen=True)
class Finding:
    check: str  # "hooks", "memory", "kernel", "pinned", "frontend"
    subject: str  # what was checked: a plugin, device, kernel and problem
    message: str
    failed: bool = True

    def __str__(self) -> str:
        return f"[{self.check}] {'FAIL' if self.failed else 'note'}: {self.subject}: {self.message}"


def failures(findings: Iterable[Finding]) -> list[Finding]:
    return [f for f in findings if f.failed]


def summary(findings: Sequence[Finding]) -> str:
    """Failures first, then notes, one per line."""
    return "\n".join(map(str, sorted(findings, key=lambda f: not f.failed)))


def _exc(exc: BaseException) -> str:
    where = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
    at = f" (at {where[0].filename.rsplit('/', 1)[-1]}:{where[0].lineno})" if where else ""
    return f"{type(exc).__name__}: {exc}{at}"


# -- the hook contract -----------------------------------------------------------------------------
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
    specs = [h for h in dir(hookspecs) if h.startswith("opruntime_")]
    implemented = set()
    for caller in reg.pm.get_hookcallers(plugin) or []:
        for impl in caller.get_hookimpls():
            if impl.plugin is not plugin:
                continue
            implemented.add(caller.name)
            extra = set(impl.argnames) - set(caller.spec.argnames if caller.spec else ())
            if extra:
                fail(f"{caller.name} takes {sorted(extra)}, which the hookspec does not provide")
    for h in specs:
        if h not in implemented and callable(getattr(plugin, h, None)):
            fail(f"{h} is not marked @opruntime.hookimpl: pluggy never calls it")
    if not implemented:
        fail(f"implements none of the hooks {', '.join(specs)}")
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
        records = list(plugin.opruntime_kernels() or ())
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
            fail(f"name must read '<backend>.{k.op}.<variant>'")
        elif not k.name.startswith(name + "."):
            fail(f"name does not start with the plugin name {name!r}", failed=False)
        if not k.dtypes or not set(k.dtypes) <= set(FLOAT_ORDER):
            fail(f"dtypes {sorted(k.dtypes)} must be a non-empty subset of {', '.join(FLOAT_ORDER)}")
        if not isinstance(k.dtypes, frozenset):
            fail(f"dtypes must be a frozenset of names, got {type(k.dtypes).__name__}")
        if not callable(k.run) or not callable(k.supports):
            fail("run and supports must be callables")
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
    proc = subprocess.run([sys.executable, "-c", code, module, *stacks], capture_output=True, text=True, timeout=120)
    if proc.returncode:
        return [Finding("hooks", f"module {module!r}", f"failed to import: {proc.stderr.strip()[-500:]}")]
    loaded = proc.stdout.split()
    if loaded:
        return [Finding("hooks", f"module {module!r}", f"importing it loads {', '.join(loaded)}: import device "
                        "stacks inside the hooks and kernels, not at module level")]
    return []


# -- device memory -------------------------------------------------------------------------------------
def supported_dtypes(device: Device, reg: Registry | None = None) -> list[str]:
    """The dtypes some kernel computes on ``device`` (float32 always), narrow to wide."""
    reg = reg or registry()
    names = {d for k in reg.kernels.values() if k.device_kind == device.kind for d in k.dtypes} | {"float32"}
    return [d for d in FLOAT_ORDER if d in names]


def check_memory(device: Device, dtypes: Sequence[str] | None = None, rng: np.random.Generator | None = None,
                 reg: Registry | None = None) -> list[Finding]:
    """Host round trips of every dtype and shape (size 0 and specials included), allocation,
    conversion, ownership, DLPack, synchronisation and the timer."""
    from ..tensor import Tensor

    reg = reg or registry()
    rng = rng or np.random.default_rng()
    prov = device.provider
    out: list[Finding] = []
    dtypes = list(dtypes or supported_dtypes(device, reg))

    def fail(subject: str, msg: str, failed: bool = True) -> None:
        out.append(Finding("memory", f"{device.name} {subject}", msg, failed))

    for dtype in dtypes:
        dt = np_dtype(dtype)
        for shape in SHAPES:
            subject = f"{dtype}{list(shape)}"
            host = with_specials(random_array(rng, shape, dtype))
            try:
                data = prov.from_host(host)
                back = prov.to_host(data)
            except Exception as exc:
                fail(subject, f"from_host / to_host raised {_exc(exc)}")
                continue
            if not isinstance(back, np.ndarray):
                fail(subject, f"to_host returned {type(back).__name__}, not a numpy array")
            elif not same_bits(np.asarray(back), host):
                fail(subject, f"round trip changed the data (got shape {back.shape} {back.dtype})")
            if tuple(data.shape) != shape or np.dtype(data.dtype) != dt:
                fail(subject, f"native data has shape {tuple(data.shape)} dtype {data.dtype}")
            if not prov.owns(data):
                fail(subject, "owns() is False for data from from_host: operators cannot adopt native arrays")
            for other in reg.devices:
                if other is not device and other.provider.owns(data):
                    fail(subject, f"{other.name} also claims to own this device's data")
            for alloc in ("empty", "zeros"):
                try:
                    a = getattr(prov, alloc)(shape, dt)
                    if tuple(a.shape) != shape or np.dtype(a.dtype) != dt:
                        fail(subject, f"{alloc}() gave shape {tuple(a.shape)} dtype {a.dtype}")
                    elif alloc == "zeros" and not same_bits(prov.to_host(a), np.zeros(shape, dt)):
                        fail(subject, "zeros() is not all +0.0")
                except Exception as exc:
                    fail(subject, f"{alloc}() raised {_exc(exc)}")
        out += _check_views_and_casts(device, dtype, dtypes, rng)
    out += _check_dlpack_and_timer(device, rng)
    t = Tensor._wrap(prov.from_host(np.arange(6, dtype=np.float32).reshape(2, 3)), device)
    if not np.array_equal(np.asarray(t), np.arange(6).reshape(2, 3)):
        fail("Tensor", "np.asarray(Tensor) does not give the values back")
    return out


def _check_views_and_casts(device: Device, dtype: str, dtypes: Sequence[str], rng: np.random.Generator) -> list[Finding]:
    prov, out = device.provider, []
    host = random_array(rng, (6, 10), dtype)
    for label, view in (("transposed", host.T), ("strided", host[:, ::3]), ("reversed", host[::-1])):
        try:  # operators pass any numpy array a user gives straight to from_host
            back = prov.to_host(prov.from_host(view))
            if not same_bits(np.asarray(back), np.ascontiguousarray(view)):
                out.append(Finding("memory", f"{device.name} {dtype}", f"from_host of a {label} numpy view "
                                   "gives wrong values"))
        except Exception as exc:
            out.append(Finding("memory", f"{device.name} {dtype}", f"from_host of a {label} numpy view raised {_exc(exc)}"))
    data = prov.from_host(host)
    for target in dtypes:
        want = host.astype(np_dtype(target))
        try:
            got = prov.to_host(prov.astype(data, np_dtype(target)))
            if not same_bits(np.asarray(got), want):
                out.append(Finding("memory", f"{device.name} astype {dtype}->{target}",
                                   "differs from numpy's conversion (round to nearest even)"))
        except Exception as exc:
            out.append(Finding("memory", f"{device.name} astype {dtype}->{target}", f"raised {_exc(exc)}"))
    return out


def _check_dlpack_and_timer(device: Device, rng: np.random.Generator) -> list[Finding]:
    from ..tensor import Tensor

    prov, out = device.provider, []
    host = random_array(rng, (4, 5), "float32")
    data = prov.from_host(host)
    try:
        dev_type, dev_id = prov.dlpack_device(data)
        if not (isinstance(dev_type, int) and isinstance(dev_id, int)):
            raise TypeError(f"got {(dev_type, dev_id)!r}")
    except Exception as exc:
        out.append(Finding("memory", f"{device.name} dlpack_device", f"must return two ints: {_exc(exc)}"))
    try:
        again = prov.from_dlpack(Tensor._wrap(data, device))
        if not same_bits(np.asarray(prov.to_host(again)), host):
            out.append(Finding("memory", f"{device.name} DLPack", "to_dlpack -> from_dlpack changed the data"))
    except (NotImplementedError, BufferError) as exc:
        out.append(Finding("memory", f"{device.name} DLPack", f"not supported: {_exc(exc)}", failed=False))
    except Exception as exc:
        out.append(Finding("memory", f"{device.name} DLPack", f"to_dlpack -> from_dlpack raised {_exc(exc)}"))
    try:
        prov.synchronize()
        calls = []
        times = prov.time(lambda: calls.append(1), repeats=3, warmup=1)
        if len(times) != 3 or not all(isinstance(t, float) and math.isfinite(t) and t >= 0 for t in times):
            out.append(Finding("memory", f"{device.name} time()", f"must return 3 finite seconds >= 0, got {times!r}"))
        if len(calls) != 4:
            out.append(Finding("memory", f"{device.name} time()", f"called fn {len(calls)} times for warmup=1 repeats=3"))
    except Exception as exc:
        out.append(Finding("memory", f"{device.name} synchronize / time", f"raised {_exc(exc)}"))
    return out


# -- kernels -----------------------------------------------------------------------------------------------
def check_kernel(kernel: Kernel, device: Device, cases: Sequence[Case] | None = None,
                 dtypes: Iterable[str] | None = None, configs: str = "all",
                 rng: np.random.Generator | None = None) -> list[Finding]:
    """Run ``kernel`` directly (``kernel.run`` with the Problem the frontend builds) on every case,
    dtype and config, against the float64 reference.

    Args:
        configs: ``"all"`` (every config ``config_for`` / ``configs`` offers) or ``"first"`` (the
            one the heuristic uses).
    """
    rng = rng or np.random.default_rng()
    out: list[Finding] = []
    cases = CASES[kernel.op] if cases is None else cases
    for dtype in [d for d in FLOAT_ORDER if d in set(dtypes or kernel.dtypes)]:
        declined = 0
        for case in cases:
            subject = f"{kernel.name} on {device.name}: {case.op} {case.id} {dtype}"
            r = _run_case(kernel, device, case, dtype, configs, rng, subject)
            declined += r == "declined"
            out += r if isinstance(r, list) else []
        if cases and declined == len(cases):
            out.append(Finding("kernel", f"{kernel.name} on {device.name} {dtype}",
                               "supports none of the generated problems", failed=False))
    return out


def _run_case(kernel: Kernel, device: Device, case: Case, dtype: str, configs: str, rng: np.random.Generator,
              subject: str) -> list[Finding] | str:
    out: list[Finding] = []
    try:
        built = build(case, device, dtype, rng)
        plan = plan_for(built, device)
    except Unsupported as exc:
        return [Finding("kernel", subject, str(exc), failed=False)]
    except (NoKernelError, DtypeError):
        return "declined"  # no kernel on the device (this one included) takes it
    problem, prov = plan.problem, device.provider
    try:
        if not kernel.supports(problem):
            return "declined"
    except Exception as exc:
        return [Finding("kernel", subject, f"supports() raised {_exc(exc)}")]
    cfgs = list(kernel.candidates(problem)) or [{}]
    for cfg in cfgs[:1] if configs == "first" else cfgs:
        label = f"{subject} config {dict(cfg)}"
        try:
            cost = kernel.estimate(problem, cfg)
            if not isinstance(cost, (int, float)) or math.isnan(cost) or cost < 0 or (kernel.cost and math.isinf(cost)):
                out.append(Finding("kernel", label, f"cost() returned {cost!r}; it must be finite seconds >= 0"))
        except Exception as exc:
            out.append(Finding("kernel", label, f"cost() raised {_exc(exc)}"))
        views = kernel_views(plan, built.operands)
        try:
            res = kernel.run(problem, cfg, *views)
            prov.synchronize()
        except Exception as exc:
            out.append(Finding("kernel", label, f"supports() accepted it but run raised {_exc(exc)}"))
            continue
        if any(res is v for v in views):
            out.append(Finding("kernel", label, "run returned one of its operands; it must return a new array"))
        if not prov.owns(res):
            out.append(Finding("kernel", label, f"run returned {type(res).__name__}, not a native array of this device"))
        if tuple(res.shape) != problem.out_shape or np.dtype(res.dtype) != np_dtype(problem.out_dtype):
            out.append(Finding("kernel", label, f"run returned shape {tuple(res.shape)} {res.dtype}, expected "
                               f"{problem.out_shape} {problem.out_dtype}"))
            continue
        bad = compare(np.asarray(prov.to_host(res)).reshape(plan.result_shape), built.reference, dtype)
        if bad:
            out.append(Finding("kernel", label, bad))
        for i, (base, host) in enumerate(built.bases):
            if not same_bits(np.asarray(prov.to_host(base)), host):
                out.append(Finding("kernel", label, f"run wrote into operand {i}"))
    return out


def check_pinned(kernel: Kernel, device: Device, cases: Sequence[Case] | None = None, dtype: str = "float32",
                 rng: np.random.Generator | None = None) -> list[Finding]:
    """Call the operator through the frontend with ``kernel`` pinned (strict: no fallback) on the
    cases it supports, and check that it is the kernel that ran."""
    from .. import explain
    from ..config import override
    from ..tensor import Tensor

    rng = rng or np.random.default_rng()
    out: list[Finding] = []
    if dtype not in kernel.dtypes:
        dtype = next(d for d in FLOAT_ORDER if d in kernel.dtypes)
    for case in CASES[kernel.op] if cases is None else cases:
        subject = f"{kernel.name} pinned on {device.name}: {case.op} {case.id} {dtype}"
        try:
            built = build(case, device, dtype, rng)
            plan = plan_for(built, device)
            if plan.trivial or not kernel.supports(plan.problem):
                continue
        except (Unsupported, NoKernelError, DtypeError):
            continue
        args = [Tensor._wrap(d, device) for d in built.operands]
        try:
            with override(ops={case.op: {"kernel": kernel.name}}, strict=True):
                chosen = explain(case.op, *args, **case.attrs).chosen or ""
                res = OPS[case.op](*args, **case.attrs)
        except Exception as exc:
            out.append(Finding("pinned", subject, f"raised {_exc(exc)}"))
            continue
        if chosen.split("[")[0] != kernel.name:
            out.append(Finding("pinned", subject, f"the frontend chose {chosen!r}, not the pinned kernel"))
        bad = compare(res.numpy(), built.reference, dtype)
        if bad:
            out.append(Finding("pinned", subject, bad))
    return out


def check_frontend_edges(device: Device, op: str, dtype: str = "float32") -> list[Finding]:
    """Size-0 results and empty reductions, which the frontend answers on the device itself."""
    from ..tensor import tensor

    out: list[Finding] = []
    rng = np.random.default_rng()
    for case in EMPTY[op]:
        subject = f"{device.name}: {op} {case.id} {dtype}"
        hosts = [random_array(rng, s, dtype) for s in case.shapes]
        norm = OPS[op].normalize([tuple(s) for s in case.shapes], dict(case.attrs))
        try:
            res = OPS[op](*[tensor(h, device=device) for h in hosts], **case.attrs)
            got = np.asarray(res.numpy())
        except Exception as exc:
            out.append(Finding("frontend", subject, f"raised {_exc(exc)}"))
            continue
        if got.shape != norm.result_shape or got.dtype != np_dtype(dtype) or res.device != device:
            out.append(Finding("frontend", subject, f"gave {got.shape} {got.dtype} on {res.device}, expected "
                               f"{norm.result_shape} {dtype} on {device.name}"))
        elif got.size:
            bad = compare(got, OPS[op].reference(*[h.astype(np.float64) for h in hosts], **case.attrs), dtype)
            if bad:
                out.append(Finding("frontend", subject, bad))
    return out


def plugin_kernels(name: str, reg: Registry | None = None) -> list[Kernel]:
    """The registered kernels that plugin ``name`` supplies."""
    reg = reg or registry()
    plugin = reg.pm.get_plugin(name)
    impl = getattr(plugin, "opruntime_kernels", None) if plugin is not None else None
    if impl is None:
        return []
    names = [k.name for k in impl() or ()]
    return [reg.kernels[n] for n in names if n in reg.kernels]


def device_plugin(device: Device, reg: Registry | None = None) -> str | None:
    """The plugin that provides ``device``."""
    reg = reg or registry()
    return next((r.name for r in reg.records.values() if device.name in r.devices), None)
