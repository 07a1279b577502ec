"""``opruntime bench``: time operators through opruntime, each candidate kernel, and the peers
(NumPy, CuPy/cuBLAS, torch, Triton, JAX, onnxruntime) on the same inputs in the same run.

Everything about an operator comes from the operator (``opruntime.ops.OPS``): its suites
(``Operator.bench``), its float64 reference, its flops and bytes and which of them bounds it,
and its peers. Every timing goes through the runtime's one harness (:mod:`opruntime.timing`):
the median over ``repeats`` batches of back-to-back calls followed by one device
synchronisation (so GPU launch gaps overlap as they do in real programs), after a warm-up that
compiles and caches. Inputs are random normal values, never zeros. Ratios are peer time / our
time: above 1 means opruntime is faster. Each timing also keeps the p10-p90 spread of its rounds;
a timing whose rounds spread wider than ``NOISY`` is flagged, and so is an overhead (our call
minus the chosen kernel called directly, paired per round) that comes out at or below zero.
"""

from __future__ import annotations

import difflib
import inspect
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from rich.table import Table

from opruntime.config import settings
from opruntime.devices import Device, host_normal
from opruntime.errors import AttributeValueError, NoKernelError, ShapeError
from opruntime.kernels import Problem, np_dtype
from opruntime.ops import FUNCTIONS, OPS
from opruntime.ops.base import Case, Operator, wide
from opruntime.selector import Candidate, capturing, plans
from opruntime.tensor import Tensor
from opruntime.timing import Timed, measure, measure_rounds, paired_ratio, settle

from . import output
from . import peers as peer_libraries
from .output import seconds, span


def suites() -> dict[str, list[Case]]:
    """Suite name -> cases: each operator's ``bench`` tables joined in ``OPS`` order; ``demo`` is
    ``cpu`` then ``overhead``."""
    out: dict[str, list[Case]] = {}
    for op in OPS.values():
        for suite, cases in op.bench.items():
            out.setdefault(suite, []).extend(cases)
    out["demo"] = out.get("cpu", []) + out.get("overhead", [])
    return out


SUITES = suites()
#: rounds at least, with ``--kernels``: telling candidates 1-2% apart needs more than the peers do
KERNEL_ROUNDS = 61
SELECTION_WITHIN = 0.02  # the selected kernel should be this close to the fastest candidate
#: an operator's ``bound`` -> the rate reported: its unit and the Result field counting the work
RATES: Mapping[str, tuple[str, str]] = {"memory": ("GB/s", "bytes"), "compute": ("GFLOP/s", "flops")}


@dataclass
class Result:
    """One case on one device: our time, each candidate's, each peer's (seconds; rates in ``unit``)."""

    op: str
    problem: str
    dtype: str
    device: str
    kernel: str = ""
    time_s: float = math.nan
    direct_s: float = math.nan  # the chosen kernel called directly, without the frontend
    select_s: float = math.nan  # a cache-hit selection: the call's key built and looked up
    rate: float = math.nan
    unit: str = ""
    peers: dict[str, float] = field(default_factory=dict)
    candidates: dict[str, float] = field(default_factory=dict)
    error: str = ""
    flops: float = math.nan  # floating-point operations of one call (the roofline's numerator)
    bytes: float = math.nan  # bytes of operands and result (its denominator)
    #: each peer's time / ours, the median of the per-round ratios (see ``paired_ratio``)
    peer_ratios: dict[str, float] = field(default_factory=dict)
    #: each candidate's time / the chosen kernel's, likewise (``--kernels``)
    vs_chosen: dict[str, float] = field(default_factory=dict)
    #: how much slower the chosen kernel is than the fastest candidate (0.012: 1.2%; 0: it is the fastest)
    selection_gap: float = math.nan
    #: opruntime's call minus the chosen kernel called directly: the median of the per-round
    #: differences (paired, as the ratios); 0.0 when it is below the noise (``"overhead"`` in ``noisy``)
    overhead_s: float = math.nan
    #: the 10th and 90th percentiles over the rounds of each timing: ``opruntime``, ``direct``,
    #: ``overhead`` (of the per-round differences), ``kernel:<label>``, ``peer:<name>``
    spread_s: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: the timings whose rounds were noisy (p90 / p10 above ``NOISY``), and ``overhead`` when the
    #: overhead came out at or below zero (smaller than the noise of the two timings)
    noisy: list[str] = field(default_factory=list)
    #: timed as device-graph replays (``--graphs``): every contender's time is its device's alone
    graphs: bool = False

    def ratios(self) -> dict[str, float]:
        """Peer time / our time per peer: above 1, opruntime is faster."""
        if self.peer_ratios:
            return dict(self.peer_ratios)
        return {k: v / self.time_s for k, v in self.peers.items() if math.isfinite(v)}


#: rounds whose p90 / p10 exceeds this are flagged noisy (a busy machine, clocks changing)
NOISY = 1.5


def spread(samples: Sequence[float]) -> tuple[float, float]:
    """The 10th and 90th percentiles of per-round samples (both the sample when there is one)."""
    if len(samples) < 2:
        return (samples[0], samples[0]) if samples else (math.nan, math.nan)
    cuts = statistics.quantiles(samples, n=10, method="inclusive")
    return cuts[0], cuts[-1]


def is_noisy(samples: Sequence[float]) -> bool:
    """Whether per-round times spread wider than ``NOISY`` (p90 / p10)."""
    lo, hi = spread(samples)
    return lo > 0 and hi / lo > NOISY


def paired_difference(a: Sequence[float], b: Sequence[float]) -> tuple[float, tuple[float, float]]:
    """The median and the p10-p90 spread of ``a - b`` per round, for two contenders timed in the
    same rounds (a slow spell then falls on both terms of each difference)."""
    diffs = [x - y for x, y in zip(a, b)]
    return statistics.median(diffs), spread(diffs)


def random_tensors(case: Case, device: Device, seed: int = 0) -> list[Tensor]:
    """Random normal operands (never zeros) for ``case`` on ``device``, drawn there."""
    dtype, draw = np_dtype(case.dtype), device.provider.random_normal
    return [Tensor._wrap(draw(shape, dtype, seed + i), device) for i, shape in enumerate(case.shapes)]


def run_case(case: Case, device: Device, *, repeats: int = 15, kernels: bool | Sequence[str] = False,
             peers: Sequence[str] | None = None, graphs: bool = False) -> Result:
    """Benchmark one case on one device; ``peers`` limits the peer libraries (default: all).
    ``kernels``: also time the candidates directly, every one (``True``) or those whose label
    contains one of these strings (the chosen kernel is always timed). ``graphs``: time every
    contender as replays of a device graph of its calls (:func:`_graphed`), which leaves the host's
    cost of each call out: what a kernel reaches inside ``opr.capture``, and the device's bandwidth
    where an eager call of a small problem is bound by its launch."""
    op = OPS[case.op]
    rng, dtype = np.random.default_rng(0), np_dtype(case.dtype)
    host = op.sample([host_normal(rng, s, dtype) for s in case.shapes], case)  # the peers and the reference get these
    res = Result(case.op, case.label, case.dtype, device.name, graphs=graphs)
    prov = device.provider
    attrs = dict(case.attrs)
    try:
        placed = [prov.from_host(h) for h in host]
        datas = [d if d.dtype == dtype or d.dtype == bool else prov.astype(d, dtype) for d in placed]
        tensors = [Tensor._wrap(d, device) for d in datas]
        public = FUNCTIONS[case.op]  # what users call
        named = dict(zip(op.operands, tensors))  # operands by name: layer_norm's weight follows normalized_shape
        last: list[Any] = [None]  # each contender waits for its own last result, as the peers do

        def wait_last() -> None:
            prov.wait(last[0])

        def ours() -> None:
            last[0] = public(**named, **attrs).data

        contenders: dict[str, Timed] = {"opruntime": (ours, wait_last)}
        first = prov.to_host(public(**named, **attrs).data)  # plans (and tunes, when asked) before timing
        plan = op.plan(datas, device, attrs, settings())
        problem = plan.problem
        views = [d.reshape(s) for d, s in zip(datas, plan.views)]
        res.kernel = plan.order[0].label if plan.order else "(trivial)"
        for i, c in enumerate(plan.order if kernels else plan.order[:1]):
            if i and not (kernels is True or any(k in c.label for k in kernels)):
                continue
            contenders["direct" if i == 0 else f"kernel:{c.label}"] = (_direct(c, problem, views, last), wait_last)
        res.flops, res.bytes = op.flops(problem), op.bytes(problem)
    except Exception as exc:
        res.error = f"{type(exc).__name__}: {exc}"
        return res
    for name, timed in peer_libraries.contenders(op, case, host, device, datas[0], peers, res.bytes).items():
        contenders[f"peer:{name}"] = timed
    calls = peer_libraries.GRAPH_CALLS  # calls a graph records (and a replay stands for)
    if graphs:
        try:
            contenders = _graphed(contenders, device, datas[0], calls)
        except Exception as exc:
            res.error = f"{type(exc).__name__}: {exc}"
            return res
    samples, errors = measure_rounds(contenders, max(repeats, KERNEL_ROUNDS) if kernels else repeats,
                                     idle=settle(prov))
    if graphs:
        samples = {name: [t / calls for t in ts] for name, ts in samples.items()}
    if "opruntime" in errors:
        res.error = errors["opruntime"]
        return res
    ours_s, direct = samples["opruntime"], samples.get("direct")
    res.time_s = statistics.median(ours_s)
    res.direct_s = statistics.median(direct) if direct else math.nan
    for name, t in samples.items():
        res.spread_s[name] = spread(t)
        if is_noisy(t):
            res.noisy.append(name)
    if direct:
        overhead, res.spread_s["overhead"] = paired_difference(ours_s, direct)
        res.overhead_s = max(overhead, 0.0)
        if overhead <= 0:  # the direct call timed slower than the whole call: the overhead is below the noise
            res.noisy.append("overhead")
    if kernels and direct:
        res.candidates[plan.order[0].label] = res.direct_s
        res.vs_chosen[plan.order[0].label] = 1.0
    for name, t in samples.items():
        kind, _, label = name.partition(":")
        if kind == "kernel":
            res.candidates[label] = statistics.median(t)
            if direct:
                res.vs_chosen[label] = paired_ratio(t, direct)
        elif kind == "peer":
            res.peers[label] = statistics.median(t)
            res.peer_ratios[label] = paired_ratio(t, ours_s)
    for name, err in errors.items():  # a failing candidate or peer is reported, not fatal
        print(f"  {name}: {err}", file=sys.stderr)
        if name.startswith("kernel:"):
            res.candidates[name.partition(":")[2]] = math.nan
    if len(res.vs_chosen) > 1:
        res.selection_gap = max(0.0, 1 / min(res.vs_chosen.values()) - 1)
    res.error = check_result(op, case, host, res.flops, first, prov.to_host(public(**named, **attrs).data))
    res.select_s = select_time(op, tensors, attrs, repeats)
    res.unit, work = RATES[op.bound]
    res.rate = getattr(res, work) / res.time_s / 1e9
    return res


def _graphed(contenders: Mapping[str, Timed], device: Device, sample: Any, calls: int) -> dict[str, Timed]:
    """Each contender recorded as a device graph of ``calls`` calls (:func:`.peers.graphed`),
    replayed as one call; a peer or candidate that cannot be recorded is left out with the reason
    on stderr, opruntime's own call raises."""
    at = peer_libraries.where(device, sample)
    out: dict[str, Timed] = {}
    token = capturing.set(True)  # as opr.capture: a kernel failing while recorded ends the recording
    try:
        for name, timed in contenders.items():
            kind, _, label = name.partition(":")
            try:
                out[name] = peer_libraries.graphed(label if kind == "peer" else "opruntime", timed, device, at,
                                                   calls)
            except Exception as exc:
                if name == "opruntime":
                    raise
                print(f"  {name}: not timed, no graph ({type(exc).__name__}: {exc})", file=sys.stderr)
    finally:
        capturing.reset(token)
    return out


def _direct(c: Candidate, problem: Problem, views: Sequence[Any], last: list[Any]) -> Callable[[], None]:
    """Candidate ``c`` called directly through its prepared launcher, keeping its last result; a
    launcher that cannot be prepared raises when called (the harness reports it)."""
    try:
        launch = c.kernel.launcher(problem, c.config)
    except Exception as exc:
        failure = exc

        def call() -> None:
            raise failure

        return call

    def call() -> None:
        last[0] = launch(*views)

    return call


#: the float64 reference is computed on the host for cases up to this many floating-point operations
REFERENCE_FLOPS = 1e9


def check_result(op: Operator, case: Case, host: Sequence[np.ndarray], flops: float, first: np.ndarray,
                 final: np.ndarray) -> str:
    """Why the timed calls cannot be trusted, or "": opruntime's answer after the timing must be the
    one it gave first (a kernel that reads freed memory, or races, changes it), and, where the
    host can afford the float64 reference, right."""
    from opruntime.testing.numerics import TOLERANCE, rel_err

    tol = TOLERANCE[case.dtype]
    try:
        drift = rel_err(final.astype(np.float64), first.astype(np.float64))
    except AssertionError as exc:  # NaN or inf where the first answer had none
        drift, why = math.inf, f" ({exc})"
    else:
        why = ""
    if not drift <= tol:
        return (f"wrong result: after the timing, opruntime's answer differs from its first by {drift:.1e} "
                f"(relative; tolerance {tol:g}){why}: a kernel whose answer changes from call to call")
    if flops <= REFERENCE_FLOPS:
        ref = op.reference(*wide(host), **case.attrs)
        try:
            err = rel_err(first.astype(np.float64).reshape(ref.shape), ref)
        except AssertionError as exc:
            return f"wrong result: {exc}"
        if not err <= tol:
            return f"wrong result: {err:.1e} from the float64 reference (relative; tolerance {tol:g})"
    return ""


class _NoPlan:
    """A cached plan that computes nothing: what is left of a call is its selection."""

    __slots__ = ("device",)

    def __init__(self, device: Device) -> None:
        self.device = device

    def __call__(self, datas: Any) -> None:
        return None


def select_time(op: Operator, tensors: Sequence[Tensor], attrs: dict[str, Any], repeats: int = 15) -> float:
    """Seconds of a cache-hit selection: the public function's own call path (settings, the key
    from the Tensors, the plan-cache lookup) with the cached plan swapped for one that does
    nothing; NaN when the call's plan is not cached (an unhashable attribute)."""
    public = FUNCTIONS[op.name]
    # operands by name: a signature may put attributes first (layer_norm(x, normalized_shape, weight))
    bound = inspect.signature(public).bind(**dict(zip(op.operands, tensors)), **attrs)
    bound.apply_defaults()  # the public function keys every attribute, defaults included
    every = {n: bound.arguments[n] for n in op.attributes}
    device = tensors[0].device
    args, kwargs = bound.args, bound.kwargs
    public(*args, **kwargs)  # the plan is cached under the key
    try:
        key = op.key(settings(), device, [t.data for t in tensors], every)
        real = plans.get(key)
    except TypeError:
        return math.nan
    if real is None:
        return math.nan
    plans[key] = _NoPlan(device)
    try:
        return measure(lambda: public(*args, **kwargs), _no_sync, repeats)
    finally:
        plans[key] = real


def _no_sync() -> None:
    return None


def tables(results: Sequence[Result]) -> list[Table]:
    """The times, then the ratios to the peers (two tables, so that each reads at 100 columns).

    The first has one row per case (its time, the p10-p90 spread of its rounds, rate, overhead,
    selection time), its candidate kernels indented below it (``--kernels``); the second one
    column per peer. A noisy figure ends in ``!`` (see :func:`legend`); the device column is
    left out when every case ran on one device (the heading names it)."""
    devices = sorted({r.device for r in results})
    many = len(devices) > 1
    head = ["case", *(["device"] if many else []), "kernel", "time", "p10-p90", "rate", "overhead", "select"]
    rows: list[list[str]] = []
    for r in results:
        where = [r.device] if many else []
        if r.error:
            rows.append([_case(r), *where, "ERROR", r.error[:60], "", "", "", ""])
            continue
        overhead = "~0 (noise)" if "overhead" in r.noisy else seconds(r.overhead_s) + _straddles(r)
        rows.append([_case(r), *where, r.kernel, seconds(r.time_s), _span(r, "opruntime"),
                     f"{r.rate:,.1f} {r.unit}", overhead, seconds(r.select_s)])
        for name, t in sorted(r.candidates.items(), key=lambda kv: r.vs_chosen.get(kv[0], math.inf)):
            vs = r.vs_chosen.get(name)
            rows.append(["", *([""] if many else []), f"  {name}", seconds(t), _span(r, f"kernel:{name}"),
                         f"{vs:.3f}x chosen" if vs else "", "", ""])
    title = None if many else f"on {devices[0]}" if devices else None
    out = [output.table(head, rows, right=["time", "p10-p90", "rate", "overhead", "select"], title=title,
                        wrap=["case", "kernel"])]
    peer_names = sorted({p for r in results for p in r.peers})
    if peer_names:
        ratios = []
        for r in results:
            if r.error:
                continue
            mine = r.ratios()
            ratios.append([_case(r), *([r.device] if many else []),
                           *(f"{mine[p]:.2f}x" + (" !" if f"peer:{p}" in r.noisy else "") if p in mine else "-"
                             for p in peer_names)])
        head = ["case", *(["device"] if many else []), *(f"vs {p}" for p in peer_names)]
        out.append(output.table(head, ratios, right=[f"vs {p}" for p in peer_names], wrap=["case"]))
    return out


def _case(r: Result) -> str:
    return f"{r.op} {r.problem} {r.dtype}" + (" (graphs)" if r.graphs else "")


def _straddles(r: Result) -> str:
    """``" !"`` when the per-round differences behind a positive overhead reach zero or below."""
    lo = r.spread_s.get("overhead", (math.nan, math.nan))[0]
    return " !" if lo <= 0 else ""


def _span(r: Result, name: str) -> str:
    """The p10-p90 spread of one timing of ``r``, ``!`` after it when its rounds were noisy."""
    lo, hi = r.spread_s.get(name, (math.nan, math.nan))
    return span(lo, hi) + (" !" if name in r.noisy else "")


def legend(results: Sequence[Result]) -> list[str]:
    """The lines under the table: what its columns mean, the noisy figures, the selection summary."""
    lines = ["vs X = X's time / opruntime's, the median of per-round ratios (above 1: opruntime is faster); "
             "p10-p90 = the spread of the rounds; overhead = opruntime's call - the chosen kernel called "
             "directly (the median of per-round differences); select = a cache-hit selection; "
             "a candidate kernel's time / the chosen kernel's (\"x chosen\", paired per round) under the case"]
    noisy = [r for r in results if any(n != "overhead" for n in r.noisy) or _straddles(r)]
    if noisy:
        lines.append(f"! = noisy, in {len(noisy)} case(s): its rounds spread more than {NOISY}x (p90/p10), or, "
                     "for an overhead, its per-round differences reach zero: a busy machine; run again with more "
                     "--repeats, or on a quieter machine")
    if any("overhead" in r.noisy for r in results):
        lines.append("~0 (noise) = the overhead came out at or below zero: smaller than the noise of the "
                     "two timings it is the difference of")
    return lines + selection_summary(results)


def format_table(results: Sequence[Result], width: int = 100) -> str:
    """The tables and their legend as plain text ``width`` columns wide."""
    return "".join(output.render(item, width) for item in [*tables(results), *legend(results)])


def selection_summary(results: Sequence[Result]) -> list[str]:
    """One line on how close the selected kernels came to the fastest candidate (``--kernels``)."""
    checked = [r for r in results if math.isfinite(r.selection_gap)]
    if not checked:
        return []
    over = [r for r in checked if r.selection_gap > SELECTION_WITHIN]
    worst = max(checked, key=lambda r: r.selection_gap)
    line = (f"selection: the chosen kernel is within {SELECTION_WITHIN:.0%} of the fastest candidate in "
            f"{len(checked) - len(over)} of {len(checked)} cases (worst {worst.selection_gap:.1%}: {worst.op} "
            f"{worst.problem} {worst.dtype})")
    return [line] + [f"  over: {r.op} {r.problem} {r.dtype} on {r.device}: {r.selection_gap:.1%}" for r in over]


#: the distributions whose versions a result file records: opruntime's stacks and the peers'
DISTRIBUTIONS = ("numpy", "cupy-cuda13x", "cupy-cuda12x", "torch", "triton", "jax", "jaxlib", "pyopencl", "onnx",
                 "onnxruntime")


def environment(devices: Sequence[Device] = ()) -> dict[str, Any]:
    """Where a benchmark ran: date, versions of opruntime and the peers, the devices."""
    import importlib.metadata
    import platform

    from opruntime import __version__

    versions = {"opruntime": __version__, "python": platform.python_version()}
    for dist in DISTRIBUTIONS:
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "versions": versions,
            "devices": {d.name: {"description": d.provider.description, **d.provider.info()} for d in devices}}


def document(results: Sequence[Result], devices: Sequence[Device] = (),
             extra: dict[str, Any] | None = None, command: str | None = None) -> dict[str, Any]:
    """The results, where they ran and ``extra`` (e.g. ``roofline``), as data for strict JSON:
    times in seconds (``*_s``), ``flops`` and ``bytes`` as integers, each result's ``ratios``.
    ``command`` is the command line that measured them (``opruntime bench ...``), recorded as
    ``"command"``: the performance page's plot tool (:mod:`.plot`) prints it under each chart."""
    head = {**environment(devices), **({"command": command} if command else {})}
    return {**head, "results": [record(r) for r in results], **(extra or {})}


def record(r: Result) -> dict[str, Any]:
    """One result as JSON data (see :func:`document`)."""
    counts = {k: int(v) if math.isfinite(v) else None for k, v in (("flops", r.flops), ("bytes", r.bytes))}
    return asdict(r) | counts | {"ratios": r.ratios()}


def parse_shapes(spec: str) -> tuple[tuple[int, ...], ...]:
    """``"1024x1024,1024x1024"`` -> ``((1024, 1024), (1024, 1024))``."""
    try:
        return tuple(tuple(int(n) for n in part.split("x")) for part in spec.split(","))
    except ValueError:
        raise ShapeError(f"bad shape {spec!r}: write operand shapes like 1024x1024,1024x1024") from None


def parse_attr(text: str) -> tuple[str, Any]:
    """``"stride=[2,1]"`` -> ``("stride", (2, 1))``: the value as JSON (lists as tuples), or as
    Python spells its constants (``True``, ``False``, ``None``), else the text itself."""
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise AttributeValueError(f"bad attribute {text!r}: write name=value, e.g. padding=1 or stride=[2,1]")
    try:
        parsed: Any = json.loads({"True": "true", "False": "false", "None": "null"}.get(value, value))
    except json.JSONDecodeError:
        parsed = value
    return key, tuple(parsed) if isinstance(parsed, list) else parsed


def make_case(op: str, shapes: Sequence[tuple[int, ...]], dtype: str, attrs: Mapping[str, Any]) -> Case:
    """The bench case of ``op`` on operands of ``shapes``, checking how many operands it takes."""
    if op not in OPS:
        close = difflib.get_close_matches(op, list(OPS), n=1)
        raise NoKernelError(f"unknown operator {op!r}" + (f"; did you mean {close[0]!r}?" if close else "")
                            + f" Operators: {', '.join(OPS)}")
    operator = OPS[op]
    least = operator.required if operator.required is not None else len(operator.operands)
    if not least <= len(shapes) <= len(operator.operands):
        spec = ",".join("x".join(map(str, s)) for s in shapes)
        raise ShapeError(f"{op} takes {'/'.join(operator.operands)}: give {least} to {len(operator.operands)} "
                         f"comma-separated shapes, got {spec!r}")
    return Case(tuple(tuple(s) for s in shapes), dict(attrs), dtype, op=op)


def parse_case(op: str, spec: str, dtype: str, attrs: Sequence[str]) -> Case:
    """``parse_case("matmul", "1024x1024,1024x1024", "float32", [])``; attrs as ``key=value``."""
    return make_case(op, parse_shapes(spec), dtype, dict(parse_attr(a) for a in attrs))
