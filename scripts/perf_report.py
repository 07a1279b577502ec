#!/usr/bin/env python3
"""Turn `opruntime bench --json` files into the Markdown tables of docs/performance.md.

    python scripts/perf_report.py out/bench.json [more.json ...] > section.md
"""

from __future__ import annotations

import json
import math
import sys


def fmt_t(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "-"
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.3f} ms"


def report(path: str) -> str:
    data = json.load(open(path))
    out = [f"### {path}: {data['date']}", ""]
    for name, dev in data.get("devices", {}).items():
        out.append(f"- device `{name}`: {dev.get('description', '')}")
    out.append("- versions: " + ", ".join(f"{k} {v}" for k, v in data.get("versions", {}).items()))
    out.append("")
    peers = sorted({p for r in data["results"] for p in r.get("peers", {})})
    out.append("| op | problem | dtype | device | kernel | time | rate | " + " | ".join(f"vs {p}" for p in peers) + " |")
    out.append("|" + "---|" * (7 + len(peers)))
    for r in data["results"]:
        if r.get("error"):
            out.append(f"| {r['op']} | {r['problem']} | {r['dtype']} | {r['device']} | error: {r['error'][:80]} |")
            continue
        ratios = r.get("ratios", {})
        cells = [r["op"], r["problem"], r["dtype"], r["device"], f"`{r['kernel']}`", fmt_t(r["time_s"]),
                 f"{r['rate']:,.1f} {r['unit']}"] + [f"{ratios[p]:.2f}x" if p in ratios else "-" for p in peers]
        out.append("| " + " | ".join(cells) + " |")
        vs = r.get("vs_chosen", {})  # candidate / chosen, per-round paired (older files: none)
        for k, t in sorted(r.get("candidates", {}).items(), key=lambda kv: vs.get(kv[0], kv[1] or math.inf)):
            share = f"{vs[k]:.3f}x the chosen" if k in vs else f"{r['time_s'] / t:.2f}x of chosen" if t else "-"
            out.append(f"|  |  |  |  | ↳ `{k}` | {fmt_t(t)} | {share} |" + " |" * len(peers))
    gaps = [r for r in data["results"] if r.get("selection_gap") is not None and math.isfinite(r["selection_gap"])]
    if gaps:
        worst = max(gaps, key=lambda r: r["selection_gap"])
        within = sum(r["selection_gap"] <= 0.02 for r in gaps)
        out += ["", f"Selection: the chosen kernel within 2% of the fastest candidate in {within} of {len(gaps)} cases "
                    f"(worst {worst['selection_gap']:.1%}: {worst['op']} {worst['problem']} {worst['dtype']})."]
    out.append("")
    out.append("Ratios are the peer's time over opruntime's (above 1: opruntime is faster).")
    return "\n".join(out)


if __name__ == "__main__":
    print("\n\n".join(report(p) for p in sys.argv[1:]))
