#!/usr/bin/env python3
"""Check and time the CUDA backend's softmax and conv2d kernels against their peers, in one run.

    scripts/gpu.sh python3 scripts/cuda_softmax_conv_bench.py [--out DIR] [--only softmax,conv,overhead]

For every target shape: each of our kernels x configs (checked against a float64 result first),
what the heuristic selects, the call through the frontend, and the peers measured in the same
process: a device copy (the bandwidth ceiling), torch.softmax, jax.nn.softmax (jit), a 12-line
Triton softmax; cuDNN through torch.nn.functional.conv2d (TF32 off) for conv2d. Timing: batches
of back-to-back calls between two synchronisations, median of several batches (as
``opruntime bench``), inputs rotated among buffers so that no input stays in L2 between calls.
Writes a JSON with every number and prints the tables.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
import traceback

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX must leave memory to the others

import numpy as np

from opruntime.bench import measure as bench_measure

SOFTMAX_SHAPES = [(4096, 4096), (8192, 8192), (32768, 1024), (1024, 32768), (65536, 128)]
RESNET = [(32, 64, 56, 64, 3, 1, 1), (32, 256, 56, 64, 1, 1, 0), (32, 128, 28, 128, 3, 1, 1),
          (32, 256, 14, 256, 3, 1, 1), (32, 3, 224, 64, 7, 2, 3)]


# the project's own timing (opruntime.bench.measure), with longer batches
measure = functools.partial(bench_measure, repeats=7, batch_s=0.01)


def rotating(arrays):
    """A callable returning the next array of ``arrays`` each call."""
    state = [0]

    def nxt():
        state[0] = (state[0] + 1) % len(arrays)
        return arrays[state[0]]

    return nxt


# -- softmax ---------------------------------------------------------------------------------------


def triton_softmax():
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(out_ptr, in_ptr, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(in_ptr + row * n_cols + cols, mask=mask, other=-float("inf"))
        x = x - tl.max(x, axis=0)
        e = tl.exp(x)
        tl.store(out_ptr + row * n_cols + cols, e / tl.sum(e, axis=0), mask=mask)

    return kernel


def bench_softmax(results: dict) -> None:
    import cupy as cp
    import torch
    from opruntime_cupy import softmax as sm

    from opruntime.config import settings
    from opruntime.kernels import Attrs, Problem
    from opruntime.plugins import registry
    from opruntime.selector import Candidate, rank

    dev = registry().device("cuda:0")
    sync = cp.cuda.Device(0).synchronize
    try:
        import jax

        jsoft = jax.jit(lambda x: jax.nn.softmax(x, axis=-1))
    except Exception as exc:
        print(f"jax unavailable: {exc}")
        jax = None
    try:
        import triton

        tri = triton_softmax()
    except Exception as exc:
        print(f"triton unavailable: {exc}")
        tri = None
    rng = np.random.default_rng(0)
    for rows, cols in SOFTMAX_SHAPES:
        key = f"{rows}x{cols}"
        res = results.setdefault("softmax", {}).setdefault(key, {"ours": {}, "peers": {}, "errors": {}})
        nbytes = 2 * rows * cols * 4
        k = max(2, min(4, math.ceil(300e6 / (rows * cols * 4))))
        host = [(rng.standard_normal((rows, cols)) * 3).astype(np.float32) for _ in range(k)]
        xs = [cp.asarray(h) for h in host]
        nxt = rotating(xs)
        ys = cp.empty((rows, cols), cp.float32)
        res["peers"]["copy"] = nbytes / measure(lambda: cp.copyto(ys, nxt()), sync) / 1e12
        ts = [torch.from_numpy(h).cuda() for h in host]
        tn = rotating(ts)
        res["peers"]["torch"] = nbytes / measure(lambda: torch.softmax(tn(), -1), torch.cuda.synchronize) / 1e12
        tcopy = torch.empty_like(ts[0])
        res["peers"]["torch_copy"] = nbytes / measure(lambda: tcopy.copy_(tn()), torch.cuda.synchronize) / 1e12
        if jax is not None:
            js = [jax.device_put(h) for h in host]
            jn = rotating(js)
            last = [None]

            def jrun():
                last[0] = jsoft(jn())

            res["peers"]["xla"] = nbytes / measure(jrun, lambda: last[0].block_until_ready()) / 1e12
            del js
        if tri is not None:
            out = torch.empty_like(ts[0])
            block = triton.next_power_of_2(cols)
            best = 0.0
            for warps in (4, 8, 16):
                if block // (32 * warps) > 256:
                    continue
                try:
                    rate = nbytes / measure(lambda: tri[(rows,)](out, tn(), cols, BLOCK=block, num_warps=warps),
                                            torch.cuda.synchronize) / 1e12
                    best = max(best, rate)
                    res["peers"][f"triton_w{warps}"] = rate
                except Exception as exc:
                    print(f"triton {key} warps={warps}: {exc}")
            res["peers"]["triton"] = best
        del ts
        torch.cuda.empty_cache()
        # ours: every kernel x config, checked first
        ref = cp.asarray(host[0]).astype(cp.float64)
        ref = cp.exp(ref - ref.max(axis=1, keepdims=True))
        ref /= ref.sum(axis=1, keepdims=True)
        p = Problem("softmax", "cuda:0", ((rows, cols),), ("float32",), ((cols, 1),), Attrs(axis=1), (rows, cols),
                    "float32")
        for kern in sm.kernels():
            if kern.op != "softmax" or not kern.supports(p):
                continue
            for cfg in kern.candidates(p):
                label = Candidate(kern, dict(cfg)).label
                try:
                    out = kern.run(p, cfg, xs[0])
                    err = float(cp.linalg.norm(out - ref) / cp.linalg.norm(ref))
                    res["errors"][label] = err
                    res["ours"][label] = nbytes / measure(lambda: kern.run(p, cfg, nxt()), sync) / 1e12
                    res.setdefault("cost_us", {})[label] = kern.estimate(p, cfg) * 1e6
                except Exception as exc:
                    res["ours"][label] = float("nan")
                    res["errors"][label] = f"{type(exc).__name__}: {exc}"[:300]
        usable, _, why = rank(p, dev, settings())
        res["selected"] = usable[0].label
        import opruntime as opr

        tens = [opr.Tensor._wrap(x, dev) for x in xs]
        tnx = rotating(tens)
        res["frontend"] = nbytes / measure(lambda: opr.softmax(tnx()), sync) / 1e12
        del xs, tens
        cp.get_default_memory_pool().free_all_blocks()
        print_softmax(key, res)


def print_softmax(key: str, res: dict) -> None:
    peers = res["peers"]
    best_peer = max(peers.get(k, 0) for k in ("torch", "xla", "triton"))
    ours = {k: v for k, v in res["ours"].items() if isinstance(v, float) and math.isfinite(v)}
    best = max(ours.items(), key=lambda kv: kv[1]) if ours else ("-", float("nan"))
    sel = res.get("selected", "")
    sel_rate = ours.get(sel, float("nan"))
    print(f"softmax {key}: copy {peers.get('copy', 0):.2f} torch {peers.get('torch', 0):.2f} "
          f"xla {peers.get('xla', 0):.2f} triton {peers.get('triton', 0):.2f} TB/s | best ours {best[1]:.2f} "
          f"({best[0]}) = {best[1] / best_peer:.3f}x best peer | selected {sel} {sel_rate:.2f} | "
          f"frontend {res.get('frontend', float('nan')):.2f}")
    for label, v in sorted(res["ours"].items(), key=lambda kv: -kv[1] if isinstance(kv[1], float) and math.isfinite(kv[1]) else 0):
        err = res["errors"].get(label)
        cost = res.get("cost_us", {}).get(label, float("nan"))
        print(f"    {label:45s} {v:6.2f} TB/s  err {err if isinstance(err, str) else f'{err:.1e}'}  est {cost:8.1f} us")


# -- conv2d ------------------------------------------------------------------------------------------


def bench_conv(results: dict, dtypes=("float32", "float16")) -> None:
    import cupy as cp
    import torch
    import torch.nn.functional as F
    from opruntime_cupy import conv as cv

    from opruntime.config import settings
    from opruntime.kernels import Problem
    from opruntime.ops import OPS
    from opruntime.plugins import registry
    from opruntime.selector import Candidate, rank

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = registry().device("cuda:0")
    sync = cp.cuda.Device(0).synchronize
    rng = np.random.default_rng(0)
    for dtype in dtypes:
        for layer in RESNET:
            n, c, hw, k, r, stride, pad = layer
            key = f"{dtype} {layer}"
            res = results.setdefault("conv", {}).setdefault(key, {"ours": {}, "peers": {}, "errors": {}})
            xh = rng.standard_normal((n, c, hw, hw)).astype(dtype)
            wh = (rng.standard_normal((k, c, r, r)) / math.sqrt(c * r * r)).astype(dtype)
            x, w = cp.asarray(xh), cp.asarray(wh)
            p = None
            xt, wt = torch.from_numpy(xh).cuda(), torch.from_numpy(wh).cuda()
            tf = measure(lambda: F.conv2d(xt, wt, stride=stride, padding=pad), torch.cuda.synchronize)
            ref = F.conv2d(xt.double(), wt.double(), stride=stride, padding=pad)
            refc = cp.from_dlpack(ref)
            norm = OPS["conv2d"].normalize([x.shape, w.shape], {"stride": stride, "padding": pad})
            p = Problem("conv2d", "cuda:0", norm.shapes, (dtype, dtype), (None, None), norm.attrs, norm.out_shape, dtype)
            flops = OPS["conv2d"].flops(p)
            res["peers"]["cudnn"] = flops / tf / 1e12
            for kern in cv.kernels():
                if dtype not in kern.dtypes or not kern.supports(p):
                    continue
                for cfg in kern.candidates(p):
                    label = Candidate(kern, dict(cfg)).label
                    try:
                        out = kern.run(p, cfg, x, w)
                        err = float(cp.linalg.norm(out.astype(cp.float64) - refc) / cp.linalg.norm(refc))
                        res["errors"][label] = err
                        res["ours"][label] = flops / measure(lambda: kern.run(p, cfg, x, w), sync, repeats=5) / 1e12
                        res.setdefault("cost_us", {})[label] = kern.estimate(p, cfg) * 1e6
                    except Exception as exc:
                        res["ours"][label] = float("nan")
                        res["errors"][label] = f"{type(exc).__name__}: {exc}"[:300]
                        traceback.print_exc()
            usable, _, _ = rank(p, dev, settings())
            res["selected"] = usable[0].label
            xt = wt = ref = refc = None  # free the GPU memory before the next layer
            torch.cuda.empty_cache()
            cp.get_default_memory_pool().free_all_blocks()
            ours = {a: b for a, b in res["ours"].items() if math.isfinite(b)}
            best = max(ours.items(), key=lambda kv: kv[1]) if ours else ("-", float("nan"))
            print(f"conv {key}: cudnn {res['peers']['cudnn']:.1f} TFLOP/s | best ours {best[1]:.1f} ({best[0]}) = "
                  f"{best[1] / res['peers']['cudnn']:.3f}x | selected {res['selected']} "
                  f"{ours.get(res['selected'], float('nan')):.1f}")
            for label, v in sorted(res["ours"].items(), key=lambda kv: -kv[1] if math.isfinite(kv[1]) else 0):
                err = res["errors"].get(label)
                cost = res.get("cost_us", {}).get(label, float("nan"))
                print(f"    {label:50s} {v:7.2f} TFLOP/s ({flops / max(v, 1e-9) / 1e6:8.1f} us)  err "
                      f"{err if isinstance(err, str) else f'{err:.1e}'}  est {cost:8.1f} us")


# -- per-call overhead --------------------------------------------------------------------------------


def bench_overhead(results: dict) -> None:
    import cupy as cp
    from opruntime_cupy import compile as cc
    from opruntime_cupy import softmax as sm

    import opruntime as opr
    from opruntime.kernels import Attrs, Problem
    from opruntime.plugins import registry

    dev = registry().device("cuda:0")
    sync = cp.cuda.Device(0).synchronize
    res = results.setdefault("overhead_us", {})
    x = cp.asarray(np.random.default_rng(0).standard_normal(16).astype(np.float32))
    y = cp.empty_like(x)
    res["cupy_exp"] = measure(lambda: cp.exp(x), sync, batch_s=0.02) * 1e6
    p = Problem("softmax", "cuda:0", ((16,),), ("float32",), ((1,),), Attrs(axis=0), (16,), "float32")
    kern = next(k for k in sm.kernels() if k.name == "cupy.softmax.warp")
    cfg = kern.candidates(p)[0]
    res["kernel_run"] = measure(lambda: kern.run(p, cfg, x), sync, batch_s=0.02) * 1e6
    d = sm._defines("warp", p, cfg, 4)
    fn = cc.get_function(sm.SOURCE, "softmax_warp", d, 0)
    res["raw_launch_pyints"] = measure(lambda: fn((1,), (128,), (x, y, 1, 16, 16)), sync, batch_s=0.02) * 1e6
    a, b, c = np.int64(1), np.int64(16), np.int64(16)
    res["raw_launch_npint64"] = measure(lambda: fn((1,), (128,), (x, y, a, b, c)), sync, batch_s=0.02) * 1e6
    res["cupy_empty"] = measure(lambda: cp.empty((16,), cp.float32), sync, batch_s=0.02) * 1e6
    launch = sm._launches[("softmax.warp", id(p), id(cfg))][2]
    res["launch_closure"] = measure(lambda: launch(x), sync, batch_s=0.02) * 1e6
    getdev = cp.cuda.runtime.getDevice
    res["getdev"] = measure(getdev, sync, batch_s=0.02) * 1e6
    res["cupy_empty_xdtype"] = measure(lambda: cp.empty((16,), x.dtype), sync, batch_s=0.02) * 1e6
    res["ptr_check"] = measure(lambda: x.data.ptr & 15, sync, batch_s=0.02) * 1e6
    args = (x, y, 1, 16, 16)
    res["raw_launch_prebuilt_args"] = measure(lambda: fn((1,), (128,), args), sync, batch_s=0.02) * 1e6
    res["kernel_run_again"] = measure(lambda: kern.run(p, cfg, x), sync, batch_s=0.02) * 1e6
    print(f"fn type: {type(fn)}")
    t = opr.Tensor._wrap(x, dev)
    res["opr_softmax_tensor"] = measure(lambda: opr.softmax(t), sync, batch_s=0.02) * 1e6
    res["opr_log_softmax_tensor"] = measure(lambda: opr.log_softmax(t), sync, batch_s=0.02) * 1e6
    res["ratio_frontend_vs_cupy_exp"] = res["opr_softmax_tensor"] / res["cupy_exp"]
    print("overhead (us per call): " + ", ".join(f"{k} {v:.2f}" for k, v in res.items()))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--only", default="softmax,conv,overhead")  # overhead last: the GPU clocks are up by then
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    import cupy as cp

    results: dict = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                     "date": time.strftime("%Y-%m-%d %H:%M"), "cupy": cp.__version__}
    print(f"device: {results['device']}  cupy {cp.__version__}")
    for part in args.only.split(","):
        t0 = time.time()
        try:
            {"softmax": bench_softmax, "conv": bench_conv, "overhead": bench_overhead}[part](results)
        except Exception:
            traceback.print_exc()
        print(f"[{part} took {time.time() - t0:.0f} s]")
        with open(os.path.join(args.out, "cuda_softmax_conv.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
