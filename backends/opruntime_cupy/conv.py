"""conv2d on CUDA: implicit GEMM kernels (no column buffer), a depthwise path, and the vendor
baseline im2col + cuBLAS.

* ``igemm_simt`` (``conv_simt.cu``): the GEMM (M = output channels per group, N = output pixels,
  K = C/groups * kH * kW) on the CUDA cores; every dtype (16-bit ones accumulate in float32, no
  TF32 anywhere). The B tile is gathered from the input on the fly through a per-problem offset
  table, so stride, 4-sided padding, dilation, groups and strided inputs cost nothing extra.
* ``igemm_mma`` (``conv_mma.cu``): the same on the tensor cores for float16 / bfloat16
  (mma.sync m16n8k16, ldmatrix, float32 accumulation).
* ``igemm_tma`` (``matmul_tma.cu`` with ``CONV 1``, Hopper): the GEMM the other way round (M =
  output channels, N = output pixels, K = taps x channels in chunks of 64) on the warp-specialised
  persistent GEMM: a producer warpgroup loads the weight's tiles and the input's with the tensor
  memory accelerator, the input through an im2col tensor map (the hardware forms each output
  position's address at a tap, steps by the stride and zero-fills the padding); two consumer
  warpgroups multiply with wgmma; the NCHW output goes out through TMA stores. The maps need
  channels-last operands: the input and weight are copied so (``layout.cu``) unless they already
  are (a channels-last view, ``x.transpose(0, 3, 1, 2)`` of an NHWC array, is read in place).
* ``winograd_f2x3`` / ``winograd_f4x3`` (``conv_winograd.cu`` + ``conv_simt.cu``): 3x3 stride-1
  float32 convolutions by Winograd F(2x2, 3x3) / F(4x4, 3x3): filter and input transforms, the
  16 / 36 products as one grouped GEMM on the SIMT kernel above (2.25x / 4x fewer multiplies
  than the direct GEMM), an output transform.
* ``depthwise`` (``conv_depthwise.cu``): groups == C (one input channel per group, any channel
  multiplier): a direct kernel, one thread per output element.
* ``im2col_cublas`` (vendor): a column buffer from ``conv_im2col.cu``, then cuBLAS
  (cuBLAS, one strided-batched GEMM per group); a 1x1 stride-1 unpadded convolution without bias
  is that GEMM on the input itself. A bias is a row of ones in the column buffer and a column of
  the weights, so the GEMM adds it before its one rounding; an activation is one in-place pass
  after it (``linear.cu``'s ``bias_act``).

Every own kernel applies the activation (``activation=``, the ``ACT`` define of
``conv_types.cuh``) after the bias in its epilogue, on the accumulator, before the rounding.

The selector ranks them by ``cost``: roofline times from the device's figures, scaled by the
efficiency each kernel reached when measured (docs/notes-cuda-softmax-conv.md). This module is
the table, the configs, what each kernel accepts and what it costs; ``conv_launch.py`` is how
each kernel's ``prepare`` compiles and launches (once per problem and config: a call then makes
the weight contiguous where the problem says it is not, allocates the output and launches).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from opruntime.kernels import Kernel, Problem, Refusal, itemsize

from . import compile as cc
from . import layout
from .conv_launch import (
    CHUNK,
    DTYPE_CODE,
    INT_MAX,
    Conv,
    int32_ok,
    pointwise,
    preparer,
    tma_copied,
    tma_corners,
    tma_pointwise,
    tma_tiles,
    wino_gemm,
    wino_tiles,
)

DTYPES = frozenset(DTYPE_CODE)
HALVES = frozenset({"float16", "bfloat16"})
WINO_DTYPES = frozenset({"float32"})
VENDOR_DTYPES = DTYPES
LAUNCH_S = 4e-6

# -- the table ------------------------------------------------------------------------------------


def kernels() -> list[Kernel]:
    """The conv2d kernels of the CUDA backend."""
    return [
        #      op        name                            kind    dtypes  prepare      supports / cost / configs
        Kernel("conv2d", "cupy.conv2d.igemm_simt", "cuda", DTYPES, prepare=preparer("simt"), supports=_igemm_ok,
               cost=_cost("simt"), config_for=_configs("simt"), configs=SIMT_CONFIGS, source=_src("conv_simt.cu")),
        Kernel("conv2d", "cupy.conv2d.igemm_mma", "cuda", HALVES, prepare=preparer("mma"), supports=_igemm_ok,
               cost=_cost("mma"), config_for=_configs("mma"), configs=MMA_CONFIGS, source=_src("conv_mma.cu")),
        Kernel("conv2d", "cupy.conv2d.igemm_tma", "cuda", HALVES, prepare=preparer("tma"), supports=_tma_ok,
               cost=_cost("tma"), config_for=_configs("tma"), configs=TMA_CONFIGS,
               source=_src("matmul_tma.cu") + _src("layout.cu")),
        Kernel("conv2d", "cupy.conv2d.winograd_f2x3", "cuda", WINO_DTYPES, prepare=preparer("winograd2"), supports=_winograd_ok,
               cost=_cost("winograd2"), config_for=_configs("winograd2"), configs=SIMT_CONFIGS,
               source=_src("conv_winograd.cu") + _src("conv_simt.cu")),
        Kernel("conv2d", "cupy.conv2d.winograd_f4x3", "cuda", WINO_DTYPES, prepare=preparer("winograd4"), supports=_winograd_ok,
               cost=_cost("winograd4"), config_for=_configs("winograd4"), configs=SIMT_CONFIGS,
               source=_src("conv_winograd.cu") + _src("conv_simt.cu")),
        Kernel("conv2d", "cupy.conv2d.depthwise", "cuda", DTYPES, prepare=preparer("depthwise"), supports=_depthwise_ok,
               cost=_cost("depthwise"), configs=({"threads": 256},), source=_src("conv_depthwise.cu")),
        Kernel("conv2d", "cupy.conv2d.im2col_cublas", "cuda", VENDOR_DTYPES, prepare=preparer("vendor"), supports=_vendor_ok,
               cost=_cost("vendor"), vendor=True, configs=({"threads": 256},), source=_src("conv_im2col.cu")),
    ]


#: block tiles (output channels x output pixels) and blocks per SM the registers are cut for;
#: the SIMT threads compute 8x8 each.
SIMT_CONFIGS = ({"bm": 64, "bn": 128, "bk": 16, "minb": 3}, {"bm": 64, "bn": 128, "bk": 8, "minb": 3},
                {"bm": 128, "bn": 128, "bk": 8, "minb": 2}, {"bm": 64, "bn": 64, "bk": 8, "minb": 8},
                {"bm": 128, "bn": 64, "bk": 8, "minb": 4})
#: tensor-core tiles with their warp grids (each warp a (bm/wm) x (bn/wn) tile of 16x8 mmas).
MMA_CONFIGS = ({"bm": 128, "bn": 128, "wm": 2, "wn": 4, "minb": 2}, {"bm": 64, "bn": 128, "wm": 2, "wn": 2, "minb": 3},
               {"bm": 128, "bn": 64, "wm": 2, "wn": 2, "minb": 3}, {"bm": 64, "bn": 64, "wm": 2, "wn": 2, "minb": 4})

#: the TMA kernel's tiles (output channels x output pixels) and pipeline stages, as matmul_tma.cu's
TMA_CONFIGS = ({"bm": 128, "bn": 256, "stages": 3}, {"bm": 128, "bn": 128, "stages": 6},
               {"bm": 64, "bn": 256, "stages": 4}, {"bm": 64, "bn": 128, "stages": 8})


def _src(name: str) -> str:
    return cc.source(name)


# -- what each kernel accepts -------------------------------------------------------------------------


def _igemm_ok(problem: Problem) -> bool:
    cv = Conv(problem)
    return int32_ok(cv, problem) and -(-cv.kg // 64) <= 65535


def _depthwise_ok(problem: Problem) -> bool:
    cv = Conv(problem)
    return cv.groups == cv.c and cv.cg == 1 and int32_ok(cv, problem)


def _tma_ok(problem: Problem) -> bool | Refusal:
    """Hopper; one group; input channels a multiple of 8 (channels-last rows of 16-byte
    multiples); the im2col map's bounding box and tap offsets in range; no empty dim."""
    cv = Conv(problem)
    if cv.groups != 1:
        return Refusal("a grouped convolution")
    if cv.c % 8:
        return Refusal("input channels not a multiple of 8 (channels-last rows must be 16-byte multiples)")
    if min(cv.npq, cv.k, cv.c) == 0:
        return Refusal("an empty dim")
    lower, upper = tma_corners(cv)
    if not all(-128 <= v < 128 for v in (*lower, *upper)) or max(cv.r * cv.dil_h, cv.s * cv.dil_w) >= 1 << 16:
        return Refusal("padding, stride or dilation beyond the im2col map's range")
    if not (int32_ok(cv, problem) and layout.fits(max(cv.n, cv.k), cv.c)):
        return False
    return cc.arch_of(problem.device.provider.index) == "90"


def _vendor_ok(problem: Problem) -> bool:
    return int32_ok(Conv(problem), problem)


def _winograd_ok(problem: Problem) -> bool:
    cv = Conv(problem)
    return (cv.r == cv.s == 3 and cv.str_h == cv.str_w == 1 and cv.dil_h == cv.dil_w == 1 and cv.groups == 1
            and int32_ok(cv, problem) and 36 * max(cv.c, cv.k) * wino_tiles(cv, 2) < INT_MAX)



# -- cost models --------------------------------------------------------------------------------------

#: Fraction of the device's peak each kernel reached on the ResNet-50 layers (H200 runs 1-3, see
#: docs/notes-cuda-softmax-conv.md), per block tile; times the useful fraction of the launched
#: tiles and of the last wave. "gemm*" are cuBLAS (strided-batched), "cols" the im2col pass and
#: "transform" the Winograd transforms, as fractions of the memory bandwidth. With these, run 3
#: predicted 200 / 147 / 143 us for Winograd F(4x4) on layers 1 / 3 / 4 and measured 192 / 158 / 166.
SIMT_EFF = {(64, 128, 16, 3): 0.40, (64, 128, 8, 3): 0.38, (128, 128, 8, 2): 0.35, (64, 64, 8, 8): 0.27,
            (128, 64, 8, 4): 0.27}
MMA_EFF = {(128, 64): 0.105, (128, 128): 0.10, (64, 128): 0.09, (64, 64): 0.08}
#: The tensor-core tiles on short reductions (C R S = 147: the 7x7 stem; 256: the 1x1 layer): the
#: fraction of MMA_EFF each tile kept on the H100 (the mean of the two layers' measured / modelled,
#: docs/data/h100-gpu-conv-matmul-heuristic-2.json), applied in full up to C R S = 256 and faded
#: out linearly by 576 (the 3x3 layer of 64 channels, where MMA_EFF fits). Without it the model
#: took 64x128 for the fp16 stem at 220 us, where 64x64 runs 181.
MMA_SHORT = {(128, 64): 0.67, (128, 128): 0.80, (64, 128): 0.45, (64, 64): 0.56}
SHORT_CRS, FULL_CRS = 256, 576
#: The SIMT tiles on the 7x7 stem (C R S = 147, stride 2, 400k output pixels): the fraction of
#: SIMT_EFF each kept (modelled / measured, fp32, docs/data/h100-conv-tma.json), applied in full up
#: to C R S = 160 and faded out by 256, to filters larger than 1x1 only (a 1x1 GEMM, such as
#: Winograd's products, keeps SIMT_EFF).
#: Without it the model took 64x128 for the fp32 stem at 349 us where 64x64 runs 318.
SIMT_SHORT = {(64, 128, 16, 3): 0.82, (64, 128, 8, 3): 0.80, (128, 128, 8, 2): 1.26, (64, 64, 8, 8): 1.33,
              (128, 64, 8, 4): 1.74}
SIMT_SHORT_CRS = (160, 256)
# gemm32 / gemm16: the 1x1 layer (32,256,56,64) through one strided-batched cuBLAS call, timed by
# `opruntime bench --suite gpu --kernels` on an H100 (docs/data/h100-cuda-tuned-3.json): 93 us fp32
# (35 TFLOP/s, 0.53 of the fp32 peak) and 30 us fp16 (110 TFLOP/s, 0.11 of the dense fp16 peak).
# Through cupy.matmul, which broadcast the shared weight with ~200 us of host work, they had been
# 0.23 and 0.013.
EFFICIENCY = {"depthwise": 0.5, "gemm32": 0.5, "gemm16": 0.11, "cols": 0.3, "transform": 0.6, "layout": 0.6}
#: the TMA kernel per tile: (fraction of the SM's fp16 peak in the MMAs, seconds a round of tiles
#: adds), as matmul.TMA_CONFIGS (a first guess from the GEMM's figures until measured on conv layers)
TMA_EFF = {(128, 256): (0.83, 6.7e-6), (128, 128): (0.765, 2.8e-6), (64, 256): (0.736, 2.6e-6),
           (64, 128): (0.65, 2.0e-6)}


def _fill(cv: Conv, bm: int, bn: int, sms: int) -> float:
    """Useful fraction of the launched tiles: edge waste in M and N, and the last partial wave
    (counting a wave as one block per SM: more resident blocks share the SM's issue slots)."""
    tm, tn = -(-cv.kg // bm), -(-cv.npq // bn)
    useful = (cv.kg / (tm * bm)) * (cv.npq / (tn * bn))
    waves = tm * tn * cv.groups / sms
    return useful * (waves / math.ceil(waves) if waves < 4 else 1.0)



def _figures(problem: Problem) -> tuple[float, float, float, int]:
    prov = problem.device.provider
    f32, f16, bw = prov.figures()
    return f32 / (2 if problem.dtype == "float64" else 1), f16, bw, prov.sm_count


def _cost(kind: str) -> Callable[[Problem, Mapping[str, Any]], float]:
    def cost(problem: Problem, config: Mapping[str, Any]) -> float:
        cv = Conv(problem)
        peak, f16, bw, sms = _figures(problem)
        isz = itemsize(problem.dtype)
        io = (cv.x_extent() + cv.k * cv.crs + math.prod(problem.out_shape)) * isz
        if kind == "simt":
            tile = (config["bm"], config["bn"])
            key = (*tile, config["bk"], config["minb"])
            lo, hi = SIMT_SHORT_CRS
            # (a filter's taps over few channels; not the 1x1 GEMMs, Winograd's products among them)
            long = 1.0 if cv.r * cv.s == 1 else min(1.0, max(0.0, (cv.crs - lo) / (hi - lo)))
            eff = SIMT_EFF[key] * (SIMT_SHORT[key] + (1 - SIMT_SHORT[key]) * long) * _fill(cv, *tile, sms)
            return max(cv.flops / (peak * eff), io / bw) + LAUNCH_S
        if kind == "mma":
            tile = (config["bm"], config["bn"])
            short = min(1.0, max(0.0, (cv.crs - SHORT_CRS) / (FULL_CRS - SHORT_CRS)))
            eff = MMA_EFF[tile] * (MMA_SHORT[tile] + (1 - MMA_SHORT[tile]) * short) * _fill(cv, *tile, sms)
            return max(cv.flops / (f16 * eff), io / bw) + LAUNCH_S
        if kind == "tma":  # per round of tiles, as matmul.cost_tma; + the channels-last copies
            bm, bn = config["bm"], config["bn"]
            rounds = -(-tma_tiles(cv, bm, bn) // sms)
            depth = cv.r * cv.s * -(-cv.c // CHUNK) * CHUNK
            eff, round_s = TMA_EFF[(bm, bn)]
            t = max(rounds * (2.0 * bm * bn * depth / (f16 / sms * eff) + round_s), io / bw)
            copied = 0 if tma_pointwise(cv) else tma_copied(cv, problem)  # the channels-last copies made
            copies = 2 * copied * isz / (bw * EFFICIENCY["layout"])
            return t + copies + 3 * LAUNCH_S
        if kind.startswith("winograd"):
            m = int(kind[-1])
            moved = (2 * (m + 2) ** 2 * (cv.c + cv.k) * wino_tiles(cv, m)) * 4 + io  # V and M written, read back
            return (_cost("simt")(wino_gemm(problem, m), config) + moved / (bw * EFFICIENCY["transform"])
                    + 3 * LAUNCH_S)
        if kind == "depthwise":
            return max(cv.flops / (peak * 0.25), io / (bw * EFFICIENCY["depthwise"])) + LAUNCH_S
        # vendor: the column buffer (with the bias row) written and read back, then the GEMM
        rows = cv.crs + cv.has_bias
        cols = 0 if pointwise(cv) else cv.n * cv.groups * rows * cv.p * cv.q * isz
        gemm = cv.flops / ((f16 * EFFICIENCY["gemm16"]) if problem.dtype in HALVES else peak * EFFICIENCY["gemm32"])
        return max(gemm, io / bw) + 2 * cols / (bw * EFFICIENCY["cols"]) + 2 * LAUNCH_S

    return cost


def _configs(kind: str) -> Callable[[Problem], list[Mapping[str, Any]]]:
    table = {"mma": MMA_CONFIGS, "tma": TMA_CONFIGS}.get(kind, SIMT_CONFIGS)
    cost = _cost(kind)

    def config_for(problem: Problem) -> list[Mapping[str, Any]]:
        return sorted(table, key=lambda c: cost(problem, c))

    return config_for



def build_variants() -> list[tuple[str, dict]]:
    """(file, defines) that CI compiles (gathered by the package's ``opruntime_build_variants``
    hook): every tile config in float32 and float16, the other dtypes once, both weight-load
    widths of the tensor-core kernel."""
    out = []
    for cfg in SIMT_CONFIGS:
        for dt in ("float32", "float16"):
            out.append(("conv_simt.cu", {"DTYPE": DTYPE_CODE[dt], "BM": cfg["bm"], "BN": cfg["bn"], "BK": cfg["bk"],
                                         "MINB": cfg["minb"]}))
    out += [("conv_simt.cu", {"DTYPE": DTYPE_CODE[dt], "BM": 64, "BN": 64, "BK": 8, "MINB": 1})
            for dt in ("float64", "bfloat16")]
    for cfg in MMA_CONFIGS:
        for avec in (0, 1):
            out.append(("conv_mma.cu", {"DTYPE": 1, "BM": cfg["bm"], "BN": cfg["bn"], "WARPS_M": cfg["wm"],
                                        "WARPS_N": cfg["wn"], "AVEC": avec, "MINB": cfg["minb"]}))
    out.append(("conv_mma.cu", {"DTYPE": 2, "BM": 128, "BN": 128, "WARPS_M": 2, "WARPS_N": 4, "AVEC": 1, "MINB": 2}))
    for code in DTYPE_CODE.values():
        out.append(("conv_depthwise.cu", {"DTYPE": code, "THREADS": 256, "KH": 3, "KW": 3, "IDX": "int"}))
        out.append(("conv_im2col.cu", {"DTYPE": code, "THREADS": 256, "IDX": "long long"}))
    out.append(("conv_depthwise.cu", {"DTYPE": 0, "THREADS": 256, "KH": 0, "KW": 0, "IDX": "long long"}))
    out += [("conv_winograd.cu", {"DTYPE": code, "THREADS": 256, "WINO_M": m}) for code in (0, 3) for m in (2, 4)]
    # the activation epilogue (ACT codes of epilogue.py: relu 1, gelu 2, gelu_tanh 3, silu 4) on each kernel
    for act in (1, 2, 3, 4):
        out.append(("conv_simt.cu", {"DTYPE": 0, "BM": 64, "BN": 128, "BK": 16, "MINB": 3, "ACT": act}))
        out.append(("conv_mma.cu", {"DTYPE": 1, "BM": 128, "BN": 128, "WARPS_M": 2, "WARPS_N": 4, "AVEC": 1,
                                    "MINB": 2, "ACT": act}))
        out.append(("conv_depthwise.cu", {"DTYPE": 1, "THREADS": 256, "KH": 3, "KW": 3, "IDX": "int", "ACT": act}))
        out.append(("conv_winograd.cu", {"DTYPE": 0, "THREADS": 256, "WINO_M": 4, "ACT": act}))
    out.append(("conv_simt.cu", {"DTYPE": 3, "BM": 64, "BN": 64, "BK": 8, "MINB": 1, "ACT": 2}))
    out.append(("conv_mma.cu", {"DTYPE": 2, "BM": 128, "BN": 128, "WARPS_M": 2, "WARPS_N": 4, "AVEC": 1, "MINB": 2,
                                "ACT": 4}))
    for cfg in TMA_CONFIGS:  # the TMA kernel's conv mode: both epilogue stores, bias, an activation, bf16
        for store in (0, 1):
            out.append(("matmul_tma.cu", {"CONV": 1, "BM": cfg["bm"], "BN": cfg["bn"], "STAGES": cfg["stages"],
                                          "STORE_TMA": store, "BF16": 0, "BIAS": 1, "ACT": 0}))
    out.append(("matmul_tma.cu", {"CONV": 1, "BM": 128, "BN": 256, "STAGES": 3, "STORE_TMA": 1, "BF16": 1,
                                  "BIAS": 0, "ACT": 2}))
    out += [("matmul_tma.cu", {"CONV": 2, "BM": cfg["bm"], "BN": cfg["bn"], "STAGES": cfg["stages"], "STORE_TMA": 1,
                               "BF16": 0, "BIAS": 0, "ACT": 0}) for cfg in TMA_CONFIGS]
    out.append(("matmul_tma.cu", {"CONV": 2, "BM": 64, "BN": 256, "STAGES": 4, "STORE_TMA": 1, "BF16": 1, "BIAS": 1,
                                  "ACT": 1}))
    out += [("layout.cu", {"ELEM": e}) for e in (2, 4, 8)]
    return out
