"""Build, check and time every OpenCL matmul / softmax config on one device, with peers.

    python scripts/opencl_bench.py --device opencl:0 --matmul 512 1024 --softmax 2048x2048
    python scripts/opencl_bench.py --device opencl:gpu --matmul 4096 --softmax 8192x8192 --peers cupy

Every config is first checked against a float64 reference at odd sizes (rel. error printed),
then timed with the device's profiling events (median). Peers run in the same process: NumPy on
the host; cupy.matmul (cuBLAS), torch.softmax and a device-to-device copy on a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

import opruntime as opr
from opruntime.ops import OPS
from opruntime.plugins import registry
from opruntime.testing.numerics import rel_err


def median_time(prov, fn, repeats: int) -> float:
    return float(np.median(prov.time(fn, repeats=repeats, warmup=2)))


def host_time(fn, repeats: int) -> float:
    fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def cuda_time(fn, repeats: int) -> float:
    """Seconds per call on cuda:0, from CUDA events (opruntime's CUDA provider)."""
    return median_time(registry().device("cuda:0").provider, fn, repeats)


def configs_of(kernel, problem):
    """Every config of the kernel that fits this device (not only the cost-ordered first)."""
    return list(kernel.candidates(problem))


def bench_matmul(dev, sizes, peers, rows, repeats, verbose_build):
    from opruntime_opencl import compile as cl_compile

    reg = registry()
    prov = dev.provider
    rng = np.random.default_rng(1)
    # edge tiles everywhere (odd sizes, batched with broadcast) and full tiles (the vector fast path)
    checks = []
    for sa, sb in (((3, 67, 129), (129, 65)), ((256, 256), (256, 256)), ((2, 1, 160, 96), (3, 96, 200))):
        ah, bh = rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)
        checks.append((OPS["matmul"].problem_for(dev.name, [sa, sb], "float32"), prov.from_host(ah), prov.from_host(bh),
                       np.matmul(ah.astype(np.float64), bh)))
    refs = {}
    for n in sizes:
        ah = rng.standard_normal((n, n)).astype(np.float32)
        bh = rng.standard_normal((n, n)).astype(np.float32)
        ref = np.matmul(ah.astype(np.float64), bh) if n <= 2048 else ah @ bh  # float32 BLAS at 4096: time
        refs[n] = (ah, bh, prov.from_host(ah), prov.from_host(bh), ref)
    for kernel in reg.kernels_for("matmul", "opencl"):
        for cfg in configs_of(kernel, checks[0][0]):
            label = f"{kernel.name}[{','.join(f'{k}={v}' for k, v in cfg.items())}]"
            t0 = time.perf_counter()
            try:
                err = 0.0
                for p, a, b, ref in checks:
                    if cfg in configs_of(kernel, p):
                        err = max(err, rel_err(prov.to_host(kernel.run(p, cfg, a, b)), ref))
            except Exception as exc:
                print(f"{label}: FAILED {type(exc).__name__}: {str(exc)[:2000]}")
                rows.append({"op": "matmul", "kernel": label, "error": str(exc)[:2000]})
                continue
            build_s = time.perf_counter() - t0
            if verbose_build and prov.is_nvidia:
                from opruntime_opencl import matmul as mm

                try:
                    prg = cl_compile.program(prov, cl_compile.source("matmul.cl"), mm.defines("float32", cfg), label="verbose",
                                        extra=("-cl-nv-verbose",))
                    import pyopencl as cl

                    log = prg.get_build_info(prov.cl_device, cl.program_build_info.LOG)
                    keep = [ln.strip() for ln in log.splitlines() if "Used" in ln or "spill" in ln or "rror" in ln]
                    print(f"  ptxas {label}: {' | '.join(keep)[-400:]}")
                except Exception as exc:  # pragma: no cover - diagnostics only
                    print(f"  build log {label}: unavailable ({exc})")
            for n in sizes:
                p = OPS["matmul"].problem_for(dev.name, [(n, n), (n, n)], "float32")
                if cfg not in configs_of(kernel, p):
                    continue
                ah, bh, da, db, ref = refs[n]
                n_err = rel_err(prov.to_host(kernel.run(p, cfg, da, db)), ref)
                t = median_time(prov, lambda: kernel.run(p, cfg, da, db), repeats)
                tf = 2 * n**3 / t / 1e12
                row = {"op": "matmul", "kernel": label, "n": n, "s": t, "tflops": tf, "check_err": err,
                       "err_at_n": n_err, "first_run_s": build_s}
                rows.append(row)
                print(f"{label:78s} n={n:5d} {t * 1e3:9.3f} ms {tf:7.3f} TFLOP/s  (err {err:.1e}, at n {n_err:.1e})",
                      flush=True)
    for n in sizes:
        ah, bh = refs[n][:2]
        t = host_time(lambda: ah @ bh, max(3, repeats // 4))
        rows.append({"op": "matmul", "kernel": "peer:numpy", "n": n, "s": t, "tflops": 2 * n**3 / t / 1e12})
        print(f"{'peer numpy (host BLAS)':78s} n={n:5d} {t * 1e3:9.3f} ms {2 * n**3 / t / 1e12:7.3f} TFLOP/s")
        if "cupy" in peers:
            import cupy as cp

            ca, cb = cp.asarray(ah), cp.asarray(bh)
            t = cuda_time(lambda: cp.matmul(ca, cb), repeats)
            rows.append({"op": "matmul", "kernel": "peer:cupy.matmul", "n": n, "s": t, "tflops": 2 * n**3 / t / 1e12})
            print(f"{'peer cupy.matmul (cuBLAS)':78s} n={n:5d} {t * 1e3:9.3f} ms {2 * n**3 / t / 1e12:7.3f} TFLOP/s")


def bench_softmax(dev, shapes, peers, rows, repeats, red_variants=False):
    reg = registry()
    prov = dev.provider
    rng = np.random.default_rng(2)
    for op in ("softmax", "log_softmax"):
        for kernel in reg.kernels_for(op, "opencl"):
            for r, c in shapes if op == "softmax" else shapes[:1]:  # log_softmax: the first shape only
                p = OPS[op].problem_for(dev.name, [(r, c)], "float32", axis=1)
                xh = (rng.standard_normal((r, c)) * 4).astype(np.float32)
                x = prov.from_host(xh)
                ref = OPS[op].reference(xh, axis=1)
                cfgs = configs_of(kernel, p)
                if red_variants:  # the same configs with local-memory reductions instead of shuffles
                    cfgs += [{**c, "RED": 0} for c in cfgs if c.get("RED", 0) != 0]
                for cfg in cfgs:
                    label = f"{kernel.name}[{','.join(f'{k}={v}' for k, v in cfg.items())}]"
                    try:
                        err = rel_err(prov.to_host(kernel.run(p, cfg, x)), ref)
                    except Exception as exc:
                        print(f"{label}: FAILED {type(exc).__name__}: {str(exc)[:2000]}")
                        rows.append({"op": op, "kernel": label, "error": str(exc)[:2000]})
                        continue
                    t = median_time(prov, lambda: kernel.run(p, cfg, x), repeats)
                    gbs = 2 * r * c * 4 / t / 1e9
                    rows.append({"op": op, "kernel": label, "shape": [r, c], "s": t, "gbs": gbs, "check_err": err})
                    print(f"{label:78s} {r}x{c} {t * 1e6:9.1f} us {gbs:8.1f} GB/s (err {err:.1e})", flush=True)
    for r, c in shapes:
        xh = rng.standard_normal((r, c)).astype(np.float32)
        try:
            t, name = host_time(lambda: OPS["softmax"](xh, device="cpu"), max(3, repeats // 4)), "numpy backend"
        except Exception as exc:  # the NumPy backend failing is not this script's business: time plain NumPy
            print(f"(NumPy backend failed: {type(exc).__name__}: {str(exc)[:200]}; timing plain NumPy instead)")

            def plain():
                e = np.exp(xh - xh.max(axis=1, keepdims=True))
                return e / e.sum(axis=1, keepdims=True)

            t, name = host_time(plain, max(3, repeats // 4)), "plain numpy"
        rows.append({"op": "softmax", "kernel": f"peer:{name}", "shape": [r, c], "s": t,
                     "gbs": 2 * r * c * 4 / t / 1e9})
        print(f"{'peer ' + name + ' softmax':78s} {r}x{c} {t * 1e6:9.1f} us {2 * r * c * 4 / t / 1e9:8.1f} GB/s")
        if "cupy" in peers:
            import cupy as cp

            cx = cp.asarray(xh)
            cy = cp.empty_like(cx)
            t = cuda_time(lambda: cy.__setitem__(Ellipsis, cx), repeats)
            gbs = 2 * r * c * 4 / t / 1e9
            rows.append({"op": "copy", "kernel": "peer:cupy d2d copy", "shape": [r, c], "s": t, "gbs": gbs})
            print(f"{'peer cupy device-to-device copy':78s} {r}x{c} {t * 1e6:9.1f} us {gbs:8.1f} GB/s")
            try:
                import torch

                tx = torch.as_tensor(xh, device="cuda")
                t = cuda_time(lambda: torch.softmax(tx, dim=1), repeats)
                rows.append({"op": "softmax", "kernel": "peer:torch.softmax", "shape": [r, c], "s": t,
                             "gbs": 2 * r * c * 4 / t / 1e9})
                print(f"{'peer torch.softmax':78s} {r}x{c} {t * 1e6:9.1f} us {2 * r * c * 4 / t / 1e9:8.1f} GB/s")
            except ImportError:
                pass
        # an OpenCL buffer copy on the same device: the bandwidth ceiling as OpenCL sees it
        import pyopencl as cl

        src, dst = prov.from_host(xh), prov.empty(xh.shape, xh.dtype)
        prov.synchronize()
        ts = []
        for _ in range(repeats):
            evt = cl.enqueue_copy(prov.queue, dst.base_data, src.base_data, byte_count=src.nbytes)
            evt.wait()
            ts.append((evt.profile.end - evt.profile.start) * 1e-9)
        t = float(np.median(ts[1:] or ts))
        rows.append({"op": "copy", "kernel": "peer:opencl enqueue_copy", "shape": [r, c], "s": t,
                     "gbs": 2 * r * c * 4 / t / 1e9})
        gbs = 2 * r * c * 4 / t / 1e9
        print(f"{'peer OpenCL buffer copy (same device)':78s} {r}x{c} {t * 1e6:9.1f} us {gbs:8.1f} GB/s")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="opencl:0")
    ap.add_argument("--matmul", type=int, nargs="*", default=[512])
    ap.add_argument("--softmax", nargs="*", default=["1024x1024"])
    ap.add_argument("--peers", nargs="*", default=[])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--verbose-build", action="store_true", help="print NVIDIA's ptxas report per matmul config")
    ap.add_argument("--red-variants", action="store_true", help="also time softmax configs with RED=0")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    dev = opr.Device(args.device)
    facts = "; ".join(f"{k}: {v}" for k, v in dev.provider.info().items())
    print(f"device {dev.name}: {dev.provider.description}; {facts}")
    rows: list[dict] = []
    if args.matmul:
        bench_matmul(dev, args.matmul, args.peers, rows, args.repeats, args.verbose_build)
    if args.softmax:
        shapes = [tuple(map(int, s.split("x"))) for s in args.softmax]
        bench_softmax(dev, shapes, args.peers, rows, args.repeats, args.red_variants)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": dev.provider.fingerprint(), "rows": rows}, f, indent=1)
    best = {}
    for r in rows:
        if "s" in r and not r["kernel"].startswith("peer"):
            key = (r["op"], r.get("n") or tuple(r.get("shape", ())))
            if key not in best or r["s"] < best[key]["s"]:
                best[key] = r
    print("\nbest per problem:")
    for key, r in best.items():
        peer_rows = [p for p in rows if p["kernel"].startswith("peer") and p["op"] in (key[0], "copy", "softmax")
                     and (p.get("n") or tuple(p.get("shape", ()))) == key[1]]
        ratios = ", ".join(f"{p['kernel']}: {p['s'] / r['s']:.2f}x" for p in peer_rows)
        print(f"  {key}: {r['kernel']} {r['s'] * 1e3:.3f} ms; speed vs peers (peer time / ours): {ratios}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
