"""The JAX backend: devices, memory, DLPack, every kernel (XLA and Pallas) against float64
references, and the jit cache (a repeated call never retraces).

On a CPU-only machine everything runs on ``jax:cpu:0`` with Pallas interpreted; the tests that
compile Pallas for a GPU carry ``@pytest.mark.gpu`` and run on the GPU machine.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from conftest import TOLERANCE, random, rel_err

import opruntime as opr
from opruntime.kernels import Problem
from opruntime.ops import OPS
from opruntime.plugins import registry

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from opruntime_jax.compile import TRACES

JAX_DEVICES = [d.name for d in registry().devices if d.kind == "jax"]
GPU_DEVICES = [n for n in JAX_DEVICES if ":gpu:" in n or ":tpu:" in n]
HALF = ["float16", "bfloat16"]


def _marks(name: str) -> list:
    return [pytest.mark.gpu] if (":gpu:" in name or ":tpu:" in name) else []


ALL = [pytest.param(n, id=n, marks=_marks(n)) for n in JAX_DEVICES]
COMPILED = [pytest.param(n, id=n, marks=_marks(n)) for n in GPU_DEVICES] or [
    pytest.param("jax:gpu:0", marks=[pytest.mark.gpu, pytest.mark.skip(reason="no jax GPU/TPU device here")])]


def pinned(op: str, kernel: str):
    """Run ``op`` with ``kernel`` pinned, strict: a kernel that cannot run raises, never falls back."""
    return opr.override(ops={op: {"kernel": kernel}}, strict=True)


def _check(out: opr.Tensor, ref: np.ndarray, dtype: str, dev: str) -> None:
    assert out.device == dev
    assert out.dtype == np.dtype(dtype)
    err = rel_err(out.numpy(), ref)
    assert err <= TOLERANCE[dtype], f"relative error {err:.2e} > {TOLERANCE[dtype]:.0e} ({dtype})"


# -- devices and memory --------------------------------------------------------------------------
def test_cpu_device_named_and_ranked_below_numpy():
    reg = registry()
    dev = reg.device("jax:cpu")
    assert dev.name == "jax:cpu:0" and dev.kind == "jax"
    assert dev.provider.priority == 10 < reg.device("cpu").provider.priority
    if not GPU_DEVICES:
        assert opr.devices()[0].name == "cpu"  # NumPy stays the default on CPU-only machines


def test_import_loads_no_jax():
    code = "import opruntime, opruntime_jax, sys; assert 'jax' not in sys.modules, 'jax imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_jax_is_unavailable_with_reason(monkeypatch):
    import importlib.util

    import opruntime_jax

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "jax" else real(n, *a))
    with pytest.raises(opr.errors.BackendUnavailable) as info:
        opruntime_jax.opruntime_devices()
    assert info.value.reason == "jax not installed" and info.value.kinds == ("jax",)


@pytest.mark.parametrize("dev", ALL)
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_memory_round_trip(dev, dtype, rng):
    prov = registry().device(dev).provider
    host = random(rng, (3, 5), dtype)
    data = prov.from_host(host)
    assert isinstance(data, jax.Array) and data.dtype == host.dtype and prov.owns(data)
    back = prov.to_host(data)
    assert back.dtype == host.dtype and np.array_equal(back, host)
    back[0, 0] = 7  # a writable copy
    z = prov.zeros((2, 3), np.dtype(dtype))
    assert z.dtype == np.dtype(dtype) and prov.owns(z) and not np.asarray(z).any()
    f = prov.astype(data, np.dtype("float32"))
    assert f.dtype == np.float32 and prov.owns(f)


def test_owns_only_arrays_on_that_device():
    prov = registry().device("jax:cpu").provider
    assert not prov.owns(np.ones(3))
    x = jax.device_put(np.ones(3, np.float32), jax.devices("cpu")[0])
    assert prov.owns(x)
    assert registry().device_of(x).name == "jax:cpu:0"
    for other in GPU_DEVICES:
        assert not registry().device(other).provider.owns(x)


def test_native_jax_array_stays_in_place(rng):
    a = jax.device_put(random(rng, (4, 6), "float32"), jax.devices("cpu")[0])
    t = opr.tensor(a)
    assert t.device.name == "jax:cpu:0" and t.data is a  # adopted, not copied
    out = opr.softmax(a)  # a raw jax.Array operand runs on its own device
    assert out.device.name == "jax:cpu:0"


@pytest.mark.parametrize("dev", ALL)
def test_dlpack_round_trip(dev, rng):
    prov = registry().device(dev).provider
    host = random(rng, (4, 7), "float32")
    t = opr.tensor(host, device=dev)
    assert t.__dlpack_device__() == t.data.__dlpack_device__()
    y = jax.dlpack.from_dlpack(t)  # out: any DLPack consumer
    assert np.array_equal(np.asarray(y), host)
    back = prov.from_dlpack(y)  # in: from another DLPack producer
    assert prov.owns(back) and np.array_equal(prov.to_host(back), host)
    if ":cpu:" in dev:
        assert np.array_equal(np.from_dlpack(t), host)
        from_np = prov.from_dlpack(host)
        assert prov.owns(from_np) and np.array_equal(prov.to_host(from_np), host)


def test_float64_leaves_global_x64_alone(rng):
    before = jax.config.jax_enable_x64
    x = random(rng, (4, 5), "float64")
    out = opr.softmax(x, device="jax:cpu")
    assert out.dtype == np.float64 and out.data.dtype == np.float64
    _check(out, OPS["softmax"].reference(x), "float64", "jax:cpu:0")
    assert jax.config.jax_enable_x64 == before
    if not before:  # the user's own JAX code still gets float32 by default
        assert jnp.asarray(np.ones(2)).dtype == jnp.float32


@pytest.mark.parametrize("dev", ALL)
def test_time_and_synchronize(dev):
    prov = registry().device(dev).provider
    x = prov.from_host(np.ones((64, 64), np.float32))
    times = prov.time(lambda: x @ x, repeats=3, warmup=1)
    assert len(times) == 3 and all(t > 0 for t in times)
    prov.synchronize()
    fp = prov.fingerprint()
    assert fp["name"] == dev and fp["jax"] == jax.__version__


# -- the jit cache -------------------------------------------------------------------------------
def test_repeated_calls_never_retrace(rng):
    a, b = random(rng, (6, 5), "float32"), random(rng, (5, 4), "float32")
    ta, tb = opr.tensor(a, device="jax:cpu"), opr.tensor(b, device="jax:cpu")
    opr.matmul(ta, tb)
    first = dict(TRACES)
    assert first["jax.matmul.xla"] >= 1
    for _ in range(5):
        opr.matmul(ta, tb)
        opr.matmul(opr.tensor(random(rng, (6, 5), "float32"), device="jax:cpu"), tb)  # new data, same signature
    assert dict(TRACES) == first
    opr.selector.clear_cache()  # a new Problem object with the same signature: still no retrace
    opr.matmul(ta, tb)
    assert dict(TRACES) == first
    opr.matmul(opr.tensor(random(rng, (7, 5), "float32"), device="jax:cpu"), tb)  # new shape: one trace
    assert TRACES["jax.matmul.xla"] == first["jax.matmul.xla"] + 1


def test_kernel_run_hot_path_returns_jitted_result(rng):
    """The hot path is: look up the cached jitted function by problem identity, call it."""
    k = registry().kernels["jax.softmax.xla"]
    x = opr.tensor(random(rng, (3, 8), "float32"), device="jax:cpu").data
    p = Problem("softmax", "jax:cpu:0", ((3, 8),), ("float32",), (None,), opr.kernels.Attrs(axis=1), (3, 8), "float32")
    cfg: dict = {}
    out = k.run(p, cfg, x)
    hit = k.run.jit.fast[id(p)]
    assert hit[0] is p and hit[1] is cfg
    before = dict(TRACES)
    assert np.allclose(np.asarray(k.run(p, cfg, x)), np.asarray(out))
    assert dict(TRACES) == before


# -- every kernel against float64 references -----------------------------------------------------
MATMUL = [((7, 13), (13, 5)), ((1, 1), (1, 1)), ((3, 7, 13), (13, 5)), ((2, 1, 7, 13), (1, 3, 13, 5)),
          ((3, 20, 33), (3, 33, 17)), ((67, 129), (129, 65))]


@pytest.mark.parametrize("dev", ALL)
@pytest.mark.parametrize("kernel", ["jax.matmul.xla", "jax.matmul.pallas_blocked"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("sa,sb", MATMUL, ids=[f"{a}x{b}" for a, b in MATMUL])
def test_matmul_kernels(dev, kernel, dtype, sa, sb, rng):
    if dtype not in registry().kernels[kernel].dtypes:
        pytest.skip(f"{kernel} has no {dtype}")
    a, b = random(rng, sa, dtype), random(rng, sb, dtype)
    with pinned("matmul", kernel):
        out = opr.matmul(a, b, device=dev)
        assert opr.explain("matmul", a, b, device=dev).chosen.startswith(kernel)
    _check(out, OPS["matmul"].reference(a, b), dtype, dev)


SOFTMAX = [((5,), 0), ((3, 7), 1), ((3, 7), 0), ((2, 3, 5), 1), ((33, 1025), 1), ((1, 3000), 1), ((9, 16), 1),
           ((6, 4, 3, 2), 1)]


@pytest.mark.parametrize("dev", ALL)
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("variant", ["xla", "pallas_rows"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("shape,axis", SOFTMAX, ids=[f"{s}-axis{a}" for s, a in SOFTMAX])
def test_softmax_kernels(dev, op, variant, dtype, shape, axis, rng):
    kernel = f"jax.{op}.{variant}"
    if dtype not in registry().kernels[kernel].dtypes:
        pytest.skip(f"{kernel} has no {dtype}")
    x = random(rng, shape, dtype) * 4
    with pinned(op, kernel):
        out = getattr(opr, op)(x, axis=axis, device=dev)
    _check(out, OPS[op].reference(x, axis=axis), dtype, dev)


@pytest.mark.parametrize("dev", ALL)
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_pallas_softmax_edges(dev, op):
    x = np.array([[-np.inf, -np.inf, -np.inf], [1e30, 1e30, -1e30], [0.5, -np.inf, 2.0], [3e38, 1.0, -3e37]],
                 np.float32)
    with pinned(op, f"jax.{op}.pallas_rows"):
        out = getattr(opr, op)(x, device=dev)
    _check(out, OPS[op].reference(x), "float32", dev)


@pytest.mark.parametrize("dev", ALL)
def test_conv2d_every_attribute(dev, rng):
    x, w, b = random(rng, (2, 6, 11, 9), "float32"), random(rng, (4, 3, 3, 2), "float32"), random(rng, (4,), "float32")
    attrs = {"stride": (2, 1), "padding": (2, 1), "dilation": (1, 2), "groups": 2}
    with pinned("conv2d", "jax.conv2d.xla"):
        out = opr.conv2d(x, w, b, device=dev, **attrs)
    _check(out, OPS["conv2d"].reference(x, w, b, **attrs), "float32", dev)


def _problem(op: str, dev: str, shapes: tuple, dtype: str, attrs: opr.kernels.Attrs, out: tuple) -> Problem:
    return Problem(op, dev, shapes, (dtype,) * len(shapes), (None,) * len(shapes), attrs, out, dtype)


@pytest.mark.parametrize("dev", ALL)
def test_every_pallas_config(dev, rng):
    """The autotuner's variants: each config of each Pallas kernel gives the right answer."""
    reg, prov = registry(), registry().device(dev).provider
    a, b = random(rng, (2, 40, 72), "float32"), random(rng, (2, 72, 24), "float32")
    p = _problem("matmul", dev, (a.shape, b.shape), "float32", opr.kernels.Attrs(), (2, 40, 24))
    k = reg.kernels["jax.matmul.pallas_blocked"]
    for cfg in k.candidates(p):
        out = prov.to_host(k.run(p, cfg, prov.from_host(a), prov.from_host(b)))
        assert rel_err(out, OPS["matmul"].reference(a, b)) <= 1e-5, cfg
    x = random(rng, (37, 300), "float32")
    for op in ("softmax", "log_softmax"):
        p = _problem(op, dev, (x.shape,), "float32", opr.kernels.Attrs(axis=1), x.shape)
        k = reg.kernels[f"jax.{op}.pallas_rows"]
        assert len(k.candidates(p)) >= 2
        for cfg in k.candidates(p):
            out = prov.to_host(k.run(p, cfg, prov.from_host(x)))
            assert rel_err(out, OPS[op].reference(x, axis=1)) <= 1e-5, cfg


def test_xla_is_the_default_and_pallas_declines_long_rows():
    reg = registry()
    x = np.ones((4, 70000), np.float32)
    e = opr.explain("softmax", x, device="jax:cpu")
    assert e.chosen == "jax.softmax.xla"
    status = {c.kernel.name: c.status for c in e.candidates}
    assert status["jax.softmax.pallas_rows"] == "does not support this problem"
    a = np.ones((64, 64), np.float32)
    assert opr.explain("matmul", a, a, device="jax:cpu").chosen == "jax.matmul.xla"
    assert "float64" not in reg.kernels["jax.matmul.pallas_blocked"].dtypes


# -- compiled Pallas (GPU / TPU) ------------------------------------------------------------------
@pytest.mark.parametrize("dev", COMPILED)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_compiled_pallas_matches_reference(dev, dtype, rng):
    for sa, sb in (((256, 512), (512, 384)), ((3, 100, 70), (70, 130))):
        a, b = random(rng, sa, dtype), random(rng, sb, dtype)
        with pinned("matmul", "jax.matmul.pallas_blocked"):
            out = opr.matmul(a, b, device=dev)
        _check(out, OPS["matmul"].reference(a, b), dtype, dev)
    for shape, axis in (((512, 1000), 1), ((64, 8192), 1), ((100, 33), 0)):
        x = random(rng, shape, dtype) * 4
        for op in ("softmax", "log_softmax"):
            with pinned(op, f"jax.{op}.pallas_rows"):
                out = getattr(opr, op)(x, axis=axis, device=dev)
            _check(out, OPS[op].reference(x, axis=axis), dtype, dev)


def _estimates(op: str, dev: str, shapes: tuple, dtype: str = "float32", **attrs) -> dict[str, float]:
    out = tuple(shapes[0][:-1]) + (shapes[1][-1],) if op == "matmul" else shapes[0]
    p = _problem(op, dev, shapes, dtype, opr.kernels.Attrs(**attrs), out)
    return {k.name: k.estimate(p, k.candidates(p)[0]) for k in registry().kernels_for(op, "jax") if k.supports(p)}


def test_estimates_pick_xla_except_long_gpu_rows():
    """XLA wins by estimate wherever it measured faster; Pallas softmax only for 16K+ rows on a GPU,
    where it measured 1.3-1.4x XLA on an H200. Pure cost functions: no device needed."""
    for dev in ("jax:cpu:0", "jax:gpu:0", "jax:tpu:0"):
        for dt in ("float32", "float16", "bfloat16"):
            for n in (8, 512, 4096):
                est = _estimates("matmul", dev, ((n, n), (n, n)), dt)
                assert min(est, key=est.get) == "jax.matmul.xla", (dev, dt, n)
        for shape in ((16,), (4096, 4096), (8192, 8192), (65536, 128), (1024, 32768)):
            est = _estimates("softmax", dev, (shape,), axis=len(shape) - 1)
            want = "jax.softmax.pallas_rows" if dev == "jax:gpu:0" and shape[-1] >= 16384 else "jax.softmax.xla"
            assert min(est, key=est.get) == want, (dev, shape, est)


def test_jax_does_not_reserve_the_gpu_for_itself():
    """Loading the backend leaves XLA_PYTHON_CLIENT_PREALLOCATE=false (unless the user set it), so
    JAX does not take 75% of a GPU the CUDA and OpenCL backends of the process also use."""
    code = ("import os; os.environ.pop('XLA_PYTHON_CLIENT_PREALLOCATE', None); import opruntime as opr; opr.devices(); "
            "print(os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "false"
    code = "import os; os.environ['XLA_PYTHON_CLIENT_PREALLOCATE'] = 'true'; import opruntime as opr; opr.devices(); " \
           "print(os.environ['XLA_PYTHON_CLIENT_PREALLOCATE'])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "true"
