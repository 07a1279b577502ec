"""First use of the cpu softmax / log_softmax along a strided axis (issue 16: compiled on first use,
cached across processes): its two loops are called by address from one ``prange`` wrapper
(``_nb_rows.par_cols``); a later process loads the loops and the wrapper, typed with a first-class
function, from the disk cache instead of compiling them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("numba")

OPS = ("softmax", "log_softmax")


def _first_uses(cache: str) -> dict[str, float]:
    code = textwrap.dedent("""
        import numpy as np, opruntime as opr
        from opruntime_numpy import jit
        x = np.random.default_rng(0).standard_normal((1031, 300)).astype(np.float32)  # parallel, odd sizes
        for op in ("softmax", "log_softmax"):
            with opr.override(ops={op: {"kernel": f"numpy.{op}.numba"}}, strict=True):
                got = np.asarray(getattr(opr, op)(x, axis=0), np.float64)
            ref = opr.ops.OPS[op].reference(x.astype(np.float64), axis=0)
            assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5, op
            print(op, jit.COMPILE_S[f"numpy.{op}.numba"])
    """)
    env = {**os.environ, "OPRUNTIME_CACHE_DIR": cache}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {line.split()[0]: float(line.split()[1]) for line in proc.stdout.splitlines() if line.split()[0] in OPS}


@pytest.mark.slow
def test_strided_softmax_loads_from_the_disk_cache(tmp_path):
    cache = str(tmp_path / "c")
    first = _first_uses(cache)
    second = _first_uses(cache)
    assert set(first) == set(second) == set(OPS)
    # log_softmax reuses softmax's loops and wrapper (log is an argument): its first use is short already
    assert second["softmax"] < 0.5 and second["softmax"] < first["softmax"] / 3, (first, second)
    assert second["log_softmax"] < 0.5, (first, second)
