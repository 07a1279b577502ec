"""Two real models end to end: the GPT-2 block and ResNet-50 of ``examples/``, run with opruntime
calls only on every device present, against PyTorch float32 on the CPU on the same input.

The models are the examples' own (loaded by ``opruntime.tools.models.load``, as the bench loads
them); the bounds are the examples' ``TOLERANCE`` (relative error: max abs error / max abs
reference; 1e-4 for the block and 1e-3 for ResNet-50's logits in float32). Sizes are small (CI
time): the block at B=2, S=64, d=128, 4 heads; ResNet-50 at batch 1, 64x64 (32x32 on OpenCL,
whose CPU device compiles a program per convolution shape). On the GPU machine the same tests run
on cuda:0 (marked ``gpu`` by the conftest), with float16 beside float32. The ``models`` bench suite
runs here at its ``--quick`` sizes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import opruntime as opr

torch = pytest.importorskip("torch", reason="the models' weights and reference come from torch: "
                                            "pip install 'opruntime[models]'")

from opruntime.tools import models  # noqa: E402  (after the torch skip)

BLOCK = {"batch": 2, "seq": 64, "d_model": 128, "heads": 4}


def resnet_size(device: opr.Device) -> dict[str, int]:
    return {"batch": 1, "size": 32 if device.kind == "opencl" and not device.provider.accelerator else 64}


@pytest.fixture(scope="module")
def block_example():
    return models.load("transformer_block")


@pytest.fixture(scope="module")
def resnet_example():
    return models.load("resnet50")


def _forward(example, device: opr.Device, dtype: str, **sizes) -> tuple[float, float]:
    """(relative error vs torch float32 on the CPU, the example's bound) of one forward pass."""
    built = example.build(device, dtype, **sizes)
    out = built.ours(opr.tensor(built.x, device=device, dtype=dtype))
    assert out.device == device and out.dtype == np.dtype(dtype)
    return example.relative_error(out.numpy(), example.torch_forward(built.module, built.x)), example.TOLERANCE[dtype]


def test_transformer_block_matches_torch(block_example, device: opr.Device) -> None:
    err, tol = _forward(block_example, device, "float32", **BLOCK)
    assert err <= tol, f"GPT-2 block on {device.name}: relative error {err:.2e} > {tol:.0e}"


def test_resnet50_matches_torch(resnet_example, device: opr.Device) -> None:
    err, tol = _forward(resnet_example, device, "float32", **resnet_size(device))
    assert err <= tol, f"ResNet-50 on {device.name}: logits' relative error {err:.2e} > {tol:.0e}"


def test_resnet50_with_batch_norm_unfolded(resnet_example) -> None:
    err, tol = _forward(resnet_example, opr.Device("cpu"), "float32", batch=2, size=32, fold=False)
    assert err <= tol, f"ResNet-50 with opr.batch_norm: logits' relative error {err:.2e} > {tol:.0e}"


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["transformer_block", "resnet50"])
def test_models_in_float16_on_cuda(model: str) -> None:
    """float16 on the GPU against torch float32, within the example's float16 bound."""
    if "cuda" not in {d.kind for d in opr.devices()}:
        pytest.skip("no CUDA device here")
    example = models.load(model)
    sizes = BLOCK if model == "transformer_block" else {"batch": 2, "size": 224}  # see resnet50.TOLERANCE
    err, tol = _forward(example, opr.Device("cuda:0"), "float16", **sizes)
    assert err <= tol, f"{model} in float16 on cuda:0: relative error {err:.2e} > {tol:.0e}"


def test_fold_batch_norm_is_conv_then_batch_norm(resnet_example) -> None:
    rng = np.random.default_rng()
    conv = torch.nn.Conv2d(5, 7, 3, padding=1, bias=True).double()
    bn = torch.nn.BatchNorm2d(7).double().eval()
    with torch.no_grad():
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.2, 3.0)
        bn.weight.normal_()
        bn.bias.normal_()
    x = torch.from_numpy(rng.standard_normal((2, 5, 9, 11)))
    w, b = resnet_example.fold_batch_norm(conv.weight, conv.bias, bn)
    assert w.dtype == b.dtype == np.float32 and w.shape == (7, 5, 3, 3) and b.shape == (7,)
    with torch.no_grad():
        ref = bn(conv(x)).numpy()
        folded = torch.nn.functional.conv2d(x, torch.from_numpy(w.astype(np.float64)),
                                            torch.from_numpy(b.astype(np.float64)), padding=1).numpy()
    assert resnet_example.relative_error(folded, ref) < 1e-6  # float32 weights
    w0, b0 = resnet_example.fold_batch_norm(conv.weight, None, bn)  # a conv without bias
    with torch.no_grad():
        ref0 = bn(torch.nn.functional.conv2d(x, conv.weight, None, padding=1)).numpy()
        got0 = torch.nn.functional.conv2d(x, torch.from_numpy(w0.astype(np.float64)),
                                          torch.from_numpy(b0.astype(np.float64)), padding=1).numpy()
    assert resnet_example.relative_error(got0, ref0) < 1e-6


def test_resnet_copy_has_torchvision_names(resnet_example) -> None:
    """The fallback architecture's state_dict keys and shapes are torchvision's ResNet-50's."""
    state = resnet_example.ResNet().state_dict()
    assert len(state) == 320 and sum(v.numel() for k, v in state.items() if "running" not in k
                                     and "num_batches" not in k) == 25_557_032  # torchvision's count
    for key, shape in {"conv1.weight": (64, 3, 7, 7), "layer1.0.downsample.0.weight": (256, 64, 1, 1),
                       "layer2.0.conv2.weight": (128, 128, 3, 3), "layer4.2.bn3.running_var": (2048,),
                       "fc.weight": (1000, 2048)}.items():
        assert tuple(state[key].shape) == shape, key


@pytest.mark.gpu  # torchvision's binary matches torch on the GPU machine only (here it fails to import)
def test_resnet_copy_loads_torchvision_state_dict(resnet_example) -> None:
    try:
        import torchvision

        reference = torchvision.models.resnet50()
    except Exception as exc:
        pytest.skip(f"torchvision does not import here: {type(exc).__name__}: {exc}")
    ours = resnet_example.ResNet()
    assert [(k, tuple(v.shape)) for k, v in ours.state_dict().items()] == \
        [(k, tuple(v.shape)) for k, v in reference.state_dict().items()]
    ours.load_state_dict(reference.state_dict())
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        np.testing.assert_array_equal(ours.eval()(x).numpy(), reference.eval()(x).numpy())


def test_attention_is_causal(block_example) -> None:
    """Changing the last position changes no earlier position's output."""
    built = block_example.build("cpu", batch=1, seq=16, d_model=32, heads=2)
    x = built.x.copy()
    y0 = built.ours(opr.tensor(x, device="cpu")).numpy()
    x[:, -1] += 1.0
    y1 = built.ours(opr.tensor(x, device="cpu")).numpy()
    np.testing.assert_array_equal(y0[:, :-1], y1[:, :-1])
    assert not np.allclose(y0[:, -1], y1[:, -1])


# -- the models bench suite ------------------------------------------------------------------------
def test_models_suite_cases() -> None:
    cpu = opr.Device("cpu")
    full = {c.model: c for c in models.cases(cpu)}
    assert full["transformer_block"].sizes == {"batch": 8, "seq": 1024, "d_model": 768, "heads": 12}
    assert full["resnet50"].sizes == {"batch": 4, "size": 224} and "onnx" in full["resnet50"].peers
    assert {c.dtype for c in full.values()} == {"float32"}


def test_models_bench_quick(tmp_path: Path) -> None:
    from opruntime.tools.cli import main

    path = tmp_path / "models.json"
    assert main(["bench", "--suite", "models", "--quick", "--device", "cpu", "--repeats", "1",
                 "--output", str(path)]) == 0
    results = {r["op"]: r for r in json.loads(path.read_text())["results"]}
    assert set(results) == {"transformer_block", "resnet50"}
    for r in results.values():
        assert not r["error"] and r["time_s"] > 0 and r["flops"] > 0 and r["unit"] == "GFLOP/s"
        assert r["kernel"].endswith("operator calls") and r["ratios"]["torch"] > 0


@pytest.mark.gpu
def test_models_bench_quick_on_cuda() -> None:
    """The suite's GPU path: float16, torch eager on the CUDA device, the check against torch float32 there."""
    if "cuda" not in {d.kind for d in opr.devices()}:
        pytest.skip("no CUDA device here")
    results = models.run_suite([opr.Device("cuda:0")], quick=True, repeats=2)
    assert {r.op for r in results} == {"transformer_block", "resnet50"}
    for r in results:
        assert not r.error and r.dtype == "float16" and r.time_s > 0 and r.ratios()["torch"] > 0, r
