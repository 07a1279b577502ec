"""The CUDA backend (opruntime_cupy): its device provider and every matmul kernel x config
against float64 references.

GPU tests carry ``@pytest.mark.gpu`` and skip with the reason when CuPy or a GPU is missing; the
tests without the marker (the kernel table, the cost models on a stand-in device, the aliasing
rule, the missing-CuPy path) run everywhere.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
from cupy_stand_in import StandInDevice, StandInProvider

import opruntime as opr
from opruntime.errors import BackendUnavailable, FallbackWarning, KernelCompileError, OutOfMemoryError
from opruntime.kernels import LAUNCHES, Kernel, Problem, c_strides, frozen
from opruntime.ops.matmul import MATMUL
from opruntime.testing.numerics import TOLERANCE, rel_err


def _gpu_reason() -> str | None:
    try:
        import cupy
    except Exception as exc:
        return f"cupy not installed ({exc})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return f"no CUDA device: {exc}"
    return None if n else "no CUDA device"


@pytest.fixture(scope="module")
def cp():
    reason = _gpu_reason()
    if reason:
        pytest.skip(reason)
    import cupy

    return cupy


# -- no GPU needed ---------------------------------------------------------------------------
def test_missing_cupy_is_reported_as_unavailable(monkeypatch):
    from opruntime_cupy import memory

    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy -> ImportError
    with pytest.raises(BackendUnavailable, match="cupy not installed") as info:
        memory.devices()
    assert info.value.kinds == ("cuda",)


def test_kernel_table_is_cheap_and_complete():
    from opruntime_cupy import matmul

    table = {k.name: k for k in matmul.kernels()}
    assert {"cupy.matmul.cublas", "cupy.matmul.simt", "cupy.matmul.simt_generic", "cupy.matmul.mma",
            "cupy.matmul.mma_generic", "cupy.matmul.wgmma", "cupy.matmul.tma"} == set(table)
    # compiled kernels plan in prepare (the runtime's one launch cache); cuBLAS has nothing to prepare
    assert table["cupy.matmul.cublas"].run is not None and table["cupy.matmul.cublas"].prepare is None
    assert all(k.prepare is not None and k.run is None for n, k in table.items() if n != "cupy.matmul.cublas")


def host_problem(sa, sb, dtype: str, strides=None) -> Problem:
    """A matmul Problem on the stand-in device (C-contiguous operands unless ``strides``)."""
    norm = MATMUL.normalize([sa, sb], {})
    strides = strides or tuple(c_strides(s) for s in norm.shapes)
    return Problem("matmul", StandInDevice(), norm.shapes, (dtype, dtype), strides, norm.attrs, norm.out_shape,
                   dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_supports_and_costs_read_the_device_from_the_provider(dtype):
    from opruntime_cupy import matmul

    for sa, sb in (((64, 64), (64, 64)), ((2, 1, 37, 21), (1, 3, 21, 19)), ((4096, 4096), (4096, 4096))):
        p = host_problem(sa, sb, dtype)
        for k in matmul.kernels():
            if dtype not in k.dtypes or k.name in ("cupy.matmul.wgmma", "cupy.matmul.tma"):
                continue  # wgmma and tma ask CuPy for the arch
            if k.name == "cupy.matmul.cublas" or k.supports(p):
                costs = [k.estimate(p, c) for c in k.candidates(p)]
                assert costs and all(0 < c < 1 for c in costs), (k.name, p)
                assert costs == sorted(costs), k.name  # config_for ranks by cost
        for name in ("cupy.matmul.wgmma", "cupy.matmul.tma"):
            wg = next(k for k in matmul.kernels() if k.name == name)
            if dtype != "float32":
                assert 0 < wg.estimate(p, wg.configs[0]) < 1
    big = host_problem((4096, 4096), (4096, 4096), "float32")
    simt = next(k for k in matmul.kernels() if k.name == "cupy.matmul.simt")
    assert simt.estimate(big, simt.configs[0]) > 2 * 4096**3 / StandInProvider().figures()[0]  # under the peak


def test_geometry_folds_batch_dims_and_declines_more_than_three():
    from opruntime_cupy import matmul

    g = matmul.geometry(host_problem((2, 3, 8, 16), (2, 3, 16, 8), "float32"), 4)
    assert (g.M, g.N, g.K, g.batch) == (8, 8, 16, 6) and g.vec_a and g.vec_b
    assert matmul.geometry(host_problem((2, 1, 2, 1, 8, 8), (1, 2, 1, 2, 8, 8), "float32"), 4) is None


def test_shares_memory_compares_byte_ranges():
    """CudaDevice.shares_memory on stand-ins with CuPy's attributes (data.ptr, shape, byte
    strides, itemsize, size), checked against NumPy's exact answer on the same views."""
    from opruntime_cupy.memory import CudaDevice

    class Ptr:
        def __init__(self, ptr):
            self.ptr = ptr

    class Arr:  # a NumPy view as CuPy describes it
        def __init__(self, x):
            self.x, self.data, self.shape, self.strides = x, Ptr(x.ctypes.data), x.shape, x.strides
            self.itemsize, self.size = x.itemsize, x.size

    dev = object.__new__(CudaDevice)  # no CuPy here: only the method under test
    dev.array_types = (Arr,)
    base = np.zeros((8, 10), np.float32)
    views = [base, base[:4], base[4:], base[:, :5], base[:, 5:], base[::2], base[1::2, ::3], base[::-1],
             base[7], base.T, base[2:3, 4:5], base[:0], base[3, ::-2], base.reshape(-1)[::7]]
    for a in views:
        for b in views:
            want = a.size > 0 and b.size > 0 and np.shares_memory(a, b)
            got = dev.shares_memory(Arr(a), Arr(b))
            if want:
                assert got, (a.shape, a.strides, b.shape, b.strides)  # never miss an overlap
    assert not dev.shares_memory(Arr(base[:4]), Arr(base[4:]))
    assert not dev.shares_memory(Arr(base[:0]), Arr(base))
    assert dev.shares_memory(Arr(base[::-1]), Arr(base[0]))
    other = np.zeros(4, np.float32)
    assert not dev.shares_memory(Arr(other), Arr(base))


# -- helpers ---------------------------------------------------------------------------------
def problem_of(a, b, device: str = "cuda:0") -> Problem:
    """The Problem the frontend builds for matmul(a, b) on device arrays of equal rank >= 2."""
    norm = MATMUL.normalize([a.shape, b.shape], {})
    dt = a.dtype.name
    strides = tuple(tuple(s // x.dtype.itemsize for s in x.strides) for x in (a, b))
    return Problem("matmul", opr.Device(device), norm.shapes, (dt, dt), strides, norm.attrs, norm.out_shape, dt)


def host_dtype(dtype: str):
    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def randn(cp, shape, dtype, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    if dtype == "bfloat16":
        from opruntime_cupy import memory

        if memory.bfloat16() is None:
            pytest.skip("CuPy cannot hold bfloat16 arrays here")
    return cp.asarray(x.astype(host_dtype(dtype)))


def poison(cp, nbytes: int) -> None:
    """Leave NaNs in the memory pool's next blocks, so unwritten outputs show up."""
    junk = cp.full(max(nbytes // 4, 1) + 64, np.nan, np.float32)
    del junk


def reference(a, b) -> np.ndarray:
    import cupy

    ah = cupy.asnumpy(a).astype(np.float64)
    bh = cupy.asnumpy(b).astype(np.float64)
    return np.matmul(ah, bh)


def check_kernel(cp, kernel: Kernel, cfg, a, b, dtype: str) -> None:
    p = problem_of(a, b)
    assert kernel.supports(p), f"{kernel.name} declines {p}"
    poison(cp, math.prod(p.out_shape) * a.dtype.itemsize)
    out = kernel(p, cfg, a, b)
    assert out.shape == p.out_shape and out.dtype == a.dtype
    err = rel_err(cp.asnumpy(out).astype(np.float64), reference(a, b))
    assert err <= TOLERANCE[dtype], f"{kernel.name}[{cfg.get('tile')}] {p}: rel err {err:.2e}"


def kernel(name: str) -> Kernel:
    from opruntime_cupy import matmul

    return next(k for k in matmul.kernels() if k.name == name)


def configs(name: str) -> list:
    from opruntime_cupy import matmul

    if "wgmma" in name:
        return list(matmul.WGMMA_CONFIGS)
    if "tma" in name:
        return list(matmul.TMA_CONFIGS)
    return list(matmul.SIMT_CONFIGS if "simt" in name else matmul.MMA_CONFIGS)


def _ids(cfgs):
    return [c["tile"] for c in cfgs]


FAMILIES = [("cupy.matmul.simt", "float32"), ("cupy.matmul.simt_generic", "float32"),
            ("cupy.matmul.mma", "float16"), ("cupy.matmul.mma", "bfloat16"),
            ("cupy.matmul.mma_generic", "float16"), ("cupy.matmul.mma_generic", "bfloat16"),
            ("cupy.matmul.wgmma", "float16"), ("cupy.matmul.wgmma", "bfloat16")]


def skip_unless_hopper(cp, name: str) -> None:
    if "wgmma" in name or "tma" in name:
        from opruntime_cupy import compile

        if compile.arch_of(0) != "90":
            pytest.skip(f"{name} needs an sm_90 device (this one: sm_{compile.arch_of(0)})")
CASES = [  # (batch shape of a, batch of b, M, K, N): odd sizes, size 1, batches and broadcasts
    ((), (), 1, 8, 8), ((), (), 8, 8, 1), ((), (), 136, 72, 200), ((), (), 257, 264, 136),
    ((3,), (3,), 64, 40, 72), ((2, 1), (1, 3), 40, 24, 48), ((5,), (), 16, 32, 8),
]
ODD_CASES = [((), (), 1, 1, 1), ((), (), 7, 13, 5), ((), (), 129, 67, 131), ((2, 1), (3,), 33, 17, 65)]


@pytest.mark.gpu
@pytest.mark.parametrize("name,dtype", FAMILIES, ids=[f"{n.split('.')[-1]}-{d}" for n, d in FAMILIES])
def test_every_config_aligned_shapes(cp, name, dtype):
    skip_unless_hopper(cp, name)
    rng = np.random.default_rng()
    k = kernel(name)
    for cfg in configs(name):
        for ba, bb, m, kk, n in CASES:
            a, b = randn(cp, (*ba, m, kk), dtype, rng), randn(cp, (*bb, kk, n), dtype, rng)
            if a.ndim != b.ndim:
                a = a.reshape((1,) * (b.ndim - a.ndim) + a.shape)
                b = b.reshape((1,) * (a.ndim - b.ndim) + b.shape)
            check_kernel(cp, k, cfg, a, b, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("name,dtype", [f for f in FAMILIES if "generic" in f[0]],
                         ids=lambda x: str(x).split(".")[-1])
def test_generic_odd_shapes(cp, name, dtype):
    rng = np.random.default_rng()
    k = kernel(name)
    for cfg in configs(name):
        for ba, bb, m, kk, n in ODD_CASES:
            a = randn(cp, (*ba, m, kk), dtype, rng)
            b = randn(cp, (*bb, kk, n), dtype, rng)
            nd = max(a.ndim, b.ndim)
            a, b = a.reshape((1,) * (nd - a.ndim) + a.shape), b.reshape((1,) * (nd - b.ndim) + b.shape)
            check_kernel(cp, k, cfg, a, b, dtype)


def _views(cp, dtype, rng, m, k, n):
    """(name, a, b) operand pairs that are views: transposed, strided, reversed, offset."""
    def r(*shape):
        return randn(cp, shape, dtype, rng)

    return [
        ("A^T", r(k, m).T, r(k, n)),
        ("B^T", r(m, k), r(n, k).T),
        ("A^T B^T", r(k, m).T, r(n, k).T),
        ("A[:, ::2]", r(m, 2 * k)[:, ::2], r(k, n)),
        ("B[::-1]", r(m, k), r(k, n)[::-1]),
        ("A offset", r(m, k + 8)[:, 1:k + 1], r(k, n)),  # misaligned base: the slow launch
        ("batch^T", r(3, k, m).transpose(0, 2, 1), r(3, n, k).transpose(0, 2, 1)),
        ("broadcast batch", cp.broadcast_to(r(1, m, k), (4, m, k)), r(4, k, n)),
    ]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_views_without_copies(cp, dtype):
    rng = np.random.default_rng()
    fast, generic = ("simt", "simt_generic") if dtype == "float32" else ("mma", "mma_generic")
    kf, kg = kernel(f"cupy.matmul.{fast}"), kernel(f"cupy.matmul.{generic}")
    for m, k, n in ((64, 32, 96), (37, 21, 19)):
        for label, a, b in _views(cp, dtype, rng, m, k, n):
            p = problem_of(a, b)
            assert kg.supports(p), label
            check_kernel(cp, kg, configs(generic)[0], a, b, dtype)
            if kf.supports(p):  # the vectorized path takes what it can, the rest falls to generic
                check_kernel(cp, kf, configs(fast)[0], a, b, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_wgmma_layouts_and_misaligned_bases(cp, dtype):
    skip_unless_hopper(cp, "wgmma")
    rng = np.random.default_rng()
    k = kernel("cupy.matmul.wgmma")
    for m, kk, n in ((64, 64, 128), (200, 136, 264)):
        for _label, a, b in _views(cp, dtype, rng, m, kk, n):
            if k.supports(problem_of(a, b)):  # row-major A; B either way; offset bases run the mma path
                check_kernel(cp, k, configs("cupy.matmul.wgmma")[0], a, b, dtype)
    a, b = randn(cp, (64, 64), dtype, rng), randn(cp, (64, 64), dtype, rng)
    assert k.supports(problem_of(a, b)) and k.supports(problem_of(a, b.T))
    assert not k.supports(problem_of(a.T, b))  # an m-contiguous A is the mma kernel's


TMA_CASES = [(1, 8, 8), (8, 8, 8), (136, 72, 200), (257, 264, 136), (300, 776, 520), (129, 64, 1032)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tma_every_config_layouts_edges_and_misaligned_bases(cp, dtype):
    """The TMA kernel on one matrix: both B layouts, edges past every tile (zero-filled loads,
    clipped stores), rows of C that are not 16-byte multiples (stores from registers), and views
    whose base is off 16 bytes (the mma kernel's any-stride variant runs them)."""
    skip_unless_hopper(cp, "tma")
    rng = np.random.default_rng()
    k = kernel("cupy.matmul.tma")
    for cfg in configs("cupy.matmul.tma"):
        for m, kk, n in TMA_CASES:
            a = randn(cp, (m, kk), dtype, rng)
            check_kernel(cp, k, cfg, a, randn(cp, (kk, n), dtype, rng), dtype)
            check_kernel(cp, k, cfg, a, randn(cp, (n + 3, kk), dtype, rng).T, dtype)
    for m, kk, n in ((64, 64, 128), (200, 136, 264)):
        for _label, a, b in _views(cp, dtype, rng, m, kk, n):
            if k.supports(problem_of(a, b)):
                check_kernel(cp, k, configs("cupy.matmul.tma")[0], a, b, dtype)
    a, b = randn(cp, (3, 64, 64), dtype, rng), randn(cp, (3, 64, 64), dtype, rng)
    assert "batch" in k.supports(problem_of(a, b))  # a Refusal: the wgmma kernel takes batches
    assert not k.supports(problem_of(a[0].T, b[0]))


@pytest.mark.gpu
def test_vectorized_path_declines_what_it_cannot_load(cp):
    rng = np.random.default_rng()
    kf = kernel("cupy.matmul.simt")
    a, b = randn(cp, (7, 13), "float32", rng), randn(cp, (13, 5), "float32", rng)
    assert not kf.supports(problem_of(a, b))
    assert kernel("cupy.matmul.simt_generic").supports(problem_of(a, b))
    a, b = randn(cp, (64, 64), "float32", rng), randn(cp, (64, 64), "float32", rng)
    assert kf.supports(problem_of(a, b))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_cublas_baseline(cp, dtype):
    rng = np.random.default_rng()
    k = kernel("cupy.matmul.cublas")
    a, b = randn(cp, (2, 33, 17), dtype, rng), randn(cp, (2, 17, 9), dtype, rng)
    check_kernel(cp, k, {}, a, b, dtype)


@pytest.mark.gpu
def test_frontend_on_cuda(cp):
    rng = np.random.default_rng()
    for sa, sb in [((7, 13), (13, 5)), ((13,), (13, 4)), ((2, 1, 7, 13), (1, 3, 13, 5)), ((128, 256), (256, 64))]:
        a, b = rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)
        out = opr.matmul(a, b, device="cuda:0")
        assert out.device == "cuda:0"
        assert rel_err(out.numpy(), MATMUL.reference(a, b)) <= TOLERANCE["float32"]
    text = str(opr.explain("matmul", cp.ones((512, 512), cp.float32), cp.ones((512, 512), cp.float32)))
    assert "cupy.matmul.cublas" in text and "cupy.matmul.simt" in text


# -- the device provider ---------------------------------------------------------------------
@pytest.mark.gpu
def test_provider_memory_timer_and_facts(cp):
    dev = opr.Device("cuda:0")
    prov = dev.provider
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    d = prov.from_host(x)
    assert prov.owns(d) and isinstance(d, cp.ndarray)
    np.testing.assert_array_equal(prov.to_host(d), x)
    back = prov.from_dlpack(d)  # a CUDA DLPack object stays on the device, no copy
    assert back.data.ptr == d.data.ptr
    np.testing.assert_array_equal(prov.to_host(prov.from_dlpack(x)), x)  # host DLPack: copied in
    assert prov.dlpack_device(d) == (2, 0)
    times = prov.time(lambda: cp.matmul(d, d.T), repeats=5, warmup=1)
    assert len(times) == 5 and all(0 < t < 1 for t in times)
    fp = prov.fingerprint()
    assert {"name", "description", "compute_capability", "driver", "runtime", "cupy"} <= set(fp)
    assert "multiprocessors" in prov.info() and "L2 cache" in prov.info()
    assert prov.accelerator
    roof = prov.roofline()
    assert roof["bytes_per_s"] > 1e11 and {"float32", "float16", "bfloat16"} <= set(roof["flops_per_s"])


@pytest.mark.gpu
def test_provider_free_memory_and_aliasing(cp):
    prov = opr.Device("cuda:0").provider
    _, total = cp.cuda.runtime.memGetInfo()
    assert 0 < prov.free_memory() <= total
    x = cp.zeros((8, 10), cp.float32)
    assert prov.shares_memory(x, x) and prov.shares_memory(x, x[2:, ::3]) and prov.shares_memory(x[::-1], x[0])
    assert not prov.shares_memory(x[:4], x[4:]) and not prov.shares_memory(x[:0], x)
    assert not prov.shares_memory(x, cp.zeros_like(x))
    assert not prov.shares_memory(x, np.zeros(3))


@pytest.mark.gpu
def test_out_of_memory_is_a_clear_error(cp):
    from opruntime_cupy import memory

    with pytest.raises(OutOfMemoryError, match="out of CUDA memory"):
        memory.empty((1 << 50,), np.float32, "test")
    with pytest.raises(OutOfMemoryError):
        opr.Device("cuda:0").provider.empty((1 << 50,), np.dtype(np.float32))


# -- build failures ----------------------------------------------------------------------------
@pytest.mark.gpu
def test_compile_error_carries_the_nvrtc_log(cp):
    from opruntime_cupy import compile

    with pytest.raises(KernelCompileError) as info:
        compile.load("matmul_sgemm.cu", {"BM": 128, "BN": 128, "BK": 8, "WM": 32, "WN": 64, "TM": 8,
                                         "TN": "8 +* broken"}, 0, kernel="cupy.matmul.simt")
    assert "error" in info.value.log and info.value.kernel == "cupy.matmul.simt"


@pytest.mark.gpu
def test_selector_falls_back_when_a_kernel_fails_to_build(cp):
    from opruntime_cupy import compile

    def broken(problem, config):  # compiling in prepare, as the CUDA kernels do
        compile.load("matmul_sgemm.cu", {"BM": "garbage("}, problem.device.provider.index,
                     kernel="broken_cuda.matmul.broken")

    class Plugin:
        @staticmethod
        @opr.hookimpl
        def opruntime_kernels():
            return [Kernel("matmul", "broken_cuda.matmul.broken", "cuda", frozenset({"float32"}), prepare=broken,
                           cost=lambda p, c: 0.0)]

    opr.register(Plugin, name="broken_cuda")
    try:
        a = np.random.default_rng().standard_normal((64, 32)).astype(np.float32)
        b = np.random.default_rng().standard_normal((32, 16)).astype(np.float32)
        with pytest.warns(FallbackWarning, match="broken_cuda.matmul.broken"):
            out = opr.matmul(a, b, device="cuda:0")
        assert rel_err(out.numpy(), MATMUL.reference(a, b)) <= TOLERANCE["float32"]
    finally:
        opr.unregister("broken_cuda")


# -- the caches: one launch cache in the runtime, a bounded module cache here ----------------------
@pytest.mark.gpu
def test_launch_is_prepared_once_and_kept_in_the_runtime_cache(cp):
    rng = np.random.default_rng()
    k = kernel("cupy.matmul.simt")
    a, b = randn(cp, (64, 32), "float32", rng), randn(cp, (32, 48), "float32", rng)
    p, cfg = problem_of(a, b), configs("cupy.matmul.simt")[0]
    launch = k.launcher(p, cfg)
    assert k.launcher(p, cfg) is launch and LAUNCHES.get((k, p, frozen(cfg))) is launch
    # the misaligned-base fallback runs through the same launcher
    big = randn(cp, (64, 40), "float32", rng)
    view = big[:, 1:33]
    pv = problem_of(view, b)
    assert k.supports(pv) and view.data.ptr & 15  # vector layout, base off by 4 bytes
    out = k(pv, cfg, view, b)
    assert rel_err(cp.asnumpy(out).astype(np.float64), reference(view, b)) <= TOLERANCE["float32"]


@pytest.mark.gpu
def test_module_cache_is_bounded(cp):
    from opruntime_cupy import compile

    cap = compile._modules.capacity
    compile._modules.resize(2)
    try:
        for threads in (128, 256, 512):
            compile.load("softmax.cu", {"DTYPE": 0, "FAMILY": 3, "VEC": 4, "THREADS": threads}, 0)
        assert len(compile._modules) == 2
    finally:
        compile._modules.resize(cap)
