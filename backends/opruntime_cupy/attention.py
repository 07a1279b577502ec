"""scaled_dot_product_attention on CUDA (``attention.cu``): FlashAttention-2 on the tensor cores,
its float32 form in 3xTF32, an FMA kernel for every dtype, and the composite baseline.

Every kernel takes the operands as the operator's contract gives them (the docstring of
``opruntime/ops/attention.py``): 4-D q, k, v and mask with their own strides, broadcast batches and
heads (GQA included) read in place through those strides, never copied or expanded.

* ``flash`` (float16, bfloat16): FlashAttention-2. One block per (tile of BM = 64 or 128 query
  rows, batch x head), launched in the order of ``work_item`` (below), 4 or 8 warps of 16 rows each; q loaded once, k and v tiles of BN keys
  streamed by cp.async through two shared-memory stages each; S = q k^T and P v with
  ``mma.sync.m16n8k16`` (fp32 accumulation); the online softmax in registers, in base 2 (the
  scale folded with log2 e); causal tiles past a block's last row never loaded, a warp's tiles
  past its own rows skipped, the diagonal tile masked. E and Ev up to 256, padded in shared
  memory to multiples of 16 (head dims 64 and 128 are exact). Why: no L x S buffer (S = 32768
  runs in the memory of its operands), one read of q, k and v per query tile, the tensor cores.
* ``flash_wgmma`` (float16, bfloat16; Hopper, sm_90a): the same algorithm with warpgroup MMA
  (``wgmma.mma_async``), warp specialised as FlashAttention-3: a producer warpgroup streams q, k
  and v with cp.async into mbarrier-guarded stages; one or two consumer warpgroups of 64 query
  rows compute S = q k^T with both operands read by the tensor cores from shared memory (128-byte
  swizzle) and P v with P from registers, the softmax of one key tile overlapping the product of
  the previous one, and the two warpgroups taking turns at the tensor cores. Persistent blocks
  (one per SM) take their work items from a counter in ``work_item``'s order: a block that
  finishes early takes the next (a fixed stride left some blocks 20-30% more causal work than
  the mean: own / cuDNN at causal S = 1024 E = 128 went from 0.68 to 0.82). E and Ev
  padded to 64, 128 or 256; needs the 16-byte copies (a misaligned base at the call runs
  ``flash``'s element-load build). Why: ``mma.sync`` reaches about 2/3 of an H100's tensor peak,
  wgmma all of it.
* ``flash_f32`` (float32): the same kernel with each product in three TF32 ``mma.sync``
  (``a_lo b_hi + a_hi b_lo + a_hi b_hi``): errors of plain fp32 FMAs (not TF32's 1e-3) at tensor
  core speed. E and Ev padded to multiples of 8. Each tile of keys' P v is summed in a zeroed
  accumulator and added to the output with one rounded add: the tensor cores truncate as they
  accumulate, and straight into the output that bias reached 2.4e-4 over S = 32768 keys. The
  three products of a step are issued over several output tiles at a time, so that dependent
  products of one accumulator do not follow each other (causal 0.91 -> 0.96x torch).

Work items (``attention.cu``'s ``work_item``): heads in equal groups whose k and v fit half the
L2, the m-blocks of a group heaviest first (causal: the last rows), the group's heads within an
m-block; blocks running at once share k and v, and the short causal items come last.
* ``simt`` (float16, bfloat16, float32, float64): the online softmax in plain FMAs in the
  accumulation type (float64 in float64), any E and Ev up to 256: float64's kernel, and the
  fallback of the others.
* ``composite`` (every dtype): the baseline a user writes: ``cupy.matmul`` (cuBLAS) for q k^T into
  an L x S buffer of float32 (float64 for float64), a masked softmax in place (``attn_softmax``),
  ``cupy.matmul`` with v, the result rounded to the dtype. Only where the buffer fits comfortably
  (:data:`COMPOSITE_MAX_BYTES`, and a quarter of the free memory).

Strides: the flash kernels copy tiles with 16-byte ``cp.async`` when q, k and v have a unit last
stride, 16-byte multiples for every other stride, E and Ev, and 16-byte aligned bases (``VEC``);
otherwise the same config is built with element loads through any strides (no copies). A base
that is misaligned only at the call (a view's offset) runs that element-load build, made when first
needed. The mask is always read element by element through its strides (a bool mask as bytes, an
additive one in the problem's dtype). The output is a new C-contiguous (B, H, L, Ev) array.

Measured on an H100 (B=4 H=16 S=4096 E=128, TFLOP/s, not causal / causal; details beside
:data:`WGMMA_EFF` and :data:`FLASH_EFF`): ``flash_wgmma`` 487 / 465 (0.84 / 0.94x cuDNN in the
same run; 0.76-0.94x over the issue's grid), ``flash`` 301 / 229, ``flash_f32`` (B=4 H=16
S=2048) 46 / 42 (1.05x torch's float32 causal, 1.0x not causal); cuDNN 576 / 487.

Each kernel's ``prepare(problem, config)`` compiles its variant (NVRTC, cached), packs the
``AttnParams`` block once and returns ``launch(q, k, v, mask=None)``; a call allocates the output
and launches through :class:`~opruntime_cupy.compile.FastLaunch`. Compile-time options are named
in each build's label (``cupy.scaled_dot_product_attention.flash[float16 D=128 DV=128 BM=128 BN=64
W=8 causal vec]``), so a failure says which variant failed.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from opruntime.kernels import Kernel, Problem, c_strides, itemsize

from . import compile as cc
from .memory import empty

OP = "scaled_dot_product_attention"
NAME = f"cupy.{OP}"
SOURCE = "attention.cu"
DTYPE_CODE = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3}
DTYPES = frozenset(DTYPE_CODE)
HALVES = frozenset({"float16", "bfloat16"})
LOG2E = 1.4426950408889634
MAX_HEAD = 256  # E and Ev
SMEM_MAX = 227 * 1024  # dynamic shared memory one block may opt in to (sm_90)
SMEM_DEFAULT = 48 * 1024  # without opting in
MAX_GRID_Y = 65535
LAUNCH_S = 4e-6
#: the composite's score buffer: at most this many bytes (and a quarter of the free memory)
COMPOSITE_MAX_BYTES = 8 << 30

#: (BM, BN, WARPS): query rows per block (16 per warp) and keys per tile
FLASH_CONFIGS = tuple({"BM": bm, "BN": bn, "WARPS": bm // 16}
                      for bm, bn in ((128, 64), (128, 128), (64, 64), (64, 128), (128, 32), (64, 32)))
#: (BM, BN, NWG): 64 query rows per warpgroup
WGMMA_CONFIGS = tuple({"BM": 64 * nwg, "BN": bn, "NWG": nwg} for nwg, bn in ((2, 128), (2, 64), (1, 128), (1, 64)))
F32_CONFIGS = tuple({"BM": bm, "BN": bn, "WARPS": bm // 16} for bm, bn in ((64, 64), (128, 64), (64, 32), (128, 32)))
#: WARPS: 4 query rows each; BN (keys per tile) follows from the shared memory (:func:`simt_bn`)
SIMT_CONFIGS = ({"WARPS": 4}, {"WARPS": 8})
COMPOSITE_CONFIGS = ({"THREADS": 256}, {"THREADS": 512}, {"THREADS": 128})


def kernels() -> list[Kernel]:
    src = cc.source(SOURCE)
    return [
        Kernel(OP, f"{NAME}.flash", "cuda", HALVES, prepare=_prepare_flash, supports=_flash_ok, cost=_cost_flash,
               config_for=_flash_configs, configs=FLASH_CONFIGS, source=src),
        Kernel(OP, f"{NAME}.flash_wgmma", "cuda", HALVES, prepare=_prepare_wgmma, supports=_wgmma_ok,
               cost=_cost_wgmma, config_for=_wgmma_configs, configs=WGMMA_CONFIGS, source=src),
        Kernel(OP, f"{NAME}.flash_f32", "cuda", frozenset({"float32"}), prepare=_prepare_flash, supports=_flash_ok,
               cost=_cost_flash, config_for=_flash_configs, configs=F32_CONFIGS, source=src),
        Kernel(OP, f"{NAME}.simt", "cuda", DTYPES, prepare=_prepare_simt, supports=_simt_ok, cost=_cost_simt,
               config_for=_simt_configs, configs=SIMT_CONFIGS, source=src),
        Kernel(OP, f"{NAME}.composite", "cuda", DTYPES, prepare=_prepare_composite, supports=_composite_ok,
               cost=_cost_composite, configs=COMPOSITE_CONFIGS, source=src),
    ]


# -- the problem as the kernels see it -----------------------------------------------------------
class AttnParams(ctypes.Structure):
    """``struct AttnParams`` of attention.cu (same fields, same order, natural alignment)."""

    _fields_ = [("sq", ctypes.c_int64 * 4), ("sk", ctypes.c_int64 * 4), ("sv", ctypes.c_int64 * 4),
                ("sm", ctypes.c_int64 * 4),
                ("B", ctypes.c_int), ("H", ctypes.c_int), ("L", ctypes.c_int), ("S", ctypes.c_int),
                ("E", ctypes.c_int), ("Ev", ctypes.c_int),
                ("gq", ctypes.c_int), ("gk", ctypes.c_int), ("gv", ctypes.c_int), ("gm", ctypes.c_int),
                ("scale_log2", ctypes.c_float), ("pad_", ctypes.c_float), ("scale", ctypes.c_double)]


@dataclass(frozen=True)
class Geometry:
    """One problem in the kernels' terms: sizes, each operand's (batch, head, row, column)
    element strides with 0 for a dim of size 1 (so that ``b % Bx`` is ``b * stride``), and each
    operand's head group (output head h reads the operand's head ``h // group``)."""

    B: int
    H: int
    L: int
    S: int
    E: int
    Ev: int
    strides: tuple[tuple[int, int, int, int], ...]  # q, k, v, mask ((0, 0, 0, 0) without one)
    groups: tuple[int, int, int, int]
    mask: str | None  # None, "bool" or "float"
    causal: bool
    scale: float

    def params(self) -> AttnParams:
        p = AttnParams()
        for name, st in zip(("sq", "sk", "sv", "sm"), self.strides):
            getattr(p, name)[:] = st
        p.B, p.H, p.L, p.S, p.E, p.Ev = self.B, self.H, self.L, self.S, self.E, self.Ev
        p.gq, p.gk, p.gv, p.gm = self.groups
        p.scale_log2 = self.scale * LOG2E
        p.scale = self.scale
        return p

    def vec(self, dtype: str) -> bool:
        """Whether q, k and v can be copied in 16-byte chunks (their base addresses aside)."""
        ce = 16 // itemsize(dtype)
        if self.E % ce or self.Ev % ce:
            return False
        for st in self.strides[:3]:
            if st[3] != 1 or any(s % ce for s in st[:3]):
                return False
        return True


def geometry(problem: Problem) -> Geometry:
    B, H, L, Ev = problem.out_shape
    S, E = problem.shapes[1][2:]
    strides, groups = [], []
    for i in range(4):
        if i >= len(problem.shapes):
            strides.append((0, 0, 0, 0))
            groups.append(1)
            continue
        shape = problem.shapes[i]
        st = problem.strides[i] if problem.strides and problem.strides[i] is not None else c_strides(shape)
        strides.append(tuple(0 if n == 1 else int(s) for n, s in zip(shape, st)))  # type: ignore[arg-type]
        groups.append(H // shape[1])
    attrs = problem.attrs
    return Geometry(B, H, L, S, E, Ev, tuple(strides), tuple(groups), attrs["mask"],  # type: ignore[arg-type]
                    bool(attrs["causal"]), float(attrs["scale"]))


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def flash_dims(problem: Problem) -> tuple[int, int]:
    """(D, DV): E and Ev padded for the flash kernels (16 for the 16-bit types, 8 for float32)."""
    m = 8 if problem.dtype == "float32" else 16
    _, _, _, Ev = problem.out_shape
    return _round_up(problem.shapes[0][3], m), _round_up(Ev, m)


def flash_smem(dtype: str, d: int, dv: int, bm: int, bn: int) -> int:
    """Dynamic shared memory of a flash build: the q / output tile and two stages of k and v,
    rows of 16-byte chunks padded by one chunk."""
    ce = 16 // itemsize(dtype)
    qs, vs = d // ce + 1, dv // ce + 1
    return 16 * (bm * max(qs, vs) + 2 * bn * qs + 2 * bn * vs)


def wgmma_dims(problem: Problem) -> tuple[int, int]:
    """(D, DV) of the wgmma kernel: E and Ev padded to 64, 128 or 256."""
    def pad(n: int) -> int:
        return 64 if n <= 64 else (128 if n <= 128 else 256)

    return pad(problem.shapes[0][3]), pad(problem.out_shape[3])


def wgmma_smem(d: int, dv: int, bm: int, bn: int) -> int:
    """The wgmma kernel's shared memory: 1 KiB to align by hand, the q tile, two stages of k and v,
    eleven mbarriers and the two words that hand work items to the consumers."""
    return 1024 + bm * d * 2 + 2 * bn * d * 2 + 2 * bn * dv * 2 + 96


def simt_bn(problem: Problem, warps: int) -> tuple[int, int] | None:
    """(BN, shared bytes) of the simt kernel: the most keys per tile whose shared memory stays
    under 100 KiB (two blocks per SM), else 16 keys if they fit at all."""
    e, ev = problem.shapes[0][3], problem.out_shape[3]
    acc = 8 if problem.dtype == "float64" else 4
    bm, es, dv = 4 * warps, e | 1, _round_up(ev, 32)
    for bn in (64, 32, 16):
        smem = (bm * es + bn * es + bn * dv + bm * (bn + 1)) * acc
        if smem <= 100 * 1024 or (bn == 16 and smem <= SMEM_MAX):
            return bn, smem
    return None


# -- supports / configs ------------------------------------------------------------------------------
def _sizes_ok(problem: Problem) -> bool:
    B, H, L, Ev = problem.out_shape
    S, E = problem.shapes[1][2:]
    return 0 < E <= MAX_HEAD and 0 < Ev <= MAX_HEAD and B * H < 2**31 and L < 2**31 and S < 2**31


def _flash_ok(problem: Problem) -> bool:
    return _sizes_ok(problem) and bool(_flash_configs(problem))


#: the (BM, BN) tile shapes fastest first, by head dim (padded) and causality, as measured on an
#: H100 (B=4 H=16 S=4096 E=128 and B=16 H=16 S=1024 E=64, float16 / bfloat16; docstring of
#: :data:`FLASH_EFF`); a shape a problem's shared memory refuses is dropped
FLASH_ORDER = {
    "small": ((64, 64), (64, 128), (64, 32), (128, 128), (128, 64), (128, 32)),
    "mid": ((128, 128), (64, 64), (128, 64), (64, 32), (128, 32), (64, 128)),
    "mid-causal": ((64, 64), (128, 128), (64, 32), (128, 64), (128, 32), (64, 128)),
    "large": ((64, 64), (64, 32), (128, 64), (128, 32), (128, 128), (64, 128)),
    "f32": ((128, 64), (64, 32), (128, 32), (64, 64)),
}
#: the wgmma kernel's: every head dim and causality alike (S = 1024, 4096, 16384; head dims 64 and
#: 128, float16 / bfloat16; :data:`WGMMA_EFF`); head dim 256 keeps that order among its 64-key tiles
WGMMA_ORDER = {"small": ((128, 128), (128, 64), (64, 128), (64, 64)),
               "mid": ((128, 128), (128, 64), (64, 128), (64, 64)),
               "large": ((128, 64), (64, 64))}


def _head_class(d: int, dv: int) -> str:
    return "small" if max(d, dv) <= 64 else ("mid" if max(d, dv) <= 128 else "large")


def _few_blocks(problem: Problem) -> bool:
    """Fewer than two 128-row blocks per SM: 64-row tiles first (more blocks to spread)."""
    B, H, L, _ = problem.out_shape
    sms = getattr(problem.device.provider, "sm_count", 132)
    return -(-L // 128) * B * H < 2 * sms


def _flash_configs(problem: Problem) -> list[Mapping[str, Any]]:
    """The configs whose shared memory fits, in the measured order of :data:`FLASH_ORDER` (64-row
    tiles first when 128-row ones leave fewer than two blocks per SM)."""
    d, dv = flash_dims(problem)
    if problem.dtype == "float32":
        table, order = F32_CONFIGS, FLASH_ORDER["f32"]
    else:
        table = FLASH_CONFIGS
        cls = _head_class(d, dv)
        order = FLASH_ORDER[cls + ("-causal" if cls == "mid" and problem.attrs["causal"] else "")]
    fits = [c for c in table if flash_smem(problem.dtype, d, dv, c["BM"], c["BN"]) <= SMEM_MAX]
    few = _few_blocks(problem)
    return sorted(fits, key=lambda c: (few and c["BM"] != 64, order.index((c["BM"], c["BN"]))))


def _sm90(problem: Problem) -> bool:
    try:
        return cc.arch_of(problem.device.provider.index) == "90"
    except Exception:  # noqa: BLE001 - no CuPy or no device here: no wgmma either
        return False


def _wgmma_configs(problem: Problem) -> list[Mapping[str, Any]]:
    """The configs that fit, in the measured order of :data:`WGMMA_ORDER`: 128-key tiles only for
    head dims up to 128 (beyond, the accumulators of S and O would not fit the registers)."""
    d, dv = wgmma_dims(problem)
    order = WGMMA_ORDER[_head_class(d, dv)]
    fits = [c for c in WGMMA_CONFIGS if wgmma_smem(d, dv, c["BM"], c["BN"]) <= SMEM_MAX
            and (c["BM"], c["BN"]) in order]
    few = _few_blocks(problem)
    return sorted(fits, key=lambda c: (few and c["BM"] != 64, order.index((c["BM"], c["BN"]))))


def _wgmma_ok(problem: Problem) -> bool:
    return (_sizes_ok(problem) and geometry(problem).vec(problem.dtype) and bool(_wgmma_configs(problem))
            and _sm90(problem))


def _simt_ok(problem: Problem) -> bool:
    return _sizes_ok(problem) and bool(_simt_configs(problem))


def _simt_configs(problem: Problem) -> list[Mapping[str, Any]]:
    return [c for c in SIMT_CONFIGS if simt_bn(problem, c["WARPS"]) is not None]


def composite_bytes(problem: Problem) -> int:
    """The composite's score buffer (B x H x L x S in float32, float64 for float64)."""
    B, H, L, _ = problem.out_shape
    S = problem.shapes[1][2]
    return B * H * L * S * (8 if problem.dtype == "float64" else 4)


def _composite_ok(problem: Problem) -> bool:
    nbytes = composite_bytes(problem)
    if nbytes > COMPOSITE_MAX_BYTES:
        return False
    free_memory = getattr(problem.device.provider, "free_memory", None)
    free = free_memory() if callable(free_memory) else None
    return free is None or nbytes <= free // 4


# -- cost models ------------------------------------------------------------------------------------
def _op_figures(problem: Problem) -> tuple[float, float]:
    from opruntime.ops import OPS

    op = OPS[OP]
    return op.flops(problem), op.bytes(problem)


#: fraction of the dense fp16 tensor peak each flash tile shape reached on an H100 (989 TFLOP/s
#: in the figures), B=4 H=16 S=4096 E=128 float16, not causal: 128x128 301, 64x64 295, 128x64
#: 290, 64x32 253, 128x32 247, 64x128 236 TFLOP/s (causal: about 0.76 of that, 64x64 best at 229;
#: torch's FlashAttention-2 361 / 312, cuDNN 661 / 565). float32 (three TF32 products at half
#: the rate: the peak / 6): 128x64 47, 64x32 45, 128x32 43, 64x64 35 (torch's efficient kernel 47)
FLASH_EFF = {(128, 128): 0.305, (64, 64): 0.30, (128, 64): 0.295, (64, 32): 0.255, (128, 32): 0.25, (64, 128): 0.24}
F32_EFF = {(128, 64): 0.285, (64, 32): 0.27, (128, 32): 0.26, (64, 64): 0.215}
CAUSAL_EFF = 0.76


def _cost_flash(problem: Problem, config: Mapping[str, Any]) -> float:
    flops, nbytes = _op_figures(problem)
    f32, f16, bw = problem.device.provider.figures()
    d, dv = flash_dims(problem)
    B, H, L, Ev = problem.out_shape
    E = problem.shapes[0][3]
    if problem.dtype == "float32":
        rate = f16 / 6 * F32_EFF[(config["BM"], config["BN"])]
    else:
        rate = f16 * FLASH_EFF[(config["BM"], config["BN"])]
    rate *= (E + Ev) / (d + dv) * (CAUSAL_EFF if problem.attrs["causal"] else 1.0)  # padded columns work too
    g = geometry(problem)
    if not g.vec(problem.dtype):
        rate *= 0.5  # element loads, not overlapped with the tensor cores
    if g.mask is not None:
        rate *= 0.8
    # k and v are read once per query tile (mostly from L2)
    S = problem.shapes[1][2]
    kv = B * H * -(-L // config["BM"]) * S * (E + Ev) * itemsize(problem.dtype)
    return max(flops / rate, nbytes / bw, kv / (4 * bw)) + LAUNCH_S


#: the wgmma kernel's fraction of the dense tensor peak on an H100 (as :data:`FLASH_EFF`), warp
#: specialised and persistent (2026-11-24, B=4 H=16 S=4096 float16, not causal): at head dim 128,
#: 128x128 490, 128x64 450, 64x128 340, 64x64 290 TFLOP/s (444 / 537 at S=1024 / 16384); causal
#: keeps about 0.84 of it (411 at 128x128). At head dim 64 (the softmax's exponentials, not the
#: products, bound it): 128x128 381, 128x64 337, 64x128 237, 64x64 187; causal about 0.83 (317).
#: cuDNN's SDPA in the same runs: 645 / 472 TFLOP/s (head dim 128 / 64), causal 545 / 371.
WGMMA_EFF = {(128, 128): 0.50, (128, 64): 0.455, (64, 128): 0.35, (64, 64): 0.29}
WGMMA_EFF_64 = {(128, 128): 0.385, (128, 64): 0.34, (64, 128): 0.24, (64, 64): 0.19}
WGMMA_CAUSAL_EFF = 0.84


def _cost_wgmma(problem: Problem, config: Mapping[str, Any]) -> float:
    flops, nbytes = _op_figures(problem)
    _, f16, bw = problem.device.provider.figures()
    d, dv = wgmma_dims(problem)
    B, H, L, Ev = problem.out_shape
    E = problem.shapes[0][3]
    narrow = max(d, dv) <= 64
    rate = f16 * (WGMMA_EFF_64 if narrow else WGMMA_EFF)[(config["BM"], config["BN"])] * (E + Ev) / (d + dv)
    if problem.attrs["causal"]:
        rate *= WGMMA_CAUSAL_EFF
    if geometry(problem).mask is not None:
        rate *= 0.8
    S = problem.shapes[1][2]
    kv = B * H * -(-L // config["BM"]) * S * (E + Ev) * itemsize(problem.dtype)
    return max(flops / rate, nbytes / bw, kv / (4 * bw)) + LAUNCH_S


def _cost_simt(problem: Problem, config: Mapping[str, Any]) -> float:
    flops, nbytes = _op_figures(problem)
    f32, _, bw = problem.device.provider.figures()
    rate = f32 * (0.5 if problem.dtype == "float64" else 1.0) * (0.15 if config["WARPS"] == 8 else 0.13)
    return max(flops / rate, nbytes / bw) + LAUNCH_S


def _cost_composite(problem: Problem, config: Mapping[str, Any]) -> float:
    flops, nbytes = _op_figures(problem)
    f32, _, bw = problem.device.provider.figures()
    rate = f32 * (0.5 if problem.dtype == "float64" else 1.0) * 0.7  # cuBLAS in the accumulation type
    B, H, L, _ = problem.out_shape
    S, E = problem.shapes[1][2:]
    full = 2.0 * B * H * L * S * (E + problem.out_shape[3])  # every score, causal or not
    scores = composite_bytes(problem)
    # written by the matmul, read twice and written by the softmax, read by the second matmul
    return max(full, flops) / rate + (5 * scores + nbytes) / bw + 4 * LAUNCH_S


# -- launching ---------------------------------------------------------------------------------------
def _mask_code(g: Geometry) -> int:
    return {None: 0, "bool": 1, "float": 2}[g.mask]


def _opt_in(fn: Any, smem: int, dev: int) -> None:
    """Let ``fn`` use ``smem`` bytes of dynamic shared memory (beyond the default 48 KiB); never
    lowers what another launcher of the same function asked for."""
    if smem <= SMEM_DEFAULT:
        return
    import cupy

    with cupy.cuda.Device(dev):
        if fn.max_dynamic_shared_size_bytes < smem:
            fn.max_dynamic_shared_size_bytes = smem


def flash_defines(problem: Problem, config: Mapping[str, Any], vec: bool) -> dict[str, int]:
    g = geometry(problem)
    d, dv = flash_dims(problem)
    defines = {"DTYPE": DTYPE_CODE[problem.dtype], "FAMILY": 1, "D": d, "DV": dv, "BM": config["BM"],
               "BN": config["BN"], "WARPS": config["WARPS"], "CAUSAL": int(g.causal), "MASK": _mask_code(g),
               "VEC": int(vec), "QREG": int(problem.dtype != "float32" and d <= 128)}
    return defines


def label(kernel: str, problem: Problem, defines: Mapping[str, int]) -> str:
    """The kernel's name with the build's options: what a compile error or a failure names."""
    keys = [f"{k}={defines[k]}" for k in ("D", "DV", "BM", "BN", "WARPS", "NWG", "THREADS") if k in defines]
    flags = ["causal"] if defines.get("CAUSAL") else []
    flags += [{1: "bool-mask", 2: "float-mask"}[defines["MASK"]]] if defines.get("MASK") else []
    if "VEC" in defines:
        flags.append("vec" if defines["VEC"] else "strided")
    return f"{kernel}[{problem.dtype} {' '.join(keys + flags)}]"


def _launcher(problem: Problem, build: Callable[[bool], Any], vec: bool, what: str,
              counted: bool = False) -> Callable[..., Any]:
    """``launch(q, k, v, mask=None)`` around ``build(vec) -> FastLaunch``; the element-load build
    serves bases that are not 16-byte aligned, made when first needed. ``counted``: the kernel
    takes its work items from a counter (a sixth pointer, one per stream: launches queued on two
    streams may run at once; each launch leaves it at 0 for the next), which a five-pointer build
    ignores."""
    import cupy

    dev = problem.device.provider.index
    shape = problem.out_shape
    fast = build(vec)
    slow: list[Any] = [None if vec else fast]
    getdev, alloc, oom = cupy.cuda.runtime.getDevice, cupy.empty, cupy.cuda.memory.OutOfMemoryError
    stream = cupy.cuda.get_current_stream
    counters: dict[int, Any] = {}

    def counter() -> int:
        sp = stream().ptr
        c = counters.get(sp)
        if c is None:  # CuPy's default pool whatever allocator is current (a graph's must not own it)
            c = counters[sp] = cupy.get_default_memory_pool().malloc(4)
            cupy.cuda.runtime.memsetAsync(c.ptr, 0, 4, sp)
        return c.ptr

    def launch(q: Any, k: Any, v: Any, mask: Any = None) -> Any:
        if getdev() != dev:
            with cupy.cuda.Device(dev):
                return launch(q, k, v, mask)
        qp, kp, vp = q.data.ptr, k.data.ptr, v.data.ptr
        run = fast
        if (qp | kp | vp) & 15 and vec:  # a view's offset: 16-byte copies would fault
            run = slow[0]
            if run is None:
                run = slow[0] = build(False)
        try:
            out = alloc(shape, q.dtype)
        except oom:
            out = empty(shape, q.dtype, what)  # retried there, raising OutOfMemoryError with the figures
        if counted:
            run(qp, kp, vp, mask.data.ptr if mask is not None else 0, out.data.ptr, counter())
        else:
            run(qp, kp, vp, mask.data.ptr if mask is not None else 0, out.data.ptr)
        return out

    return launch


def _prepare_flash(problem: Problem, config: Mapping[str, Any]) -> Callable[..., Any]:
    g = geometry(problem)
    dev = problem.device.provider.index
    kernel = f"{NAME}.flash_f32" if problem.dtype == "float32" else f"{NAME}.flash"
    params = g.params()
    grid = (-(-g.L // config["BM"]) * g.B * g.H,)  # one block per work item (attention.cu: work_item)
    d, dv = flash_dims(problem)
    smem = flash_smem(problem.dtype, d, dv, config["BM"], config["BN"])

    def build(vec: bool) -> Any:
        defines = flash_defines(problem, config, vec)
        fn = cc.get_function(SOURCE, "attn_flash", defines, dev, kernel=label(kernel, problem, defines))
        _opt_in(fn, smem, dev)
        return cc.FastLaunch(fn, grid, (config["WARPS"] * 32,), pointers=5, scalars=[params], shared_mem=smem)

    return _launcher(problem, build, g.vec(problem.dtype), kernel)


def wgmma_defines(problem: Problem, config: Mapping[str, Any]) -> dict[str, int]:
    g = geometry(problem)
    d, dv = wgmma_dims(problem)
    return {"DTYPE": DTYPE_CODE[problem.dtype], "FAMILY": 4, "D": d, "DV": dv, "BN": config["BN"],
            "NWG": config["NWG"], "CAUSAL": int(g.causal), "MASK": _mask_code(g)}


def _prepare_wgmma(problem: Problem, config: Mapping[str, Any]) -> Callable[..., Any]:
    g = geometry(problem)
    dev = problem.device.provider.index
    kernel = f"{NAME}.flash_wgmma"
    params = g.params()
    d, dv = wgmma_dims(problem)
    smem = wgmma_smem(d, dv, config["BM"], config["BN"])
    fallback = FLASH_CONFIGS[2]  # misaligned bases: the mma.sync kernel's element-load build

    def build(vec: bool) -> Any:
        if not vec:
            defines = flash_defines(problem, fallback, False)
            fn = cc.get_function(SOURCE, "attn_flash", defines, dev, kernel=label(f"{NAME}.flash", problem, defines))
            fsmem = flash_smem(problem.dtype, *flash_dims(problem), fallback["BM"], fallback["BN"])
            _opt_in(fn, fsmem, dev)
            grid = (-(-g.L // fallback["BM"]) * g.B * g.H,)
            return cc.FastLaunch(fn, grid, (fallback["WARPS"] * 32,), pointers=5, scalars=[params], shared_mem=fsmem)
        defines = wgmma_defines(problem, config)
        fn = cc.get_function(SOURCE, "attn_wgmma", defines, dev, kernel=label(kernel, problem, defines), arch="90a")
        _opt_in(fn, smem, dev)
        # persistent: one block per SM takes the (query tile, batch x head) items from a counter;
        # a producer warpgroup and NWG consumer warpgroups each
        grid = (min(-(-g.L // config["BM"]) * g.B * g.H, problem.device.provider.sm_count), 1)
        return cc.FastLaunch(fn, grid, ((config["NWG"] + 1) * 128,), pointers=6, scalars=[params], shared_mem=smem)

    return _launcher(problem, build, True, kernel, counted=True)


def simt_defines(problem: Problem, config: Mapping[str, Any]) -> dict[str, int]:
    g = geometry(problem)
    bn, _ = simt_bn(problem, config["WARPS"])  # type: ignore[misc]
    return {"DTYPE": DTYPE_CODE[problem.dtype], "FAMILY": 2, "WARPS": config["WARPS"], "BN": bn,
            "DV": _round_up(g.Ev, 32), "CAUSAL": int(g.causal), "MASK": _mask_code(g)}


def _prepare_simt(problem: Problem, config: Mapping[str, Any]) -> Callable[..., Any]:
    g = geometry(problem)
    dev = problem.device.provider.index
    defines = simt_defines(problem, config)
    _, smem = simt_bn(problem, config["WARPS"])  # type: ignore[misc]
    params = g.params()
    grid = (-(-g.L // (4 * config["WARPS"])), min(g.B * g.H, MAX_GRID_Y))
    kernel = f"{NAME}.simt"

    def build(vec: bool) -> Any:
        fn = cc.get_function(SOURCE, "attn_simt", defines, dev, kernel=label(kernel, problem, defines))
        _opt_in(fn, smem, dev)
        return cc.FastLaunch(fn, grid, (config["WARPS"] * 32,), pointers=5, scalars=[params], shared_mem=smem)

    return _launcher(problem, build, False, kernel)


# -- the composite -------------------------------------------------------------------------------------
def _grouped(cupy: Any, x: Any, hk: int, grp: int) -> Any:
    """(Bx, Hx, R, C) as (Bx, Hk, G, R, C) or a broadcastable (Bx, Hk | 1, 1, R, C): output head
    h = hk_index * G + g reads head h // G of an operand with Hk heads."""
    b, hx, r, c = x.shape
    if hx == hk * grp:
        return x.reshape(b, hk, grp, r, c)
    if hx == hk:
        return x.reshape(b, hk, 1, r, c)
    return x.reshape(b, 1, 1, r, c)


def _prepare_composite(problem: Problem, config: Mapping[str, Any]) -> Callable[..., Any]:
    import cupy

    from . import memory

    g = geometry(problem)
    dev = problem.device.provider.index
    dtype = problem.dtype
    acc = cupy.float64 if dtype == "float64" else cupy.float32
    defines = {"DTYPE": DTYPE_CODE[dtype], "FAMILY": 3, "THREADS": config["THREADS"], "CAUSAL": int(g.causal),
               "MASK": _mask_code(g)}
    kernel = f"{NAME}.composite"
    fn = cc.get_function(SOURCE, "attn_softmax", defines, dev, kernel=label(kernel, problem, defines))
    hk = max(problem.shapes[1][1], problem.shapes[2][1])
    grp = g.H // hk
    softmax = cc.FastLaunch(fn, (g.B * g.H * g.L,), (config["THREADS"],), pointers=2, scalars=[g.params()])
    bf16 = memory.bfloat16() if dtype == "bfloat16" else None
    what = f"{kernel} {problem}"

    def widen(x: Any) -> Any:
        if dtype == "bfloat16":
            return (x.view(cupy.uint16).astype(cupy.uint32) << 16).view(cupy.float32)
        return x.astype(acc, copy=False)

    def narrow(x: Any) -> Any:
        if dtype == "bfloat16":  # round to nearest even; NaN stays a (quiet) NaN
            b = x.view(cupy.uint32)
            r = ((b + cupy.uint32(0x7FFF) + ((b >> 16) & cupy.uint32(1))) >> 16).astype(cupy.uint16)
            return cupy.where(cupy.isnan(x), cupy.uint16(0x7FC0), r).view(bf16)
        return x.astype(dtype, copy=False) if x.dtype != dtype else x

    def launch(q: Any, k: Any, v: Any, mask: Any = None) -> Any:
        if cupy.cuda.runtime.getDevice() != dev:
            with cupy.cuda.Device(dev):
                return launch(q, k, v, mask)
        with memory.oom_guard(what, composite_bytes(problem)):
            qg = _grouped(cupy, widen(q), hk, grp)
            qg = cupy.broadcast_to(qg, (g.B, hk, grp, g.L, g.E))
            kg = _grouped(cupy, widen(k), hk, grp)
            s = cupy.matmul(qg, kg.swapaxes(-1, -2))  # (B, Hk, G, L, S), C-contiguous
            s = cupy.ascontiguousarray(s)
            softmax(s.data.ptr, mask.data.ptr if mask is not None else 0)
            out = cupy.matmul(s, _grouped(cupy, widen(v), hk, grp))
            out = cupy.ascontiguousarray(cupy.broadcast_to(out, (g.B, hk, grp, g.L, g.Ev))).reshape(problem.out_shape)
            return narrow(out)

    return launch


# -- CI builds ----------------------------------------------------------------------------------------
def build_variants() -> list[tuple[str, dict]]:
    """(file, defines) that CI compiles (gathered by the package's ``opruntime_build_variants``
    hook): every flash config at head dims 64 and 128 (and the 256 ones that fit) in float16, the
    largest ones in bfloat16 and float32, causal, both masks and the element-load builds at odd
    padded dims; the simt kernel per dtype at its largest output width; the composite's softmax."""
    out: list[tuple[str, dict]] = []

    def flash(dtype: str, d: int, dv: int, cfg: Mapping[str, int], causal: int = 0, mask: int = 0,
              vec: int = 1) -> None:
        out.append((SOURCE, {"DTYPE": DTYPE_CODE[dtype], "FAMILY": 1, "D": d, "DV": dv, "BM": cfg["BM"],
                             "BN": cfg["BN"], "WARPS": cfg["WARPS"], "CAUSAL": causal, "MASK": mask, "VEC": vec,
                             "QREG": int(dtype != "float32" and d <= 128)}))

    for d in (64, 128, 256):
        for cfg in FLASH_CONFIGS:
            if flash_smem("float16", d, d, cfg["BM"], cfg["BN"]) <= SMEM_MAX:
                flash("float16", d, d, cfg)
    big = FLASH_CONFIGS[0]
    flash("bfloat16", 128, 128, big, causal=1)
    flash("bfloat16", 64, 64, FLASH_CONFIGS[1], causal=1)
    flash("float16", 128, 128, big, causal=1, mask=1)
    flash("bfloat16", 128, 128, big, mask=2)
    flash("float16", 96, 48, FLASH_CONFIGS[2], causal=1, vec=0)
    flash("bfloat16", 16, 256, FLASH_CONFIGS[2], mask=2, vec=0)
    for d in (64, 128):
        for cfg in F32_CONFIGS:
            if flash_smem("float32", d, d, cfg["BM"], cfg["BN"]) <= SMEM_MAX:
                flash("float32", d, d, cfg)
    flash("float32", 128, 128, F32_CONFIGS[0], causal=1, mask=1)
    flash("float32", 256, 256, F32_CONFIGS[2], mask=2)
    flash("float32", 8, 40, F32_CONFIGS[0], causal=1, vec=0)
    for d in (64, 128):
        for cfg in WGMMA_CONFIGS:
            out.append((SOURCE, {"DTYPE": 1, "FAMILY": 4, "D": d, "DV": d, "BN": cfg["BN"], "NWG": cfg["NWG"],
                                 "CAUSAL": 0, "MASK": 0}))
    out.append((SOURCE, {"DTYPE": 2, "FAMILY": 4, "D": 128, "DV": 128, "BN": 128, "NWG": 2, "CAUSAL": 1, "MASK": 0}))
    out.append((SOURCE, {"DTYPE": 1, "FAMILY": 4, "D": 256, "DV": 256, "BN": 64, "NWG": 2, "CAUSAL": 0, "MASK": 1}))
    out.append((SOURCE, {"DTYPE": 2, "FAMILY": 4, "D": 64, "DV": 128, "BN": 64, "NWG": 1, "CAUSAL": 1, "MASK": 2}))
    for code in DTYPE_CODE.values():
        out.append((SOURCE, {"DTYPE": code, "FAMILY": 2, "WARPS": 8, "BN": 16, "DV": 256, "CAUSAL": 0,
                             "MASK": 2}))
        out.append((SOURCE, {"DTYPE": code, "FAMILY": 3, "THREADS": 256, "CAUSAL": 0, "MASK": 2}))
    out.append((SOURCE, {"DTYPE": 3, "FAMILY": 2, "WARPS": 4, "BN": 64, "DV": 32, "CAUSAL": 1, "MASK": 0}))
    out.append((SOURCE, {"DTYPE": 1, "FAMILY": 3, "THREADS": 512, "CAUSAL": 1, "MASK": 0}))
    out.append((SOURCE, {"DTYPE": 0, "FAMILY": 3, "THREADS": 128, "CAUSAL": 0, "MASK": 1}))
    return out
