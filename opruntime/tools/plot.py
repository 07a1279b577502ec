"""``opruntime bench --plot out.png``: the benchmark as bar charts and a roofline.

One bar chart per operator (each case a group: opruntime's choice, each candidate kernel timed
with ``--kernels`` at its best config, each peer), throughput on the y axis; then one roofline
chart per device: achieved GFLOP/s against arithmetic intensity under the device's memory
bandwidth and compute roofs. The roofs come from the device's own
``DeviceProvider.roofline()`` (``{"bytes_per_s": ..., "flops_per_s": {dtype: ...}}``) when it
gives them, else they are measured once here: a device copy for the bandwidth, opruntime's
matmul for the compute rate of float32 and of each other dtype benchmarked.

matplotlib is imported only here, and only for ``--plot``: it is an optional dependency.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from opruntime.devices import Device
from opruntime.errors import ConfigError
from opruntime.ops import OPS
from opruntime.ops.base import Case
from opruntime.timing import back_to_back

from .bench import random_tensors

if TYPE_CHECKING:
    from .bench import Result


def require_matplotlib() -> None:
    """Fail early, with the fix, when matplotlib is missing."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise SystemExit("opruntime bench --plot needs matplotlib, which is not installed: "
                         "pip install matplotlib  (the benchmark itself runs without it; use --json for the data)")


# -- the roofs ------------------------------------------------------------------------------------
def roofline_figures(device: Device, dtypes: Sequence[str] = ("float32",)) -> dict[str, Any]:
    """``{"bytes_per_s": B, "flops_per_s": {dtype: F}, "source": how}`` for ``device``."""
    own = device.provider.roofline()
    if own is not None:
        figures = dict(own)
        figures.setdefault("source", f"{device.name} DeviceProvider.roofline()")
        return figures
    return {"bytes_per_s": measure_bandwidth(device),
            "flops_per_s": {dt: f for dt in dict.fromkeys(["float32", *dtypes]) if (f := measure_compute(device, dt))},
            "source": "measured: a device copy and opruntime's matmul"}


def _best(fn: Any, sync: Any, runs: int = 5) -> float:
    """The fastest of ``runs`` timed calls after one warm-up: a roof is what the device can do,
    so the best run counts, not the median (other processes only ever slow a run down)."""
    fn()
    return min(back_to_back(fn, sync, 1) for _ in range(runs))


def measure_bandwidth(device: Device, nbytes: int = 64 << 20) -> float:
    """Bytes per second of a device-side copy (read + write), the best of a few conversions."""
    prov = device.provider
    n = nbytes // 4
    x = prov.from_host(np.random.default_rng(0).standard_normal(n).astype(np.float32))
    best = 0.0
    for dtype in map(np.dtype, ("float32", "float16", "float64")):  # astype to itself may be a no-op
        try:
            if dtype == np.float32 and prov.astype(x, dtype) is x:
                continue
            t = _best(lambda dt=dtype: prov.astype(x, dt), prov.synchronize)
        except Exception:  # a conversion the device lacks: the others measure it
            continue
        best = max(best, n * (4 + dtype.itemsize) / t)
    return best


def measure_compute(device: Device, dtype: str = "float32", budget_s: float = 0.05) -> float | None:
    """FLOP/s of opruntime's matmul on square ``dtype`` operands, grown until one call takes
    ``budget_s`` (or n = 8192); None when no matmul kernel computes ``dtype`` there."""
    n, rate = 256, None
    while True:
        try:
            a, b = random_tensors(Case(((n, n), (n, n)), {}, dtype, op="matmul"), device)
            t = _best(lambda a=a, b=b: OPS["matmul"](a, b), device.provider.synchronize)
        except Exception:
            return rate
        rate = max(rate or 0.0, 2.0 * n**3 / t)
        if t >= budget_s or n >= 8192:
            return rate
        n *= 2


# -- the charts -----------------------------------------------------------------------------------
def _work(r: Result) -> float:
    """The result's throughput numerator in the plotted unit (rate * time)."""
    return r.rate * r.time_s


def _series(r: Result) -> dict[str, float]:
    """name -> throughput of opruntime, each candidate kernel (best config) and each peer."""
    out = {f"opruntime ({r.kernel})" if not r.candidates else "opruntime": r.rate}
    best: dict[str, float] = {}
    for label, t in r.candidates.items():
        name = label.split("[")[0]
        if math.isfinite(t) and t > 0 and (name not in best or t < best[name]):
            best[name] = t
    out.update({name: _work(r) / t for name, t in best.items()})
    out.update({f"peer: {p}": _work(r) / t for p, t in r.peers.items() if math.isfinite(t) and t > 0})
    return out


def plot(results: Sequence[Result], path: str, roofs: dict[str, dict[str, Any]]) -> None:
    """Write the charts for ``results`` to ``path`` (the format follows the suffix: png, svg, pdf)."""
    from matplotlib.figure import Figure

    good = [r for r in results if not r.error and math.isfinite(r.rate)]
    ops = list(dict.fromkeys(r.op for r in good))
    devices = list(dict.fromkeys(r.device for r in good))
    multi = len(devices) > 1
    widest = max((sum(1 for r in good if r.op == op) for op in ops), default=1)
    fig = Figure(figsize=(max(9.0, 1.6 * widest + 3), 3.6 * (len(ops) + len(devices))), layout="constrained")
    axes = fig.subplots(len(ops) + len(devices), 1, squeeze=False)[:, 0]
    for ax, op in zip(axes, ops):
        _bars(ax, [r for r in good if r.op == op], op, multi)
    for ax, dev in zip(axes[len(ops):], devices):
        _roofline(ax, [r for r in good if r.device == dev], dev, roofs.get(dev, {}))
    fig.savefig(path, dpi=120)


def _bars(ax: Any, rs: list[Result], op: str, multi: bool) -> None:
    per_case = [_series(r) for r in rs]
    names = list(dict.fromkeys(n for s in per_case for n in s))
    names.sort(key=lambda n: (not n.startswith("opruntime"), n.startswith("peer: "), n))
    width = 0.8 / max(len(names), 1)
    x = np.arange(len(rs))
    kernels = [n for n in names if not n.startswith(("opruntime", "peer: "))]
    peers = [n for n in names if n.startswith("peer: ")]
    color = {n: "tab:blue" for n in names if n.startswith("opruntime")}
    color |= dict(zip(kernels, _colors(len(kernels), "Blues", 0.25)))  # kernels: shades of opruntime's blue
    color |= dict(zip(peers, ["tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink"] * 3))
    for i, name in enumerate(names):
        vals = [s.get(name, np.nan) for s in per_case]
        ax.bar(x + (i - (len(names) - 1) / 2) * width, vals, width, label=name, color=color[name],
               hatch="//" if name.startswith("peer: ") else None, edgecolor="white", linewidth=0.3)
    labels = [_label(r) + f"\n{r.dtype}" + (f" {r.device}" if multi else "") for r in rs]
    ax.set_xticks(x, labels, fontsize=7)
    vals = [v for s in per_case for v in s.values() if v > 0 and math.isfinite(v)]
    if vals and max(vals) / min(vals) > 50:
        ax.set_yscale("log")
    unit = rs[0].unit
    ax.set_ylabel(unit)
    ax.set_title(f"{op}: throughput ({unit}, higher is better)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)  # beside, not over, the bars
    ax.grid(axis="y", alpha=0.3)


def _label(r: Result) -> str:
    """``"8x64x56x56 x 64x64x3x3 stride=1"`` -> one operand per line, then the attributes."""
    head, _, last = r.problem.rpartition(" ")
    shapes, attrs = (head, last) if "=" in last else (r.problem, "")
    return shapes.replace(" x ", " x\n") + (f"\n{attrs}" if attrs else "")


def _roofline(ax: Any, rs: list[Result], device: str, roofs: dict[str, Any]) -> None:
    pts = [(r.flops / r.bytes, r.flops / r.time_s, r) for r in rs
           if math.isfinite(r.flops) and math.isfinite(r.bytes) and r.bytes > 0 and r.flops > 0]
    bw, flops, raised = _fit_roofs(roofs.get("bytes_per_s") or 0.0, dict(roofs.get("flops_per_s") or {}), rs)
    ais = [p[0] for p in pts] or [1.0]
    lo, hi = min(ais) / 4, max(max(ais) * 4, 4 * max(flops.values(), default=1.0) / max(bw, 1.0))
    grid = np.logspace(np.log10(lo), np.log10(hi), 200)
    for (dtype, peak), color in zip(flops.items(), _colors(len(flops), "Greys", 0.4)):
        roof = np.minimum(peak, bw * grid) if bw else np.full_like(grid, peak)
        ax.plot(grid, roof / 1e9, color=color, lw=1.5,
                label=f"roof: {bw / 1e9:,.1f} GB/s, {peak / 1e9:,.1f} GFLOP/s ({dtype}"
                      + (", raised to rates measured in this run)" if raised else ")"))
    ops = list(dict.fromkeys(p[2].op for p in pts))
    markers = dict(zip(ops, itertools.cycle("osD^v<>")))
    colors = dict(zip(ops, itertools.cycle(["tab:blue", "tab:red", "tab:green", "tab:purple", "tab:brown"])))
    for ai, rate, r in pts:
        ax.scatter(ai, rate / 1e9, marker=markers[r.op], color=colors[r.op], s=28, zorder=3,
                   label=r.op if r.op not in ax.get_legend_handles_labels()[1] else None)
        ax.annotate(r.problem.split(" x ")[0].split(" ")[0], (ai, rate / 1e9),  # the first operand's shape
                    fontsize=6, xytext=(3, 3), textcoords="offset points")
        for t in r.peers.values():
            if math.isfinite(t) and t > 0:
                ax.scatter(ai, r.flops / t / 1e9, marker=markers[r.op], s=18, facecolors="none",
                           edgecolors="grey", zorder=2, label=("peers" if "peers" not in
                                                               ax.get_legend_handles_labels()[1] else None))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte of operands and result)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title(f"roofline on {device} ({roofs.get('source', 'no figures')})", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.grid(alpha=0.3, which="both")


def _fit_roofs(bw: float, flops: dict[str, float], rs: list[Result]) -> tuple[float, dict[str, float], bool]:
    """Raise the roofs to the best rates measured in the run (opruntime, candidates and peers): a
    roof is what the device can do, so a rate above it means the roof was measured low (a busy
    machine). Returns (bandwidth, compute per dtype, whether anything was raised)."""
    raised = False
    for r in rs:
        if not (math.isfinite(r.flops) and math.isfinite(r.bytes) and r.flops > 0 and r.bytes > 0):
            continue
        ai = r.flops / r.bytes
        for t in [r.time_s, *r.candidates.values(), *r.peers.values()]:
            if not (math.isfinite(t) and t > 0):
                continue
            key = r.dtype if r.dtype in flops else "float32"
            rate = r.flops / t
            if rate > flops.get(key, 0.0):  # both roofs must be at or above every measured point
                flops[key], raised = rate, True
            if rate > bw * ai:
                bw, raised = rate / ai, True
    return bw, flops, raised


def _colors(n: int, cmap: str, start: float = 0.0) -> list[Any]:
    from matplotlib import colormaps

    cm = colormaps[cmap]
    return [cm(start + (0.95 - start) * i / max(n - 1, 1)) for i in range(n)]


# -- the performance page: ratios to the peers ----------------------------------------------------
# ``python -m opruntime.tools.plot`` draws, from ``opruntime bench --json`` files, one chart per
# operator: for each case, a bar per peer of peer time / opruntime's time (above 1: opruntime is
# faster), one panel per device. ``--page`` redraws every chart of docs/performance.md and its
# summary table from a manifest (docs/data/current.json).

#: a peer's colour, the same on every chart (unknown peers take the fallbacks in turn)
PEER_COLORS = {"torch": "#dd8452", "jax": "#55a868", "triton": "#c44e52", "cupy": "#8172b3",
               "onnx": "#937860", "numpy": "#8c8c8c", "copy": "#b0b0b0"}
_FALLBACK_COLORS = ("#da8bc3", "#ccb974", "#64b5cd", "#4c72b0")
#: how a peer is named on the charts and in the table
PEER_NAMES = {"torch": "PyTorch", "jax": "JAX (XLA)", "triton": "Triton", "cupy": "CuPy", "onnx": "ONNX Runtime",
              "numpy": "NumPy", "copy": "a copy of the bytes"}
_SHORT_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64"}
_SHAPE = re.compile(r"^\d+(x\d+)*$")
#: the charts' width: 7.5 in = 540 pt = 720 CSS px, the width of mkdocs-material's text column
CHART_WIDTH_IN = 7.5
BEGIN, END = "<!-- BEGIN figures: generated by `python -m opruntime.tools.plot --page {manifest}` -->", \
    "<!-- END figures -->"


@dataclass(frozen=True)
class Source:
    """One ``opruntime bench --json`` file: when, where and how it was measured, and its results."""

    path: Path
    date: str
    command: str
    devices: dict[str, str]  # device name -> its description ("NVIDIA H100 80GB HBM3")
    results: tuple[Result, ...]
    #: each result's own command where the file gives one (one process per case), else ""
    commands: tuple[str, ...] = ()

    def device_label(self, device: str) -> str:
        """``"NVIDIA H100 80GB HBM3 (cuda:0)"``; the bare name when the file does not describe it."""
        desc = self.devices.get(device, "")
        return f"{desc} ({device})" if desc and desc != device else device


def load_source(path: str | Path) -> Source:
    """Read a bench JSON file; :class:`~opruntime.errors.ConfigError` names the file and the field
    when it is not one (no ``results``, a result without ``op`` or ``time_s``, no ``date``)."""
    from .bench import Result

    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read the bench figures {path}: {e}") from e
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise ConfigError(f"{path} is not an `opruntime bench --json` file: it has no \"results\" list")
    names = {f.name for f in fields(Result)}
    results, commands = [], []
    for i, raw in enumerate(data["results"]):
        missing = [k for k in ("op", "problem", "dtype", "device", "time_s") if k not in raw]
        if missing:
            raise ConfigError(f"{path}: results[{i}] lacks {', '.join(missing)}")
        r = Result(**{k: v for k, v in raw.items() if k in names})
        if not r.peer_ratios and raw.get("ratios"):  # files written before peer_ratios: the ratios column
            r.peer_ratios = dict(raw["ratios"])
        results.append(r)
        commands.append(str(raw.get("command", "")))
    if "date" not in data:
        raise ConfigError(f"{path} has no \"date\": add when it was measured (bench --json writes it)")
    devices = {name: str(d.get("description", "")) for name, d in (data.get("devices") or {}).items()}
    return Source(path, str(data["date"]), str(data.get("command", "")), devices, tuple(results), tuple(commands))


def case_label(r: Result, with_op: bool = False) -> tuple[str, str]:
    """A case in two parts: its operand shapes (three or more equal ones folded), then the dtype and
    attributes: ``("32x64x56x56, 64x64x3x3", "fp32 stride=1,padding=1")``; ``with_op`` puts the
    operator first (it always comes first when the problem has no shapes, as a model's); a case
    timed as device-graph replays (``bench --graphs``) ends in ``(graphs)``."""
    tokens = r.problem.split()
    shapes = [t for t in tokens if _SHAPE.match(t)]
    attrs = [t for t in tokens if not (_SHAPE.match(t) or t == "x")]  # name=value, and flags ("captured")
    head = f"{len(shapes)} × {shapes[0]}" if len(shapes) >= 3 and len(set(shapes)) == 1 else ", ".join(shapes)
    if with_op or not head:
        head = f"{r.op} {head}".strip()
    return head, " ".join([_SHORT_DTYPES.get(r.dtype, r.dtype), *attrs, *(["(graphs)"] if r.graphs else [])])


def _ratios(r: Result) -> dict[str, float]:
    return {p: v for p, v in r.ratios().items() if math.isfinite(v) and v > 0}


def ratio_chart(panels: Sequence[tuple[str, Sequence[Result]]], path: str | Path, title: str) -> None:
    """Draw ``panels`` (a device's label and its results) as horizontal bars of peer time /
    opruntime's time, a line at 1.0, one panel per device, to ``path`` (svg, png or pdf)."""
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, NullLocator

    panels = [(label, [r for r in rs if _ratios(r)]) for label, rs in panels]
    panels = [(label, rs) for label, rs in panels if rs]
    if not panels:
        raise ConfigError(f"nothing to draw for {title!r}: no result with a finite peer ratio")
    seen = dict.fromkeys(p for _, rs in panels for r in rs for p in _ratios(r))
    peers = sorted(seen, key=lambda p: (list(PEER_COLORS).index(p) if p in PEER_COLORS else len(PEER_COLORS)))
    fallback = itertools.cycle(_FALLBACK_COLORS)
    colors = {p: PEER_COLORS.get(p) or next(fallback) for p in peers}
    values = [v for _, rs in panels for r in rs for v in _ratios(r).values()]
    lo, hi = min(min(values) / 1.3, 0.5), max(max(values) * 1.45, 2.0)
    ticks = [2.0**k for k in range(math.floor(math.log2(lo)), math.ceil(math.log2(hi)) + 1)]
    # each panel's own peers (a device without a peer keeps no empty slot for it)
    own = [[p for p in peers if any(p in _ratios(r) for r in rs)] for _, rs in panels]
    rows = [len(rs) * max(0.36, len(ps) * 0.15 + 0.14) + 0.4 for (_, rs), ps in zip(panels, own)]  # inches
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "opruntime", "font.size": 9,
                                "font.family": "sans-serif"}):
        fig = Figure(figsize=(CHART_WIDTH_IN, sum(rows) + 0.9), layout="constrained")
        axes = fig.subplots(len(panels), 1, squeeze=False, height_ratios=rows)[:, 0]
        for ax, (label, rs), ps in zip(axes, panels, own):
            several = len({r.op for r in rs}) > 1
            height = 0.8 / len(ps)
            for i, r in enumerate(rs):
                for j, p in enumerate(ps):
                    v = _ratios(r).get(p)
                    if v is None:
                        continue
                    y = i + (j - (len(ps) - 1) / 2) * height
                    ax.barh(y, v, height * 0.9, color=colors[p], label=PEER_NAMES.get(p, p))
                    ax.text(v * 1.03, y, f"{v:.2f}", va="center", ha="left", fontsize=7.5, color="#222222",
                            bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.6, "alpha": 0.8})
            ax.axvline(1.0, color="black", lw=1.2, zorder=3)
            ax.set_xscale("log")
            ax.set_xlim(lo, hi)
            ax.xaxis.set_major_locator(FixedLocator(ticks))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticklabels([f"{t:g}×" for t in ticks])
            ax.set_yticks(range(len(rs)), ["\n".join(case_label(r, several)) for r in rs], fontsize=8)
            ax.set_ylim(len(rs) - 0.5, -0.5)  # the first case on top
            ax.grid(axis="x", alpha=0.3)
            ax.set_title(label, fontsize=9, loc="left")
        fig.supxlabel("peer time / opruntime time, log scale:  ← the peer is faster  |  opruntime is faster →", fontsize=9)
        handles = {lab: h for ax in axes for h, lab in zip(*ax.get_legend_handles_labels())}
        # the title heads the legend (a suptitle and an outside legend overlap in constrained layout)
        fig.legend(handles.values(), handles.keys(), loc="outside upper center", ncols=min(len(handles), 6),
                   frameon=False, fontsize=8, title=title, title_fontproperties={"weight": "bold", "size": 11})
        fig.savefig(path, metadata={"Date": None} if str(path).endswith(".svg") else None)


# -- the page: a manifest of charts and the summary table -----------------------------------------
@dataclass(frozen=True)
class Chart:
    """One chart of the page: its operators, the files they come from and its headline cases."""

    name: str
    title: str
    ops: tuple[str, ...]
    sources: tuple[Source, ...]
    headline: tuple[dict[str, str], ...]

    def panels(self) -> list[tuple[str, list[Result]]]:
        """(device label, its results of these operators) per device, in the sources' order."""
        out: dict[str, list[Result]] = {}
        for src in self.sources:
            for r in src.results:
                if r.op in self.ops and not r.error:
                    out.setdefault(src.device_label(r.device), []).append(r)
        return list(out.items())

    def find(self, want: dict[str, str]) -> tuple[Source, Result]:
        """The one result that ``want`` (device, op, problem, dtype) names; ConfigError otherwise."""
        hits = [(s, r) for s in self.sources for r in s.results
                if all(str(getattr(r, k)) == v for k, v in want.items())]
        if len(hits) != 1:
            raise ConfigError(f"chart {self.name!r}: the headline {want} matches {len(hits)} results of "
                              f"{', '.join(s.path.name for s in self.sources)}; it must name exactly one")
        return hits[0]


@dataclass(frozen=True)
class Page:
    """docs/data/current.json: the page to fill, where its charts go, and the charts."""

    manifest: Path
    page: Path
    img: Path
    charts: tuple[Chart, ...]
    #: a device's description -> the short name the table gives it ("NVIDIA H100 80GB HBM3" -> "H100")
    machines: dict[str, str] = field(default_factory=dict)

    def svg(self, chart: Chart) -> Path:
        return self.img / f"perf-{chart.name}.svg"

    def device_name(self, src: Source, device: str) -> str:
        """The table's name of ``device`` as ``src`` describes it: the manifest's short name ("H100")."""
        desc = src.devices.get(device, "")
        return self.machines.get(desc) or src.device_label(device)


def load_page(manifest: str | Path) -> Page:
    """Read the manifest (paths in it are relative to it); ConfigError names what is wrong."""
    manifest = Path(manifest)
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read the figures manifest {manifest}: {e}") from e
    base, loaded, charts = manifest.parent, {}, []
    for i, c in enumerate(data.get("plots", [])):
        missing = [k for k in ("name", "ops", "sources") if k not in c]
        if missing:
            raise ConfigError(f"{manifest}: plots[{i}] lacks {', '.join(missing)}")
        srcs = tuple(loaded.setdefault(s, load_source(base / s)) for s in c["sources"])
        charts.append(Chart(c["name"], c.get("title", c["name"]), tuple(c["ops"]), srcs, tuple(c.get("headline", []))))
    for key in ("page", "img"):
        if key not in data:
            raise ConfigError(f"{manifest} lacks {key!r}: the page to fill and the folder of its charts")
    return Page(manifest, (base / data["page"]).resolve(), (base / data["img"]).resolve(), tuple(charts),
                dict(data.get("machines", {})))


def _time(s: float) -> str:
    return f"{s * 1e6:.1f} µs" if s < 1e-3 else f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def summary_table(page: Page) -> str:
    """The short table: per chart, its headline cases with opruntime's time and the fastest peer."""
    lines = ["| operator | device | problem | opruntime | fastest peer | ratio |", "|---|---|---|---|---|---|"]
    for chart in page.charts:
        for want in chart.headline:
            src, r = chart.find(want)
            ratios = {p: v for p, v in _ratios(r).items() if p != "copy"}  # the copy is a yardstick, no peer
            if not ratios:
                raise ConfigError(f"chart {chart.name!r}: the headline {want} has no peer ratio")
            peer = min(ratios, key=ratios.__getitem__)  # the fastest peer: the smallest time ratio
            problem = ", ".join(case_label(r))
            op = r.op.replace("_", "_<wbr>")  # a long name may wrap in a narrow column
            lines.append(f"| {op} | {page.device_name(src, r.device)} | {problem} | {_time(r.time_s)} | "
                         f"{PEER_NAMES.get(peer, peer)} | {ratios[peer]:.2f}× |")
    return "\n".join(lines)


def page_section(page: Page) -> str:
    """The generated part of the page: the summary table, then each chart with the files, dates
    and commands it is drawn from."""
    rel = Path(os.path.relpath(page.manifest, page.page.parent.parent))
    out = [BEGIN.format(manifest=rel.as_posix()), "", "## At a glance", "",
           "The headline case of each operator and device; the charts below show every case. A ratio is the "
           "peer's time over opruntime's: above 1, opruntime is faster.", "", summary_table(page), ""]
    for chart in page.charts:
        img = os.path.relpath(page.svg(chart), page.page.parent)
        out += [f"## {chart.title}", "", f"![{chart.title}: peer time / opruntime time per case]({img})", ""]
        used = {s.path for s in chart.sources if any(r.op in chart.ops for r in s.results)}
        for src in chart.sources:
            if src.path not in used:
                continue
            mine = [(r, c) for r, c in zip(src.results, src.commands or [""] * len(src.results)) if r.op in chart.ops]
            devs = ", ".join(dict.fromkeys(src.device_label(r.device) for r, _ in mine))
            own = list(dict.fromkeys(c for _, c in mine if c))
            if own:  # one process per case: each case's own command
                out.append(f"- `docs/data/{src.path.name}` ({devs}, {src.date}), one command per case:")
                out += [f"    - `{c}`" for c in own]
            else:
                out.append(f"- `docs/data/{src.path.name}` ({devs}, {src.date}): `{src.command}`")
        out.append("")
    return "\n".join([*out, END])


def render_page(page: Page) -> dict[Path, str]:
    """Draw every chart (in place) and return the page's new text (not written)."""
    page.img.mkdir(parents=True, exist_ok=True)
    for chart in page.charts:
        ratio_chart(chart.panels(), page.svg(chart), chart.title)
    text = page.page.read_text()
    head, sep, rest = text.partition(BEGIN.split("`")[0])
    _, sep2, tail = rest.partition(END)
    if not (sep and sep2):
        raise ConfigError(f"{page.page} has no generated section: put the lines {BEGIN.split('`')[0]!r}... and "
                          f"{END!r} where the charts go")
    return {page.page: head + page_section(page) + tail}


def main(argv: Sequence[str] | None = None, raise_errors: bool = False) -> int:
    """``python -m opruntime.tools.plot DATA.json [...] -o OUT.svg [--op OP ...]`` draws one chart;
    ``python -m opruntime.tools.plot --page docs/data/current.json`` redraws the performance page.
    ``raise_errors``: a ConfigError propagates (``opruntime plot`` reports it) instead of status 2."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m opruntime.tools.plot", description=main.__doc__)
    ap.add_argument("data", nargs="*", help="opruntime bench --json files")
    ap.add_argument("-o", "--out", help="the chart to write (.svg, .png or .pdf)")
    ap.add_argument("--op", action="append", default=[], help="draw only this operator (repeatable; default: all)")
    ap.add_argument("--title", help="the chart's title (default: the operators)")
    ap.add_argument("--page", metavar="MANIFEST", help="redraw every chart of the page that MANIFEST describes, and "
                    "its summary table (docs/data/current.json)")
    args = ap.parse_args(argv)
    try:
        require_matplotlib()
        if args.page:
            for path, text in render_page(load_page(args.page)).items():
                path.write_text(text)
                print(f"wrote {path}", file=sys.stderr)
            return 0
        if not args.data or not args.out:
            ap.error("give bench JSON files and -o OUT.svg, or --page MANIFEST")
        sources = [load_source(p) for p in args.data]
        ops = tuple(args.op) or tuple(dict.fromkeys(r.op for s in sources for r in s.results))
        chart = Chart(Path(args.out).stem, args.title or ", ".join(ops), ops, tuple(sources), ())
        ratio_chart(chart.panels(), args.out, chart.title)
        print(f"wrote {args.out}", file=sys.stderr)
        return 0
    except ConfigError as e:
        if raise_errors:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
