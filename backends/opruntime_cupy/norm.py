"""layer_norm, rms_norm and batch_norm (inference) on CUDA (``norm.cu``).

layer_norm / rms_norm see ``x`` as rows of the normalized trailing dims; one read of the data
and one write, the row held in registers, the variance the exact two-pass one over those
registers (mean first, then the centred sum of squares), fp32 accumulation for fp16 / bf16:

* ``warp``: a group of up to 32 threads per row (fewer for short rows), several rows in flight
  per group, 128-bit loads and stores; rows up to 1024 elements.
* ``block``: a block per row, the row in registers; rows past 256 elements up to 32768.
* ``loop``: a block per row of any length, the row read three times (the last two mostly from
  L2): for rows too long for registers.

batch_norm folds the running variance and the weight into one scale per channel (computed per
thread in the kernel, from the four vectors in L1) and computes ``(x - mean) * scale + bias``,
the centring first in the accumulation type (fp32 for fp16 / bf16 / fp32, fp64 for fp64): a
subtraction and one FMA per element. Folding the mean into the bias (``x * scale + shift``) would
lose an ulp of ``|mean * scale|`` where the output is near zero.

* ``planes``: a 2-D grid over (chunks of one (n, c) plane, planes), 128-bit access along the
  plane; for planes of a few hundred elements and more.
* ``flat``: one grid-stride loop over every element, the channel from the flat index: small
  planes (S = 1 for a 2-D input, 7x7 maps).

The row families need the normalized dims to collapse to one unit-stride run and the leading dims
to one row stride; anything else is made contiguous first (as is a strided weight, bias or
running statistic, and a strided batch_norm input). 128-bit access needs the row length, row
stride and every base address 16-byte aligned; otherwise the same config runs with scalar access
(built when first needed). weight and bias are compile-time options (``HAS_W`` / ``HAS_B``).

Each kernel's ``prepare(problem, config)`` plans the run once (compiled function, grid, a
``FastLaunch`` with the scalar arguments packed) and returns ``launch(x, *vectors)``.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable, Mapping
from typing import Any

from opruntime.kernels import Kernel, Problem, c_strides, itemsize, strided_run

from . import compile as cc
from .memory import empty

DTYPE_CODE = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3}
DTYPES = frozenset(DTYPE_CODE)
SOURCE = "norm.cu"
LAUNCH_S = 2.5e-6  # launch and the smallest kernel's run, seconds
WARP_MAX_COLS = 1024  # 32 threads x 32 values
FAMILY = {"warp": 1, "block": 2, "loop": 3, "planes": 4, "flat": 5}
DEFAULT_EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23, "float64": 2.0 ** -52}

WARP_CONFIGS = ({"threads": 128, "rows": 1}, {"threads": 128, "rows": 2}, {"threads": 256, "rows": 1},
                {"threads": 128, "rows": 4})
BLOCK_CONFIGS = tuple({"threads": t} for t in (256, 512, 1024, 128))
LOOP_CONFIGS = tuple({"threads": t} for t in (512, 256, 1024))
PLANE_CONFIGS = tuple({"threads": t} for t in (256, 128, 512))
FLAT_CONFIGS = ({"threads": 256, "waves": 8}, {"threads": 512, "waves": 4})


def kernels() -> list[Kernel]:
    src = cc.source(SOURCE)
    out = []
    for op in ("layer_norm", "rms_norm"):
        out += [
            #       op  name                  kind    dtypes  prepare                     supports
            Kernel(op, f"cupy.{op}.warp", "cuda", DTYPES, prepare=_rows_preparer(op, "warp"), supports=_warp_ok,
                   cost=_cost("warp"), config_for=_warp_configs, configs=WARP_CONFIGS, source=src),
            Kernel(op, f"cupy.{op}.block", "cuda", DTYPES, prepare=_rows_preparer(op, "block"), supports=_block_ok,
                   cost=_cost("block"), config_for=_block_configs, configs=BLOCK_CONFIGS, source=src),
            Kernel(op, f"cupy.{op}.loop", "cuda", DTYPES, prepare=_rows_preparer(op, "loop"),
                   cost=_cost("loop"), configs=LOOP_CONFIGS, source=src),
        ]
    out += [
        Kernel("batch_norm", "cupy.batch_norm.planes", "cuda", DTYPES, prepare=_batch_preparer("planes"),
               cost=_cost("planes"), configs=PLANE_CONFIGS, source=src),
        Kernel("batch_norm", "cupy.batch_norm.flat", "cuda", DTYPES, prepare=_batch_preparer("flat"),
               cost=_cost("flat"), configs=FLAT_CONFIGS, source=src),
    ]
    return out


# -- layout ------------------------------------------------------------------------------------------
def geometry(problem: Problem) -> tuple[int, int, int, bool]:
    """(rows, cols, row stride, copy): ``copy`` when x must be made contiguous first."""
    shape = problem.shapes[0]
    strides = problem.strides[0] or c_strides(shape)
    k = problem.attrs["dims"]
    lead, inner = len(shape) - k, None
    cols, rows = math.prod(shape[lead:]), math.prod(shape[:lead])
    inner = strided_run(list(zip(shape[lead:], strides[lead:])))
    outer = strided_run(list(zip(shape[:lead], strides[:lead])))
    if inner is None or outer is None or (inner[0] > 1 and inner[1] != 1):
        return rows, cols, cols, True
    return rows, cols, (outer[1] if rows > 1 else cols), False


def _vec(problem: Problem) -> int:
    """Elements per 16-byte access when the shape allows it (addresses are checked at run time)."""
    rows, cols, ldx, _ = geometry(problem)
    v = 16 // itemsize(problem.dtype)
    return v if cols % v == 0 and (rows == 1 or ldx % v == 0) else 1


def _max_values(threads: int, dtype: str) -> int:
    """Values one thread may hold in registers without spilling (nvcc 12: 1024-thread blocks get
    64 registers, of which the row may take 16; 512-thread blocks 128, the row 48)."""
    return (16 if threads >= 1024 else 48 if threads >= 512 else 64) // (2 if dtype == "float64" else 1)


def _spatial(problem: Problem) -> tuple[int, int, int]:
    """batch_norm's (N, C, S)."""
    shape = problem.shapes[0]
    return shape[0], shape[1], math.prod(shape[2:])


# -- supports / configs -----------------------------------------------------------------------------
def _warp_ok(problem: Problem) -> bool:
    return geometry(problem)[1] <= WARP_MAX_COLS


def _warp_configs(problem: Problem) -> list[Mapping[str, Any]]:
    if geometry(problem)[1] > 256:  # long rows: one row per group is enough work in flight
        return list(WARP_CONFIGS)
    # short rows: two or four rows per thread group keep more loads in flight
    return [WARP_CONFIGS[1], WARP_CONFIGS[3], WARP_CONFIGS[0], WARP_CONFIGS[2]]


def _block_configs(problem: Problem) -> list[Mapping[str, Any]]:
    vec = _vec(problem)
    packs = -(-geometry(problem)[1] // vec)
    fits = [c for c in BLOCK_CONFIGS if c["threads"] <= packs
            and -(-packs // c["threads"]) * vec <= _max_values(c["threads"], problem.dtype)]
    # about 16 values per thread: enough loads in flight, several blocks per SM
    return sorted(fits, key=lambda c: (abs(-(-packs // c["threads"]) * vec - 16), -c["threads"]))


def _block_ok(problem: Problem) -> bool:
    return geometry(problem)[1] > 256 and bool(_block_configs(problem))


# -- cost: bytes over bandwidth, scaled by each family's expected efficiency ----------------------------
#: fraction of the copy bandwidth each family is expected to reach (the register families read
#: once and write once, as softmax's measured 0.91-1.0; loop re-reads; flat is scalar and divides)
EFFICIENCY = {"warp": 0.95, "block": 0.93, "loop": 0.7, "planes": 0.9, "flat": 0.55}


def _cost(family: str) -> Callable[[Problem, Mapping[str, Any]], float]:
    def cost(problem: Problem, config: Mapping[str, Any]) -> float:
        n = math.prod(problem.shapes[0])
        nbytes = 2.0 * n * itemsize(problem.dtype)
        bw = problem.device.provider.figures()[2]
        eff = EFFICIENCY[family]
        if family in ("warp", "block", "loop"):
            if _vec(problem) == 1:
                eff *= 0.8
            if geometry(problem)[3]:
                nbytes *= 2  # the contiguous copy first
        elif family == "planes":
            _, _, s = _spatial(problem)
            v = 16 // itemsize(problem.dtype) if s % (16 // itemsize(problem.dtype)) == 0 else 1
            npk = -(-s // v)
            chunk = config["threads"]
            eff *= npk / (-(-npk // chunk) * chunk) * (1.0 if v > 1 else 0.8)  # idle threads of a plane's last chunk
        return nbytes / (bw * eff) + LAUNCH_S

    return cost


# -- running -------------------------------------------------------------------------------------------
def _contiguous(a: Any) -> Any:
    """A C-contiguous copy of ``a`` (bfloat16 copied as 16-bit words: CuPy has no bf16 kernels)."""
    import cupy

    if a.flags.c_contiguous:
        return a
    if a.dtype.name == "bfloat16":
        return cupy.ascontiguousarray(a.view(cupy.uint16)).view(a.dtype)
    return cupy.ascontiguousarray(a)


def _eps(problem: Problem) -> Any:
    eps = problem.attrs["eps"]
    eps = DEFAULT_EPS[problem.dtype] if eps is None else eps
    return (ctypes.c_double if problem.dtype == "float64" else ctypes.c_float)(eps)


def _rows_preparer(op: str, family: str) -> Callable[[Problem, Mapping[str, Any]], Callable[..., Any]]:
    def prepare(problem: Problem, config: Mapping[str, Any]) -> Callable[..., Any]:
        return _build_rows(op, family, problem, config)

    prepare.__name__ = f"prepare_{op}_{family}"
    return prepare


def _rows_defines(op: str, family: str, problem: Problem, config: Mapping[str, Any], vec: int) -> dict[str, int]:
    cols = geometry(problem)[1]
    packs = -(-cols // vec)
    d = {"DTYPE": DTYPE_CODE[problem.dtype], "FAMILY": FAMILY[family], "VEC": vec, "THREADS": config["threads"],
         "RMS": int(op == "rms_norm"), "HAS_W": int(problem.attrs["weight"]),
         "HAS_B": int(problem.attrs.get("bias", False))}
    if family == "warp":
        group = min(32, 1 << max(0, (packs - 1).bit_length()))
        d.update(GROUP=group, PACKS=-(-packs // group), ROWS=config["rows"])
    elif family == "block":
        d.update(PACKS=-(-packs // config["threads"]))
    return d


def _rows_grid(family: str, d: Mapping[str, int], rows: int) -> int:
    if family == "warp":
        per_block = d["THREADS"] // d["GROUP"] * d["ROWS"]
        return max(1, min(-(-rows // per_block), 2**31 - 1))
    return max(1, min(rows, 2**31 - 1))


def _build_rows(op: str, family: str, problem: Problem, config: Mapping[str, Any]) -> Callable[..., Any]:
    """Compile (cached) and return ``launch(x, *vectors) -> y`` for this problem and config."""
    import cupy

    dev = problem.device.provider.index
    shape, name = problem.out_shape, f"cupy.{op}.{family}"
    rows, cols, ldx, copy = geometry(problem)
    vec = _vec(problem)
    has_w, has_b = problem.attrs["weight"], problem.attrs.get("bias", False)

    def function(v: int) -> Any:
        d = _rows_defines(op, family, problem, config, v)
        fn = cc.get_function(SOURCE, f"norm_{family}", d, dev, kernel=name)
        return cc.FastLaunch(fn, (_rows_grid(family, d, rows),), (d["THREADS"],), pointers=4,
                             scalars=[ctypes.c_int64(rows), ctypes.c_int64(cols), ctypes.c_int64(ldx), _eps(problem)])

    fast = function(vec)
    scalar: list[Any] = [fast if vec == 1 else None]  # the scalar-access build, made when first needed
    getdev, alloc, oom = cupy.cuda.runtime.getDevice, cupy.empty, cupy.cuda.memory.OutOfMemoryError

    def launch(x: Any, *vecs: Any) -> Any:
        if getdev() != dev:
            with cupy.cuda.Device(dev):
                return launch(x, *vecs)
        if copy:
            x = _contiguous(x)
        w = _contiguous(vecs[0]) if has_w else None
        b = _contiguous(vecs[-1]) if has_b else None
        xp, wp, bp = x.data.ptr, (w.data.ptr if has_w else 0), (b.data.ptr if has_b else 0)
        run = fast
        if (xp | wp | bp) & 15 and vec > 1:  # a view's offset: 128-bit loads would fault
            run = scalar[0]
            if run is None:
                run = scalar[0] = function(1)
        try:
            y = alloc(shape, x.dtype)
        except oom:
            y = empty(shape, x.dtype, name)  # retried there, raising OutOfMemoryError with the figures
        run(xp, wp, bp, y.data.ptr)
        return y

    return launch


def _batch_preparer(family: str) -> Callable[[Problem, Mapping[str, Any]], Callable[..., Any]]:
    def prepare(problem: Problem, config: Mapping[str, Any]) -> Callable[..., Any]:
        return _build_batch(family, problem, config)

    prepare.__name__ = f"prepare_batch_norm_{family}"
    return prepare


def _build_batch(family: str, problem: Problem, config: Mapping[str, Any]) -> Callable[..., Any]:
    import cupy

    prov = problem.device.provider
    dev, shape, name = prov.index, problem.out_shape, f"cupy.batch_norm.{family}"
    n, c, s = _spatial(problem)
    has_w, has_b = problem.attrs["weight"], problem.attrs["bias"]
    threads = config["threads"]
    vec = 16 // itemsize(problem.dtype) if family == "planes" and s % (16 // itemsize(problem.dtype)) == 0 else 1

    def function(v: int) -> Any:
        d = {"DTYPE": DTYPE_CODE[problem.dtype], "FAMILY": FAMILY[family], "VEC": v, "THREADS": threads,
             "HAS_W": int(has_w), "HAS_B": int(has_b)}
        fn = cc.get_function(SOURCE, f"norm_{family}", d, dev, kernel=name)
        if family == "planes":
            npk = s // v
            grid: tuple[int, ...] = (max(1, min(-(-npk // threads), 2**31 - 1)), max(1, min(n * c, 65535)))
            first = n * c
        else:
            grid = (max(1, min(-(-(n * c * s) // threads), prov.sm_count * config["waves"] * (1024 // threads))),)
            first = n * c * s
        return cc.FastLaunch(fn, grid, (threads,), pointers=6,
                             scalars=[ctypes.c_int64(first), ctypes.c_int64(c), ctypes.c_int64(s), _eps(problem)])

    fast = function(vec)
    scalar: list[Any] = [fast if vec == 1 else None]
    getdev = cupy.cuda.runtime.getDevice

    def launch(x: Any, mean: Any, var: Any, *vecs: Any) -> Any:
        if getdev() != dev:
            with cupy.cuda.Device(dev):
                return launch(x, mean, var, *vecs)
        x, mean, var = _contiguous(x), _contiguous(mean), _contiguous(var)
        w = _contiguous(vecs[0]) if has_w else None
        b = _contiguous(vecs[-1]) if has_b else None
        run = fast
        if x.data.ptr & 15 and vec > 1:
            run = scalar[0]
            if run is None:
                run = scalar[0] = function(1)
        y = empty(shape, x.dtype, name)
        run(x.data.ptr, mean.data.ptr, var.data.ptr, w.data.ptr if has_w else 0, b.data.ptr if has_b else 0,
            y.data.ptr)
        return y

    return launch


def build_variants() -> list[tuple[str, dict]]:
    """(file, defines) that CI compiles (gathered by the package's ``opruntime_build_variants``
    hook): each family in each dtype at its largest register footprint, the scalar-access builds,
    and every weight / bias / rms combination across them."""
    out = []
    for dtype, code in DTYPE_CODE.items():
        vec = 16 // itemsize(dtype)
        base = {"DTYPE": code}
        out += [
            (SOURCE, {**base, "FAMILY": 1, "VEC": vec, "THREADS": 128, "GROUP": 32, "PACKS": 32 // vec, "ROWS": 1,
                      "RMS": 0, "HAS_W": 1, "HAS_B": 1}),
            (SOURCE, {**base, "FAMILY": 1, "VEC": 1, "THREADS": 128, "GROUP": 4, "PACKS": 1, "ROWS": 4,
                      "RMS": 1, "HAS_W": 1, "HAS_B": 0}),
            (SOURCE, {**base, "FAMILY": 2, "VEC": vec, "THREADS": 1024, "PACKS": _max_values(1024, dtype) // vec,
                      "RMS": 0, "HAS_W": 0, "HAS_B": 1}),
            (SOURCE, {**base, "FAMILY": 2, "VEC": 1, "THREADS": 256, "PACKS": _max_values(256, dtype),
                      "RMS": 1, "HAS_W": 0, "HAS_B": 0}),
            (SOURCE, {**base, "FAMILY": 2, "VEC": vec, "THREADS": 512, "PACKS": _max_values(512, dtype) // vec,
                      "RMS": 0, "HAS_W": 1, "HAS_B": 1}),
            (SOURCE, {**base, "FAMILY": 3, "VEC": vec, "THREADS": 512, "RMS": 0, "HAS_W": 1, "HAS_B": 0}),
            (SOURCE, {**base, "FAMILY": 3, "VEC": 1, "THREADS": 256, "RMS": 1, "HAS_W": 1, "HAS_B": 0}),
            (SOURCE, {**base, "FAMILY": 4, "VEC": vec, "THREADS": 256, "HAS_W": 1, "HAS_B": 1}),
            (SOURCE, {**base, "FAMILY": 4, "VEC": 1, "THREADS": 128, "HAS_W": 0, "HAS_B": 1}),
            (SOURCE, {**base, "FAMILY": 5, "VEC": 1, "THREADS": 256, "HAS_W": 1, "HAS_B": 0}),
        ]
    return out
