"""Time the JAX backend against bare jitted JAX in one process: the issue-5 targets.

    python scripts/jax_bench.py                 # on the best jax device (jax:gpu:0 on the GPU machine)
    python scripts/jax_bench.py --small         # CPU-sized problems, for a dry run here
    python scripts/jax_bench.py --json out.json

Every figure is the median over interleaved rounds (A B C A B C ...) of back-to-back calls
followed by one ``block_until_ready``, so slow drift hits every variant alike. Ratios are
``ours / bare`` (time): 1.00 means no overhead.

1. XLA path vs the same jitted ``jnp`` function called directly: matmul 4096^3 fp32
   (HIGHEST), softmax 8192x8192 fp32; through ``opr.matmul`` (frontend + plan + kernel) and
   through ``kernel.run`` alone.
2. Per-call overhead on tiny inputs (softmax of 16 values, 4x4 matmul).
3. Pallas vs XLA: softmax / log_softmax over several shapes, matmul 4096^3 in fp32 / fp16 /
   bf16, every config of each Pallas kernel, with each output checked against XLA's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def block(x: Any) -> None:
    import jax

    jax.block_until_ready(getattr(x, "data", x))


def per_call(fn: Callable[[], Any], target_s: float = 0.02) -> int:
    """How many back-to-back calls make one timed batch of about ``target_s``."""
    for _ in range(2):
        block(fn())
    t0 = time.perf_counter()
    block(fn())
    one = time.perf_counter() - t0
    return max(1, min(5000, int(target_s / max(one, 1e-7))))


def interleaved(variants: dict[str, Callable[[], Any]], rounds: int = 15, target_s: float = 0.02) -> dict[str, float]:
    """Median seconds per call of each variant, timed in interleaved rounds."""
    n = {k: per_call(f, target_s) for k, f in variants.items()}
    samples: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for k, f in variants.items():
            t0 = time.perf_counter()
            for _ in range(n[k] - 1):
                f()
            block(f())
            samples[k].append((time.perf_counter() - t0) / n[k])
    return {k: statistics.median(v) for k, v in samples.items()}


def rel(a: Any, b: Any) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", help="opruntime jax device (default: the best jax device)")
    ap.add_argument("--small", action="store_true", help="small sizes (CPU dry run)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    import jax
    import jax.numpy as jnp
    from jax import lax

    import opruntime as opr
    from opruntime.config import settings
    from opruntime.ops import OPS
    from opruntime.plugins import registry

    reg = registry()
    devs = [d for d in reg.devices if d.kind == "jax"]
    dev = reg.device(args.device) if args.device else devs[0]
    prov = dev.provider
    print(f"device {dev.name} ({dev.provider.description}), jax {jax.__version__}", flush=True)
    rng = np.random.default_rng(0)
    results: dict[str, Any] = {"device": dev.name, "description": dev.provider.description, "jax": jax.__version__}
    mm_n, sm_shape = (512, (1024, 1024)) if args.small else (4096, (8192, 8192))

    def put(shape: tuple[int, ...], dtype: str = "float32") -> Any:
        x = prov.from_host(rng.standard_normal(shape).astype(np.float32))
        return prov.astype(x, np.dtype(dtype)) if dtype != "float32" else x

    def plan_of(op: str, datas: list[Any], **attrs: Any) -> Any:
        return OPS[op].plan(datas, dev, attrs, settings())

    def direct(plan: Any, label: str | None = None) -> tuple[Callable[[], Any], Any]:
        """kernel.run for the plan's chosen candidate, or the candidate called ``label``."""
        c = next(c for c in plan.order if label is None or c.kernel.name == label)
        return c, plan.problem

    rows: list[tuple[str, str]] = []

    # 1. the XLA path vs the same jitted function -----------------------------------------------
    a, b = put((mm_n, mm_n)), put((mm_n, mm_n))
    ta, tb = opr.Tensor._wrap(a, dev), opr.Tensor._wrap(b, dev)
    bare_mm = jax.jit(lambda a, b: jnp.matmul(a, b, precision=lax.Precision.HIGHEST))
    pl_mm = plan_of("matmul", [a, b])
    c_mm, p_mm = direct(pl_mm)
    t = interleaved({"bare": lambda: bare_mm(a, b), "opruntime": lambda: opr.matmul(ta, tb),
                     "kernel.run": lambda: c_mm.kernel.run(p_mm, c_mm.config, a, b)}, args.rounds)
    results["matmul_xla"] = t | {"kernel": c_mm.label, "n": mm_n}
    rows.append((f"matmul {mm_n}^3 fp32 {c_mm.label}: bare {t['bare'] * 1e3:.3f} ms "
                 f"({2 * mm_n**3 / t['bare'] / 1e12:.1f} TFLOP/s)",
                 f"opruntime/bare {t['opruntime'] / t['bare']:.3f}x, kernel.run/bare {t['kernel.run'] / t['bare']:.3f}x"))
    print(*rows[-1], flush=True)

    x = put(sm_shape)
    tx = opr.Tensor._wrap(x, dev)
    bare_sm = jax.jit(lambda x: jax.nn.softmax(x, axis=-1))
    pl_sm = plan_of("softmax", [x], axis=-1)
    c_sm, p_sm = direct(pl_sm)
    t = interleaved({"bare": lambda: bare_sm(x), "opruntime": lambda: opr.softmax(tx),
                     "kernel.run": lambda: c_sm.kernel.run(p_sm, c_sm.config, x)}, args.rounds)
    gbs = 2 * x.size * 4 / 1e9
    results["softmax_xla"] = t | {"kernel": c_sm.label, "shape": sm_shape}
    rows.append((f"softmax {sm_shape} fp32 {c_sm.label}: bare {t['bare'] * 1e3:.3f} ms ({gbs / t['bare']:.0f} GB/s)",
                 f"opruntime/bare {t['opruntime'] / t['bare']:.3f}x, kernel.run/bare {t['kernel.run'] / t['bare']:.3f}x"))
    print(*rows[-1], flush=True)

    # 2. per-call overhead on tiny inputs ----------------------------------------------------------
    s16 = put((16,))
    ts16 = opr.Tensor._wrap(s16, dev)
    bare_s16 = jax.jit(lambda x: jax.nn.softmax(x, axis=-1))
    c_s16, p_s16 = direct(plan_of("softmax", [s16], axis=-1))
    m4a, m4b = put((4, 4)), put((4, 4))
    tm4a, tm4b = opr.Tensor._wrap(m4a, dev), opr.Tensor._wrap(m4b, dev)
    bare_m4 = jax.jit(lambda a, b: jnp.matmul(a, b, precision=lax.Precision.HIGHEST))
    c_m4, p_m4 = direct(plan_of("matmul", [m4a, m4b]))
    t = interleaved({"softmax16 bare": lambda: bare_s16(s16), "softmax16 opruntime": lambda: opr.softmax(ts16),
                     "softmax16 kernel.run": lambda: c_s16.kernel.run(p_s16, c_s16.config, s16),
                     "matmul4 bare": lambda: bare_m4(m4a, m4b), "matmul4 opruntime": lambda: opr.matmul(tm4a, tm4b),
                     "matmul4 kernel.run": lambda: c_m4.kernel.run(p_m4, c_m4.config, m4a, m4b)},
                    args.rounds * 2, target_s=0.01)
    results["tiny"] = t
    for op in ("softmax16", "matmul4"):
        bare = t[f"{op} bare"]
        rows.append((f"tiny {op}: bare {bare * 1e6:.2f} us/call",
                     f"opruntime/bare {t[f'{op} opruntime'] / bare:.3f}x ({(t[f'{op} opruntime'] - bare) * 1e6:+.2f} us), "
                     f"kernel.run/bare {t[f'{op} kernel.run'] / bare:.3f}x ({(t[f'{op} kernel.run'] - bare) * 1e6:+.2f} us)"))
        print(*rows[-1], flush=True)

    # 3. Pallas vs XLA -------------------------------------------------------------------------------
    shapes = [(256, 256), (1024, 1000)] if args.small else [(4096, 4096), (8192, 8192), (32768, 1024), (1024, 32768),
                                                            (65536, 128)]
    results["softmax_pallas"] = []
    for op in ("softmax", "log_softmax"):
        for shape in shapes if op == "softmax" else shapes[1:2]:
            x = put(shape)
            plan = plan_of(op, [x], axis=-1)
            xla = next(c for c in plan.rows if c.kernel.name == f"jax.{op}.xla")
            pal = reg.kernels[f"jax.{op}.pallas_rows"]
            variants = {"xla": lambda xla=xla, plan=plan, x=x: xla.kernel.run(plan.problem, xla.config, x)}
            ref = variants["xla"]()
            for cfg in pal.candidates(plan.problem) if pal.supports(plan.problem) else []:
                label = ",".join(f"{k}={v}" for k, v in cfg.items())
                try:
                    out = pal.run(plan.problem, cfg, x)
                    err = rel(out, ref)
                except Exception as exc:  # report and go on
                    print(f"  pallas {op} {shape} [{label}] failed: {type(exc).__name__}: {str(exc)[:300]}")
                    continue
                variants[f"pallas[{label}]"] = lambda cfg=cfg, pal=pal, plan=plan, x=x: pal.run(plan.problem, cfg, x)
                print(f"  pallas {op} {shape} [{label}] rel err vs xla {err:.2e}", flush=True)
            t = interleaved(variants, max(5, args.rounds // 2))
            gb = 2 * x.size * 4 / 1e9
            best = min((k for k in t if k != "xla"), key=t.get, default=None)
            results["softmax_pallas"].append({"op": op, "shape": shape, "times": t})
            rows.append((f"{op} {shape} fp32: xla {gb / t['xla']:.0f} GB/s",
                         " ".join(f"{k} {gb / v:.0f} GB/s ({t['xla'] / v:.2f}x xla)" for k, v in t.items() if k != "xla")
                         + (f"  best {best}" if best else "")))
            print(*rows[-1], flush=True)

    results["matmul_pallas"] = []
    for dtype in ("float32", "float16", "bfloat16"):
        a, b = put((mm_n, mm_n), dtype), put((mm_n, mm_n), dtype)
        plan = plan_of("matmul", [a, b])
        xla = next(c for c in plan.rows if c.kernel.name == "jax.matmul.xla")
        pal = reg.kernels["jax.matmul.pallas_blocked"]
        variants = {"xla": lambda xla=xla, plan=plan, a=a, b=b: xla.kernel.run(plan.problem, xla.config, a, b)}
        ref = variants["xla"]()
        for cfg in pal.candidates(plan.problem):
            label = ",".join(f"{k}={v}" for k, v in cfg.items())
            try:
                err = rel(pal.run(plan.problem, cfg, a, b), ref)
            except Exception as exc:
                print(f"  pallas matmul {dtype} [{label}] failed: {type(exc).__name__}: {str(exc)[:300]}")
                continue
            variants[f"pallas[{label}]"] = lambda cfg=cfg, pal=pal, plan=plan, a=a, b=b: pal.run(plan.problem, cfg, a, b)
            print(f"  pallas matmul {dtype} [{label}] rel err vs xla {err:.2e}", flush=True)
        t = interleaved(variants, max(5, args.rounds // 3))
        tf = 2 * mm_n**3 / 1e12
        results["matmul_pallas"].append({"dtype": dtype, "n": mm_n, "times": t})
        rows.append((f"matmul {mm_n}^3 {dtype}: xla {tf / t['xla']:.1f} TFLOP/s",
                     " ".join(f"{k} {tf / v:.1f} TFLOP/s ({t['xla'] / v:.2f}x xla)" for k, v in t.items() if k != "xla")))
        print(*rows[-1], flush=True)

    print("\n== summary (" + dev.name + ", " + dev.provider.description + ") ==")
    for left, right in rows:
        print(f"{left}\n    {right}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
