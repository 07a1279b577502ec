"""Tensor and device handles; the one memory rule (a Tensor never changes because the caller
changed an array, and the caller cannot change a Tensor through ``.numpy()``) and the one
host-data rule (byte order, masked, ragged, Python ints), on every device."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import opruntime as opr
from opruntime.testing.numerics import compare


def test_tensor_round_trip(device, rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    t = opr.tensor(x, device=device)
    assert t.shape == (3, 4) and t.dtype == np.float32 and t.device == device and t.ndim == 2 and t.size == 12
    np.testing.assert_array_equal(t.numpy(), x)
    np.testing.assert_array_equal(np.asarray(t), x)
    back = t.to("cpu")
    assert back.device.name == "cpu"
    np.testing.assert_array_equal(back.numpy(), x)
    assert t.to(device) is t


def test_tensor_from_list_scalar_and_dtype():
    t = opr.tensor([[1.5, 2.5]], device="cpu")
    assert t.shape == (1, 2) and t.dtype == np.float64
    assert opr.tensor(3.0, device="cpu").shape == ()
    assert opr.tensor([1, 2], device="cpu", dtype="float32").dtype == np.float32
    assert opr.tensor(opr.tensor([1.0], device="cpu")).device.name == "cpu"


def test_tensor_dlpack(device, rng):
    x = rng.standard_normal((5,)).astype(np.float32)
    t = opr.tensor(x, device=device)
    dev_type, _ = t.__dlpack_device__()
    assert isinstance(dev_type, int)
    if device.name == "cpu":
        np.testing.assert_array_equal(np.from_dlpack(t), x)
    again = opr.tensor(opr.tensor(x, device="cpu"), device=device)  # any Tensor -> device
    np.testing.assert_array_equal(again.numpy(), x)


def test_tensor_repr():
    r = repr(opr.tensor(np.arange(3, dtype=np.float32), device="cpu"))
    assert r.startswith("Tensor(shape=(3,), dtype=float32, device='cpu'") and "[0., 1., 2.]" in r
    big = repr(opr.tensor(np.zeros((100, 100), np.float32), device="cpu"))
    assert big == "Tensor(shape=(100, 100), dtype=float32, device='cpu')"


def test_device_handles():
    cpu = opr.Device("cpu")
    assert cpu is opr.Device("CPU") and cpu == "cpu" and str(cpu) == "cpu" and "Device('cpu'" in repr(cpu)
    assert opr.devices()[0].provider.priority >= max(d.provider.priority for d in opr.devices())


def test_result_is_a_tensor_and_host_data_joins_tensor_device(fake, rng):
    a = opr.tensor(rng.standard_normal((2, 3)).astype(np.float32), device="fake:1")
    out = opr.matmul(a, np.ones((3, 2), np.float32))
    assert isinstance(out, opr.Tensor) and out.device.name == "fake:1"


def test_native_arrays_are_adopted(fake, rng):
    a = opr.tensor(rng.standard_normal((2, 3)).astype(np.float32), device="fake:0")
    out = opr.matmul(a.data, a.data.T)  # a native FakeArray, not wrapped: found by its provider
    assert out.device.name == "fake:0"


def test_import_loads_no_gpu_stack():
    code = ("import sys, opruntime as opr; opr.matmul\n"
            "bad = [m for m in ('cupy', 'pyopencl', 'jax', 'torch', 'triton') if m in sys.modules]\n"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import opruntime loaded {out.stdout.strip()}"


def test_import_is_fast():
    code = "import time; t = time.perf_counter(); import opruntime; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert float(out.stdout) < 1.0


def test_host_operands_are_placed_on_every_call(fake, rng):
    with opr.device("fake:1"):
        for _ in range(3):  # the first call builds the plan, the next ones take the cached path
            a, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)
            out = opr.matmul(a, b)
            assert out.device.name == "fake:1" and out.data.__class__.__name__ == "FakeArray"
            np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5)
    assert fake.calls["run:a"] == 3


# -- the memory rule (finding 4) ---------------------------------------------------------------------
def host_at(offset: int, values: np.ndarray) -> np.ndarray:
    """A copy of ``values`` whose data starts ``offset`` bytes past a 64-byte boundary (XLA's CPU
    client takes a 64-byte-aligned host array without copying it: alignment decides aliasing)."""
    raw = np.empty(values.nbytes + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    out = raw[start:start + values.nbytes].view(values.dtype).reshape(values.shape)
    out[...] = values
    assert out.ctypes.data % 64 == offset
    return out


@pytest.mark.parametrize("offset", [0, 4], ids=["64-byte-aligned", "unaligned"])
def test_finding_4_tensor_copies_host_data_on_every_device(device, offset):
    """Finding 4: on the cpu ``opr.tensor(a)`` kept ``a`` itself, so changing ``a`` changed the
    Tensor; on every device the Tensor now holds its own copy (host arrays of either alignment:
    a device whose ``from_host`` can take the host buffer as it is must copy it first)."""
    a = host_at(offset, np.arange(6, dtype=np.float32).reshape(2, 3))
    t = opr.tensor(a, device=device)
    a[...] = -1
    np.testing.assert_array_equal(t.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))


@pytest.mark.parametrize("offset", [0, 4], ids=["64-byte-aligned", "unaligned"])
def test_a_result_never_changes_because_the_caller_changed_an_operand(device, offset):
    """The memory rule for results: a host operand written right after the call returns (while an
    asynchronous device may still be computing) leaves the result as the call's values made it.
    Large NumPy arrays are usually 64-byte aligned, which is where a zero-copy placement bites."""
    rng = np.random.default_rng(0)
    a = host_at(offset, rng.standard_normal((1024, 1024)).astype(np.float32))
    want = a.astype(np.float64) @ a.astype(np.float64)
    out = opr.matmul(a, a, device=device)
    a[...] = 0  # before the result is looked at
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-3, atol=1e-2)


def test_finding_4_numpy_is_read_only_or_a_copy_on_every_device(device):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = opr.tensor(x, device=device)
    host = t.numpy()
    if host.flags.writeable:  # a copy: writing into it leaves the Tensor as it is
        host[...] = 7
    else:
        with pytest.raises(ValueError, match="read-only"):
            host[...] = 7
    np.testing.assert_array_equal(t.numpy(), x)
    arr = np.asarray(t)
    if arr.flags.writeable:
        arr[...] = 7
    np.testing.assert_array_equal(t.numpy(), x)


def test_tensor_of_a_native_array_copies_it(device):
    t = opr.tensor(np.ones(4, np.float32), device=device)
    again = opr.tensor(t.data)  # a native array of the device: adopted on its device, copied
    assert again.device == device and again.data is not t.data
    if device.name == "cpu":
        assert not np.shares_memory(again.data, t.data)


def test_results_are_new_arrays_not_the_callers(device):
    x = np.ones((2, 3), np.float32)
    out = opr.softmax(x, device=device)
    if device.name == "cpu":
        assert not np.shares_memory(out.data, x)
    x[...] = 5
    np.testing.assert_allclose(out.numpy(), np.full((2, 3), 1 / 3), rtol=1e-6)


# -- the host-data rule (finding 1) ---------------------------------------------------------------------
@pytest.mark.parametrize("order", [">", "<"], ids=["big-endian", "little-endian"])
@pytest.mark.parametrize("dtype", ["f4", "f8"])
def test_finding_1_byte_order_is_converted_values_kept(device, order, dtype):
    """Finding 1: a big-endian ``>f4`` / ``>f8`` array was handed to kernels as if native, giving
    garbage (softmax of [1, 2, 3] came out as NaN / uniform); values are kept on every device."""
    from conftest import dtypes_on

    if dtype == "f8" and "float64" not in dtypes_on(device, "softmax"):
        pytest.skip(f"no float64 kernels on {device.name}")
    x = np.array([1, 2, 3], f"{order}{dtype}")
    out = opr.softmax(x, device=device)
    assert out.dtype == np.dtype(dtype) and out.dtype.isnative
    np.testing.assert_allclose(out.numpy(), [0.09003057, 0.24472847, 0.66524096], rtol=1e-6)
    a = np.arange(6, dtype=f"{order}{dtype}").reshape(2, 3)
    b = np.array([[1, 0], [0, 1], [1, 1]], f"{order}{dtype}")
    np.testing.assert_array_equal(opr.matmul(a, b, device=device).numpy(), [[2, 3], [8, 9]])
    t = opr.tensor(a, device=device)
    assert t.dtype.isnative
    np.testing.assert_array_equal(t.numpy(), np.arange(6).reshape(2, 3))


def test_finding_1_mixed_big_endian_and_native_operands(device):
    from conftest import dtypes_on

    if "float64" not in dtypes_on(device, "matmul"):
        pytest.skip(f"no float64 kernels on {device.name}")
    a = np.arange(6, dtype=">f4").reshape(2, 3)
    b = np.array([[1, 0], [0, 1], [1, 1]], np.float64)
    out = opr.matmul(a, b, device=device)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out.numpy(), [[2, 3], [8, 9]])
    out = opr.matmul(a, b.astype(">f8")[::1], device=device)
    np.testing.assert_array_equal(out.numpy(), [[2, 3], [8, 9]])


# -- the arithmetic operators: the operators add, sub, mul, div, matmul, neg ------------------------------
def test_tensor_operators_call_the_operators(monkeypatch):
    """``+ - * / @`` and unary ``-`` (reflected forms and NumPy's ufuncs included) reach the
    operators through ``config.OPERATORS`` at call time (tensor.py sits below ``opruntime.ops``)."""
    import opruntime.config

    calls = []
    for name in ("add", "sub", "mul", "div", "matmul", "neg"):
        monkeypatch.setitem(opruntime.config.OPERATORS, name,
                            lambda *xs, _n=name: calls.append((_n, tuple(type(x).__name__ for x in xs))) or _n)
    t = opr.tensor(np.ones((2, 2), np.float32), device="cpu")
    x = np.ones((2, 2), np.float32)
    got = [t + t, 1.0 + t, t - 2, 1.0 - t, t * x, 2 * t, t / 2.0, 3.0 / t, t @ t, x @ t, -t, x - t, np.matmul(x, t),
           np.negative(t)]
    assert got == ["add", "add", "sub", "sub", "mul", "mul", "div", "div", "matmul", "matmul", "neg", "sub", "matmul",
                   "neg"]
    assert calls[1] == ("add", ("float", "Tensor")) and calls[3] == ("sub", ("float", "Tensor"))
    assert calls[9] == ("matmul", ("ndarray", "Tensor")) and calls[11] == ("sub", ("ndarray", "Tensor"))
    assert +t is t


def test_tensor_arithmetic_matches_numpy(device, rng):
    a = rng.standard_normal((3, 5)).astype(np.float32)
    b = (np.abs(rng.standard_normal((3, 5))) + 0.5).astype(np.float32)
    row = rng.standard_normal(5).astype(np.float32)
    w = rng.standard_normal((5, 4)).astype(np.float32)
    ta, tb = opr.tensor(a, device=device), opr.tensor(b, device=device)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    for got, want in [
        (ta + tb, a64 + b64), (ta - tb, a64 - b64), (ta * tb, a64 * b64), (ta / tb, a64 / b64), (-ta, -a64),
        (1.0 - ta, 1.0 - a64), (2 * ta, 2 * a64), (ta / 4.0, a64 / 4.0), (3.0 / tb, 3.0 / b64), (ta + 1, a64 + 1),
        (ta + row, a64 + row), (row * ta, row * a64), (a - tb, a64 - b64),  # host operands, broadcasting
        (ta @ w, a64 @ w), (w.T @ ta.T, w.T.astype(np.float64) @ a64.T), (ta.T[1:] @ tb, a64.T[1:] @ b64),
        (2 * (ta @ w) + 1.0, 2 * (a64 @ w) + 1.0),
    ]:
        assert isinstance(got, opr.Tensor) and got.device == device and got.dtype == np.float32
        assert compare(got.numpy(), want, "float32") is None, compare(got.numpy(), want, "float32")


def test_a_python_number_keeps_a_float16_tensor_float16():
    t = opr.tensor(np.array([1.0, 2.0, 3.0], np.float16), device="cpu")
    for out in (t * 2, 2.5 + t, t - 1.0, 1.0 / t):
        assert out.dtype == np.float16
    np.testing.assert_array_equal((t * 2).numpy(), np.array([2, 4, 6], np.float16))


def test_other_numpy_functions_still_get_the_host_values():
    t = opr.tensor(np.array([0.0, 1.0], np.float32), device="cpu")
    out = np.exp(t)
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, [1.0, np.e], rtol=1e-6)
    x = np.zeros(2, np.float32)
    x += t  # into a NumPy array: NumPy's own add, writing x
    np.testing.assert_array_equal(x, [0.0, 1.0])
    with pytest.raises(opr.errors.InputTypeError, match="a Tensor cannot be written into"):
        np.exp(x, out=t)
