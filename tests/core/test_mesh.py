"""``opr.mesh``: one operator spread over several devices (issue 19).

Here: the meshes every machine can make (the NumPy ``cpu`` device alone, JAX's first host
device), the refusals, and the operators' hooks. The sharded operators on 8 devices are in
``mesh_jax8.py``, run by :func:`test_sharded_operators_on_8_jax_host_devices` in a process
whose JAX starts with 8 host devices (``XLA_FLAGS`` must be set before JAX starts, and this
session's JAX started with one).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import opruntime as opr
from opruntime.errors import AttributeValueError, DeviceError, DeviceMismatchError, InputTypeError
from opruntime.mesh import MeshTensor, counts
from opruntime.testing.numerics import TOLERANCE, rel_err

HERE = Path(__file__).resolve().parent


def test_counts_split_as_array_split():
    for n in (0, 1, 7, 8, 13, 64):
        assert counts(n, 8) == [len(p) for p in np.array_split(np.arange(n), 8)]


def test_a_mesh_of_the_cpu_device_runs_every_strategy(rng):
    m = opr.mesh(["cpu"])
    a, b = rng.standard_normal((7, 5)), rng.standard_normal((5, 3))
    ta = opr.tensor(a, device=m)
    assert isinstance(ta, MeshTensor) and ta.device == m and ta.shape == (7, 5) and ta.counts == (7,)
    out = opr.matmul(ta, b)
    assert isinstance(out, MeshTensor) and out.axis == 0
    assert rel_err(out.numpy(), a @ b) <= TOLERANCE["float64"]
    k = opr.matmul(opr.mesh(["cpu"], axis=-1).shard(a), m.shard(b))  # along K: the one-member "sum"
    assert k.axis is None and rel_err(k.numpy(), a @ b) <= TOLERANCE["float64"]
    assert opr.explain("matmul", ta, b).strategy.kind == "shards"
    s = opr.softmax(ta, axis=0)  # along the split axis: whole, on the one member
    assert rel_err(s.numpy(), opr.OPS["softmax"].reference(a, axis=0)) <= TOLERANCE["float64"]


def test_with_device_mesh_and_device_argument(rng):
    m = opr.mesh(["cpu"])
    x = rng.standard_normal((4, 6)).astype(np.float32)
    with opr.device(m):
        t = opr.tensor(x)
        y = opr.relu(x)  # host data in the block: on the mesh
    assert isinstance(t, MeshTensor) and isinstance(y, MeshTensor)
    assert np.array_equal(y.numpy(), np.maximum(x, 0))
    assert not isinstance(opr.relu(x, device="cpu"), MeshTensor)  # outside the block: as before
    z = opr.relu(x, device=m)
    assert isinstance(z, MeshTensor) and np.array_equal(z.numpy(), y.numpy())


def test_mesh_tensor_reads_like_a_tensor(rng):
    m = opr.mesh(["cpu"])
    x = rng.standard_normal((3, 2)).astype(np.float32)
    t = opr.tensor(x, device=m, dtype="float64")
    assert t.dtype == np.float64 and t.ndim == 2 and t.size == 6 and len(t) == 3
    assert np.array_equal(np.asarray(t), x.astype(np.float64))
    assert "split along 0 (3,)" in repr(t) and "mesh(cpu)" in repr(t)
    host = t.numpy()
    host[0, 0] = 99.0  # a copy: the mesh tensor keeps its values
    assert t.numpy()[0, 0] == np.float64(x[0, 0])
    single = t.to("cpu")
    assert isinstance(single, opr.Tensor) and np.array_equal(single.numpy(), x.astype(np.float64))
    assert m.replicate(x).layout() == "replicated" and opr.tensor(t) is t
    with pytest.raises(InputTypeError, match="opr.tensor"):
        opr.Tensor(x, device=m)


def test_mesh_refusals(fake):
    with pytest.raises(DeviceError, match="one kind"):
        opr.mesh(["cpu", "fake:0"])
    with pytest.raises(DeviceError, match="more than once"):
        opr.mesh(["fake:0", "fake:0"])
    with pytest.raises(DeviceError, match="non-empty list"):
        opr.mesh([])
    with pytest.raises(DeviceError, match="no collective engine"):
        opr.mesh(["fake:0", "fake:1"])  # a kind without DeviceProvider.mesh_engine
    with pytest.raises(AttributeValueError, match="axis"):
        opr.mesh(["cpu"], axis="rows")
    with pytest.raises(AttributeValueError, match="policy"):
        opr.mesh(["cpu"], policy="sometimes")
    with pytest.raises(AttributeValueError, match="out of range"):
        opr.mesh(["cpu"], axis=2).shard(np.ones((2, 2)))


def test_single_device_operands_are_not_moved_silently(rng):
    m = opr.mesh(["cpu"])
    x = rng.standard_normal((4, 4)).astype(np.float32)
    with pytest.raises(DeviceMismatchError, match="mesh"):
        opr.add(opr.tensor(x, device=m), opr.tensor(x, device="cpu"))
    with pytest.raises(DeviceMismatchError):
        opr.relu(opr.tensor(x, device=m), device="cpu")


def test_sharded_operators_on_8_jax_host_devices():
    """``mesh_jax8.py`` in a process with 8 JAX host devices (every sharded operator against its
    float64 reference, uneven / size-1 / size-0 splits, the small-problem rule)."""
    pytest.importorskip("jax")
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / "mesh_jax8.py")],
                         capture_output=True, text=True, env=env, cwd=HERE.parent.parent, timeout=600)
    tail = (run.stdout + run.stderr)[-4000:]
    assert run.returncode == 0, tail
    assert " passed" in tail and "skipped" not in tail, tail
