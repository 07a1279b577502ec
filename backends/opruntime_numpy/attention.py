"""scaled_dot_product_attention on the CPU: blocked over queries and keys with an online softmax.

For each block of query rows, the key / value blocks are visited once, keeping per row the running
maximum ``m``, the running sum ``l`` of ``exp(s - m)`` and the unnormalised output ``acc``; a new
block rescales them by ``exp(m_old - m_new)``. Memory stays O(rows x keys of one block) per head
(:data:`TILE` elements of scores across the heads), never L x S. Causal blocks past a query
block's last row are skipped. Batches and heads are NumPy broadcasting: GQA groups are a
dimension of their own (q as (B, Hk, G, L, E) against k as (B, Hk, 1, S, E)), so no key or value is
copied per group. float16 is computed in float32; float32 and float64 in their own precision.

With numba (:mod:`.jit`), ``numpy.scaled_dot_product_attention.numba`` is flash attention with
the products by BLAS (:mod:`._nb_attention`): per task (batch, head, pair of query blocks), tiles
of :data:`NUMBA_CONFIGS` query rows x keys, scores and ``p @ v`` as ``np.dot`` calls on contiguous
blocks and the online softmax in compiled loops between them. The tasks are cut into pieces that
Python threads take in turn, each piece one call of the nogil loop, scipy's BLAS held to one
thread meanwhile (:mod:`._blas`). Measured on this 2-core machine (causal, float32): 1x4x512x64
1.2 ms (torch 1.2-1.4), 2x12x1024x64 22 ms (torch 21-22), 1x12x2048x64 39 ms (torch 32); the
NumPy kernel 78 ms on the second. It is chosen from decode steps to long sequences.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from opruntime.kernels import FLOATS, Kernel, Problem, roofline

from . import buffers, jit
from .matmul import CPU_BYTES, CPU_FLOPS

#: score elements (across the heads) of one (query block, key block) step: a few MB in cache
TILE = 1 << 19
KEY_BLOCK = 256


def _grouped(x: np.ndarray, hk: int, g: int) -> np.ndarray:
    """(B, Hx, R, C) as (B, Hk, G, R, C): heads of the output h = hk_index * G + g."""
    b, hx, r, c = x.shape
    if hx == hk * g:
        return x.reshape(b, hk, g, r, c)
    if hx == hk:
        return x.reshape(b, hk, 1, r, c)
    return x.reshape(b, 1, 1, r, c)  # one head for all (hx == 1)


@np.errstate(invalid="ignore", over="ignore", divide="ignore")
def attention(problem: Problem, config: Any, q: np.ndarray, k: np.ndarray, v: np.ndarray,
              mask: np.ndarray | None = None) -> np.ndarray:
    acc_t = np.dtype(np.float32 if problem.dtype == "float16" else problem.dtype)
    B, H, L, Ev = problem.out_shape
    S = k.shape[2]
    scale = problem.attrs["scale"]
    causal = problem.attrs["causal"]
    hk = max(k.shape[1], v.shape[1])  # H, a GQA group count, or 1 (both broadcast)
    g = H // hk
    # q scaled once (in the computation dtype), the keys transposed once
    qg = _grouped(q.astype(acc_t, copy=False) * acc_t.type(scale), hk, g)
    kt = _grouped(k.astype(acc_t, copy=False), hk, g).swapaxes(-1, -2)
    vg = _grouped(v.astype(acc_t, copy=False), hk, g)
    mg = None
    if mask is not None:
        mg = _grouped(mask if mask.dtype == np.bool_ else mask.astype(acc_t, copy=False), hk, g)
    out = np.empty((B, hk, g, L, Ev), acc_t)
    kb = min(S, KEY_BLOCK)
    qb = max(1, min(L, max(16, TILE // max(1, B * H * kb))))
    for i0 in range(0, L, qb):
        i1 = min(L, i0 + qb)
        qi = qg[..., i0:i1, :]
        shape = (B, hk, g, i1 - i0)
        m = np.full(shape, -np.inf, acc_t)
        lsum = np.zeros(shape, acc_t)
        acc = np.zeros((*shape, Ev), acc_t)
        stop = min(S, i1) if causal else S  # causal: row i sees keys 0..i
        for j0 in range(0, stop, kb):
            j1 = min(stop, j0 + kb)
            s = qi @ kt[..., j0:j1]
            if mg is not None:
                mi = mg[..., i0:i1, :] if mg.shape[-2] > 1 else mg
                mj = mi[..., j0:j1] if mi.shape[-1] > 1 else mi
                s = np.where(mj, s, -np.inf) if mj.dtype == np.bool_ else s + mj
            if causal and j1 - 1 > i0:  # the block reaches past the diagonal of some rows
                rows = np.arange(i0, i1)[:, None]
                s = np.where(np.arange(j0, j1)[None, :] <= rows, s, -np.inf)
            m_new = np.maximum(m, s.max(axis=-1))
            base = np.where(np.isneginf(m_new), 0.0, m_new).astype(acc_t, copy=False)
            p = np.exp(s - base[..., None])
            alpha = np.exp(m - base)  # 0 for a row's first finite block (m = -inf)
            lsum = lsum * alpha + p.sum(axis=-1)
            acc = acc * alpha[..., None] + p @ vg[..., j0:j1, :]
            m = m_new
        out[..., i0:i1, :] = acc / np.where(lsum == 0, 1.0, lsum)[..., None]  # every key masked: zeros
    return out.reshape(B, H, L, Ev).astype(problem.dtype, copy=False)


def cost(problem: Problem, config: Any) -> float:
    """BLAS for the products, plus NumPy's exp (libm, about 6 ns a score) and the Python steps of
    the block loops (about 150 us each, small batched matmuls included)."""
    from opruntime.ops import OPS

    op = OPS["scaled_dot_product_attention"]
    B, H, L, _ = problem.out_shape
    S, E = problem.shapes[1][-2:]
    scores = op.flops(problem) / (2.0 * (E + problem.out_shape[-1]))
    kb = min(S, KEY_BLOCK)
    qb = max(1, min(L, max(16, TILE // max(1, B * H * kb))))
    steps = -(-L // qb) * -(-S // kb)
    return roofline(op.flops(problem), op.bytes(problem), CPU_FLOPS, CPU_BYTES, 2e-5) + scores * 6e-9 + steps * 1.5e-4


#: (query rows, keys) per tile of the numba kernel the tuner tries; the heuristic takes the first.
#: Measured (interleaved rounds, one process) on 1x4x512x64 / 2x12x1024x64 / 1x12x2048x64 causal:
#: 64 x 1024 1.15 / 21.7 / 39.3 ms, 64 x 256 1.24 / 23.1 / 43.1, 96 x 512 1.20 / 22.3 / 38.8,
#: 48 x 1024 1.20 / 23.0 / 42.0. 64-row BLAS calls run at about 120 GFLOP/s a core here; a
#: 64 x 1024 float32 score tile is 256 KB (in L2 beside the blocks of k and v).
NUMBA_CONFIGS = ({"qblock": 64, "kblock": 1024}, {"qblock": 64, "kblock": 256}, {"qblock": 96, "kblock": 512},
                 {"qblock": 32, "kblock": 512})
#: below this many flops a call runs in the calling thread alone (a thread hand-off costs ~30 us)
NUMBA_SERIAL_FLOPS = 4e6


def _tasks(problem: Problem, qblock: int) -> int:
    """(batch, head, pair of query blocks) tasks of :func:`._nb_attention.flash`."""
    B, H, L, _ = problem.out_shape
    nqb = -(-L // qblock)
    return B * H * ((nqb + 1) // 2 if problem.attrs["causal"] else nqb)


def prepare_numba(problem: Problem, config: Any) -> Any:
    """The launcher of ``numpy.scaled_dot_product_attention.numba``: q, k, v as they come when
    C-contiguous, else gathered in parallel in their own memory order (:func:`._nb_attention.gather`:
    NumPy's copies of the strided q, k, v of a GPT-2 block took 17-40 ms, the loop reading them in
    place 15 ms more than contiguous ones), the output a (B, L, H, Ev) array returned as its (B, H, L, Ev)
    view (as torch's: the heads joined after by a view, not a 25 MB copy), the tasks cut into contiguous
    pieces that the calling thread and the pool's threads take in turn (:func:`.conv.split`), each
    piece one call of the nogil loop, scipy's BLAS held to one thread meanwhile (:mod:`._blas`);
    one call in the calling thread where that is not possible or not worth it."""
    from opruntime.ops import OPS

    from . import _blas
    from .conv import split

    nb = jit.loops("_nb_attention")
    cfg = config or NUMBA_CONFIGS[0]
    qblock, kblock = int(cfg["qblock"]), int(cfg["kblock"])
    acc_t = np.dtype(np.float32 if problem.dtype == "float16" else problem.dtype)
    kind = {None: 0, "bool": 1, "float": 2}[problem.attrs["mask"]]
    scale, causal = acc_t.type(problem.attrs["scale"]), problem.attrs["causal"]
    absent = np.zeros((1, 1, 1, 1), acc_t)
    B, H, L, Ev = problem.out_shape
    blhe = (B, L, H, Ev)
    tasks = _tasks(problem, qblock)
    flops = OPS["scaled_dot_product_attention"].flops(problem)
    spread = split(tasks, flops if flops >= NUMBA_SERIAL_FLOPS and _blas.controllable() else 0.0)

    def contiguous(*arrays: np.ndarray) -> list[np.ndarray]:
        """Each array itself when C-contiguous, else gathered by the threads in its memory order
        into one block for all (from :func:`.buffers.empty`: a GPT-2 block's three 25 MB copies
        into fresh arrays faulted their pages in, 24 ms against 6)."""
        strided = [a for a in arrays if not a.flags.c_contiguous]
        if not strided:
            return list(arrays)
        block = buffers.empty((sum(a.size for a in strided),), acc_t)
        out, at = [], 0
        for a in arrays:
            if a.flags.c_contiguous:
                out.append(a)
                continue
            dst = block[at:at + a.size].reshape(a.shape)
            at += a.size
            tasks = a.shape[0] * -(-a.shape[2] // 64)
            split(tasks, a.size * 64.0)(nb.gather, a, dst)  # (a copy's flops: few elements stay in one thread)
            out.append(dst)
        return out

    @np.errstate(invalid="ignore", over="ignore", divide="ignore")
    def launch(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        q, k, v = contiguous(*(a.astype(acc_t, copy=False) for a in (q, k, v)))
        if mask is None:
            mask = absent
        else:
            mask = np.ascontiguousarray(mask, None if mask.dtype == np.bool_ else acc_t)
        out = buffers.empty(blhe, acc_t).transpose(0, 2, 1, 3)  # (B, H, L, Ev) seen in (B, L, H, Ev) memory
        with _blas.one_thread():
            spread(nb.flash, q, k, v, mask, out, scale, causal, kind, qblock, kblock)
        return out.astype(problem.dtype, copy=False)

    return jit.first_use("numpy.scaled_dot_product_attention.numba", launch)


def numba_cost(problem: Problem, config: Any) -> float:
    """BLAS on the tiles at about 120 GFLOP/s a core (less for blocks of few rows: a decode step's
    1 x S products read the keys at memory speed), the causal diagonal tiles counted whole, the
    vectorized exps (about 0.5 ns a score on a core) and a thread hand-off."""
    from opruntime.ops import OPS

    op = OPS["scaled_dot_product_attention"]
    cfg = config or NUMBA_CONFIGS[0]
    B, H, L, Ev = problem.out_shape
    S, E = problem.shapes[1][-2:]
    rows = max(1, min(L, int(cfg["qblock"])))
    cores = max(1, min(jit.threads(), _tasks(problem, int(cfg["qblock"]))))
    flops = op.flops(problem)
    scores = flops / (2.0 * max(1, E + Ev))
    if problem.attrs["causal"]:  # the diagonal tiles: half of each is computed and cut
        waste = B * H * -(-L // rows) * rows * rows / 2.0
        scores, flops = scores + waste, flops + waste * 2.0 * (E + Ev)
    rate = 120e9 * cores * min(1.0, rows / 64.0) ** 0.5
    return roofline(flops, op.bytes(problem), rate, CPU_BYTES, 1e-5) + scores * 5e-10 / cores


def kernels() -> list[Kernel]:
    out = [Kernel("scaled_dot_product_attention", "numpy.scaled_dot_product_attention.blocked", "cpu", FLOATS,
                  attention, cost=cost)]
    if jit.available():
        out.append(Kernel("scaled_dot_product_attention", "numpy.scaled_dot_product_attention.numba", "cpu", FLOATS,
                          prepare=prepare_numba, cost=numba_cost, configs=NUMBA_CONFIGS,
                          source=jit.source("_nb_rows", "_nb_attention"),
                          notes=jit.notes("numpy.scaled_dot_product_attention.numba")))
    return out
