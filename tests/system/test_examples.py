"""The examples, the plugin template and the docs' generated pages.

Every example script runs in a subprocess (as a user runs it) and checks its own results against
float64 references; the plugin template's tests run against the template installed as a package
(``make test`` installs it into ``build/plugin_template``; nothing is installed here); the
generated reference pages must match the code; the ``opruntime`` command (``opruntime.tools``)
works as a user runs it: ``info``, ``explain``, ``bench`` with ``--json``, ``--plot`` and progress,
``tune`` and the ``cache`` subcommands.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "examples" / "plugin_template"
TEMPLATE_INSTALL = ROOT / "build" / "plugin_template"  # where `make test` installs the template
# mlp_inference.py and device_config/run.py run in their own tests below
SCRIPTS = ["examples/quickstart.py", "examples/conv_layer.py", "examples/kernels/run.py"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPRUNTIME_") or k == "OPRUNTIME_CACHE_DIR"}
    return env | extra


def _run(args: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT,
         timeout: float = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=cwd, env=env or _env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(args)} exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


# -- examples ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("script", SCRIPTS)
def test_example_runs_and_checks_itself(script: str) -> None:
    _run([sys.executable, script])


# the two models (their devices and sizes in tests/system/test_models.py): the scripts as a user runs them
MODELS = [["examples/transformer_block.py", "--device", "cpu", "--repeats", "1"],
          ["examples/resnet50.py", "--device", "cpu", "--size", "32", "--repeats", "1"]]


@pytest.mark.parametrize("args", MODELS, ids=[a[0] for a in MODELS])
def test_model_example_runs_and_checks_itself(args: list[str]) -> None:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("the model examples need torch: pip install 'opruntime[models]'")
    out = _run([sys.executable, *args]).stdout
    assert "relative error vs torch float32" in out and "FAILED" not in out


def test_mlp_takes_its_device_from_configuration(device) -> None:  # noqa: ANN001 (conftest fixture)
    out = _run([sys.executable, "examples/mlp_inference.py", "--batch", "16", "--batches", "1"],
               env=_env(OPRUNTIME_DEVICE=device.name)).stdout
    assert f"device: Device('{device.name}'" in out
    assert "$OPRUNTIME_DEVICE" in out


def test_device_config_applies_per_operator_settings() -> None:
    out = _run([sys.executable, "examples/device_config/run.py"]).stdout
    conv = next(line for line in out.splitlines() if line.startswith("conv2d"))
    assert "on cpu" in conv and "numpy.conv2d.im2col" in conv  # device and kernel from [ops.conv2d]


def test_cuda_example_source_compiles() -> None:
    # nvcc (or NVRTC) when present; the script says so and exits 0 when neither is
    _run([sys.executable, "scripts/compile_cu.py", "examples/kernels/softmax_rows.cu"])


# -- the plugin template ---------------------------------------------------------------------------
def _template_env() -> dict[str, str]:
    env = _env()
    if TEMPLATE_INSTALL.is_dir():
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TEMPLATE_INSTALL), env.get("PYTHONPATH")]))
    return env


def test_plugin_template_tests_pass() -> None:
    env = _template_env()
    probe = subprocess.run([sys.executable, "-c", "import importlib.metadata as m; "
                            "print(' '.join(e.name for e in m.entry_points(group='opruntime.backends')))"],
                           env=env, capture_output=True, text=True, timeout=60)
    if "demo" not in probe.stdout.split():
        pytest.skip("the plugin template is not installed: `make test` installs it with "
                    "`pip install --no-deps --target build/plugin_template examples/plugin_template`")
    out = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], env=env, cwd=TEMPLATE).stdout
    assert " passed" in out and "failed" not in out


# -- docs -------------------------------------------------------------------------------------------
def test_generated_reference_pages_are_current() -> None:
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs" / "gen_reference.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    for name, make in gen.PAGES.items():
        assert (ROOT / "docs" / name).read_text() == make(), (
            f"docs/{name} is stale: run `python docs/gen_reference.py` (or `mkdocs build`) and commit it")


# -- the CLI: --json, --plot, progress --------------------------------------------------------------
def test_bench_json_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    from opruntime.tools.cli import main

    assert main(["bench", "matmul", "--shape", "33x17,17x9", "--device", "cpu", "--repeats", "1",
                 "--peers", "numpy", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)  # stdout is the JSON alone
    (r,) = data["results"]
    assert r["op"] == "matmul" and r["device"] == "cpu" and r["flops"] == 2 * 33 * 17 * 9 and r["bytes"] > 0
    assert r["time_s"] > 0 and "numpy" in r["peers"] and "versions" in data


def test_explain_json(capsys: pytest.CaptureFixture[str]) -> None:
    from opruntime.tools.cli import main

    assert main(["explain", "conv2d", "--shape", "1x3x8x8,4x3x3x3", "--attr", "padding=1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["chosen"] in {c["label"] for c in data["candidates"]}
    assert all(c["estimate_s"] is None or c["estimate_s"] > 0 for c in data["candidates"])


def test_bench_plot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    from opruntime.tools import plot as benchplot
    from opruntime.tools.cli import main

    roofs = []

    def small(device, dtypes):  # noqa: ANN001 - the same measurement, on small sizes (CI time)
        roofs.append({"bytes_per_s": benchplot.measure_bandwidth(device, nbytes=1 << 20),
                      "flops_per_s": {"float32": benchplot.measure_compute(device, "float32", budget_s=2e-3)},
                      "source": "measured (small)"})
        return roofs[-1]

    monkeypatch.setattr(benchplot, "roofline_figures", small)
    out, js = tmp_path / "bench.png", tmp_path / "bench.json"
    assert main(["bench", "softmax", "--shape", "64x300", "--shape", "2x3x50", "--device", "cpu",
                 "--repeats", "1", "--kernels", "--peers", "numpy", "--plot", str(out), "--output", str(js)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    roof = json.loads(js.read_text())["roofline"]["cpu"]
    assert roof["bytes_per_s"] > 0 and roof["flops_per_s"]["float32"] > 0


def test_roofs_are_raised_to_measured_rates() -> None:
    from opruntime.tools.bench import Result
    from opruntime.tools.plot import _fit_roofs

    compute_bound = Result("matmul", "p", "float32", "cpu", time_s=1.0, flops=100e9, bytes=1e9, peers={"x": 0.5})
    assert _fit_roofs(10e9, {"float32": 50e9}, [compute_bound]) == (10e9, {"float32": 200e9}, True)
    memory_bound = Result("softmax", "p", "float32", "cpu", time_s=1.0, flops=1e9, bytes=2e9)
    assert _fit_roofs(1e9, {"float32": 50e9}, [memory_bound]) == (2e9, {"float32": 50e9}, True)
    assert _fit_roofs(10e9, {"float32": 50e9}, [memory_bound]) == (10e9, {"float32": 50e9}, False)


def test_bench_plot_without_matplotlib_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    from opruntime.tools import plot as benchplot

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(SystemExit, match="needs matplotlib.*pip install matplotlib"):
        benchplot.require_matplotlib()


def test_progress_silent_when_not_a_terminal() -> None:
    from opruntime.tools.progress import Progress

    stream = io.StringIO()
    with Progress(2, "bench", stream=stream, delay=0) as p:
        p.update(0, "first")
        p.update(1, "second")
        p.update(2)
    assert stream.getvalue() == ""


# -- the command as a user runs it (a child process) -----------------------------------------------
def _cli(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opruntime.tools", *args], capture_output=True, text=True,
                          env=env or _env(), cwd=cwd, timeout=300)


@pytest.mark.parametrize("args", [["info"], ["info", "--json"], ["explain", "matmul", "--shape", "3x4,4x5"],
                                  ["bench", "softmax", "--shape", "8x16", "--repeats", "2", "--peers", "numpy"]])
def test_cli(args: list[str], tmp_path: Path) -> None:
    out = _cli(*args, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()


def test_cli_bench_json(tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    out = _cli("bench", "matmul", "--shape", "16x16,16x16", "--repeats", "2", "--kernels", "--output", str(path),
               "--device", "cpu", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rec = json.loads(path.read_text())["results"][0]
    assert rec["op"] == "matmul" and rec["time_s"] > 0 and rec["kernel"] == "numpy.matmul.blas"
    assert "numpy" in rec["peers"] and rec["candidates"]


def test_cli_tune_and_cache(tmp_path: Path) -> None:
    from opruntime.plugins import registry

    env = _env(OPRUNTIME_CACHE_DIR=str(tmp_path / "c"), OPRUNTIME_PLUGINS="numpy")
    out = _cli("tune", "conv2d", "--shape", "2x8x12x12,8x8x1x1", "--device", "cpu", env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    # the pointwise kernel, the im2col kernel's column-buffer configs and numba's direct kernel (where
    # numba is installed), as many as the 2 s budget allows: a numba kernel's first compile counts in it
    import re

    n_all = 2 + len(registry().kernels["numpy.conv2d.im2col"].configs)
    timed = re.search(r"tuned now: fastest of (\d+) timed", out.stdout)
    assert timed and 2 <= int(timed.group(1)) <= n_all and "numpy.conv2d." in out.stdout, out.stdout
    listed = _cli("cache", "list", env=env, cwd=tmp_path)
    assert "numpy.conv2d." in listed.stdout and "(1 entries in" in listed.stdout
    assert _cli("cache", "export", str(tmp_path / "e.json"), env=env, cwd=tmp_path).returncode == 0
    assert "removed 1 entries" in _cli("cache", "clear", env=env, cwd=tmp_path).stdout
    assert "imported 1 entries" in _cli("cache", "import", str(tmp_path / "e.json"), env=env, cwd=tmp_path).stdout
    again = _cli("tune", "conv2d", "--shape", "2x8x12x12,8x8x1x1", "--device", "cpu", env=env, cwd=tmp_path)
    assert "tuned earlier" in again.stdout
    bad = _cli("tune", "softmax", "--shape", "3x3,3x3", env=env, cwd=tmp_path)
    assert bad.returncode != 0 and "softmax takes x: give 1 to 1" in bad.stderr
