"""Plugin loading: the hook contract (``hookspecs.contract_errors``) enforced by ``opr.register``
(PluginError, nothing kept) and by the entry-point loader (the plugin disabled with a
FallbackWarning, the others working); namespaces (a kernel or device name belongs to the first
plugin that registers it); isolation of plugins that fail to import or whose hooks raise or
return junk; blocking by configuration."""

from __future__ import annotations

import types

import numpy as np
import pytest
from fake_backend import FakeDevice

import opruntime as opr
from opruntime import hookspecs, plugins
from opruntime.errors import BackendUnavailable, DeviceUnavailableError, FallbackWarning, PluginError
from opruntime.plugins import Registry, registry


def _registry(*plugins):
    return Registry(list(plugins), entry_points=False)


def _ok_after(rng):
    """The built-in cpu backend still answers (a broken plugin took nothing down)."""
    a, b = rng.standard_normal((5, 7)).astype(np.float32), rng.standard_normal((7, 3)).astype(np.float32)
    np.testing.assert_allclose(opr.matmul(a, b, device="cpu").numpy(), a @ b, rtol=1e-5)


def _softmax_run(problem, config, x):
    e = np.exp(x - x.max(axis=problem.attrs["axis"], keepdims=True))
    return e / e.sum(axis=problem.attrs["axis"], keepdims=True)


def _softmax_kernel(name, **kw):
    return opr.Kernel("softmax", name, "cpu", frozenset({"float32"}), _softmax_run, **kw)


def _builtins_untouched():
    reg = registry()
    assert reg.records["numpy"].status == "ok"
    assert reg.kernels["numpy.softmax.fused"].run.__module__ == "opruntime_numpy.softmax"
    assert type(opr.Device("cpu").provider).__module__.startswith("opruntime_numpy")
    assert [k.plugin for k in reg.kernels_for("softmax", "cpu")] == ["numpy"] * len(reg.kernels_for("softmax", "cpu"))


def test_builtin_backends_come_from_entry_points():
    reg = opr.registry()
    assert {"numpy", "cupy", "opencl", "jax"} <= set(reg.records)
    assert reg.records["numpy"].status == "ok" and "cpu" in reg.records["numpy"].devices


# -- the contract, as register() enforces it ----------------------------------------------------------
def _unmarked():
    def opruntime_kernels():  # forgot @opr.hookimpl
        return []

    return {"opruntime_kernels": opruntime_kernels}


def _unknown():
    return {"opruntime_kernals": opr.hookimpl(lambda: [])}


def _extra_args():
    @opr.hookimpl
    def opruntime_kernels(device):
        return []

    return {"opruntime_kernels": opruntime_kernels}


@pytest.mark.parametrize("hooks,match", [
    (_unmarked, "opruntime_kernels is not marked @opruntime.hookimpl"),
    (_unknown, "opruntime_kernals is not a hook; the hooks are opruntime_devices, opruntime_kernels"),
    (_extra_args, r"opruntime_kernels takes \['device'\], which the hookspec does not provide"),
], ids=["unmarked", "unknown-hook", "extra-argument"])
def test_register_refuses_a_plugin_that_breaks_the_contract(rng, hooks, match):
    plugin = types.SimpleNamespace(__name__="sloppy", **hooks())
    assert any(match.split(" ")[0] in e for e in hookspecs.contract_errors(plugin))  # the one rule, both places
    with pytest.raises(PluginError, match=f"plugin 'sloppy' .*{match}"):
        opr.register(plugin)
    assert "sloppy" not in registry().records and plugins._extra == []  # nothing of it kept
    with pytest.raises(PluginError, match="'sloppy' was not registered"):
        opr.unregister("sloppy")
    _ok_after(rng)


def test_register_refuses_a_kernel_outside_its_namespace(rng):
    with pytest.raises(PluginError, match=r"plugin 'sloppy' refused: kernel 'sloppy_softmax' is outside its "
                                          r"namespace: kernels of plugin 'sloppy' are named 'sloppy.<op>.<variant>'"):
        opr.register(types.SimpleNamespace(__name__="sloppy", opruntime_kernels=opr.hookimpl(
            lambda: [_softmax_kernel("sloppy_softmax")])))
    assert "sloppy" not in registry().records
    _ok_after(rng)


def test_finding_2_a_plugin_cannot_take_a_builtin_kernel_name():
    """Finding 2: a plugin registering ``numpy.softmax.fused`` (the numpy plugin's namespace) is
    refused, the error naming the plugin and the kernel it claimed; the built-in keeps its kernel."""
    hijack = types.SimpleNamespace(__name__="evil", opruntime_kernels=opr.hookimpl(
        lambda: [_softmax_kernel("numpy.softmax.fused", cost=lambda p, c: 0.0)]))
    with pytest.raises(PluginError, match=r"plugin 'evil' refused: kernel 'numpy.softmax.fused' is outside its "
                                          r"namespace.*'evil.<op>.<variant>'") as info:
        opr.register(hijack)
    assert "evil" in str(info.value) and "numpy.softmax.fused" in str(info.value)
    _builtins_untouched()
    assert opr.explain("softmax", np.ones((2, 3), np.float32), device="cpu").chosen.startswith("numpy.softmax.")


def test_finding_2_a_plugin_cannot_take_a_builtin_device_name():
    """Finding 2: a plugin providing a device called ``cpu`` is refused, naming both plugins; the
    numpy plugin keeps ``cpu``."""
    class FakeCpu(FakeDevice):
        kind = "cpu"

        def __init__(self):
            super().__init__(0)
            self.name = "cpu"

    hijack = types.SimpleNamespace(__name__="evil", opruntime_devices=opr.hookimpl(lambda: [FakeCpu()]))
    with pytest.raises(PluginError, match="plugin 'evil' refused: device 'cpu' is already provided by plugin 'numpy'"):
        opr.register(hijack)
    assert "evil" not in registry().records
    _builtins_untouched()
    assert opr.softmax(np.ones(3, np.float32), device="cpu").data.__class__ is np.ndarray


def test_a_kernel_name_twice_in_one_plugin_is_refused():
    with pytest.raises(PluginError, match="kernel 'twice.softmax.k' is registered twice"):
        opr.register(types.SimpleNamespace(__name__="twice", opruntime_kernels=opr.hookimpl(
            lambda: [_softmax_kernel("twice.softmax.k"), _softmax_kernel("twice.softmax.k")])))


def test_two_plugins_claiming_one_device_name_names_both(fake):
    from fake_backend import FakeBackend

    with pytest.raises(PluginError, match="plugin 'fake2' refused: device 'fake:0' is already provided by plugin 'fake'"):
        opr.register(FakeBackend(plugin="fake2"))
    assert registry().records["fake"].status == "ok" and "fake2" not in registry().records


def test_a_plugin_name_is_taken_once(fake):
    with pytest.raises(PluginError, match="plugin name 'fake' is taken"):
        opr.register(types.SimpleNamespace(__name__="fake"))
    with pytest.raises(PluginError, match="plugin name 'numpy' is taken"):
        opr.register(types.SimpleNamespace(__name__="numpy"))


def test_unregister_by_object_or_name_and_never_registered(rng):
    plugin = types.SimpleNamespace(__name__="acme", opruntime_kernels=opr.hookimpl(
        lambda: [_softmax_kernel("acme.softmax.k")]))
    opr.register(plugin)
    assert "acme.softmax.k" in registry().kernels
    opr.unregister(plugin)  # the object
    assert "acme.softmax.k" not in registry().kernels
    opr.register(plugin)
    opr.unregister("acme")  # the name
    assert "acme" not in registry().records
    with pytest.raises(PluginError, match="'acme' was not registered with opruntime.register"):
        opr.unregister("acme")
    with pytest.raises(PluginError, match="was not registered"):
        opr.unregister(plugin)
    with pytest.raises(PluginError, match="'numpy' was not registered"):  # entry points are not unregistered
        opr.unregister("numpy")


# -- the contract, as the entry-point loader enforces it ------------------------------------------------
@pytest.fixture
def entry_point(tmp_path, monkeypatch):
    """``add(name, source)``: a module with ``source`` installed as an entry point called ``name``
    (the registry is rebuilt from the entry points)."""
    found = list(plugins._entry_point_plugins())
    monkeypatch.setattr(plugins, "_entry_point_plugins", lambda: list(found))
    monkeypatch.syspath_prepend(str(tmp_path))

    def add(name, source):
        (tmp_path / f"opruntime_ep_{name}.py").write_text(source)
        found.append((name, f"opruntime_ep_{name}"))
        plugins.reset()

    yield add
    plugins.reset()


def test_entry_point_that_breaks_the_contract_is_disabled_with_a_warning(entry_point, rng):
    entry_point("sloppy", "def opruntime_kernels():\n    return []\n")
    with pytest.warns(FallbackWarning, match="plugin 'sloppy' failed to load: PluginError: opruntime_kernels is not "
                                             "marked @opruntime.hookimpl.*it is disabled, other plugins keep working"):
        reg = registry()
    assert reg.records["sloppy"].status == "failed"
    _ok_after(rng)


def test_entry_point_claiming_a_builtin_kernel_is_disabled_and_the_builtin_kept(entry_point, rng):
    entry_point("evil", "import numpy as np, opruntime as opr\n"
                        "@opr.hookimpl\n"
                        "def opruntime_kernels():\n"
                        "    return [opr.Kernel('softmax', 'numpy.softmax.fused', 'cpu', opr.FLOATS,\n"
                        "                       lambda p, c, x: np.zeros_like(x), cost=lambda p, c: 0.0)]\n")
    with pytest.warns(FallbackWarning, match="plugin 'evil' refused: kernel 'numpy.softmax.fused' is outside"):
        registry()
    _builtins_untouched()
    _ok_after(rng)


def test_a_broken_entry_point_is_announced_even_when_register_builds_the_registry(entry_point):
    """register() keeps quiet about the plugin it registers (it raises instead), not about the
    others: an entry point that breaks the contract is announced on that build too."""
    entry_point("sloppy", "def opruntime_kernels():\n    return []\n")
    with pytest.warns(FallbackWarning, match="plugin 'sloppy' failed to load"):
        opr.register(types.SimpleNamespace(__name__="acme", opruntime_kernels=opr.hookimpl(
            lambda: [_softmax_kernel("acme.softmax.k")])))
    opr.unregister("acme")


# -- isolation: plugins that fail to import, hooks that raise or return junk --------------------------------
def test_plugin_that_fails_to_import_is_isolated():
    with pytest.warns(FallbackWarning, match="plugin 'broken' failed to load: ModuleNotFoundError"):
        reg = _registry(("broken", "opruntime_no_such_module"), ("numpy", "opruntime_numpy"))
    assert reg.records["broken"].status == "failed"
    assert [d.name for d in reg.devices] == ["cpu"]


def test_register_of_a_module_that_is_missing_or_raises_at_import(tmp_path, monkeypatch, rng):
    with pytest.raises(PluginError, match="plugin 'ghost' failed to load: ModuleNotFoundError"):
        opr.register("opruntime_no_such_backend_xyz", name="ghost")  # an entry point naming a missing module
    (tmp_path / "opruntime_explodes.py").write_text("raise RuntimeError('libacme.so: cannot open shared object')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match="'explodes' failed to load: RuntimeError: libacme.so"):
        opr.register("opruntime_explodes", name="explodes")
    assert not {"ghost", "explodes"} & set(registry().records)
    _ok_after(rng)


def test_misspelled_hook_is_reported():
    @opr.hookimpl
    def opruntime_kernals():
        return []

    plugin = types.SimpleNamespace(opruntime_kernals=opruntime_kernals, __name__="typo")
    with pytest.warns(FallbackWarning, match="opruntime_kernals is not a hook; the hooks are"):
        reg = _registry(("typo", plugin))
    assert reg.records["typo"].status == "failed"


JUNK = [
    ("opruntime_devices", RuntimeError("driver exploded"), "opruntime_devices raised RuntimeError: driver exploded"),
    ("opruntime_kernels", RuntimeError("no"), "opruntime_kernels raised RuntimeError: no"),
    ("opruntime_devices", ["cpu"], "opruntime_devices returned 'cpu', not a DeviceProvider"),
    ("opruntime_devices", 5, "opruntime_devices raised TypeError"),
    ("opruntime_kernels", [None], "opruntime_kernels returned None, not an opruntime.Kernel"),
    ("opruntime_kernels", 5, "opruntime_kernels raised TypeError"),
]


def _junk_plugin(hook, result):
    def impl():
        if isinstance(result, Exception):
            raise result
        return result

    hooks = {"opruntime_devices": lambda: [FakeDevice(7)], "opruntime_kernels": lambda: []}
    hooks[hook] = impl
    return types.SimpleNamespace(__name__="junk", **{k: opr.hookimpl(v) for k, v in hooks.items()})


@pytest.mark.parametrize("hook,result,match", JUNK)
def test_hook_that_raises_or_returns_junk_is_refused_by_register(rng, hook, result, match):
    with pytest.raises(PluginError, match=f"plugin 'junk' {match}"):
        opr.register(_junk_plugin(hook, result))
    reg = registry()
    assert "junk" not in reg.records and "fake:7" not in [d.name for d in reg.devices]  # nothing of it kept
    _ok_after(rng)


@pytest.mark.parametrize("hook,result,match", JUNK)
def test_hook_that_raises_or_returns_junk_is_isolated_in_a_build(hook, result, match):
    with pytest.warns(FallbackWarning, match=f"plugin 'junk' {match}"):
        reg = _registry(("junk", _junk_plugin(hook, result)), ("numpy", "opruntime_numpy"))
    assert reg.records["junk"].status == "failed" and reg.records["numpy"].status == "ok"
    assert [d.name for d in reg.devices] == ["cpu"]  # a disabled plugin offers no devices


def test_unavailable_backend_gives_reason():
    @opr.hookimpl
    def opruntime_devices():
        raise BackendUnavailable("acmelib not installed", kinds=["acme"])

    reg = _registry(("acme", types.SimpleNamespace(opruntime_devices=opruntime_devices)))
    assert reg.records["acme"].status == "unavailable"
    with pytest.raises(DeviceUnavailableError, match="acmelib not installed"):
        reg.device("acme:0")


def test_block_plugin_by_config(monkeypatch):
    monkeypatch.setenv("OPRUNTIME_PLUGINS", "-opencl,-jax")
    opr.reload()
    try:
        reg = opr.registry()
        assert reg.records["opencl"].status == "blocked" and reg.records["jax"].status == "blocked"
        assert not any(d.kind in ("opencl", "jax") for d in reg.devices)
    finally:
        monkeypatch.delenv("OPRUNTIME_PLUGINS")
        opr.reload()
    assert opr.registry().records["numpy"].status == "ok"


def test_kernel_only_plugin_adds_a_kernel_for_an_existing_device(rng):
    calls = []

    def run(problem, config, x):
        calls.append(problem)
        return _softmax_run(problem, config, x)

    kernel = opr.Kernel("softmax", "acme.softmax.fast", "cpu", frozenset({"float32"}), run, cost=lambda p, c: 0.0)
    opr.register(types.SimpleNamespace(opruntime_kernels=opr.hookimpl(lambda: [kernel])), name="acme")
    try:
        x = rng.standard_normal((3, 4)).astype(np.float32)
        out = opr.softmax(x)
        assert len(calls) == 1 and calls[0].device is opr.Device("cpu")  # the Problem carries the Device
        np.testing.assert_allclose(out.numpy().sum(axis=-1), 1, rtol=1e-6)
    finally:
        opr.unregister("acme")
    assert "acme.softmax.fast" not in opr.registry().kernels


def test_device_of_a_blocked_plugin_falls_back(monkeypatch):
    monkeypatch.setenv("OPRUNTIME_PLUGINS", "-cupy")
    monkeypatch.setenv("OPRUNTIME_DEVICE", "cuda:0,cpu")
    opr.reload()
    try:
        with pytest.warns(FallbackWarning, match="falling back to 'cpu'.*Plugins not loaded here: cupy \\(blocked"):
            out = opr.softmax(np.ones(3, np.float32))
        assert out.device.name == "cpu"
    finally:
        monkeypatch.delenv("OPRUNTIME_PLUGINS")
        monkeypatch.delenv("OPRUNTIME_DEVICE")
        opr.reload()


def test_device_provider_is_the_contract_class():
    """``DeviceProvider`` lives in the contract (``hookspecs``) and is re-exported as ``opr.DeviceProvider``."""
    assert opr.DeviceProvider is hookspecs.DeviceProvider
    for point in ("accelerator", "copy", "shares_memory", "free_memory", "roofline"):
        assert hasattr(hookspecs.DeviceProvider, point), point
    assert "opruntime_build_variants" in hookspecs.HOOKS


def test_register_of_a_plugin_the_configuration_blocks_raises(monkeypatch):
    """``plugins = ["numpy"]`` (an allow-list without acme): ``opr.register`` of acme used to
    return as if it worked while the registry skipped it; it raises, keeping nothing. (A block
    list cannot name acme before it is registered: an unknown name is a ConfigError, below.)"""
    monkeypatch.setenv("OPRUNTIME_PLUGINS", "numpy")
    opr.reload()
    plugin = types.SimpleNamespace(__name__="acme", opruntime_kernels=opr.hookimpl(
        lambda: [_softmax_kernel("acme.softmax.k")]))
    with pytest.raises(PluginError, match="plugin 'acme' blocked by configuration"):
        opr.register(plugin)
    assert plugins._extra == [] and "acme" not in registry().records
    monkeypatch.delenv("OPRUNTIME_PLUGINS")
    opr.reload()


def test_build_variants_come_from_the_hook_through_pluggy(tmp_path):
    """``opruntime_build_variants`` is a hook like the others: the registry collects each plugin's
    ``(path, defines)`` pairs, paths relative to the plugin module's folder made absolute."""
    module = tmp_path / "opruntime_ep_variants.py"
    module.write_text("import opruntime as opr\n"
                      "@opr.hookimpl\n"
                      "def opruntime_build_variants():\n"
                      "    return [('k.cu', {'TILE': 16}), ('/abs/k.cu', {})]\n")
    import importlib.util

    spec = importlib.util.spec_from_file_location("opruntime_ep_variants", module)
    plugin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plugin)
    opr.register(plugin, name="variants")
    try:
        found = [(p, d) for p, d in registry().build_variants() if p.endswith("k.cu")]
    finally:
        opr.unregister("variants")
    assert found == [(str(tmp_path / "k.cu"), {"TILE": 16}), ("/abs/k.cu", {})]
