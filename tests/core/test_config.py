"""Configuration sources and their precedence; per-operator settings; bad values."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import opruntime as opr
from opruntime import config
from opruntime.errors import ConfigError, DeviceUnavailableError, FallbackWarning, UnknownDeviceError


def default_device(op="matmul"):
    return opr.matmul(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32)).device.name if op == "matmul" else None


def test_defaults():
    s = config.settings()
    assert s.device == () and s.tune == "heuristic" and s.strict is False
    assert default_device() == opr.devices()[0].name


def test_precedence_file_env_code_context_call(fake, tmp_path, monkeypatch):
    (tmp_path / "opruntime.toml").write_text('device = "fake:0"\ntune = "off"\n')
    config.reload()
    assert default_device() == "fake:0"
    assert config.settings().origin["device"].endswith("opruntime.toml")
    monkeypatch.setenv("OPRUNTIME_DEVICE", "fake:1")
    config.reload()
    assert default_device() == "fake:1" and config.settings().tune == "off"
    opr.configure(device="cpu")
    assert default_device() == "cpu"
    with opr.device("fake:0"):
        assert default_device() == "fake:0"
        out = opr.matmul(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32), device="fake:1")
        assert out.device.name == "fake:1"
    assert default_device() == "cpu"


def test_pyproject_table(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname="x"\n[tool.opruntime]\nstrict = true\n')
    sub = tmp_path / "pkg"
    sub.mkdir()
    s = config.Settings()
    found = config.find_file(sub)
    assert found is not None and found[0].name == "pyproject.toml" and found[1] == {"strict": True}
    assert s.strict is False


def test_config_env_var_names_the_file(tmp_path, monkeypatch):
    path = tmp_path / "custom.toml"
    path.write_text('[tool.opruntime]\ntune = "off"\n[tool.opruntime.ops.softmax]\nkernel = "numpy.softmax.fused"\n')
    monkeypatch.setenv("OPRUNTIME_CONFIG", str(path))
    config.reload()
    s = config.settings()
    assert s.tune == "off" and s.ops["softmax"].kernel == "numpy.softmax.fused"


@pytest.mark.parametrize("text,match", [
    ('tune = "fast"', r"opruntime.toml: 'tune' must be one of off, heuristic, autotune, got 'fast'"),
    ('devise = "cpu"', r"unknown key 'devise'; allowed keys: device, tune"),
    ('strict = "maybe"', r"'strict' must be true or false"),
    ('device = 3', r"'device' must be a name or a list of names"),
    ('[ops.softmaxx]\nkernel = "x"', r"unknown operator 'softmaxx' under 'ops'"),
    ('[ops.softmax]\nkernal = "x"', r"unknown key\(s\) \['kernal'\] in 'ops.softmax'"),
    ('tune = ', r"cannot read configuration"),
])
def test_malformed_file_names_file_and_key(tmp_path, text, match):
    (tmp_path / "opruntime.toml").write_text(text)
    config.reload()
    with pytest.raises(ConfigError, match=match):
        config.settings()


def test_malformed_env(monkeypatch):
    monkeypatch.setenv("OPRUNTIME_STRICT", "perhaps")
    config.reload()
    with pytest.raises(ConfigError, match="environment variable OPRUNTIME_STRICT: 'strict' must be true or false"):
        config.settings()


def test_env_strict_and_tune(monkeypatch):
    monkeypatch.setenv("OPRUNTIME_STRICT", "1")
    monkeypatch.setenv("OPRUNTIME_TUNE", "off")
    config.reload()
    s = config.settings()
    assert s.strict is True and s.tune == "off" and s.origin["strict"] == "$OPRUNTIME_STRICT"


def test_priority_list_falls_back_once_with_a_warning(monkeypatch):
    monkeypatch.setenv("OPRUNTIME_DEVICE", "cuda:7,cpu")
    config.reload()
    with pytest.warns(FallbackWarning, match="falling back to 'cpu'"):
        assert default_device() == "cpu"


def test_priority_list_strict_raises(monkeypatch):
    monkeypatch.setenv("OPRUNTIME_DEVICE", "cuda:7,cpu")
    monkeypatch.setenv("OPRUNTIME_STRICT", "true")
    config.reload()
    with pytest.raises(DeviceUnavailableError, match="strict mode"):
        default_device()


def test_typo_in_device_suggests():
    opr.configure(device="cpo")
    with pytest.raises(UnknownDeviceError, match="Did you mean 'cpu'"):
        default_device()


def test_per_op_device(fake):
    opr.configure(ops={"softmax": {"device": "fake:1"}})
    assert opr.softmax(np.ones(3, np.float32)).device.name == "fake:1"
    assert default_device() == opr.devices()[0].name


def test_configure_none_removes():
    opr.configure(tune="off")
    assert config.settings().tune == "off"
    opr.configure(tune=None)
    assert config.settings().tune == "heuristic"


def test_override_is_thread_local(fake):
    seen = {}
    barrier = threading.Barrier(2)

    def worker(name):
        with opr.device(name):
            barrier.wait()
            seen[name] = opr.softmax(np.ones(3, np.float32)).device.name

    threads = [threading.Thread(target=worker, args=(n,)) for n in ("fake:0", "fake:1")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"fake:0": "fake:0", "fake:1": "fake:1"}
    assert config.settings().device == ()


def test_settings_are_interned():
    with opr.override(tune="off") as a:
        pass
    with opr.override(tune="off") as b:
        pass
    assert a is b  # so the plan cache keeps hitting across blocks


# -- findings: values that parsed as numbers but are no setting ---------------------------------------
@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan"), "inf", "nan", "Infinity", 0, -1.0, True,
                                   "2 s"])
def test_finding_8_tune_budget_must_be_finite_seconds(value):
    """Finding 8: ``tune_budget=inf`` (or nan, or the strings) was taken, and the tuner then
    never stopped; every source now refuses it with a ConfigError (there is no environment
    variable for it: configure() and files are the sources)."""
    with pytest.raises(ConfigError, match="'tune_budget' must be a number of seconds > 0"):
        opr.configure(tune_budget=value)
    assert config.settings().tune_budget == 2.0  # the refused value left nothing behind


def test_finding_8_tune_budget_in_a_file(tmp_path):
    (tmp_path / "opruntime.toml").write_text("tune_budget = inf\n")  # TOML has inf and nan literals
    config.reload()
    with pytest.raises(ConfigError, match="opruntime.toml: 'tune_budget' must be a number of seconds > 0, got inf"):
        config.settings()


@pytest.mark.parametrize("key,value", [("tune_top_k", 0), ("tune_top_k", 2.5), ("tune_top_k", True),
                                       ("tune_top_k", float("inf")), ("cache_entries", 0), ("cache_entries", "lots"),
                                       ("cache_entries", float("nan"))])
def test_counts_must_be_positive_ints(key, value):
    with pytest.raises(ConfigError, match=f"'{key}' must be an int >= 1"):
        opr.configure(**{key: value})


def test_finding_14_a_config_file_that_is_not_utf8_is_a_config_error(tmp_path):
    """Finding 14: a config file with invalid UTF-8 raised UnicodeDecodeError; it is a
    ConfigError naming the file."""
    (tmp_path / "opruntime.toml").write_bytes(b'device = "cpu"\n# caf\xe9 \xff\xfe\n')
    config.reload()
    with pytest.raises(ConfigError, match=r"opruntime.toml: cannot read configuration: .*utf-8"):
        config.settings()
    (tmp_path / "opruntime.toml").unlink()
    config.reload()
    assert config.settings().device == ()


def test_finding_14_config_env_var_naming_a_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("OPRUNTIME_CONFIG", str(tmp_path))
    config.reload()
    with pytest.raises(ConfigError, match="OPRUNTIME_CONFIG names .* which is not a file"):
        config.settings()


def test_device_resolution_lives_in_the_registry(fake):
    """``opruntime.plugins.resolve_device(settings, op, wanted)``: the call's device, else the op's
    setting, else the global one, else the best present device."""
    from opruntime.plugins import resolve_device

    s = config.settings()
    assert resolve_device(s, "matmul") is opr.devices()[0]
    assert resolve_device(s, "matmul", "fake:1") is opr.Device("fake:1")
    assert resolve_device(s, "matmul", opr.Device("fake:0")) is opr.Device("fake:0")
    with pytest.warns(FallbackWarning, match="falling back to 'fake:1' from the device= argument"):
        assert resolve_device(s, "matmul", ["cuda:9", "fake:gpu"]).name == "fake:1"  # an alias, after a fallback
    opr.configure(device="fake:0", ops={"softmax": {"device": "fake:1"}})
    s = config.settings()
    assert resolve_device(s, "matmul").name == "fake:0" and resolve_device(s, "softmax").name == "fake:1"
    assert not hasattr(config, "_announced")  # announcements are the registry's


def test_opruntime_toml_beside_a_pyproject_table_wins_and_says_so(tmp_path, caplog):
    """Files are not merged: in one directory opruntime.toml wins over pyproject's
    [tool.opruntime] table, and a warning names both, once per process."""
    (tmp_path / "pyproject.toml").write_text('[tool.opruntime]\ntune = "off"\nstrict = true\n')
    (tmp_path / "opruntime.toml").write_text('tune = "autotune"\n')
    config._shadowed.clear()
    with caplog.at_level("WARNING", logger="opruntime"):
        config.reload()
        s = config.settings()
        config.reload()
        config.settings()
    assert s.tune == "autotune" and s.strict is False  # nothing of the pyproject table
    assert s.origin["tune"] == str(tmp_path.resolve() / "opruntime.toml")
    said = [r.getMessage() for r in caplog.records if "is ignored" in r.getMessage()]
    assert len(said) == 1
    assert "opruntime.toml is in force" in said[0] and str(tmp_path.resolve() / "pyproject.toml") in said[0]


def test_a_pyproject_without_the_table_beside_opruntime_toml_is_not_announced(tmp_path, caplog):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    (tmp_path / "opruntime.toml").write_text('tune = "off"\n')
    config._shadowed.clear()
    with caplog.at_level("WARNING", logger="opruntime"):
        config.reload()
        assert config.settings().tune == "off"
    assert not [r for r in caplog.records if "is ignored" in r.getMessage()]


@pytest.mark.parametrize(("value", "hint"), [(["-opencll"], "Did you mean '-opencl'?"), ("nmupy", "Did you mean 'numpy'?"),
                                             (["-zzzz"], "Plugins here: ")])
def test_an_unknown_plugin_name_is_an_error_with_a_suggestion(value, hint):
    """A typo in ``plugins`` used to block nothing (or, in an allow-list, allow nothing) silently."""
    with pytest.raises(ConfigError, match=rf"configure\(\): unknown plugin '{value[0].lstrip('-') if isinstance(value, list) else value}' in 'plugins'\. .*{hint}") as err:
        opr.configure(plugins=value)
    assert "jax" in str(err.value) and "numpy" in str(err.value)  # the names it could have been
    assert config.settings().plugins == ()  # nothing of it kept


def test_a_typo_in_the_plugins_environment_variable_names_the_variable(monkeypatch):
    monkeypatch.setenv("OPRUNTIME_PLUGINS", "-opencl,-jaxx")
    with pytest.raises(ConfigError, match=r"OPRUNTIME_PLUGINS: unknown plugin 'jaxx' in 'plugins'\. Did you mean '-jax'"):
        config.reload()
        config.settings()
