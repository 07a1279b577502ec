"""batch_norm where the output is small against the running mean: every kernel, float32.

Folding the statistics into ``y = x * scale + shift`` with ``shift = bias - mean * scale`` rounds
``x * scale`` and ``shift`` to the dtype before they cancel, so each element carries an error of
about an ulp of ``|mean * scale|`` (here ~100), not of ``|y|`` (here ~0.01): a relative error near
1e-3 in float32. Computing ``(x - mean) * scale + bias`` keeps it at the dtype's rounding, since
``x - mean`` is exact when x is near the mean (Sterbenz). The tolerance is the suite's own.

The ``device`` fixture runs this on every device present; on CUDA devices (and GPU OpenCL / JAX
ones) conftest marks it ``gpu``.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import TOLERANCE, rel_err

import opruntime as opr
from opruntime.config import override
from opruntime.ops import OPS
from opruntime.plugins import registry

#: (x shape, weight given, bias given): planes of 1 (a 2-D input: CUDA's flat family), odd planes
#: (scalar access), planes of a multiple of 16 bytes (CUDA's 128-bit planes family)
SHAPES = [((7, 5), True, True), ((3, 4, 7, 5), True, True), ((2, 3, 64), True, False), ((2, 6, 8, 8), False, True),
          ((1, 1), False, False), ((2, 3, 1024), True, True)]


def draw(rng: np.random.Generator, shape: tuple[int, ...], has_w: bool, has_b: bool) -> list[np.ndarray | None]:
    """x within a few hundredths of a running mean of about +-100 per channel, var near 1 (so
    ``scale`` is near the weight), weight near 1, bias a few hundredths: the output is ~0.01."""
    c = shape[1]
    per_channel = (1, c) + (1,) * (len(shape) - 2)
    mean = (rng.choice([-1.0, 1.0], c) * rng.uniform(80.0, 120.0, c)).astype(np.float32)
    var = rng.uniform(0.5, 1.5, c).astype(np.float32)
    x = (mean.reshape(per_channel) + 0.01 * rng.standard_normal(shape)).astype(np.float32)
    w = rng.uniform(0.9, 1.1, c).astype(np.float32) if has_w else None
    b = (0.01 * rng.standard_normal(c)).astype(np.float32) if has_b else None
    return [x, mean, var, w, b]


def reference(args: list[np.ndarray | None]) -> np.ndarray:
    wide = [None if a is None else a.astype(np.float64) for a in args]
    return OPS["batch_norm"].reference(*wide, eps=1e-5)


@pytest.mark.parametrize("shape,has_w,has_b", SHAPES, ids=[str(s[0]) for s in SHAPES])
def test_output_near_zero_against_a_large_mean(device, shape, has_w, has_b):
    kernels = registry().kernels_for("batch_norm", device.kind)
    if not kernels:
        pytest.skip(f"no batch_norm kernel for {device.kind}")
    rng = np.random.default_rng(14)
    errors = {}
    for k in kernels:
        for _ in range(3):
            args = draw(rng, shape, has_w, has_b)
            ref = reference(args)
            with override(ops={"batch_norm": {"kernel": k.name}}, strict=True):
                out = opr.batch_norm(*args, eps=1e-5, device=device)
            assert out.device == device and out.dtype == np.float32
            errors[k.name] = max(errors.get(k.name, 0.0), rel_err(np.asarray(out.numpy(), np.float64), ref))
    bad = {name: f"{e:.2e}" for name, e in errors.items() if not e <= TOLERANCE["float32"]}
    assert not bad, f"relative error > {TOLERANCE['float32']:.0e} (float32): {bad}"
