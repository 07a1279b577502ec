"""How the CUDA matmul kernels of :mod:`opruntime_cupy.matmul` see a problem and launch on it.

:func:`geometry` is the kernels' view of one problem (sizes, element strides, up to three batch
dims merged where the strides allow, which operand layouts allow 128-bit loads); :func:`plan`
compiles the variants a problem needs and lays out their launches; ``prepare`` (made by
:func:`preparer`) turns a plan into ``launch(a, b) -> out``, the function the runtime keeps in its
one launch cache. The table of kernels, their configs, ``supports`` and cost models are in
``matmul.py``, which imports this module (never the other way).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from opruntime.kernels import Problem

from . import compile, memory

#: config keys that describe a config (for the cost model and names), not the source
NOT_DEFINES = ("tile", "occ", "eff", "round_s")
MAX_GRID_Z = 65535


# -- geometry: what the kernels need to know about one problem --------------------------------
@dataclass(frozen=True)
class Geometry:
    """A matmul problem as the kernels index it (element strides; batch dims merged)."""

    M: int
    N: int
    K: int
    batch: int
    sam: int  # A[m, k] at m * sam + k * sak (elements)
    sak: int
    sbk: int  # B[k, n] at k * sbk + n * sbn
    sbn: int
    dims: tuple[int, int, int]  # batch sizes (d2, d1, d0), d2 outermost
    sa: tuple[int, int, int]  # A's batch strides, 0 for broadcast dims
    sb: tuple[int, int, int]
    a_kcontig: bool  # layout of A: k contiguous (else m) -- exact when vec_a, a hint otherwise
    b_ncontig: bool
    vec_a: bool  # vector loads possible (before the base-pointer check at run time)
    vec_b: bool


def geometry(problem: Problem, w: int) -> Geometry | None:
    """The kernel's view of a matmul problem for vectors of ``w`` elements; None when the batch
    dims do not fold into three. Computed afresh each time (microseconds, no cache to bound):
    ``supports`` and ``cost`` run when a plan is made, never per call, and ``prepare`` keeps what
    the launches need."""
    (sha, shb), out = problem.shapes, problem.out_shape
    sta, stb = problem.strides
    if sta is None or stb is None:
        return None
    M, K, N = sha[-2], sha[-1], shb[-1]
    dims: list[list[int]] = []  # [size, stride_a, stride_b], merged where both operands allow
    for i, size in enumerate(out[:-2]):
        if size == 1:
            continue
        sa = sta[i] if sha[i] != 1 else 0
        sb = stb[i] if shb[i] != 1 else 0
        if dims and dims[-1][1] == sa * size and dims[-1][2] == sb * size:
            dims[-1] = [dims[-1][0] * size, sa, sb]
        else:
            dims.append([size, sa, sb])
    if len(dims) > 3:
        return None
    dims = [[1, 0, 0]] * (3 - len(dims)) + dims
    batch = math.prod(d[0] for d in dims)
    a_k, vec_a, sam, sak = _layout(M, sta[-2], K, sta[-1], w)
    b_k, vec_b, sbn, sbk = _layout(N, stb[-1], K, stb[-2], w)
    vec_a = vec_a and all(d[1] % w == 0 for d in dims)
    vec_b = vec_b and all(d[2] % w == 0 for d in dims)
    return Geometry(M, N, K, batch, sam, sak, sbk, sbn, tuple(d[0] for d in dims),  # type: ignore[arg-type]
                    tuple(d[1] for d in dims), tuple(d[2] for d in dims),  # type: ignore[arg-type]
                    a_k, not b_k, vec_a, vec_b)


def _layout(p: int, sp: int, k: int, sk: int, w: int) -> tuple[bool, bool, int, int]:
    """Layout of an operand indexed (p, k) with strides (sp, sk): (k contiguous?, vector loads
    possible?, sp, sk). A size-1 dim's stride is irrelevant, so it is normalised."""
    if p == 1:
        sp = k if sk == 1 else 1
    if k == 1:
        sk = p if sp == 1 else 1
    if sk == 1 and k % w == 0 and sp % w == 0:
        return True, True, sp, sk
    if sp == 1 and p % w == 0 and sk % w == 0:
        return False, True, sp, sk
    return abs(sk) <= abs(sp), False, sp, sk


# -- launch plans ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Launch:
    """One kernel launch of a plan: the function, its grid, block and dynamic shared memory, and
    the ``GemmParams`` block (a NumPy structured scalar, passed by value)."""

    fn: Any
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    params: Any


#: struct GemmParams of matmul_common.cuh
PARAMS = np.dtype([(n, np.int64) for n in ("M", "N", "K", "sam", "sak", "sbk", "sbn", "z0", "d1", "d0",
                                           "sa2", "sa1", "sa0", "sb2", "sb1", "sb0")])


def plan(family: str, problem: Problem, cfg: Mapping[str, Any], generic: bool,
         fallback: Mapping[str, Any] | None = None, epilogue: Mapping[str, int] | None = None,
         label: str = "cupy.matmul") -> tuple[list[Launch], list[Launch] | None]:
    """(launches for 16-byte aligned bases, launches for any base or None when they are the
    same), compiled for ``problem.device``. ``fallback``: for ``wgmma``, the ``mma`` config whose
    any-stride variant serves misaligned bases. ``epilogue``: the ``BIAS`` / ``ACT`` defines of
    matmul_common.cuh (linear's), none for matmul."""
    w = 4 if family == "simt" else 8
    g = geometry(problem, w)
    if g is None:
        raise ValueError(f"{label}.{family}: the batch dims of {problem} do not fold into three")
    dev = problem.device.provider.index
    epi = dict(epilogue or {})
    vec_a, vec_b = (g.vec_a, g.vec_b) if not generic else (False, False)
    fast = _launches(family, problem, cfg, g, dev, vec_a, vec_b, epi, label)
    if family in ("wgmma", "tma"):  # misaligned bases: the mma kernel's any-stride variant
        assert fallback is not None, "wgmma needs the mma config for misaligned bases"
        return fast, _launches("mma", problem, fallback, g, dev, False, False, epi, label)
    slow = _launches(family, problem, cfg, g, dev, False, False, epi, label) if (vec_a or vec_b) else None
    return fast, slow


def variant(family: str, problem: Problem, cfg: Mapping[str, Any], g: Geometry, vec_a: bool,
            vec_b: bool, epilogue: Mapping[str, int] | None = None) -> tuple[str, str, dict]:
    """(source file, function name, defines) of one compiled variant."""
    defines = {k: v for k, v in cfg.items() if k not in NOT_DEFINES}
    defines.update(epilogue or {})
    defines.update(A_KCONTIG=g.a_kcontig, B_NCONTIG=g.b_ncontig, VEC_A=vec_a, VEC_B=vec_b)
    if family == "simt":
        return "matmul_sgemm.cu", "sgemm", defines
    defines["BF16"] = problem.dtype == "bfloat16"
    if family == "wgmma":
        defines = {k: v for k, v in defines.items() if k not in ("A_KCONTIG", "VEC_A", "VEC_B")}
        return "matmul_wgmma.cu", "hgemm_wgmma", defines
    if family == "tma":
        defines = {k: v for k, v in defines.items() if k not in ("A_KCONTIG", "VEC_A", "VEC_B")}
        return "matmul_tma.cu", "hgemm_tma", {**defines, "STORE_TMA": int(g.N % 8 == 0)}
    return "matmul_hgemm.cu", "hgemm", defines


def variants_for(family: str, problem: Problem, cfg: Mapping[str, Any], generic: bool,
                 epilogue: Mapping[str, int] | None = None) -> list[tuple[str, dict]]:
    """Every (file, defines) a run of this problem may need (to build them ahead, in parallel)."""
    g = geometry(problem, 4 if family == "simt" else 8)
    vec = (g.vec_a, g.vec_b) if not generic else (False, False)
    out = [variant(family, problem, cfg, g, *vec, epilogue)]
    if any(vec):
        out.append(variant(family, problem, cfg, g, False, False, epilogue))
    return [(f, d) for f, _, d in out]


def _launches(family: str, problem: Problem, cfg: Mapping[str, Any], g: Geometry, dev: int,
              vec_a: bool, vec_b: bool, epilogue: Mapping[str, int] | None = None,
              label: str = "cupy.matmul") -> list[Launch]:
    file, name, defines = variant(family, problem, cfg, g, vec_a, vec_b, epilogue)
    arch = "90a" if family in ("wgmma", "tma") else None
    fn = compile.get_function(file, name, defines, dev, kernel=f"{label}.{family}", arch=arch)
    bm, bn = cfg["BM"], cfg["BN"]
    if family == "wgmma":  # warpgroups of 128 threads, 64 rows each; 1 KiB to align the stages
        threads, smem = bm // 64 * 128, cfg["STAGES"] * (bm + bn) * cfg["BK"] * 2 + 1024
    elif family == "tma":  # + the producer warpgroup; the C staging buffer; a full and an empty barrier per stage
        threads = (bm // 64 + 1) * 128
        smem = tma_smem(cfg, defines["STORE_TMA"])
    else:
        threads = (bm // cfg["WM"]) * (bn // cfg["WN"]) * 32
        smem = 0 if family == "simt" else cfg["STAGES"] * (bm + bn) * cfg["BK"] * 2
    if smem > 48 * 1024:  # opt in to more than the default 48 KiB of dynamic shared memory
        import cupy

        with cupy.cuda.Device(dev):
            fn.max_dynamic_shared_size_bytes = smem
    tiles = -(-g.M // bm) * -(-g.N // bn)
    if family == "tma":  # persistent: one block per SM walks the tiles (one matrix: supports_tma)
        params = np.array((g.M, g.N, g.K, g.sam, g.sak, g.sbk, g.sbn, 0, 1, 1, 0, 0, 0, 0, 0, 0), dtype=PARAMS)[()]
        return [Launch(fn, (min(tiles, problem.device.provider.sm_count), 1, 1), (threads, 1, 1), smem, params)]
    out = []
    for z0 in range(0, g.batch, MAX_GRID_Z):
        nz = min(MAX_GRID_Z, g.batch - z0)
        params = np.array((g.M, g.N, g.K, g.sam, g.sak, g.sbk, g.sbn, z0, g.dims[1], g.dims[2], *g.sa, *g.sb),
                          dtype=PARAMS)[()]
        out.append(Launch(fn, (tiles, 1, nz), (threads, 1, 1), smem, params))
    return out


def tma_smem(cfg: Mapping[str, Any], store_tma: int) -> int:
    """Dynamic shared memory of a ``matmul_tma.cu`` config: the stages, the C staging buffer (for
    TMA stores), the barriers, and 1 KiB to align the stages to the swizzle atoms."""
    bm, bn, st = cfg["BM"], cfg["BN"], cfg["STAGES"]
    return st * (bm + bn) * cfg["BK"] * 2 + (bm * bn * 2 if store_tma else 0) + st * 16 + 1024


def preparer(family: str, generic: bool, fallback: Mapping[str, Any] | None = None) \
        -> Callable[[Problem, Mapping[str, Any]], Callable[[Any, Any], Any]]:
    """The ``prepare`` of one kernel: compile and plan once, return ``launch(a, b) -> out``."""

    def prepare(problem: Problem, config: Mapping[str, Any]) -> Callable[[Any, Any], Any]:
        return launcher(family, problem, config, generic, fallback)

    prepare.__name__ = f"prepare_{family}{'_generic' if generic else ''}"
    return prepare


def launcher(family: str, problem: Problem, config: Mapping[str, Any], generic: bool,
             fallback: Mapping[str, Any] | None = None, epilogue: Mapping[str, int] | None = None,
             label: str = "cupy.matmul") -> Callable[..., Any]:
    """Compile and plan ``problem`` (a matmul-shaped one) once; ``launch(a, b, bias=None) -> out``.
    With ``epilogue`` (``BIAS`` / ``ACT`` defines: linear's) the GEMM adds ``bias`` (a 1-D array
    of N values, made contiguous when it is not) and applies the activation before storing."""
    import cupy

    if family == "tma":
        return _tma_launcher(problem, config, fallback, epilogue, label)
    fast, slow = plan(family, problem, config, generic, fallback, epilogue, label)
    dev = problem.device.provider.index
    shape, what = problem.out_shape, f"{label} {problem}"
    getdev, empty = cupy.cuda.runtime.getDevice, memory.empty

    def launch(a: Any, b: Any, bias: Any = None) -> Any:
        if getdev() != dev:
            with cupy.cuda.Device(dev):
                return launch(a, b, bias)
        # vector loads need 16-byte aligned bases: a view's offset may break that per call
        launches = slow if slow is not None and (a.data.ptr | b.data.ptr) & 15 else fast
        out = empty(shape, a.dtype, what)
        if bias is None:
            for ln in launches:
                ln.fn(ln.grid, ln.block, (a, b, out, ln.params), shared_mem=ln.smem)
        else:
            bias = _contiguous(bias)
            for ln in launches:
                ln.fn(ln.grid, ln.block, (a, b, out, ln.params, bias), shared_mem=ln.smem)
        return out

    return launch


def _tma_launcher(problem: Problem, config: Mapping[str, Any], fallback: Mapping[str, Any] | None,
                  epilogue: Mapping[str, int] | None, label: str) -> Callable[..., Any]:
    """``launch(a, b, bias=None) -> out`` for ``matmul_tma.cu``: each call passes the tensor maps of
    its A, B and C. Where the maps take an address patch (:class:`tma.TileMaps`), the launch is a
    :class:`compile.FastLaunch` whose call writes the three addresses into the maps of its
    parameter block; else CuPy's launch with each call's maps. A base off 16 bytes (a view's
    offset) runs the ``mma`` kernel's any-stride variant instead."""
    import ctypes

    import cupy

    from . import tma

    (fast,), slow = plan("tma", problem, config, False, fallback, epilogue, label)
    g = geometry(problem, 8)
    dev, dt = problem.device.provider.index, problem.dtype
    bm, bn, isz = config["BM"], config["BN"], 2
    maps_a = tma.tiles(dt, (g.K, g.M), (g.sam * isz,), (64, bm))
    # B: n-contiguous as atoms of 64 n x 64 k; k-contiguous (a weight's transpose) as BN rows of 64 k
    maps_b = (tma.tiles(dt, (g.N, g.K), (g.sbk * isz,), (64, 64)) if g.b_ncontig
              else tma.tiles(dt, (g.K, g.N), (g.sbn * isz,), (64, bn)))
    maps_c = tma.tiles(dt, (g.N, g.M), (g.N * isz,), (64, 64)) if g.N % 8 == 0 else maps_a  # unused: stores from registers
    shape, what = problem.out_shape, f"{label} {problem}"
    getdev, empty = cupy.cuda.runtime.getDevice, memory.empty
    has_bias = bool((epilogue or {}).get("BIAS"))
    quick = None
    if maps_a.patched and maps_b.patched and maps_c.patched:
        words = [(ctypes.c_uint64 * 16)(*m.words.tolist()) for m in (maps_a, maps_b, maps_c)]
        params = (ctypes.c_int64 * len(PARAMS.names))(*fast.params.tolist())
        quick = compile.FastLaunch(fast.fn, fast.grid, fast.block, pointers=1 + has_bias, scalars=[*words, params],
                                   shared_mem=fast.smem, patches=[(i, m.slot) for i, m in
                                                                  enumerate((maps_a, maps_b, maps_c))])

    def launch(a: Any, b: Any, bias: Any = None) -> Any:
        if getdev() != dev:
            with cupy.cuda.Device(dev):
                return launch(a, b, bias)
        out = empty(shape, a.dtype, what)
        pa, pb, pc = a.data.ptr, b.data.ptr, out.data.ptr
        if (pa | pb) & 15:
            ln = slow[0]
            args: tuple = (a, b, out, ln.params)
            ln.fn(ln.grid, ln.block, args if bias is None else (*args, _contiguous(bias)), shared_mem=ln.smem)
        elif quick is not None:
            if bias is None:
                quick(pc, pa, pb, pc)
            else:
                quick(pc, _contiguous(bias).data.ptr, pa, pb, pc)
        else:
            maps = (maps_a(pa), maps_b(pb), maps_c(pc), fast.params)
            fast.fn(fast.grid, fast.block, (out, *maps) if bias is None else (out, _contiguous(bias), *maps),
                    shared_mem=fast.smem)
        return out

    return launch


def _contiguous(bias: Any) -> Any:
    """A 1-D bias the kernels index as bias[n]."""
    if bias.strides[0] != bias.itemsize and bias.shape[0] > 1:
        import cupy

        return cupy.ascontiguousarray(bias)
    return bias


def run_cublas(problem: Problem, config: Mapping[str, Any], a: Any, b: Any) -> Any:
    """cuBLAS through ``cupy.matmul``: nothing to prepare, so a plain ``run``."""
    import cupy

    try:
        if a.data.device_id != cupy.cuda.runtime.getDevice():
            with memory.on_device(a):
                return cupy.matmul(a, b)
        return cupy.matmul(a, b)
    except cupy.cuda.memory.OutOfMemoryError as exc:
        raise memory._oom(f"matmul {problem} (cuBLAS)", math.prod(problem.out_shape) * a.dtype.itemsize,
                          exc) from exc


#: cudaDataType and cublasComputeType_t per dtype: float32 accumulation for 16-bit inputs, and no TF32
#: for float32 (CUBLAS_COMPUTE_32F is IEEE float32, as CuPy's own default)
CUBLAS_TYPES = {"float16": (2, 68), "bfloat16": (14, 68), "float32": (0, 68), "float64": (1, 70)}


def gemm_nt(dtype: str, dev: int) -> Callable[[Any, Any, Any], bool]:
    """``run(x, w, y) -> bool``: ``y = x @ w.T`` by one ``cublasGemmEx`` call on the current stream,
    for a 2-D ``x`` (m, k) and ``w`` (n, k) whose rows are unit-stride and ``y`` (m, n) C-contiguous;
    False (nothing done) for other layouts, which the caller gives to ``cupy.matmul``. The direct
    call costs a few microseconds of host time where ``cupy.matmul`` costs about 40 (measured on
    the H100's host: the GPT-2 block's MLP linear)."""
    import cupy
    from cupy.cuda import cublas

    dt, ct = CUBLAS_TYPES[dtype]
    scalar = np.float64 if dtype == "float64" else np.float32
    one, zero = np.ones(1, scalar), np.zeros(1, scalar)  # host scalars, kept alive by the closure
    alpha, beta = one.ctypes.data, zero.ctypes.data
    with cupy.cuda.Device(dev):
        handle = cupy.cuda.device.get_cublas_handle()
    isz = np.dtype(scalar).itemsize if dtype in ("float32", "float64") else 2
    stream_ptr = cupy.cuda.get_current_stream

    def lead(a: Any, k: int) -> int:
        """The row stride in elements as cuBLAS's leading dim (any value >= k for one row), or 0."""
        if a.strides[1] != isz and a.shape[1] > 1:
            return 0
        if a.shape[0] == 1:
            return k
        ld, rem = divmod(a.strides[0], isz)
        return ld if not rem and ld >= k else 0

    def run(x: Any, w: Any, y: Any) -> bool:
        (m, k), n = x.shape, w.shape[0]
        lx, lw = lead(x, k), lead(w, k)
        if not (lx and lw) or max(m, n, k, lx, lw) >= 2**31:
            return False
        # row-major y = x w^T is column-major y^T = w x^T: cuBLAS's (T, N) product of the same buffers,
        # on the current stream (the handle is CuPy's, shared: its stream is whatever was set last)
        cublas.setStream(handle, stream_ptr().ptr)
        cublas.gemmEx(handle, cublas.CUBLAS_OP_T, cublas.CUBLAS_OP_N, n, m, k, alpha, w.data.ptr, dt, lw,
                      x.data.ptr, dt, lx, beta, y.data.ptr, dt, n, ct, -1)
        return True

    return run
