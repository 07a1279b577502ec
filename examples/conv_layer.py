"""A convolution block through opruntime: a MobileNet-style stack of a 3x3 convolution with
bias, a depthwise 3x3 (groups = channels) with stride 2, and a 1x1 pointwise convolution, then a
classifier (global average pool, matmul, log_softmax).

The three convolutions are the same operator with different attributes; opruntime picks a kernel
per exact problem, and this script prints which one and why (``opr.explain``). The device comes
from configuration (``OPRUNTIME_DEVICE=...``, see ``device_config/``).

    python examples/conv_layer.py [--batch 8] [--size 32]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import opruntime as opr
from opruntime.ops import OPS
from opruntime.testing.numerics import rel_err


def relu(t: opr.Tensor) -> opr.Tensor:
    return opr.tensor(np.maximum(t.numpy(), 0.0), device=t.device)  # elementwise: on the host


class Block:
    def __init__(self, cin: int, cmid: int, cout: int, classes: int, rng: np.random.Generator) -> None:
        def init(*shape: int) -> np.ndarray:
            return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

        self.host = {"w1": init(cmid, cin, 3, 3), "b1": init(1, cmid)[0], "dw": init(cmid, 1, 3, 3),
                     "pw": init(cout, cmid, 1, 1), "fc": init(cout, classes)}
        self.dev = {k: opr.tensor(v) for k, v in self.host.items()}  # on the configured device
        self.device = self.dev["w1"].device

    def __call__(self, x: np.ndarray, explain: bool = False) -> opr.Tensor:
        h = opr.tensor(x, device=self.device)
        steps = [(self.dev["w1"], self.dev["b1"], {"padding": 1}),
                 (self.dev["dw"], None, {"stride": 2, "padding": 1, "groups": self.host["dw"].shape[0]}),
                 (self.dev["pw"], None, {})]
        for w, b, attrs in steps:
            if explain:
                print(opr.explain("conv2d", h, w, *([b] if b is not None else []), **attrs), end="\n\n")
            h = relu(opr.conv2d(h, w, b, **attrs))
        pooled = h.numpy().mean(axis=(2, 3))  # global average pool (N, C)
        return opr.log_softmax(opr.matmul(opr.tensor(pooled, device=self.device), self.dev["fc"]), axis=-1)

    def reference(self, x: np.ndarray) -> np.ndarray:
        conv, p = OPS["conv2d"].reference, self.host
        h = np.maximum(conv(x, p["w1"], p["b1"], padding=1), 0)
        h = np.maximum(conv(h, p["dw"], None, stride=2, padding=1, groups=p["dw"].shape[0]), 0)
        h = np.maximum(conv(h, p["pw"], None), 0)
        return OPS["log_softmax"].reference(h.mean(axis=(2, 3)) @ p["fc"].astype(np.float64), axis=-1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--size", type=int, default=32, help="image height and width")
    args = p.parse_args()

    rng = np.random.default_rng(0)
    block = Block(cin=3, cmid=32, cout=64, classes=10, rng=rng)
    print(f"device: {block.device!r}\n")
    x = rng.standard_normal((args.batch, 3, args.size, args.size)).astype(np.float32)
    out = block(x, explain=True).numpy()  # the first call plans (and compiles, on a GPU)
    t0 = time.perf_counter()
    out = block(x).numpy()
    dt = time.perf_counter() - t0
    ref = block.reference(x)
    err = rel_err(out, ref)
    print(f"batch {args.batch} x 3 x {args.size} x {args.size} -> {out.shape}: {dt * 1e3:.2f} ms; "
          f"relative error vs float64 reference: {err:.2e}")
    if not err < 1e-5:
        print("FAILED: the result differs from the reference", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
