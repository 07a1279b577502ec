"""Foreign arrays through DLPack: torch and JAX arrays in, Tensors out usable zero-copy by torch,
JAX and CuPy; one rule for integer and bool dtypes whatever their source; the two operands that
cannot be taken (a JAX tracer, a torch tensor that requires grad) refused with the way out."""

from __future__ import annotations

import numpy as np
import pytest

import opruntime as opr
from opruntime import dlpack
from opruntime.errors import DtypeError, InputTypeError

torch = pytest.importorskip("torch")


def ones(n=3):
    return np.arange(1, n + 1, dtype=np.float32)


def test_a_torch_cpu_tensor_is_host_data_read_without_a_copy(monkeypatch):
    """On the cpu device the kernel reads the torch tensor's own memory (the host view NumPy
    gets through DLPack), and the result is a new array."""
    seen = []
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    from opruntime.tensor import host_array as real

    def spy(op, data):
        arr = real(op, data)
        seen.append(arr.ctypes.data)
        return arr

    monkeypatch.setattr("opruntime.ops.base.host_array", spy)
    out = opr.relu(x, device="cpu")
    assert seen == [x.data_ptr()]
    np.testing.assert_array_equal(out.numpy(), x.numpy())
    assert not np.shares_memory(out.numpy(), x.numpy())


def test_a_torch_cpu_tensor_goes_where_a_numpy_array_goes():
    """The rule: a foreign array in host memory is placed as a NumPy array is (the call's
    device, else the configured one), whatever library made it."""
    devices = [d.name for d in opr.devices() if not d.provider.accelerator]
    for name in devices:
        with opr.device(name):
            assert opr.relu(torch.ones(3)).device.name == opr.relu(np.ones(3, np.float32)).device.name == name


def test_opr_tensor_copies_a_torch_tensor():
    x = torch.ones(3)
    t = opr.tensor(x, device="cpu")
    x += 1
    np.testing.assert_array_equal(t.numpy(), np.ones(3, np.float32))


def test_torch_bfloat16_is_read_as_ml_dtypes_bfloat16():
    """NumPy's own from_dlpack refuses bfloat16; the capsule is read directly, without a copy."""
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(torch.bfloat16)
    view = dlpack.host_view(x[:, 1:])  # strided too
    assert view.dtype.name == "bfloat16" and view.ctypes.data == x[:, 1:].data_ptr() and not view.flags.writeable
    np.testing.assert_array_equal(view.astype(np.float32), x[:, 1:].float().numpy())
    t = opr.tensor(x, device="cpu")
    assert t.dtype.name == "bfloat16"
    np.testing.assert_array_equal(t.numpy().astype(np.float32), x.float().numpy())


def test_a_bfloat16_view_outlives_the_torch_tensor():
    x = torch.full((1000,), 2.0, dtype=torch.bfloat16)
    view = dlpack.host_view(x)
    del x
    import gc

    gc.collect()
    assert float(view.astype(np.float32).sum()) == 2000.0  # the capsule (base of the view) keeps the memory


def _bf16_tensor(shape=(3, 4)):
    import ml_dtypes

    values = (np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) - 5) / 8  # exact in bfloat16
    return opr.tensor(values.astype(ml_dtypes.bfloat16), device="cpu"), values


def test_a_bfloat16_cpu_tensor_goes_to_torch_sharing_its_memory():
    """NumPy will not export bfloat16; the cpu device's capsule comes from opruntime.dlpack. The
    array stays alive after ``del t`` until torch is done with it (its deleter)."""
    import gc

    t, values = _bf16_tensor()
    x = torch.from_dlpack(t)
    assert x.dtype == torch.bfloat16 and x.shape == (3, 4) and x.data_ptr() == t.data.ctypes.data
    np.testing.assert_array_equal(x.float().numpy(), values)
    x[0, 0] = 7.0  # the same memory
    assert float(t.numpy()[0, 0]) == 7.0
    del t
    gc.collect()
    junk = [np.full(4096, 9.0, np.float32) for _ in range(64)]  # memory freed too early would be reused here
    values[0, 0] = 7.0
    np.testing.assert_array_equal(x.float().numpy(), values)
    assert len(junk) == 64


def test_a_bfloat16_export_is_released_by_its_consumer_or_its_capsule():
    import gc

    before = len(dlpack._LIVE)
    t, values = _bf16_tensor((5, 6))
    legacy = t.__dlpack__()  # no max_version: the legacy capsule, read by torch's old entry point
    assert "dltensor" in repr(legacy) and "versioned" not in repr(legacy)
    x = torch.utils.dlpack.from_dlpack(legacy)
    np.testing.assert_array_equal(x.float().numpy(), values)
    unused = t.__dlpack__(max_version=(1, 0))
    assert "dltensor_versioned" in repr(unused) and len(dlpack._LIVE) == before + 2
    del unused, legacy
    gc.collect()
    assert len(dlpack._LIVE) == before + 1  # an unconsumed capsule frees its export
    del x, t
    gc.collect()
    assert len(dlpack._LIVE) == before  # torch called the deleter


@pytest.mark.parametrize("shape", [(0,), (2, 0), (), (1, 1), (7, 5)])
def test_bfloat16_exports_of_every_shape_and_strided_views(shape):
    t, values = _bf16_tensor(shape)
    np.testing.assert_array_equal(torch.from_dlpack(t).float().numpy(), values)
    if len(shape) == 2 and shape[1] > 1:
        view = t[:, 1::2]  # a strided view: exported as it is, strides in elements
        x = torch.from_dlpack(view)
        assert x.stride() == (shape[1], 2) and x.data_ptr() == view.data.ctypes.data
        np.testing.assert_array_equal(x.float().numpy(), values[:, 1::2])


def test_the_exporter_follows_the_dlpack_protocol():
    """Checked with NumPy as the consumer (float64, which NumPy reads back): versioned capsules
    say read-only, copy=True copies, a legacy capsule of a read-only array is refused, a stream or
    another device is refused."""
    class Host:
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, **kw):
            return dlpack.export(self.a, **kw)

        def __dlpack_device__(self):
            return (dlpack.CPU, 0)

    a = np.arange(12.0).reshape(3, 4)[:, 1::2]
    b = np.from_dlpack(Host(a))
    assert np.shares_memory(a, b) and b.flags.writeable
    np.testing.assert_array_equal(b, a)
    assert not np.shares_memory(a, np.from_dlpack(Host(a), copy=True))
    ro = a.copy()
    ro.flags.writeable = False
    assert not np.from_dlpack(Host(ro)).flags.writeable
    with pytest.raises(BufferError, match="read-only"):
        dlpack.export(ro)
    with pytest.raises(BufferError, match="stream"):
        dlpack.export(a, stream=1)
    with pytest.raises(BufferError, match="exports to the CPU"):
        dlpack.export(a, dl_device=(dlpack.CUDA, 0))


def test_results_in_bfloat16_are_read_by_jax():
    jax = pytest.importorskip("jax")
    t, values = _bf16_tensor()
    np.testing.assert_array_equal(np.asarray(jax.dlpack.from_dlpack(t)).astype(np.float32), values)


def test_bfloat16_computes_where_a_device_has_bfloat16_kernels():
    jax_cpu = next((d for d in opr.devices() if d.name == "jax:cpu:0"), None)
    if jax_cpu is None:
        pytest.skip("no jax:cpu device")
    x = torch.tensor([[1.0, -2.0], [3.0, 4.0]], dtype=torch.bfloat16)
    out = opr.relu(x, device="jax:cpu:0")
    assert out.dtype.name == "bfloat16"
    np.testing.assert_array_equal(out.numpy().astype(np.float32), torch.relu(x).float().numpy())


def _int_sources():
    jnp = pytest.importorskip("jax.numpy")
    return {"numpy": np.ones((2, 2), np.int32), "torch": torch.ones((2, 2), dtype=torch.int32),
            "jax": jnp.ones((2, 2), jnp.int32)}


def test_integer_inputs_get_one_error_whatever_their_source():
    messages = set()
    for source, x in _int_sources().items():
        with pytest.raises(DtypeError, match="matmul: dtype int32 is not supported") as err:
            opr.matmul(x, x, device=None if source == "jax" else "cpu")
        messages.add(str(err.value))
    assert len(messages) == 1, messages


@pytest.mark.parametrize("make", [lambda: np.ones(3, bool), lambda: torch.ones(3, dtype=torch.bool)],
                         ids=["numpy", "torch"])
def test_bool_inputs_get_one_error_whatever_their_source(make):
    with pytest.raises(DtypeError, match="relu: dtype bool is not supported"):
        opr.relu(make(), device="cpu")


def test_a_tensor_that_requires_grad_is_refused_with_the_fix():
    w = torch.ones(2, 2, requires_grad=True)
    with pytest.raises(InputTypeError, match=r"matmul: operand b is a torch tensor that requires grad.*b\.detach\(\)"):
        opr.matmul(np.ones((2, 2), np.float32), w, device="cpu")
    with pytest.raises(InputTypeError, match=r"tensor: operand data .* requires grad"):
        opr.tensor(w)
    np.testing.assert_array_equal(opr.matmul(w.detach(), w.detach(), device="cpu").numpy(), np.full((2, 2), 2.0))


def test_a_call_inside_jax_jit_names_the_alternative_and_the_alternative_works():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    with pytest.raises(InputTypeError, match=r"relu: operand x is a JAX tracer.*runs eagerly.*jax\.pure_callback"):
        jax.jit(lambda a: opr.relu(a).data)(jnp.ones(3))

    @jax.jit
    def f(a):  # what the message suggests
        return jax.pure_callback(lambda v: np.asarray(opr.relu(np.asarray(v))),
                                 jax.ShapeDtypeStruct(a.shape, a.dtype), a) * 2

    np.testing.assert_array_equal(np.asarray(f(jnp.array([-1.0, 2.0]))), [0.0, 4.0])


def test_results_are_read_by_torch_without_a_copy():
    t = opr.relu(ones(), device="cpu")
    x = torch.from_dlpack(t)
    assert x.data_ptr() == t.data.ctypes.data
    np.testing.assert_array_equal(x.numpy(), ones())


def test_results_are_read_by_jax():
    jax = pytest.importorskip("jax")
    t = opr.relu(ones(), device="cpu")
    x = jax.dlpack.from_dlpack(t)
    np.testing.assert_array_equal(np.asarray(x), ones())
    if t.data.ctypes.data % 64 == 0:  # XLA's CPU client adopts a 64-byte aligned buffer, copies others
        assert x.unsafe_buffer_pointer() == t.data.ctypes.data


def test_a_jax_array_stays_on_its_jax_device_and_comes_back_to_jax():
    jax = pytest.importorskip("jax")
    x = jax.numpy.array([-1.0, 2.0])
    t = opr.relu(x)
    assert t.device.name.startswith("jax:") and isinstance(t.data, jax.Array)
    np.testing.assert_array_equal(np.asarray(jax.dlpack.from_dlpack(t)), [0.0, 2.0])


def test_a_dlpack_array_on_a_device_nobody_holds_is_a_clear_error():
    class OnAnotherDevice:  # what a producer on a device without a backend here looks like
        def __dlpack_device__(self):
            return (dlpack.METAL, 0)

        def __dlpack__(self, **kwargs):
            raise AssertionError("must not be read")

    with pytest.raises(opr.errors.DeviceUnavailableError, match="relu: operand x .* lives on Metal 0, and no device "
                                                                "here holds that memory"):
        opr.relu(OnAnotherDevice())


# -- CUDA: the lead runs these on the GPU machine (scripts/gpu.sh) ---------------------------------
def _cuda():
    if not torch.cuda.is_available() or not any(d.kind == "cuda" for d in opr.devices()):
        pytest.skip("needs CUDA through torch and the cupy backend")
    return pytest.importorskip("cupy")


@pytest.mark.gpu
def test_a_torch_cuda_tensor_lands_on_its_cuda_device_without_a_copy(monkeypatch):
    _cuda()
    x = torch.randn(64, 64, device="cuda:0")
    t = opr.tensor(x)  # opr.tensor copies, on the device
    assert t.device.name == "cuda:0" and t.data.data.ptr != x.data_ptr()
    imported = []
    prov = opr.Device("cuda:0").provider
    real = prov.from_dlpack
    monkeypatch.setattr(prov, "from_dlpack", lambda obj: imported.append(real(obj)) or imported[-1])
    out = opr.matmul(x, x)  # configured device or not: the operands' device
    assert out.device.name == "cuda:0"
    assert imported and all(a.data.ptr == x.data_ptr() for a in imported)  # zero-copy in
    torch.testing.assert_close(torch.from_dlpack(out), x @ x, rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
def test_results_on_cuda_are_read_by_torch_and_cupy_without_a_copy():
    cupy = _cuda()
    out = opr.relu(torch.randn(1000, device="cuda:0"))
    assert torch.from_dlpack(out).data_ptr() == out.data.data.ptr
    assert cupy.from_dlpack(out).data.ptr == out.data.data.ptr


@pytest.mark.gpu
def test_torch_cuda_bfloat16_in_and_out():
    _cuda()
    x = torch.randn(32, 32, device="cuda:0").to(torch.bfloat16)
    out = opr.matmul(x, x)
    assert out.device.name == "cuda:0" and out.dtype.name == "bfloat16"
    torch.testing.assert_close(torch.from_dlpack(out).float(), (x.float() @ x.float()), rtol=2e-2, atol=2e-1)


@pytest.mark.gpu
def test_a_torch_cuda_tensor_with_device_cpu_asked_is_a_mismatch():
    _cuda()
    with pytest.raises(opr.errors.DeviceMismatchError, match="never copies between devices silently"):
        opr.relu(torch.ones(3, device="cuda:0"), device="cpu")


def test_native_arrays_of_a_device_take_the_hot_path_after_their_first_call(monkeypatch):
    """A device's own array (here a jax.Array on jax:cpu) is adopted on the first call; once its
    class is known, the next call of a shape keys the plan by class, device, shape, dtype and
    strides, and later calls find it without placing the arrays again, with the same results;
    another shape plans anew."""
    jnp = pytest.importorskip("jax.numpy")
    from opruntime.ops import base

    a, b = jnp.arange(12.0, dtype=jnp.float32).reshape(3, 4), jnp.ones((3, 4), jnp.float32)
    first = opr.add(a, b)  # adopts: the class becomes known
    assert first.device.name.startswith("jax")
    opr.add(a, b)  # keys the plan for the hot path

    def no_placing(*args, **kwargs):
        raise AssertionError("placed again")

    monkeypatch.setattr(base, "place", no_placing)
    again = opr.add(b, a)
    assert np.array_equal(np.asarray(again.numpy()), np.arange(12.0).reshape(3, 4) + 1)
    with pytest.raises(AssertionError, match="placed again"):
        opr.add(a[:2], b[:2])  # another shape: planned (and placed) anew
    monkeypatch.undo()
    assert np.array_equal(np.asarray(opr.add(a[:2], b[:2]).numpy()), np.asarray(a[:2] + b[:2]))
