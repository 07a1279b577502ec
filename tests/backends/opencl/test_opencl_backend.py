"""The OpenCL backend: every kernel x config against float64 references, memory and views,
device facts, bounded caches, and the fallback when a kernel's source fails to build.

Kernels are called directly, as the runtime calls them: ``kernel(problem, config, *arrays)``
(through ``Kernel.launcher``, the one launch cache) with the Problem the frontend would build,
its ``device`` the :class:`opruntime.Device`. Runs on every OpenCL device present (PoCL in CI;
the NVIDIA platform on the GPU machine, where these tests carry the ``gpu`` marker). Sizes stay
small: PoCL compiles each config once.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import traceback

import numpy as np
import pytest
from conftest import TOLERANCE, random, rel_err

import opruntime as opr
from opruntime import lru
from opruntime.errors import BackendUnavailable, FallbackWarning, KernelCompileError, KernelError, OutOfMemoryError
from opruntime.kernels import LAUNCHES, Attrs, Kernel, Problem, c_strides
from opruntime.ops import OPS
from opruntime.plugins import registry

pytest.importorskip("pyopencl", reason="pyopencl not installed")
import opruntime_opencl  # noqa: E402  (after the skip: imports nothing heavy)
from opruntime_opencl import compile as cl_compile
from opruntime_opencl import memory


def _opencl_devices() -> list:
    out = []
    for d in registry().devices:
        if d.kind == "opencl":
            marks = [pytest.mark.gpu] if d.provider.accelerator else []
            out.append(pytest.param(d.name, marks=marks, id=d.name))
    return out


DEVICES = _opencl_devices()
if not DEVICES:
    pytest.skip(f"no OpenCL device: {registry().unavailable.get('opencl', 'unknown reason')}", allow_module_level=True)

#: The backend's own kernel table (what its ``opruntime_kernels`` hook registers).
KERNELS = opruntime_opencl.opruntime_kernels()
DTYPES = ["float32", "float64", "float16"]


@pytest.fixture(params=DEVICES)
def ocl(request) -> opr.Device:
    return registry().device(request.param)


def problem(op: str, device: opr.Device, shapes, dtype: str, strides=None, padding=None, **attrs) -> Problem:
    """The Problem the frontend builds for operands of ``shapes`` (C-contiguous unless
    ``strides``, in elements), with normalised attributes (conv2d ``padding``: top, bottom,
    left, right)."""
    shapes = tuple(tuple(s) for s in shapes)
    strides = tuple(tuple(s) for s in strides) if strides else tuple(c_strides(s) for s in shapes)
    if op == "matmul":
        a, b = shapes
        norm, out = Attrs(), (*np.broadcast_shapes(a[:-2], b[:-2]), a[-2], b[-1])
    elif op in ("softmax", "log_softmax"):
        norm, out = Attrs(axis=attrs["axis"] % len(shapes[0])), shapes[0]
    else:
        (n, _, h, w), (o, _, kh, kw) = shapes[:2]
        (sh, sw), (dh, dw) = attrs.get("stride", (1, 1)), attrs.get("dilation", (1, 1))
        pads = tuple(padding or (0, 0, 0, 0))
        ho = (h + pads[0] + pads[1] - dh * (kh - 1) - 1) // sh + 1
        wo = (w + pads[2] + pads[3] - dw * (kw - 1) - 1) // sw + 1
        norm = Attrs(stride=(sh, sw), padding=pads, dilation=(dh, dw), groups=attrs.get("groups", 1),
                     bias=len(shapes) == 3)
        out = (n, o, ho, wo)
    return Problem(op, device, shapes, (dtype,) * len(shapes), strides, norm, tuple(out), dtype)


def need_dtype(device: opr.Device, dtype: str) -> None:
    prov = device.provider
    if dtype == "float64" and not prov.has_fp64:
        pytest.skip(f"{device.name} ({prov.description}) lacks cl_khr_fp64")
    if dtype == "float16" and not prov.has_fp16:
        pytest.skip(f"{device.name} ({prov.description}) lacks cl_khr_fp16")


def kernels(op: str) -> list[Kernel]:
    return [k for k in KERNELS if k.op == op]


def kernel(name: str) -> Kernel:
    return next(k for k in KERNELS if k.name == name)


def run_every_config(prob: Problem, datas: list, ref: np.ndarray, *, all_configs: bool) -> int:
    """Run every kernel of ``prob.op`` that supports it, each config (or each kernel's first,
    the one the heuristic picks) on ``datas``; assert each against ``ref``. Returns how many ran."""
    prov = prob.device.provider
    ran = 0
    for k in kernels(prob.op):
        if not k.supports(prob):  # a kernel for other device types (opencl.matmul.vector: CPUs)
            assert k.name == "opencl.matmul.vector" and prov.type != "cpu", f"{k.name} declines {prob}"
            continue
        cfgs = list(k.candidates(prob))
        for cfg in cfgs if all_configs else cfgs[:1]:
            out = prov.to_host(k(prob, cfg, *datas)).reshape(ref.shape)
            assert out.dtype == np.dtype(prob.dtype)
            err = rel_err(out, ref)
            assert err <= TOLERANCE[prob.dtype], f"{k.name}[{cfg}] on {prob}: relative error {err:.2e}"
            ran += 1
    return ran


def run_all_configs(device: opr.Device, op: str, host: list[np.ndarray], dtype: str, **attrs) -> int:
    """:func:`run_every_config` on contiguous copies of ``host``: float32 runs every config;
    float64 / float16 each kernel's first, since every config is another cold compile on PoCL."""
    prob = problem(op, device, [x.shape for x in host], dtype, **attrs)
    datas = [device.provider.from_host(x) for x in host]
    return run_every_config(prob, datas, OPS[op].reference(*host, **attrs), all_configs=dtype == "float32")


# -- every kernel x config ---------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sa,sb", [((2, 1, 37, 45), (3, 45, 29)), ((128, 64), (64, 128)), ((5, 1), (1, 6))],
                         ids=["batched-broadcast-edges", "full-tiles", "k1"])
def test_matmul_every_config(ocl, rng, dtype, sa, sb):
    need_dtype(ocl, dtype)
    assert run_all_configs(ocl, "matmul", [random(rng, sa, dtype), random(rng, sb, dtype)], dtype) >= 2


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,axis", [((7, 300), 1), ((6, 48), 1), ((4, 33, 8), 1), ((3, 5, 12), 0)],
                         ids=["last", "last-vec16", "middle", "first"])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_every_config(ocl, rng, op, dtype, shape, axis):
    need_dtype(ocl, dtype)
    assert run_all_configs(ocl, op, [random(rng, shape, dtype) * 3], dtype, axis=axis) >= 2


def test_softmax_rows_three_pass_path(ocl, rng):
    """Rows longer than the register budget take the re-reading path (ONEPASS=0)."""
    from opruntime_opencl import softmax

    x = random(rng, (3, 64 * 16 * 4 + 4), "float32")  # > TPR * VW * MAX_NV for the CPU and GPU menus' first
    prob = problem("softmax", ocl, [x.shape], "float32", axis=1)
    cfgs = [c for c in softmax.row_configs(prob) if c["ONEPASS"] == 0][:2]
    assert cfgs
    for cfg in cfgs:
        out = ocl.provider.to_host(softmax.prepare_rows(prob, cfg)(ocl.provider.from_host(x)))
        assert rel_err(out, OPS["softmax"].reference(x, axis=1)) <= 1e-5, cfg


CONV_CASES = [  # 4-sided padding (top, bottom, left, right), as kernels see it
    ((2, 3, 9, 11), (8, 3, 3, 3), dict(stride=(2, 1), padding=(1, 0, 2, 1), dilation=(1, 2))),
    ((1, 6, 7, 7), (12, 1, 3, 3), dict(groups=6, padding=(1, 1, 1, 1))),
    ((2, 8, 5, 6), (4, 4, 1, 1), dict(groups=2)),
]


def conv_reference(host: list[np.ndarray], padding, **attrs) -> np.ndarray:
    """The float64 reference; asymmetric padding applied explicitly (``padding`` 4-sided)."""
    pads = tuple(padding or (0, 0, 0, 0))
    xpad = np.pad(host[0].astype(np.float64), ((0, 0), (0, 0), pads[:2], pads[2:]))
    return OPS["conv2d"].reference(xpad, *host[1:], **attrs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("xs,ws,attrs", CONV_CASES, ids=["strided-dilated-padded", "depthwise-x2", "grouped-1x1"])
def test_conv2d_every_config(ocl, rng, dtype, bias, xs, ws, attrs):
    need_dtype(ocl, dtype)
    host = [random(rng, xs, dtype), random(rng, ws, dtype)] + ([random(rng, (ws[0],), dtype)] if bias else [])
    prob = problem("conv2d", ocl, [x.shape for x in host], dtype, **attrs)
    assert all(k.supports(prob) for k in kernels("conv2d"))
    attrs = {k: v for k, v in attrs.items() if k != "padding"}
    ref = conv_reference(host, prob.attrs["padding"], **attrs)
    datas = [ocl.provider.from_host(x) for x in host]
    assert run_every_config(prob, datas, ref, all_configs=dtype == "float32") >= 2


def test_conv2d_padded_taps_multiply_their_zero_in(ocl, rng):
    """An ``inf`` weight gives NaN where its tap falls in the padding (0 * inf), as in the
    reference and on the other devices, not the finite sum of the in-range taps."""
    x, w = random(rng, (2, 3, 6, 7), "float32"), random(rng, (4, 3, 3, 3), "float32")
    w[1, 2, 0, 0] = np.inf  # output channel 1: NaN on its top row and left column, +-inf elsewhere
    w[3, 0, 2, 1] = -np.inf  # output channel 3: NaN on its bottom row
    ref = OPS["conv2d"].reference(x, w, padding=1)
    assert np.isnan(ref).any() and np.isinf(ref).any()
    prob = problem("conv2d", ocl, [x.shape, w.shape], "float32", padding=(1, 1, 1, 1))
    prov = ocl.provider
    for k in kernels("conv2d"):
        out = prov.to_host(k(prob, k.candidates(prob)[0], prov.from_host(x), prov.from_host(w)))
        np.testing.assert_array_equal(np.isnan(out), np.isnan(ref), err_msg=f"{k.name}: NaN positions")
        np.testing.assert_array_equal(np.isinf(out), np.isinf(ref), err_msg=f"{k.name}: inf positions")
        assert rel_err(out, ref) <= 1e-5, k.name


# -- views, layouts and threads ----------------------------------------------------------------
def test_offset_views_read_in_place_or_copied(ocl, rng):
    """pyopencl views with a byte offset and strides, transposes, views starting off a vector
    boundary, and arrays whose layout is not the problem's: every kernel gives the reference."""
    prov = ocl.provider
    a_host, b_host = random(rng, (40, 50), "float32"), random(rng, (50, 30), "float32")
    a, b = prov.from_host(a_host)[3:, 5:], prov.from_host(b_host)[5:, 2:]  # offset + row stride 50 / 30
    bt = prov.from_host(np.ascontiguousarray(b_host.T)).T[5:, 2:]  # column stride 50: gathered first
    ref = OPS["matmul"].reference(a_host[3:, 5:], b_host[5:, 2:])
    for operands in ([a, b], [a, bt]):
        prob = problem("matmul", ocl, [x.shape for x in operands], "float32",
                       strides=[memory.elem_strides(x) for x in operands])
        assert run_every_config(prob, operands, ref, all_configs=False) >= 2
        # a contiguous copy given to the launcher of the strided problem (the frontend cast it)
        copies = [prov.from_host(prov.to_host(x)) for x in operands]
        assert run_every_config(prob, copies, ref, all_configs=False) >= 2

    flat = random(rng, (2000,), "float32")
    for start in (0, 3):  # a C-contiguous view starting 3 elements in: the scalar-load variants
        host = flat[start:start + 39 * 48].reshape(39, 48)
        x = prov.from_host(flat)[start:start + 39 * 48].reshape(39, 48)
        assert x.offset == 4 * start and x.flags.c_contiguous
        strided = prov.from_host(a_host)[1:, 4:]  # row stride 50: gathered first
        for axis in (0, 1):
            prob = problem("softmax", ocl, [x.shape], "float32", axis=axis)
            assert run_every_config(prob, [x], OPS["softmax"].reference(host, axis=axis), all_configs=True) >= 2
            prob = problem("softmax", ocl, [strided.shape], "float32", strides=[memory.elem_strides(strided)],
                           axis=axis)
            ref = OPS["softmax"].reference(a_host[1:, 4:], axis=axis)
            assert run_every_config(prob, [strided], ref, all_configs=False) >= 2


def test_one_launcher_serves_many_threads(ocl, rng):
    """A launcher's ``pyopencl.Kernel`` carries its arguments: calls from several threads at once
    must not mix them up."""
    prov = ocl.provider
    hosts = [random(rng, (33, 40), "float32") for _ in range(8)]
    prob = problem("softmax", ocl, [(33, 40)], "float32", axis=1)
    refs = [OPS["softmax"].reference(h, axis=1) for h in hosts]
    datas = [prov.from_host(h) for h in hosts]
    for k in kernels("softmax"):
        launch = k.launcher(prob, k.candidates(prob)[0])
        errors: list[str] = []

        def work(i: int, launch=launch, k=k, errors=errors) -> None:
            for _ in range(25):
                out = prov.to_host(launch(datas[i]))
                if not rel_err(out, refs[i]) <= 1e-5:
                    errors.append(f"{k.name}: thread {i} got another input's result")

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(hosts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors[:3]


class _Elsewhere:
    """A device handle named like no device: kernels must use its ``provider``, not its name."""

    def __init__(self, provider) -> None:
        self.provider, self.name, self.kind = provider, "not-a-device-name", "opencl"

    def __hash__(self) -> int:
        return hash(self.name)


def test_kernels_take_their_device_from_the_problem(ocl, rng):
    x = random(rng, (5, 24), "float32")
    prob = problem("softmax", _Elsewhere(ocl.provider), [x.shape], "float32", axis=1)
    assert not hasattr(memory, "provider") and not hasattr(memory, "_devices")  # no name table to look in
    assert run_every_config(prob, [ocl.provider.from_host(x)], OPS["softmax"].reference(x, axis=1),
                            all_configs=False) >= 2


# -- bounded caches ------------------------------------------------------------------------------
@pytest.fixture
def small_caches():
    """Every LRU at 32 entries for one test (the ``cache_entries`` setting), then restored."""
    before = cl_compile._programs.capacity
    lru.set_capacity(32)
    try:
        yield 32
    finally:
        lru.set_capacity(before)


def test_memory_flat_over_distinct_shapes(ocl, rng, small_caches):
    """300 distinct softmax shapes (a handful of programs) keep at most 32 programs and 32
    launchers: nothing the backend keeps grows with the number of shapes seen."""
    prov = ocl.provider
    rows_kernel = kernel("opencl.softmax.rows")
    shapes = [(rows, length) for rows in range(16, 76) for length in (7, 64, 100, 250, 1000)]
    assert len(set(shapes)) == 300
    for shape in shapes:
        x = random(rng, shape, "float32")
        prob = problem("softmax", ocl, [shape], "float32", axis=1)
        out = prov.to_host(rows_kernel(prob, rows_kernel.candidates(prob)[0], prov.from_host(x)))
        assert rel_err(out, OPS["softmax"].reference(x, axis=1)) <= 1e-5, shape
    assert len(cl_compile._programs) <= small_caches
    assert len(LAUNCHES) <= small_caches


def test_device_buffers_of_launchers_go_with_them(ocl, rng, small_caches):
    """Launchers own device buffers (matmul's batch steps, conv's gather table): evicted from the
    launch cache, they return them, so 100 distinct problems hold at most 32 launchers' worth."""
    prov = ocl.provider
    tiled = kernel("opencl.matmul.tiled")
    prov.queue  # noqa: B018 - makes the context and its memory pool
    gc.collect()
    before = prov._pool.active_blocks  # pyopencl MemoryPool: blocks handed out and not returned
    for batch in range(2, 102):
        a, b = random(rng, (batch, 3, 4), "float32"), random(rng, (4, 5), "float32")
        prob = problem("matmul", ocl, [a.shape, b.shape], "float32")
        out = prov.to_host(tiled(prob, tiled.candidates(prob)[0], prov.from_host(a), prov.from_host(b)))
        assert rel_err(out, OPS["matmul"].reference(a, b)) <= 1e-5, batch
    gc.collect()
    assert prov._pool.active_blocks - before <= 2 * small_caches  # two step tables per launcher


TINY = "__kernel void tiny(__global int* y) { y[0] = V; }"


def test_program_cache_is_one_bounded_lru(ocl, small_caches):
    assert isinstance(cl_compile._programs, lru.LRU)
    lru.set_capacity(2)
    for v in range(4):
        cl_compile.program(ocl.provider, TINY, {"V": v}, label="test.tiny")
    assert len(cl_compile._programs) == 2


# -- memory and device facts ---------------------------------------------------------------------
def test_memory_round_trips(ocl, rng):
    prov = ocl.provider
    x = random(rng, (3, 4, 5), "float32")
    d = prov.from_host(x)
    assert prov.owns(d) and not prov.owns(x)
    np.testing.assert_array_equal(prov.to_host(d), x)
    np.testing.assert_array_equal(prov.to_host(d.transpose((2, 0, 1))), x.transpose(2, 0, 1))  # strided gather
    np.testing.assert_array_equal(prov.to_host(prov.zeros((7,), np.float32)), np.zeros(7, np.float32))
    np.testing.assert_array_equal(prov.to_host(prov.astype(d, np.float16)), x.astype(np.float16))
    t = opr.tensor(x, device=ocl)
    np.testing.assert_array_equal(np.from_dlpack(t), x)  # DLPack through the host
    np.testing.assert_array_equal(t.to("cpu").numpy(), x)
    assert t.to("cpu").to(ocl).device == ocl


def test_big_endian_host_data_is_made_native(ocl):
    prov = ocl.provider
    for host in (np.arange(12, dtype=">f4").reshape(3, 4), np.arange(12, dtype=">f4").reshape(4, 3).T,
                 np.array(2.5, ">f4")):
        d = prov.from_host(host)
        assert d.dtype == np.float32 and d.dtype.isnative and d.shape == host.shape
        np.testing.assert_array_equal(prov.to_host(d), host.astype(np.float32))


def test_host_memory_errors_are_out_of_memory(ocl, monkeypatch):
    """A transfer whose host buffer cannot be allocated is a typed OutOfMemoryError naming the
    device, shape and dtype, not NumPy's ``_ArrayMemoryError``."""
    import pyopencl.array as cla

    prov = ocl.provider
    huge = np.lib.stride_tricks.as_strided(np.zeros(1, ">f4"), shape=(2**46,), strides=(0,))  # 256 TiB native
    with pytest.raises(OutOfMemoryError, match=rf"(?s){ocl.name}.*host memory.*float32.*\(70368744177664,\)"):
        prov.from_host(huge)
    try:
        np.empty(2**46, np.float32)
    except MemoryError as exc:
        numpy_error = exc
    else:  # pragma: no cover - a machine with 256 TiB to give
        pytest.skip("this host can allocate 256 TiB")

    def fail(*args, **kwargs):
        raise numpy_error

    d = prov.from_host(np.ones((3, 4), np.float32))
    monkeypatch.setattr(cla.Array, "get", fail)
    with pytest.raises(OutOfMemoryError, match=rf"(?s){ocl.name}.*host memory.*float32.*\(3, 4\)"):
        prov.to_host(d)
    with pytest.raises(OutOfMemoryError, match=ocl.name):  # float16 converts through the host
        prov.astype(d, np.float16)


def test_device_memory_facts(ocl, rng):
    prov = ocl.provider
    cl_dev = prov.cl_device
    assert prov.free_memory() == cl_dev.global_mem_size  # OpenCL cannot say what is free
    assert prov.roofline() is None
    too_big = cl_dev.max_mem_alloc_size // 4 + 1
    with pytest.raises(OutOfMemoryError, match="max_mem_alloc_size"):
        prov.empty((too_big,), np.float32)
    base = prov.from_host(random(rng, (10, 12), "float32"))
    other = prov.from_host(random(rng, (10, 12), "float32"))
    assert prov.shares_memory(base, base) and prov.shares_memory(base, base[2:5])
    assert prov.shares_memory(base[2:5], base[4:]) and prov.shares_memory(base.T, base[9:, 11:])
    assert prov.shares_memory(base[:, :6], base[:, 6:])  # interleaved rows: spans overlap (conservative)
    assert not prov.shares_memory(base[:5], base[5:]) and not prov.shares_memory(base, other)
    assert not prov.shares_memory(base[:0], base) and not prov.shares_memory(base, np.zeros(3))


def test_device_facts(ocl):
    prov = ocl.provider
    info = prov.info()
    for key in ("platform", "device", "opencl", "max work-group size", "local memory", "extensions"):
        assert info[key], key
    assert prov.accelerator == (prov.type == "gpu")
    assert prov.priority == (70 if prov.accelerator else 20 if prov.type == "cpu" else prov.priority)
    alias = registry().device(f"opencl:{prov.type}")
    assert alias.kind == "opencl" and alias.provider.type == prov.type
    fp = prov.fingerprint()
    assert fp["device"] == prov.description and fp["driver"]
    prob = problem("softmax", ocl, [(4, 8)], "float32", axis=1)
    rows = kernel("opencl.softmax.rows")
    launch, x = rows.launcher(prob, rows.candidates(prob)[0]), prov.from_host(np.ones((4, 8), np.float32))
    times = prov.time(lambda: launch(x), repeats=3)  # from the launches' profiling events
    assert len(times) == 3 and all(0 < t < 1 for t in times)


def test_a_cpu_only_opencl_machine_keeps_numpy_as_default():
    devs = [d for d in registry().devices if d.kind == "opencl"]
    if any(d.provider.accelerator for d in devs):
        pytest.skip("an OpenCL GPU is present: it ranks above the NumPy cpu device")
    names = [d.name for d in registry().devices]
    assert names.index("cpu") < min(names.index(d.name) for d in devs)


def test_dtype_errors_are_clear():
    """A dtype no present device computes is a DtypeError from the selector."""
    devs = [d for d in registry().devices if d.kind == "opencl"]
    dev = devs[0]
    x = opr.tensor(np.ones((2, 2), np.float32), device=dev)
    if not any(d.provider.has_fp16 for d in devs):
        with pytest.raises(opr.errors.DtypeError, match="float16"):
            opr.matmul(x.to("cpu").numpy().astype(np.float16), np.ones((2, 2), np.float16), device=dev)
    import ml_dtypes

    with pytest.raises(opr.errors.DtypeError, match="bfloat16"):
        opr.softmax(np.ones((2, 2), ml_dtypes.bfloat16), device=dev)


# -- build failures fall back, with the log ------------------------------------------------------------
BROKEN = "__kernel void broken(__global float* y) { y[0] = this_name_is_not_declared; }"


def _prepare_broken(problem: Problem, config) -> None:
    cl_compile.kernel(problem.device.provider, BROKEN, {"UNUSED": 1}, "broken", label="test_opencl_broken.matmul.broken")
    raise AssertionError("unreachable: the build fails")


BROKEN_KERNEL = Kernel("matmul", "test_opencl_broken.matmul.broken", "opencl", frozenset({"float32"}), prepare=_prepare_broken,
                       cost=lambda p, c: 0.0)


class BrokenPlugin:
    """A test-only plugin: a matmul kernel whose OpenCL source does not compile, ranked first."""

    __name__ = "test_opencl_broken"

    @opr.hookimpl
    def opruntime_kernels(self):
        return [BROKEN_KERNEL]


@pytest.fixture
def broken_plugin():
    plugin = BrokenPlugin()
    opr.register(plugin, name="test_opencl_broken")
    try:
        yield plugin
    finally:
        opr.unregister("test_opencl_broken")


def test_build_failure_raises_from_prepare_with_the_log(ocl):
    """The build fails in ``prepare`` (so the selector marks the kernel bad for the problem), and
    the failure is cached: asked again, the same error and log come back without a rebuild."""
    prob = problem("matmul", ocl, [(9, 7), (7, 5)], "float32")
    with pytest.raises(KernelCompileError) as first:
        BROKEN_KERNEL.launcher(prob, {})
    assert ocl.provider.description in first.value.device and "this_name_is_not_declared" in first.value.log
    depths = []
    for _ in range(3):
        with pytest.raises(KernelCompileError) as again:
            cl_compile.program(ocl.provider, BROKEN, {"UNUSED": 1}, label="test_opencl_broken.matmul.broken")
        assert again.value is first.value
        depths.append(len(traceback.extract_tb(again.value.__traceback__)))
    assert depths[0] == depths[-1], "each raise of the cached error keeps the frames of the ones before"


def test_build_failure_reports_log_and_falls_back(ocl, rng, broken_plugin):
    a, b = random(rng, (9, 7), "float32"), random(rng, (7, 5), "float32")
    assert opr.explain("matmul", a, b, device=ocl).chosen == "test_opencl_broken.matmul.broken"
    with pytest.warns(FallbackWarning, match=r"(?s)test_opencl_broken\.matmul\.broken.*failed to build.*this_name_is_not_declared"):
        out = opr.matmul(a, b, device=ocl)
    assert rel_err(out.numpy(), OPS["matmul"].reference(a, b)) <= 1e-5
    with pytest.raises(KernelCompileError) as info:  # the cached failure, raised again with its log
        cl_compile.program(ocl.provider, BROKEN, {"UNUSED": 1}, label="test_opencl_broken.matmul.broken")
    assert ocl.provider.description in info.value.device and "this_name_is_not_declared" in info.value.log
    with opr.override(strict=True), pytest.raises(KernelError, match="strict"):
        opr.matmul(random(rng, (3, 7), "float32"), b, device=ocl)


# -- the stack is optional and imported lazily ------------------------------------------------------------
def test_pyopencl_missing_or_no_platform_is_unavailable(monkeypatch):
    import pyopencl

    monkeypatch.setattr(memory, "_providers", [])
    monkeypatch.setattr(memory, "_discovered", False)
    monkeypatch.setitem(sys.modules, "pyopencl", None)  # import pyopencl -> ImportError
    with pytest.raises(BackendUnavailable, match="pyopencl not installed") as info:
        opruntime_opencl.opruntime_devices()
    assert info.value.kinds == ("opencl",)
    monkeypatch.setitem(sys.modules, "pyopencl", pyopencl)
    monkeypatch.setattr(memory, "_discovered", False)
    monkeypatch.setattr(pyopencl, "get_platforms", lambda: [])
    with pytest.raises(BackendUnavailable, match="no OpenCL platform"):
        opruntime_opencl.opruntime_devices()
    assert opruntime_opencl.opruntime_kernels()  # kernels are still listed, for other plugins' devices


def test_backend_import_loads_no_pyopencl():
    code = "import sys, opruntime, opruntime_opencl; sys.exit('pyopencl' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_every_kernel_is_prepared():
    """Every kernel gives ``prepare`` (the runtime's one launch cache keeps what it returns) and
    is named ``opencl.<op>.<variant>``."""
    assert KERNELS and all(k.prepare is not None and k.name.startswith(f"opencl.{k.op}.") for k in KERNELS)


def test_copy_into_a_view_of_more_dims_than_the_copy_kernel_takes(ocl):
    """A 9-D view sliced in every dim (nothing merges) is copied one leading index at a time."""
    prov = ocl.provider
    every_other = (slice(None, None, 2),) * 9
    host = np.random.default_rng().standard_normal((4,) * 9).astype(np.float32)
    big = prov.from_host(np.zeros((4,) * 9, np.float32))
    prov.copy_into(big[every_other], prov.from_host(np.ascontiguousarray(host[every_other])))
    want = np.zeros((4,) * 9, np.float32)
    want[every_other] = host[every_other]
    np.testing.assert_array_equal(prov.to_host(big), want)


def _at_once(fn, n=8):
    """``fn(i)`` in ``n`` threads released together by a barrier; the exceptions they raised."""
    barrier, errors = threading.Barrier(n), []

    def run(i):
        try:
            barrier.wait(timeout=60)
            fn(i)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return errors


def _overlaps(monkeypatch, owner, name):
    """``owner.name`` patched so that each call is held 5 ms (threads that are not kept apart then
    meet) and counted: the returned list gains an entry whenever a call starts while another is
    still inside. The real calls still run one at a time, even where the lock under test fails."""
    import time

    real, inside, overlaps, count, guard = getattr(owner, name), [0], [], threading.Lock(), threading.Lock()

    def watched(*args, **kwargs):
        with count:
            inside[0] += 1
            if inside[0] > 1:
                overlaps.append(inside[0])
        time.sleep(0.005)
        try:
            with guard:
                return real(*args, **kwargs)
        finally:
            with count:
                inside[0] -= 1

    monkeypatch.setattr(owner, name, watched)
    return overlaps


def test_threads_racing_to_the_first_use_share_one_context(ocl, monkeypatch):
    """A device's context, queue and pool are made once even when 8 threads make their first call
    at the same moment (each had made its own before: on NVIDIA's OpenCL a buffer of one context
    then reached a kernel of another, INVALID_MEM_OBJECT). The context takes 20 ms to make here,
    as a driver's may, so the threads do race."""
    import time

    import pyopencl as cl

    make = cl.Context

    def slow_context(*args, **kwargs):
        time.sleep(0.02)
        return make(*args, **kwargs)

    monkeypatch.setattr(cl, "Context", slow_context)
    fresh = memory.OpenCLDevice(99, ocl.provider.cl_device)
    seen = []
    assert not _at_once(lambda i: seen.append((fresh.context, fresh.queue)))
    assert len(seen) == 8 and len({id(c) for c, _ in seen}) == 1 and len({id(q) for _, q in seen}) == 1
    out = fresh.empty((4,), np.float32)
    assert out.context == fresh.context


def test_threads_making_launchers_never_meet_in_pyopencls_invoker_cache(ocl, monkeypatch):
    """pyopencl makes a kernel's argument setter through a cache on one SQLite connection (pytools'
    ``PersistentDict``); two threads in it at once crashed the process on the H100 machine. 8
    threads making launchers of one kernel at once enter it one at a time (``INVOKERS``)."""
    import pyopencl.invoker as invoker

    overlaps = _overlaps(monkeypatch, invoker, "generate_enqueue_and_set_args")
    src = "__kernel void twice(__global float* x, int n) { int i = get_global_id(0); if (i < n) x[i] *= 2; }"
    made = []

    def make(i):
        knl = cl_compile.kernel(ocl.provider, src, {}, "twice", label="test.twice")
        made.append(cl_compile.Launch(ocl.provider, knl, (64,), (cl_compile.BUFFER, np.int32), (64,)))

    assert not _at_once(make) and len(made) == 8
    assert not overlaps, f"{len(overlaps)} entries into pyopencl's invoker cache overlapped another"
    x = ocl.provider.from_host(np.arange(64, dtype=np.float32))
    made[0](x.data, np.int32(64))
    np.testing.assert_array_equal(ocl.provider.to_host(x), 2 * np.arange(64, dtype=np.float32))


def test_threads_enqueue_on_a_device_one_at_a_time(ocl, monkeypatch):
    """Every enqueue on a device's queue holds its ``enqueue_lock``: 8 threads copying host data
    in at once (which crashed NVIDIA's OpenCL driver in ``enqueue_copy``) enter ``Array.set`` one
    at a time, and the launchers take the same lock."""
    import pyopencl.array as cla

    overlaps = _overlaps(monkeypatch, cla.Array, "set")
    prov, got = ocl.provider, []
    assert not _at_once(lambda i: got.append((i, prov.to_host(prov.from_host(np.full(1000, i, np.float32))))))
    assert len(got) == 8 and all((h == i).all() for i, h in got)
    assert not overlaps, f"{len(overlaps)} host copies entered the queue beside another"
    src = "__kernel void one(__global float* x) { x[get_global_id(0)] = 1; }"
    knl = cl_compile.kernel(prov, src, {}, "one", label="test.one")
    assert cl_compile.Launch(prov, knl, (1,), (cl_compile.BUFFER,), (1,))._lock is prov.enqueue_lock
