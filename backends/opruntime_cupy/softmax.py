"""softmax / log_softmax on CUDA (``softmax.cu``): one read of the data and one write.

Families (``FAMILY`` in the source), from short rows to long ones:

* ``warp``: a group of up to 32 threads per row (fewer for short rows), the row held in
  registers, 128-bit loads and stores; rows up to 1024 elements.
* ``block``: a block per row, the row held in registers; rows up to 32768 elements.
* ``cluster``: a row split over a cluster of 2-8 blocks (Hopper), partial statistics meeting
  through distributed shared memory; many small blocks per SM keep loads in flight.
* ``online``: a block per row of any length: online max and sum in one read pass, then a
  second pass that re-reads (mostly from L2) and writes.
* ``strided``: any axis and any strides, without a transpose copy: the input is seen as
  (outer, n, inner); threads run across the inner dim (coalesced) and split the reduced axis.

The row families need the reduced axis last with unit stride and the other dims collapsible to
one row stride; everything else goes to ``strided`` (which copies only when the outer or inner
dims cannot be collapsed to one stride each). 128-bit access needs the row length, row stride
and base address 16-byte aligned; otherwise the same config runs with scalar access.

Each kernel's ``prepare(problem, config)`` plans the run once (compiled function, grid, block,
a ``FastLaunch`` with the scalar arguments packed) and returns ``launch(x)``, which the runtime
keeps in its one launch cache: a call allocates the output and launches, nothing else.
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
SOURCE = "softmax.cu"
LAUNCH_S = 2.5e-6  # launch and the smallest kernel's run, seconds
WARP_MAX_COLS = 1024  # 32 threads x 32 values
BLOCK_MAX_COLS = 32768  # 1024 threads x 32 values (float32)

# -- the table ------------------------------------------------------------------------------------


def kernels() -> list[Kernel]:
    src = cc.source(SOURCE)
    out = []
    for op in ("softmax", "log_softmax"):
        out += [
            #       op  name                      kind    dtypes  prepare                   supports      cost                        config_for
            Kernel(op, f"cupy.{op}.warp", "cuda", DTYPES, prepare=_preparer(op, "warp"), supports=_warp_ok,
                   cost=_cost("warp"), config_for=_warp_configs, configs=WARP_CONFIGS, source=src),
            Kernel(op, f"cupy.{op}.block", "cuda", DTYPES, prepare=_preparer(op, "block"), supports=_block_ok,
                   cost=_cost("block"), config_for=_block_configs, configs=BLOCK_CONFIGS, source=src),
            Kernel(op, f"cupy.{op}.cluster", "cuda", DTYPES, prepare=_preparer(op, "cluster"), supports=_cluster_ok,
                   cost=_cost("cluster"), config_for=_cluster_configs, configs=CLUSTER_CONFIGS, source=src),
            Kernel(op, f"cupy.{op}.online", "cuda", DTYPES, prepare=_preparer(op, "online"), supports=_rows_ok,
                   cost=_cost("online"), config_for=_online_configs, configs=ONLINE_CONFIGS, source=src),
            Kernel(op, f"cupy.{op}.strided", "cuda", DTYPES, prepare=_preparer(op, "strided"),
                   cost=_cost("strided"), configs=STRIDED_CONFIGS, source=src),
        ]
    return out


WARP_CONFIGS = ({"threads": 128, "rows": 1}, {"threads": 128, "rows": 2}, {"threads": 256, "rows": 1},
                {"threads": 128, "rows": 4})
BLOCK_CONFIGS = tuple({"threads": t} for t in (256, 512, 1024, 128))
CLUSTER_CONFIGS = tuple({"cluster": c, "threads": t} for c in (2, 4) for t in (128, 256))
ONLINE_CONFIGS = tuple({"threads": t} for t in (512, 1024, 256))
STRIDED_CONFIGS = ({"threads": 256}, {"threads": 512}, {"threads": 128})

# -- layout: (outer, n, inner) with element strides ------------------------------------------------
def layout(problem: Problem) -> tuple[int, int, int, int, int, int] | None:
    """(outer, n, inner, so, sn, si) of the input, or None when outer or inner dims don't collapse."""
    shape = problem.shapes[0]
    strides = problem.strides[0] or c_strides(shape)
    ax = problem.attrs["axis"]
    outer = strided_run(list(zip(shape[:ax], strides[:ax])))
    inner = strided_run(list(zip(shape[ax + 1:], strides[ax + 1:])))
    if outer is None or inner is None:
        return None
    n, sn = shape[ax], (strides[ax] if shape[ax] > 1 else 1)
    return outer[0], n, inner[0], outer[1], sn, inner[1]


def _rows(problem: Problem) -> tuple[int, int, int] | None:
    """(rows, cols, row stride) when the row families apply, else None."""
    lay = layout(problem)
    if lay is None:
        return None
    outer, n, inner, so, sn, _ = lay
    if inner != 1 or sn != 1:
        return None
    return outer, n, (so if outer > 1 else n)


def _vec(problem: Problem) -> int:
    """Elements per 16-byte access when the shape allows it (the address is checked at run time)."""
    rows, cols, ldx = _rows(problem)
    v = 16 // itemsize(problem.dtype)
    return v if cols % v == 0 and (rows == 1 or ldx % v == 0) else 1


def _max_values(threads: int, dtype: str) -> int:
    """Values one thread may hold in registers (1024-thread blocks get at most 64 registers)."""
    return (32 if threads >= 1024 else 64) // (2 if dtype == "float64" else 1)


# -- supports / configs -------------------------------------------------------------------------------


def _rows_ok(problem: Problem) -> bool:
    return _rows(problem) is not None


def _warp_ok(problem: Problem) -> bool:
    r = _rows(problem)
    return r is not None and r[1] <= WARP_MAX_COLS


def _warp_configs(problem: Problem) -> list[Mapping[str, Any]]:
    cols = _rows(problem)[1]
    if cols > 256:  # long rows: one row per warp is enough work in flight (32768x1024: 4.00 vs 3.90 TB/s)
        return list(WARP_CONFIGS)
    # short rows: two rows per thread group keep twice the loads in flight (65536x128: 3.55 vs 3.48)
    return [WARP_CONFIGS[1], WARP_CONFIGS[0], WARP_CONFIGS[3], WARP_CONFIGS[2]]


def _online_configs(problem: Problem) -> list[Mapping[str, Any]]:
    if _rows(problem)[1] >= 16384:  # 1024x32768: 1024 threads 2.74, 512 2.65, 256 2.53 TB/s
        return [ONLINE_CONFIGS[1], ONLINE_CONFIGS[0], ONLINE_CONFIGS[2]]
    return list(ONLINE_CONFIGS)


def _block_configs(problem: Problem) -> list[Mapping[str, Any]]:
    packs = -(-_rows(problem)[1] // _vec(problem))
    vec = _vec(problem)
    fits = [c for c in BLOCK_CONFIGS if c["threads"] <= packs
            and -(-packs // c["threads"]) * vec <= _max_values(c["threads"], problem.dtype)]
    # about 16 values per thread: enough loads in flight, several blocks per SM
    return sorted(fits, key=lambda c: (abs(-(-packs // c["threads"]) * vec - 16), -c["threads"]))


def _block_ok(problem: Problem) -> bool:
    r = _rows(problem)
    return r is not None and r[1] > 256 and bool(_block_configs(problem))


def _cluster_configs(problem: Problem) -> list[Mapping[str, Any]]:
    packs = -(-_rows(problem)[1] // _vec(problem))
    vec = _vec(problem)
    fits = [c for c in CLUSTER_CONFIGS if c["cluster"] * c["threads"] <= packs
            and -(-packs // (c["cluster"] * c["threads"])) * vec <= 32]
    return sorted(fits, key=lambda c: (abs(-(-packs // (c["cluster"] * c["threads"])) * vec - 16),
                                       c["cluster"], -c["threads"]))


def _cluster_ok(problem: Problem) -> bool:
    r = _rows(problem)
    return (r is not None and r[1] >= 2048 and r[0] * 8 < 2**31 and _sm90(problem)
            and bool(_cluster_configs(problem)))


def _sm90(problem: Problem) -> bool:
    try:
        return int(cc.arch_of(problem.device.provider.index)[:2]) >= 90
    except Exception:  # noqa: BLE001 - no CuPy or no device here: no clusters either
        return False


# -- cost: bytes over bandwidth, scaled by each family's measured efficiency ---------------------------

#: fraction of the copy bandwidth each family reached on the target shapes (H200, measured, see
#: docs/notes-cuda-softmax-conv.md): warp 0.98-1.0 of the copy on rows <= 1024, block 0.91-1.0,
#: online 0.67-0.92, cluster 0.69-0.88 (never the best: kept for the tuner), strided 0.3-0.4 on
#: a last axis (it exists for the other axes).
EFFICIENCY = {"warp": 0.97, "block": 0.95, "cluster": 0.75, "online": 0.8, "strided": 0.4}


def _cost(family: str) -> Callable[[Problem, Mapping[str, Any]], float]:
    def cost(problem: Problem, config: Mapping[str, Any]) -> float:
        n = math.prod(problem.out_shape)
        nbytes = 2.0 * n * itemsize(problem.dtype)
        bw = problem.device.provider.figures()[2]
        eff = EFFICIENCY[family]
        if family != "strided" and _vec(problem) == 1:
            eff *= 0.8
        if family == "strided":
            lay = layout(problem)
            if lay is None:
                nbytes *= 2  # the contiguous copy first
            elif lay[2] < 32:
                eff *= 0.5  # little coalescing across the inner dim
        return nbytes / (bw * eff) + LAUNCH_S

    return cost


# -- running -----------------------------------------------------------------------------------------

def _preparer(op: str, family: str) -> Callable[[Problem, Mapping[str, Any]], Callable[[Any], Any]]:
    """``prepare(problem, config) -> launch(x)`` of one family."""

    def prepare(problem: Problem, config: Mapping[str, Any]) -> Callable[[Any], Any]:
        return _build(op, family, problem, config)

    prepare.__name__ = f"prepare_{op}_{family}"
    return prepare


def _defines(family: str, problem: Problem, config: Mapping[str, Any], vec: int) -> dict[str, int]:
    cols = _rows(problem)[1]
    packs = -(-cols // vec)
    d = {"DTYPE": DTYPE_CODE[problem.dtype], "FAMILY": {"warp": 1, "block": 2, "online": 3, "cluster": 5}[family],
         "VEC": vec, "THREADS": config["threads"]}
    if family == "warp":
        group = min(32, 1 << max(0, (packs - 1).bit_length()))
        d.update(GROUP=group, PACKS=-(-packs // group), ROWS=config["rows"])
    elif family == "block":
        d.update(PACKS=-(-packs // config["threads"]))
    elif family == "cluster":
        d.update(CLUSTER=config["cluster"], PACKS=-(-packs // (config["cluster"] * config["threads"])))
    return d


def _grid(family: str, d: Mapping[str, int], rows: int) -> int:
    if family == "warp":
        per_block = d["THREADS"] // d["GROUP"] * d["ROWS"]
        return min(-(-rows // per_block), 2**31 - 1)
    if family == "cluster":
        return rows * d["CLUSTER"]
    return min(rows, 2**31 - 1)


def _build(op: str, family: str, problem: Problem, config: Mapping[str, Any]) -> Callable[[Any], Any]:
    """Compile (cached) and return ``launch(x) -> y`` for this problem and config."""
    import cupy

    dev = problem.device.provider.index
    shape, name = problem.out_shape, f"cupy.{op}.{family}"
    if family == "strided":
        return _build_strided(op, problem, config, dev)
    rows, cols, ldx = _rows(problem)
    vec = _vec(problem)

    def function(v: int) -> tuple[Any, int, int]:
        d = _defines(family, problem, config, v)
        fn = cc.get_function(SOURCE, f"{op}_{family}", d, dev, kernel=name)
        return fn, _grid(family, d, rows), d["THREADS"]

    fn, grid, block = function(vec)
    args_tail = (rows, cols, ldx)
    fast = cc.FastLaunch(fn, (grid,), (block,), pointers=2, scalars=[ctypes.c_int64(a) for a in args_tail])
    getdev, alloc, oom = cupy.cuda.runtime.getDevice, cupy.empty, cupy.cuda.memory.OutOfMemoryError
    aligned = vec == 1  # scalar access: any base address will do
    slow: list[Callable[[Any], Any]] = []  # the launcher for misaligned bases, made when first needed

    def launch(x: Any) -> Any:
        if getdev() != dev:
            with cupy.cuda.Device(dev):
                return launch(x)
        xp = x.data.ptr
        if xp & 15 and not aligned:  # a view's offset: 128-bit loads would fault
            return (slow[0] if slow else misaligned())(x)
        try:
            y = alloc(shape, x.dtype)
        except oom:
            y = empty(shape, x.dtype, name)  # retried there, raising OutOfMemoryError with the figures
        fast(xp, y.data.ptr)
        return y

    def misaligned() -> Callable[[Any], Any]:
        """Make the launcher for misaligned bases (rare, so not at prepare time): the same config
        with scalar access; for clusters (whose sizes were chosen for 128-bit access) the online
        family. Kept in this closure, it lives as long as the fast launcher."""
        if family == "cluster":
            slow.append(_build(op, "online", problem, ONLINE_CONFIGS[0]))
            return slow[0]
        sfn, sgrid, sblock = function(1)

        def scalar(x: Any) -> Any:
            y = empty(shape, x.dtype, name)
            sfn((sgrid,), (sblock,), (x, y, *args_tail))
            return y

        slow.append(scalar)
        return scalar

    return launch


def _build_strided(op: str, problem: Problem, config: Mapping[str, Any], dev: int) -> Callable[[Any], Any]:
    import cupy

    shape, name = problem.out_shape, f"cupy.{op}.strided"
    lay = layout(problem)
    copy = lay is None
    if copy:  # outer or inner dims that do not collapse: one contiguous copy, then the same kernel
        ax = problem.attrs["axis"]
        lay = (math.prod(shape[:ax]), shape[ax], math.prod(shape[ax + 1:]), shape[ax] * math.prod(shape[ax + 1:]),
               math.prod(shape[ax + 1:]), 1)
    outer, n, inner, so, sn, si = lay
    threads = config["threads"]
    tx = min(1 << max(0, (inner - 1).bit_length()), threads)
    ty = min(threads // tx, 1 << max(0, (n - 1).bit_length()))
    d = {"DTYPE": DTYPE_CODE[problem.dtype], "FAMILY": 4, "THREADS": threads}
    fn = cc.get_function(SOURCE, f"{op}_strided", d, dev, kernel=name)
    grid = (-(-inner // tx), min(outer, 65535))
    args_tail = (n, inner, outer, so, sn, si)
    getdev = cupy.cuda.runtime.getDevice

    def launch(x: Any) -> Any:
        if getdev() != dev:
            with cupy.cuda.Device(dev):
                return launch(x)
        if copy:
            x = cupy.ascontiguousarray(x)
        y = empty(shape, x.dtype, name)
        fn(grid, (tx, ty), (x, y, *args_tail))
        return y

    return launch


def build_variants() -> list[tuple[str, dict]]:
    """(file, defines) that CI compiles (gathered by the package's ``opruntime_build_variants``
    hook): each family in each dtype at its largest register footprint, and the scalar-access
    builds."""
    out = []
    for dtype, code in DTYPE_CODE.items():
        vec = 16 // itemsize(dtype)
        out += [
            (SOURCE, {"DTYPE": code, "FAMILY": 1, "VEC": vec, "THREADS": 128, "GROUP": 32, "PACKS": 32 // vec, "ROWS": 1}),
            (SOURCE, {"DTYPE": code, "FAMILY": 1, "VEC": 1, "THREADS": 128, "GROUP": 4, "PACKS": 1, "ROWS": 4}),
            (SOURCE, {"DTYPE": code, "FAMILY": 2, "VEC": vec, "THREADS": 1024,
                      "PACKS": _max_values(1024, dtype) // vec}),
            (SOURCE, {"DTYPE": code, "FAMILY": 2, "VEC": 1, "THREADS": 256, "PACKS": _max_values(256, dtype)}),
            (SOURCE, {"DTYPE": code, "FAMILY": 3, "VEC": vec, "THREADS": 512}),
            (SOURCE, {"DTYPE": code, "FAMILY": 4, "THREADS": 256}),
            (SOURCE, {"DTYPE": code, "FAMILY": 5, "VEC": vec, "THREADS": 256, "CLUSTER": 4, "PACKS": 32 // vec}),
        ]
    return out
