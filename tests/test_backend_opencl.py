"""The OpenCL backend: every kernel x config against float64 references, memory and views,
device facts, and the fallback when a kernel's source fails to build.

Runs on every OpenCL device present (PoCL in CI; the NVIDIA platform on the GPU machine, where
these tests carry the ``gpu`` marker). Sizes stay small: PoCL compiles each config once.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest
from conftest import TOLERANCE, random, rel_err

import opruntime as opr
from opruntime.errors import BackendUnavailable, FallbackWarning, KernelCompileError, KernelError
from opruntime.kernels import Attrs, Kernel, Problem
from opruntime.ops import OPS
from opruntime.plugins import registry

pytest.importorskip("pyopencl", reason="pyopencl not installed")
from opruntime_opencl import compile as cl_compile  # noqa: E402  (after the skip: imports nothing heavy)
from opruntime_opencl import memory


def _opencl_devices() -> list:
    out = []
    for d in registry().devices:
        if d.kind == "opencl":
            marks = [pytest.mark.gpu] if d.provider.is_gpu else []
            out.append(pytest.param(d.name, marks=marks, id=d.name))
    return out


DEVICES = _opencl_devices()
if not DEVICES:
    pytest.skip(f"no OpenCL device: {registry().unavailable.get('opencl', 'unknown reason')}", allow_module_level=True)


@pytest.fixture(params=DEVICES)
def ocl(request) -> opr.Device:
    return opr.Device(request.param)


def problem(op: str, device: opr.Device, shapes, dtype: str, **attrs) -> Problem:
    """The Problem the frontend would build for contiguous operands of ``shapes``."""
    return OPS[op].problem_for(device.name, shapes, dtype, **attrs)


def need_dtype(device: opr.Device, dtype: str) -> None:
    prov = device.provider
    if dtype == "float64" and not prov.has_fp64:
        pytest.skip(f"{device.name} ({prov.description}) lacks cl_khr_fp64")
    if dtype == "float16" and not prov.has_fp16:
        pytest.skip(f"{device.name} ({prov.description}) lacks cl_khr_fp16")


def kernels(op: str) -> list[Kernel]:
    return registry().kernels_for(op, "opencl")


def run_all_configs(device: opr.Device, op: str, host: list[np.ndarray], dtype: str, **attrs) -> int:
    """Run every kernel x config of ``op`` that fits ``device`` on ``host`` operands; assert each
    against the float64 reference. Returns how many ran.

    float32 runs every config; float64 / float16 run each kernel's first config (the one the
    heuristic picks), since every config is another cold compile on PoCL."""
    prov = device.provider
    prob = problem(op, device, [x.shape for x in host], dtype, **attrs)
    datas = [prov.from_host(x.reshape(s)) for x, s in zip(host, prob.shapes)]
    ref = OPS[op].reference(*host, **attrs)
    ran = 0
    for k in kernels(op):
        if not k.supports(prob):  # a kernel for other device types (opencl.matmul.vector: CPUs)
            assert k.name == "opencl.matmul.vector" and device.provider.type != "cpu", f"{k.name} declines {prob}"
            continue
        cfgs = list(k.candidates(prob))
        for cfg in cfgs if dtype == "float32" else cfgs[:1]:
            out = prov.to_host(k.run(prob, cfg, *datas)).reshape(ref.shape)
            assert out.dtype == np.dtype(dtype)
            err = rel_err(out, ref)
            assert err <= TOLERANCE[dtype], f"{k.name}[{cfg}] on {prob}: relative error {err:.2e}"
            ran += 1
    return ran


DTYPES = ["float32", "float64", "float16"]


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


def test_softmax_rows_three_pass_path(ocl, rng, monkeypatch):
    """Rows longer than the register budget take the re-reading path (ONEPASS=0)."""
    from opruntime_opencl import softmax

    x = random(rng, (3, 64 * 16 * 4 + 4), "float32")  # > TPR * VW * MAX_NV for the CPU and GPU menus' first
    prob = problem("softmax", ocl, [x.shape], "float32", axis=1)
    cfgs = [c for c in softmax.row_configs(prob) if c["ONEPASS"] == 0][:2]
    assert cfgs
    for cfg in cfgs:
        out = ocl.provider.to_host(softmax.run_rows(prob, cfg, ocl.provider.from_host(x)))
        assert rel_err(out, OPS["softmax"].reference(x, axis=1)) <= 1e-5, cfg


CONV_CASES = [  # 4-sided padding (top, bottom, left, right), as kernels see it
    ((2, 3, 9, 11), (8, 3, 3, 3), dict(stride=(2, 1), padding=(1, 0, 2, 1), dilation=(1, 2))),
    ((1, 6, 7, 7), (12, 1, 3, 3), dict(groups=6, padding=(1, 1, 1, 1))),
    ((2, 8, 5, 6), (4, 4, 1, 1), dict(groups=2)),
]


def conv_problem(device: opr.Device, shapes, dtype: str, padding=(0, 0, 0, 0), **attrs) -> Problem:
    prob = problem("conv2d", device, shapes, dtype, **attrs)
    x, w = shapes[0], shapes[1]
    (sh, sw), (dh, dw) = prob.attrs["stride"], prob.attrs["dilation"]
    ho = (x[2] + padding[0] + padding[1] - dh * (w[2] - 1) - 1) // sh + 1
    wo = (x[3] + padding[2] + padding[3] - dw * (w[3] - 1) - 1) // sw + 1
    return dataclasses.replace(prob, attrs=Attrs({**prob.attrs, "padding": tuple(padding)}),
                               out_shape=(x[0], w[0], ho, wo))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("xs,ws,attrs", CONV_CASES, ids=["strided-dilated-padded", "depthwise-x2", "grouped-1x1"])
def test_conv2d_every_config(ocl, rng, dtype, bias, xs, ws, attrs):
    need_dtype(ocl, dtype)
    host = [random(rng, xs, dtype), random(rng, ws, dtype)] + ([random(rng, (ws[0],), dtype)] if bias else [])
    attrs = dict(attrs)
    pads = attrs.pop("padding", (0, 0, 0, 0))
    prob = conv_problem(ocl, [x.shape for x in host], dtype, pads, **attrs)
    xpad = np.pad(host[0].astype(np.float64), ((0, 0), (0, 0), pads[:2], pads[2:]))  # asymmetric: pad explicitly
    ref = OPS["conv2d"].reference(xpad, host[1], host[2] if bias else None, **attrs)
    prov = ocl.provider
    datas = [prov.from_host(x) for x in host]
    ran = 0
    for k in kernels("conv2d"):
        assert k.supports(prob)
        cfgs = list(k.candidates(prob))
        for cfg in cfgs if dtype == "float32" else cfgs[:1]:
            err = rel_err(prov.to_host(k.run(prob, cfg, *datas)), ref)
            assert err <= TOLERANCE[dtype], f"{k.name}[{cfg}]: relative error {err:.2e}"
            ran += 1
    assert ran >= 2


# -- memory, views and device facts ------------------------------------------------------------------
def test_offset_views_read_in_place_or_copied(ocl, rng):
    """pyopencl views with a byte offset and strides: every operator gives the reference."""
    prov = ocl.provider
    a_host, b_host = random(rng, (40, 50), "float32"), random(rng, (50, 30), "float32")
    a = opr.Tensor._wrap(prov.from_host(a_host)[3:, 5:], ocl)  # offset + row stride 50
    b = opr.Tensor._wrap(prov.from_host(b_host)[5:, 2:], ocl)
    out = opr.matmul(a, b)
    assert rel_err(out.numpy(), OPS["matmul"].reference(a_host[3:, 5:], b_host[5:, 2:])) <= 1e-5
    x = opr.Tensor._wrap(prov.from_host(a_host)[1:, 4:], ocl)  # contiguous rows, misaligned start
    for axis in (0, 1):
        got = opr.softmax(x, axis=axis).numpy()
        assert rel_err(got, OPS["softmax"].reference(a_host[1:, 4:], axis=axis)) <= 1e-5


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


def test_device_facts(ocl):
    prov = ocl.provider
    info = prov.info()
    for key in ("platform", "device", "opencl", "max work-group size", "local memory", "extensions"):
        assert info[key], key
    assert prov.priority == (70 if prov.is_gpu else 20 if prov.type == "cpu" else prov.priority)
    alias = f"opencl:{prov.type}"
    assert opr.Device(alias).kind == "opencl" and opr.Device(alias).provider.type == prov.type
    fp = prov.fingerprint()
    assert fp["device"] == prov.description and fp["driver"]
    times = prov.time(lambda: opr.softmax(opr.tensor(np.ones((4, 8), np.float32) + 1, device=ocl)), repeats=3)
    assert len(times) == 3 and all(t > 0 for t in times)


def test_a_cpu_only_opencl_machine_keeps_numpy_as_default():
    devs = [d for d in registry().devices if d.kind == "opencl"]
    if any(d.provider.is_gpu for d in devs):
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


class BrokenPlugin:
    """A test-only plugin: a matmul kernel whose OpenCL source does not compile, ranked first."""

    __name__ = "test_opencl_broken"

    @staticmethod
    def _run(problem, config, a, b):
        dev = memory.provider(problem.device)
        cl_compile.kernel(dev, BROKEN, {"UNUSED": 1}, "broken", label="test.matmul.broken")
        raise AssertionError("unreachable: the build fails")

    @opr.hookimpl
    def opruntime_kernels(self):
        return [Kernel("matmul", "test.matmul.broken", "opencl", frozenset({"float32"}), self._run,
                       cost=lambda p, c: 0.0)]


@pytest.fixture
def broken_plugin():
    plugin = BrokenPlugin()
    opr.register(plugin, name="test_opencl_broken")
    try:
        yield plugin
    finally:
        opr.unregister("test_opencl_broken")


def test_build_failure_reports_log_and_falls_back(ocl, rng, broken_plugin):
    a, b = random(rng, (9, 7), "float32"), random(rng, (7, 5), "float32")
    assert opr.explain("matmul", a, b, device=ocl).chosen == "test.matmul.broken"
    with pytest.warns(FallbackWarning, match=r"(?s)test\.matmul\.broken.*failed to build.*this_name_is_not_declared"):
        out = opr.matmul(a, b, device=ocl)
    assert rel_err(out.numpy(), OPS["matmul"].reference(a, b)) <= 1e-5
    with pytest.raises(KernelCompileError) as info:  # the cached failure, raised again with its log
        cl_compile.kernel(ocl.provider, BROKEN, {"UNUSED": 1}, "broken", label="test.matmul.broken")
    assert ocl.provider.description in info.value.device and "this_name_is_not_declared" in info.value.log
    with opr.override(strict=True), pytest.raises(KernelError, match="strict"):
        opr.matmul(random(rng, (3, 7), "float32"), b, device=ocl)


# -- the stack is optional and imported lazily ------------------------------------------------------------
def test_pyopencl_missing_or_no_platform_is_unavailable(monkeypatch):
    import opruntime_opencl
    import pyopencl

    monkeypatch.setattr(memory, "_devices", {})
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
