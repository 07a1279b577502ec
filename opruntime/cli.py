"""The ``opruntime`` command: ``info`` and ``bench`` (``opruntime <command> --help``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


def cmd_info(args: argparse.Namespace) -> int:
    import opruntime as opr
    from opruntime.config import settings
    from opruntime.plugins import registry

    reg = registry()
    s = settings()
    data = {
        "version": opr.__version__,
        "plugins": [vars(r) for r in reg.records.values()],
        "devices": [{"name": d.name, "kind": d.kind, "description": d.provider.description,
                     "priority": d.provider.priority, "aliases": list(d.provider.aliases), **d.provider.info()}
                    for d in reg.devices],
        "unavailable": reg.unavailable,
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
        facts = ", ".join(f"{k}={v}" for k, v in d.items() if k not in ("name", "kind", "description", "priority"))
        print(f"  {d['name']:<12} {d['description']}" + (f"  ({facts})" if facts else ""))
    for kind, reason in reg.unavailable.items():
        print(f"  {kind + ':*':<12} unavailable: {reason}")
    print("\nkernels:")
    for k in reg.kernels.values():
        print(f"  {k.name:<40} {k.op:<12} {k.device_kind:<8} {','.join(sorted(k.dtypes))}")
    print(f"\nsettings: {s!r}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from opruntime.bench import SUITES, format_table, parse_case, run_case, to_json
    from opruntime.plugins import registry

    reg = registry()
    if args.op:
        if not args.shape:
            raise SystemExit("bench: give --shape for each operator (e.g. --shape 1024x1024,1024x1024)")
        cases = [parse_case(op, shape, args.dtype, args.attr) for op in args.op for shape in args.shape]
    else:
        cases = SUITES[args.suite]
    devices = [reg.device(d) for d in args.device] if args.device else [reg.devices[0]]
    results = []
    total = len(cases) * len(devices)
    for i, (dev, case) in enumerate(((d, c) for d in devices for c in cases), 1):
        print(f"[{i}/{total}] {case.op} {case.label} {case.dtype} on {dev.name} ...", file=sys.stderr, flush=True)
        results.append(run_case(case, dev, repeats=args.repeats, kernels=args.kernels,
                                peers=args.peers.split(",") if args.peers else None))
    print(format_table(results))
    if args.json:
        to_json(results, args.json)
        print(f"wrote {args.json}", file=sys.stderr)
    return 1 if any(r.error for r in results) else 0


def cmd_explain(args: argparse.Namespace) -> int:
    import numpy as np

    import opruntime as opr
    from opruntime.bench import parse_case

    case = parse_case(args.op, args.shape, args.dtype, args.attr)
    arrays = [np.random.default_rng(0).standard_normal(s).astype(args.dtype) for s in case.shapes]
    print(opr.explain(args.op, *arrays, device=args.device, **dict(case.attrs)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="opruntime", description="opruntime: a pluggable multi-backend operator runtime")
    sub = p.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="plugins, devices (and why a backend has none), kernels, settings")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(fn=cmd_info)

    from opruntime.bench import SUITES

    b = sub.add_parser("bench", help="time operators, their kernels and the peers (numpy, torch, jax, cuBLAS)")
    b.add_argument("op", nargs="*", help="operators (default: the --suite)")
    b.add_argument("--shape", action="append", help="operand shapes, e.g. 1024x1024,1024x1024 (repeatable)")
    b.add_argument("--dtype", default="float32")
    b.add_argument("--attr", action="append", default=[], help="an attribute, e.g. padding=1 or stride=[2,1]")
    b.add_argument("--device", action="append", help="device (repeatable; default: the configured default)")
    b.add_argument("--suite", default="demo", choices=sorted(SUITES))
    b.add_argument("--repeats", type=int, default=15)
    b.add_argument("--kernels", action="store_true", help="also time every candidate kernel directly")
    b.add_argument("--peers", help="comma-separated peers to time (default: all installed)")
    b.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    b.set_defaults(fn=cmd_bench)

    e = sub.add_parser("explain", help="which kernel a call would run, the candidates and why")
    e.add_argument("op")
    e.add_argument("--shape", required=True)
    e.add_argument("--dtype", default="float32")
    e.add_argument("--attr", action="append", default=[])
    e.add_argument("--device")
    e.set_defaults(fn=cmd_explain)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except Exception as exc:
        from opruntime.errors import OpRuntimeError

        if isinstance(exc, OpRuntimeError):
            print(f"opruntime: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
