"""The elementwise family on CUDA (``elementwise.cu``): ``add``/``sub``/``mul``/``div``, ``neg``
and the activations, each optionally followed by an activation (``epilogue.cuh``) in the same
kernel, so a fused chain ``act(a op b)`` (the binary operators' ``activation=``) is one launch,
computed in the accumulator type and rounded once. One source; the defines pick the
operator, the activation and one of three paths, chosen from the operands' layout:

* ``vector`` (KIND 1): every operand C-contiguous in the output's shape: a grid-stride loop over
  128-bit words (scalar access when an address is not 16-byte aligned).
* ``broadcast`` (KIND 2, binary): one operand C-contiguous in the output's shape, the other
  repeated: a scalar, a row (bias over the last dims), a column, an NCHW channel bias: element
  ``i`` reads ``g[(i // div) % mod]``, with 128-bit access where the word shares one ``g`` value
  or reads a 16-byte-aligned word of ``g``; no division inside the loop.
* ``strided`` (KIND 3): anything else (transposed or sliced views, broadcasting on both sides):
  dims collapsed on the host to at most 6, 64-bit offsets, no copy of any operand.

Other CUDA code calls the same launchers through :func:`prepare_elementwise` (once, in its
``prepare``) or :func:`binary_act` (a one-off launch), e.g. a GEMM's bias + GELU after its
main loop as one launch.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opruntime.kernels import Kernel, Problem, itemsize
from opruntime.ops.elementwise import BINARY_OPS, MAX_DIMS, UNARY_OPS, Layout, activation, layout

from . import compile as cc
from .epilogue import ACT
from .memory import empty

DTYPE_CODE = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3}
DTYPES = frozenset(DTYPE_CODE)
SOURCE = "elementwise.cu"
#: the OP define: binary operators, and the unary operator applied before the activation
OP_CODE: dict[str | None, int] = {None: 0, "add": 1, "sub": 2, "mul": 3, "div": 4, "neg": 5}
KIND = {"vector": 1, "broadcast": 2, "strided": 3}
ENTRY = {"vector": "ew_contig", "broadcast": "ew_bcast", "strided": "ew_strided"}
#: threads per block, and resident blocks per SM the grid is sized to (a grid-stride loop); WAVES=0:
#: a grid of one unit (a 128-bit word) per thread, every load of the array in flight at once. The
#: estimate does not tell them apart, so the order is the heuristic's choice: on the H100 the
#: contiguous path with WAVES=0 matched torch (8192^2 fp16 add 134.5 us, torch 134.0; gelu 96.9 / 94.9)
#: where the grid-stride WAVES=8 took 143 and 111.5 (unrolling the grid-stride loop 2 or 4 words
#: deep, or streaming cache hints, gained at most 1%; CUDA events)
CONFIGS: tuple[dict[str, int], ...] = (dict(THREADS=256, WAVES=0), dict(THREADS=256, WAVES=8),
                                       dict(THREADS=512, WAVES=4), dict(THREADS=128, WAVES=16),
                                       dict(THREADS=128, WAVES=0))
STRIDED_CONFIGS: tuple[dict[str, int], ...] = (dict(THREADS=256, WAVES=8), dict(THREADS=512, WAVES=4))
#: fraction of the copy bandwidth each path is expected to reach (the estimate only ranks them)
EFFICIENCY = {"vector": 0.92, "broadcast": 0.9, "strided": 0.5}
LAUNCH_S = 2.5e-6


# -- the table ----------------------------------------------------------------------------------------

def kernels() -> list[Kernel]:
    src = cc.source(SOURCE)
    out = []
    for op in (*BINARY_OPS, *UNARY_OPS):
        paths = ("vector", "broadcast", "strided") if op in BINARY_OPS else ("vector", "strided")
        for path in paths:
            out.append(Kernel(op, f"cupy.{op}.{path}", "cuda", DTYPES, prepare=_preparer(path), supports=_supports(path),
                              cost=_cost(path), configs=STRIDED_CONFIGS if path == "strided" else CONFIGS,
                              source=src))
    return out


# -- layout -------------------------------------------------------------------------------------------

def _layout(problem: Problem) -> Layout:
    return layout(problem.shapes, problem.strides, problem.out_shape)


def _vector_mode(lay: Layout, dtype: str) -> int:
    """The BMODE of a broadcast layout with 128-bit access (0: scalar access only)."""
    w = 16 // itemsize(dtype)
    if lay.mod == 1 or lay.div % w == 0:
        return 1
    if lay.div == 1 and lay.mod % w == 0:
        return 2
    return 0


def _supports(path: str) -> Callable[[Problem], bool]:
    def supports(problem: Problem) -> bool:
        return path == "strided" or _layout(problem).path == path

    supports.__name__ = f"supports_{path}"
    return supports


def _cost(path: str) -> Callable[[Problem, Mapping[str, int]], float]:
    def cost(problem: Problem, config: Mapping[str, int]) -> float:
        size = itemsize(problem.dtype)
        nbytes = float(sum(math.prod(s) for s in problem.shapes) + math.prod(problem.out_shape)) * size
        eff = EFFICIENCY[path]
        if path == "broadcast" and _vector_mode(_layout(problem), problem.dtype) == 0:
            eff *= 0.7
        return nbytes / (problem.device.provider.figures()[2] * eff) + LAUNCH_S

    return cost


# -- launching ----------------------------------------------------------------------------------------

def _preparer(path: str) -> Callable[[Problem, Mapping[str, int]], Callable[..., Any]]:
    def prepare(problem: Problem, config: Mapping[str, int]) -> Callable[..., Any]:
        binary = problem.op in BINARY_OPS
        op = problem.op if binary or problem.op == "neg" else None
        prov = problem.device.provider
        return prepare_elementwise(op, activation(problem), problem.dtype, problem.shapes,
                                   problem.strides, problem.out_shape, prov.index, prov.sm_count, config,
                                   path=path, label=f"cupy.{problem.op}.{path}")

    prepare.__name__ = f"prepare_{path}"
    return prepare


def prepare_elementwise(op: str | None, act: str | None, dtype: str, shapes: Sequence[tuple[int, ...]],
                        strides: Sequence[tuple[int, ...] | None], out_shape: tuple[int, ...], device: int,
                        sm_count: int, config: Mapping[str, int] | None = None, *, path: str | None = None,
                        label: str = "cupy.elementwise") -> Callable[..., Any]:
    """Compile ``out = act(a op b)`` (two operands: ``op`` one of add/sub/mul/div) or
    ``out = act(op(a))`` (one operand: ``op`` None or ``"neg"``) for operands of these shapes and
    element strides, and return ``launch(*operands, out=None) -> out``.

    Args:
        op: the arithmetic; act: an activation name of ``epilogue.ACT`` (None: none).
        dtype: the element dtype of the operands and the output (all equal).
        shapes, strides: per operand (CuPy arrays: ``a.shape``, ``a.strides`` // itemsize);
            they broadcast to ``out_shape`` as NumPy does.
        device, sm_count: the CUDA device index and its SM count (the grid is sized to it).
        config: ``THREADS`` and ``WAVES`` (default: the first of :data:`CONFIGS`).
        path: ``"vector"``, ``"broadcast"``, ``"strided"`` or None (the layout's own).

    ``launch`` runs on the current stream and takes arrays of exactly the shapes and strides
    given (addresses may differ per call: a misaligned one gets scalar access). ``out`` is a new
    C-contiguous array, or the one passed: it may be the operand that is C-contiguous in the
    output's shape (``bias_act(c, bias, out=c)`` after a GEMM, in place), never a repeated one.
    """
    import cupy

    config = dict(config or CONFIGS[0])
    lay = layout(shapes, strides, out_shape, strided=path == "strided")
    path = path or lay.path
    arity = len(shapes)
    if path == "strided" and not lay.fits:  # more than 6 dims after merging: contiguous copies first
        inner = prepare_elementwise(op, act, dtype, [tuple(out_shape)] * arity, [None] * arity, out_shape, device,
                                    sm_count, config, path="vector", label=label)

        def copied(*xs: Any, out: Any = None) -> Any:
            return inner(*(cupy.ascontiguousarray(cupy.broadcast_to(x, out_shape)) for x in xs), out=out)

        return copied
    if path != "strided" and lay.path != path:
        raise ValueError(f"{label}: the {path} path does not apply to operands {list(shapes)} with strides "
                         f"{list(strides)}")
    base = {"DTYPE": DTYPE_CODE[dtype], "ARITY": arity, "OP": OP_CODE[op], "ACT": ACT[act], "KIND": KIND[path]}
    threads, w, n = config["THREADS"], 16 // itemsize(dtype), lay.n
    cap = max(1, sm_count * config["WAVES"]) if config["WAVES"] else 2 ** 31 - 1
    getdev = cupy.cuda.runtime.getDevice
    shape = tuple(out_shape)

    def fn(**defines: int) -> Any:
        return cc.get_function(SOURCE, ENTRY[path], {**base, **defines}, device, kernel=label)

    if path == "strided":
        dims, st = lay.dims, lay.strides
        sb = st[1] if arity == 2 else (0,) * MAX_DIMS
        tx = min(threads, 1 << max(0, (dims[-1] - 1).bit_length()))
        ty = threads // tx
        rows = math.prod(dims[:-1])
        gx = max(1, min(-(-dims[-1] // tx), cap))
        gy = max(1, min(-(-rows // ty), 65535, max(1, cap // gx)))
        fast = cc.FastLaunch(fn(), (gx, gy), (tx, ty), pointers=3,
                             scalars=[ctypes.c_int64(v) for v in (*dims, *st[0], *sb)])

        def strided(*xs: Any, out: Any = None) -> Any:
            if getdev() != device:
                with cupy.cuda.Device(device):
                    return strided(*xs, out=out)
            y = empty(shape, xs[0].dtype, label) if out is None else out
            fast(xs[0].data.ptr, xs[-1].data.ptr if arity == 2 else 0, y.data.ptr)
            return y

        return strided

    def grid(unit: int) -> int:
        return max(1, min(-(-(n // unit or 1) // threads), cap))

    if path == "vector":
        def build(vec: int) -> Callable[[int, int, int], None]:
            return cc.FastLaunch(fn(VEC=vec), (grid(w if vec else 1),), (threads,), pointers=3,
                                 scalars=[ctypes.c_int64(n)])

        fast_v = build(1)
        slow: list[Any] = []

        def vector(*xs: Any, out: Any = None) -> Any:
            if getdev() != device:
                with cupy.cuda.Device(device):
                    return vector(*xs, out=out)
            y = empty(shape, xs[0].dtype, label) if out is None else out
            pa, pb, po = xs[0].data.ptr, xs[-1].data.ptr if arity == 2 else 0, y.data.ptr
            if (pa | pb | po) & 15:
                if not slow:
                    slow.append(build(0))
                slow[0](pa, pb, po)
            else:
                fast_v(pa, pb, po)
            return y

        return vector

    # broadcast: f is the full operand, g the repeated one
    fi, div, mod = lay.full, lay.div, lay.mod
    bmode = _vector_mode(lay, dtype)

    def build_b(vec: int) -> Callable[[int, int, int], None]:
        unit = w if vec else 1
        g = grid(unit)
        step = g * threads * unit  # elements each thread advances per iteration
        defines = {"VEC": vec, "SWAP": int(fi == 1), "BMODE": bmode or 1}
        return cc.FastLaunch(fn(**defines), (g,), (threads,), pointers=3,
                             scalars=[ctypes.c_int64(v) for v in (n, div, mod, step % div, (step // div) % mod)])

    fast_b = build_b(1) if bmode else None
    slow_b: list[Any] = []

    def broadcast(a: Any, b: Any, out: Any = None) -> Any:
        if getdev() != device:
            with cupy.cuda.Device(device):
                return broadcast(a, b, out=out)
        y = empty(shape, a.dtype, label) if out is None else out
        f, g = (a, b) if fi == 0 else (b, a)
        pf, pg, po = f.data.ptr, g.data.ptr, y.data.ptr
        if fast_b is not None and not (pf | po | (pg if bmode == 2 else 0)) & 15:
            fast_b(pf, pg, po)
        else:
            if not slow_b:
                slow_b.append(build_b(0))
            slow_b[0](pf, pg, po)
        return y

    return broadcast


def binary_act(op: str, act: str | None, a: Any, b: Any, out: Any = None, config: Mapping[str, int] | None = None) -> Any:
    """``act(a op b)`` on CuPy arrays of one dtype in one launch (NumPy broadcasting), e.g.
    ``binary_act("add", "gelu", y, bias, out=y)``: a GEMM result's bias and GELU, in place.

    A one-off: it compiles (cached) and builds the launch on every call; code that repeats a
    call keeps :func:`prepare_elementwise`'s launcher instead.
    """
    import cupy
    import numpy as np

    shapes = [tuple(a.shape), tuple(b.shape)]
    strides = [tuple(s // a.dtype.itemsize for s in a.strides), tuple(s // b.dtype.itemsize for s in b.strides)]
    out_shape = tuple(np.broadcast_shapes(*shapes))
    dtype = "bfloat16" if a.dtype.name == "bfloat16" else a.dtype.name
    dev = a.device.id
    sms = cupy.cuda.Device(dev).attributes["MultiProcessorCount"]
    return prepare_elementwise(op, act, dtype, shapes, strides, out_shape, dev, sms, config)(a, b, out=out)


def build_variants() -> list[tuple[str, dict]]:
    """(file, defines) CI compiles: each path in each dtype, both access widths, every operator on
    the vector path (every activation in float32 and float16), a fused binary + activation on each
    path (``add(..., activation="relu")``, ResNet's residual, on the 128-bit vector path)."""
    out = []
    for dtype, code in DTYPE_CODE.items():
        d = {"DTYPE": code}
        for op in ("add", "sub", "mul", "div"):
            out.append((SOURCE, {**d, "ARITY": 2, "OP": OP_CODE[op], "ACT": 0, "KIND": 1, "VEC": 1}))
        out.append((SOURCE, {**d, "ARITY": 2, "OP": 4, "ACT": 2, "KIND": 1, "VEC": 0}))
        out.append((SOURCE, {**d, "ARITY": 2, "OP": 1, "ACT": ACT["relu"], "KIND": 1, "VEC": 1}))  # add(..., activation="relu")
        acts = [a for a in ACT if a] if dtype in ("float32", "float16") else ["gelu_tanh", "silu"]
        for act in acts:
            out.append((SOURCE, {**d, "ARITY": 1, "OP": 0, "ACT": ACT[act], "KIND": 1, "VEC": 1}))
        out.append((SOURCE, {**d, "ARITY": 1, "OP": 5, "ACT": 0, "KIND": 1, "VEC": 0}))
        for swap in (0, 1):
            for bmode in (1, 2):
                out.append((SOURCE, {**d, "ARITY": 2, "OP": 2 + 2 * swap, "ACT": 3 * bmode - 3, "KIND": 2, "VEC": 1,
                                     "SWAP": swap, "BMODE": bmode}))
        out.append((SOURCE, {**d, "ARITY": 2, "OP": 1, "ACT": 4, "KIND": 2, "VEC": 0, "SWAP": 0, "BMODE": 1}))
        out.append((SOURCE, {**d, "ARITY": 2, "OP": 3, "ACT": 1, "KIND": 3}))
        out.append((SOURCE, {**d, "ARITY": 1, "OP": 0, "ACT": 5, "KIND": 3}))
    return out
