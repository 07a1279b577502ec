"""Run each operator on the device that ``opruntime.toml`` (beside this script) chooses for it.

    python examples/device_config/run.py          # or: cd examples/device_config && python run.py

Host data passed to an operator is placed on that operator's configured device; a Tensor stays
where it is (opruntime never moves data between devices silently), so each call below starts
from NumPy arrays. Try ``OPRUNTIME_DEVICE=cpu python run.py`` (the environment overrides the
file's global ``device``; the per-operator tables still apply) or edit the file.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import numpy as np

# Name the file explicitly so that the script works from any directory; without this, opruntime
# uses the nearest opruntime.toml / pyproject.toml above the working directory.
os.environ.setdefault("OPRUNTIME_CONFIG", str(Path(__file__).with_name("opruntime.toml")))

import opruntime as opr  # after the environment is set
from opruntime.config import settings
from opruntime.ops import OPS
from opruntime.testing.numerics import rel_err


def main() -> int:
    warnings.simplefilter("default", opr.errors.FallbackWarning)  # show each fallback once
    s = settings()
    print(f"configuration: {s!r}")
    print(f"present devices: {', '.join(d.name for d in opr.devices())}\n")

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((96, 80)).astype(np.float32), rng.standard_normal((80, 64)).astype(np.float32)
    x = rng.standard_normal((4, 3, 16, 16)).astype(np.float32)
    w = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    calls = [("matmul", (a, b), {}), ("softmax", (a,), {"axis": -1}), ("log_softmax", (a,), {"axis": 0}),
             ("conv2d", (x, w), {"padding": 1})]
    failed = 0
    for op, args, attrs in calls:
        out = getattr(opr, op)(*args, **attrs)
        chosen = opr.explain(op, *args, **attrs).chosen
        ref = OPS[op].reference(*args, **attrs)
        err = rel_err(out.numpy(), ref)
        failed += not err < 1e-5
        where = s.origin.get(f"ops.{op}", s.origin.get("device", "default"))
        print(f"{op:<12} on {out.device.name:<10} kernel {chosen:<34} rel. error {err:.1e}   (device from {where})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
