"""The built-in backends pass the conformance suite a plugin author runs (``opruntime.testing``),
and the suite catches broken plugins (a wrong kernel, one that writes its operands, a lossy
device, malformed records).

CI runs a budgeted slice on each device: every kernel on three problems per operator in float32
with the heuristic's config, every other dtype on one problem, and every config on one problem.
The whole table is ``python -m opruntime.testing --device <name>``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import types

import numpy as np
import pytest

import opruntime as opr
from opruntime import hookspecs
from opruntime.errors import FallbackWarning, PluginError
from opruntime.ops import OPS
from opruntime.plugins import Registry, registry
from opruntime.testing import (
    QUICK_CASES,
    check_frontend_edges,
    check_hooks,
    check_kernel,
    check_lazy_import,
    check_memory,
    check_pinned,
    failures,
    summary,
)

BUILTIN = {"numpy": "opruntime_numpy", "cupy": "opruntime_cupy", "opencl": "opruntime_opencl", "jax": "opruntime_jax"}


def clean(findings) -> None:
    bad = failures(findings)
    assert not bad, f"{len(bad)} conformance failure(s):\n{summary(bad)}"


def kernels_on(device, op):
    ks = registry().kernels_for(op, device.kind)
    if not ks:
        pytest.skip(f"no {op} kernel for {device.kind}")
    return ks


@pytest.mark.parametrize("plugin", list(BUILTIN))
def test_builtin_hooks_match_hookspecs(plugin):
    clean(check_hooks(plugin))


@pytest.mark.parametrize("plugin", list(BUILTIN))
def test_builtin_import_loads_no_device_stack(plugin):
    clean(check_lazy_import(BUILTIN[plugin]))


def test_memory_round_trips(device):
    clean(check_memory(device))


@pytest.mark.parametrize("op", list(OPS))
def test_size_zero_results(device, op):
    clean(check_frontend_edges(device, op))


@pytest.mark.parametrize("op", list(OPS))
def test_every_kernel_every_dtype(device, op):
    rng = np.random.default_rng()
    findings = []
    for k in kernels_on(device, op):
        findings += check_kernel(k, device, QUICK_CASES[op], dtypes=["float32"], configs="first", rng=rng)
        others = [d for d in k.dtypes if d != "float32"]
        findings += check_kernel(k, device, QUICK_CASES[op][:1], dtypes=others, configs="first", rng=rng)
    clean(findings)


@pytest.mark.parametrize("op", list(OPS))
def test_every_kernel_every_config(device, op):
    rng = np.random.default_rng()
    findings = []
    for k in kernels_on(device, op):
        main = "float32" if "float32" in k.dtypes else min(k.dtypes)  # fp16-only kernels: their own dtype
        findings += check_kernel(k, device, QUICK_CASES[op][:1], dtypes=[main], configs="all", rng=rng)
    clean(findings)


@pytest.mark.parametrize("op", list(OPS))
def test_every_kernel_pinned(device, op):
    findings = []
    for k in kernels_on(device, op):
        findings += check_pinned(k, device, QUICK_CASES[op])
    clean(findings)


def test_suite_runs_as_a_pytest_package():
    """What a plugin author types: the package collects, takes the option and passes on cpu. Its
    every test but matmul's kernels is deselected here (``-k``; the whole package took 160 s of
    CI's 2 cores): the kernels' checks themselves run in this process above, on every device."""
    proc = subprocess.run([sys.executable, "-m", "opruntime.testing", "--device", "cpu", "--cases", "quick", "-q",
                           "-p", "no:cacheprovider", "-k", "not (test_kernel or test_pinned) or matmul"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) >= 5 and "failed" not in proc.stdout, proc.stdout[-3000:]


# -- the suite catches broken plugins ------------------------------------------------------------------
@pytest.fixture
def broken(kernel_plugin):
    """``broken(name, *kernels)``: a kernel-only plugin registered for one test; its registered kernels."""
    return kernel_plugin


def test_catches_a_wrong_kernel(broken):
    def wrong(problem, config, a, b):  # forgets the last row of the reduction
        return np.matmul(a[..., :-1], b[..., :-1, :]) if a.shape[-1] > 1 else np.zeros(problem.out_shape, a.dtype)

    (k,) = broken("wrongmm", opr.Kernel("matmul", "wrongmm.matmul.short", "cpu", frozenset({"float32"}), wrong))
    bad = failures(check_kernel(k, opr.Device("cpu"), dtypes=["float32"]))
    assert bad and all("relative error" in f.message for f in bad), summary(bad)


def test_catches_a_kernel_that_ignores_strides(broken):
    def contiguous_only(problem, config, a, b):  # reads the base buffer as if it were C-contiguous
        c_strides = [a.itemsize * int(np.prod(a.shape[i + 1:])) for i in range(a.ndim)]
        flat = np.lib.stride_tricks.as_strided(a, a.shape, c_strides)
        return np.matmul(flat, b)

    (k,) = broken("naive", opr.Kernel("matmul", "naive.matmul.plain", "cpu", frozenset({"float32"}), contiguous_only))
    bad = failures(check_kernel(k, opr.Device("cpu"), dtypes=["float32"]))
    assert bad and all("0slice" in f.subject or "0T" in f.subject for f in bad), summary(bad)


def test_catches_a_kernel_that_writes_its_operands(broken):
    def scribble(problem, config, x):
        out = OPS["softmax"].reference(x, axis=problem.attrs["axis"]).astype(x.dtype)
        x[...] = 0  # in place on the caller's data
        return out

    (k,) = broken("scribble", opr.Kernel("softmax", "scribble.softmax.inplace", "cpu", frozenset({"float32"}), scribble))
    bad = failures(check_kernel(k, opr.Device("cpu"), QUICK_CASES["softmax"][:2], dtypes=["float32"]))
    assert bad and all("wrote into operand 0" in f.message for f in bad), summary(bad)


def test_catches_a_prepared_launcher_that_differs_from_run(broken):
    """A plan calls what ``prepare`` returns after the first ``run``: the suite checks both."""
    def run(problem, config, a, b):
        return np.matmul(a, b)

    def prepare(problem, config):  # a launcher that drifted from run
        return lambda a, b: np.matmul(a, b) * 2

    (k,) = broken("stale", opr.Kernel("matmul", "stale.matmul.bound", "cpu", frozenset({"float32"}), run,
                                      prepare=prepare))
    bad = failures(check_kernel(k, opr.Device("cpu"), QUICK_CASES["matmul"], dtypes=["float32"]))
    assert bad and all("prepare(problem, config)(*arrays)" in f.message for f in bad), summary(bad)
    (good,) = broken("fine", opr.Kernel("matmul", "fine.matmul.bound", "cpu", frozenset({"float32"}), run,
                                        prepare=lambda problem, config: lambda a, b: np.matmul(a, b)))
    assert not failures(check_kernel(good, opr.Device("cpu"), QUICK_CASES["matmul"], dtypes=["float32"]))


def test_catches_a_kernel_whose_supports_lies(broken):
    def run(problem, config, x):
        if len(problem.shapes[0]) > 2:
            raise RuntimeError("rank > 2 is not implemented")
        return OPS["softmax"].reference(x, axis=problem.attrs["axis"]).astype(x.dtype)

    (k,) = broken("liar", opr.Kernel("softmax", "liar.softmax.rank2", "cpu", frozenset({"float32"}), run))
    bad = failures(check_kernel(k, opr.Device("cpu"), dtypes=["float32"]))
    assert bad and all("supports() accepted it but run raised RuntimeError" in f.message for f in bad)


def test_catches_malformed_kernel_records(broken):
    """Records the registry takes but a kernel must not have: dtypes outside the float dtypes,
    no configs."""
    ok = OPS["softmax"].reference
    broken("sloppy",
           opr.Kernel("softmax", "sloppy.softmax.ints", "cpu", frozenset({"int32"}), ok),
           opr.Kernel("softmax", "sloppy.softmax.noconfig", "cpu", frozenset({"float32"}), ok, configs=()))
    text = summary(failures(check_hooks("sloppy")))
    assert "must be a non-empty subset of" in text
    assert "configs must be a non-empty tuple" in text


def test_catches_a_kernel_outside_its_namespace():
    """The registry refuses the plugin (``opr.register`` raises; an entry point is disabled);
    the suite reports the refusal as the plugin's failure."""
    plugin = types.SimpleNamespace(__name__="sloppy", opruntime_kernels=opr.hookimpl(
        lambda: [opr.Kernel("softmax", "sloppy_softmax", "cpu", frozenset({"float32"}), OPS["softmax"].reference)]))
    with pytest.raises(PluginError, match="outside its namespace"):
        opr.register(plugin)
    with pytest.warns(FallbackWarning, match="outside its namespace"):
        reg = Registry([("sloppy", plugin)], entry_points=False)
    text = summary(failures(check_hooks("sloppy", reg)))
    assert "kernel 'sloppy_softmax' is outside its namespace" in text


def test_catches_a_lossy_device():
    from fake_backend import FakeDevice

    class Lossy(FakeDevice):
        kind = "lossy"

        def __init__(self):
            super().__init__(0)
            self.name = "lossy:0"

        def to_host(self, data):  # drops to float16 and back: loses bits, keeps the dtype
            return np.asarray(data.a).astype(np.float16).astype(data.a.dtype) if data.a.dtype.kind == "f" else data.a

        def fingerprint(self):
            return {"name": self.name, "version": 1}  # not all strings

    @opr.hookimpl
    def opruntime_devices():
        return [Lossy()]

    opr.register(types.SimpleNamespace(opruntime_devices=opruntime_devices, __name__="lossy"), name="lossy")
    try:
        dev = opr.Device("lossy:0")
        mem = summary(failures(check_memory(dev, dtypes=["float32"])))
        hooks = summary(failures(check_hooks("lossy")))
    finally:
        opr.unregister("lossy")
    assert "round trip changed the data" in mem
    assert "fingerprint() must be a non-empty dict of str to str" in hooks


def test_catches_an_unmarked_hook():
    """The suite reports what ``hookspecs.contract_errors`` finds, as the registry refuses by it:
    ``opr.register`` raises it, an entry point is disabled with it, ``check_hooks`` lists it."""
    def opruntime_kernels():  # forgot @opr.hookimpl
        return []

    plugin = types.SimpleNamespace(opruntime_kernels=opruntime_kernels, opruntime_devices=opr.hookimpl(lambda: []),
                                   __name__="unmarked")
    (error,) = hookspecs.contract_errors(plugin)
    assert error == "opruntime_kernels is not marked @opruntime.hookimpl: pluggy would never call it"
    with pytest.raises(PluginError) as info:
        opr.register(plugin)
    assert error in str(info.value)
    with pytest.warns(FallbackWarning, match="not marked @opruntime.hookimpl"):
        reg = Registry([("unmarked", plugin)], entry_points=False)
    assert error in summary(failures(check_hooks("unmarked", reg)))
