"""Tensor and device handles."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import opruntime as opr


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


@pytest.mark.parametrize("args", [["info"], ["info", "--json"], ["explain", "matmul", "--shape", "3x4,4x5"],
                                  ["bench", "softmax", "--shape", "8x16", "--repeats", "2", "--peers", "numpy"]])
def test_cli(args, tmp_path):
    out = subprocess.run([sys.executable, "-m", "opruntime.cli", *args], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()


def test_cli_bench_json(tmp_path):
    path = tmp_path / "b.json"
    out = subprocess.run([sys.executable, "-m", "opruntime.cli", "bench", "matmul", "--shape", "16x16,16x16",
                          "--repeats", "2", "--kernels", "--json", str(path), "--device", "cpu"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    import json

    rec = json.loads(path.read_text())["results"][0]
    assert rec["op"] == "matmul" and rec["time_s"] > 0 and rec["kernel"] == "numpy.matmul.blas"
    assert "numpy" in rec["peers"] and rec["candidates"]


def test_host_operands_are_placed_on_every_call(fake, rng):
    with opr.device("fake:1"):
        for _ in range(3):  # the first call builds the plan, the next ones take the cached path
            a, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)
            out = opr.matmul(a, b)
            assert out.device.name == "fake:1" and out.data.__class__.__name__ == "FakeArray"
            np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5)
    assert fake.calls["run:a"] == 3
