"""numba loops of the convolutions (imported through :mod:`.jit` only): depthwise and
small-channel direct conv2d, the GEMM convolutions (below). The pools' loops are in :mod:`._nb_pool`.

**The GEMM convolutions** (``numba_gemm``, ``numba_im2col``, ``numba_batch``, ``numba_winograd``
of :mod:`.conv`) call scipy's BLAS from their tasks through :func:`_gemm`: numba's own ``?gemm``
entry (``numba_xxgemm``, by symbol name, so the loops stay cacheable) with leading dimensions, so
a GEMM reads a window of a padded image, an image's channels or a strided phase in place and
writes straight into the output. Each is a plain loop over a range of tasks (a task's working set
in L2) run by a small ``parallel=True`` wrapper (``par_*``) on numba's threads.

**Depthwise.** Each task is one (image, channel) plane: the plane is copied once into a
zero-padded buffer that stays in L1 / L2, then the outputs are built from taps:

* stride 1: *wide*, as the NumPy kernels' ``Taps``: output row ``y`` is computed at every one
  of the ``Wp`` padded columns, so each tap is one long vectorized loop over ``Ho * Wp`` values
  of the flattened padded plane shifted by the tap's offset (the values read past a row's end
  only reach dropped columns); the kept columns are then copied out with the bias and activation;
* otherwise, per output row, one loop over the row per tap (a strided read).

**Direct** (few input channels per group, the 7x7 stem: :func:`direct_strips`): register-blocked
as oneDNN's direct convolution. A task (image, group, block of output rows) copies its input
rows into a tile of stride phases (every tap then reads consecutive values, whatever the
stride), and each strip of 3 vectors of output positions by 8 output channels (AVX-512; 3 by 4
with AVX2) sums every tap in 24 vector registers: LLVM's loop vectorizer would vectorize the
taps' loops with their accumulators in memory (measured at most 60 % of the FMA rate on this
machine), so the strip is written in LLVM's vector IR (:func:`_strip_fma`, ``llvm.fma`` on
vectors, accumulators in an ``alloca`` that SROA promotes to registers). The 7x7 stem on
1 x 3 x 224 x 224, alone on this 2-core machine: 0.68-0.72 ms (the im2col + BLAS path 1.26), its
strips at about 215 GFLOP/s per core, the tiles and the output's write about a sixth of the time.

**Pointwise strips** (1x1 convs with stride 1 and no padding on large maps:
:func:`pointwise_strips`): the same strips and intrinsics with the input channels as the taps,
read in place from the input (no tile: a 1x1 conv needs no phases and no padding), the bias and
ReLU added in registers as a strip is stored (:func:`_strip_save_act`). The cpu suite's 64 -> 128
on 8 x 56 x 56, alone: 1.32-1.4 ms against 1.8 for BLAS on the same blocks (OpenBLAS packs both
operands of every 64-deep product); one thread runs the strips at about 185 GFLOP/s with its data
in L2 and 140 from memory. Tried and dropped: non-temporal stores of the output (aligned; no
gain, slower on blocks past 32 KB), software prefetch of the next strip's input (slower).

The padded values take part in the arithmetic as the float64 reference's do (a NaN or infinite
weight over the padding gives NaN). float32 and float64 natively; the launchers widen float16.

**Compile time.** The convolution entry points (depthwise wide / strided, direct) compile
separately, each on its own first use; they apply only the bias and ReLU themselves (:data:`FUSED`:
the exp / erfc polynomials of the other activations would be compiled into every loop). The
depthwise loops are plain ``nogil`` loops over a range of tasks, not ``parallel=True``: a
``prange`` region compiled the same loops a second time (measured on the depthwise loop: 1.31 s
parallel, 0.58 s plain, its helpers compiled apart); they and the direct loop run on numba's
threads through :func:`par_depthwise` / :func:`par_direct`, which call them by address. (The
depthwise loops ran on Python threads: with a padded plane allocated per task, two threads took
as long as one, 1.2 ms on the cpu suite's 8 x 64 x 56 x 56; allocated once per range, 3x3 in one
pass and on numba's threads, 0.5-0.65 ms; first use 0.98 -> 1.61 s, the wrapper included.)

A first use's compile time goes mostly by the count of functions and of distinct typed operations
compiled, each with a fixed cost (numba's typing and lowering, an LLVM module: 0.07-0.15 s for the
smallest), more than by their bodies. So the small helpers of the GEMM loops (:func:`act_row`,
:func:`_crop`, :func:`_gemm`, the phase helpers) are ``inline="always"`` (inlined in numba's IR,
never compiled on their own: numba_im2col's strided first use 1.95 -> 1.70 s), a path that a
problem may not take is a loop of its own (the strided paths: :func:`phase_gemm`,
:func:`phase_1x1`, :func:`phase_taps`), and the Winograd stages share operations (the flat
reshapes, one scratch shape) and take the GEMM's scalars from the launcher.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic
from numba.np.linalg import ensure_blas

from . import _nb_math

OPTIONS = dict(cache=True, nogil=True, error_model="numpy")

#: activation codes the loops apply themselves (``_nb_elementwise.CODES``: none, relu); the
#: launchers apply any other in a second pass (``_nb_elementwise.bias_act_rows``), so that these
#: loops never compile the exp / erfc polynomials (about 1.5 s of a first use)
FUSED = (0, 2)

ensure_blas()  # scipy's BLAS (scipy.linalg.cython_blas), which numba's np.dot and _xxgemm call

#: numba's own BLAS entry (``numba/_helperlib``: scipy's ?gemm, column-major, with leading
#: dimensions), called by symbol name, so that the loops that use it stay cacheable on disk
_xxgemm = types.ExternalFunction("numba_xxgemm", types.intc(
    types.char, types.char, types.char, types.intp, types.intp, types.intp,
    types.voidptr, types.voidptr, types.intp, types.voidptr, types.intp, types.voidptr, types.voidptr, types.intp))


@intrinsic
def _ptr(typingctx, arr, off):
    """A ``void *`` to element ``off`` of ``arr``'s data counted flat (C-contiguous arrays)."""
    sig = types.voidptr(arr, types.intp)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.bitcast(cgutils.pointer_add(builder, ary.data, builder.mul(
            args[1], context.get_constant(types.intp, context.get_abi_sizeof(
                context.get_data_type(signature.args[0].dtype))))), cgutils.voidptr_t)

    return sig, codegen


@njit(inline="always", **OPTIONS)
def _gemm(a, a_off, lda, b, b_off, ldb, c, c_off, ldc, m, n, k, ab):
    """Row-major ``C = A @ B + beta C`` on flat C-contiguous ``a``, ``b``, ``c`` of one dtype:
    ``A`` (m, k) from element ``a_off`` with row stride ``lda``, ``B`` (k, n) and ``C`` (m, n)
    likewise; ``ab`` = [1, beta] in that dtype. One BLAS call (column-major: C^T = B^T A^T) in
    the calling thread (:mod:`._blas` holds the library to one thread), no copy of any operand:
    the leading dimensions let ``B`` be a window of a padded image or of an image's channels."""
    kind = np.int8(115) if c.itemsize == 4 else np.int8(100)  # 's' / 'd'
    nn = np.int8(110)
    _xxgemm(kind, nn, nn, n, m, k, _ptr(ab, 0), _ptr(b, b_off), ldb, _ptr(a, a_off), lda,
            _ptr(ab, 1), _ptr(c, c_off), ldc)


@njit(inline="always", **OPTIONS)
def act_row(y, b, code):
    """In place on the 1-D ``y``: ``y + b``, then ReLU where ``code`` is 2 (NaN kept, as
    ``_nb_elementwise.relu``); any other code adds the bias only."""
    act_into(y, y, b, code)


@njit(inline="always", **OPTIONS)
def act_into(src, dst, b, code):
    """:func:`act_row` from the 1-D ``src`` into ``dst`` (the same length; may be ``src``)."""
    n = dst.shape[0]
    if code == 2:
        zero = dst.dtype.type(0.0)
        for j in range(n):
            v = src[j] + b
            dst[j] = zero if v < zero else v
    else:
        for j in range(n):
            dst[j] = src[j] + b


@njit(inline="always", **OPTIONS)
def _task(t, groups, nblk, size, length):
    """Task ``t`` of the (image, group, block) tasks the GEMM loops share, blocks of ``size`` out of
    ``length`` (``nblk`` of them): (image, group, the block's first index, its length)."""
    n = t // (groups * nblk)
    r = t - n * groups * nblk
    g = r // nblk
    first = (r - g * nblk) * size
    return n, g, first, min(size, length - first)


@njit(inline="always", **OPTIONS)
def _unit_alpha(dt, beta):
    """The [alpha, beta] of the GEMM calls, alpha 1 (np.empty, not np.zeros: one allocation's code
    fewer to compile)."""
    ab = np.empty(2, dt)
    ab[0] = 1
    ab[1] = beta
    return ab


@njit(**OPTIONS)
def _tap_row(acc, row, wv, start, sw, wo):
    """``acc[ox] += wv * row[start + ox * sw]`` for ``ox < wo``."""
    if sw == 1:
        seg = row[start:start + wo]
        for ox in range(wo):
            acc[ox] += wv * seg[ox]
    else:
        seg = row[start:start + sw * (wo - 1) + 1:sw]
        for ox in range(wo):
            acc[ox] += wv * seg[ox]


@njit(**OPTIONS)
def _wide_row(acc, flat, wrow, off, dw):
    """The taps of one kernel row (weights ``wrow``) into the wide plane: three taps per pass over
    ``acc`` where the row has three (one read-modify-write of ``acc`` per three products)."""
    kw = wrow.shape[0]
    n = acc.shape[0]
    j = 0
    while j + 3 <= kw:
        w0, w1, w2 = wrow[j], wrow[j + 1], wrow[j + 2]
        s0 = flat[off + j * dw:off + j * dw + n]
        s1 = flat[off + (j + 1) * dw:off + (j + 1) * dw + n]
        s2 = flat[off + (j + 2) * dw:off + (j + 2) * dw + n]
        for k in range(n):
            acc[k] += w0 * s0[k] + w1 * s1[k] + w2 * s2[k]
        j += 3
    while j < kw:  # the rest one at a time
        wv = wrow[j]
        src = flat[off + j * dw:off + j * dw + n]
        for k in range(n):
            acc[k] += wv * src[k]
        j += 1


@njit(inline="always", **OPTIONS)
def _crop(out_plane, acc, wp, b, code):
    """The kept columns of the wide plane ``acc`` into ``out_plane`` (Ho, Wo), bias and activation."""
    ho, wo = out_plane.shape
    for oy in range(ho):
        row = out_plane[oy]
        src = acc[oy * wp:oy * wp + wo]
        for ox in range(wo):
            row[ox] = src[ox]
        act_row(row, b, code)


@njit(**OPTIONS)
def _pad(flat, plane, pt, pl, wp):
    """``plane`` (H, W) into the zero-filled ``flat`` padded plane (row stride ``wp``) at (pt, pl)."""
    h, wd = plane.shape
    for y in range(h):
        row = plane[y]
        dst = flat[(pt + y) * wp + pl:(pt + y) * wp + pl + wd]
        for c in range(wd):
            dst[c] = row[c]


@njit(**OPTIONS)
def _zero(a):
    for k in range(a.shape[0]):
        a[k] = 0


@njit(**OPTIONS)
def _wide_3x3(acc, flat, wk, off_y, off_x):
    """A 3x3 kernel ``wk`` into the wide plane in one pass: ``acc[k]`` is the sum of the nine
    taps' products (rows ``off_y`` apart in ``flat``, columns ``off_x``), one store per value
    (where three passes of three taps read and wrote ``acc`` three times). Summed as
    :func:`_wide_row` sums them (each kernel row's three, the rows in order): the same values."""
    n = acc.shape[0]
    w00, w01, w02 = wk[0, 0], wk[0, 1], wk[0, 2]
    w10, w11, w12 = wk[1, 0], wk[1, 1], wk[1, 2]
    w20, w21, w22 = wk[2, 0], wk[2, 1], wk[2, 2]
    a, b = off_y, 2 * off_y
    s00, s01, s02 = flat[0:n], flat[off_x:off_x + n], flat[2 * off_x:2 * off_x + n]
    s10, s11, s12 = flat[a:a + n], flat[a + off_x:a + off_x + n], flat[a + 2 * off_x:a + 2 * off_x + n]
    s20, s21, s22 = flat[b:b + n], flat[b + off_x:b + off_x + n], flat[b + 2 * off_x:b + 2 * off_x + n]
    for k in range(n):
        acc[k] = ((w00 * s00[k] + w01 * s01[k] + w02 * s02[k]) + (w10 * s10[k] + w11 * s11[k] + w12 * s12[k])) \
            + (w20 * s20[k] + w21 * s21[k] + w22 * s22[k])


@njit(**OPTIONS)
def depthwise_wide(x, w, bias, out, sh, sw, dh, dw, pt, pl, hp, wp, code, first, last):
    """Depthwise conv2d (groups == C, ``O = C * mult``) with stride 1 (``sh``, ``sw`` unused: the
    signature of :func:`depthwise_rows`, so that one :func:`par_depthwise` runs both): ``x``
    (N, C, H, W) any strides, ``w`` (O, kh, kw), ``bias`` (O,) or size 0, ``out`` (N, O, Ho, Wo)
    C-contiguous; each output plane computed wide (3x3: :func:`_wide_3x3`, else
    :func:`_wide_row` per kernel row), then cropped with the bias and activation ``code``
    (:data:`FUSED`). One task per (image, channel), tasks ``first:last``; the padded plane and the
    wide plane are allocated once per range (a plane's padding stays zero: :func:`_pad` writes
    only its interior): allocated per task, two threads ran no faster than one."""
    c_in = x.shape[1]
    o_out, kh, kw = w.shape
    ho = out.shape[2]
    mult = o_out // c_in
    has_bias = bias.shape[0] > 0
    flat = np.zeros(hp * wp + (kw - 1) * dw, x.dtype)
    acc = np.empty(ho * wp, x.dtype)
    for t in range(first, last):
        n = t // c_in
        c = t % c_in
        _pad(flat, x[n, c], pt, pl, wp)
        for m in range(mult):
            o = c * mult + m
            if kh == 3 and kw == 3:
                _wide_3x3(acc, flat, w[o], dh * wp, dw)
            else:
                _zero(acc)
                for i in range(kh):
                    _wide_row(acc, flat, w[o, i], i * dh * wp, dw)
            _crop(out[n, o], acc, wp, bias[o] if has_bias else x.dtype.type(0.0), code)


@njit(**OPTIONS)
def depthwise_rows(x, w, bias, out, sh, sw, dh, dw, pt, pl, hp, wp, code, first, last):
    """:func:`depthwise_wide` for any stride: per output row, one strided loop per tap."""
    c_in = x.shape[1]
    o_out, kh, kw = w.shape
    ho, wo = out.shape[2], out.shape[3]
    mult = o_out // c_in
    has_bias = bias.shape[0] > 0
    flat = np.zeros(hp * wp, x.dtype)
    for t in range(first, last):
        n = t // c_in
        c = t % c_in
        _pad(flat, x[n, c], pt, pl, wp)
        for m in range(mult):
            o = c * mult + m
            for oy in range(ho):
                row_acc = out[n, o, oy]
                _zero(row_acc)
                for i in range(kh):
                    r0 = (oy * sh + i * dh) * wp
                    row = flat[r0:r0 + wp]
                    for j in range(kw):
                        _tap_row(row_acc, row, w[o, i, j], j * dw, sw, wo)
                act_row(row_acc, bias[o] if has_bias else x.dtype.type(0.0), code)


# -- the register-blocked direct convolution (numba_direct) ---------------------------------------

#: bytes of one vector of :func:`direct_strips`'s strips (:data:`._nb_math.VECTOR_BYTES`)
VECTOR_BYTES = _nb_math.VECTOR_BYTES
#: one strip of :func:`direct_strips`: ``STRIP_VECTORS`` vectors of consecutive output positions
#: (16 float32 or 8 float64 with AVX-512) times ``STRIP_CHANNELS`` output channels: with AVX-512,
#: 24 accumulators of the 32 vector registers (per tap 3 vector loads of the input and 8
#: broadcasts of a weight feed 24 fused multiply-adds); with AVX2, 12 of 16
STRIP_VECTORS, STRIP_CHANNELS = 3, (8 if VECTOR_BYTES == 64 else 4)


def _slots(builder, acc, vt):
    return builder.bitcast(acc, ir.PointerType(ir.ArrayType(vt, STRIP_VECTORS * STRIP_CHANNELS)))


@intrinsic
def _strip_zero(typingctx, like):
    """A strip's accumulators, zeroed: ``STRIP_VECTORS * STRIP_CHANNELS`` vectors of ``like``'s
    dtype on the stack (one ``alloca`` in the function's entry, zeroed where this is called). Only
    :func:`_strip_fma` and :func:`_strip_save` touch them, whole vectors at constant indices, so
    LLVM's SROA keeps them in registers across the loop over taps."""
    sig = types.voidptr(like)

    def codegen(context, builder, signature, args):
        _, _, vt = _nb_math.vector_type(context, like.dtype)
        slots = cgutils.alloca_once(builder, ir.ArrayType(vt, STRIP_VECTORS * STRIP_CHANNELS))
        for i in range(STRIP_VECTORS * STRIP_CHANNELS):
            builder.store(ir.Constant(vt, None), cgutils.gep(builder, slots, 0, i))
        return builder.bitcast(slots, cgutils.voidptr_t)

    return sig, codegen


@intrinsic
def _strip_fma(typingctx, acc, x, xoff, w, woff):
    """One tap into a strip: ``acc[c][v] = fma(x[xoff + v * lanes:][:lanes], w[woff + c], acc[c][v])``
    for the strip's channels ``c`` and vectors ``v`` (``x``, ``w`` C-contiguous, offsets flat):
    each input vector loaded once (unaligned), each weight broadcast once, one fused
    multiply-add per pair (``llvm.fma``: one rounding, NaN and infinities as IEEE's)."""
    sig = types.none(acc, x, xoff, w, woff)

    def codegen(context, builder, signature, args):
        ft, lanes, vt = _nb_math.vector_type(context, x.dtype)
        slots = _slots(builder, args[0], vt)
        xp = _nb_math.element_ptr(context, builder, signature.args[1], args[1], args[2])
        wp = _nb_math.element_ptr(context, builder, signature.args[3], args[3], args[4])
        size = context.get_abi_sizeof(ft)
        name = f"llvm.fma.v{lanes}{'f32' if size == 4 else 'f64'}"
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt, vt]), name)
        xs = [builder.load(builder.bitcast(cgutils.gep(builder, xp, v * lanes), ir.PointerType(vt)), align=size)
              for v in range(STRIP_VECTORS)]
        for c in range(STRIP_CHANNELS):
            wv = _nb_math.splat(builder, builder.load(cgutils.gep(builder, wp, c)), vt)
            for v in range(STRIP_VECTORS):
                slot = cgutils.gep(builder, slots, 0, c * STRIP_VECTORS + v)
                builder.store(builder.call(fma, [xs[v], wv, builder.load(slot)]), slot)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _strip_save(typingctx, acc, buf, off, stride):
    """A strip's accumulators into ``buf`` (C-contiguous): channel ``c``'s vectors at ``off + c *
    stride`` on."""
    sig = types.none(acc, buf, off, stride)

    def codegen(context, builder, signature, args):
        ft, lanes, vt = _nb_math.vector_type(context, buf.dtype)
        slots = _slots(builder, args[0], vt)
        size = context.get_abi_sizeof(ft)
        for c in range(STRIP_CHANNELS):
            at = builder.add(args[2], builder.mul(args[3], ir.Constant(args[3].type, c)))
            bp = _nb_math.element_ptr(context, builder, signature.args[1], args[1], at)
            for v in range(STRIP_VECTORS):
                dst = builder.bitcast(cgutils.gep(builder, bp, v * lanes), ir.PointerType(vt))
                builder.store(builder.load(cgutils.gep(builder, slots, 0, c * STRIP_VECTORS + v)), dst, align=size)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _strip_save_act(typingctx, acc, buf, off, stride, bias, boff, relu):
    """:func:`_strip_save` with the epilogue in registers: channel ``c``'s vectors plus
    ``bias[boff + c]`` (broadcast), then ReLU where ``relu`` is true (``v < 0`` gives 0, NaN kept,
    as :func:`act_row`), stored at ``off + c * stride`` on: no second pass over the output."""
    sig = types.none(acc, buf, off, stride, bias, boff, relu)

    def codegen(context, builder, signature, args):
        ft, lanes, vt = _nb_math.vector_type(context, buf.dtype)
        slots = _slots(builder, args[0], vt)
        size = context.get_abi_sizeof(ft)
        bp = _nb_math.element_ptr(context, builder, signature.args[4], args[4], args[5])
        for c in range(STRIP_CHANNELS):
            bv = _nb_math.splat(builder, builder.load(cgutils.gep(builder, bp, c)), vt)
            at = builder.add(args[2], builder.mul(args[3], ir.Constant(args[3].type, c)))
            dp = _nb_math.element_ptr(context, builder, signature.args[1], args[1], at)
            for v in range(STRIP_VECTORS):
                y = builder.fadd(builder.load(cgutils.gep(builder, slots, 0, c * STRIP_VECTORS + v)), bv)
                y = _nb_math.relu_where(builder, y, args[6], vt)
                dst = builder.bitcast(cgutils.gep(builder, dp, v * lanes), ir.PointerType(vt))
                builder.store(y, dst, align=size)
        return context.get_dummy_value()

    return sig, codegen


@njit(inline="always", **OPTIONS)
def _phase_rows(tile, at, plane, x, n, ci, y, sw, pl, wq):
    """Row ``y`` of channel ``ci`` of image ``n`` (zero-padded: ``pl`` columns on the left, zeros
    past the input, and a whole row of zeros outside ``0 <= y < H``) split into its ``sw``
    phases: ``tile[at + px * plane + j] = xpad[y, sw * j + px]`` for ``j < wq``. Stride 2 reads
    both phases in one pass over the columns every phase has (consecutive pairs: LLVM
    deinterleaves whole vectors, where one phase alone is a gather)."""
    h, wd = x.shape[2], x.shape[3]
    zero = x.dtype.type(0.0)
    for px in range(sw):
        d = tile[at + px * plane:at + px * plane + wq]
        for j in range(wq):
            d[j] = zero
    if y < 0 or y >= h:
        return
    src = x[n, ci, y]
    both_lo = min(wq, (pl + sw - 1) // sw)  # the columns where every phase is in the input
    both_hi = max(both_lo, min(wq, (wd - sw + pl) // sw + 1))
    if sw == 2 and both_hi > both_lo:
        # zero-based slices: indices LLVM knows are not negative (no wraparound select per value)
        d0 = tile[at + both_lo:at + both_hi]
        d1 = tile[at + plane + both_lo:at + plane + both_hi]
        pairs = src[2 * both_lo - pl:2 * both_hi - pl]
        for j in range(both_hi - both_lo):
            d0[j] = pairs[2 * j]
            d1[j] = pairs[2 * j + 1]
    else:
        both_lo = both_hi = wq
    for px in range(sw):
        d = tile[at + px * plane:at + px * plane + wq]
        lo = min(wq, max(0, (pl - px + sw - 1) // sw))  # the first column in the input
        hi = max(lo, min(wq, (wd - 1 + pl - px) // sw + 1))
        s0 = px - pl
        if sw == 1:  # a known stride: LLVM vectorizes it (a C-contiguous x)
            if hi > lo:
                part = d[lo:hi]
                run = src[lo + s0:hi + s0]
                for j in range(hi - lo):
                    part[j] = run[j]
        else:  # the columns the paired pass left
            for j in range(lo, min(hi, both_lo)):
                d[j] = src[sw * j + s0]
            for j in range(max(lo, both_hi), hi):
                d[j] = src[sw * j + s0]


@njit(**OPTIONS)
def direct_strips(x, wt, toff, bias, out, sh, sw, pt, pl, rows, rt, wq, groups, code, first, last):
    """Direct conv2d for few input channels per group (the 3-channel 7x7 stem), any stride,
    dilation and padding, blocked over output channels and positions in registers.

    ``x`` (N, C, H, W) any strides; ``wt`` (groups, kblocks, taps, STRIP_CHANNELS) C-contiguous:
    each group's weights in blocks of ``STRIP_CHANNELS`` output channels (zero past the group's
    last), per tap ``(c, i, j)`` the block's channels together; ``toff`` (taps,): where each tap
    reads in the task's tile (below); ``out`` (N, O, Ho, Wo) C-contiguous; ``bias`` (O,) or size
    0; ``code`` the fused activation (:data:`FUSED`). One task per (image, group, block of
    ``rows`` output rows), tasks ``first:last``.

    A task first copies the input its rows read into a tile of *stride phases*: for each channel
    and phase ``(py, px)`` a plane of ``rt`` rows of ``wq`` values, ``plane[ii, jj] =
    xpad[sh * (oy0 + ii) + py, sw * jj + px]`` (zero where the padding is, or past the input).
    Tap ``(i, j)`` of output ``(oy, ox)`` then reads ``plane[(oy - oy0) + dh * i // sh, ox +
    dw * j // sw]`` of phase ``(dh * i % sh, dw * j % sw)``: the block's outputs, counted *wide*
    (``q = (oy - oy0) * wq + ox``, ``ox`` up to ``wq``; the columns from ``Wo`` on are dropped),
    read consecutive values of the tile from ``toff[tap] + q``, whatever the stride: stride 2
    needs no gather. The padding is in the tile, so the taps over it are multiplied like the
    others (a NaN or infinite weight there gives NaN, as the float64 reference) and the loop over
    taps has no branch.

    Each strip of ``STRIP_VECTORS`` vectors of wide positions and ``STRIP_CHANNELS`` channels then
    sums every tap in registers (:func:`_strip_fma`), into a buffer of the block's wide planes,
    whose kept columns are written out with the bias and activation."""
    o_out, ho, wo = out.shape[1], out.shape[2], out.shape[3]
    cg = x.shape[1] // groups
    og = o_out // groups
    kblocks, taps, kc = wt.shape[1], wt.shape[2], wt.shape[3]
    nblk = (ho + rows - 1) // rows
    plane = rt * wq
    step = STRIP_VECTORS * (VECTOR_BYTES // x.itemsize)  # wide positions per strip
    span = (rows * wq + step - 1) // step * step
    tile = np.zeros(cg * sh * sw * plane + wq + step, x.dtype)  # the slack: strips past the block's end
    wide = np.empty(kc * span, x.dtype)
    has_bias = bias.shape[0] > 0
    zero = x.dtype.type(0.0)
    for t in range(first, last):
        n = t // (groups * nblk)
        r = t - n * groups * nblk
        g = r // nblk
        oy0 = (r - g * nblk) * rows
        cnt = min(rows, ho - oy0)
        for c in range(cg):
            for py in range(sh):
                for ii in range(rt):
                    _phase_rows(tile, ((c * sh + py) * sw) * plane + ii * wq, plane, x, n, g * cg + c,
                                sh * (oy0 + ii) + py - pt, sw, pl, wq)
        for kb in range(kblocks):
            wbase = (g * kblocks + kb) * taps * kc
            for q0 in range(0, cnt * wq, step):
                acc = _strip_zero(tile)
                for tp in range(taps):
                    _strip_fma(acc, tile, toff[tp] + q0, wt, wbase + tp * kc)
                _strip_save(acc, wide, q0, span)
            for k in range(min(kc, og - kb * kc)):
                o = g * og + kb * kc + k
                b = bias[o] if has_bias else zero
                for yy in range(cnt):
                    row = out[n, o, oy0 + yy]
                    act_into(wide[k * span + yy * wq:k * span + yy * wq + wo], row, b, code)


@njit(**OPTIONS)
def _gather(row, xc, k, cnt, p0, wo, sh, sw, oy_off, ox_off, h, wd):
    """``row[k:k + cnt]`` = the input values under output positions ``p0 ..`` (flattened
    ``oy * wo + ox``) of one (channel, tap): ``xc[oy * sh + oy_off, ox * sw + ox_off]``, zero
    outside the input (the padding); the in-range columns of each output row found once."""
    zero = row.dtype.type(0.0)
    lo_ox = (-ox_off + sw - 1) // sw if ox_off < 0 else 0  # first ox with a column >= 0
    hi_ox = (wd - 1 - ox_off) // sw + 1 if wd - 1 - ox_off >= 0 else 0  # past the last one < wd
    p = p0
    end = k + cnt
    while k < end:
        oy = p // wo
        ox0 = p - oy * wo
        run = min(wo - ox0, end - k)
        iy = oy * sh + oy_off
        if iy < 0 or iy >= h:
            for q in range(run):
                row[k + q] = zero
        else:
            xr = xc[iy]
            a = min(max(lo_ox - ox0, 0), run)
            b = min(max(hi_ox - ox0, a), run)
            for q in range(a):
                row[k + q] = zero
            start = (ox0 + a) * sw + ox_off
            if sw == 1:
                src = xr[start:start + b - a]
                for q in range(b - a):
                    row[k + a + q] = src[q]
            else:
                for q in range(b - a):
                    row[k + a + q] = xr[start + q * sw]
            for q in range(b, run):
                row[k + q] = zero
        k += run
        p += run


@njit(**OPTIONS)
def im2col_gemm(x, w2, bias, out, sh, sw, dh, dw, pt, pl, kh, kw, groups, nb, code, first, last):
    """conv2d as GEMMs on blocks of output positions, everything for a block in cache: ``x``
    (N, C, H, W) any strides, ``w2`` (O, C/g * kh * kw) C-contiguous, ``out`` (N, O, Ho, Wo)
    C-contiguous. A task is (image, group, block of ``nb`` output positions): its columns
    (C/g * kh * kw, nb) gathered from the input (zeros for the padding, no padded copy), one
    BLAS call (:func:`_gemm`, in this thread) with the group's weights writing the block's run of
    each output channel in place, then the bias and activation over it while it is in cache
    (:data:`FUSED`). Tasks ``first:last``."""
    n_img, _, h, wd = x.shape
    o_out, kk = w2.shape
    cg = kk // (kh * kw)
    og = o_out // groups
    ho, wo = out.shape[2], out.shape[3]
    hw = ho * wo
    nblk = (hw + nb - 1) // nb
    has_bias = bias.shape[0] > 0
    dt = out.dtype
    width = min(nb, hw)
    cols = np.empty((kk, width), dt)
    cf = cols.reshape(-1)
    wf = w2.reshape(-1)
    of = out.reshape(-1)
    ab = _unit_alpha(dt, 0)
    for t in range(first, last):
        n, g, b0, cnt = _task(t, groups, nblk, nb, hw)
        for c in range(cg):
            xc = x[n, g * cg + c]
            for i in range(kh):
                for j in range(kw):
                    _gather(cols[(c * kh + i) * kw + j], xc, 0, cnt, b0, wo, sh, sw, i * dh - pt, j * dw - pl, h, wd)
        # the block's output rows written in place (leading dimension HW), then the epilogue
        _gemm(wf, g * og * kk, kk, cf, 0, width, of, (n * o_out + g * og) * hw + b0, hw, og, cnt, kk, ab)
        for oo in range(og):
            o = g * og + oo
            act_row(of[(n * o_out + o) * hw + b0:(n * o_out + o) * hw + b0 + cnt], bias[o] if has_bias else dt.type(0.0), code)


@njit(**OPTIONS)
def pointwise_gemm(x, w, bias, out, groups, nb, code, first, last):
    """1x1 conv2d with stride 1 and no padding as GEMMs on the operands in place: ``x`` (N, C, HW)
    and ``out`` (N, O, HW) C-contiguous and flat, ``w`` (O * C/g) flat. A task is (image, group,
    block of ``nb`` positions): ``out[n, group, block] = w[group] @ x[n, group, block]``, one BLAS
    call reading the block of the image's channels through its leading dimension (no column
    buffer, no copy) and writing the output's rows in place, then the bias and activation
    (:data:`FUSED`) over the block while it is in cache. Tasks ``first:last``."""
    n_img, c_in, hw = x.shape
    o_out = out.shape[1]
    cg = c_in // groups
    og = o_out // groups
    nblk = (hw + nb - 1) // nb
    has_bias = bias.shape[0] > 0
    dt = out.dtype
    xf = x.reshape(-1)
    of = out.reshape(-1)
    ab = _unit_alpha(dt, 0)
    for t in range(first, last):
        n, g, b0, cnt = _task(t, groups, nblk, nb, hw)
        _gemm(w, g * og * cg, cg, xf, (n * c_in + g * cg) * hw + b0, hw,
              of, (n * o_out + g * og) * hw + b0, hw, og, cnt, cg, ab)
        for oo in range(og):
            o = g * og + oo
            act_row(of[(n * o_out + o) * hw + b0:(n * o_out + o) * hw + b0 + cnt], bias[o] if has_bias else dt.type(0.0), code)


@njit(**OPTIONS)
def pointwise_strips(x, wt, bias, out, groups, nb, code, first, last):
    """1x1 conv2d with stride 1 and no padding, register-blocked as :func:`direct_strips` with the
    input channels as its taps, for short reductions (few input channels per group), where a BLAS
    call spends much of its time packing its operands: the cpu suite's 64 -> 128 on 8 x 56 x 56
    is, per image, (128 x 64) @ (64 x 3136), 64 multiply-adds per output.

    ``x`` (N, C, HW) and ``out`` (N, O, HW) C-contiguous; ``wt`` flat (groups, kblocks, C/g,
    ``STRIP_CHANNELS``): each group's weights in blocks of ``STRIP_CHANNELS`` output channels (zero
    past the group's last), per input channel the block's channels together; ``bias`` flat
    (groups, kblocks, ``STRIP_CHANNELS``) in the same blocks (zeros without a bias); ``code`` the
    fused activation (:data:`FUSED`). A task is (image, group, block of ``nb``
    positions), tasks ``first:last``. For each block of output channels, each strip of
    ``STRIP_VECTORS`` vectors of positions sums every input channel in registers
    (:func:`_strip_fma`: per channel 3 vector loads of ``x`` read in place, 8 weight broadcasts, 24
    fused multiply-adds) and is stored straight into the output's rows with the bias and ReLU
    added in registers (:func:`_strip_save_act`: a separate pass over the rows, even in L1,
    took a sixth of the time on the cpu suite's 1x1 case). The input
    block (C/g x ``nb``) is read from memory once and from cache by every block of channels; each
    output value is written once. The block's last partial strip reads its columns from a
    zero-padded copy (a strip never reads past the input), and a partial block of channels (O/g
    not a multiple of ``STRIP_CHANNELS``) or a partial strip is saved to a buffer whose valid part
    is copied out. One rounding per multiply-add, in input-channel order, as a BLAS dot product."""
    c_in, hw = x.shape[1], x.shape[2]
    o_out = out.shape[1]
    cg = c_in // groups
    og = o_out // groups
    kc = STRIP_CHANNELS
    kblocks = (og + kc - 1) // kc
    step = STRIP_VECTORS * (VECTOR_BYTES // x.itemsize)  # positions per strip
    nblk = (hw + nb - 1) // nb
    xf = x.reshape(-1)
    of = out.reshape(-1)
    tail = np.zeros(cg * step, x.dtype)  # the last partial strip's columns, zero-padded
    buf = np.empty(kc * step, x.dtype)  # a strip that does not fit the output
    relu = code == 2
    zero = x.dtype.type(0.0)
    for t in range(first, last):
        n, g, b0, cnt = _task(t, groups, nblk, nb, hw)
        xbase = (n * c_in + g * cg) * hw + b0
        full = cnt // step * step
        rest = cnt - full
        if rest:  # the last partial strip's columns, zero-padded (element loops: a slice
            # assignment compiles numba's whole broadcasting setitem, most of this loop's first use)
            for c in range(cg):
                for j in range(step):
                    tail[c * step + j] = xf[xbase + c * hw + full + j] if j < rest else zero
        for kb in range(kblocks):
            wbase = (g * kblocks + kb) * cg * kc
            o0 = g * og + kb * kc
            kk = min(kc, og - kb * kc)
            obase = (n * o_out + o0) * hw + b0
            bbase = (g * kblocks + kb) * kc
            # one call site each for the strip's sums and its store (each expands to every vector
            # of the strip: fewer sites compile faster): the last partial strip reads the padded
            # copy, and a strip short of channels or positions is stored through ``buf``
            for q in range(0, cnt, step):
                src, at, stride = (xf, xbase + q, hw) if q < full else (tail, 0, step)
                acc = _strip_zero(xf)
                for c in range(cg):
                    _strip_fma(acc, src, at + c * stride, wt, wbase + c * kc)
                whole = kk == kc and q < full
                dst, off, ld = (of, obase + q, hw) if whole else (buf, 0, step)
                _strip_save_act(acc, dst, off, ld, bias, bbase, relu)
                if not whole:
                    m = min(step, cnt - q)
                    for k in range(kk):
                        for j in range(m):
                            of[obase + k * hw + q + j] = buf[k * step + j]


@njit(**OPTIONS)
def images_gemm(x, w2, bias, out, sh, sw, dh, dw, pt, pl, kh, kw, groups, nb, code, first, last):
    """conv2d as one GEMM per block of ``nb`` whole images, for small maps: the arguments are
    :func:`im2col_gemm`'s, a task is (block of images, group). Its columns (C/g * kh * kw,
    images * Ho * Wo) built image after image, channel by channel: the channel's plane copied
    once into a zero-padded buffer (``pad``: the rows and columns the taps reach; its padding
    stays zero from call to call), then each tap's rows copied from it, no bounds to check
    (:func:`_gather` per (channel, tap), a call and the bounds of every output row, took 1.36 ms a
    task on 512 channels 3x3 on two 7 x 7 images, this 0.52); one BLAS call with the group's
    weights into a buffer (og, images * Ho * Wo), whose rows are then copied into each image's
    output with the bias and activation (:data:`FUSED`). On a 7 x 7 map an image gives the GEMM
    49 columns, where BLAS runs at 70 % of its rate on a few hundred (512 x 4608 weights: 1.85 ms
    for 49 columns, 5.3 for 196, one thread). Tasks ``first:last``."""
    n_img, _, h, wd = x.shape
    o_out, kk = w2.shape
    cg = kk // (kh * kw)
    og = o_out // groups
    ho, wo = out.shape[2], out.shape[3]
    hw = ho * wo
    has_bias = bias.shape[0] > 0
    dt = out.dtype
    width = min(nb, n_img) * hw
    cols = np.empty((kk, width), dt)
    acc = np.empty(og * width, dt)
    hp = (ho - 1) * sh + (kh - 1) * dh + 1  # the padded plane's rows and columns that taps read
    wp = (wo - 1) * sw + (kw - 1) * dw + 1
    pad = np.zeros((hp, wp), dt)
    r0, r1 = min(pt, hp), min(hp, pt + h)  # its rows and columns that hold the input's
    c0, c1 = min(pl, wp), min(wp, pl + wd)
    cf = cols.reshape(-1)
    wf = w2.reshape(-1)
    of = out.reshape(-1)
    ab = _unit_alpha(dt, 0)
    for t in range(first, last):
        blk = t // groups
        g = t - blk * groups
        n0 = blk * nb
        m = min(nb, n_img - n0)
        cnt = m * hw
        for q in range(m):
            for c in range(cg):
                xc = x[n0 + q, g * cg + c]
                for r in range(r0, r1):
                    pr = pad[r]
                    xr = xc[r - pt]
                    for k in range(c0, c1):
                        pr[k] = xr[k - pl]
                for i in range(kh):
                    for j in range(kw):
                        dst = cols[(c * kh + i) * kw + j]
                        for oy in range(ho):
                            src = pad[oy * sh + i * dh]
                            d0 = q * hw + oy * wo
                            if sw == 1:
                                for ox in range(wo):
                                    dst[d0 + ox] = src[j * dw + ox]
                            else:
                                for ox in range(wo):
                                    dst[d0 + ox] = src[j * dw + ox * sw]
        _gemm(wf, g * og * kk, kk, cf, 0, width, acc, 0, cnt, og, cnt, kk, ab)
        for oo in range(og):
            o = g * og + oo
            bv = bias[o] if has_bias else dt.type(0.0)
            for q in range(m):
                dst = of[((n0 + q) * o_out + o) * hw:((n0 + q) * o_out + o + 1) * hw]
                src = acc[oo * cnt + q * hw:oo * cnt + (q + 1) * hw]
                for k in range(hw):
                    dst[k] = src[k]
                act_row(dst, bv, code)


@njit(**OPTIONS)
def shift_gemm(x, wt, bias, out, kh, kw, dh, dw, pt, pl, wp, rows, groups, code, first, last):
    """conv2d with stride 1 as one GEMM per kernel tap, no im2col: ``x`` (N, C, H, W) any
    strides, ``wt`` (kh * kw * O * C/g) flat, the weights ordered (tap, O, C/g), ``out`` (N, O,
    Ho, Wo) C-contiguous. A task is (image, group, block of ``rows`` output rows): the block's
    input rows are copied once into a zero-padded buffer (C/g, rows + (kh - 1) dh, Wp) that stays
    in cache, then for each tap (i, j) ``acc += w[tap] @ buffer[:, shifted by i dh Wp + j dw]``
    (BLAS, the shifted window read through its leading dimension): ``acc`` is the block computed
    *wide* (every one of the Wp padded columns of each output row, as :func:`direct_wide`; the
    values read past a row's end, and the buffer's unwritten slack, reach only dropped columns).
    The buffer is not zeroed per range: each row is written whole, its padding included (zeroing
    it cost as much as the copy, once per range of tasks). The kept columns are then copied
    out with the bias and activation (:data:`FUSED`). Tasks ``first:last``."""
    n_img, c_in, h, wd = x.shape
    o_out, ho = out.shape[1], out.shape[2]
    cg = c_in // groups
    og = o_out // groups
    nblk = (ho + rows - 1) // rows
    rin = rows + (kh - 1) * dh
    plane = rin * wp + (kw - 1) * dw
    has_bias = bias.shape[0] > 0
    dt = out.dtype
    buf = np.empty(cg * plane, dt)  # every row read for a kept output is written whole below
    acc = np.empty(og * rows * wp, dt)
    ab = _unit_alpha(dt, 0)  # beta set per tap
    for t in range(first, last):
        n, g, y0, cnt = _task(t, groups, nblk, rows, ho)
        span = cnt * wp
        for c in range(cg):
            xc = x[n, g * cg + c]
            for q in range(cnt + (kh - 1) * dh):
                iy = y0 + q - pt
                dst = buf[c * plane + q * wp:c * plane + (q + 1) * wp]
                if 0 <= iy < h:
                    src = xc[iy]
                    for k in range(pl):
                        dst[k] = 0
                    for k in range(wd):
                        dst[pl + k] = src[k]
                    for k in range(pl + wd, wp):
                        dst[k] = 0
                else:
                    for k in range(wp):
                        dst[k] = 0
        for i in range(kh):
            for j in range(kw):
                tap = i * kw + j
                ab[1] = 0 if tap == 0 else 1
                _gemm(wt, (tap * o_out + g * og) * cg, cg, buf, i * dh * wp + j * dw, plane,
                      acc, 0, span, og, span, cg, ab)
        for oo in range(og):
            o = g * og + oo
            _crop(out[n, o, y0:y0 + cnt], acc[oo * span:(oo + 1) * span], wp,
                  bias[o] if has_bias else dt.type(0.0), code)


@njit(inline="always", **OPTIONS)
def _tapped(phase, k, d, s):
    """Whether some tap ``i < k`` reads stride phase ``phase``: ``(i * d) % s == phase`` (a 1x1
    stride-2 conv reads one phase of four: the others are never filled)."""
    for i in range(k):
        if (i * d) % s == phase:
            return True
    return False


@njit(inline="always", **OPTIONS)
def _phase_columns(buf, cols, cg, kh, kw, sh, sw, dh, dw, nph, plane, wq, span):
    """The block's columns (C/g * kh * kw, span) from its phase planes: per (channel, tap), one
    contiguous copy of ``span`` values of the tap's phase, shifted by the tap's offset."""
    for c in range(cg):
        for i in range(kh):
            py, oy = (i * dh) % sh, (i * dh) // sh
            for j in range(kw):
                px, ox = (j * dw) % sw, (j * dw) // sw
                start = (c * nph + py * sw + px) * plane + oy * wq + ox
                src = buf[start:start + span]
                row = ((c * kh + i) * kw + j) * span
                dst = cols[row:row + span]
                for k in range(span):
                    dst[k] = src[k]


@njit(inline="always", **OPTIONS)
def _phase_fill(x, buf, n, c0, cg, y0, cnt, halo, kh, kw, sh, sw, dh, dw, pt, pl, wq, plane):
    """The stride phases of a block of rows (:func:`phase_gemm`): phase (py, px) of channel ``c0 +
    c`` into ``buf[(c * sh * sw + py * sw + px) * plane + q * wq:][:wq]`` for block row ``q <
    cnt + halo``: the padded input at rows ``(y0 + q) * sh + py`` and columns ``k * sw + px``,
    zeros outside the input. Each row written whole (its padding included); phases no tap reads
    are skipped."""
    h, wd = x.shape[2], x.shape[3]
    nph = sh * sw
    for c in range(cg):
        xc = x[n, c0 + c]
        for py in range(sh):
            if not _tapped(py, kh, dh, sh):
                continue
            for q in range(cnt + halo):
                iy = (y0 + q) * sh + py - pt
                for px in range(sw):
                    if not _tapped(px, kw, dw, sw):
                        continue
                    dst = buf[(c * nph + py * sw + px) * plane + q * wq:(c * nph + py * sw + px) * plane + (q + 1) * wq]
                    if 0 <= iy < h:
                        src = xc[iy]
                        lo = max(0, (pl - px + sw - 1) // sw)  # first phase column inside the input
                        hi = min(wq, (wd - 1 + pl - px) // sw + 1) if wd - 1 + pl - px >= 0 else 0
                        for k in range(min(lo, wq)):
                            dst[k] = 0
                        for k in range(lo, hi):
                            dst[k] = src[k * sw + px - pl]
                        for k in range(max(hi, lo), wq):
                            dst[k] = 0
                    else:
                        for k in range(wq):
                            dst[k] = 0


@njit(inline="always", **OPTIONS)
def _phase_out(out, acc, bias, n, o0, og, y0, cnt, wq, code):
    """A block's ``acc`` (og, cnt * wq), computed wide, into ``out[n, o0:o0 + og, y0:y0 + cnt]``:
    the kept columns, the bias and the activation (:data:`FUSED`)."""
    has_bias = bias.shape[0] > 0
    dt = out.dtype
    span = cnt * wq
    for oo in range(og):
        o = o0 + oo
        _crop(out[n, o, y0:y0 + cnt], acc[oo * span:(oo + 1) * span], wq, bias[o] if has_bias else dt.type(0.0), code)


# The strided conv2d of ``numba_im2col`` (:func:`phase_gemm`'s scheme) has three paths, each its own
# loop of one signature (one parallel wrapper, ``par_phase``, runs any): only the path a problem
# takes compiles on its first use (the three in one loop compiled 1.5 s, each alone about half).

@njit(**OPTIONS)
def phase_gemm(x, w2, wt, bias, out, kh, kw, sh, sw, dh, dw, pt, pl, wq, rows, groups, code, first, last):
    """Strided conv2d as im2col + GEMM with the columns copied in long contiguous runs: ``x``
    (N, C, H, W) any strides, ``w2`` (O * C/g * kh * kw) flat in its own order, ``out`` (N, O, Ho,
    Wo) C-contiguous (``wt`` unused: :func:`phase_taps`'s). A task is (image, group, block of
    ``rows`` output rows). The block's input is first split into its stride phases, zero-padded
    (:func:`_phase_fill`): phase (py, px) of channel c holds the padded input at rows ``y * sh +
    py`` and columns ``x * sw + px`` (row length ``wq``). Tap (i, j) then reads phase ((i dh) %
    sh, (j dw) % sw) shifted by ((i dh) // sh, (j dw) // sw) at unit stride, so its column row for
    the whole block, computed *wide* over the ``wq`` phase columns (the ones past Wo are dropped),
    is one contiguous copy (where a gather per output row and tap reads every sw-th value: the 7x7
    stem's columns cost more than its GEMM). One BLAS call per task, then the kept columns copied
    out with the bias and activation (:data:`FUSED`). Tasks ``first:last``. 1x1 convs take
    :func:`phase_1x1`, many channels per group :func:`phase_taps`."""
    c_in = x.shape[1]
    o_out, ho = out.shape[1], out.shape[2]
    cg = c_in // groups
    og = o_out // groups
    kk = cg * kh * kw
    nblk = (ho + rows - 1) // rows
    halo = ((kh - 1) * dh) // sh
    plane = (rows + halo) * wq + ((kw - 1) * dw) // sw
    nph = sh * sw
    dt = out.dtype
    buf = np.empty(cg * nph * plane, dt)  # rows written whole; the slack reaches dropped columns only
    cols = np.empty(kk * rows * wq, dt)
    acc = np.empty(og * rows * wq, dt)
    ab = _unit_alpha(dt, 0)
    for t in range(first, last):
        n, g, y0, cnt = _task(t, groups, nblk, rows, ho)
        span = cnt * wq
        _phase_fill(x, buf, n, g * cg, cg, y0, cnt, halo, kh, kw, sh, sw, dh, dw, pt, pl, wq, plane)
        _phase_columns(buf, cols, cg, kh, kw, sh, sw, dh, dw, nph, plane, wq, span)
        _gemm(w2, g * og * kk, kk, cols, 0, span, acc, 0, span, og, span, kk, ab)
        _phase_out(out, acc, bias, n, g * og, og, y0, cnt, wq, code)


@njit(**OPTIONS)
def phase_1x1(x, w2, wt, bias, out, kh, kw, sh, sw, dh, dw, pt, pl, wq, rows, groups, code, first, last):
    """:func:`phase_gemm` for a 1x1 conv (``kh == kw == 1``): its columns are its phase (0, 0)
    rows, which the GEMM reads in place (the channels' rows ``sh * sw`` planes apart: one leading
    dimension); no copy of columns."""
    c_in = x.shape[1]
    o_out, ho = out.shape[1], out.shape[2]
    cg = c_in // groups
    og = o_out // groups
    nblk = (ho + rows - 1) // rows
    plane = rows * wq
    nph = sh * sw
    dt = out.dtype
    buf = np.empty(cg * nph * plane, dt)  # rows written whole; the other phases are never read
    acc = np.empty(og * rows * wq, dt)
    ab = _unit_alpha(dt, 0)
    for t in range(first, last):
        n, g, y0, cnt = _task(t, groups, nblk, rows, ho)
        span = cnt * wq
        _phase_fill(x, buf, n, g * cg, cg, y0, cnt, 0, 1, 1, sh, sw, dh, dw, pt, pl, wq, plane)
        _gemm(w2, g * og * cg, cg, buf, 0, nph * plane, acc, 0, span, og, span, cg, ab)
        _phase_out(out, acc, bias, n, g * og, og, y0, cnt, wq, code)


@njit(**OPTIONS)
def phase_taps(x, w2, wt, bias, out, kh, kw, sh, sw, dh, dw, pt, pl, wq, rows, groups, code, first, last):
    """:func:`phase_gemm` without columns, for many channels per group: ``wt`` the weights ordered
    (tap, O, C/g), flat (``w2`` unused). One GEMM per tap reads the tap's shifted phase rows in
    place (the channels' rows of one phase are ``sh * sw`` planes apart: one leading dimension),
    accumulating into the block, as :func:`shift_gemm` does for stride 1 (K = C/g per GEMM)."""
    c_in = x.shape[1]
    o_out, ho = out.shape[1], out.shape[2]
    cg = c_in // groups
    og = o_out // groups
    nblk = (ho + rows - 1) // rows
    halo = ((kh - 1) * dh) // sh
    plane = (rows + halo) * wq + ((kw - 1) * dw) // sw
    nph = sh * sw
    dt = out.dtype
    buf = np.empty(cg * nph * plane, dt)  # rows written whole; the slack reaches dropped columns only
    acc = np.empty(og * rows * wq, dt)
    ab = _unit_alpha(dt, 0)  # beta set per tap
    for t in range(first, last):
        n, g, y0, cnt = _task(t, groups, nblk, rows, ho)
        span = cnt * wq
        _phase_fill(x, buf, n, g * cg, cg, y0, cnt, halo, kh, kw, sh, sw, dh, dw, pt, pl, wq, plane)
        for i in range(kh):
            py, oy = (i * dh) % sh, (i * dh) // sh
            for j in range(kw):
                px, ox = (j * dw) % sw, (j * dw) // sw
                tap = i * kw + j
                ab[1] = 0 if tap == 0 else 1
                _gemm(wt, (tap * o_out + g * og) * cg, cg, buf, (py * sw + px) * plane + oy * wq + ox, nph * plane,
                      acc, 0, span, og, span, cg, ab)
        _phase_out(out, acc, bias, n, g * og, og, y0, cnt, wq, code)


@njit(**OPTIONS)
def batch_columns(x, w2, cols, bias, out, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, mb, code, first, last):
    """The columns of the whole batch: ``cols`` (C * kh * kw, N * Ho * Wo) (image-major positions)
    from ``x`` (N, C, H, W) any strides, zeros for the padding; one task per (image, channel),
    tasks ``first:last``. A 1x1 conv with stride 1 and no padding copies whole planes. (The
    arguments of :func:`batch_gemm` too: one signature, one parallel wrapper for both.)"""
    c_in, h, wd = x.shape[1], x.shape[2], x.shape[3]
    hw = ho * wo
    for t in range(first, last):
        n = t // c_in
        c = t - n * c_in
        xc = x[n, c]
        for i in range(kh):
            for j in range(kw):
                _gather(cols[(c * kh + i) * kw + j], xc, n * hw, hw, 0, wo, sh, sw, i * dh - pt, j * dw - pl, h, wd)


@njit(**OPTIONS)
def batch_gemm(x, w2, cols, bias, out, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, mb, code, first, last):
    """``out[:, block] = w2[block] @ cols`` for blocks of ``mb`` output channels, tasks
    ``first:last``: one BLAS call per block over the whole batch's positions (the weights packed
    once per block, where a GEMM per image packs them once per image: on 7 x 7 maps they
    outweigh its 49 columns), then the block's rows scattered into ``out`` (N, O, Ho * Wo) with
    the bias and activation (:data:`FUSED`) while they are in cache; ``out`` is (N, O, Ho * Wo)
    (the other arguments are :func:`batch_columns`'s)."""
    o_out, kk = w2.shape
    n_img, hw = out.shape[0], out.shape[2]
    npos = n_img * hw
    has_bias = bias.shape[0] > 0
    dt = out.dtype
    acc = np.empty(mb * npos, dt)
    ab = _unit_alpha(dt, 0)
    wf = w2.reshape(-1)
    cf = cols.reshape(-1)
    for t in range(first, last):
        m0 = t * mb
        m = min(mb, o_out - m0)
        _gemm(wf, m0 * kk, kk, cf, 0, npos, acc, 0, npos, m, npos, kk, ab)
        for oo in range(m):
            o = m0 + oo
            bv = bias[o] if has_bias else dt.type(0.0)
            for n in range(n_img):
                dst = out[n, o]
                src = acc[oo * npos + n * hw:oo * npos + (n + 1) * hw]
                for k in range(hw):
                    dst[k] = src[k]
                act_row(dst, bv, code)


# -- Winograd F(2x2, 3x3) and F(4x4, 3x3) ------------------------------------------------------------
# A 3x3 stride-1 convolution as P GEMMs of (O x C) @ (C x tiles), one per position of an input tile:
# F(2x2, 3x3) on 4 x 4 tiles that give 2 x 2 outputs each (P = 16: 2.25x fewer multiply-adds than
# direct), F(4x4, 3x3) on 6 x 6 tiles that give 4 x 4 (P = 36: 4x fewer, and intermediates of 2.25x
# the input or output where F(2x2)'s are 4x), for three cheap passes (input, weight and output
# transforms). V = B^T d B per input tile d, U = G g G^T per filter g, Y = A^T (U . V) A per tile
# (Lavin and Gray, 2015). F(2x2, 3x3):
#   B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]
#   G = [[1, 0, 0], [1/2, 1/2, 1/2], [1/2, -1/2, 1/2], [0, 0, 1]],  A^T = [[1, 1, 1, 0], [0, 1, -1, -1]].
# F(4x4, 3x3), Lavin's points 0, +-1, +-2 and infinity:
#   B^T = [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
#          [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]
#   G = [[1/4, 0, 0], [-1/6, -1/6, -1/6], [-1/6, 1/6, -1/6], [1/24, 1/12, 1/6], [1/24, -1/12, 1/6], [0, 0, 1]]
#   A^T = [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]
# F(2x2)'s transforms only add and halve: its error is about the direct product's (a relative 1e-7
# in float32 against the float64 reference on ResNet's layers). F(4x4)'s larger coefficients (5, 8)
# cost some precision: a relative 2-7e-7 measured for 16-512 input channels (1-4e-6 in a NumPy
# model of it with float32 sums), inside the 1e-5 tolerance; both transform the filters in float64.
# Infinite or NaN inputs give NaN over a whole tile's outputs (inf - inf, or 0 * inf, in the
# transforms) where the direct sum may be +-inf, as any Winograd's, the CUDA backend's too.
#
# **One loop per tile size.** All of a tile size's stages are one loop (:func:`wino2`, :func:`wino4`)
# over one range of task numbers, stage after stage, which the launcher runs in groups one after the
# other, each through the parallel wrapper with its offset in the task numbers. F(2x2)'s stages pass
# their intermediates through memory (three groups: the input tiles and the filters; the GEMMs; the
# output tiles); F(4x4)'s transform the filters, then run each block of tiles from input to output
# with its intermediates in L2 (two groups; :func:`wino4`). A first use compiles one loop and one
# wrapper: as four loops (a stage each) F(4x4)'s compiled in 2.22 s, each loop's fixed cost (numba's
# typing and lowering of a function, its LLVM module, the first-class wrapper, the cache entry)
# four times.

#: F(2x2)'s flat scratch ``s`` (T = N * th * tw tiles, th = ceil(Ho / 2), tw = ceil(Wo / 2), P = 16
#: tile positions): ``v`` (P, C, T) from 0, ``u`` (O, P, C) from P C T, ``m`` (P, O, T) from P C T +
#: P O C, then ``ab`` = [1, 0] (the GEMMs' scalars, set by the launcher); F(4x4)'s is ``u`` (O, 36,
#: C) and ``ab``. ``u`` is (O, P, C), not (P, O, C): an output channel's P rows are then neighbours,
#: where 16 rows O * C apart (256 KB on 256 channels) fall into the same cache sets (3.1 ms against
#: 0.5 on 256 x 256 filters).
WINO_LAYOUT = ("v (P, C, T)", "u (O, P, C)", "m (P, O, T)", "ab (2,)")


@njit(inline="always", **OPTIONS)
def _wino_gemm(s, t, c_in, o_out, tiles, npos, mb):
    """GEMM task ``t`` of F(2x2)'s stages (``npos`` 16): ``m[k, block] = u[block, k] @ v[k]`` for tile position
    k and the ``t``-th block of ``mb`` output channels, one BLAS call (``u[block, k]`` read through
    its leading dimension P C), all three in the scratch ``s`` (:data:`WINO_LAYOUT`)."""
    u0 = npos * c_in * tiles
    m0 = u0 + npos * o_out * c_in
    ab0 = m0 + npos * o_out * tiles
    nblk = (o_out + mb - 1) // mb
    k = t // nblk
    o0 = (t - k * nblk) * mb
    cnt = min(mb, o_out - o0)
    _gemm(s, u0 + (o0 * npos + k) * c_in, npos * c_in, s, k * c_in * tiles, tiles, s,
          m0 + (k * o_out + o0) * tiles, tiles, cnt, tiles, c_in, s[ab0:ab0 + 2])


@njit(**OPTIONS)
def wino2(x, w, bias, out, s, pt, pl, mb, tile, code, first, last):
    """Winograd F(2x2, 3x3), tasks ``first:last`` of its stages (``tile`` is 2):

    * tasks ``[0, C)``: ``v[k, c, tile] = (B^T d B)[k]`` for every 4 x 4 input tile ``d`` of
      channel c, image after image (zero-padded; ``x`` (N, C, H, W) any strides): per row of
      tiles the four input rows are combined down the columns at once, then across each tile's
      four columns;
    * ``[C, C + O)``: ``u[o, k, c] = (G g G^T)[k]`` for each filter ``g = w[o, c]`` of output
      channel o (computed in float64; ``w`` (O, C, 3, 3) C-contiguous and flat);
    * the next ``16 ceil(O / mb)``: the GEMMs (:func:`_wino_gemm`);
    * the next ``O``: ``out[:, o]`` (``out`` (N, O, Ho, Wo)), image after image, each tile's 2 x 2
      outputs ``A^T m A`` (the last row or column of tiles may be cut by the map), then the bias
      and activation (:data:`FUSED`).

    A task takes a channel of every image, not one (image, channel) plane: v's and m's rows
    for (k, c) are then written and read whole, in order (per plane, runs of Wo / 2 values in 16
    places each: on 256 channels at 4 x 14 x 14 the input stage took 0.53 ms, now 0.42-0.45, the
    output 0.36, now 0.29).

    v, u and m are in the flat scratch ``s`` (:data:`WINO_LAYOUT`)."""
    n_img, c_in, h, wd = x.shape
    o_out, ho, wo = out.shape[1], out.shape[2], out.shape[3]
    th, tw = (ho + 1) // 2, (wo + 1) // 2
    tiles = n_img * th * tw
    u0 = 16 * c_in * tiles
    m0 = u0 + 16 * o_out * c_in
    n_in = c_in
    n_w = n_in + o_out
    n_g = n_w + 16 * ((o_out + mb - 1) // mb)
    has_bias = bias.shape[0] > 0
    dt = out.dtype
    width = 2 * tw + 2
    rows = np.empty((8, width), dt)  # four input rows, then B^T d; written whole per row of tiles
    gt = np.empty(12, np.float64)  # G g (4 x 3), in float64 as the products after it
    sc = np.empty((8, tw), dt)  # A^T m
    floor = dt.type(0.0) if code == 2 else dt.type(-np.inf)  # ReLU's, or none (-inf stays -inf)
    for t in range(first, last):
        if t < n_in:  # the input tiles of channel c, image after image (v's rows for (k, c) written in order)
            c = t
            step = c_in * tiles  # from one tile position's plane of v to the next
            for n in range(n_img):
                xc = x[n, c]
                for ty in range(th):
                    for r in range(4):
                        iy = 2 * ty + r - pt
                        row = rows[r]
                        if 0 <= iy < h:
                            src = xc[iy]
                            for q in range(width):
                                ix = q - pl
                                row[q] = src[ix] if 0 <= ix < wd else 0
                        else:
                            for q in range(width):
                                row[q] = 0
                    for q in range(width):  # B^T d: the rows
                        r0, r1, r2, r3 = rows[0, q], rows[1, q], rows[2, q], rows[3, q]
                        rows[4, q] = r0 - r2
                        rows[5, q] = r1 + r2
                        rows[6, q] = r2 - r1
                        rows[7, q] = r1 - r3
                    base = c * tiles + (n * th + ty) * tw
                    for i in range(4):  # (B^T d) B: the columns of each tile, into planes 4 i .. 4 i + 3 of v
                        ti = rows[4 + i]
                        dst = 4 * i * step + base
                        for tx in range(tw):
                            a, b, cc, dd = ti[2 * tx], ti[2 * tx + 1], ti[2 * tx + 2], ti[2 * tx + 3]
                            s[dst + tx] = a - cc
                            s[dst + step + tx] = b + cc
                            s[dst + 2 * step + tx] = cc - b
                            s[dst + 3 * step + tx] = b - dd
        elif t < n_w:  # the filters of output channel o
            o = t - n_in
            uo = u0 + o * 16 * c_in
            for c in range(c_in):
                f = (o * c_in + c) * 9  # the filter's 3 x 3 values in the flat w
                for j in range(3):  # G g: rows g0, (g0 + g1 + g2) / 2, (g0 - g1 + g2) / 2, g2
                    a, b, d = np.float64(w[f + j]), np.float64(w[f + 3 + j]), np.float64(w[f + 6 + j])
                    gt[j] = a
                    gt[3 + j] = 0.5 * (a + b + d)
                    gt[6 + j] = 0.5 * (a - b + d)
                    gt[9 + j] = d
                for k in range(4):  # (G g) G^T, row by row: (a, b, d) -> (a, (a + b + d) / 2, (a - b + d) / 2, d)
                    a, b, d = gt[3 * k], gt[3 * k + 1], gt[3 * k + 2]
                    r = uo + 4 * k * c_in + c
                    s[r] = a
                    s[r + c_in] = 0.5 * (a + b + d)
                    s[r + 2 * c_in] = 0.5 * (a - b + d)
                    s[r + 3 * c_in] = d
        elif t < n_g:
            _wino_gemm(s, t - n_w, c_in, o_out, tiles, 16, mb)
        else:  # the output tiles of output channel o, image after image (m's rows for (k, o) read in order)
            o = t - n_g
            step = o_out * tiles  # from one tile position's plane of m to the next
            bv = bias[o] if has_bias else dt.type(0.0)
            for n in range(n_img):
                for ty in range(th):
                    base = m0 + o * tiles + (n * th + ty) * tw
                    for j in range(4):  # A^T m: the two rows of each tile, per column j
                        src = base + j * step
                        m0r = s[src:src + tw]
                        m1r = s[src + 4 * step:src + 4 * step + tw]
                        m2r = s[src + 8 * step:src + 8 * step + tw]
                        m3r = s[src + 12 * step:src + 12 * step + tw]
                        for tx in range(tw):
                            sc[j, tx] = m0r[tx] + m1r[tx] + m2r[tx]
                            sc[4 + j, tx] = m1r[tx] - m2r[tx] - m3r[tx]
                    for i in range(2):  # (A^T m) A: the two columns
                        oy = 2 * ty + i
                        if oy >= ho:
                            break
                        row = out[n, o, oy]
                        for tx in range(tw):
                            a, b, cc, dd = sc[4 * i, tx], sc[4 * i + 1, tx], sc[4 * i + 2, tx], sc[4 * i + 3, tx]
                            row[2 * tx] = a + b + cc
                            if 2 * tx + 1 < wo:
                                row[2 * tx + 1] = b - cc - dd
                        for q in range(wo):  # the bias and ReLU as act_row's (NaN kept), one loop
                            v = row[q] + bv
                            row[q] = floor if v < floor else v


@njit(**OPTIONS)
def wino4(x, w, bias, out, s, pt, pl, mb, tile, code, first, last):
    """Winograd F(4x4, 3x3) on 6 x 6 input tiles 4 apart (``tile`` is 4), tasks ``first:last``,
    with its transforms and GEMMs *fused* per block of tiles: F(2x2)'s stages pass v and m through
    memory (a 64 x 1568 x 64 GEMM streaming its operands ran 56 GFLOP/s on one core here, 64 x 112
    x 64 from L2 159), so here a task computes a block of tiles from input to output in a working
    set sized for L2:

    * tasks ``[0, O)``: ``u[o, k, c] = (G g G^T)[k]`` for the filters of output channel o, into
      ``u`` (O, 36, C) at the start of the flat scratch ``s`` (then ``ab`` = [1, 0], the GEMMs'
      scalars), in float64, filter by filter, by multiplications with the reciprocals (divisions
      took 26-40 ns a filter, 10 ms on 512 x 512 filters; vectorized down rows of C values, 21-23
      ns; this way 16-17 ns on 128-256 channels: 0.27 ms on 128 x 128, 1.0 ms on 256 x 256);
    * ``[O, O + N ceil(th / mb))``: (image, block of ``mb`` rows of tiles, T_b tiles): the block's
      ``v`` (36, C, T_b) ``= B^T d B`` per tile, per channel (per row of tiles the six input rows,
      the map's part copied and the padding zeroed, combined down the columns at once, then across
      each tile's six columns); then 36 GEMMs ``m[k] = u[:, k] @ v[k]`` (O x T_b, BLAS in this
      thread, ``u[:, k]`` read through its leading dimension 36 C); then per output channel each
      tile's 4 x 4 outputs ``A^T m A``, cut to the map, with the bias and activation
      (:data:`FUSED`). ``v`` and ``m`` are this call's buffers, reused by its tasks.

    The transforms' products are in the operands' dtype (constants of it: no float64 products)."""
    n_img, c_in, h, wd = x.shape
    o_out, ho, wo = out.shape[1], out.shape[2], out.shape[3]
    th, tw = (ho + 3) // 4, (wo + 3) // 4
    nblk = (th + mb - 1) // mb
    tb = min(mb, th) * tw  # tiles of a block at most
    ab0 = 36 * o_out * c_in
    has_bias = bias.shape[0] > 0
    dt = out.dtype
    c2, c4, c5, c8 = dt.type(2.0), dt.type(4.0), dt.type(5.0), dt.type(8.0)
    width = 4 * tw + 2
    rows = np.empty((12, width), dt)  # six input rows, then B^T d; written whole per row of tiles
    lo, hi = min(pl, width), min(max(pl, 0) + wd, width)  # the row's columns inside the map
    gt = np.empty(18, np.float64)  # G g (6 x 3) of one filter, in float64 as the products after it
    q4, q6, q12, q24 = 0.25, 1.0 / 6.0, 1.0 / 12.0, 1.0 / 24.0
    sc = np.empty((24, tw), dt)  # A^T m: row i of each tile at column j in sc[6 i + j]
    rw = np.empty(4 * tw, dt)  # one output row of the tiles, cut to Wo when copied out
    floor = dt.type(0.0) if code == 2 else dt.type(-np.inf)  # ReLU's, or none (-inf stays -inf)
    v = np.empty(36 * c_in * tb if first < last and last > o_out else 0, dt)  # (36, C, T_b)
    m = np.empty(36 * o_out * tb if first < last and last > o_out else 0, dt)  # (36, O, T_b)
    for t in range(first, last):
        if t < o_out:  # the filters of output channel o
            o = t
            uo = o * 36 * c_in
            for c in range(c_in):
                f = (o * c_in + c) * 9  # the filter's 3 x 3 values in the flat w
                for j in range(3):  # G g, column j: g0 / 4, -(g0 + g1 + g2) / 6, -(g0 - g1 + g2) / 6, ..., g2
                    a, b, d = np.float64(w[f + j]), np.float64(w[f + 3 + j]), np.float64(w[f + 6 + j])
                    e = a + d
                    gt[j] = q4 * a
                    gt[3 + j] = -q6 * (e + b)
                    gt[6 + j] = -q6 * (e - b)
                    gt[9 + j] = q24 * a + q12 * b + q6 * d
                    gt[12 + j] = q24 * a - q12 * b + q6 * d
                    gt[15 + j] = d
                for k in range(6):  # (G g) G^T, row k of G g into u's rows 6 k .. 6 k + 5
                    a, b, d = gt[3 * k], gt[3 * k + 1], gt[3 * k + 2]
                    e = a + d
                    r = uo + 6 * k * c_in + c
                    s[r] = q4 * a
                    s[r + c_in] = -q6 * (e + b)
                    s[r + 2 * c_in] = -q6 * (e - b)
                    s[r + 3 * c_in] = q24 * a + q12 * b + q6 * d
                    s[r + 4 * c_in] = q24 * a - q12 * b + q6 * d
                    s[r + 5 * c_in] = d
            continue
        r = t - o_out  # (image, block of rows of tiles)
        n = r // nblk
        ty0 = (r - n * nblk) * mb
        nty = min(mb, th - ty0)
        nt = nty * tw  # this block's tiles
        step = c_in * nt  # from one tile position's plane of v to the next
        for c in range(c_in):  # the input tiles, channel by channel
            xc = x[n, c]
            for ty in range(ty0, ty0 + nty):
                for rr in range(6):
                    iy = 4 * ty + rr - pt
                    row = rows[rr]
                    if 0 <= iy < h:
                        src = xc[iy]
                        for q in range(lo):
                            row[q] = 0
                        for q in range(lo, hi):
                            row[q] = src[q - pl]
                        for q in range(hi, width):
                            row[q] = 0
                    else:
                        for q in range(width):
                            row[q] = 0
                for q in range(width):  # B^T d: the rows
                    d0, d1, d2, d3, d4, d5 = rows[0, q], rows[1, q], rows[2, q], rows[3, q], rows[4, q], rows[5, q]
                    a = d4 - c4 * d2
                    b = d3 - c4 * d1
                    cc = d4 - d2
                    dd = c2 * (d3 - d1)
                    rows[6, q] = c4 * d0 - c5 * d2 + d4
                    rows[7, q] = a + b
                    rows[8, q] = a - b
                    rows[9, q] = cc + dd
                    rows[10, q] = cc - dd
                    rows[11, q] = c4 * d1 - c5 * d3 + d5
                base = c * nt + (ty - ty0) * tw
                for i in range(6):  # (B^T d) B: the columns of each tile, into planes 6 i .. 6 i + 5 of v
                    ti = rows[6 + i]
                    dst = 6 * i * step + base
                    for tx in range(tw):
                        q = 4 * tx
                        d0, d1, d2, d3, d4, d5 = ti[q], ti[q + 1], ti[q + 2], ti[q + 3], ti[q + 4], ti[q + 5]
                        a = d4 - c4 * d2
                        b = d3 - c4 * d1
                        cc = d4 - d2
                        dd = c2 * (d3 - d1)
                        v[dst + tx] = c4 * d0 - c5 * d2 + d4
                        v[dst + step + tx] = a + b
                        v[dst + 2 * step + tx] = a - b
                        v[dst + 3 * step + tx] = cc + dd
                        v[dst + 4 * step + tx] = cc - dd
                        v[dst + 5 * step + tx] = c4 * d1 - c5 * d3 + d5
        for k in range(36):  # m[k] (O x nt) = u[:, k] (O x C, leading dimension 36 C) @ v[k] (C x nt)
            _gemm(s, k * c_in, 36 * c_in, v, k * step, nt, m, k * o_out * nt, nt, o_out, nt, c_in, s[ab0:ab0 + 2])
        mstep = o_out * nt  # from one tile position's plane of m to the next
        for o in range(o_out):  # the output tiles, channel by channel
            bv = bias[o] if has_bias else dt.type(0.0)
            for ty in range(ty0, ty0 + nty):
                base = o * nt + (ty - ty0) * tw
                for j in range(6):  # A^T m: the four rows of each tile, per column j
                    src = base + j * mstep
                    r0 = m[src:src + tw]
                    r1 = m[src + 6 * mstep:src + 6 * mstep + tw]
                    r2 = m[src + 12 * mstep:src + 12 * mstep + tw]
                    r3 = m[src + 18 * mstep:src + 18 * mstep + tw]
                    r4 = m[src + 24 * mstep:src + 24 * mstep + tw]
                    r5 = m[src + 30 * mstep:src + 30 * mstep + tw]
                    for tx in range(tw):
                        a, b = r1[tx] + r2[tx], r1[tx] - r2[tx]
                        cc, dd = r3[tx] + r4[tx], r3[tx] - r4[tx]
                        sc[j, tx] = r0[tx] + a + cc
                        sc[6 + j, tx] = b + c2 * dd
                        sc[12 + j, tx] = a + c4 * cc
                        sc[18 + j, tx] = b + c8 * dd + r5[tx]
                for i in range(min(4, ho - 4 * ty)):  # (A^T m) A: the four columns
                    for tx in range(tw):
                        e0, e1, e2 = sc[6 * i, tx], sc[6 * i + 1, tx], sc[6 * i + 2, tx]
                        e3, e4, e5 = sc[6 * i + 3, tx], sc[6 * i + 4, tx], sc[6 * i + 5, tx]
                        a, b = e1 + e2, e1 - e2
                        cc, dd = e3 + e4, e3 - e4
                        rw[4 * tx] = e0 + a + cc
                        rw[4 * tx + 1] = b + c2 * dd
                        rw[4 * tx + 2] = a + c4 * cc
                        rw[4 * tx + 3] = b + c8 * dd + e5
                    row = out[n, o, 4 * ty + i]
                    for q in range(wo):  # the bias and ReLU as act_row's (NaN kept), in the same pass
                        vq = rw[q] + bv
                        row[q] = floor if vq < floor else vq


@njit(**OPTIONS)
def reorder_taps(w, wt):
    """``wt[tap, o, c] = w[o, c, tap]`` (``w`` (O, C/g, kh * kw), ``wt`` (kh * kw, O, C/g)): the
    weights of :func:`shift_gemm`, read once in order (a NumPy transpose of the 4-D weights
    copies with a stride of kh * kw elements in its inner loop: 5 ms on 512 x 512 x 3 x 3)."""
    o_out, cg, taps = w.shape
    for o in range(o_out):
        for c in range(cg):
            for t in range(taps):
                wt[t, o, c] = w[o, c, t]


# -- the GEMM loops on numba's own threads ---------------------------------------------------------
# One prange over ``pieces`` contiguous ranges of tasks, each range one call of a plain loop above.
# The launchers set numba's chunk size to 1 around the call (:func:`.conv.run_dynamic`: not in here,
# where it would make the loops uncacheable), so the ranges are handed out one at a time: a thread
# whose core is busy with another library's spinning threads takes fewer of them. On numba's
# threads, not Python's: after every parallel region (the elementwise kernels between the
# convolutions) numba's OpenMP workers spin for a while, and on 2 cores a Python thread started
# meanwhile waits for a core: ResNet-50's convolutions ran a third slower on Python threads.
#
# The wrappers call the loop by address (``fn``, a first-class function: :func:`.jit.task`), not by
# name. A call by name links the callee's whole call tree into the caller's LLVM module, which
# numba then optimizes again (O3) as part of the caller: three times for a ``parallel=True``
# wrapper (its parfor's kernel, the kernel's gufunc wrapper, the function itself). By address,
# the loop is optimized once, in its own module, and a wrapper compiles in about 0.35 s whatever
# the loop: numba_gemm's par_shift took 0.82 s over its loop's 1.0, Winograd's four-stage par_wino
# 2.9 s over its loops' 2.0. Loops that run one after the other in a kernel take one argument
# list (the batch's and Winograd's stages), so that one wrapper, compiled once, runs them all.
# Nothing in a wrapper is worth LLVM's optimizer (``WRAPPER``: numba's ``optnone``).

#: a loop as a first-class function for the wrappers (:func:`.jit.task`, shared with the softmax loops)
from .jit import task, wrapper_options  # noqa: E402, F401

#: the wrappers' options: parallel, LLVM's optimizer off (:func:`.jit.wrapper_options`)
WRAPPER = wrapper_options(**OPTIONS)


@njit(**WRAPPER)
def par_pointwise(fn, x, w, bias, out, groups, nb, code, tasks, pieces):
    """:func:`pointwise_gemm` (``fn``) over ``tasks`` tasks cut into ``pieces`` ranges, in parallel."""
    for p in prange(pieces):
        fn(x, w, bias, out, groups, nb, code, tasks * p // pieces, tasks * (p + 1) // pieces)


@njit(**WRAPPER)
def par_shift(fn, x, wt, bias, out, kh, kw, dh, dw, pt, pl, wp, rows, groups, code, tasks, pieces):
    """:func:`shift_gemm` (``fn``) over ``tasks`` tasks cut into ``pieces`` ranges, in parallel."""
    for p in prange(pieces):
        fn(x, wt, bias, out, kh, kw, dh, dw, pt, pl, wp, rows, groups, code,
           tasks * p // pieces, tasks * (p + 1) // pieces)


@njit(**WRAPPER)
def par_im2col(fn, x, w2, bias, out, sh, sw, dh, dw, pt, pl, kh, kw, groups, nb, code, tasks, pieces):
    """:func:`im2col_gemm` (``fn``) over ``tasks`` tasks cut into ``pieces`` ranges, in parallel."""
    for p in prange(pieces):
        fn(x, w2, bias, out, sh, sw, dh, dw, pt, pl, kh, kw, groups, nb, code,
           tasks * p // pieces, tasks * (p + 1) // pieces)


@njit(**WRAPPER)
def par_phase(fn, x, w2, wt, bias, out, kh, kw, sh, sw, dh, dw, pt, pl, wq, rows, groups, code, tasks, pieces):
    """:func:`phase_gemm`, :func:`phase_1x1` or :func:`phase_taps` (``fn``) over ``tasks`` tasks cut
    into ``pieces`` ranges, in parallel."""
    for p in prange(pieces):
        fn(x, w2, wt, bias, out, kh, kw, sh, sw, dh, dw, pt, pl, wq, rows, groups, code,
           tasks * p // pieces, tasks * (p + 1) // pieces)


@njit(**WRAPPER)
def par_batch(fn, x, w2, cols, bias, out, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, mb, code, tasks, pieces):
    """A stage of ``numba_batch`` (``fn``: :func:`batch_columns` or :func:`batch_gemm`) over
    ``tasks`` tasks cut into ``pieces`` ranges, in parallel."""
    for p in prange(pieces):
        fn(x, w2, cols, bias, out, kh, kw, sh, sw, dh, dw, pt, pl, ho, wo, mb, code,
           tasks * p // pieces, tasks * (p + 1) // pieces)


@njit(**WRAPPER)
def par_depthwise(fn, x, w, bias, out, sh, sw, dh, dw, pt, pl, hp, wp, code, tasks, pieces):
    """:func:`depthwise_wide` or :func:`depthwise_rows` (``fn``) over ``tasks`` tasks cut into
    ``pieces`` ranges, in parallel."""
    for p in prange(pieces):
        fn(x, w, bias, out, sh, sw, dh, dw, pt, pl, hp, wp, code, tasks * p // pieces, tasks * (p + 1) // pieces)


@njit(**WRAPPER)
def par_direct(fn, x, wt, toff, bias, out, sh, sw, pt, pl, rows, rt, wq, groups, code, tasks, pieces):
    """:func:`direct_strips` (``fn``) over ``tasks`` tasks cut into ``pieces`` ranges, in parallel."""
    for p in prange(pieces):
        fn(x, wt, toff, bias, out, sh, sw, pt, pl, rows, rt, wq, groups, code,
           tasks * p // pieces, tasks * (p + 1) // pieces)


@njit(**WRAPPER)
def par_wino(fn, x, w, bias, out, s, pt, pl, mb, tile, code, off, tasks, pieces):
    """A group of Winograd's stages (``fn``: :func:`wino2` or :func:`wino4`), its tasks ``off``
    .. ``off + tasks``, cut into ``pieces`` ranges, in parallel."""
    for p in prange(pieces):
        fn(x, w, bias, out, s, pt, pl, mb, tile, code, off + tasks * p // pieces, off + tasks * (p + 1) // pieces)
