#!/usr/bin/env python3
"""Build, check and time the CUDA backend's matmul kernels against cuBLAS in one go (GPU machine).

    scripts/gpu.sh python3 scripts/cuda_matmul.py [--sizes 1024,2048,4096] [--out DIR]

1. builds every compiled variant in parallel (NVRTC; fills the on-disk cubin cache, so the
   tests afterwards skip compilation),
2. checks each kernel x config at the timed sizes against a float64 reference,
3. times cuBLAS (cupy.matmul), torch (bf16 peer), every own kernel x config with CUDA events
   (warm-up, then the median of per-launch events), and the selector's heuristic pick,
4. prints a table (TFLOP/s and ratio to cuBLAS) and writes it to DIR/matmul.txt.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "backends")]


def event_median(prov, fn) -> float:
    """Median seconds per run from CUDA events (opruntime's CUDA provider)."""
    return float(np.median(prov.time(fn, repeats=20, warmup=3)))


def prebuild(mm, compile, arch: str) -> tuple[int, float, list[str]]:
    """Every layout / vector / dtype variant of every config, compiled in worker processes."""
    jobs = []
    for cfg in mm.SIMT_CONFIGS:
        base = {k: v for k, v in cfg.items() if k not in mm._NOT_DEFINES}
        for ak, bn, va, vb in itertools.product((0, 1), repeat=4):
            jobs.append(("matmul_sgemm.cu", {**base, "A_KCONTIG": bool(ak), "B_NCONTIG": bool(bn),
                                             "VEC_A": bool(va), "VEC_B": bool(vb)}))
    for cfg in mm.MMA_CONFIGS:
        base = {k: v for k, v in cfg.items() if k not in mm._NOT_DEFINES}
        for ak, bn, va, vb, bf in itertools.product((0, 1), repeat=5):
            jobs.append(("matmul_hgemm.cu", {**base, "A_KCONTIG": bool(ak), "B_NCONTIG": bool(bn),
                                             "VEC_A": bool(va), "VEC_B": bool(vb), "BF16": bool(bf)}))
    wg = []
    for cfg in mm.WGMMA_CONFIGS:
        base = {k: v for k, v in cfg.items() if k not in mm._NOT_DEFINES}
        for bn, bf, (lbo, tb) in itertools.product((0, 1), (0, 1), DESCS):
            wg.append(("matmul_wgmma.cu", {**base, "B_NCONTIG": bool(bn), "BF16": bool(bf), "B_LBO_MN": lbo,
                                           "TNSP_B": tb}))
    t0 = time.perf_counter()
    errors = compile.prebuild(jobs, arch)
    if arch == "90":
        errors += compile.prebuild(wg, "90a")
    return len(jobs) + len(wg) - len(errors), time.perf_counter() - t0, errors


# (B_LBO_MN, TNSP_B) candidates for an n-contiguous B, tried in order until one is right. On an
# H200 (run 4) (1, 1) was right; (0, 1) gave wrong results and (1, 0) an illegal address, which
# ends the CUDA context: so the probe stops at the first right one.
DESCS = ((1, 1), (0, 1))


def probe_wgmma(cp, mm, problem_of, say) -> bool:
    """Find which descriptor convention for an n-contiguous B gives right results; False: none."""
    rng = np.random.default_rng(7)
    k = next(x for x in mm.kernels() if x.name == "cupy.matmul.wgmma")
    shapes = [(128, 64, 256), (200, 136, 264), (64, 512, 128)]
    found = None
    for lbo, tb in DESCS:
        mm.WGMMA_B_DESC.update(B_LBO_MN=lbo, TNSP_B=tb)
        mm._plans.clear()
        errs = []
        for m, kk, n in shapes:
            for bt in (False, True):
                a = rng.standard_normal((m, kk)).astype(np.float16)
                b = rng.standard_normal((n, kk) if bt else (kk, n)).astype(np.float16)
                b = b.T if bt else b
                ref = a.astype(np.float64) @ b.astype(np.float64)
                da, db = cp.asarray(a), (cp.asarray(np.ascontiguousarray(b.T)).T if bt else cp.asarray(b))
                p = problem_of(da, db)
                try:
                    out = cp.asnumpy(k.run(p, mm.WGMMA_CONFIGS[0], da, db)).astype(np.float64)
                    errs.append(float(np.linalg.norm(out - ref) / np.linalg.norm(ref)))
                except Exception as exc:
                    errs.append(float("inf"))
                    say(f"# wgmma probe {lbo, tb} {m}x{kk}x{n} bT={bt}: {type(exc).__name__}: {str(exc)[:300]}")
        say(f"# wgmma probe B_LBO_MN={lbo} TNSP_B={tb}: rel errs " + " ".join(f"{e:.1e}" for e in errs))
        if all(e < 2e-3 for e in errs):
            found = (lbo, tb)
            break
    if found is None:
        return False
    mm.WGMMA_B_DESC.update(B_LBO_MN=found[0], TNSP_B=found[1])
    mm._plans.clear()
    say(f"# wgmma: B descriptor convention B_LBO_MN={found[0]} TNSP_B={found[1]}")
    return True


def sustained(cp, fn, n=10, repeats=7) -> float:
    """Back-to-back launches (as the benchmark times them): median of event pairs around n calls."""
    fn()
    cp.cuda.Device().synchronize()
    ts = []
    for _ in range(repeats):
        s, e = cp.cuda.Event(), cp.cuda.Event()
        s.record()
        for _ in range(n):
            fn()
        e.record()
        e.synchronize()
        ts.append(cp.cuda.get_elapsed_time(s, e) * 1e-3 / n)
    return float(np.median(ts))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1024,2048,4096")
    ap.add_argument("--half-sizes", default="2048,4096")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sustained", action="store_true", help="also time back-to-back launches (as bench does)")
    args = ap.parse_args()
    import cupy as cp
    from opruntime_cupy import compile, memory
    from opruntime_cupy import matmul as mm

    import opruntime as opr
    from opruntime import selector
    from opruntime.ops.matmul import MATMUL

    lines: list[str] = []

    def say(s: str = "") -> None:
        print(s, flush=True)
        lines.append(s)

    dev = memory.provider(0)
    say(f"# {dev.description}, cc {dev._device.compute_capability}, SMs {dev.sm_count}, cupy {cp.__version__}, "
        f"driver {cp.cuda.runtime.driverGetVersion()}, runtime {cp.cuda.runtime.runtimeGetVersion()}")
    bf16 = memory.bfloat16()
    say(f"# cupy bfloat16 arrays: {bf16 is not None}; cuBLAS bfloat16 via cupy.matmul: {mm._cublas_bf16()}")
    def problem_of(a, b):
        norm = MATMUL.normalize([a.shape, b.shape], {})
        dt = a.dtype.name if a.dtype != np.uint16 else "bfloat16"
        st = tuple(tuple(s // x.dtype.itemsize for s in x.strides) for x in (a, b))
        return opr.Problem("matmul", "cuda:0", norm.shapes, (dt, dt), st, norm.attrs, norm.out_shape, dt)

    n, secs, errors = prebuild(mm, compile, compile.arch_of(0))
    say(f"# built {n} variants in {secs:.1f} s")
    for e in errors[:5]:
        say(f"# BUILD FAILED {e[:2000]}")

    has_wgmma = compile.arch_of(0) == "90" and probe_wgmma(cp, mm, problem_of, say)
    kernels = {k.name: k for k in mm.kernels()}
    rng = np.random.default_rng(1)

    def operands(nn, dtype):
        a = rng.standard_normal((nn, nn)).astype(np.float32)
        b = rng.standard_normal((nn, nn)).astype(np.float32)
        if dtype == "bfloat16":
            import ml_dtypes

            ah, bh = a.astype(ml_dtypes.bfloat16), b.astype(ml_dtypes.bfloat16)
            ref = ah.astype(np.float64) @ bh.astype(np.float64)
            if bf16 is None:  # raw bits: the kernels only need the pointer
                return cp.asarray(ah.view(np.uint16)), cp.asarray(bh.view(np.uint16)), ref
            return cp.asarray(ah), cp.asarray(bh), ref
        ah, bh = a.astype(dtype), b.astype(dtype)
        return cp.asarray(ah), cp.asarray(bh), ah.astype(np.float64) @ bh.astype(np.float64)

    def err_of(out, ref, dtype):
        o = cp.asnumpy(out)
        if dtype == "bfloat16":
            import ml_dtypes

            o = o.view(ml_dtypes.bfloat16) if o.dtype == np.uint16 else o
        o = o.astype(np.float64)
        return float(np.linalg.norm(o - ref) / np.linalg.norm(ref))

    say(f"{'dtype':8} {'n':>5} {'kernel[config]':40} {'ms':>8} {'TFLOP/s':>8} {'x cuBLAS':>8} {'est ms':>8} "
        f"{'relerr':>8}")
    summary = []
    cases = [("float32", int(x)) for x in args.sizes.split(",") if x]
    cases += [(dt, int(x)) for dt in ("float16", "bfloat16") for x in args.half_sizes.split(",") if x]
    for dtype, nn in cases:
        a, b, ref = operands(nn, dtype)
        p = problem_of(a, b)
        flops = 2.0 * nn ** 3
        rows = []
        base = None
        if dtype != "bfloat16" or mm._cublas_bf16():
            t = event_median(dev, lambda: cp.matmul(a, b))
            base = t
            rows.append(("cupy.matmul.cublas", t, mm.cost_cublas(p, {}), err_of(cp.matmul(a, b), ref, dtype)))
        if dtype == "bfloat16":
            try:
                import torch

                ta = torch.from_dlpack(a).view(torch.bfloat16) if a.dtype == np.uint16 else torch.from_dlpack(a)
                tb = torch.from_dlpack(b).view(torch.bfloat16) if b.dtype == np.uint16 else torch.from_dlpack(b)
                t = event_median(dev, lambda: torch.matmul(ta, tb))
                rows.append(("torch.matmul (cuBLAS bf16)", t, float("nan"), float("nan")))
                base = base or t
            except Exception as exc:
                say(f"# torch bf16 peer failed: {exc}")
        fams = ["cupy.matmul.simt", "cupy.matmul.simt_generic"] if dtype == "float32" else \
            ["cupy.matmul.mma", "cupy.matmul.mma_generic"] + (["cupy.matmul.wgmma"] if has_wgmma else [])
        for name in fams:
            k = kernels[name]
            if not k.supports(p):
                continue
            cfgs = k.configs if "generic" not in name else k.config_for(p)[:1]
            for cfg in cfgs:
                try:
                    out = k.run(p, cfg, a, b)
                    e = err_of(out, ref, dtype)
                    t = event_median(dev, lambda: k.run(p, cfg, a, b))
                    rows.append((f"{name}[{cfg['tile']}]", t, k.estimate(p, cfg), e))
                except Exception as exc:
                    say(f"# {name}[{cfg['tile']}] FAILED: {type(exc).__name__}: {str(exc)[:300]}")
        # the heuristic's choice among the candidates (as the selector ranks them)
        cands = []
        for name in ["cupy.matmul.cublas", *fams]:
            k = kernels[name]
            if (dtype != "bfloat16" or name != "cupy.matmul.cublas" or mm._cublas_bf16()) and k.supports(p):
                cfg = (k.config_for(p) if k.config_for else k.configs)[0]
                cands.append((k.estimate(p, cfg), f"{name}[{cfg['tile']}]" if cfg else name))
        pick = min(cands)[1] if cands else "-"
        best = min(rows, key=lambda r: r[1])
        for label, t, est, e in rows:
            ratio = base / t if base else float("nan")
            mark = "*" if label == pick or (label == "cupy.matmul.cublas" and pick == label) else " "
            say(f"{dtype:8} {nn:5d} {mark}{label:39} {t * 1e3:8.3f} {flops / t / 1e12:8.1f} {ratio:8.2f} "
                f"{est * 1e3:8.3f} {e:8.1e}")
        if args.sustained and nn >= 4096:
            fastest = {}
            for label, t, _est, _e in rows:
                fam = label.split("[")[0]
                if fam not in fastest or t < fastest[fam][1]:
                    fastest[fam] = (label, t)
            base_s = sustained(cp, lambda: cp.matmul(a, b)) if dtype != "bfloat16" or mm._cublas_bf16() else None
            for fam, (label, _) in fastest.items():
                if fam.startswith("cupy.matmul.") and "cublas" not in fam and "generic" not in fam:
                    tile = label.split("[")[1].rstrip("]")
                    k = kernels[fam]
                    cfg = next(c for c in k.configs if c["tile"] == tile)
                    ts = sustained(cp, lambda: k.run(p, cfg, a, b))
                    say(f"# sustained {dtype} {nn}: {label} {ts * 1e3:.3f} ms = {flops / ts / 1e12:.0f} TFLOP/s, "
                        f"cuBLAS {base_s * 1e3:.3f} ms -> {base_s / ts:.2f}x cuBLAS")
        picked = next((r for r in rows if r[0] == pick), None)
        own = [r for r in rows if r[0].startswith("cupy.matmul.") and "cublas" not in r[0]]
        best_own = min(own, key=lambda r: r[1]) if own else None
        summary.append(f"{dtype} {nn}: best own {best_own[0] if best_own else '-'} "
                       f"{(base / best_own[1]) if best_own and base else float('nan'):.2f}x cuBLAS; heuristic pick "
                       f"{pick} is {(picked[1] / best[1]) if picked else float('nan'):.3f}x the fastest ({best[0]})")
        a = b = ref = None
        cp.get_default_memory_pool().free_all_blocks()

    say("")
    for s in summary:
        say("# " + s)

    # per-call overhead on tiny problems: opruntime vs a bare cupy.matmul, host clock
    a = cp.asarray(rng.standard_normal((4, 4)).astype(np.float32))
    ta = opr.tensor(a)
    p4 = problem_of(a, a)
    simt, cfg0 = kernels["cupy.matmul.simt"], mm.SIMT_CONFIGS[0]
    bare = cp.ElementwiseKernel("float32 x", "float32 y", "y = x * 2.0f", "opr_bare")
    for label, fn in (("cupy elementwise (bare launch)", lambda: bare(a)),
                      ("cupy.matmul 4x4", lambda: cp.matmul(a, a)),
                      ("kernel.run simt 4x4", lambda: simt.run(p4, cfg0, a, a)),
                      ("cupy.empty 4x4", lambda: cp.empty((4, 4), cp.float32)),
                      ("opr.matmul 4x4", lambda: opr.matmul(ta, ta))):
        for _ in range(50):
            fn()
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(2000):
            fn()
        cp.cuda.Device().synchronize()
        say(f"# overhead {label}: {(time.perf_counter() - t0) / 2000 * 1e6:.1f} us/call")
    print(opr.explain("matmul", ta, ta))
    selector.clear_cache()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "matmul.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
