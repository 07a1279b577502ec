"""scaled_dot_product_attention on OpenCL devices (``attention.cl``): a fused, tiled kernel with an
online softmax, so memory stays O(L x E): no L x S score buffer is ever made.

One work-group takes a tile of ``BM`` query rows of one (batch, head): the Q tile sits in local
memory, the keys and values stream through local memory ``BN`` at a time, and each row keeps its
running maximum, running sum and ``Ev`` accumulators in private memory (``RM`` rows and
``Ev / TPR`` columns per work-item, in ``VW``-wide vectors). Scores live in the log2 domain (``exp2``); float16 is
computed in float32, float32 and float64 in their own precision. Causal key tiles past a query
tile's last row are never visited, and query tiles run heaviest first.

Why fused: the composite (``q @ k.T``, softmax, ``@ v``) writes and reads an L x S buffer per
head, which for long sequences is both the memory bound and, at S = 32768, 4 GiB per head in
float32; the fused kernel reads q, k and v and writes the output once per query tile.

Every operand is read in place through its element strides (transposed or sliced views
included: no gathered copies), a broadcast batch through a zero batch stride, shared heads (GQA,
one head for all) through ``h // (H // Hx)``; a boolean mask is read as bytes, an additive one in
the computation dtype, each broadcast along rows and columns through zero strides. Masked keys
(boolean False, additive -inf, causal) take no part; a row with every key masked is zeros; a NaN
in an additive mask makes its row NaN (the kernel's maximum propagates NaN), as the reference.

Configs are tile shapes (``BM`` query rows, ``BN`` keys, ``TPR`` work-items per row group, ``RM``
rows per work-item, ``VW`` vector width): a GPU menu (64-256 work-items splitting the keys and
columns, scalar lanes, measured on an H100) and a CPU menu (PoCL: one work-item per 8 rows with
16-float vectors, so each work-item runs SIMD code), each filtered by the device's work-group and
local-memory limits (and, on GPUs, an estimate of the registers) and ranked by :func:`cost`.
float16 needs ``cl_khr_fp16`` (neither PoCL nor NVIDIA's platform has it: that path passes
clang's OpenCL front end but has never run).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from opruntime.kernels import Kernel, Problem, itemsize

from . import compile as cl_compile
from .compile import BUFFER
from .matmul import TYPES
from .memory import OpenCLDevice, elem_strides, kernel_dtypes

NAME = "opencl.scaled_dot_product_attention.tiled"

#: GPUs: 64-256 work-items, 2 to 4 rows per work-item (the register blocking that amortises the
#: local-memory reads), 64-row Q tiles where local memory holds them (each K / V tile is then
#: loaded for more rows); the small tiles last, for head dims whose Q tile fills local memory.
#: Measured on an H100 (NVIDIA's OpenCL, 48 KiB of local memory, fp32, 4 x 16 x 4096 x 4096):
#: 64 x 16 x 8 x 4 runs 16.7 TFLOP/s at E = 128, 64 x 32 x 8 x 4 18.2 at E = 64; 32-row tiles
#: 11-15, one row per work-item 5-7.
GPU_CONFIGS: tuple[dict[str, int], ...] = (
    dict(BM=64, BN=32, TPR=8, RM=4, VW=1),
    dict(BM=64, BN=16, TPR=8, RM=4, VW=1),
    dict(BM=64, BN=32, TPR=16, RM=4, VW=1),
    dict(BM=32, BN=32, TPR=8, RM=4, VW=1),
    dict(BM=32, BN=64, TPR=8, RM=4, VW=2),
    dict(BM=32, BN=32, TPR=16, RM=2, VW=1),
    dict(BM=32, BN=16, TPR=8, RM=2, VW=1),
    dict(BM=16, BN=16, TPR=8, RM=2, VW=1),
    dict(BM=16, BN=32, TPR=16, RM=1, VW=1),
    dict(BM=16, BN=16, TPR=16, RM=1, VW=1),
    dict(BM=8, BN=8, TPR=8, RM=1, VW=1),
)
#: CPUs (PoCL): one work-item per RM rows (TPR = 1) with VW-wide vectors along the keys and the
#: value columns (16 floats: one AVX-512 register), so the work inside a work-item is SIMD code.
CPU_CONFIGS: tuple[dict[str, int], ...] = (
    dict(BM=64, BN=64, TPR=1, RM=8, VW=16),
    dict(BM=64, BN=32, TPR=1, RM=8, VW=16),
    dict(BM=128, BN=64, TPR=1, RM=8, VW=16),
    dict(BM=32, BN=64, TPR=1, RM=4, VW=16),
    dict(BM=16, BN=16, TPR=1, RM=2, VW=8),
)
CONFIGS: tuple[dict[str, int], ...] = (*GPU_CONFIGS, *(c for c in CPU_CONFIGS if c not in GPU_CONFIGS))
#: GPU work-items holding more accumulators and scores than this spill registers
MAX_REGS = 160

#: per operand (q, k, v, mask): buffer, element offset, 4 element strides, heads' group size;
#: then out, H, L, S, B * H and the scale (ACC: set per dtype)
OPERAND = (BUFFER, np.int64, np.int64, np.int64, np.int64, np.int64, np.int32)
SIGNATURE = OPERAND * 4 + (BUFFER, np.int32, np.int32, np.int32, np.int32)


def kernels() -> list[Kernel]:
    return [Kernel("scaled_dot_product_attention", NAME, "opencl", kernel_dtypes(), prepare=prepare,
                   supports=supports, cost=cost, configs=CONFIGS, config_for=configs_for,
                   source=cl_compile.source("attention.cl"))]


def _dims(problem: Problem) -> tuple[int, int, int, int, int, int]:
    """(B, H, L, S, E, Ev)."""
    B, H, L, Ev = problem.out_shape
    S, E = problem.shapes[1][-2:]
    return B, H, L, S, E, Ev


def _mask_kind(problem: Problem) -> int:
    """0 no mask, 1 boolean, 2 additive (the kernel's MASK)."""
    if len(problem.shapes) < 4:
        return 0
    return 1 if problem.dtypes[3] == "bool" else 2


def defines(problem: Problem, config: Mapping[str, int]) -> dict[str, Any]:
    t, acc, ext = TYPES[problem.dtype]
    _, _, _, _, E, Ev = _dims(problem)
    return {"T": t, "ACC": acc, **ext, "E": E, "EV": Ev, "MASK": _mask_kind(problem),
            "CAUSAL": int(problem.attrs["causal"]), "KPAD": _kpad(config),
            **{k: config[k] for k in ("BM", "BN", "TPR", "RM", "VW")}}


def _kpad(config: Mapping[str, int]) -> int:
    """Padding of the K^T / P rows: one word (odd strides: no bank conflicts) for scalar
    reads, a vector for vector reads (keeps them aligned)."""
    return 1 if config["VW"] == 1 else config["VW"]


def prepare(problem: Problem, config: Mapping[str, int]) -> Callable[..., Any]:
    """Build ``config`` for ``problem``; ``launch(q, k, v, mask=None)`` reads each operand in
    place through the strides it has at the call (a cast or reshaped operand may differ from the
    problem's strides)."""
    dev: OpenCLDevice = problem.device.provider
    B, H, L, S, E, Ev = _dims(problem)
    knl = cl_compile.kernel(dev, cl_compile.source("attention.cl"), defines(problem, config), "attention", label=NAME)
    scalar = np.float64 if problem.dtype == "float64" else np.float32
    wg = config["TPR"] * (config["BM"] // config["RM"])
    groups = -(-L // config["BM"]) * B * H
    run = cl_compile.Launch(dev, knl, (wg,), SIGNATURE + (scalar,), (groups * wg,))
    shapes, out_dtype = problem.shapes, np.dtype(problem.dtype)
    scale = scalar(problem.attrs["scale"])

    def operand(i: int, x: Any, rows_cols: bool = False) -> tuple[Any, ...]:
        shape = shapes[i]
        if tuple(x.shape) != shape:
            x = dev.reshape(x, shape)
        sb, sh, sr, sc = elem_strides(x)
        bx, hx, r, c = shape
        # broadcast dims read one entry: stride 0 (a mask's single row or column too)
        sb = 0 if bx == 1 else sb
        sh = 0 if hx == 1 else sh
        if rows_cols:
            sr, sc = (0 if r == 1 else sr), (0 if c == 1 else sc)
        return x.base_data, x.offset // x.dtype.itemsize, sb, sh, sr, sc, H // hx

    def launch(q: Any, k: Any, v: Any, mask: Any = None) -> Any:
        args = operand(0, q) + operand(1, k) + operand(2, v)
        args += operand(3, mask, True) if mask is not None else (q.base_data, 0, 0, 0, 0, 0, 1)
        out = dev.empty((B, H, L, Ev), out_dtype)
        run(*args, out.base_data, H, L, S, B * H, scale)
        return out

    return launch


# -- which configs fit, and what they cost ------------------------------------------------------
def local_bytes(problem: Problem, cfg: Mapping[str, int]) -> int:
    """Local memory of ``cfg`` (the .cl file's qs, kv, ps and mx)."""
    _, _, _, _, E, Ev = _dims(problem)
    bm, bn, tpr, vw = cfg["BM"], cfg["BN"], cfg["TPR"], cfg["VW"]
    t, acc = itemsize(problem.dtype), (8 if problem.dtype == "float64" else 4)
    kstr, vstr = bn + _kpad(cfg), -(-Ev // (tpr * vw)) * tpr * vw
    return t * (bm * (E + 1) + max(E * kstr, bn * vstr)) + acc * (bm * kstr + bm * tpr)


def _registers(problem: Problem, cfg: Mapping[str, int]) -> int:
    """Accumulators, scores and operands a work-item holds (ACC words)."""
    Ev = _dims(problem)[5]
    rm, vw = cfg["RM"], cfg["VW"]
    nj, nc = cfg["BN"] // cfg["TPR"], -(-Ev // (cfg["TPR"] * vw)) * vw
    return rm * (nc + nj + vw + 1) + nj + nc


def fits(dev: OpenCLDevice, problem: Problem, cfg: Mapping[str, int]) -> bool:
    bm, bn, tpr, rm, vw = cfg["BM"], cfg["BN"], cfg["TPR"], cfg["RM"], cfg["VW"]
    if bm % rm or bn % (tpr * vw) or tpr & (tpr - 1) or vw not in (1, 2, 4, 8, 16):
        return False
    wg = tpr * (bm // rm)
    return (wg <= dev.max_wg and wg <= dev.cl_device.max_work_item_sizes[0]
            and local_bytes(problem, cfg) <= dev.local_mem - 256)


def configs_for(problem: Problem) -> Sequence[Mapping[str, int]]:
    """The device's menu, those that fit, cheapest first (on a GPU, those that would spill
    registers only when nothing else fits)."""
    dev = problem.device.provider
    menu = GPU_CONFIGS if dev.accelerator else CPU_CONFIGS
    fit = [c for c in menu if fits(dev, problem, c)]
    if dev.accelerator and any(_registers(problem, c) <= MAX_REGS for c in fit):
        fit = [c for c in fit if _registers(problem, c) <= MAX_REGS]
    if not fit:  # very large head dims: the other menu may hold a tile that fits
        fit = [c for c in CONFIGS if fits(dev, problem, c)]
    return sorted(fit, key=lambda c: cost(problem, c))


def supports(problem: Problem) -> bool:
    return problem.device.provider.dtype_ok(problem.dtype) and bool(configs_for(problem))


def _key_tiles(L: int, S: int, bm: int, bn: int, causal: bool) -> int:
    """Key tiles visited per (batch, head), over all its query tiles."""
    tiles = -(-L // bm)
    if not causal:
        return tiles * -(-S // bn)
    return sum(-(-min(S, L, (t + 1) * bm) // bn) for t in range(tiles))


def cost(problem: Problem, cfg: Mapping[str, int]) -> float:
    """Seconds: the padded tile work at an efficiency set by the register blocking (rows per
    work-item, FMAs per local-memory read in the two products), the rows per tile and the vector
    width, over the waves of work-groups the device runs at once; or the traffic of re-reading K
    and V per query tile, if more; plus a launch. (PoCL, 2 cores, L = S = 1024, E = 128: 30-36
    GFLOP/s for the first CPU config, 20 with RM = 4, 13 for the 16 x 16 tile.)"""
    dev = problem.device.provider
    B, H, L, S, E, Ev = _dims(problem)
    bm, bn, tpr, rm, vw = cfg["BM"], cfg["BN"], cfg["TPR"], cfg["RM"], cfg["VW"]
    njv, ncv = bn // (tpr * vw), -(-Ev // (tpr * vw))
    visited = _key_tiles(L, S, bm, bn, problem.attrs["causal"]) * B * H
    # per key tile: BM x BN x (E + padded Ev) FMAs and ~12 operations per score (mask, exp2, max)
    flops = visited * bm * bn * (2.0 * (E + ncv * tpr * vw) + 12.0)
    # vector FMAs per local read: scores RM x NJV per RM + NJV reads, output RM x NCV per RM + NCV
    reuse = 2.0 / ((rm + njv) / (rm * njv) + (rm + ncv) / (rm * ncv))
    groups = -(-L // bm) * B * H
    wg = tpr * (bm // rm)
    if dev.accelerator:
        # fitted to the H100 figures above (within ~30% for every config there): rows per
        # work-item and rows per tile (K / V loads per FLOP) dominate, register reuse less so,
        # and ~110 estimated words (~170 real registers) cost occupancy
        eff = 0.455 * rm / (rm + 1) / (1 + 16 / bm) * min(1.0, reuse / 3.0) ** 0.25
        if _registers(problem, cfg) > 110:
            eff *= 0.75
        slots = dev.compute_units * max(1, min(8, 2048 // wg, int(dev.local_mem // max(local_bytes(problem, cfg), 1))))
    else:  # PoCL: SIMD along VW within a work-item, a work-group per core at a time
        eff = 0.25 * min(1.0, reuse / 4.0) * min(1.0, tpr * vw / 16) ** 0.5
        slots = dev.compute_units
    waves = -(-groups // slots)
    fill = groups / (waves * slots)
    dt = 2.0 if problem.dtype == "float64" else 1.0
    compute = flops * dt / (eff * fill * dev.flops)
    nbytes = itemsize(problem.dtype) * (B * H * L * (E + 2 * Ev) + visited * bn * (E + Ev))
    return max(compute, nbytes / dev.bandwidth) + dev.launch_s
