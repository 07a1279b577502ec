"""ResNet-50 (random weights, eval mode) run with opruntime calls only, checked against PyTorch.

The torch model is ``torchvision.models.resnet50()`` when torchvision imports, else
:func:`torch_resnet50`, a copy of torchvision's ResNet-50 written here with ``torch.nn``: the same
modules under the same names (``conv1``, ``bn1``, ``layer1`` .. ``layer4`` of ``Bottleneck``
blocks with ``conv1/bn1/conv2/bn2/conv3/bn3/downsample``, ``fc``), the stride on the 3x3 conv
(ResNet v1.5) and the same initialisation, so state_dicts load into either.

:class:`OprResNet50` runs the same function with ``opr.conv2d`` (bias and ReLU fused:
``activation="relu"``), ``opr.max_pool2d``, ``opr.add(out, identity, activation="relu")`` for the
residuals (the add and its ReLU one kernel, one pass),
``opr.adaptive_avg_pool2d`` and ``opr.linear``. Batch norm is folded into the convolutions'
weights by :func:`fold_batch_norm` (the default), or run as ``opr.batch_norm`` after each
convolution (``fold=False``, ``--no-fold``).

The weights are random (seeded). The batch norms get random affine parameters and running
statistics measured on one random batch (as a trained network's are), so that the activations keep
their scale through the 50 layers, which float16 needs, and folding is not an identity.

``main()`` runs the model on every device present (or those named by ``--device``) in float32,
and in float16 on accelerators, and compares the logits with PyTorch float32 on the CPU on the same
input: relative error (max abs error / max abs reference) at most 1e-3 in float32 and
:data:`TOLERANCE` ``["float16"]`` in float16. ``opruntime bench --suite models`` times
:func:`build`'s model against PyTorch eager and ONNX Runtime.

    python examples/resnet50.py                              # batch 1, 64x64 images
    python examples/resnet50.py --batch 32 --size 224 --device cuda:0

Needs torch (``pip install opruntime[models]``) for the weights and the comparison.
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

import opruntime as opr

try:
    import torch
    from torch import nn
except ImportError:  # pragma: no cover - the message says what to do
    raise SystemExit("resnet50.py needs torch for the weights and the comparison: "
                     "pip install 'opruntime[models]' (or pip install torch)") from None

#: the largest relative error (max abs error / max abs reference) of the logits accepted against
#: PyTorch float32: float32 as the issue asks; float16 rounds the weights and every activation to 11
#: bits, 88 times on the way (53 convolutions, 16 residual adds, ...): simulated (float32 arithmetic,
#: every operand and result rounded to float16; three seeds) the logits' error is 1.6e-3 at 224x224
#: and 3-5e-3 at 32x32 and 64x64 (fewer positions averaged by the final pool)
TOLERANCE = {"float32": 1e-3, "float16": 2e-2}


# -- torchvision's ResNet-50, for machines where torchvision does not import ----------------------
def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class Bottleneck(nn.Module):
    """torchvision's ``Bottleneck`` (groups 1, base width 64): 1x1, 3x3 (strided), 1x1 x4."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision's ``ResNet`` for Bottleneck blocks."""

    def __init__(self, layers: tuple[int, int, int, int] = (3, 4, 6, 3), num_classes: int = 1000) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, layers[0])
        self.layer2 = self._make_layer(128, layers[1], stride=2)
        self.layer3 = self._make_layer(256, layers[2], stride=2)
        self.layer4 = self._make_layer(512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * Bottleneck.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * Bottleneck.expansion:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes * Bottleneck.expansion, stride),
                                       nn.BatchNorm2d(planes * Bottleneck.expansion))
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * Bottleneck.expansion
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def torch_resnet50() -> nn.Module:
    """``torchvision.models.resnet50()`` (random weights) when torchvision imports, else :class:`ResNet`."""
    try:
        import torchvision

        return torchvision.models.resnet50()
    except Exception:  # not installed, or a binary that does not match this torch
        return ResNet()


def calibrate(module: nn.Module, seed: int = 0, batch: int = 4, size: int = 48) -> nn.Module:
    """Random batch-norm affine parameters, and running statistics measured on one random batch
    (the module is left in eval mode). At 48x48 the last stage still sees 2x2 positions per image:
    16 values per channel.

    As in trained ResNets, the last batch norm of each residual branch (``bn3``) scales down
    (weights in [0.1, 0.4]; the others in [0.5, 1.5]), so that the residual stream does not grow
    block after block (with weights near 1 it reaches ~100 in layer4, and float16 loses 4e-2 of
    the logits on the way)."""
    gen = torch.Generator().manual_seed(seed)
    norms = {name: m for name, m in module.named_modules() if isinstance(m, nn.BatchNorm2d)}
    with torch.no_grad():
        for name, bn in norms.items():
            low, high = (0.1, 0.4) if name.endswith("bn3") else (0.5, 1.5)
            bn.weight.copy_(low + (high - low) * torch.rand(bn.num_features, generator=gen))
            bn.bias.copy_(0.1 * torch.randn(bn.num_features, generator=gen))
            bn.reset_running_stats()
            bn.momentum = None  # a cumulative average: after one batch, that batch's statistics
        module.train()
        module(torch.randn(batch, 3, size, size, generator=gen))
    for bn in norms.values():
        bn.momentum = 0.1
    return module.eval()


# -- the same network through opruntime -----------------------------------------------------------
def _host(t: Any) -> np.ndarray:
    """A torch tensor (or anything array-like) as a float64 NumPy array."""
    if isinstance(t, torch.Tensor):
        t = t.detach().cpu().double().numpy()
    return np.asarray(t, np.float64)


def fold_batch_norm(conv_w: Any, conv_b: Any, bn: Any) -> tuple[np.ndarray, np.ndarray]:
    """Fold an inference batch norm into the convolution before it: (weight, bias) in float32 such
    that ``conv2d(x, weight, bias) == batch_norm(conv2d(x, conv_w, conv_b), ...)``.

    Args:
        conv_w: the convolution's weight (O, C, kH, kW) (torch tensor or array).
        conv_b: its bias (O,), or None.
        bn: the batch norm: anything with ``running_mean``, ``running_var``, ``weight``, ``bias``
            (None: 1 and 0) and ``eps``, e.g. a ``torch.nn.BatchNorm2d``.
    """
    w = _host(conv_w)
    scale = 1.0 / np.sqrt(_host(bn.running_var) + bn.eps)
    if bn.weight is not None:
        scale = scale * _host(bn.weight)
    shift = -_host(bn.running_mean) * scale
    if conv_b is not None:
        shift = shift + _host(conv_b) * scale
    if bn.bias is not None:
        shift = shift + _host(bn.bias)
    return (w * scale[:, None, None, None]).astype(np.float32), shift.astype(np.float32)


class ConvBN:
    """A convolution and the batch norm after it, optionally followed by a ReLU, on a device."""

    def __init__(self, conv: nn.Conv2d, bn: nn.BatchNorm2d, device: opr.Device, dtype: str, fold: bool) -> None:
        self.stride, self.padding = conv.stride, conv.padding
        put: Callable[[Any], opr.Tensor] = lambda a: opr.tensor(np.asarray(a, np.float32), device=device, dtype=dtype)  # noqa: E731
        if fold:
            w, b = fold_batch_norm(conv.weight, conv.bias, bn)
            self.weight, self.bias, self.norm = put(w), put(b), None
        else:
            self.weight = put(_host(conv.weight))
            self.bias = None if conv.bias is None else put(_host(conv.bias))
            self.norm = (put(_host(bn.running_mean)), put(_host(bn.running_var)), put(_host(bn.weight)),
                         put(_host(bn.bias)), bn.eps)

    def __call__(self, x: opr.Tensor, relu: bool) -> opr.Tensor:
        if self.norm is None:  # folded: one kernel does conv + bias + ReLU
            return opr.conv2d(x, self.weight, self.bias, stride=self.stride, padding=self.padding,
                              activation="relu" if relu else None)
        y = opr.conv2d(x, self.weight, self.bias, stride=self.stride, padding=self.padding)
        mean, var, weight, bias, eps = self.norm
        y = opr.batch_norm(y, mean, var, weight, bias, eps=eps)
        return opr.relu(y) if relu else y


class OprBottleneck:
    """A Bottleneck block: three ConvBNs, the shortcut (a strided 1x1 ConvBN or the identity), and
    the residual's add and ReLU as one fused kernel."""

    def __init__(self, block: nn.Module, device: opr.Device, dtype: str, fold: bool) -> None:
        self.c1 = ConvBN(block.conv1, block.bn1, device, dtype, fold)
        self.c2 = ConvBN(block.conv2, block.bn2, device, dtype, fold)
        self.c3 = ConvBN(block.conv3, block.bn3, device, dtype, fold)
        down = block.downsample
        self.down = None if down is None else ConvBN(down[0], down[1], device, dtype, fold)

    def __call__(self, x: opr.Tensor) -> opr.Tensor:
        out = self.c3(self.c2(self.c1(x, relu=True), relu=True), relu=False)
        identity = x if self.down is None else self.down(x, relu=False)
        return opr.add(out, identity, activation="relu")  # relu(out + identity) in one pass


class OprResNet50:
    """A torchvision-structured ResNet-50's forward pass with opruntime calls, its weights uploaded
    once to ``device`` in ``dtype``; batch norm folded into the convolutions unless ``fold=False``."""

    def __init__(self, module: nn.Module, device: opr.Device | str, dtype: str = "float32", fold: bool = True) -> None:
        self.device, self.dtype = opr.Device(device), dtype
        self.stem = ConvBN(module.conv1, module.bn1, self.device, dtype, fold)
        self.blocks = [OprBottleneck(b, self.device, dtype, fold)
                       for layer in (module.layer1, module.layer2, module.layer3, module.layer4) for b in layer]
        self.fc = (opr.tensor(_host(module.fc.weight).astype(np.float32), device=self.device, dtype=dtype),
                   opr.tensor(_host(module.fc.bias).astype(np.float32), device=self.device, dtype=dtype))

    def __call__(self, x: opr.Tensor) -> opr.Tensor:
        """Logits (N, 1000) of images x (N, 3, H, W), a Tensor on the model's device."""
        h = opr.max_pool2d(self.stem(x, relu=True), 3, stride=2, padding=1)
        for block in self.blocks:
            h = block(h)
        h = opr.adaptive_avg_pool2d(h, 1)  # (N, 2048, 1, 1)
        return opr.linear(h.reshape(h.shape[0], h.shape[1]), *self.fc)


@functools.lru_cache(maxsize=2)
def random_resnet50(seed: int = 0) -> nn.Module:
    """A random-weight ResNet-50 with calibrated batch norms (:func:`calibrate`), in eval mode; made
    once per seed and shared by every :func:`build` of that seed: do not change it."""
    torch.manual_seed(seed)
    return calibrate(torch_resnet50(), seed)


class Built(NamedTuple):
    """What :func:`build` gives: the opruntime model, the torch module it was made from, an input."""

    ours: OprResNet50
    module: nn.Module  # float32 on the CPU, eval mode (shared: see random_resnet50)
    x: np.ndarray  # float32 (N, 3, size, size)


def build(device: opr.Device | str, dtype: str = "float32", *, batch: int = 1, size: int = 64, fold: bool = True,
          seed: int = 0) -> Built:
    """A random-weight ResNet-50 (seeded), its opruntime twin on ``device`` in ``dtype`` and a
    random input of ``batch`` images of ``size`` x ``size`` (the bench reuses this)."""
    module = random_resnet50(seed)
    x = np.random.default_rng(seed).standard_normal((batch, 3, size, size)).astype(np.float32)
    return Built(OprResNet50(module, device, dtype, fold), module, x)


def torch_forward(module: nn.Module, x: np.ndarray) -> np.ndarray:
    """The torch module's output for x, in float64 on the host."""
    with torch.inference_mode():
        return module(torch.from_numpy(x)).double().numpy()


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """max |out - ref| / max |ref| (inf when out has a NaN or an inf)."""
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    if out.shape != ref.shape:
        raise ValueError(f"shape {out.shape} differs from the reference's {ref.shape}")
    if not np.isfinite(out).all():
        return math.inf
    return float(np.abs(out - ref).max() / np.abs(ref).max())


def check(device: opr.Device, dtype: str, *, repeats: int = 3, **options: Any) -> tuple[float, float]:
    """Run the model on ``device`` in ``dtype`` and compare the logits with torch float32 on the
    CPU: (relative error, seconds per forward pass)."""
    built = build(device, dtype, **options)
    x = opr.tensor(built.x, device=device, dtype=dtype)
    out = built.ours(x).numpy()  # the first call plans every operator
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        built.ours(x).numpy()
        times.append(time.perf_counter() - t0)
    return relative_error(out, torch_forward(built.module, built.x)), statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    """Check the model on every device present (float32; float16 too on accelerators)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--size", type=int, default=64, help="image height and width (224 for ImageNet's)")
    p.add_argument("--no-fold", dest="fold", action="store_false",
                   help="run batch norm as opr.batch_norm instead of folding it into the convolutions")
    p.add_argument("--device", action="append", help="a device to run on (repeatable; default: every device present)")
    p.add_argument("--repeats", type=int, default=3, help="timed forward passes per device")
    args = p.parse_args(argv)
    print(f"ResNet-50 batch {args.batch} at {args.size}x{args.size}, batch norm "
          f"{'folded into the convolutions' if args.fold else 'as opr.batch_norm'}; "
          f"devices: {', '.join(d.name for d in opr.devices())}")
    failed = False
    devices = [opr.Device(n) for n in args.device] if args.device else list(opr.devices())
    for device in devices:
        for dtype in ("float32", "float16") if device.provider.accelerator else ("float32",):
            try:
                err, dt = check(device, dtype, repeats=args.repeats, batch=args.batch, size=args.size, fold=args.fold)
            except opr.errors.DtypeError as exc:  # no kernel for this dtype on this device
                print(f"{device.name:<12} {dtype:<8} skipped: {exc}")
                continue
            except opr.errors.OpRuntimeError as exc:  # an operator that does not run here: say which, go on
                failed = True
                print(f"{device.name:<12} {dtype:<8} FAILED: {type(exc).__name__}: {exc}")
                continue
            ok = err <= TOLERANCE[dtype]
            failed |= not ok
            print(f"{device.name:<12} {dtype:<8} {dt * 1e3:9.2f} ms per forward; logits' relative error vs torch "
                  f"float32 {err:.2e} (bound {TOLERANCE[dtype]:.0e}){'' if ok else '  FAILED'}")
    if failed:
        print("FAILED: the logits differ from PyTorch's", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
