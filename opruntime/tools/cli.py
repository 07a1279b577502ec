"""The ``opruntime`` command: ``info``, ``bench``, ``tune``, ``cache``, ``explain``
(``opruntime <command> --help``; also ``python -m opruntime.tools``)."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence

import numpy as np

import opruntime as opr
from opruntime import cache, config, selector, tuning
from opruntime.config import settings
from opruntime.errors import OpRuntimeError
from opruntime.lru import CACHES
from opruntime.ops import OPS
from opruntime.plugins import registry

from . import bench, models, plot
from .peers import LIBRARIES
from .progress import Progress


def cmd_info(args: argparse.Namespace) -> int:
    reg = registry()
    s = settings()
    data = {
        "version": opr.__version__,
        "plugins": [vars(r) for r in reg.records.values()],
        "devices": [{"name": d.name, "kind": d.kind, "description": d.provider.description,
                     "priority": d.provider.priority, "aliases": list(d.provider.aliases), **d.provider.info()}
                    for d in reg.devices],
        "unavailable": reg.unavailable,
        "operators": [{"name": op.name, "operands": list(op.operands), "attributes": list(op.attributes),
                       "bound": op.bound, "suites": list(op.bench), "peers": list(op.peers)} for op in OPS.values()],
        "caches": [{"name": c.name, "size": len(c), "capacity": c.capacity}
                   for c in sorted(CACHES, key=lambda c: c.name)],
        "settings": {k: (v if not isinstance(v, tuple) else list(v)) for k, v in s.content()},
        "settings_origin": dict(s.origin),
    }
    if args.json:
        print(json.dumps(data, indent=1, default=str))
        return 0
    print(f"opruntime {opr.__version__}\n\nplugins:")
    for r in reg.records.values():
        extra = f"{len(r.devices)} device(s), {r.kernels} kernel(s)" if r.status == "ok" else r.reason
        print(f"  {r.name:<8} {r.version or '-':<12} {r.status:<12} {extra}")
    print("\ndevices (best first; the first is the default):")
    for d in data["devices"]:
        print(f"  {d['name']:<12} {d['description']}")
        facts = [f"{k}: {', '.join(v) if isinstance(v, list) else v}" for k, v in d.items()
                 if k not in ("name", "kind", "description", "priority") and v not in ([], "", None)]
        for fact in facts:
            print(f"  {'':<12}   {fact if len(fact) <= 96 else fact[:93] + '...'}")
    for kind, reason in reg.unavailable.items():
        print(f"  {kind + ':*':<12} unavailable: {reason}")
    print("\noperators:")
    for o in data["operators"]:
        signature = f"{o['name']}({', '.join(o['operands'] + o['attributes'])})"
        print(f"  {signature:<56} {o['bound'] + '-bound':<14} peers: {', '.join(o['peers']) or '-'}")
    print("\nkernels:")
    for k in reg.kernels.values():
        print(f"  {k.name:<40} {k.op:<12} {k.device_kind:<8} {','.join(sorted(k.dtypes))}")
    print("\ncaches (entries / capacity):")
    for c in data["caches"]:
        print(f"  {c['name']:<40} {c['size']}/{c['capacity']}")
    print(f"\nsettings: {s!r}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    if args.plot:
        plot.require_matplotlib()  # before the benchmark, not after it
    reg = registry()
    devices = [reg.device(d) for d in args.device] if args.device else [reg.devices[0]]
    wanted = args.peers.split(",") if args.peers else None
    results = []
    if not args.op and args.suite == models.SUITE:  # whole models, not operators' cases
        total = models.count(devices, args.quick)
        with Progress(total, "bench") as progress:
            results = models.run_suite(devices, quick=args.quick, repeats=args.repeats, peers=wanted,
                                       progress=progress.update)
            progress.update(total)
    else:
        cases = _cases(args)
        total = len(cases) * len(devices)
        with Progress(total, "bench") as progress:
            for i, (dev, case) in enumerate((d, c) for d in devices for c in cases):
                progress.update(i, f"{case.op} {case.label} {case.dtype} on {dev.name}")
                results.append(bench.run_case(case, dev, repeats=args.repeats, kernels=args.kernels, peers=wanted))
            progress.update(total)
    if args.json != "-":  # with --json -, stdout is the JSON alone
        print(bench.format_table(results))
    roofs: dict[str, dict] = {}
    if args.plot:
        with Progress(len(devices), "roofline") as progress:
            for i, dev in enumerate(devices):
                progress.update(i, f"the roofline of {dev.name}")
                roofs[dev.name] = plot.roofline_figures(dev, sorted({r.dtype for r in results if r.device == dev.name}))
        plot.plot(results, args.plot, roofs)
        print(f"wrote {args.plot}", file=sys.stderr)
    if args.json:
        bench.to_json(results, args.json, devices, {"roofline": roofs} if roofs else None)
        if args.json != "-":
            print(f"wrote {args.json}", file=sys.stderr)
    return 1 if any(r.error for r in results) else 0


def _cases(args: argparse.Namespace) -> list[bench.Case]:
    if args.op:
        if not args.shape:
            raise SystemExit(f"{args.command}: give --shape for each operator (e.g. --shape 1024x1024,1024x1024)")
        return [bench.parse_case(op, shape, args.dtype, args.attr) for op in args.op for shape in args.shape]
    return bench.SUITES[args.suite]


def cmd_tune(args: argparse.Namespace) -> int:
    reg = registry()
    devices = [reg.device(d) for d in args.device] if args.device else [reg.devices[0]]
    overrides: dict[str, object] = {"tune": "autotune"}
    if args.budget:
        overrides["tune_budget"] = args.budget
    rows = []
    with config.override(**overrides) as s:
        for dev in devices:
            for case in _cases(args):
                op = OPS[case.op]
                datas = [t.data for t in bench.random_tensors(case, dev)]
                problem = op.problem(datas, dev, dict(case.attrs))[0]
                if args.force:
                    cache.tuning_cache().delete(tuning.device_key(dev), tuning.problem_key(problem, s.bucket_for(case.op)))
                t0 = time.perf_counter()
                with Progress(0, f"{case.op} {case.label} {case.dtype} on {dev.name}") as progress:
                    tuning.reporter = progress.candidate
                    try:
                        order, _, why = selector.rank(problem, dev, s)
                    finally:
                        tuning.reporter = None
                best = order[0]
                vendor = [c.measured for c in order if c.kernel.vendor and c.measured and math.isfinite(c.measured)]
                rows.append([case.op, case.label, case.dtype, dev.name, best.label,
                             f"{best.measured * 1e6:.1f} us" if best.measured else "-",
                             f"{min(vendor) / best.measured:.2f}x" if vendor and best.measured else "-",
                             why.split(" (")[0], f"{time.perf_counter() - t0:.2f} s"])
    head = ["op", "problem", "dtype", "device", "winner", "time", "vs vendor", "how", "tuning"]
    if args.json:
        print(json.dumps([dict(zip(head, r)) for r in rows], indent=1))
        return 0
    _table(head, rows)
    print(f"(cache: {cache.tuning_cache().path}; vs vendor = vendor time / winner time)")
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    store = cache.tuning_cache()
    if args.action == "path":
        print(store.path)
    elif args.action == "list":
        rows = [[e.device_name, e.problem, e.kernel, f"{e.time_s * 1e6:.1f} us",
                 f"{e.vendor_time / e.time_s:.2f}x" if e.vendor_time else "-",
                 time.strftime("%Y-%m-%d %H:%M", time.localtime(e.created))]
                for e in store.entries()]
        if args.json:
            print(json.dumps([vars(e) for e in store.entries()], indent=1))
        else:
            _table(["device", "problem", "kernel", "time", "vs vendor", "tuned"], rows)
            print(f"({len(rows)} entries in {store.path})")
    elif args.action == "export":
        print(f"exported {store.export(args.path)} entries to {args.path}")
    elif args.action == "import":
        print(f"imported {store.import_(args.path)} entries from {args.path}")
    elif args.action == "clear":
        print(f"removed {store.clear()} entries from {store.path}")
    return 0


def _table(head: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)] if rows else [len(h) for h in head]
    for cells in [head, ["-" * w for w in widths], *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip())


def cmd_explain(args: argparse.Namespace) -> int:
    case = bench.parse_case(args.op, args.shape, args.dtype, args.attr)
    arrays = [np.random.default_rng(0).standard_normal(s).astype(args.dtype) for s in case.shapes]
    ex = opr.explain(args.op, *arrays, device=args.device, **case.attrs)
    if args.json:
        print(json.dumps({"problem": str(ex.problem), "device": ex.device, "chosen": ex.chosen, "why": ex.why,
                          "cached": ex.cached,
                          "candidates": [{"label": c.label, "kernel": c.kernel.name, "config": dict(c.config),
                                          "estimate_s": _finite(c.cost), "measured_s": _finite(c.measured),
                                          "status": c.status} for c in ex.candidates]}, indent=1, default=str))
        return 0
    print(ex)
    return 0


def _finite(x: float | None) -> float | None:
    """A number for JSON: inf and NaN (not JSON) become null."""
    return x if x is not None and math.isfinite(x) else None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="opruntime", description="opruntime: a pluggable multi-backend operator runtime")
    sub = p.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="plugins, devices (or why none), operators, kernels, caches, settings")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(fn=cmd_info)

    suites = sorted(bench.SUITES)
    b = sub.add_parser("bench", help="time operators, kernels and peers (" + ", ".join(LIBRARIES) + ")")
    b.add_argument("op", nargs="*", help="operators (default: the --suite)")
    b.add_argument("--shape", action="append", help="operand shapes, e.g. 1024x1024,1024x1024 (repeatable)")
    b.add_argument("--dtype", default="float32")
    b.add_argument("--attr", action="append", default=[], help="an attribute, e.g. padding=1 or stride=[2,1]")
    b.add_argument("--device", action="append", help="device (repeatable; default: the configured default)")
    b.add_argument("--suite", default="demo", choices=sorted([*suites, models.SUITE]),
                   help=f"operators' bench shapes, or {models.SUITE!r}: whole models (opruntime.tools.models)")
    b.add_argument("--repeats", type=int, default=15)
    b.add_argument("--kernels", action="store_true", help="also time every candidate kernel directly")
    b.add_argument("--quick", action="store_true", help=f"--suite {models.SUITE}: small models (a check that it runs)")
    b.add_argument("--peers", help="comma-separated peers to time (default: all installed)")
    b.add_argument("--json", metavar="PATH", help="also write the results as JSON ('-': print it instead of the table)")
    b.add_argument("--plot", metavar="PATH", help="also draw bars per operator and a roofline per device "
                   "(png, svg or pdf; needs matplotlib)")
    b.set_defaults(fn=cmd_bench)

    t = sub.add_parser("tune", help="autotune problems into the persistent cache; a table of winners")
    t.add_argument("op", nargs="*", help="operators (default: the --suite)")
    t.add_argument("--shape", action="append")
    t.add_argument("--dtype", default="float32")
    t.add_argument("--attr", action="append", default=[])
    t.add_argument("--device", action="append")
    t.add_argument("--suite", default="demo", choices=suites)
    t.add_argument("--budget", type=float, help="seconds per problem (default: the tune_budget setting)")
    t.add_argument("--force", action="store_true", help="tune again even when the cache has a result")
    t.add_argument("--json", action="store_true", help="print JSON instead of the table")
    t.set_defaults(fn=cmd_tune)

    c = sub.add_parser("cache", help="the tuning cache: path | list | export PATH | import PATH | clear")
    c.add_argument("action", choices=["path", "list", "export", "import", "clear"])
    c.add_argument("path", nargs="?")
    c.add_argument("--json", action="store_true")
    c.set_defaults(fn=cmd_cache)

    e = sub.add_parser("explain", help="which kernel a call would run, the candidates and why")
    e.add_argument("op")
    e.add_argument("--shape", required=True)
    e.add_argument("--dtype", default="float32")
    e.add_argument("--attr", action="append", default=[])
    e.add_argument("--device")
    e.add_argument("--json", action="store_true", help="print JSON")
    e.set_defaults(fn=cmd_explain)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except OpRuntimeError as exc:
        print(f"opruntime: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
