"""Near-tied candidates: are their gaps noise, the input buffers, or the process?

    python3 scripts/tie_study.py [--repeats 40]

For a few problems whose tuned choice missed the fastest candidate by 2-3% in a later bench, time
the kept candidates (as the tuner keeps them) in interleaved rounds under three conditions: one
input set, the same input set again in fresh buffers, and rotated input sets (as the tuner does);
then run the tuner itself three times. Prints each candidate's median and its median per-round
ratio to the first candidate.
"""

from __future__ import annotations

import argparse
import statistics
import time

from opruntime import bench, selector, tuning
from opruntime.config import settings
from opruntime.ops import OPS
from opruntime.plugins import registry

CASES = [
    ("conv2d", ((32, 256, 56, 56), (64, 256, 1, 1)), "float16", {"stride": 1, "padding": 0}),
    ("softmax", ((16,),), "float32", {}),
    ("softmax", ((65536, 128),), "float32", {}),
]


def show(title, samples):
    """Each candidate's median and its median per-round ratio to the first, with the quartiles."""
    names = list(samples)
    ref = samples[names[0]]
    print(f"  {title}")
    for n in sorted(names, key=lambda n: statistics.median(samples[n])):
        ratios = sorted(a / b for a, b in zip(samples[n], ref))
        q = len(ratios) // 4
        print(f"    {n:<60} {statistics.median(samples[n]) * 1e6:9.2f} us  vs first "
              f"{bench.paired_ratio(samples[n], ref):.3f} [{ratios[q]:.3f}, {ratios[-q - 1]:.3f}]")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--device", default="cuda:0")
    args = ap.parse_args()
    dev = registry().device(args.device)
    prov = dev.provider
    s = settings()
    for op, shapes, dtype, attrs in CASES:
        problem = OPS[op].problem_for(dev.name, shapes, dtype, **attrs)
        print(f"== {problem}")
        usable, _, _ = selector.rank(problem, dev, s)
        ranked = sorted(usable, key=lambda c: c.cost)
        keep = ranked[:s.tune_top_k] + [c for c in ranked[s.tune_top_k:] if c.kernel.vendor]
        for label, sets in [("one input set", tuning.random_inputs(problem, dev, 1, seed=0)),
                            ("same values, fresh buffers", tuning.random_inputs(problem, dev, 1, seed=0)),
                            ("rotated input sets", tuning.random_inputs(problem, dev, max(2, tuning.input_sets(problem)), seed=0))]:
            calls = {c.label: (tuning._caller(problem, c, sets), prov.synchronize) for c in keep}
            show(label, bench.measure_rounds(calls, args.repeats, idle=prov.synchronize)[0])
        for i in range(3):
            fresh = [selector.Candidate(c.kernel, dict(c.config), c.cost) for c in keep]
            t0 = time.perf_counter()
            order = tuning.autotune(problem, dev, fresh, budget_s=s.tune_budget, top_k=s.tune_top_k)
            print(f"  tuner run {i}: {time.perf_counter() - t0:.2f} s: "
                  + ", ".join(f"{c.label} {c.measured * 1e6:.2f}" for c in order[:3] if c.measured))


if __name__ == "__main__":
    main()
