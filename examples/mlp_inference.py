"""A small MLP forward pass (784 -> 256 -> 10) through opruntime: matmul + softmax.

The device comes from configuration, not from this code: the default is the best present device;
choose another with ``OPRUNTIME_DEVICE="opencl:0,cpu"`` (a priority list), an ``opruntime.toml``
or ``[tool.opruntime]`` in pyproject.toml (see ``device_config/``). The weights are uploaded once
and stay on the device; each batch is one upload and one download.

opruntime supplies the heavy operators (matmul, conv2d, softmax); elementwise steps (bias, ReLU)
here use the device array's own library when it has NumPy semantics and the host otherwise.

    python examples/mlp_inference.py [--batch 64] [--batches 5]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time

import numpy as np

import opruntime as opr
from opruntime.testing.numerics import rel_err


def relu_bias(t: opr.Tensor, bias: np.ndarray) -> opr.Tensor:
    """max(t + bias, 0), kept on t's device where that is free (the cpu device computes in place)."""
    h = t.numpy()  # no copy on the cpu device; one download elsewhere
    return opr.tensor(np.maximum(h + bias, 0.0), device=t.device)


class MLP:
    def __init__(self, sizes: list[int], rng: np.random.Generator) -> None:
        self.host = [((rng.standard_normal((m, n)) / np.sqrt(m)).astype(np.float32),
                      0.1 * rng.standard_normal(n).astype(np.float32)) for m, n in itertools.pairwise(sizes)]
        # no device named: the configured one (uploaded once; the weights stay there)
        self.weights = [(opr.tensor(w), b) for w, b in self.host]
        self.device = self.weights[0][0].device

    def __call__(self, x: np.ndarray) -> opr.Tensor:
        h = opr.tensor(x, device=self.device)
        for i, (w, b) in enumerate(self.weights):
            h = opr.matmul(h, w)
            if i < len(self.weights) - 1:
                h = relu_bias(h, b)
            else:
                h = opr.tensor(h.numpy() + b, device=h.device)
        return opr.softmax(h, axis=-1)

    def reference(self, x: np.ndarray) -> np.ndarray:
        h = x.astype(np.float64)
        for i, (w, b) in enumerate(self.host):
            h = h @ w + b
            if i < len(self.host) - 1:
                h = np.maximum(h, 0.0)
        return opr.ops.OPS["softmax"].reference(h, axis=-1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--batches", type=int, default=5)
    args = p.parse_args()

    rng = np.random.default_rng(0)
    model = MLP([784, 256, 10], rng)
    origin = opr.config.settings().origin.get("device", "default: the best present device")
    print(f"device: {model.device!r} ({origin}); present: {', '.join(d.name for d in opr.devices())}")
    x0 = rng.standard_normal((args.batch, 784)).astype(np.float32)
    print(opr.explain("matmul", x0, model.weights[0][0]))

    assert model(x0).dtype == np.float32
    worst = elapsed = 0.0
    for _ in range(args.batches):
        x = rng.standard_normal((args.batch, 784)).astype(np.float32)
        t0 = time.perf_counter()
        probs = model(x).numpy()
        elapsed += time.perf_counter() - t0
        ref = model.reference(x)
        worst = max(worst, rel_err(probs, ref))
    dt = elapsed / args.batches
    sums = probs.sum(axis=1)
    print(f"{args.batches} batches of {args.batch}: {dt * 1e3:.2f} ms per batch; predicted classes "
          f"{probs.argmax(axis=1)[:8].tolist()}...; rows sum to {sums.min():.6f}..{sums.max():.6f}")
    print(f"relative error vs float64 reference: {worst:.2e}")
    if not worst < 1e-5:
        print("FAILED: the result differs from the reference", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
