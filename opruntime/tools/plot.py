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
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from opruntime.devices import Device
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
