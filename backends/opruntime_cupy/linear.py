"""linear on CUDA: ``x @ weight.T + bias`` and the activation, three ways.

* The own GEMMs of ``matmul.py`` (``simt`` fp32, ``mma`` and Hopper's ``wgmma`` and ``tma`` fp16 /
  bf16, each with its any-stride variant) built with their epilogue (``BIAS``, ``ACT`` of
  ``matmul_common.cuh``): bias and activation applied in fp32 to the accumulators before the one
  rounding, so GEMM + bias + activation is one kernel. ``weight`` (N, K) row-major is the GEMM's
  B (K x N) k-contiguous: the ``B_NCONTIG 0`` layout the kernels already read.
* ``cublas``: cuBLAS through ``cupy.matmul(x, weight.T)`` (a transposed GEMM, no copy), then ONE
  fused in-place pass adding the bias and applying the activation (``linear.cu``, 16-byte
  vectors); the vendor baseline for every activation.
* ``cublaslt``: one ``cublasLtMatmul`` with cuBLASLt's own epilogue (BIAS, RELU_BIAS, GELU_BIAS,
  and RELU / GELU without a bias), torch's ``F.linear`` call (``cublaslt.py``: the descriptors and
  the algorithm for each operand alignment planned once). cuBLASLt's GELU is the tanh
  approximation: exact gelu and silu run as the BIAS epilogue and one in-place activation pass.
  Absent (``supports`` refuses, :func:`nvmath_missing` says why) when nvmath-python's bindings or
  the library cannot be loaded.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable, Mapping
from typing import Any

from opruntime.kernels import Attrs, Kernel, Problem, Refusal, c_strides, itemsize

from . import compile as cc
from . import cublaslt, memory
from . import matmul as mm
from .conv_launch import DTYPE_CODE
from .cudnn import ALIGN
from .cudnn import like as aligned
from .epilogue import ACT
from .matmul_launch import NOT_DEFINES, gemm_nt, launcher

EPILOGUE_THREADS = 256


def as_matmul(problem: Problem) -> Problem:
    """The linear problem as the GEMM (M x K) @ (K x N) its kernels run: B is ``weight.T``."""
    (m, k), (n, _) = problem.shapes[:2]
    sx, sw = problem.strides[:2]
    sb = None if sw is None else (sw[1], sw[0])
    return Problem("matmul", problem.device, ((m, k), (k, n)), problem.dtypes[:2], (sx, sb), Attrs(), (m, n),
                   problem.dtype)


def epilogue_defines(problem: Problem) -> dict[str, int]:
    """The BIAS / ACT defines of the problem's epilogue in the own GEMMs (none: a plain GEMM).
    With a residual the activation waits for it: the GEMM adds the bias, one pass of
    :func:`epilogue_pass` adds the residual and activates."""
    out = {}
    if problem.attrs["bias"]:
        out["BIAS"] = 1
    if problem.attrs["activation"] is not None and not problem.attrs["residual"]:
        out["ACT"] = ACT[problem.attrs["activation"]]
    return out


def operands(problem: Problem) -> Callable[[tuple[Any, ...]], tuple[Any, Any]]:
    """``split(rest)``: (bias, residual) from a call's operands after ``x, w`` (None when absent)."""
    has_bias, has_residual = problem.attrs["bias"], problem.attrs["residual"]
    return lambda rest: (rest[0] if has_bias else None, rest[-1] if has_residual else None)


#: seconds per output element an activation adds to the own GEMMs' epilogue, measured on an H100
#: (fp16, 4096^3 + bias, the TMA kernel: 197 us plain, 213 with gelu_tanh, 226 with gelu): the
#: epilogue runs from the accumulator registers of 8 warps per SM while the tensor cores wait, so
#: it costs more than its arithmetic. (Before the activations divided by one rcp.approx, an IEEE
#: division per value made it 5e-12: 110 us for gelu_tanh at 4096^3.)
EPILOGUE_S_PER_ELEMENT = 1.5e-12


def _pass_seconds(problem: Problem, reads: int) -> float:
    """A pass over the output of its own (the output read and written, ``reads`` more operands of
    its size read) and its launch."""
    bw = problem.device.provider.figures()[2]
    return (2.0 + reads) * math.prod(problem.out_shape) * itemsize(problem.dtype) / bw + mm.GPU_LAUNCH


def _epilogue_seconds(problem: Problem) -> float:
    """What the activation adds to an own GEMM's epilogue (:data:`EPILOGUE_S_PER_ELEMENT`), or
    with a residual the pass that adds it and activates."""
    if problem.attrs["residual"]:
        return _pass_seconds(problem, 1)
    return 0.0 if problem.attrs["activation"] is None else EPILOGUE_S_PER_ELEMENT * math.prod(problem.out_shape)


# -- the own GEMMs with their epilogue ----------------------------------------------------------
def _own(family: str, generic: bool, fallback: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    label = "cupy.linear"

    def prepare(problem: Problem, config: Mapping[str, Any]) -> Callable[..., Any]:
        gemm = launcher(family, as_matmul(problem), config, generic, fallback, epilogue_defines(problem), label)
        split = operands(problem)
        if not problem.attrs["residual"]:
            def launch(x: Any, w: Any, bias: Any = None) -> Any:
                return gemm(x, w.T, bias)

            return launch
        (m, n), act = problem.out_shape, problem.attrs["activation"]
        apply = epilogue_pass(problem, (m, n), 1, n, False, act, label, residual=True)

        def launch_residual(x: Any, w: Any, *rest: Any) -> Any:  # GEMM + bias, then + residual, activated
            bias, residual = split(rest)
            y = gemm(x, w.T, bias)
            apply(y, None, residual)
            return y

        return launch_residual

    prepare.__name__ = f"prepare_linear_{family}{'_generic' if generic else ''}"
    return prepare


def _via(fn: Callable[[Problem], Any]) -> Callable[[Problem], Any]:
    return lambda problem: fn(as_matmul(problem))


def _cost(fn: Callable[[Problem, Mapping[str, Any]], float]) -> Callable[[Problem, Mapping[str, Any]], float]:
    return lambda problem, config: fn(as_matmul(problem), config) + _epilogue_seconds(problem)


def _ranked(configs: tuple[dict, ...], cost: Callable[[Problem, Mapping[str, Any]], float]) -> Callable[..., Any]:
    return lambda problem: sorted(configs, key=lambda c: cost(problem, c))


# -- cuBLAS, then one fused bias + activation pass ------------------------------------------------
def epilogue_pass(problem: Problem, out_shape: tuple[int, ...], inner: int, channels: int, bias: bool,
                  activation: str | None, label: str, residual: bool = False) -> Callable[..., None]:
    """``apply(y, b, r=None)``: ``y = act(y + b[channel] + r)`` in place, one launch of
    ``linear.cu``'s ``bias_act`` over the contiguous ``y`` of ``out_shape`` seen as (outer,
    channels, inner); ``b`` may be None when ``bias`` is False, ``r`` (``y``'s shape, copied when
    not contiguous) is read when ``residual``. Shared with conv2d's vendor path."""
    import cupy

    dev = problem.device.provider.index
    total = math.prod(out_shape)
    isz = itemsize(problem.dtype)
    vec = 16 // isz
    if not ((inner == 1 and channels % vec == 0) or inner % vec == 0):
        vec = 1
    d = {"DTYPE": DTYPE_CODE[problem.dtype], "ACT": ACT[activation], "BIAS": int(bias), "VEC": vec,
         "IDX": "int" if total < 2**31 - 16 else "long long", "THREADS": EPILOGUE_THREADS}
    if residual:
        d["RESID"] = 1
    fn = cc.get_function("linear.cu", "bias_act", d, dev, kernel=label)
    nvec = total // vec
    grid = max(1, min(-(-nvec // EPILOGUE_THREADS), problem.device.provider.sm_count * 8))
    fast = cc.FastLaunch(fn, (grid,), (EPILOGUE_THREADS,), pointers=3,
                         scalars=[ctypes.c_int64(nvec), ctypes.c_int64(inner), ctypes.c_int64(channels)])
    scalar: list[Any] = []  # a misaligned y or residual: the scalar build, made when needed

    def apply(y: Any, b: Any, r: Any = None) -> None:
        yp = y.data.ptr
        if b is not None and not (b.shape[0] == 1 or b.strides[0] == b.itemsize):
            b = cupy.ascontiguousarray(b)
        bp = b.data.ptr if b is not None else yp
        if r is not None and not r.flags.c_contiguous:
            r = aligned(r, None)  # C order
        rp = r.data.ptr if r is not None else yp
        if vec > 1 and (yp | rp) & 15:
            if not scalar:
                f1 = cc.get_function("linear.cu", "bias_act", {**d, "VEC": 1}, dev, kernel=label)
                g1 = max(1, min(-(-total // EPILOGUE_THREADS), problem.device.provider.sm_count * 8))
                scalar.append(cc.FastLaunch(f1, (g1,), (EPILOGUE_THREADS,), pointers=3,
                                            scalars=[ctypes.c_int64(total), ctypes.c_int64(inner),
                                                     ctypes.c_int64(channels)]))
            scalar[0](yp, bp, rp)
        else:
            fast(yp, bp, rp)

    return apply


def prepare_cublas(problem: Problem, config: Mapping[str, Any]) -> Callable[..., Any]:
    """cuBLAS's GEMM, then (with a bias or an activation) one fused in-place pass."""
    import cupy

    dev = problem.device.provider.index
    (m, n), act, has_bias = problem.out_shape, problem.attrs["activation"], problem.attrs["bias"]
    has_residual = problem.attrs["residual"]
    label = "cupy.linear.cublas"
    apply = epilogue_pass(problem, (m, n), 1, n, has_bias, act, label, has_residual) \
        if has_bias or act or has_residual else None
    getdev, oom = cupy.cuda.runtime.getDevice, cupy.cuda.memory.OutOfMemoryError
    gemm = gemm_nt(problem.dtype, dev) if problem.shapes[0][1] else None  # k = 0: CuPy's zeros
    split = operands(problem)

    def launch(x: Any, w: Any, *rest: Any) -> Any:
        if getdev() != dev:
            with cupy.cuda.Device(dev):
                return launch(x, w, *rest)
        try:
            y = memory.empty((m, n), x.dtype, label)
            if gemm is None or not gemm(x, w, y):
                y = cupy.matmul(x, w.T)
        except oom as exc:
            raise memory._oom(f"linear {problem} (cuBLAS)", m * n * x.dtype.itemsize, exc) from exc
        if apply is not None:
            apply(y, *split(rest))
        return y

    return launch


def cost_cublas(problem: Problem, config: Mapping[str, Any]) -> float:
    t = mm.cost_cublas(as_matmul(problem), config)
    if problem.attrs["bias"] or problem.attrs["activation"] is not None or problem.attrs["residual"]:
        t += _pass_seconds(problem, int(problem.attrs["residual"]))
    return t


def supports_cublas(problem: Problem) -> bool:
    return mm.supports_cublas(as_matmul(problem))


# -- cuBLASLt with its own epilogues (cublaslt.py) --------------------------------------------------
def nvmath_missing() -> str:
    """Why the cuBLASLt kernel is absent ("" when cuBLASLt is callable through nvmath's bindings)."""
    return cublaslt.missing()


def supports_cublaslt(problem: Problem) -> bool:
    """cuBLASLt callable, a bias, a residual or an activation (a plain GEMM is matmul's), operands
    it reads in place (one unit stride each; a residual's rows unit-stride: it is cuBLASLt's C),
    and k > 0."""
    act, has_bias, has_residual = problem.attrs["activation"], problem.attrs["bias"], problem.attrs["residual"]
    if act is None and not has_bias and not has_residual:
        return Refusal("a plain GEMM: matmul's kernels and cuBLAS serve it")
    for shape, strides in zip(problem.shapes[:2], problem.strides[:2]):
        if not cublaslt.layout_ok(shape, strides):
            return Refusal("an operand with no unit stride")
    if has_residual and cublaslt.row_stride(problem.out_shape, problem.strides[-1]) is None:
        return Refusal("a residual whose rows are not unit-stride (cuBLASLt's C is column-major D's layout)")
    if problem.shapes[0][1] == 0:
        return Refusal("k = 0")
    if why := nvmath_missing():
        return Refusal(why)
    return supports_cublas(problem)


def prepare_cublaslt(problem: Problem, config: Mapping[str, Any]) -> Callable[..., Any]:
    """Plan the cuBLASLt GEMM with its epilogue once (:class:`cublaslt.GemmNT`); a call allocates the
    result and issues one ``cublasLtMatmul`` (a residual is its C, added with beta 1 before the
    epilogue: ``D = act(A B + C + bias)``), then, for an activation cuBLASLt has not (exact gelu,
    silu), one in-place activation pass (the bias stays in cuBLASLt's epilogue). A bias that is
    strided or off 16 bytes is copied."""
    import cupy

    dev = problem.device.provider.index
    act, has_bias, has_residual = problem.attrs["activation"], problem.attrs["bias"], problem.attrs["residual"]
    (m, k), (n, _) = problem.shapes[:2]
    sx, sw = problem.strides[:2]
    ldr = cublaslt.row_stride((m, n), problem.strides[-1]) if has_residual else None
    label = "cupy.linear.cublaslt"
    fused = (act, has_bias) in cublaslt.EPILOGUE
    apply = None if fused else epilogue_pass(problem, (m, n), 1, n, False, act, label)
    with cupy.cuda.Device(dev):
        gemm = cublaslt.GemmNT(problem.dtype, dev, m, n, k, sx or c_strides((m, k)), sw or c_strides((n, k)),
                               act if fused else None, has_bias, ldr) if m and n else None
    getdev = cupy.cuda.runtime.getDevice
    split = operands(problem)

    def launch(x: Any, w: Any, *rest: Any) -> Any:
        if getdev() != dev:
            with cupy.cuda.Device(dev):
                return launch(x, w, *rest)
        y = memory.empty((m, n), x.dtype, label)
        if gemm is not None:
            bias, residual = split(rest)
            if has_bias and ((bias.strides[0] != bias.itemsize and n > 1) or bias.data.ptr % ALIGN):
                bias = aligned(bias, (1,))
            gemm(x, w, bias, y, residual)
            if apply is not None:
                apply(y, None)
        return y

    launch.gemm = gemm  # type: ignore[attr-defined]  (kept alive with the launcher)
    return launch


#: host seconds of a cuBLASLt call (the result's allocation, ``cublasLtMatmul``'s own host path,
#: and a memset it queues for its cooperative kernels: 24-32 us measured on the H100's host)
HOST_LT = 25e-6
#: cuBLASLt's fp16 / bf16 kernels on Hopper are persistent (no wave quantisation): their time is the
#: work at a fraction of the tensor peak that grows with K, fitted on the H100 (fp16, bias epilogue):
#: 8192 x 768 x 2304 in 56 us (0.52), 8192 x 3072 x 768 in 59 us (0.67), 4096^3 + gelu_tanh in 192 us
#: (0.72); 8192 x 768 x 3072 + gelu_tanh in 76 us (0.51, the activation included)
LT_EFF, LT_EFF_K = 0.75, 350.0


def cost_cublaslt(problem: Problem, config: Mapping[str, Any]) -> float:
    (m, k), (n, _) = problem.shapes[:2]
    if problem.dtype not in ("float16", "bfloat16"):
        t = mm.cost_cublas(as_matmul(problem), config)
    else:
        peak = problem.device.provider.figures()[1]
        t = 2.0 * m * n * k / (peak * LT_EFF * k / (k + LT_EFF_K)) + mm.GPU_LAUNCH
    if problem.attrs["residual"]:  # C read by the epilogue
        t += m * n * itemsize(problem.dtype) / problem.device.provider.figures()[2]
    if (problem.attrs["activation"], problem.attrs["bias"]) not in cublaslt.EPILOGUE:  # the activation pass
        t += _pass_seconds(problem, 0)
    return max(t, HOST_LT)


# -- the table ----------------------------------------------------------------------------------
def kernels() -> list[Kernel]:
    """The linear kernels of the CUDA backend."""
    f32, f16 = frozenset({"float32"}), frozenset({"float16", "bfloat16"})
    vendor = frozenset({"float16", "bfloat16", "float32", "float64"})
    sgemm, hgemm = cc.source("matmul_sgemm.cu"), cc.source("matmul_hgemm.cu")
    wgmma = cc.source("matmul_wgmma.cu")
    tma = cc.source("matmul_tma.cu")
    simt_generic = _cost(lambda p, c: mm.cost_simt(p, c, True))
    mma_generic = _cost(lambda p, c: mm.cost_mma(p, c, True))
    simt, mma, wg, tm = _cost(mm.cost_simt), _cost(mm.cost_mma), _cost(mm.cost_wgmma), _cost(mm.cost_tma)
    return [
        #       op        name                          kind    dtypes  prepare, supports, cost
        Kernel("linear", "cupy.linear.cublas", "cuda", vendor, prepare=prepare_cublas, supports=supports_cublas,
               cost=cost_cublas, vendor=True, source="cupy.matmul (cuBLAS) + " + cc.source("linear.cu")),
        Kernel("linear", "cupy.linear.cublaslt", "cuda", frozenset({"float16", "bfloat16", "float32"}),
               prepare=prepare_cublaslt, supports=supports_cublaslt, cost=cost_cublaslt, vendor=True,
               source="cublasLtMatmul (nvmath.bindings.cublasLt), epilogue BIAS / RELU_BIAS / GELU_BIAS / RELU / GELU"),
        Kernel("linear", "cupy.linear.simt", "cuda", f32, prepare=_own("simt", False), supports=_via(mm.supports_simt),
               cost=simt, configs=mm.SIMT_CONFIGS, config_for=_ranked(mm.SIMT_CONFIGS, simt), source=sgemm),
        Kernel("linear", "cupy.linear.simt_generic", "cuda", f32, prepare=_own("simt", True),
               supports=_via(mm.supports_generic_simt), cost=simt_generic, configs=mm.SIMT_CONFIGS,
               config_for=_ranked(mm.SIMT_CONFIGS, simt_generic), source=sgemm),
        Kernel("linear", "cupy.linear.mma", "cuda", f16, prepare=_own("mma", False), supports=_via(mm.supports_mma),
               cost=mma, configs=mm.MMA_CONFIGS, config_for=_ranked(mm.MMA_CONFIGS, mma), source=hgemm),
        Kernel("linear", "cupy.linear.mma_generic", "cuda", f16, prepare=_own("mma", True),
               supports=_via(mm.supports_generic_mma), cost=mma_generic, configs=mm.MMA_CONFIGS,
               config_for=_ranked(mm.MMA_CONFIGS, mma_generic), source=hgemm),
        Kernel("linear", "cupy.linear.wgmma", "cuda", f16, prepare=_own("wgmma", False, mm.WGMMA_FALLBACK),
               supports=_via(mm.supports_wgmma), cost=wg, configs=mm.WGMMA_CONFIGS,
               config_for=_ranked(mm.WGMMA_CONFIGS, wg), source=wgmma),
        Kernel("linear", "cupy.linear.tma", "cuda", f16, prepare=_own("tma", False, mm.WGMMA_FALLBACK),
               supports=_via(mm.supports_tma), cost=tm, configs=mm.TMA_CONFIGS,
               config_for=_ranked(mm.TMA_CONFIGS, tm), source=tma),
    ]


def build_variants() -> list[tuple[str, dict]]:
    """(file, defines) CI compiles: the epilogue pass in every dtype and activation (vector and
    scalar), and the GEMMs with their epilogue: every activation with a bias on each kernel's
    linear layout (B k-contiguous: weight (N, K) row-major), and the any-stride variants."""
    out = []
    for dt, code in DTYPE_CODE.items():
        for act in (None, "relu", "gelu", "gelu_tanh", "silu"):
            out.append(("linear.cu", {"DTYPE": code, "ACT": ACT[act], "BIAS": 1, "VEC": 16 // itemsize(dt),
                                      "IDX": "int", "THREADS": EPILOGUE_THREADS}))
        out.append(("linear.cu", {"DTYPE": code, "ACT": ACT["gelu"], "BIAS": 0, "VEC": 1, "IDX": "long long",
                                  "THREADS": EPILOGUE_THREADS}))
        for vec in (16 // itemsize(dt), 1):  # a residual after the own GEMMs: + r, activated
            out.append(("linear.cu", {"DTYPE": code, "ACT": ACT["relu"], "BIAS": 0, "RESID": 1, "VEC": vec,
                                      "IDX": "int", "THREADS": EPILOGUE_THREADS}))
    for file, cfg, extra in (("matmul_sgemm.cu", mm.SIMT_CONFIGS[0], {}),
                             ("matmul_hgemm.cu", mm.MMA_CONFIGS[0], {"BF16": 0}),
                             ("matmul_hgemm.cu", mm.MMA_CONFIGS[0], {"BF16": 1})):
        base = {k: v for k, v in cfg.items() if k not in NOT_DEFINES}
        for act in (None, "relu", "gelu", "gelu_tanh", "silu"):
            out.append((file, {**base, **extra, "A_KCONTIG": 1, "B_NCONTIG": 0, "VEC_A": 1, "VEC_B": 1, "BIAS": 1,
                               "ACT": ACT[act]}))
        out.append((file, {**base, **extra, "A_KCONTIG": 1, "B_NCONTIG": 0, "VEC_A": 0, "VEC_B": 0, "ACT": ACT["gelu"]}))
    for cfg in mm.WGMMA_CONFIGS:
        base = {k: v for k, v in cfg.items() if k not in NOT_DEFINES}
        for bf, act in ((0, "gelu"), (0, "gelu_tanh"), (1, "relu"), (0, None)):
            out.append(("matmul_wgmma.cu", {**base, "B_NCONTIG": 0, "BF16": bf, "BIAS": 1, "ACT": ACT[act]}))
    for cfg in mm.TMA_CONFIGS:
        base = {k: v for k, v in cfg.items() if k not in NOT_DEFINES}
        for bf, act, store in ((0, "gelu", 1), (0, "gelu_tanh", 1), (1, "silu", 1), (0, "relu", 0)):
            out.append(("matmul_tma.cu", {**base, "B_NCONTIG": 0, "BF16": bf, "BIAS": 1, "ACT": ACT[act],
                                          "STORE_TMA": store}))
    return out
