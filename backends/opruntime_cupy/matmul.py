"""matmul on CUDA: cuBLAS through ``cupy.matmul`` (the vendor baseline), an fp32 SGEMM on the
CUDA cores (``matmul_sgemm.cu``) and an fp16 / bf16 GEMM on the tensor cores
(``matmul_hgemm.cu``), each in a vectorized variant for aligned operands and a generic one for
any strides.

The kernels read operands through their strides (transposed and strided views, broadcast batch
dims with stride 0, negative strides) without copies. Batch dims are merged where the strides
allow; up to three remain for the kernel (more: only cuBLAS).

Per call, the work is one dict lookup (the launch plan of this problem and config, built once:
compiled function, grid, block, shared memory, scalar arguments), one allocation and one launch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from opruntime.kernels import Kernel, Problem, itemsize

from . import compile, memory

# -- tunable configurations ------------------------------------------------------------------
# occ: resident blocks per SM (registers / shared memory); eff: the fraction of the device's
# peak a full SM reaches with this tile (measured on an H200, docs/notes-cuda-matmul.md).
SIMT_CONFIGS: tuple[dict, ...] = (
    dict(tile="128x128x16", BM=128, BN=128, BK=16, WM=32, WN=64, TM=8, TN=8, occ=2, eff=0.68),
    dict(tile="128x128x8", BM=128, BN=128, BK=8, WM=32, WN=64, TM=8, TN=8, occ=2, eff=0.60),
    dict(tile="128x64x16", BM=128, BN=64, BK=16, WM=32, WN=64, TM=8, TN=8, occ=3, eff=0.645),
    dict(tile="64x64x16", BM=64, BN=64, BK=16, WM=32, WN=32, TM=4, TN=8, occ=4, eff=0.54),
)
MMA_CONFIGS: tuple[dict, ...] = (
    dict(tile="128x256x64s3", BM=128, BN=256, BK=64, WM=64, WN=64, STAGES=3, occ=1, eff=0.422),
    dict(tile="128x256x64s4", BM=128, BN=256, BK=64, WM=64, WN=64, STAGES=4, occ=1, eff=0.42),
    dict(tile="256x128x64s3", BM=256, BN=128, BK=64, WM=64, WN=64, STAGES=3, occ=1, eff=0.41),
    dict(tile="128x128x64s3", BM=128, BN=128, BK=64, WM=64, WN=64, STAGES=3, occ=2, eff=0.40),
    dict(tile="128x128x32s6", BM=128, BN=128, BK=32, WM=64, WN=64, STAGES=6, occ=2, eff=0.397),
    dict(tile="128x128x32s4", BM=128, BN=128, BK=32, WM=64, WN=64, STAGES=4, occ=2, eff=0.389),
    dict(tile="256x128x32s4", BM=256, BN=128, BK=32, WM=64, WN=64, STAGES=4, occ=1, eff=0.375),
    dict(tile="128x256x32s4", BM=128, BN=256, BK=32, WM=64, WN=64, STAGES=4, occ=1, eff=0.352),
    dict(tile="64x64x32s3", BM=64, BN=64, BK=32, WM=32, WN=32, STAGES=3, occ=3, eff=0.237),
)
#: Hopper only (sm_90a): warpgroup MMA; BM/64 warpgroups of 128 threads, B as n- or k-contiguous.
WGMMA_CONFIGS: tuple[dict, ...] = (
    dict(tile="128x256x64s4", BM=128, BN=256, BK=64, STAGES=4, occ=1, eff=0.583),
    dict(tile="128x128x64s4", BM=128, BN=128, BK=64, STAGES=4, occ=1, eff=0.543),
    dict(tile="128x128x64s3", BM=128, BN=128, BK=64, STAGES=3, occ=2, eff=0.323),
)
#: How the wgmma kernel describes an n-contiguous B (see matmul_wgmma.cu): checked on an H200,
#: the other conventions give wrong results or an illegal address.
WGMMA_B_DESC = {"B_LBO_MN": 1, "TNSP_B": 1}
_NOT_DEFINES = ("tile", "occ", "eff")

# cuBLAS, modelled the same way: the best of the tiles it chooses from (calibrated like the rest).
CUBLAS_TILES = {  # dtype -> ((BM, BN, occ, eff), ...)
    "float32": ((128, 128, 2, 0.76), (64, 64, 4, 0.62)),
    "float64": ((128, 128, 2, 0.76), (64, 64, 4, 0.62)),
    "float16": ((128, 256, 1, 0.71), (128, 128, 2, 0.65), (64, 64, 4, 0.45)),
    "bfloat16": ((128, 256, 1, 0.71), (128, 128, 2, 0.65), (64, 64, 4, 0.45)),
}
GPU_LAUNCH = 3e-6  # device-side start and drain of one kernel, seconds
HOST_OWN, HOST_CUBLAS = 8e-6, 15e-6  # host seconds per call (RawKernel launch vs cupy.matmul)
MAX_GRID_Z = 65535


# -- geometry: what the kernels need to know about one problem --------------------------------
@dataclass(frozen=True)
class Geometry:
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


_geometry: dict[tuple[Problem, int], Geometry | None] = {}


def geometry(problem: Problem, width: int) -> Geometry | None:
    """The kernel's view of a matmul problem for vectors of ``width`` elements; None when the
    batch dims do not fold into three."""
    key = (problem, width)
    if key not in _geometry:
        _geometry[key] = _geometry_of(problem, width)
    return _geometry[key]


def _geometry_of(problem: Problem, w: int) -> Geometry | None:
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
@dataclass
class Launch:
    fn: Any
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    device: int
    params: Any  # a GemmParams struct (numpy structured scalar)


#: struct GemmParams of matmul_common.cuh
PARAMS = np.dtype([(n, np.int64) for n in ("M", "N", "K", "sam", "sak", "sbk", "sbn", "z0", "d1", "d0",
                                           "sa2", "sa1", "sa0", "sb2", "sb1", "sb0")])


_plans: dict[tuple, tuple[list[Launch], list[Launch] | None]] = {}


def _plan(family: str, problem: Problem, cfg: Mapping[str, Any], generic: bool) -> tuple:
    """(launches for aligned bases, launches for any base or None when they are the same)."""
    key = (family, problem, cfg["tile"], generic)
    plan = _plans.get(key)
    if plan is None:
        plan = _plans[key] = _make_plan(family, problem, cfg, generic)
    return plan



def _make_plan(family: str, problem: Problem, cfg: Mapping[str, Any], generic: bool) -> tuple:
    w = 4 if family == "simt" else 8
    g = geometry(problem, w)
    assert g is not None, "supports() admitted a problem without a geometry"
    dev = int(problem.device.split(":")[1])
    vec_a, vec_b = (g.vec_a, g.vec_b) if not generic else (False, False)
    fast = _launches(family, problem, cfg, g, dev, vec_a, vec_b)
    if family == "wgmma":  # misaligned bases: the mma kernel's any-stride variant
        mma_cfg = next(c for c in MMA_CONFIGS if c["tile"] == "128x128x64s3")
        return fast, _launches("mma", problem, mma_cfg, g, dev, False, False)
    slow = _launches(family, problem, cfg, g, dev, False, False) if (vec_a or vec_b) else None
    return fast, slow


def variant(family: str, problem: Problem, cfg: Mapping[str, Any], g: Geometry, vec_a: bool,
            vec_b: bool) -> tuple[str, str, dict]:
    """(source file, function name, defines) of one compiled variant."""
    defines = {k: v for k, v in cfg.items() if k not in _NOT_DEFINES}
    defines.update(A_KCONTIG=g.a_kcontig, B_NCONTIG=g.b_ncontig, VEC_A=vec_a, VEC_B=vec_b)
    if family == "simt":
        return "matmul_sgemm.cu", "sgemm", defines
    defines["BF16"] = problem.dtype == "bfloat16"
    if family == "wgmma":
        defines = {k: v for k, v in defines.items() if k not in ("A_KCONTIG", "VEC_A", "VEC_B")}
        return "matmul_wgmma.cu", "hgemm_wgmma", {**defines, **WGMMA_B_DESC}
    return "matmul_hgemm.cu", "hgemm", defines


def variants_for(family: str, problem: Problem, cfg: Mapping[str, Any], generic: bool) -> list[tuple[str, dict]]:
    """Every (file, defines) a run of this problem may need (to build them ahead, in parallel)."""
    g = geometry(problem, 4 if family == "simt" else 8)
    vec = (g.vec_a, g.vec_b) if not generic else (False, False)
    out = [variant(family, problem, cfg, g, *vec)]
    if any(vec):
        out.append(variant(family, problem, cfg, g, False, False))
    return [(f, d) for f, _, d in out]


def _launches(family: str, problem: Problem, cfg: Mapping[str, Any], g: Geometry, dev: int,
              vec_a: bool, vec_b: bool) -> list[Launch]:
    file, name, defines = variant(family, problem, cfg, g, vec_a, vec_b)
    arch = "90a" if family == "wgmma" else None
    fn = compile.get_function(file, name, defines, dev, kernel=f"cupy.matmul.{family}", arch=arch)
    bm, bn = cfg["BM"], cfg["BN"]
    if family == "wgmma":  # warpgroups of 128 threads, 64 rows each; 1 KiB to align the stages
        threads, smem = bm // 64 * 128, cfg["STAGES"] * (bm + bn) * cfg["BK"] * 2 + 1024
    else:
        threads = (bm // cfg["WM"]) * (bn // cfg["WN"]) * 32
        smem = 0 if family == "simt" else cfg["STAGES"] * (bm + bn) * cfg["BK"] * 2
    if smem > 48 * 1024:  # opt in to more than the default 48 KiB of dynamic shared memory
        import cupy

        with cupy.cuda.Device(dev):
            fn.max_dynamic_shared_size_bytes = smem
    tiles = -(-g.M // bm) * -(-g.N // bn)
    out = []
    for z0 in range(0, g.batch, MAX_GRID_Z):
        nz = min(MAX_GRID_Z, g.batch - z0)
        params = np.array((g.M, g.N, g.K, g.sam, g.sak, g.sbk, g.sbn, z0, g.dims[1], g.dims[2], *g.sa, *g.sb),
                          dtype=PARAMS)[()]
        out.append(Launch(fn, (tiles, 1, nz), (threads, 1, 1), smem, dev, params))
    return out


def _launch(family: str, problem: Problem, cfg: Mapping[str, Any], a: Any, b: Any, generic: bool) -> Any:
    plan = _plans.get((family, problem, cfg["tile"], generic))
    if plan is None:
        plan = _plan(family, problem, cfg, generic)
    fast, slow = plan
    launches = slow if slow is not None and (a.data.ptr | b.data.ptr) & 15 else fast
    dev = launches[0].device
    if dev != _current_device():
        with memory.on_device(a):
            return _go(launches, problem, a, b)
    return _go(launches, problem, a, b)


def _go(launches: list[Launch], problem: Problem, a: Any, b: Any) -> Any:
    out = memory.empty(problem.out_shape, a.dtype, f"matmul {problem}")
    for ln in launches:
        ln.fn(ln.grid, ln.block, (a, b, out, ln.params), shared_mem=ln.smem)
    return out


def _current_device() -> int:
    import cupy

    return cupy.cuda.runtime.getDevice()


def run_simt(problem: Problem, config: Mapping[str, Any], a: Any, b: Any) -> Any:
    return _launch("simt", problem, config, a, b, False)


def run_simt_generic(problem: Problem, config: Mapping[str, Any], a: Any, b: Any) -> Any:
    return _launch("simt", problem, config, a, b, True)


def run_mma(problem: Problem, config: Mapping[str, Any], a: Any, b: Any) -> Any:
    return _launch("mma", problem, config, a, b, False)


def run_mma_generic(problem: Problem, config: Mapping[str, Any], a: Any, b: Any) -> Any:
    return _launch("mma", problem, config, a, b, True)


def run_wgmma(problem: Problem, config: Mapping[str, Any], a: Any, b: Any) -> Any:
    return _launch("wgmma", problem, config, a, b, False)


def run_cublas(problem: Problem, config: Mapping[str, Any], a: Any, b: Any) -> Any:
    import cupy

    try:
        if a.data.device_id != cupy.cuda.runtime.getDevice():
            with memory.on_device(a):
                return cupy.matmul(a, b)
        return cupy.matmul(a, b)
    except cupy.cuda.memory.OutOfMemoryError as exc:
        raise memory._oom(f"matmul {problem} (cuBLAS)", math.prod(problem.out_shape) * a.dtype.itemsize,
                          exc) from exc


# -- what each kernel accepts -------------------------------------------------------------------
_LIMIT = 2**31 - 1


def _fits(problem: Problem, w: int) -> Geometry | None:
    g = geometry(problem, w)
    if g is None or max(g.M, g.N, g.K) > _LIMIT or -(-g.M // 64) * -(-g.N // 64) > _LIMIT:
        return None
    return g


def supports_simt(problem: Problem) -> bool:
    g = _fits(problem, 4)
    return g is not None and g.vec_a and g.vec_b


def supports_generic_simt(problem: Problem) -> bool:
    return _fits(problem, 4) is not None


def supports_mma(problem: Problem) -> bool:
    g = _fits(problem, 8)
    return g is not None and g.vec_a and g.vec_b


def supports_generic_mma(problem: Problem) -> bool:
    return _fits(problem, 8) is not None


def supports_wgmma(problem: Problem) -> bool:
    g = _fits(problem, 8)
    if g is None or not (g.vec_a and g.a_kcontig and g.vec_b):
        return False
    return compile.arch_of(int(problem.device.split(":")[1])) == "90"


def supports_cublas(problem: Problem) -> bool:
    return problem.dtype != "bfloat16" or _cublas_bf16()


_bf16_probe: dict[str, bool] = {}


def _cublas_bf16() -> bool:
    """Whether cupy.matmul multiplies bfloat16 arrays (probed once)."""
    if "ok" not in _bf16_probe:
        try:
            import cupy

            dt = memory.bfloat16()
            x = cupy.ones((2, 2), dt) if dt is not None else None
            _bf16_probe["ok"] = x is not None and float(cupy.matmul(x, x)[0, 0].astype(cupy.float32)) == 2.0
        except Exception:
            _bf16_probe["ok"] = False
    return _bf16_probe["ok"]


# -- cost models: a roofline with tile quantization on the device's figures --------------------
def _figures(problem: Problem) -> tuple[float, float, float, int]:
    dev = memory.provider(int(problem.device.split(":")[1]))
    f32, f16, bw = dev.figures()
    return f32, f16, bw, dev.sm_count


def _tiled_time(problem: Problem, g: Geometry, bm: int, bn: int, bk: int, occ: int, eff: float) -> float:
    """Device seconds for a kernel of BM x BN tiles, ``occ`` resident per SM at ``eff`` of peak.

    Tiles are dealt to the SMs; the busiest SM runs ceil(tiles / SMs) of them, ``conc`` at a
    time; an SM running fewer blocks than it can hold gets sqrt(conc / occ) of its full rate
    (less latency hiding). Fitted to H200 measurements (docs/notes-cuda-matmul.md).
    """
    f32, f16, bw, sms = _figures(problem)
    peak = f16 if problem.dtype in ("float16", "bfloat16") else f32
    if problem.dtype == "float64":
        peak = f32 / 2
    tiles = -(-g.M // bm) * -(-g.N // bn) * g.batch
    per_sm = -(-tiles // sms)
    conc = min(occ, per_sm)
    rate = peak / sms * eff * math.sqrt(conc / occ)
    t = per_sm * 2.0 * bm * bn * (-(-g.K // bk) * bk) / rate
    nbytes = g.batch * (g.M * g.K + g.K * g.N + g.M * g.N) * itemsize(problem.dtype)
    return max(t, nbytes / bw) + GPU_LAUNCH


def cost_simt(problem: Problem, cfg: Mapping[str, Any], generic: bool = False) -> float:
    g = geometry(problem, 4)
    t = _tiled_time(problem, g, cfg["BM"], cfg["BN"], cfg["BK"], cfg["occ"], cfg["eff"])
    return max(t * (1.2 if generic else 1.0), HOST_OWN)


def cost_mma(problem: Problem, cfg: Mapping[str, Any], generic: bool = False) -> float:
    g = geometry(problem, 8)
    t = _tiled_time(problem, g, cfg["BM"], cfg["BN"], cfg["BK"], cfg["occ"], cfg["eff"])
    return max(t * (3.0 if generic else 1.0), HOST_OWN)


def cost_wgmma(problem: Problem, cfg: Mapping[str, Any]) -> float:
    g = geometry(problem, 8)
    return max(_tiled_time(problem, g, cfg["BM"], cfg["BN"], cfg["BK"], cfg["occ"], cfg["eff"]), HOST_OWN)


def cost_cublas(problem: Problem, cfg: Mapping[str, Any]) -> float:
    g = geometry(problem, 1)
    if g is None:  # batch dims cuBLAS folds itself: count the work only
        M, K, N = problem.shapes[0][-2], problem.shapes[0][-1], problem.shapes[1][-1]
        g = Geometry(M, N, K, math.prod(problem.out_shape[:-2]), K, 1, N, 1, (1, 1, 1), (0,) * 3, (0,) * 3,
                     True, True, False, False)
    t = min(_tiled_time(problem, g, bm, bn, 32, occ, eff) for bm, bn, occ, eff in CUBLAS_TILES[problem.dtype])
    # cupy.matmul copies operands that are neither contiguous nor simply transposed
    if not problem.contiguous:
        t += 2.0 * sum(math.prod(s) for s in problem.shapes) * itemsize(problem.dtype) / _figures(problem)[2]
    return max(t, HOST_CUBLAS)


def _ranked(configs: Sequence[dict], cost) -> Any:
    def config_for(problem: Problem) -> list[dict]:
        return sorted(configs, key=lambda c: cost(problem, c))

    return config_for


def kernels() -> list[Kernel]:
    """The matmul kernels of the CUDA backend."""
    f32, f16 = frozenset({"float32"}), frozenset({"float16", "bfloat16"})
    vendor = frozenset({"float16", "bfloat16", "float32", "float64"})
    sgemm, hgemm = compile.source("matmul_sgemm.cu"), compile.source("matmul_hgemm.cu")
    wgmma = compile.source("matmul_wgmma.cu") + repr(WGMMA_B_DESC)
    simt_generic = lambda p, c: cost_simt(p, c, True)  # noqa: E731
    mma_generic = lambda p, c: cost_mma(p, c, True)  # noqa: E731
    return [
        #       op      name                          kind    dtypes  run / supports / cost
        Kernel("matmul", "cupy.matmul.cublas", "cuda", vendor, run_cublas, supports=supports_cublas,
               cost=cost_cublas, vendor=True, source="cupy.matmul (cuBLAS)"),
        Kernel("matmul", "cupy.matmul.simt", "cuda", f32, run_simt, supports=supports_simt, cost=cost_simt,
               configs=SIMT_CONFIGS, config_for=_ranked(SIMT_CONFIGS, cost_simt), source=sgemm),
        Kernel("matmul", "cupy.matmul.simt_generic", "cuda", f32, run_simt_generic,
               supports=supports_generic_simt, cost=simt_generic, configs=SIMT_CONFIGS,
               config_for=_ranked(SIMT_CONFIGS, simt_generic), source=sgemm),
        Kernel("matmul", "cupy.matmul.mma", "cuda", f16, run_mma, supports=supports_mma, cost=cost_mma,
               configs=MMA_CONFIGS, config_for=_ranked(MMA_CONFIGS, cost_mma), source=hgemm),
        Kernel("matmul", "cupy.matmul.mma_generic", "cuda", f16, run_mma_generic,
               supports=supports_generic_mma, cost=mma_generic, configs=MMA_CONFIGS,
               config_for=_ranked(MMA_CONFIGS, mma_generic), source=hgemm),
        Kernel("matmul", "cupy.matmul.wgmma", "cuda", f16, run_wgmma, supports=supports_wgmma, cost=cost_wgmma,
               configs=WGMMA_CONFIGS, config_for=_ranked(WGMMA_CONFIGS, cost_wgmma), source=wgmma),
    ]


def build_variants() -> list[tuple[str, dict]]:
    """(file, defines) of every variant CI compiles: each config in its default layout, and
    every layout / vector combination of the first config."""
    out = []
    for file, configs, extra in (("matmul_sgemm.cu", SIMT_CONFIGS, {}),
                                 ("matmul_hgemm.cu", MMA_CONFIGS, {"BF16": 0})):
        for cfg in configs:
            out.append((file, {**{k: v for k, v in cfg.items() if k not in _NOT_DEFINES}, **extra}))
        base = {k: v for k, v in configs[0].items() if k not in _NOT_DEFINES}
        for ak in (0, 1):
            for bn in (0, 1):
                for vec in (0, 1):
                    out.append((file, {**base, "A_KCONTIG": ak, "B_NCONTIG": bn, "VEC_A": vec, "VEC_B": vec}))
        if file == "matmul_hgemm.cu":
            out.append((file, {**base, "BF16": 1}))
    for cfg in WGMMA_CONFIGS:
        base = {k: v for k, v in cfg.items() if k not in _NOT_DEFINES}
        for bn, bf in ((1, 0), (0, 0), (1, 1)):
            out.append(("matmul_wgmma.cu", {**base, "B_NCONTIG": bn, "BF16": bf, **WGMMA_B_DESC}))
    return out
