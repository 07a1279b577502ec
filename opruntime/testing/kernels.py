"""Conformance of kernels: every kernel, in every config, on the generated problems, called
directly with the Problem the frontend builds (``run``, and the launcher ``prepare`` returns where
the kernel has one) and through the frontend with the kernel pinned; and the size-0 results the
frontend answers on the device."""

# ruff: noqa: BLE001 - whatever a plugin (or a thread) raises is reported, never let through

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from ..devices import Device
from ..errors import DtypeError, NoKernelError
from ..kernels import Kernel
from ..ops import OPS
from ..ops.base import FLOAT_ORDER, wide
from .findings import Finding, _exc
from .numerics import compare, np_dtype, random_array, same_bits
from .problems import CASES, EMPTY, Case, Unsupported, build, kernel_views, plan_for


def check_kernel(kernel: Kernel, device: Device, cases: Sequence[Case] | None = None,
                 dtypes: Iterable[str] | None = None, configs: str = "all",
                 rng: np.random.Generator | None = None) -> list[Finding]:
    """Run ``kernel`` directly (``kernel.run`` with the Problem the frontend builds) on every case,
    dtype and config, against the float64 reference.

    Args:
        dtypes: the dtypes to try, among those the kernel declares (default: all it declares).
        configs: ``"all"`` (every config ``config_for`` / ``configs`` offers) or ``"first"`` (the
            one the heuristic uses).
    """
    rng = rng or np.random.default_rng()
    out: list[Finding] = []
    cases = CASES[kernel.op] if cases is None else cases
    wanted = set(kernel.dtypes) if dtypes is None else set(dtypes) & set(kernel.dtypes)
    for dtype in [d for d in FLOAT_ORDER if d in wanted]:
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
        paths = [("run", kernel.run)] if kernel.run is not None else []
        if kernel.prepare is not None:  # what a plan calls: it must give the same answer as run
            paths.append(("prepare(problem, config)(*arrays)", lambda p, c, *a: kernel.prepare(p, c)(*a)))
        for what, call in paths:
            try:
                res = call(problem, cfg, *views)
                prov.synchronize()
            except Exception as exc:
                out.append(Finding("kernel", label, f"supports() accepted it but {what} raised {_exc(exc)}"))
                continue
            out += _check_result(what, res, label, views, plan, built, dtype, prov)
    return out


def _check_result(what: str, res: object, label: str, views: Sequence[object], plan, built, dtype: str,
                  prov) -> list[Finding]:
    """A kernel's result: a new native array of the problem's shape and dtype, within the dtype's
    tolerance of the float64 reference, the operands untouched."""
    problem, out = plan.problem, []
    if any(res is v or prov.shares_memory(res, v) for v in views):
        out.append(Finding("kernel", label, f"{what} returned an array sharing memory with an operand; it must "
                           "return a new array"))
    if not prov.owns(res):
        out.append(Finding("kernel", label, f"{what} returned {type(res).__name__}, not a native array of this device"))
    if tuple(res.shape) != problem.out_shape or np.dtype(res.dtype) != np_dtype(problem.out_dtype):
        out.append(Finding("kernel", label, f"{what} returned shape {tuple(res.shape)} {res.dtype}, expected "
                           f"{problem.out_shape} {problem.out_dtype}"))
        return out
    bad = compare(np.asarray(prov.to_host(res)).reshape(plan.result_shape), built.reference, dtype, built.sensitivity)
    if bad:
        out.append(Finding("kernel", label, f"{what}: {bad}" if what != "run" else bad))
    for i, (base, host) in enumerate(built.bases):
        if not same_bits(np.asarray(prov.to_host(base)), host):
            out.append(Finding("kernel", label, f"{what} wrote into operand {i}"))
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
        bad = compare(res.numpy(), built.reference, dtype, built.sensitivity)
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
        hosts = OPS[op].sample([random_array(rng, s, dtype) for s in case.shapes], case)
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
            bad = compare(got, OPS[op].reference(*wide(hosts), **case.attrs), dtype)
            if bad:
                out.append(Finding("frontend", subject, bad))
    return out
