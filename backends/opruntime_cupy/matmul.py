"""matmul on CUDA: cuBLAS through ``cupy.matmul`` (the vendor baseline), an fp32 SGEMM on the
CUDA cores (``matmul_sgemm.cu``) and an fp16 / bf16 GEMM on the tensor cores
(``matmul_hgemm.cu``, and on Hopper ``matmul_wgmma.cu`` and the warp-specialised, TMA-fed
``matmul_tma.cu``), each in a vectorized variant for
aligned operands and a generic one for any strides: the table, the configs, what each kernel
accepts and what it costs.

The kernels read operands through their strides (transposed and strided views, broadcast batch
dims with stride 0, negative strides) without copies. Batch dims are merged where the strides
allow; up to three remain for the kernel (more: only cuBLAS).

Each kernel's ``prepare(problem, config)`` (``matmul_launch.py``) builds the launch plan once
(compiled functions, grid, block, shared memory, the parameter block) and returns
``launch(a, b)``; the runtime keeps it in its one launch cache (``Kernel.launcher``). A call is
then an alignment check of the two base addresses, one allocation and one launch (one per 65535
batch entries).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from opruntime.kernels import Kernel, Problem, Refusal, itemsize

from . import compile, memory
from .matmul_launch import NOT_DEFINES, Geometry, geometry, preparer, run_cublas

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
#: Hopper only (sm_90a): the warp-specialised persistent kernel fed by TMA (matmul_tma.cu), one block
#: per SM. Its time is modelled per round of tiles (ceil(tiles / SMs)): each tile's MMAs at ``eff`` of
#: the SM's peak, plus ``round_s`` of epilogue and tile change that the two consumer warpgroups do
#: not overlap with MMAs. Fitted on the H100 (fp16, 4096 x 4096 x K for K = 768 ... 6144, CUDA events;
#: 128x256: 4096^3 in 180 us, K = 768 in 59 us).
TMA_CONFIGS: tuple[dict, ...] = (
    dict(tile="128x256x64s3", BM=128, BN=256, BK=64, STAGES=3, occ=1, eff=0.83, round_s=6.7e-6),
    dict(tile="128x128x64s6", BM=128, BN=128, BK=64, STAGES=6, occ=1, eff=0.765, round_s=2.8e-6),
    dict(tile="64x256x64s4", BM=64, BN=256, BK=64, STAGES=4, occ=1, eff=0.736, round_s=2.6e-6),
)
#: the mma config whose any-stride variant runs the wgmma kernel's misaligned bases
WGMMA_FALLBACK = next(c for c in MMA_CONFIGS if c["tile"] == "128x128x64s3")

# cuBLAS, modelled the same way: the best of the tiles it chooses from (calibrated like the rest).
CUBLAS_TILES = {  # dtype -> ((BM, BN, occ, eff), ...)
    "float32": ((128, 128, 2, 0.76), (64, 64, 4, 0.62)),
    "float64": ((128, 128, 2, 0.76), (64, 64, 4, 0.62)),
    "float16": ((128, 256, 1, 0.71), (128, 128, 2, 0.65), (64, 64, 4, 0.45)),
    "bfloat16": ((128, 256, 1, 0.71), (128, 128, 2, 0.65), (64, 64, 4, 0.45)),
}
GPU_LAUNCH = 3e-6  # device-side start and drain of one kernel, seconds
HOST_OWN, HOST_CUBLAS = 8e-6, 15e-6  # host seconds per call (RawKernel launch vs cupy.matmul)


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
    return compile.arch_of(problem.device.provider.index) == "90"


def supports_tma(problem: Problem) -> bool | Refusal:
    """One matrix (no batch), A k-contiguous, rows of 16-byte multiples stepping forward (the tensor
    maps), no empty dim, Hopper."""
    g = _fits(problem, 8)
    if g is None or not (g.vec_a and g.a_kcontig and g.vec_b):
        return Refusal("operands the tensor maps cannot describe (A k-contiguous, rows of 16 bytes)")
    if g.batch != 1:
        return Refusal("a batch of matrices (the wgmma kernel's)")
    if g.sam <= 0 or (g.sbk if g.b_ncontig else g.sbn) <= 0:
        return Refusal("a reversed operand (tensor maps step forward)")
    if min(g.M, g.N, g.K) == 0:
        return Refusal("an empty dim")
    return compile.arch_of(problem.device.provider.index) == "90"


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
    prov = problem.device.provider
    f32, f16, bw = prov.figures()
    return f32, f16, bw, prov.sm_count


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


#: device seconds each wave of the wgmma kernel's tiles costs beyond its MMAs (the pipeline's fill
#: and the epilogue's stores, not overlapped with the next tile): on the H100, fp16 8192 x 768 x 2304
#: (K = 768, 9 waves of 128 x 128 tiles) ran in 84 us where the MMAs alone model 56 us. It decides
#: short-K GEMMs (a transformer's linears), where cuBLASLt's persistent kernels win.
WGMMA_WAVE_S = 3e-6


def cost_wgmma(problem: Problem, cfg: Mapping[str, Any]) -> float:
    g = geometry(problem, 8)
    t = _tiled_time(problem, g, cfg["BM"], cfg["BN"], cfg["BK"], cfg["occ"], cfg["eff"])
    if g is not None:
        sms = _figures(problem)[3]
        tiles = -(-g.M // cfg["BM"]) * -(-g.N // cfg["BN"]) * g.batch
        t += -(-tiles // (sms * cfg["occ"])) * WGMMA_WAVE_S
    return max(t, HOST_OWN)


def cost_tma(problem: Problem, cfg: Mapping[str, Any]) -> float:
    g = geometry(problem, 8)
    f16, sms = _figures(problem)[1], _figures(problem)[3]
    rounds = -(-(-(-g.M // cfg["BM"]) * -(-g.N // cfg["BN"])) // sms)
    per_tile = 2.0 * cfg["BM"] * cfg["BN"] * (-(-g.K // cfg["BK"]) * cfg["BK"]) / (f16 / sms * cfg["eff"])
    nbytes = (g.M * g.K + g.K * g.N + g.M * g.N) * itemsize(problem.dtype)
    t = max(rounds * (per_tile + cfg["round_s"]), nbytes / _figures(problem)[2]) + GPU_LAUNCH
    return max(t, HOST_OWN)


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
    wgmma = compile.source("matmul_wgmma.cu")
    tma = compile.source("matmul_tma.cu")
    simt_generic = lambda p, c: cost_simt(p, c, True)  # noqa: E731
    mma_generic = lambda p, c: cost_mma(p, c, True)  # noqa: E731
    return [
        #       op      name                          kind    dtypes  run / prepare, supports, cost
        Kernel("matmul", "cupy.matmul.cublas", "cuda", vendor, run=run_cublas, supports=supports_cublas,
               cost=cost_cublas, vendor=True, source="cupy.matmul (cuBLAS)"),
        Kernel("matmul", "cupy.matmul.simt", "cuda", f32, prepare=preparer("simt", False), supports=supports_simt,
               cost=cost_simt, configs=SIMT_CONFIGS, config_for=_ranked(SIMT_CONFIGS, cost_simt), source=sgemm),
        Kernel("matmul", "cupy.matmul.simt_generic", "cuda", f32, prepare=preparer("simt", True),
               supports=supports_generic_simt, cost=simt_generic, configs=SIMT_CONFIGS,
               config_for=_ranked(SIMT_CONFIGS, simt_generic), source=sgemm),
        Kernel("matmul", "cupy.matmul.mma", "cuda", f16, prepare=preparer("mma", False), supports=supports_mma,
               cost=cost_mma, configs=MMA_CONFIGS, config_for=_ranked(MMA_CONFIGS, cost_mma), source=hgemm),
        Kernel("matmul", "cupy.matmul.mma_generic", "cuda", f16, prepare=preparer("mma", True),
               supports=supports_generic_mma, cost=mma_generic, configs=MMA_CONFIGS,
               config_for=_ranked(MMA_CONFIGS, mma_generic), source=hgemm),
        Kernel("matmul", "cupy.matmul.wgmma", "cuda", f16, prepare=preparer("wgmma", False, WGMMA_FALLBACK),
               supports=supports_wgmma, cost=cost_wgmma, configs=WGMMA_CONFIGS,
               config_for=_ranked(WGMMA_CONFIGS, cost_wgmma), source=wgmma),
        Kernel("matmul", "cupy.matmul.tma", "cuda", f16, prepare=preparer("tma", False, WGMMA_FALLBACK),
               supports=supports_tma, cost=cost_tma, configs=TMA_CONFIGS,
               config_for=_ranked(TMA_CONFIGS, cost_tma), source=tma),
    ]


def build_variants() -> list[tuple[str, dict]]:
    """(file, defines) of every variant CI compiles (gathered by the package's
    ``opruntime_build_variants`` hook): each config in its default layout, and every layout /
    vector combination of the first config."""
    out = []
    for file, configs, extra in (("matmul_sgemm.cu", SIMT_CONFIGS, {}),
                                 ("matmul_hgemm.cu", MMA_CONFIGS, {"BF16": 0})):
        for cfg in configs:
            out.append((file, {**{k: v for k, v in cfg.items() if k not in NOT_DEFINES}, **extra}))
        base = {k: v for k, v in configs[0].items() if k not in NOT_DEFINES}
        for ak in (0, 1):
            for bn in (0, 1):
                for vec in (0, 1):
                    out.append((file, {**base, "A_KCONTIG": ak, "B_NCONTIG": bn, "VEC_A": vec, "VEC_B": vec}))
        if file == "matmul_hgemm.cu":
            out.append((file, {**base, "BF16": 1}))
    for cfg in WGMMA_CONFIGS:
        base = {k: v for k, v in cfg.items() if k not in NOT_DEFINES}
        for bn, bf in ((1, 0), (0, 0), (1, 1)):
            out.append(("matmul_wgmma.cu", {**base, "B_NCONTIG": bn, "BF16": bf}))
    for cfg in TMA_CONFIGS:
        base = {k: v for k, v in cfg.items() if k not in NOT_DEFINES}
        for bn, bf, store in ((1, 0, 1), (0, 0, 1), (1, 1, 0)):
            out.append(("matmul_tma.cu", {**base, "B_NCONTIG": bn, "BF16": bf, "STORE_TMA": store}))
    return out
