"""Lazy loading: a backend that declares its device kinds (``opruntime_device_kinds``) is loaded
when a device of those kinds is first needed, so a call on ``cpu`` imports no other device stack;
the full view (``opr.devices()``, ``registry().records``) still sees every plugin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest

import opruntime as opr
from opruntime.plugins import Registry

STACKS = ("jax", "pyopencl", "cupy")


def run(code: str, **env: str) -> dict:
    """Run ``code`` in a fresh interpreter (``import opruntime as opr, numpy as np, sys`` done)
    and return the JSON it prints last."""
    head = "import json, sys, numpy as np, opruntime as opr\n"
    full = {**{k: v for k, v in os.environ.items() if not k.startswith("OPRUNTIME_")}, **env}
    out = subprocess.run([sys.executable, "-c", head + code], capture_output=True, text=True, env=full, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


LOADED = (f"print(json.dumps({{'stacks': [m for m in {STACKS!r} if m in sys.modules], "
          "'status': {n: r.status for n, r in opr.registry()._records.items()}}))")


def test_a_call_on_cpu_imports_no_other_device_stack():
    got = run("opr.matmul(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32))\n" + LOADED,
              OPRUNTIME_DEVICE="cpu")
    assert got["stacks"] == []
    assert got["status"]["numpy"] == "ok"
    assert got["status"]["jax"] == got["status"]["opencl"] == got["status"]["cupy"] == "deferred"


def test_a_first_cpu_matmul_imports_no_scipy():
    """SciPy (0.15 s of import) is loaded by the cpu epilogue only when gelu is applied."""
    code = ("opr.matmul(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32))\n"
            "before = 'scipy' in sys.modules\n"
            "from opruntime_numpy.epilogue import activate\n"
            "y = activate('gelu', np.full(2, 2.0, np.float32))\n"
            "print(json.dumps({'before': before, 'after': 'scipy' in sys.modules, 'y': y.tolist()}))")
    got = run(code, OPRUNTIME_DEVICE="cpu")
    assert got["before"] is False
    assert got["after"] is True and got["y"] == pytest.approx([1.9545, 1.9545], abs=1e-3)  # gelu(2)


def test_the_full_view_still_lists_every_plugin_and_device():
    got = run("opr.relu(np.ones(3, np.float32))\n"
              "names = [d.name for d in opr.devices()]\n"
              "print(json.dumps({'names': names, 'status': {n: r.status for n, r in opr.registry().records.items()}}))",
              OPRUNTIME_DEVICE="cpu")
    assert "deferred" not in got["status"].values()
    assert {"numpy", "jax", "opencl", "cupy"} <= set(got["status"])
    assert "cpu" in got["names"] and any(n.startswith("jax:") for n in got["names"])


def test_a_priority_list_falls_through_loading_only_the_kinds_it_names():
    """``device = ["cuda:0", "cpu"]`` on a machine without CUDA: the CUDA backend is loaded (and
    says why it is unavailable), the call falls back to cpu, JAX and OpenCL stay unloaded."""
    pytest.importorskip("jax")
    if any(d.kind == "cuda" for d in opr.devices()):
        pytest.skip("CUDA is present here: the list does not fall through")
    got = run("import warnings\nwarnings.simplefilter('ignore')\n"
              "assert opr.relu(np.ones(3, np.float32)).device.name == 'cpu'\n" + LOADED,
              OPRUNTIME_DEVICE="cuda:0,cpu")
    assert got["status"]["cupy"] == "unavailable" and got["status"]["numpy"] == "ok"
    assert got["status"]["jax"] == got["status"]["opencl"] == "deferred"
    assert "jax" not in got["stacks"] and "pyopencl" not in got["stacks"]


def test_a_native_array_loads_the_plugin_that_owns_it():
    """A JAX array stays on its JAX device with the cpu device configured: the plugin that
    declared the ``jax`` module is loaded for it (ownership does not depend on earlier calls)."""
    pytest.importorskip("jax")
    got = run("import jax.numpy as jnp\n"
              "print(json.dumps({'device': opr.relu(jnp.ones(3)).device.name}))", OPRUNTIME_DEVICE="cpu")
    assert got["device"] == "jax:cpu:0"


def test_a_torch_cpu_tensor_loads_no_other_plugin():
    pytest.importorskip("torch")
    got = run("import torch\nassert opr.relu(torch.ones(3)).device.name == 'cpu'\n" + LOADED, OPRUNTIME_DEVICE="cpu")
    assert got["stacks"] == [] and got["status"]["jax"] == "deferred"


def _declared_plugin(calls: list[str], kinds: dict) -> types.SimpleNamespace:
    from tests.fake_backend import FakeDevice

    def devices():
        calls.append("devices")
        return [FakeDevice(0)]

    def kernels():
        calls.append("kernels")
        return []

    return types.SimpleNamespace(__name__="lazy", opruntime_device_kinds=opr.hookimpl(lambda: kinds),
                                 opruntime_devices=opr.hookimpl(devices), opruntime_kernels=opr.hookimpl(kernels))


def test_a_declared_plugin_is_collected_when_its_kind_is_first_needed():
    calls: list[str] = []
    other: list[str] = []
    host = _declared_plugin(other, {"cpu": []})
    host.opruntime_devices = opr.hookimpl(lambda: other.append("devices") or [])
    reg = Registry([("lazy", _declared_plugin(calls, {"fake": ["fakemod"]})), ("host", host)], entry_points=False)
    assert calls == other == [] and reg._records["lazy"].status == "deferred"
    assert reg.kernels_for("matmul", "cpu") == []
    assert other == ["devices", "kernels"] and calls == []  # another kind: only its plugin loaded
    assert reg.device("fake:0").name == "fake:0"
    assert calls == ["devices", "kernels"] and reg._records["lazy"].status == "ok"
    reg.device("fake:0")
    reg.records  # noqa: B018 (the full view loads nothing twice)
    assert calls == ["devices", "kernels"]


def test_the_full_view_loads_a_declared_plugin():
    calls: list[str] = []
    reg = Registry([("lazy", _declared_plugin(calls, {"fake": []}))], entry_points=False)
    assert [d.name for d in reg.devices] == ["fake:0"] and calls == ["devices", "kernels"]


def test_a_plugin_without_the_declaration_is_loaded_at_once():
    calls: list[str] = []
    plugin = _declared_plugin(calls, {})
    del plugin.opruntime_device_kinds
    Registry([("eager", plugin)], entry_points=False)
    assert calls == ["devices", "kernels"]


@pytest.mark.parametrize("bad", [["fake"], {"fake": "fakemod"}, {"fake": [1]}])
def test_a_malformed_declaration_disables_the_plugin(bad):
    with pytest.warns(opr.errors.FallbackWarning, match="opruntime_device_kinds returned"):
        reg = Registry([("lazy", _declared_plugin([], bad))], entry_points=False)
    assert reg.records["lazy"].status == "failed"
