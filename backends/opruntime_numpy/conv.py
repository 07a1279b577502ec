"""conv2d on the CPU: an im2col + GEMM path over a strided window view (any attributes; the
columns are built per cache-sized chunk of the batch), a 1x1 path (one batched GEMM, no column
buffer) and a depthwise path (one multiply-add per kernel tap over the whole batch). No Python
loop runs over single images or channels. Each ends in the same epilogue: the bias and the
activation, in place.

With numba (:mod:`.jit`), two direct kernels join them: ``numpy.conv2d.numba_depthwise`` (groups
== C: each parallel task copies one image's plane into a zero-padded buffer in cache and builds
every output row from rows of taps, vectorized, bias and activation applied to the row while it
is in cache: one read of the input and one write of the output, where the NumPy depthwise path
reads the input once per tap and im2col writes and reads the columns) and
``numpy.conv2d.numba_direct`` (at most :data:`DIRECT_CHANNELS` input channels per group, e.g. the
3-channel 7x7 stem: a register-blocked direct convolution, strips of output positions by output
channels summed over every tap in vector registers from a tile of the input's stride phases,
:func:`._nb_conv.direct_strips`).

Four GEMM kernels join them, all on numba's threads (one pool for every numba kernel: after a
parallel region its OpenMP workers spin a while, and on 2 cores another pool's threads then wait
for a core), each task's BLAS call in its own thread (scipy's OpenBLAS held to one thread,
:mod:`._blas`), the bias and ReLU applied to each block while it is in cache, no NumPy BLAS:

* ``numpy.conv2d.numba_gemm`` (stride 1): a 1x1 conv as GEMMs reading the input's channels and
  writing the output in place (no column buffer), or (configs ``strips``, maps of 512 positions
  and more) with no BLAS: strips of output positions by output channels summed in vector registers
  over the input channels, the bias and ReLU added before the one store
  (:func:`._nb_conv.pointwise_strips`: a short reduction, 64 channels, leaves BLAS packing more
  than it computes); any other as one GEMM per kernel tap on a zero-padded block of rows, the
  tap's shifted window read through the GEMM's leading dimension;
* ``numpy.conv2d.numba_im2col``: per block of output rows or positions, the columns copied from
  the block's stride phases (strided convs: one contiguous copy per tap and channel) or gathered
  (stride 1, small maps), then one GEMM;
* ``numpy.conv2d.numba_batch``: the whole batch's columns, then one GEMM per block of output
  channels over every position (the weights packed once: 1x1 convs with large weights on 7 x 7);
* ``numpy.conv2d.numba_winograd``: Winograd F(2x2, 3x3) or F(4x4, 3x3) (config ``tile``), 16 or 36
  GEMMs on transformed tiles (F(4x4)'s fused per block of tiles, in cache).

The cost models (fitted on ResNet-50's layers at batch 4, inside the model) choose per shape; the
NumPy BLAS paths are charged :data:`BLAS_THREADS_PENALTY` for the spinning threads they leave.
"""

from __future__ import annotations

import itertools
import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from opruntime.kernels import FLOATS, Kernel, Problem, Refusal, itemsize, roofline

from . import buffers, jit
from .epilogue import activate
from .matmul import CPU_BYTES, CPU_FLOPS
from .memory import compute_dtype

#: input channels per group up to which the direct numba kernel is offered
DIRECT_CHANNELS = 16


def _prepare(problem: Problem, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, slack: int = 0):
    """Operands in the compute dtype, ``x`` zero-padded. With ``slack``, ``x`` is always a view of
    the first elements of a contiguous flat buffer (returned too) that has ``slack`` more."""
    dt = compute_dtype(problem.dtype)
    x, w = x.astype(dt, copy=False), w.astype(dt, copy=False)
    pt, pb, pl, pr = problem.attrs["padding"]
    flat = None
    if pt or pb or pl or pr or slack:
        n, c, h, wd = x.shape
        shape = (n, c, h + pt + pb, wd + pl + pr)
        flat = np.zeros(math.prod(shape) + slack, dt)
        xp = flat[: math.prod(shape)].reshape(shape)
        xp[:, :, pt : pt + h, pl : pl + wd] = x
        x = xp
    return x, w, (None if bias is None else bias.astype(dt, copy=False)), flat


def _finish(problem: Problem, out: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """The epilogue, in place in the compute dtype: the bias, then the activation."""
    if bias is not None:
        out += bias.reshape(1, -1, 1, 1)
    with np.errstate(over="ignore", invalid="ignore"):
        activate(problem.attrs.get("activation"), out)
    return out.astype(problem.dtype, copy=False)


def _windows(x: np.ndarray, problem: Problem, kh: int, kw: int) -> np.ndarray:
    """A (N, C, kh, kw, Ho, Wo) view of the padded input: no copy."""
    (sh, sw), (dh, dw) = problem.attrs["stride"], problem.attrs["dilation"]
    _, _, ho, wo = problem.out_shape
    n, c = x.shape[:2]
    s0, s1, s2, s3 = x.strides
    return as_strided(x, (n, c, kh, kw, ho, wo), (s0, s1, s2 * dh, s3 * dw, s2 * sh, s3 * sw), writeable=False)


#: Column-buffer budgets (bytes) the tuner tries; the heuristic takes the first. A budget that
#: keeps one chunk's columns in the last-level cache lets the GEMM read them from cache; ``None``
#: builds the columns of the whole batch at once.
IM2COL_CONFIGS = ({"cols_bytes": 4 << 20}, {"cols_bytes": 1 << 20}, {"cols_bytes": 16 << 20}, {"cols_bytes": None})


class Taps:
    """The input seen once per kernel tap, for the paths that sum over taps (im2col, depthwise).

    ``views[t]`` is (N, G, C/G, *plane) for tap ``t``: with stride 1 the plane is *wide*, one
    contiguous run of ``Ho * Wp`` values of the flattened padded image shifted by the tap's offset
    (output row ``y`` is computed at every one of the ``Wp`` padded columns, the first ``Wo`` are
    kept, and the values read past a row's end never reach a kept column); otherwise the plane is
    the window view's (Ho, Wo) at the tap. ``crop`` turns a (..., span) result into (..., Ho, Wo). Long contiguous runs keep NumPy's inner loops long: a copy or a multiply over
    (Ho, Wo) planes runs one short inner loop per output row.
    """

    def __init__(self, problem: Problem, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> None:
        g = problem.attrs["groups"]
        (sh, sw), (dh, dw) = problem.attrs["stride"], problem.attrs["dilation"]
        _, cg, kh, kw = problem.shapes[1]
        n, _, ho, wo = problem.out_shape
        self.wide = sh == sw == 1 and kw > 1
        x, self.w, self.bias, flat = _prepare(problem, x, w, bias, slack=(kw - 1) * dw if self.wide else 0)
        self.dtype, self.count = x.dtype, kh * kw
        hp, wp = x.shape[2:]
        self.ho, self.wo, self.wp = ho, wo, wp
        self.plane = (ho * wp,) if self.wide else (ho, wo)
        self.span = math.prod(self.plane)
        if self.wide:
            it = x.itemsize
            strides = (x.strides[0], cg * hp * wp * it, hp * wp * it, it)
            self.views = [as_strided(flat[i * dh * wp + j * dw :], (n, g, cg, self.span), strides, writeable=False)
                          for i in range(kh) for j in range(kw)]
        else:
            win = _windows(x, problem, kh, kw).reshape(n, g, cg, kh, kw, ho, wo)
            self.views = [win[:, :, :, i, j] for i in range(kh) for j in range(kw)]

    def crop(self, a: np.ndarray) -> np.ndarray:
        """(..., span) -> (..., Ho, Wo): the kept columns of a wide plane (a view)."""
        if self.wide:
            return a.reshape(*a.shape[:-1], self.ho, self.wp)[..., : self.wo]
        return a.reshape(*a.shape[:-1], self.ho, self.wo)


def _chunk(n: int, per_image: int, budget: int | None) -> int:
    """Images per chunk: as many as fit ``budget`` bytes (at least one; all without a budget)."""
    return max(1, n if budget is None else min(n, budget // max(1, per_image)))


def im2col(problem: Problem, config: Any, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """im2col + GEMM over a chunk of images at a time.

    The columns are copied tap by tap from :class:`Taps` (wide, memcpy-like runs with stride 1)
    into a buffer of at most ``config["cols_bytes"]`` (one image when a single image is larger),
    and each chunk's GEMM writes straight into the output (through a crop when wide). The loop
    runs over cache-sized chunks of the batch, not over images or channels: for a batch that fits
    the budget it runs once.
    """
    g = problem.attrs["groups"]
    o, cg = problem.shapes[1][:2]
    n = problem.out_shape[0]
    og, taps = o // g, Taps(problem, x, w, bias)
    kk = taps.count
    # weights ordered (g, og | tap, c) to match the columns (tap, c | y, x)
    wm = np.ascontiguousarray(taps.w.reshape(g, og, cg, kk).transpose(0, 1, 3, 2)).reshape(g, og, kk * cg)
    chunk = _chunk(n, g * kk * cg * taps.span * taps.dtype.itemsize, config.get("cols_bytes") if config else None)
    cols = np.empty((chunk, g, kk, cg, *taps.plane), taps.dtype)
    out = np.empty(problem.out_shape, taps.dtype)
    wide_out = np.empty((chunk, g, og, taps.span), taps.dtype) if taps.wide else None
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        for t, view in enumerate(taps.views):
            cols[:m, :, t] = view[start : start + m]
        dest = wide_out[:m] if taps.wide else out[start : start + m].reshape(m, g, og, taps.span)
        np.matmul(wm, cols[:m].reshape(m, g, kk * cg, taps.span), out=dest)
        if taps.wide:
            out[start : start + m] = taps.crop(dest.reshape(m, o, taps.span))
    return _finish(problem, out, taps.bias)


def is_pointwise(problem: Problem) -> bool:
    return problem.shapes[1][2:] == (1, 1) and not any(problem.attrs["padding"])


def pointwise(problem: Problem, config: Any, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    x, w, bias, _ = _prepare(problem, x, w, bias)
    (sh, sw), g = problem.attrs["stride"], problem.attrs["groups"]
    n, o, ho, wo = problem.out_shape
    xs = x[:, :, : sh * (ho - 1) + 1 : sh, : sw * (wo - 1) + 1 : sw]
    cg = w.shape[1]
    xs = xs.reshape(n, g, cg, ho * wo)  # a copy only when strided
    out = np.matmul(w.reshape(g, o // g, cg), xs)  # (n, g, og, ho*wo)
    return _finish(problem, out.reshape(n, o, ho, wo), bias)


def is_depthwise(problem: Problem) -> bool:
    c, g = problem.shapes[0][1], problem.attrs["groups"]
    return g == c and problem.shapes[1][1] == 1


#: Bytes of accumulator per chunk the tuner tries for the depthwise path (heuristic: the first).
DEPTHWISE_CONFIGS = ({"chunk_bytes": 1 << 20}, {"chunk_bytes": 4 << 20}, {"chunk_bytes": 256 << 10})
_pool: list[ThreadPoolExecutor] = []


def _threads() -> ThreadPoolExecutor:
    """One pool for the process: NumPy's ufunc loops release the GIL, so chunks run in parallel."""
    if not _pool:
        _pool.append(ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="opruntime-numpy"))
    return _pool[0]


def depthwise(problem: Problem, config: Any, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """Depthwise (and channel-multiplier) conv: per chunk of images, one multiply-add per kernel
    tap into an accumulator of at most ``config["chunk_bytes"]`` that stays in cache, the chunks
    spread over the cores. The taps are :class:`Taps`, so with stride 1 every multiply runs over
    whole wide planes."""
    c = problem.shapes[0][1]
    o = problem.shapes[1][0]
    n = problem.out_shape[0]
    mult, taps = o // c, Taps(problem, x, w, bias)
    lead = (1, c, mult) + (1,) * len(taps.plane)
    wt = [taps.w.reshape(c, mult, taps.count)[:, :, t].reshape(lead) for t in range(taps.count)]
    out = np.empty(problem.out_shape, taps.dtype)
    chunk = _chunk(n, 2 * o * taps.span * taps.dtype.itemsize, config.get("chunk_bytes") if config else None)

    def run(start: int) -> None:
        m = min(chunk, n - start)
        acc = np.empty((m, c, mult, *taps.plane), taps.dtype)
        tmp = np.empty_like(acc) if taps.count > 1 else None
        np.multiply(taps.views[0][start : start + m], wt[0], out=acc)  # views: (m, c, 1, *plane)
        for t in range(1, taps.count):
            np.multiply(taps.views[t][start : start + m], wt[t], out=tmp)
            acc += tmp
        out[start : start + m] = taps.crop(acc.reshape(m, o, taps.span))

    starts = range(0, n, chunk)
    if len(starts) > 1:
        list(_threads().map(run, starts))
    elif starts:
        run(0)
    return _finish(problem, out, taps.bias)


def _bytes(problem: Problem, extra: float = 0.0) -> float:
    n = sum(math.prod(s) for s in problem.shapes) + math.prod(problem.out_shape)
    return (n + extra) * itemsize(problem.dtype)


def _flops(problem: Problem) -> float:
    _, cg, kh, kw = problem.shapes[1]
    return 2.0 * math.prod(problem.out_shape) * cg * kh * kw


#: rates the conv cost models use (this 2-core machine, float32; they rank the CPU kernels): BLAS
#: on whole-image GEMMs (NumPy's, both cores), BLAS on one block per thread (numba_im2col), and
#: the memory passes of copies and NumPy epilogues
GEMM_RATE, BLOCK_GEMM_RATE, PASS_BYTES = 250e9, 200e9, 20e9


#: what a call of NumPy's BLAS (two threads) costs the kernels after it, where numba's kernels are
#: the alternative: its threads keep spinning for about 0.1 s after each call and on 2 cores take
#: a core from the next kernel's threads (numba's, or the next BLAS call's): ResNet-50 batch 4 ran
#: 221 ms with its 2048 -> 512 1x1 and stride-2 3x3 layers on the NumPy paths, 174 ms without
BLAS_THREADS_PENALTY = 1e-3


def _spin(problem: Problem) -> float:
    """:data:`BLAS_THREADS_PENALTY` where the numba kernels are offered and the GEMMs are large
    enough for BLAS to start its threads, else 0."""
    return BLAS_THREADS_PENALTY if jit.available() and _flops(problem) >= SERIAL_FLOPS else 0.0


def _out_bytes(problem: Problem) -> float:
    return math.prod(problem.out_shape) * itemsize(problem.dtype)


def _cols_bytes(problem: Problem) -> float:
    _, cg, kh, kw = problem.shapes[1]
    n, _, ho, wo = problem.out_shape
    return problem.attrs["groups"] * cg * kh * kw * n * ho * wo * itemsize(problem.dtype)


def im2col_cost(problem: Problem, config: Any) -> float:
    """The GEMMs (slower on few positions per chunk: BLAS on (O x K) @ (K x N) wants N in the
    hundreds), the columns written and read, the output written and its NumPy epilogue (bias,
    activation: two more passes). Measured on ResNet-50's layers at batch 4: within 25 %."""
    _, cg, kh, kw = problem.shapes[1]
    n, _, ho, wo = problem.out_shape
    g = problem.attrs["groups"]
    per_image = g * kh * kw * cg * ho * (wo + kw - 1) * itemsize(problem.dtype)
    positions = _chunk(n, per_image, (config or IM2COL_CONFIGS[0]).get("cols_bytes")) * ho * (wo + kw - 1)
    rate = GEMM_RATE * min(1.0, positions / 512.0) ** 0.5 * min(1.0, problem.shapes[1][0] / g / 64.0)
    chunk_bytes = positions / (ho * (wo + kw - 1)) * per_image
    cols_rate = PASS_BYTES if chunk_bytes <= 4 << 20 else PASS_BYTES / 2  # columns past the caches
    return _flops(problem) / rate + 2 * _cols_bytes(problem) / cols_rate + 5 * _out_bytes(problem) / PASS_BYTES \
        + 1e-5 + _spin(problem)


def pointwise_cost(problem: Problem, config: Any) -> float:
    """One batched GEMM, the input read (copied first when strided), the output written and its
    NumPy epilogue (two more passes): 64 -> 256 channels on 4 x 56 x 56 measured 3.8 ms, 1024 ->
    256 on 4 x 14 x 14 1.7 ms (the same flops: the output's passes differ)."""
    x = math.prod(problem.shapes[0]) * itemsize(problem.dtype) * (1 if problem.attrs["stride"] == (1, 1) else 2)
    return _flops(problem) / (GEMM_RATE * 1.2) + (x + 5 * _out_bytes(problem)) / PASS_BYTES + 5e-6 + _spin(problem)


def depthwise_cost(problem: Problem, config: Any) -> float:
    """One read of the input per tap; the accumulators stay in cache (measured 2.5-3x faster than
    im2col on the 3x3 depthwise layer of the CPU suite)."""
    _, _, kh, kw = problem.shapes[1]
    return roofline(_flops(problem), _bytes(problem, kh * kw * math.prod(problem.out_shape)),
                    CPU_FLOPS / 4, CPU_BYTES, 5e-6)


def is_direct(problem: Problem) -> bool:
    return problem.shapes[1][1] <= DIRECT_CHANNELS and not is_depthwise(problem)


#: below this many flops a numba loop runs in the calling thread alone (a hand-off costs ~30 us)
SERIAL_FLOPS = 2e6


#: pieces per thread that :func:`split` cuts a range of tasks into
PIECES_PER_THREAD = 3


def split(tasks: int, flops: float) -> Any:
    """``run(loop, *args)``: ``loop(*args, first, last)`` over ``range(tasks)`` cut into
    :data:`PIECES_PER_THREAD` contiguous pieces per thread, which the calling thread and the pool's
    threads take in turn until none is left (the loops are nogil), or one call for few flops. A
    thread that starts late (its core busy with another pool's spinning threads) takes fewer
    pieces instead of holding the call up. The loops are plain ``@njit``, not ``parallel=True``
    (see :mod:`._nb_conv`)."""
    workers = 1 if flops < SERIAL_FLOPS else max(1, min(jit.threads(), tasks))
    pieces = min(tasks, workers * PIECES_PER_THREAD)
    bounds = [tasks * i // max(1, pieces) for i in range(pieces + 1)]

    def run(loop: Any, *args: Any) -> None:
        if workers == 1:
            loop(*args, 0, tasks)
            return
        counter = itertools.count()  # next() on it is atomic under the GIL

        def take() -> None:
            while (i := next(counter)) < pieces:
                loop(*args, bounds[i], bounds[i + 1])

        rest = [_threads().submit(take) for _ in range(1, workers)]
        take()
        for f in rest:
            f.result()

    return run


#: ranges of (image, channel) tasks per thread of ``numba_depthwise`` (cut evenly: see prepare_numba)
DEPTHWISE_PIECES = 1


def prepare_numba(problem: Problem, config: Any) -> Any:
    """The launcher of ``numpy.conv2d.numba_depthwise``: the loops on numba's threads, one range of
    tasks each, through :func:`._nb_conv.par_depthwise` (by address). On Python threads (the pool
    of :func:`split`) two threads ran the cpu suite's 8 x 64 x 56 x 56 no faster than one."""
    nb, code, fused = _loops(problem)
    (sh, sw), (dh, dw) = problem.attrs["stride"], problem.attrs["dilation"]
    pt, pb, pl, pr = problem.attrs["padding"]
    _, _, h, wd = problem.shapes[0]
    o, cg, kh, kw = problem.shapes[1]
    hp, wp = h + pt + pb, wd + pl + pr
    dt = compute_dtype(problem.dtype)
    wide = sh == sw == 1  # each specialization compiles on its own first use
    tasks = problem.out_shape[0] * problem.shapes[0][1]
    pieces = 1 if _flops(problem) < SERIAL_FLOPS else max(1, min(tasks, jit.threads() * DEPTHWISE_PIECES))

    @np.errstate(over="ignore", invalid="ignore")
    def launch(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        x = x.astype(dt, copy=False)
        w = np.ascontiguousarray(w, dt)
        b = np.zeros(0, dt) if bias is None else np.ascontiguousarray(bias, dt)
        out = buffers.empty(problem.out_shape, dt)
        loop = nb.depthwise_wide if wide else nb.depthwise_rows
        args = (x, w.reshape(o, kh, kw), b, out, sh, sw, dh, dw, pt, pl, hp, wp, fused)
        if pieces == 1:
            loop(*args, 0, tasks)
        else:
            jit.call(nb.par_depthwise, nb.task(loop, *args), *args, tasks, pieces)
        _activate_rest(out, b, code, fused)
        return out.astype(problem.dtype, copy=False)

    return jit.first_use("numpy.conv2d.numba_depthwise", launch)


#: the largest tile of stride phases a task of ``numba_direct`` copies its input into (bytes; the
#: block's wide output planes beside it, both in L2). The stem, alternating budgets: 2.79 ms at
#: batch 4 and 6.05 at batch 8 with 128 KB (20 rows a task), 3.04 and 6.33 with 1 MB (56, 112
#: rows), 2.99 and 6.68 with 64 KB (8 rows); level at batch 1 (14 rows: four tasks a thread)
DIRECT_TILE_BYTES = 128 << 10


def _strip_shape(size: int) -> tuple[int, int]:
    """(output channels, wide positions) of a strip of ``numba_direct`` for ``size``-byte values:
    :mod:`._nb_conv`'s, once it is loaded (AVX-512: 8 channels by 3 vectors of 64 bytes; AVX2: 4
    by 3 of 32), else AVX-512's (the cost models run before any numba kernel is prepared)."""
    import sys

    nb = sys.modules.get(f"{__package__}._nb_conv")
    vector, channels = (nb.VECTOR_BYTES, nb.STRIP_CHANNELS) if nb is not None else (64, 8)
    return channels, 3 * vector // size


def _direct_plan(problem: Problem) -> tuple[int, int, int, int, int]:
    """(kv, rows, rt, wq, tasks) of ``numba_direct``: output channels per strip
    (:func:`_strip_shape`), output rows per task (four tasks a thread where the batch gives fewer, the tile
    within :data:`DIRECT_TILE_BYTES`), the tile's rows and row length per phase, the task count."""
    _, c, h, wd = problem.shapes[0]
    _, cg, kh, kw = problem.shapes[1]
    g = problem.attrs["groups"]
    n, _, ho, _ = problem.out_shape
    (sh, sw), (dh, _) = problem.attrs["stride"], problem.attrs["dilation"]
    _, _, pl, pr = problem.attrs["padding"]
    size = np.dtype(compute_dtype(problem.dtype)).itemsize
    kv = _strip_shape(size)[0]
    wq = max(1, -(-(wd + pl + pr) // sw))
    reach = dh * (kh - 1) // sh  # the phase rows a block reads past its own
    want = -(-4 * jit.threads() // max(1, n * g))
    fit = DIRECT_TILE_BYTES // max(1, cg * sh * sw * wq * size) - reach
    rows = max(1, min(ho, -(-ho // want), fit))
    return kv, rows, rows + reach, wq, n * g * -(-ho // rows)


def prepare_numba_direct(problem: Problem, config: Any) -> Any:
    """The launcher of ``numpy.conv2d.numba_direct`` (:func:`._nb_conv.direct_strips`): the weights
    arranged (group, block of ``kv`` output channels, tap, channel) once per call (64 x 3 x 7 x 7
    for the stem: 9408 values), each tap's offset in a task's tile of stride phases computed here
    once, then tasks of (image, group, block of output rows) on numba's threads."""
    nb, code, fused = _loops(problem)
    (sh, sw), (dh, dw) = problem.attrs["stride"], problem.attrs["dilation"]
    pt, _, pl, _ = problem.attrs["padding"]
    o, cg, kh, kw = problem.shapes[1]
    g = problem.attrs["groups"]
    og = o // g
    dt = compute_dtype(problem.dtype)
    kv, rows, rt, wq, tasks = _direct_plan(problem)
    kblocks = -(-og // kv)
    ci, ti, tj = (a.reshape(-1) for a in np.meshgrid(np.arange(cg), np.arange(kh), np.arange(kw), indexing="ij"))
    toff = (((ci * sh + dh * ti % sh) * sw + dw * tj % sw) * rt * wq + dh * ti // sh * wq + dw * tj // sw)
    toff = np.ascontiguousarray(toff, np.int64)
    pieces = 1 if _flops(problem) < SERIAL_FLOPS else max(1, min(tasks, jit.threads() * PIECES_PER_THREAD * 2))

    @np.errstate(over="ignore", invalid="ignore")
    def launch(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        x = x.astype(dt, copy=False)
        wt = np.zeros((g, kblocks * kv, cg * kh * kw), dt)
        wt[:, :og] = np.asarray(w, dt).reshape(g, og, cg * kh * kw)
        wt = np.ascontiguousarray(wt.reshape(g, kblocks, kv, cg * kh * kw).transpose(0, 1, 3, 2))
        b = np.zeros(0, dt) if bias is None else np.ascontiguousarray(bias, dt)
        out = buffers.empty(problem.out_shape, dt)
        if out.size:
            run_tasks(nb, nb.par_direct, nb.direct_strips, (x, wt, toff, b, out, sh, sw, pt, pl, rows, rt, wq, g,
                      fused), tasks, pieces)
            _activate_rest(out, b, code, fused)
        return out.astype(problem.dtype, copy=False)

    return jit.first_use("numpy.conv2d.numba_direct", launch)


#: Column-block budgets (bytes) of ``numpy.conv2d.numba_im2col`` the tuner tries; the heuristic
#: takes the first: 1 MB, half the core's 2 MB L2, which leaves room for BLAS's packed blocks. The
#: strided layers that take this kernel in ResNet-50 at batch 4, alone, alternating config by
#: config: the 7x7 stem 5.05 ms at 1 MB against 6.35 at 2 MB and 6.75 at 4 MB (its columns, 147
#: rows, spill L2 past 1 MB; at batch 1 1.41 against 1.53), the 3x3 stride-2 layers and the 1x1
#: stride-2 one level (within 3 %). ``images``: blocks of that many whole images instead (small
#: maps, :func:`._nb_conv.images_gemm`)
NUMBA_IM2COL_CONFIGS = ({"cols_bytes": 1 << 20}, {"cols_bytes": 2 << 20}, {"cols_bytes": 512 << 10},
                        {"cols_bytes": 4 << 20}, {"images": 2})



def _loops(problem: Problem) -> tuple[Any, int, int]:
    """The conv loops' module, the activation's code, and the code the loops fuse themselves (the
    activations of ``FUSED``; 0 for the others, which :func:`_activate_rest` applies after)."""
    nb = jit.loops("_nb_conv")
    code = jit.loops("_nb_elementwise").CODES[problem.attrs.get("activation")]
    return nb, code, (code if code in nb.FUSED else 0)


def _activate_rest(out: np.ndarray, b: np.ndarray, code: int, fused: int) -> None:
    """The activation the numba loops did not apply (they fuse ``fused``), one pass over ``out``
    (N, O, Ho, Wo) after them; the bias is already in."""
    if code != fused and out.size:
        jit.call(jit.loops("_nb_elementwise").bias_act_rows, out.reshape(-1, out.shape[-2] * out.shape[-1]), b[:0],
                 code)

def _block(problem: Problem, config: Any) -> int:
    """Output positions per block of ``numba_im2col``: the columns within ``cols_bytes`` (at least
    64 positions; whole images where they fit)."""
    _, cg, kh, kw = problem.shapes[1]
    _, _, ho, wo = problem.out_shape
    budget = (config or NUMBA_IM2COL_CONFIGS[0])["cols_bytes"]
    nb = max(64, budget // max(1, cg * kh * kw * itemsize(problem.dtype)))
    return max(1, min(ho * wo, nb))


def is_not_depthwise(problem: Problem) -> bool | Refusal:
    """``numba_im2col`` takes any grouped convolution but the depthwise ones; the cost models
    send it the strided ones (the 7x7 stem, ResNet's stride-2 3x3 and 1x1 layers), where the
    stride-1 path (``numba_gemm``) does not apply."""
    if is_depthwise(problem):
        return Refusal("depthwise: numba_depthwise")
    return True


#: input channels per group from which ``numba_im2col``'s strided path runs one GEMM per tap on the
#: phase rows in place (K = C/g) instead of copying the columns (K = C/g * kh * kw), for weights of
#: at most ``TAPS_GEMM_BYTES`` (reordered per call, and each tap's GEMM packs its share per task:
#: 512 channels 3x3 stride 2 on 4 x 14 x 14 took 8.8 ms per tap, 4.8 with the columns; 128 on 4 x 56 x
#: 56: 4.7 per tap, 4.9 with the columns)
TAPS_GEMM_CHANNELS, TAPS_GEMM_BYTES = 32, 1 << 20
#: output positions (the GEMM's N) per block of ``numba_im2col``'s strided path at least, where the
#: map allows: fewer stream the whole weight matrix for little work (1024 -> 2048 1x1 stride 2 on
#: 4 x 14 x 14, 4 rows of 7 a task: 6.3 ms, whole images: 4.1)
MIN_POSITIONS = 128


def _phase_plan(problem: Problem, config: Any) -> tuple[int, int, int]:
    """(wq, rows, tasks) of ``numba_im2col``'s strided path: the phase rows' length, output rows
    per block (the block's columns and output within ``cols_bytes``; cut finer where the batch
    gives the threads fewer than four tasks each) and the task count."""
    _, cg, kh, kw = problem.shapes[1]
    g = problem.attrs["groups"]
    n, o, ho, _ = problem.out_shape
    sw = problem.attrs["stride"][1]
    pl, pr = problem.attrs["padding"][2:]
    wq = -(-(problem.shapes[0][3] + pl + pr) // sw)
    budget = (config or NUMBA_IM2COL_CONFIGS[0])["cols_bytes"]
    want = -(-4 * jit.threads() // max(1, n * g))  # the stem at batch 1: 8 rows a task, 1.12 ms (21: 1.3)
    rows = min(budget // ((cg * kh * kw + o // g) * wq * itemsize(problem.dtype)), -(-ho // want))
    rows = max(1, min(ho, max(rows, -(-MIN_POSITIONS // wq))))
    return wq, rows, n * g * -(-ho // rows)


def prepare_numba_im2col(problem: Problem, config: Any) -> Any:
    """The launcher of ``numpy.conv2d.numba_im2col``: tasks (image, group, block of output
    positions or rows) cut into ranges run on numba's threads, each range one call of a plain
    loop (gather or copy the block's columns, BLAS in the calling thread, epilogue, all in cache),
    scipy's BLAS held to one thread meanwhile (:mod:`._blas`). Strided convolutions copy their
    columns from the block's stride phases (:func:`._nb_conv.phase_gemm`; 1x1 convs read the phase
    in place, :func:`._nb_conv.phase_1x1`; many channels run a GEMM per tap on the phases,
    :func:`._nb_conv.phase_taps`), the others gather them
    (:func:`._nb_conv.im2col_gemm`, no wide columns: best on small maps, 7 x 7). Where the BLAS
    threads cannot be held (another BLAS), one range."""
    from . import _blas

    nb, code, fused = _loops(problem)
    (sh, sw), (dh, dw) = problem.attrs["stride"], problem.attrs["dilation"]
    pt, _, pl, _ = problem.attrs["padding"]
    o, cg, kh, kw = problem.shapes[1]
    g = problem.attrs["groups"]
    n, _, ho, wo = problem.out_shape
    dt = compute_dtype(problem.dtype)
    images = (config or {}).get("images")
    phased = (sh, sw) != (1, 1) and not images
    taps_gemm = kh * kw > 1 and cg >= TAPS_GEMM_CHANNELS and o * cg * kh * kw * itemsize(problem.dtype) <= TAPS_GEMM_BYTES
    if images:
        block, tasks = images, g * -(-n // images)
    elif phased:
        wq, block, tasks = _phase_plan(problem, config)
        # one loop per path, each compiled on its own first use
        phase_loop = "phase_1x1" if kh * kw == 1 else "phase_taps" if taps_gemm else "phase_gemm"
    else:
        block = _block(problem, config)
        tasks = n * g * -(-(ho * wo) // block)
    pieces = _pieces(tasks, problem)

    @np.errstate(over="ignore", invalid="ignore")
    def launch(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        x = x.astype(dt, copy=False) if phased else np.ascontiguousarray(x, dt)
        w2 = np.ascontiguousarray(w, dt).reshape(o, cg * kh * kw)
        b = np.zeros(0, dt) if bias is None else np.ascontiguousarray(bias, dt)
        out = buffers.empty(problem.out_shape, dt)
        if out.size:
            with _blas.one_thread():
                if phased:
                    wt = np.zeros(0, dt)
                    if taps_gemm:
                        wt = np.empty((kh * kw, o, cg), dt)
                        jit.call(nb.reorder_taps, w2.reshape(o, cg, kh * kw), wt)
                    run_tasks(nb, nb.par_phase, getattr(nb, phase_loop), (x, w2.reshape(-1), wt.reshape(-1), b, out, kh,
                              kw, sh, sw, dh, dw, pt, pl, wq, block, g, fused), tasks, pieces)
                else:
                    run_tasks(nb, nb.par_im2col, nb.images_gemm if images else nb.im2col_gemm, (x, w2, b, out, sh, sw,
                              dh, dw, pt, pl, kh, kw, g, block, fused), tasks, pieces)
            _activate_rest(out, b, code, fused)
        return out.astype(problem.dtype, copy=False)

    return jit.first_use("numpy.conv2d.numba_im2col", launch)


def numba_im2col_cost(problem: Problem, config: Any) -> float:
    """GEMMs on blocks in cache (BLAS in each thread), the columns gathered once (from cache), the
    output written once with its epilogue: measured 2.1 ms on the 7x7 stem (im2col 2.5-2.9),
    3.0 ms on a 64 -> 256 1x1 conv on 4 x 56 x 56 (pointwise 3.8), 2.4 ms on 1024 -> 256 on
    4 x 14 x 14 (pointwise 1.7), 6.0 ms on 512 channels 3x3 on 4 x 7 x 7 (im2col 9.5)."""
    base = _flops(problem) / BLOCK_GEMM_RATE + _cols_bytes(problem) / (PASS_BYTES / 2) \
        + _out_bytes(problem) / PASS_BYTES + 2e-5
    images = (config or {}).get("images")
    if not images:
        return base
    # blocks of whole images (:func:`._nb_conv.images_gemm`): the GEMM on images * Ho * Wo columns
    # where the others give it at most one image's, at BLAS's rate on N columns ~ (N / 196) ** 0.25
    # (one thread, 512 x 4608 weights: 125 GFLOP/s on 49, 174 on 196), the output copied once
    # more, and threads idle where there are fewer tasks than threads. Inside ResNet-50 at batch 4
    # (two images a block): 512 channels 3x3 on 7 x 7 5.3-5.6 -> 4.6-4.8 ms, stride 2 from 14 x 14
    # 5.5 -> 5.1; on 14 x 14 outputs (196 columns an image) it lost (4.5 -> 5.3 ms alone), and on
    # 1x1 convs with stride 1, where the GEMM is as slow on either side (2048 -> 512 on 7 x 7: 2.2
    # ms, numba_gemm 2.1, reading the input in place): no gain counted for them. Strided 1x1 convs
    # (K = C, a gather of every sw-th value for columns) run the images' GEMM at the rate of
    # numba_gemm's whole blocks, :data:`BLOCK_GEMM_PEAK` (down on fewer than 196 columns): alone
    # at batch 4, 512 -> 1024 from 28 x 28 2.81 ms in two-image blocks against 3.30-3.39 for the
    # strided path's blocks and 3.48 for numba_batch, 256 -> 512 from 56 x 56 3.03 against
    # 3.16-3.39, 1024 -> 2048 from 14 x 14 3.13 against numba_batch 3.33 (the model: 2.99, 3.47, 3.22)
    n, _, ho, wo = problem.out_shape
    gemm = _flops(problem) / BLOCK_GEMM_RATE
    tasks = problem.attrs["groups"] * -(-n // images)
    if math.prod(problem.shapes[1][2:]) == 1 and problem.attrs["stride"] != (1, 1):
        rate = BLOCK_GEMM_PEAK * min(1.0, min(images, n) * ho * wo / 196.0) ** 0.25
        idle = _flops(problem) / rate * (max(1.0, jit.threads() / max(1, tasks)) - 1.0)
        return base - gemm + _flops(problem) / rate + _out_bytes(problem) / PASS_BYTES + idle
    per_image = min(1.0, ho * wo / 196.0) ** 0.25 if math.prod(problem.shapes[1][2:]) > 1 else 1.0
    per_block = min(1.0, min(images, n) * ho * wo / 196.0) ** 0.25
    idle = gemm * (max(1.0, jit.threads() / max(1, tasks)) - 1.0)
    # a block's columns of at most IMAGES_COLS_BYTES, built from each channel's padded plane in
    # cache, cost half the strided path's per byte: 256 channels 3x3 stride 2 from 28 x 28 (3.6
    # MB a block) 4.30 ms alone against 4.63; larger blocks lose (128 channels from 56 x 56, 7.2 MB:
    # 5.64 against 5.01; the 7x7 stem 9.4 against 5.4)
    _, cg, kh, kw = problem.shapes[1]
    if cg * kh * kw * min(images, n) * ho * wo * itemsize(problem.dtype) <= IMAGES_COLS_BYTES:
        base -= _cols_bytes(problem) / PASS_BYTES
    return base - gemm * (1.0 - per_image / per_block) + _out_bytes(problem) / PASS_BYTES + idle


#: the largest columns of a block of whole images (``numba_im2col``'s ``images`` configs) that
#: :func:`numba_im2col_cost` counts as built in cache
IMAGES_COLS_BYTES = 4 << 20


#: Cache budgets (bytes) of one task's working set in ``numpy.conv2d.numba_gemm`` (its input
#: window and its block of output): the tuner tries each, the heuristic takes the first
NUMBA_GEMM_CONFIGS = ({"block_bytes": 1 << 20}, {"block_bytes": 512 << 10}, {"block_bytes": 2 << 20})
#: ``numba_gemm``'s register-blocked 1x1 path (:func:`._nb_conv.pointwise_strips`, no BLAS), offered
#: for 1x1 convs without padding on maps of at least :data:`STRIPS_POSITIONS` positions: the bytes of
#: a task's input block (C/g x positions). Alone, alternating config by config, the three within
#: 5 % of each other (64 KB first or level on every layer below)
NUMBA_STRIPS_CONFIGS = ({"strips": 1, "block_bytes": 64 << 10}, {"strips": 1, "block_bytes": 256 << 10},
                        {"strips": 1, "block_bytes": 1 << 20})
#: output positions an image gives the strips at least: on ResNet-50's 1x1 layers at batch 4, alone,
#: the strips against BLAS (``numba_gemm``'s best block): 56 x 56 64 -> 256 1.31 against 1.67 ms,
#: 256 -> 64 1.56 / 1.90, 64 -> 64 0.39 / 0.53; 28 x 28 128 -> 512 1.39 / 1.36, 512 -> 128 1.47 /
#: 1.51; but 14 x 14 1024 -> 256 1.71 / 1.36 and 7 x 7 2048 -> 512 3.3 / 1.8 (with the bias and ReLU
#: still a second pass, 0.1-0.3 ms of those; an image's last strip is mostly padding there, 196
#: positions computed as 240 and 49 as 96, and a strip's input channels outgrow L1)
STRIPS_POSITIONS = 512
#: ``pointwise_strips``' multiply-adds per second (float32, both threads; float64 half), as computed
#: (output channels rounded up to whole strips' blocks, an image's positions to whole strips),
#: slowed by each strip's fixed work (zeroing, the bias and ReLU, storing: about
#: :data:`STRIPS_FIXED` input channels' worth). Alone, with bias and ReLU, against the model: the
#: cpu suite's 8 x 64 x 56 x 56 -> 128 1.32 / 1.36 ms (BLAS 1.80), at batch 4 on 56 x 56 64 -> 256
#: 1.31 / 1.36, 256 -> 64 1.56 / 1.30, 64 -> 64 0.39 / 0.34, on 28 x 28 128 -> 512 1.39 / 1.38,
#: 512 -> 128 1.47 / 1.35
STRIPS_RATE, STRIPS_FIXED = 320e9, 4


def numba_gemm_configs(problem: Problem) -> tuple[dict[str, Any], ...]:
    """``numba_gemm``'s configs for ``problem``: the BLAS blocks, and for a 1x1 conv without padding
    on maps of :data:`STRIPS_POSITIONS` or more the register-blocked strips too."""
    if is_pointwise(problem) and problem.attrs["stride"] == (1, 1) \
            and math.prod(problem.out_shape[2:]) >= STRIPS_POSITIONS:
        return NUMBA_GEMM_CONFIGS + NUMBA_STRIPS_CONFIGS
    return NUMBA_GEMM_CONFIGS


def is_unit_stride(problem: Problem) -> bool | Refusal:
    """``numba_gemm`` takes stride-1 convolutions (the strided ones gather: ``numba_im2col``)."""
    if is_depthwise(problem):
        return Refusal("depthwise: numba_depthwise")
    if problem.attrs["stride"] != (1, 1):
        return Refusal("strided: numba_im2col")
    return True


def _gemm_plan(problem: Problem, config: Any) -> tuple[bool, int, int]:
    """(pointwise, block, tasks) of ``numba_gemm``: positions per block (pointwise) or output rows
    per block (shifted taps) within the budget, cut finer where the batch gives the threads fewer
    than two tasks each."""
    _, c, h, wd = problem.shapes[0]
    o, cg, kh, kw = problem.shapes[1]
    g = problem.attrs["groups"]
    n, _, ho, wo = problem.out_shape
    pt, pb, pl, pr = problem.attrs["padding"]
    og, size = o // g, itemsize(problem.dtype)
    budget = (config or NUMBA_GEMM_CONFIGS[0])["block_bytes"]
    want = -(-2 * jit.threads() // max(1, n * g))  # blocks per image for two tasks a thread
    if kh == kw == 1 and not (pt or pb or pl or pr):
        if (config or {}).get("strips"):
            # the input block (C/g x block) in cache, in whole strips; blocks of an image even
            cs = np.dtype(compute_dtype(problem.dtype)).itemsize
            step = _strip_shape(cs)[1]  # positions per strip
            blocks = max(-(-(ho * wo * cg * cs) // budget), want)
            per = -(-(ho * wo) // blocks)
            block = min(ho * wo, -(-per // step) * step)
            return True, block, n * g * -(-(ho * wo) // block)
        per = max(64, budget // ((cg + og) * size))
        block = max(1, min(ho * wo, per, -(-(ho * wo) // want)))
        return True, block, n * g * -(-(ho * wo) // block)
    wp = wd + pl + pr
    rows = max(1, min(ho, budget // ((cg + og) * wp * size), -(-ho // want)))
    return False, rows, n * g * -(-ho // rows)


#: numba's dynamic schedule for a ``par_*`` wrapper (:func:`.jit.run_dynamic`)
run_dynamic = jit.run_dynamic


def run_tasks(nb: Any, wrapper: Any, loop: Any, args: tuple, tasks: int, pieces: int) -> None:
    """``loop(*args, first, last)`` over ``range(tasks)`` in ``pieces`` ranges on numba's threads:
    the ``par_*`` ``wrapper`` of :mod:`._nb_conv` (``nb``) calling the loop by address
    (:func:`._nb_conv.task`: each compiles apart, the wrapper in a fraction of a second), through
    :func:`run_dynamic`."""
    run_dynamic(wrapper, nb.task(loop, *args), *args, tasks, pieces)


def _pieces(tasks: int, problem: Problem) -> int:
    """Ranges of tasks the GEMM loops run in parallel: :data:`PIECES_PER_THREAD` per thread, one
    for few flops (a parallel region's hand-off costs more) or where BLAS cannot be held to one
    thread (another BLAS spreads each product itself)."""
    from . import _blas

    if _flops(problem) < SERIAL_FLOPS or not _blas.controllable():
        return 1
    return max(1, min(tasks, jit.threads() * PIECES_PER_THREAD))


def prepare_numba_gemm(problem: Problem, config: Any) -> Any:
    """The launcher of ``numpy.conv2d.numba_gemm`` (stride 1): a 1x1 conv without padding as GEMMs
    on the input and output in place (:func:`._nb_conv.pointwise_gemm`) or, with config
    ``strips``, register-blocked without BLAS (:func:`._nb_conv.pointwise_strips`: the weights and
    the bias laid out in blocks of ``STRIP_CHANNELS`` output channels per call, 8192 values for
    64 -> 128), any other as one GEMM
    per kernel tap on a padded block of rows (:func:`._nb_conv.shift_gemm`, the weights reordered
    (tap, O, C/g) once per call). Tasks split over the threads as ``numba_im2col``'s, BLAS held
    to one thread; no im2col, no NumPy BLAS (whose threads keep spinning after a call: on 2
    cores they take a core from the next kernel's threads)."""
    from . import _blas

    nb, code, fused = _loops(problem)
    (dh, dw) = problem.attrs["dilation"]
    pt, _, pl, pr = problem.attrs["padding"]
    n, c, h, wd = problem.shapes[0]
    o, cg, kh, kw = problem.shapes[1]
    g = problem.attrs["groups"]
    _, _, ho, wo = problem.out_shape
    dt = compute_dtype(problem.dtype)
    pointwise_path, block, tasks = _gemm_plan(problem, config)
    pieces = _pieces(tasks, problem)
    wp = wd + pl + pr
    strips = pointwise_path and bool((config or {}).get("strips"))
    if strips:  # no BLAS: the tasks spread whatever the library
        pieces = 1 if _flops(problem) < SERIAL_FLOPS else max(1, min(tasks, jit.threads() * PIECES_PER_THREAD))
    og = o // g
    kc = nb.STRIP_CHANNELS
    kblocks = -(-og // kc)

    @np.errstate(over="ignore", invalid="ignore")
    def launch(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        b = np.zeros(0, dt) if bias is None else np.ascontiguousarray(bias, dt)
        out = buffers.empty(problem.out_shape, dt)
        if out.size:
            if strips:
                xs = np.ascontiguousarray(x, dt).reshape(n, c, h * wd)
                wt = np.zeros((g, kblocks * kc, cg), dt)
                wt[:, :og] = np.asarray(w, dt).reshape(g, og, cg)
                wt = np.ascontiguousarray(wt.reshape(g, kblocks, kc, cg).transpose(0, 1, 3, 2)).reshape(-1)
                bt = np.zeros((g, kblocks * kc), dt)  # the bias in the weights' blocks of channels
                if b.size:
                    bt[:, :og] = b.reshape(g, og)
                run_tasks(nb, nb.par_pointwise, nb.pointwise_strips, (xs, wt, bt.reshape(-1), out.reshape(n, o, ho * wo),
                          g, block, fused), tasks, pieces)
            elif pointwise_path:
                xs = np.ascontiguousarray(x, dt).reshape(n, c, h * wd)
                wf = np.ascontiguousarray(w, dt).reshape(-1)
                with _blas.one_thread():
                    run_tasks(nb, nb.par_pointwise, nb.pointwise_gemm, (xs, wf, b, out.reshape(n, o, ho * wo), g, block,
                              fused), tasks, pieces)
            else:
                xs = x.astype(dt, copy=False)
                wt = np.empty((kh * kw, o, cg), dt)
                jit.call(nb.reorder_taps, np.ascontiguousarray(w, dt).reshape(o, cg, kh * kw), wt)
                wt = wt.reshape(-1)
                with _blas.one_thread():
                    run_tasks(nb, nb.par_shift, nb.shift_gemm, (xs, wt, b, out, kh, kw, dh, dw, pt, pl, wp, block, g,
                              fused), tasks, pieces)
            _activate_rest(out, b, code, fused)
        return out.astype(problem.dtype, copy=False)

    return jit.first_use("numpy.conv2d.numba_gemm", launch)


#: BLAS in each thread on one block in cache, both threads (``numba_gemm``): 330 GFLOP/s on wide
#: blocks, less on few output channels per group or few positions per block (the GEMM's M and N)
BLOCK_GEMM_PEAK = 330e9


def numba_gemm_cost(problem: Problem, config: Any) -> float:
    """The GEMMs (:data:`BLOCK_GEMM_PEAK` scaled down for M or N under 256; the shifted taps
    compute the Wp - Wo padding columns too), the input read once, the weights reordered
    (shifted taps), the output written once with its epilogue. Fitted on ResNet-50's stride-1
    layers at batch 4 inside the model (within 20 %): 1.4 ms for 256 -> 1024 1x1 on 14 x 14,
    3.8 ms for 64 channels 3x3 on 56 x 56, 2.0 ms for 2048 -> 512 1x1 on 7 x 7.

    A 1x1 conv's BLAS call packs its group's weights afresh in every task, so fewer, larger
    blocks of an image pack them fewer times (each task past one per image and group charged its
    weights at :data:`PASS_BYTES`): on ResNet-50's 1x1 layers at
    batch 4, alone, 2 MB blocks against 1 MB: 512 -> 128 on 28 x 28 1.45 against 1.65 ms,
    128 -> 512 1.33 against 1.46, 256 -> 128 on 56 x 56 3.07 against 3.25, the others level
    or up to 5 % faster.

    The register-blocked 1x1 path (configs ``strips``): the multiply-adds as computed at
    :data:`STRIPS_RATE`, each strip's fixed work as :data:`STRIPS_FIXED` more input channels."""
    o, cg, kh, kw = problem.shapes[1]
    g = problem.attrs["groups"]
    pointwise_path, block, tasks = _gemm_plan(problem, config)
    if pointwise_path and (config or {}).get("strips"):
        n, _, ho, wo = problem.out_shape
        size = np.dtype(compute_dtype(problem.dtype)).itemsize
        kv, step = _strip_shape(size)
        hw = ho * wo
        positions = n * (hw // block * -(-block // step) + -(-(hw % block) // step)) * step
        computed = 2.0 * g * positions * -(-(o // g) // kv) * kv * cg
        return computed / (STRIPS_RATE * 4 / size) * (1 + STRIPS_FIXED / max(1, cg)) + 2e-5
    wd, (pl, pr), wo = problem.shapes[0][3], problem.attrs["padding"][2:], problem.out_shape[3]
    positions = block if pointwise_path else block * (wd + pl + pr)
    rate = BLOCK_GEMM_PEAK * min(1.0, o / g / 256.0) ** 0.25 * min(1.0, positions / 256.0) ** 0.25
    wide = 1.0 if pointwise_path else (wd + pl + pr) / max(1, wo)
    size = itemsize(problem.dtype)
    moved = math.prod(problem.shapes[0]) * size + _out_bytes(problem)
    if not pointwise_path:
        moved += 2 * math.prod(problem.shapes[1]) * size
    else:
        n = problem.shapes[0][0]
        moved += (tasks - n * g) * (o // g) * cg * size  # the weights packed again by an image's later blocks
    return _flops(problem) * wide / rate + moved / PASS_BYTES + 2e-5


#: bytes per second of columns gathered for the whole batch (short runs, a buffer past the caches;
#: fitted low so that ``numba_batch`` is only picked where it measured clearly faster inside
#: ResNet-50: 1x1 convs with large weights on 7 x 7 outputs, not 2048 -> 512 (2.3 ms, numba_gemm
#: 2.0), nor 256 channels 3x3 stride 2 on 28 x 28 (6.8 ms, numba_im2col 4.5))
GATHER_BYTES = 1.5e9
#: output channels per block of ``numpy.conv2d.numba_batch`` the tuner tries (heuristic: the first)
NUMBA_BATCH_CONFIGS = ({"channels": 64}, {"channels": 128}, {"channels": 32})


def is_ungrouped(problem: Problem) -> bool | Refusal:
    """``numba_batch`` takes convolutions without groups (one GEMM's weights for the batch)."""
    if problem.attrs["groups"] != 1:
        return Refusal("grouped: numba_gemm / numba_im2col")
    return True


def prepare_numba_batch(problem: Problem, config: Any) -> Any:
    """The launcher of ``numpy.conv2d.numba_batch``: the columns of the whole batch, (C * kh * kw,
    N * Ho * Wo), gathered in parallel (:func:`._nb_conv.batch_columns`), then one GEMM per block
    of output channels over every position of the batch, the blocks spread over numba's threads
    (:func:`._nb_conv.batch_gemm`: the weights packed once, not once per image), each block
    scattered into the output with the bias and activation."""
    from . import _blas

    nb, code, fused = _loops(problem)
    (sh, sw), (dh, dw) = problem.attrs["stride"], problem.attrs["dilation"]
    pt, _, pl, _ = problem.attrs["padding"]
    n, c, _, _ = problem.shapes[0]
    o, _, kh, kw = problem.shapes[1]
    _, _, ho, wo = problem.out_shape
    dt = compute_dtype(problem.dtype)
    mb = (config or NUMBA_BATCH_CONFIGS[0])["channels"]
    blocks = -(-o // mb)
    col_pieces, gemm_pieces = _pieces(n * c, problem), _pieces(blocks, problem)

    @np.errstate(over="ignore", invalid="ignore")
    def launch(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        x = x.astype(dt, copy=False)
        w2 = np.ascontiguousarray(w, dt).reshape(o, -1)
        b = np.zeros(0, dt) if bias is None else np.ascontiguousarray(bias, dt)
        out = buffers.empty(problem.out_shape, dt)
        if out.size:
            cols = buffers.empty((c * kh * kw, n * ho * wo), dt)
            args = (x, w2, cols, b, out.reshape(n, o, ho * wo), kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, mb, fused)
            run_tasks(nb, nb.par_batch, nb.batch_columns, args, n * c, col_pieces)
            with _blas.one_thread():
                run_tasks(nb, nb.par_batch, nb.batch_gemm, args, blocks, gemm_pieces)
            _activate_rest(out, b, code, fused)
        return out.astype(problem.dtype, copy=False)

    return jit.first_use("numpy.conv2d.numba_batch", launch)


def numba_batch_cost(problem: Problem, config: Any) -> float:
    """The GEMMs at :data:`BLOCK_GEMM_PEAK` (every position of the batch in each: N is large;
    slower on blocks of few channels), the columns gathered run by run into a buffer past the
    caches (:data:`GATHER_BYTES`) and the output written once. Measured at batch 4: 1.6 ms for
    512 -> 2048 1x1 on 7 x 7 (numba_gemm 1.9), 4.7 ms for 512 channels 3x3 on 7 x 7 (numba_im2col
    4.8), 3.4 ms for 1024 -> 2048 1x1 stride 2 on 14 x 14 (4.3); on large maps the columns
    dominate (13.6 ms for 64 channels 3x3 on 56 x 56, numba_gemm 3.7)."""
    mb = min(problem.shapes[1][0], (config or NUMBA_BATCH_CONFIGS[0])["channels"])
    rate = BLOCK_GEMM_PEAK * min(1.0, mb / 128.0) ** 0.25
    return _flops(problem) / rate + _cols_bytes(problem) / GATHER_BYTES + _out_bytes(problem) / PASS_BYTES + 3e-5


def is_winograd(problem: Problem) -> bool | Refusal:
    """``numba_winograd`` takes 3x3 convolutions with stride 1, no dilation and no groups."""
    if problem.shapes[1][2:] != (3, 3) or problem.attrs["stride"] != (1, 1) or problem.attrs["dilation"] != (1, 1):
        return Refusal("not a 3x3 stride-1 undilated conv")
    if problem.attrs["groups"] != 1:
        return Refusal("grouped")
    return True


#: ``numpy.conv2d.numba_winograd``'s configs the tuner tries; the cost model picks among them. F(2x2,
#: 3x3) (``tile`` 2): output channels per GEMM block (``channels``); F(4x4, 3x3) (``tile`` 4, fused
#: per block of tiles, :func:`._nb_conv.wino4`): the bytes of a block's v and m (``block_bytes``)
NUMBA_WINOGRAD_CONFIGS = ({"channels": 128, "tile": 2}, {"channels": 64, "tile": 2}, {"channels": 256, "tile": 2},
                          {"tile": 4, "block_bytes": 2 << 20}, {"tile": 4, "block_bytes": 1 << 20},
                          {"tile": 4, "block_bytes": 4 << 20})


def _wino_config(config: Any) -> tuple[int, int]:
    """(channels per GEMM block, tile) of a ``numba_winograd`` config (tile 2 where it names none)."""
    cfg = config or NUMBA_WINOGRAD_CONFIGS[0]
    return cfg.get("channels", 0), cfg.get("tile", 2)


def _wino4_rows(problem: Problem, config: Any) -> tuple[int, int]:
    """(rows of tiles per block, blocks per image) of F(4x4): a block's v (36, C, T_b) and m (36, O,
    T_b) within ``block_bytes``, cut finer where the batch gives the threads fewer than two blocks
    each."""
    _, c, _, _ = problem.shapes[0]
    o = problem.shapes[1][0]
    th, tw = _tiles(problem, 4)
    budget = (config or {}).get("block_bytes", 2 << 20)
    rows = max(1, budget // (36 * (c + o) * itemsize(problem.dtype) * tw))
    want = -(-2 * jit.threads() // max(1, problem.out_shape[0]))  # blocks per image for two a thread
    rows = max(1, min(rows, th, -(-th // want)))
    return rows, -(-th // rows)


def _tiles(problem: Problem, tile: int = 2) -> tuple[int, int]:
    _, _, ho, wo = problem.out_shape
    return -(-ho // tile), -(-wo // tile)


def prepare_numba_winograd(problem: Problem, config: Any) -> Any:
    """The launcher of ``numpy.conv2d.numba_winograd``: Winograd F(2x2, 3x3) or, with config
    ``tile=4``, F(4x4, 3x3) (:mod:`._nb_conv`). F(2x2): the input tiles and the filters
    transformed in parallel, 16 GEMMs (per tile position, per block of output channels) spread
    over numba's threads with BLAS in each, then the output tiles with the bias and activation.
    F(4x4): the filters transformed, then blocks of rows of tiles (:func:`_wino4_rows`) spread
    over the threads, each from input to output in cache (its transforms, 36 GEMMs, the bias and
    activation). Each tile size is one loop (:func:`._nb_conv.wino2`, :func:`._nb_conv.wino4`:
    compiled on its first use only) run in groups of tasks by one parallel wrapper."""
    from . import _blas

    nb, code, fused = _loops(problem)
    pt, _, pl, _ = problem.attrs["padding"]
    n, c, _, _ = problem.shapes[0]
    o = problem.shapes[1][0]
    mb, tile = _wino_config(config)
    th, tw = _tiles(problem, tile)
    tiles = n * th * tw
    npos = (tile + 2) ** 2
    dt = compute_dtype(problem.dtype)
    if tile == 2:
        # the stages' three groups of tasks (_nb_conv.wino2): the input tiles and the filters, the
        # GEMMs, the output tiles; each group's offset in the loop's task numbers
        blocks = npos * -(-o // mb)
        groups = ((0, c + o), (c + o, blocks), (c + o + blocks, o))
        size = npos * (c * tiles + o * c + o * tiles) + 2
    else:
        # two groups (_nb_conv.wino4): the filters, then the fused blocks of rows of tiles
        mb, nblk = _wino4_rows(problem, config)
        groups = ((0, o), (o, n * nblk))
        size = npos * o * c + 2
    pieces = [_pieces(tasks, problem) for _, tasks in groups]
    blas = 1 if tile == 2 else len(groups) - 1  # the group of tasks that calls BLAS
    loop = nb.wino2 if tile == 2 else nb.wino4

    @np.errstate(over="ignore", invalid="ignore")
    def launch(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        x = x.astype(dt, copy=False)
        b = np.zeros(0, dt) if bias is None else np.ascontiguousarray(bias, dt)
        out = buffers.empty(problem.out_shape, dt)
        if out.size:
            # scratch from the pool too: fresh mappings of tens of MB fault in page by page
            # F(2x2): v (P, C, T), u (O, P, C), m (P, O, T) and the GEMMs' [1, 0] in one flat
            # scratch (_nb_conv.WINO_LAYOUT): the stages' parallel wrapper takes few arguments;
            # F(4x4): u (O, 36, C) and [1, 0]
            s = buffers.empty((size,), dt)
            s[-2:] = (1, 0)
            args = (x, np.ascontiguousarray(w, dt).reshape(-1), b, out, s, pt, pl, mb, tile, fused)
            fn = nb.task(loop, *args)
            for i, ((off, tasks), p) in enumerate(zip(groups, pieces)):
                if i == blas:
                    with _blas.one_thread():
                        run_dynamic(nb.par_wino, fn, *args, off, tasks, p)
                else:
                    run_dynamic(nb.par_wino, fn, *args, off, tasks, p)
            _activate_rest(out, b, code, fused)
        return out.astype(problem.dtype, copy=False)

    return jit.first_use("numpy.conv2d.numba_winograd", launch)


#: F(4x4)'s fused blocks (:func:`._nb_conv.wino4`), fitted on its times at 4-8 x 64 x 56 x 56, 4 x 128 x 28 x 28
#: and 4 x 256 x 14 x 14 in isolation (within 10 %): the GEMMs' rate on both threads (operands in
#: L2: 64 x 112 x 64 ran 159 GFLOP/s on one core, against 56 streaming 64 x 1568 x 64), the input
#: and output transforms per (tile, channel), and the filters' transform per filter
WINO4_GEMM_RATE, WINO4_TILE_S, WINO4_FILTER_S = 262e9, 11.4e-9, 17e-9


def numba_winograd_cost(problem: Problem, config: Any) -> float:
    """F(2x2, 3x3) (``tile`` 2): the 16 GEMMs (2.25x fewer multiply-adds than direct on whole
    tiles; slower on few channels: the GEMMs' K is C, their M a block of output channels; and on
    few tiles, their N), the transforms' passes through memory (the input read and its 16 tile
    planes, 4x the input, written and read; the same for the output's) and the filters' transform
    at a third of the copy rate (16 values per filter, every call). Inside ResNet-50 at batch 4:
    3.2 ms on 256 channels at 14 x 14 (numba_gemm 4.2), 3.3 on 128 at 28 x 28 (3.6), but 6.7 on
    512 at 7 x 7 (numba_im2col 5.4: the filters' 16 MB) and, in isolation, 7.7 on 64 at 8 x 56 x 56
    (numba_gemm 7.7).

    F(4x4, 3x3) (``tile`` 4, fused per block of tiles): the 36 GEMMs on the tiles that cover the
    output (4x fewer multiply-adds than direct where the map is a multiple of 4) at
    :data:`WINO4_GEMM_RATE` (slower on blocks of few tiles), the transforms per (tile, channel),
    the filters per filter, and the transformed filters (36 O C values) read again by every
    block. In isolation, alternating call by call: 4.7 ms at 8 x 64 x 56 x 56 (F(2x2) 8.9,
    numba_gemm 8.4), 2.3 at 4 x 64 x 56 x 56 (4.3, 4.2), 2.2 for 128 channels at 28 x 28 (3.4,
    3.8); it loses on small maps with many channels, where the tiles overhang the map (14 -> 16)
    and the filters outweigh the GEMMs: 4.1 against 3.3 for 256 channels at 14 x 14, 18 against
    8 for 512 at 7 x 7 (the model: 4.6 and 14)."""
    o, c = problem.shapes[1][:2]
    mb, tile = _wino_config(config)
    th, tw = _tiles(problem, tile)
    tiles = problem.out_shape[0] * th * tw
    size = itemsize(problem.dtype)
    if tile == 4:
        rows, nblk = _wino4_rows(problem, config)
        rate = WINO4_GEMM_RATE * min(1.0, rows * tw / 64.0) ** 0.25
        refetch = 36 * o * c * size * problem.out_shape[0] * nblk / PASS_BYTES
        return 2.0 * 36 * o * c * tiles / rate + (c + o) * tiles * WINO4_TILE_S + o * c * WINO4_FILTER_S \
            + refetch + 4e-5
    mb = min(o, mb)
    rate = BLOCK_GEMM_PEAK * min(1.0, mb / 256.0) ** 0.25 * min(1.0, c / 256.0) ** 0.3 * min(1.0, tiles / 256.0) ** 0.25
    moved = (math.prod(problem.shapes[0]) + 2 * 16 * c * tiles + 2 * 16 * o * tiles) * size
    filters = 2 * 16 * o * c * size / (PASS_BYTES / 3)
    return 2.0 * 16 * o * c * tiles / rate + moved / PASS_BYTES + filters + _out_bytes(problem) / PASS_BYTES + 4e-5


def numba_depthwise_cost(problem: Problem, config: Any) -> float:
    """One read of the input and one write of the output; the taps from cache."""
    return roofline(_flops(problem), _bytes(problem), CPU_FLOPS, CPU_BYTES * 1.5, 1e-5)


#: ``numba_direct``'s multiply-adds per second on both threads (float32; float64 half), as
#: computed: whole blocks of 8 output channels, every wide position of whole strips (fitted on
#: the 7x7 stem at batch 1, 4 and 8: 0.72, 2.8, 6.0 ms, and 3x3 convs of 4 to 16 channels)
DIRECT_RATE = 360e9


def numba_direct_cost(problem: Problem, config: Any) -> float:
    """The strips (:func:`._nb_conv.direct_strips`) at :data:`DIRECT_RATE`, their multiply-adds
    counted as computed (output channels rounded up to blocks of 8, each row's ``wq`` wide
    positions rounded up to whole strips), plus each strip's fixed work (zeroing, saving, about
    8 taps' worth: short reductions pay it most), threads idle where there are fewer tasks than
    threads (or one thread for few flops), the tiles written and a call's fixed cost (the
    weights arranged, the parallel region). Measured against the model: the stem 0.72 / 0.78 ms
    at batch 1, 3x3 from 4 channels to 32 on 4 x 56 x 56 0.150 / 0.16, 16 to 64 0.81 / 0.79,
    8 to 128 on 4 x 28 x 28 0.25 / 0.24, 1x1 16 to 16 on 2 x 32 x 32 0.063 / 0.066."""
    kv, rows, rt, wq, tasks = _direct_plan(problem)
    o, cg, kh, kw = problem.shapes[1]
    g = problem.attrs["groups"]
    n, _, ho, _ = problem.out_shape
    sh, sw = problem.attrs["stride"]
    size = np.dtype(compute_dtype(problem.dtype)).itemsize
    step = _strip_shape(size)[1]
    taps = cg * kh * kw
    positions = n * g * -(-ho // rows) * -(-(rows * wq) // step) * step
    flops = 2.0 * positions * -(-(o // g) // kv) * kv * max(1, taps)
    threads = jit.threads()
    idle = threads if _flops(problem) < SERIAL_FLOPS else max(1.0, threads / max(1, tasks))
    compute = flops / (DIRECT_RATE * 4 / size) * (1 + 8 / max(1, taps)) * idle
    tiles = tasks * cg * sh * sw * rt * wq * size
    return compute + tiles / PASS_BYTES + 4e-5


def kernels() -> list[Kernel]:
    out = [
        Kernel("conv2d", "numpy.conv2d.im2col", "cpu", FLOATS, im2col, cost=im2col_cost, configs=IM2COL_CONFIGS),
        Kernel("conv2d", "numpy.conv2d.pointwise", "cpu", FLOATS, pointwise, supports=is_pointwise,
               cost=pointwise_cost),
        Kernel("conv2d", "numpy.conv2d.depthwise", "cpu", FLOATS, depthwise, supports=is_depthwise,
               cost=depthwise_cost, configs=DEPTHWISE_CONFIGS),
    ]
    if jit.available():
        src = jit.source("_nb_elementwise", "_nb_conv")
        out += [Kernel("conv2d", "numpy.conv2d.numba_depthwise", "cpu", FLOATS, prepare=prepare_numba,
                       supports=is_depthwise, cost=numba_depthwise_cost, source=src,
                       notes=jit.notes("numpy.conv2d.numba_depthwise")),
                Kernel("conv2d", "numpy.conv2d.numba_direct", "cpu", FLOATS, prepare=prepare_numba_direct,
                       supports=is_direct, cost=numba_direct_cost, source=src,
                       notes=jit.notes("numpy.conv2d.numba_direct")),
                Kernel("conv2d", "numpy.conv2d.numba_gemm", "cpu", FLOATS, prepare=prepare_numba_gemm,
                       supports=is_unit_stride, cost=numba_gemm_cost, config_for=numba_gemm_configs,
                       configs=NUMBA_GEMM_CONFIGS + NUMBA_STRIPS_CONFIGS, source=src, notes=jit.notes("numpy.conv2d.numba_gemm")),
                Kernel("conv2d", "numpy.conv2d.numba_batch", "cpu", FLOATS, prepare=prepare_numba_batch,
                       supports=is_ungrouped, cost=numba_batch_cost,
                       configs=NUMBA_BATCH_CONFIGS, source=src, notes=jit.notes("numpy.conv2d.numba_batch")),
                Kernel("conv2d", "numpy.conv2d.numba_winograd", "cpu", FLOATS, prepare=prepare_numba_winograd,
                       supports=is_winograd, cost=numba_winograd_cost,
                       configs=NUMBA_WINOGRAD_CONFIGS, source=src, notes=jit.notes("numpy.conv2d.numba_winograd")),
                Kernel("conv2d", "numpy.conv2d.numba_im2col", "cpu", FLOATS, prepare=prepare_numba_im2col,
                       supports=is_not_depthwise, cost=numba_im2col_cost,
                       configs=NUMBA_IM2COL_CONFIGS, source=src, notes=jit.notes("numpy.conv2d.numba_im2col"))]
    return out
