"""The elementwise family on the CPU: ``add``/``sub``/``mul``/``div`` as one NumPy ufunc into a new
array (broadcasting and strided operands read in place; float16 computed as NumPy does), their
``activation=`` applied in place on that result by this backend's ``epilogue.activate`` (no second
result array; float16 with an activation other than relu computed in float32, one rounding at the
end), ``neg`` as ``np.negative``, and the activations through ``epilogue.activate`` (float16
computed in float32, one rounding at the end).

With numba (:mod:`.jit`), ``numpy.<op>.numba`` does each in one parallel pass (a binary operator
and its activation in one loop): the operands seen as 2-D (flat when both are C-contiguous; a
bias row as one (1, cols) row; otherwise (rows, last dim), broadcast operands with stride 0,
strided ones read in place where NumPy can make the view), or, for an operand repeated through
the output (an NCHW channel bias, a column, a scalar), flat with that operand's values spread
block by block in cache (``binary_cycle``); blocks spread over the threads, and the activations computed with
the vectorized exp / erfc / tanh of :mod:`._nb_math` (NumPy's ufuncs call libm one element at a
time: gelu's erfc alone costs 15 ns an element). float16 is computed in float32.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from opruntime.kernels import FLOATS, Kernel, Problem, itemsize, roofline
from opruntime.ops.elementwise import BINARY_OPS, UNARY_OPS, activation, layout

from . import buffers, jit
from .epilogue import activate
from .matmul import CPU_BYTES, CPU_FLOPS, F16

UFUNCS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}
_quiet = np.errstate(divide="ignore", invalid="ignore", over="ignore")  # IEEE results, no warnings
#: elements of a binary result the NumPy kernel activates at a time (gelu, silu: one temporary
#: of this many elements, 128 KB in float32, instead of one of the result's size)
ACT_BLOCK = 1 << 15


@_quiet
def binary(problem: Problem, config: Any, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The ufunc into a new array of the broadcast shape (0-d too: a bare ufunc call would return
    a scalar), then the activation in place on it, block by block (no second result-sized
    array). relu is exact in any dtype; the others on float16 take a float32 result (the ufunc
    computes in float32 from the float16 operands) and round once at the end."""
    act = activation(problem)
    wide = a.dtype is F16 and act not in (None, "relu")
    out = np.empty(problem.out_shape, np.float32 if wide else a.dtype)
    UFUNCS[problem.op](a, b, out=out, dtype=out.dtype)
    if act is None:
        return out
    flat = out.reshape(-1)  # 1-d: on a 0-d array NumPy's ufuncs give scalars
    if act == "relu":  # no temporary
        activate(act, flat)
    else:  # by blocks: the activation's temporary is a block's, in cache, not a second result
        for i in range(0, flat.shape[0], ACT_BLOCK):
            activate(act, flat[i:i + ACT_BLOCK])
    return out.astype(np.float16) if wide else out


@_quiet
def unary(problem: Problem, config: Any, x: np.ndarray) -> np.ndarray:
    if problem.op == "neg":
        return np.negative(x, out=np.empty(x.shape, x.dtype))
    if problem.op == "relu":  # exact in any dtype: no widening
        return np.maximum(x, x.dtype.type(0), out=np.empty(x.shape, x.dtype))
    y = np.array(x, np.float32 if x.dtype is F16 else x.dtype, order="C", copy=True)
    activate(activation(problem), y.reshape(-1))  # 1-d: on a 0-d array NumPy's ufuncs give scalars
    return y if y.dtype == x.dtype else y.astype(x.dtype)


def as_2d(x: np.ndarray) -> np.ndarray:
    """``x`` as (rows, last dim): a view where NumPy can make one (strided ones too), else a copy."""
    if x.ndim == 0:
        return x.reshape(1, 1)
    return x.reshape(-1, x.shape[-1]) if x.ndim > 1 else x.reshape(1, -1)


def _row_split(problem: Problem) -> tuple[int, int] | None:
    """(rows, cols) when one operand is the output's trailing dims repeated over its leading ones
    (a bias row) and the other has the output's shape: the kernel then reads the row (a
    contiguous (1, cols) array) for every output row; None otherwise."""
    shape = problem.out_shape
    small = [s for s in problem.shapes if s != shape]
    if len(small) != 1 or not small[0] or math.prod(small[0]) == 0:
        return None
    trail = tuple(small[0])
    while trail and trail[0] == 1:
        trail = trail[1:]
    if not trail or len(trail) > len(shape) or shape[len(shape) - len(trail):] != trail:
        return None
    cols = math.prod(trail)
    return math.prod(shape) // cols, cols


def _two_d(problem: Problem) -> Any:
    """``views(a, b) -> (a2, b2, (rows, cols))`` for ``_nb_elementwise.binary``: the operands as it
    reads them, from their layout (``opruntime.ops.elementwise.layout``); None when
    ``binary_cycle`` takes them (see :func:`_cycle`):

    * vector (both C-contiguous in the output's shape): (1, n) each;
    * a bias row repeated over the output's leading dims: (1, cols) against the full (rows, cols);
    * anything else: both broadcast to the output's shape and seen as (rows, last dim) (views
      where NumPy can make them, else copies).
    """
    shape = problem.out_shape
    lay = layout(problem.shapes, problem.strides, shape)
    n = math.prod(shape)
    if lay.path == "vector":
        return lambda a, b: (a.reshape(1, n), b.reshape(1, n), (1, n))
    if _cycle(problem) is not None:
        return None
    split = _row_split(problem)
    if split is not None:  # (rows, cols), an operand that repeats by rows as one (1, cols) row
        return lambda a, b: (a.reshape(-1, split[1]), b.reshape(-1, split[1]), split)

    def general(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
        a2, b2 = (as_2d(v if v.shape == shape else np.broadcast_to(v, shape)) for v in (a, b))
        return a2, b2, a2.shape

    return general


def _cycle(problem: Problem) -> tuple[int, int, int] | None:
    """``(full, div, mod)`` when ``_nb_elementwise.binary_cycle`` takes the problem: one operand
    C-contiguous in the output's shape and the other repeated as ``g[(i // div) % mod]`` with runs
    (``div`` > 1: an NCHW channel bias, a column) or a scalar (``mod`` 1); a bias row (``div`` 1)
    goes to ``binary`` as (1, cols), which reads it in place."""
    lay = layout(problem.shapes, problem.strides, problem.out_shape)
    if lay.path != "broadcast" or (lay.div == 1 and lay.mod > 1):
        return None
    return lay.full, (lay.div if lay.mod > 1 else lay.n), lay.mod


def prepare_numba(problem: Problem, config: Any) -> Any:
    """The launcher of ``numpy.<op>.numba`` (unary or binary)."""
    nb = jit.loops("_nb_elementwise")
    shape = problem.out_shape
    f16 = problem.dtype == "float16"
    if problem.op in UFUNCS:
        code, act = nb.BINARY[problem.op], nb.CODES[activation(problem)]
        views, cycle = _two_d(problem), _cycle(problem)

        @_quiet
        def launch(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            if f16:
                a, b = a.astype(np.float32), b.astype(np.float32)
            if cycle is not None:  # f C-contiguous, g repeated: both read in place, flat
                full, div, mod = cycle
                f, g = (a, b) if full == 0 else (b, a)
                out = buffers.empty(shape, f.dtype)
                args = (f.reshape(-1), np.ascontiguousarray(g).reshape(-1), out.reshape(-1), code)
                if act:
                    jit.call(nb.binary_cycle_act, *args, act, div, mod, full == 1)
                else:
                    jit.call(nb.binary_cycle, *args, div, mod, full == 1)
            else:
                a2, b2, out_2d = views(a, b)
                out = buffers.empty(out_2d, a2.dtype)
                stream = out.nbytes > buffers.STREAM_BYTES and a2.strides[1] == b2.strides[1] == a2.itemsize
                if act:
                    jit.call(nb.binary_act, a2, b2, out, code, act, stream)
                else:
                    jit.call(nb.binary, a2, b2, out, code, stream)
                out = out.reshape(shape)
            return out.astype(np.float16) if f16 else out
    else:
        code = nb.CODES["neg" if problem.op == "neg" else activation(problem)]

        @_quiet
        def launch(x: np.ndarray) -> np.ndarray:  # type: ignore[misc]
            if f16:
                x = x.astype(np.float32)
            # C-contiguous: one flat row, cut into CHUNK blocks (short last dims would make a task
            # and a vector loop's remainder of each row)
            x2 = x.reshape(1, -1) if x.flags.c_contiguous else as_2d(x)
            out = buffers.empty(x2.shape, x2.dtype)
            jit.call(nb.unary, x2, out, code, out.nbytes > buffers.STREAM_BYTES and x2.strides[1] == x2.itemsize)
            out = out.reshape(shape)
            return out.astype(np.float16) if f16 else out

    return jit.first_use(f"numpy.{problem.op}.numba", launch)


#: elements per second of the NumPy activations (libm one element at a time), by op: the cost model
NUMPY_RATE = {"gelu": 0.07e9, "sigmoid": 0.12e9, "silu": 0.4e9, "tanh": 0.4e9}


def cost(problem: Problem, config: Any) -> float:
    """The NumPy kernels: memory-bound, except the activations' libm calls; a binary operator's
    activation is a second pass over its result (read and written again) and its libm calls."""
    n = math.prod(problem.out_shape)
    moved = sum(math.prod(s) for s in problem.shapes) + n
    name = activation(problem)
    compute = n / NUMPY_RATE.get(name or "", CPU_FLOPS)
    if problem.op in UFUNCS and name is not None:
        moved += 2 * n
        compute += n / CPU_FLOPS
    return max(compute, moved * itemsize(problem.dtype) / CPU_BYTES) + 1e-6


def numba_cost(problem: Problem, config: Any) -> float:
    """One parallel pass (float16: and its float32 copies), the activations vectorized."""
    n = math.prod(problem.out_shape)
    moved = sum(math.prod(s) for s in problem.shapes) + n
    per = 6 if problem.dtype == "float16" else itemsize(problem.dtype)
    return roofline(20.0 * n, moved * per, CPU_FLOPS * 4, CPU_BYTES * 1.5, 6e-6)


def kernels() -> list[Kernel]:
    out = ([Kernel(op, f"numpy.{op}.ufunc", "cpu", FLOATS, binary, cost=cost) for op in BINARY_OPS]
           + [Kernel(op, f"numpy.{op}.ufunc", "cpu", FLOATS, unary, cost=cost) for op in UNARY_OPS])
    if jit.available():
        src = jit.source("_nb_elementwise")
        out += [Kernel(op, f"numpy.{op}.numba", "cpu", FLOATS, prepare=prepare_numba, cost=numba_cost, source=src,
                          notes=jit.notes(f"numpy.{op}.numba"))
                for op in (*BINARY_OPS, *UNARY_OPS)]
    return out
