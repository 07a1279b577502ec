"""The ``opruntime`` command: ``info``, ``bench``, ``tune``, ``cache``, ``explain``, ``plot``
(``opruntime <command> --help``; also ``python -m opruntime``), on click.

Conventions, the same for every command:

* ``--json`` prints strict JSON on stdout instead of the table; ``-o/--output PATH`` writes the
  same JSON to a file (:mod:`.output`); numbers in SI units, the unit in the key (``time_s``).
* A user's mistake (a bad option value, an unknown attribute, a missing file) is one line on
  stderr and exit status 2; ``opruntime --debug <command>`` shows the traceback instead.
* Output piped into a reader that stops early (``opruntime info | head -1``) ends quietly.
"""

from __future__ import annotations

import ast
import difflib
import math
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import click
import numpy as np

import opruntime as opr
from opruntime import cache, config, selector, tuning
from opruntime.config import settings
from opruntime.errors import OpRuntimeError
from opruntime.kernels import c_strides, np_dtype
from opruntime.lru import CACHES
from opruntime.ops import OPS
from opruntime.ops.base import FLOAT_ORDER
from opruntime.plugins import registry

from . import bench, models, output, plot
from .output import seconds
from .peers import COPY, LIBRARIES
from .progress import Progress

CONTEXT = {"help_option_names": ["-h", "--help"], "show_default": True, "max_content_width": 100}


# -- option types and shared options ----------------------------------------------------------------
class Parsed(click.ParamType):
    """An option value read by one of the bench's parsers, whose typed error becomes click's
    one-line usage error: ``Parsed("SHAPES", bench.parse_shapes)`` (``1024x1024,1024x1024``),
    ``Parsed("NAME=VALUE", bench.parse_attr)`` (``padding=1``)."""

    def __init__(self, name: str, parse: Callable[[str], Any]) -> None:
        self.name, self.parse = name, parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):  # a default, already parsed
            return value
        try:
            return self.parse(value)
        except OpRuntimeError as exc:
            self.fail(str(exc), param, ctx)


SHAPES = Parsed("SHAPES", bench.parse_shapes)
ATTR = Parsed("NAME=VALUE", bench.parse_attr)


def _operators(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Check operator names, suggesting the closest for a typo."""
    for name in [value] if isinstance(value, str) else value:
        if name not in OPS:
            close = difflib.get_close_matches(name, list(OPS), n=1)
            hint = f"did you mean {close[0]!r}?" if close else "`opruntime info` lists them"
            raise click.BadParameter(f"unknown operator {name!r}; {hint}", ctx, param)
    return value


def _peers(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str] | None:
    """``--peers numpy,torch`` -> the list; ``none`` -> no peer; unset -> every installed one."""
    if value is None:
        return None
    if value == "none":
        return []
    names = [v.strip() for v in value.split(",") if v.strip()]
    known = [*LIBRARIES, COPY]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise click.BadParameter(f"unknown peer(s) {', '.join(unknown)}; peers: {', '.join(known)}, or none",
                                 ctx, param)
    return names


def json_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The one output convention of every command: ``--json`` and ``-o/--output PATH``."""
    fn = click.option("-o", "--output", "output_path", metavar="PATH", type=click.Path(dir_okay=False),
                      help="also write the JSON to PATH (the table is still printed)")(fn)
    return click.option("--json", "as_json", is_flag=True,
                        help="print strict JSON on stdout instead of the table")(fn)


def case_options(suites: Sequence[str]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The problems of ``bench`` and ``tune``: operators with shapes, or a suite."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        options = [
            click.argument("ops", nargs=-1, metavar="[OP]...", callback=_operators),
            click.option("--shape", "shapes", multiple=True, type=SHAPES,
                         help="operand shapes, e.g. 1024x1024,1024x1024 (repeatable: a case each)"),
            click.option("--dtype", type=click.Choice(FLOAT_ORDER), default="float32", help="the operands' dtype"),
            click.option("--attr", "attrs", multiple=True, type=ATTR,
                         help="an operator attribute, e.g. padding=1 or stride=[2,1] (repeatable)"),
            click.option("--device", "devices", multiple=True, metavar="NAME",
                         help="device, e.g. cpu or cuda:0 (repeatable)  [default: the first of `opruntime info`]"),
            click.option("--suite", type=click.Choice(suites), default="demo",
                         help="the operators' bench shapes to run: every operator's, or the named OPs' "
                              "when no --shape is given"),
        ]
        for option in reversed(options):
            fn = option(fn)
        return fn

    return wrap


def _devices(names: Sequence[str]) -> list[opr.Device]:
    reg = registry()
    return [reg.device(d) for d in names] if names else [reg.devices[0]]


def _cases(ops: Sequence[str], shapes: Sequence[tuple], dtype: str, attrs: Sequence[tuple[str, Any]],
           suite: str) -> list[bench.Case]:
    if not ops:
        return bench.SUITES[suite]
    if not shapes:  # the suite's cases of these operators
        cases = [c for c in bench.SUITES[suite] if c.op in ops]
        if not cases:
            raise click.UsageError(f"the {suite!r} suite has no case of {', '.join(ops)}: give --shape with an "
                                   "operator, e.g. --shape 1024x1024,1024x1024, or another --suite")
        return cases
    return [bench.make_case(op, s, dtype, dict(attrs)) for op in ops for s in shapes]


# -- the command ------------------------------------------------------------------------------------
@click.group(context_settings=CONTEXT)
@click.version_option(opr.__version__, "-V", "--version", prog_name="opruntime", message="%(prog)s %(version)s")
@click.option("--debug", is_flag=True, help="show the traceback of an error instead of one line")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """opruntime: a pluggable multi-backend operator runtime.

    \b
    Examples:
      opruntime info
      opruntime explain matmul --shape 1024x1024,1024x1024
      opruntime bench softmax --shape 4096x4096 --repeats 5
      opruntime plot softmax.json -o softmax.svg
      python -m opruntime info --json
    """
    ctx.ensure_object(dict)["debug"] = debug


@cli.command(context_settings=CONTEXT)
@json_options
def info(as_json: bool, output_path: str | None) -> None:
    """Plugins, devices (or why none), operators, kernels, caches and settings.

    \b
    Examples:
      opruntime info
      opruntime info --json | python -c "import json, sys; print(json.load(sys.stdin)['devices'])"
    """
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
        "kernels": [{"name": k.name, "op": k.op, "device_kind": k.device_kind, "dtypes": sorted(k.dtypes)}
                    for k in reg.kernels.values()],
        "caches": [{"name": c.name, "entries": len(c), "capacity": c.capacity}
                   for c in sorted(CACHES, key=lambda c: c.name)],
        "settings": {k: dict(v) if k == "ops" and v else v for k, v in s.content()},
        "settings_origin": dict(s.origin),
    }

    def show() -> None:
        plugins = [[r.name, r.version or "-", r.status,
                    f"{len(r.devices)} device(s), {r.kernels} kernel(s)" if r.status == "ok" else r.reason]
                   for r in reg.records.values()]
        devices = [[d["name"], "\n".join([d["description"], *_facts(d)])] for d in data["devices"]]
        devices += [[f"{kind}:*", f"unavailable: {reason}"] for kind, reason in reg.unavailable.items()]
        operators = [[f"{o['name']}({', '.join(o['operands'] + o['attributes'])})", o["bound"],
                      ", ".join(o["peers"]) or "-"] for o in data["operators"]]
        kernels = [[k["name"], k["device_kind"], ", ".join(k["dtypes"])] for k in data["kernels"]]
        caches = [[c["name"], c["entries"], c["capacity"]] for c in data["caches"]]
        values = [[k, _setting(v), s.origin.get(k, "default")] for k, v in s.content()]
        output.show(f"opruntime {opr.__version__}",
                    "\nplugins:", output.table(["plugin", "version", "status", "what"], plugins),
                    "\ndevices (best first; the first is the default):", output.table(["device", "what"], devices),
                    "\noperators:", output.table(["operator", "bound", "peers"], operators),
                    "\nkernels (<plugin>.<operator>.<variant>):", output.table(["kernel", "device", "dtypes"], kernels),
                    "\ncaches:", output.table(["cache", "entries", "capacity"], caches, right=["entries", "capacity"]),
                    "\nsettings:", output.table(["setting", "value", "set by"], values))

    output.emit(data, as_json=as_json, output=output_path, show=show)


def _facts(device: dict[str, Any]) -> list[str]:
    """A device's ``info()`` as ``key: value`` lines."""
    return [f"{k}: {', '.join(map(str, v)) if isinstance(v, list) else v}" for k, v in device.items()
            if k not in ("name", "kind", "description", "priority") and v not in ([], "", None)]


def _setting(value: Any) -> str:
    """A setting's value for the table: lists comma-separated, unset as ``-``."""
    if value in ((), None, ""):
        return "-"
    if isinstance(value, tuple):
        return ", ".join(_setting(v) for v in value)
    return str(value)


@cli.command("bench", context_settings=CONTEXT)
@case_options(sorted([*bench.SUITES, models.SUITE]))
@click.option("--repeats", type=click.IntRange(min=1), default=15, help="timed rounds per case")
@click.option("--kernels", is_flag=True, help="also time every candidate kernel directly (61 rounds at least)")
@click.option("--only", "only_kernels", metavar="LIST",
              help="with --kernels: time only the candidates whose label contains one of these comma-separated "
                   "strings (the chosen kernel is always timed), e.g. --only flash_wgmma,cudnn")
@click.option("--graphs", is_flag=True,
              help="on a CUDA device: record each contender's calls as a CUDA graph and time its replays, the "
                   "device's time without the host's (peers without graphs, JAX and ONNX Runtime, are left out)")
@click.option("--quick", is_flag=True, help=f"with --suite {models.SUITE}: small models (a check that it runs)")
@click.option("--peers", callback=_peers, metavar="LIST",
              help=f"comma-separated peers to time ({', '.join(LIBRARIES)}; {COPY}: the device copying the bytes "
                   "a memory-bound operator moves, its ratio the fraction of the copy bandwidth reached), or none  "
                   "[default: all installed]")
@click.option("--plot", "plot_path", metavar="PATH", type=click.Path(dir_okay=False),
              help="also draw bars per operator and a roofline per device (png, svg or pdf; needs matplotlib)")
@json_options
def bench_command(ops: tuple[str, ...], shapes: tuple, dtype: str, attrs: tuple, devices: tuple[str, ...],
                  suite: str, repeats: int, kernels: bool, only_kernels: str | None, graphs: bool, quick: bool,
                  peers: list[str] | None, plot_path: str | None, as_json: bool, output_path: str | None) -> None:
    """Time operators, each candidate kernel and the peers on the same inputs.

    Each time is the median of --repeats rounds, with its p10-p90 spread; a noisy figure is
    flagged with "!". The exit status is 1 when a case failed.

    \b
    Examples:
      opruntime bench                                  # the demo suite on the default device
      opruntime bench matmul --shape 1024x1024,1024x1024 --kernels
      opruntime bench --suite attention --device cuda:0 --kernels --only flash_wgmma,cudnn
      opruntime bench conv2d --shape 8x64x56x56,64x64x3x3 --attr padding=1 --device cpu
      opruntime bench softmax --shape 4096x4096 --peers numpy,torch --json > softmax.json
      opruntime bench --suite gpu --device cuda:0 -o gpu.json --plot gpu.svg
      opruntime bench layer_norm --device cuda:0 --peers torch,copy --graphs   # device time only
    """
    if only_kernels and not kernels:
        raise click.UsageError("--only picks among the candidates that --kernels times: add --kernels")
    if graphs and suite == models.SUITE and not ops:
        raise click.UsageError(f"--graphs times operators' cases; the {models.SUITE} suite times the block "
                               "through opr.capture already (its 'captured' case)")
    if plot_path:
        plot.require_matplotlib()  # before the benchmark, not after it
    targets = _devices(devices)
    results = []
    if not ops and suite == models.SUITE:  # whole models, not operators' cases
        total = models.count(targets, quick)
        with Progress(total, "bench") as progress:
            results = models.run_suite(targets, quick=quick, repeats=repeats, peers=peers, progress=progress.update)
    else:
        cases = _cases(ops, shapes, dtype, attrs, suite)
        with Progress(len(cases) * len(targets), "bench") as progress:
            for i, (dev, case) in enumerate((d, c) for d in targets for c in cases):
                progress.update(i, f"{case.op} {case.label} {case.dtype} on {dev.name}")
                timed = [k.strip() for k in only_kernels.split(",") if k.strip()] if only_kernels else kernels
                results.append(bench.run_case(case, dev, repeats=repeats, kernels=timed, peers=peers, graphs=graphs))
    roofs: dict[str, dict] = {}
    if plot_path:
        with Progress(len(targets), "roofline") as progress:
            for i, dev in enumerate(targets):
                progress.update(i, f"the roofline of {dev.name}")
                roofs[dev.name] = plot.roofline_figures(dev, sorted({r.dtype for r in results if r.device == dev.name}))
        plot.plot(results, plot_path, roofs)
        print(f"wrote {plot_path}", file=sys.stderr)
    data = bench.document(results, targets, {"roofline": roofs} if roofs else None, command=_command_line())
    output.emit(data, as_json=as_json, output=output_path,
                show=lambda: output.show(*bench.tables(results), *bench.legend(results)))
    if any(r.error for r in results):
        raise click.exceptions.Exit(1)


@cli.command(context_settings=CONTEXT)
@case_options(sorted(bench.SUITES))
@click.option("--budget", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="seconds per problem  [default: the tune_budget setting]")
@click.option("--force", is_flag=True, help="tune again even when the cache has a result")
@json_options
def tune(ops: tuple[str, ...], shapes: tuple, dtype: str, attrs: tuple, devices: tuple[str, ...], suite: str,
         budget: float | None, force: bool, as_json: bool, output_path: str | None) -> None:
    """Autotune problems into the persistent tuning cache; a table of the winners.

    \b
    Examples:
      opruntime tune                                   # the demo suite
      opruntime tune conv2d --shape 8x64x56x56,64x64x3x3 --attr padding=1 --budget 10
      opruntime tune --suite gpu --device cuda:0 --force --json
    """
    overrides: dict[str, object] = {"tune": "autotune"}
    if budget:
        overrides["tune_budget"] = budget
    rows = []
    cases = _cases(ops, shapes, dtype, attrs, suite)
    with config.override(**overrides) as s:
        for dev in _devices(devices):
            for case in cases:
                rows.append(_tune_one(case, dev, s, force))
    head = ["op", "problem", "dtype", "device", "winner", "time", "vs vendor", "how", "tuning"]

    def show() -> None:
        lines = [[r["op"], r["problem"], r["dtype"], r["device"], r["winner"], seconds(r["time_s"]),
                  f"{r['vs_vendor']:.2f}x" if r["vs_vendor"] else "-", r["how"], seconds(r["tuning_s"])]
                 for r in rows]
        output.show(output.table(head, lines, right=["time", "vs vendor", "tuning"]),
                    f"(cache: {cache.tuning_cache().path}; vs vendor = the vendor library's time / the winner's)")

    output.emit(rows, as_json=as_json, output=output_path, show=show)


def _tune_one(case: bench.Case, dev: opr.Device, s: config.Settings, force: bool) -> dict[str, Any]:
    """Tune one case on one device: a row of ``tune``'s table (times in seconds)."""
    op = OPS[case.op]
    datas = [t.data for t in bench.random_tensors(case, dev)]
    problem = op.problem(datas, dev, dict(case.attrs))[0]
    if force:
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
    return {"op": case.op, "problem": case.label, "dtype": case.dtype, "device": dev.name, "winner": best.label,
            "time_s": best.measured, "vendor_time_s": min(vendor) if vendor else None,
            "vs_vendor": min(vendor) / best.measured if vendor and best.measured else None,
            "how": why.split(" (")[0], "tuning_s": time.perf_counter() - t0}


@cli.group(context_settings=CONTEXT)
def cache_group() -> None:
    """The persistent tuning cache: path, list, export PATH, import PATH, clear.

    \b
    Examples:
      opruntime cache list
      opruntime cache export tuned.json && opruntime cache import tuned.json
    """


@cache_group.command("path", context_settings=CONTEXT)
@json_options
def cache_path(as_json: bool, output_path: str | None) -> None:
    """The cache file's path.

    \b
    Example:
      opruntime cache path
    """
    path = str(cache.tuning_cache().path)
    output.emit({"path": path}, as_json=as_json, output=output_path, show=lambda: print(path))


@cache_group.command("list", context_settings=CONTEXT)
@json_options
def cache_list(as_json: bool, output_path: str | None) -> None:
    """The tuned problems: operator, shapes, dtypes, attributes, device, winner and its time.

    The raw cache keys are in the JSON only (``key``).

    \b
    Examples:
      opruntime cache list
      opruntime cache list --json
    """
    store = cache.tuning_cache()
    entries = [_entry(e) for e in store.entries()]

    def show() -> None:
        rows = [[e["device_name"], e["op"], e["shapes_text"], ",".join(e["dtypes"]), e["attrs_text"], e["winner"],
                 seconds(e["time_s"]), f"{e['vendor_time_s'] / e['time_s']:.2f}x" if e["vendor_time_s"] else "-",
                 time.strftime("%Y-%m-%d %H:%M", time.localtime(e["created"]))] for e in entries]
        output.show(output.table(["device", "op", "shapes", "dtypes", "attrs", "winner", "time", "vs vendor", "tuned"],
                                 rows, right=["time", "vs vendor"]),
                    f"({len(rows)} entries in {store.path})")

    output.emit([{k: v for k, v in e.items() if not k.endswith("_text")} for e in entries],
                as_json=as_json, output=output_path, show=show)


def _entry(e: cache.Entry) -> dict[str, Any]:
    """A cache entry as readable fields (the raw ``key`` kept for the JSON)."""
    fields = problem_fields(e.problem)
    shown = _unusual(fields)
    cfg = ",".join(f"{k}={v}" for k, v in e.config.items())
    shapes = fields.get("shapes")
    return {"device_name": e.device_name, **fields, "winner": f"{e.kernel}[{cfg}]" if cfg else e.kernel,
            "kernel": e.kernel, "config": e.config, "time_s": e.time_s, "vendor_time_s": e.vendor_time,
            "created": e.created, "candidates": e.candidates, "device": e.device, "key": e.problem,
            "shapes_text": " x ".join("x".join(map(str, s)) or "scalar" for s in shapes) if shapes else e.problem,
            "attrs_text": ", ".join(f"{k}={v}" for k, v in shown.items()) or "-"}


def _unusual(fields: dict[str, Any]) -> dict[str, Any]:
    """The attributes of a cache entry that differ from the operator's defaults (all of them when
    the defaults cannot be worked out from the key's shapes)."""
    attrs = fields.get("attrs", {})
    try:
        defaults = dict(OPS[fields["op"]].normalize([tuple(s) for s in fields["shapes"]], {}).attrs)
    except Exception:  # an operator gone, or one that needs attributes: show every attribute
        return attrs
    return {k: v for k, v in attrs.items() if k not in defaults or defaults[k] != v}


def problem_fields(key: str) -> dict[str, Any]:
    """What a tuning-cache problem key (``opruntime.tuning.problem_key``) says: ``op``,
    ``shapes``, ``dtypes``, ``attrs``, ``bucket`` (exact or pow2: shapes rounded up) and
    ``layout``; only ``op`` when the key cannot be read."""
    op, _, rest = key.partition("|")
    try:
        shapes_text, dtypes, layout, attrs = rest.split("|", 3)
        bucket = "pow2" if shapes_text.startswith("pow2") else "exact"
        shapes = ast.literal_eval(shapes_text.removeprefix("pow2"))
        if bucket == "exact":
            strides = ast.literal_eval(layout)
            strided = any(st is not None and tuple(st) != c_strides(sh) for sh, st in zip(shapes, strides))
        else:
            strided = "s" in layout.split(",")
        return {"op": op, "shapes": [list(s) for s in shapes], "dtypes": dtypes.split(","),
                "attrs": dict(ast.literal_eval(attrs)), "bucket": bucket,
                "layout": "strided" if strided else "contiguous"}
    except (ValueError, SyntaxError, TypeError):
        return {"op": op}


@cache_group.command("export", context_settings=CONTEXT)
@click.argument("path", type=click.Path(dir_okay=False))
@json_options
def cache_export(path: str, as_json: bool, output_path: str | None) -> None:
    """Write every entry to PATH (JSON), for `cache import` on another machine.

    \b
    Example:
      opruntime cache export tuned.json
    """
    _counted("exported", cache.tuning_cache().export(path), "to", path, as_json, output_path)


@cache_group.command("import", context_settings=CONTEXT)
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@json_options
def cache_import(path: str, as_json: bool, output_path: str | None) -> None:
    """Add the entries of an export (newer entries win); a bad file imports nothing.

    \b
    Example:
      opruntime cache import tuned.json
    """
    _counted("imported", cache.tuning_cache().import_(path), "from", path, as_json, output_path)


@cache_group.command("clear", context_settings=CONTEXT)
@json_options
def cache_clear(as_json: bool, output_path: str | None) -> None:
    """Remove every entry.

    \b
    Example:
      opruntime cache clear
    """
    store = cache.tuning_cache()
    _counted("removed", store.clear(), "from", str(store.path), as_json, output_path)


def _counted(verb: str, n: int, preposition: str, path: str, as_json: bool, output_path: str | None) -> None:
    """What ``cache export``, ``import`` and ``clear`` did: ``{verb: n, "path": path}`` or a sentence."""
    output.emit({verb: n, "path": path}, as_json=as_json, output=output_path,
                show=lambda: print(f"{verb} {n} entries {preposition} {path}"))


cli.add_command(cache_group, "cache")


@cli.command(context_settings=CONTEXT)
@click.argument("op", callback=_operators)
@click.option("--shape", required=True, type=SHAPES,
              help="operand shapes, one per operand, e.g. 1024x1024,1024x1024")
@click.option("--dtype", type=click.Choice(FLOAT_ORDER), default="float32", help="the operands' dtype")
@click.option("--attr", "attrs", multiple=True, type=ATTR, help="an operator attribute, e.g. axis=0 (repeatable)")
@click.option("--device", metavar="NAME", help="device, e.g. cpu or cuda:0  [default: the first of `opruntime info`]")
@json_options
def explain(op: str, shape: tuple, dtype: str, attrs: tuple, device: str | None, as_json: bool,
            output_path: str | None) -> None:
    """Which kernel a call would run, the candidates and why.

    \b
    Examples:
      opruntime explain matmul --shape 1024x1024,1024x1024
      opruntime explain softmax --shape 8x4096 --attr axis=0 --device cpu --json
    """
    case = bench.make_case(op, shape, dtype, dict(attrs))
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np_dtype(dtype)) for s in case.shapes]
    ex = opr.explain(op, *arrays, device=device, **case.attrs)
    data = {"problem": str(ex.problem), "device": ex.device, "chosen": ex.chosen, "why": ex.why, "cached": ex.cached,
            "candidates": [{"label": c.label, "kernel": c.kernel.name, "config": dict(c.config), "estimate_s": c.cost,
                            "measured_s": c.measured, "status": c.status} for c in ex.candidates]}
    output.emit(data, as_json=as_json, output=output_path, show=lambda: print(ex))


@cli.command("plot", context_settings=CONTEXT)
@click.argument("data", nargs=-1, metavar="[BENCH.json]...", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", "out", metavar="PATH", type=click.Path(dir_okay=False),
              help="the chart to write: .svg, .png or .pdf (with BENCH.json files)")
@click.option("--op", "ops", multiple=True, metavar="OP",
              help="draw only this operator (repeatable)  [default: every operator in the files]")
@click.option("--title", help="the chart's title  [default: the operators]")
@click.option("--page", metavar="MANIFEST", type=click.Path(exists=True, dir_okay=False),
              help="redraw every chart and the summary table of the page MANIFEST describes "
                   "(docs/data/current.json), instead of one chart")
def plot_command(data: tuple[str, ...], out: str | None, ops: tuple[str, ...], title: str | None,
                 page: str | None) -> None:
    """Chart bench JSON files as peer ratios, or redraw the performance page.

    One chart of peer time / opruntime time: horizontal bars per case, one panel per device, a line at 1.0 (above it,
    opruntime is faster). The files are what `opruntime bench -o PATH` writes. Needs matplotlib.

    \b
    Examples:
      opruntime bench softmax --shape 4096x4096 -o softmax.json
      opruntime plot softmax.json -o softmax.svg
      opruntime plot cpu.json gpu.json -o matmul.svg --op matmul --title "matmul, cpu and H100"
      opruntime plot --page docs/data/current.json
    """
    if page and (data or out or ops or title):
        raise click.UsageError("--page redraws the page its manifest describes: give it alone, "
                               "or give BENCH.json files with -o PATH")
    if not page and not (data and out):
        raise click.UsageError("give bench JSON files and -o PATH (e.g. opruntime plot bench.json -o bench.svg), "
                               "or --page MANIFEST")
    if page:
        argv = ["--page", page]
    else:
        argv = ["-o", out, *(a for op in ops for a in ("--op", op)), *(["--title", title] if title else []),
                "--", *data]
    status = plot.main(argv, raise_errors=True)  # a ConfigError: one line, status 2, as every user error
    if status:
        raise click.exceptions.Exit(status)


# -- running it --------------------------------------------------------------------------------------
def _command_line() -> str:
    """The command line being run, as ``opruntime ARGS`` (the bench's JSON records it)."""
    ctx = click.get_current_context(silent=True)
    state = ctx.find_root().obj if ctx is not None else None
    argv = state.get("argv") if isinstance(state, dict) else None
    return shlex.join(["opruntime", *(argv if argv is not None else sys.argv[1:])])


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command on ``argv`` (default: ``sys.argv[1:]``); returns the exit status: 0, 1
    when a benchmark case failed, 2 for a user's mistake (one line on stderr)."""
    argv = list(argv) if argv is not None else sys.argv[1:]
    state: dict[str, Any] = {"debug": False, "argv": argv}
    try:
        try:
            status = cli.main(args=argv, prog_name="opruntime",
                              standalone_mode=False, obj=state)
        finally:
            sys.stdout.flush()  # a closed pipe shows here, inside the handler below
    except BrokenPipeError:
        # the reader went away (`opruntime info | head -1`): the Python docs' recipe, so that the
        # interpreter's last flush of stdout does not raise again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except click.exceptions.Exit as done:
        return done.exit_code
    except click.exceptions.Abort:
        print("opruntime: interrupted", file=sys.stderr)
        return 130
    except click.ClickException as exc:
        return _fail(exc.format_message(), exc, state, _usage_hint(exc))
    except OpRuntimeError as exc:
        return _fail(f"{type(exc).__name__}: {exc}", exc, state)
    except SystemExit as exc:  # a tool's own refusal, e.g. --plot without matplotlib
        if isinstance(exc.code, str):
            return _fail(exc.code, exc, state)
        raise
    return status if isinstance(status, int) else 0  # an int: click's Exit (bench: 1 when a case failed)


def _usage_hint(exc: click.ClickException) -> str:
    ctx = getattr(exc, "ctx", None)
    return f" (see '{ctx.command_path} --help')" if ctx is not None else ""


def _fail(message: str, exc: BaseException, state: dict[str, Any], hint: str = "") -> int:
    """A user's mistake: one line on stderr and exit status 2 (the traceback with ``--debug``)."""
    if state.get("debug"):
        import traceback

        traceback.print_exception(exc)
    one_line = " ".join(message.split())
    print(f"opruntime: {one_line}{hint}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
