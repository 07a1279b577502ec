"""The ``opruntime`` command (``opruntime.tools.cli``, on click): its entry points and help, one
line and exit status 2 for a user's mistake, strict JSON in SI units from every command, tables
readable at 100 columns, quiet broken pipes, progress silent off a terminal; and the bench
reading its suites, units and peers from the operators."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import click
import numpy as np
import pytest

import opruntime as opr
from opruntime.config import settings
from opruntime.errors import NoKernelError, ShapeError
from opruntime.lru import CACHES
from opruntime.ops import OPS
from opruntime.ops.base import Case
from opruntime.tools import bench, output, peers
from opruntime.tools.cli import cli, main, problem_fields
from opruntime.tools.progress import Progress

ROOT = Path(__file__).resolve().parents[2]


def strict_json(text: str) -> object:
    """``json.loads`` that fails on NaN and infinities (not JSON)."""
    def fail(constant: str) -> None:
        raise AssertionError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=fail)


def run(*args: str, tmp_path: Path, shell: str | None = None) -> subprocess.CompletedProcess:
    """``python -m opruntime ARGS`` in a child process (or ``shell`` with ``{opr}`` for the command)."""
    env = {**os.environ, "OPRUNTIME_CACHE_DIR": str(tmp_path / "c"), "OPRUNTIME_PLUGINS": "numpy",
           "PYTHONPATH": str(ROOT)}
    if shell is not None:
        return subprocess.run(["bash", "-c", shell.replace("{opr}", f"{sys.executable} -m opruntime")], capture_output=True,
                              text=True, env=env, cwd=tmp_path, timeout=300)
    return subprocess.run([sys.executable, "-m", "opruntime", *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)


# -- entry points, help ----------------------------------------------------------------------------
def test_version_and_python_dash_m(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"opruntime {opr.__version__}\n"
    helped = run("--help", tmp_path=tmp_path)
    assert helped.returncode == 0 and helped.stderr == ""
    assert all(name in helped.stdout for name in ("info", "bench", "tune", "cache", "explain", "plot", "--version"))


def test_importing_the_entry_module_loads_no_tool() -> None:
    code = "import sys, opruntime.__main__; print(any(m.startswith('opruntime.tools') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _commands(group: click.Group, path: str = "opruntime") -> list[tuple[str, click.Command]]:
    out = []
    for name, command in group.commands.items():
        out.append((f"{path} {name}", command))
        if isinstance(command, click.Group):
            out += _commands(command, f"{path} {name}")
    return out


def test_every_option_has_help_and_every_command_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    for path, command in _commands(cli):
        assert "Example" in (command.help or ""), f"{path}: no example in its help"
        for param in command.params:
            if isinstance(param, click.Option):
                assert param.help, f"{path} {param.opts[0]}: no help text"
    assert main(["bench", "--help"]) == 0
    text = capsys.readouterr().out
    assert "[default: 15; x>=1]" in text and "[default: float32]" in text  # defaults shown


# -- user errors: one line, status 2 ------------------------------------------------------------------
@pytest.mark.parametrize(("args", "says"), [
    (["explain", "softmax", "--shape", "3x4", "--attr", "axsi=0"], "UnknownAttributeError: softmax() got"),
    (["cache", "export"], "Missing argument 'PATH'"),
    (["cache", "import", "missing.json"], "does not exist"),
    (["cache", "import", "bad.json"], "CacheError: cannot import"),
    (["bench", "softmax", "--shape", "8x16", "--repeats", "0"], "--repeats"),
    (["bench", "softmx", "--shape", "8x16"], "did you mean 'softmax'?"),
    (["bench", "softmax", "--shape", "8xq"], "bad shape '8xq'"),
    (["bench", "matmul", "--suite", "attention"], "no case of matmul: give --shape"),
    (["bench", "softmax", "--shape", "8x16", "--peers", "nope"], "unknown peer(s) nope"),
    (["bench", "softmax", "--shape", "8x16", "--only", "numba"], "--only picks among the candidates"),
    (["tune", "softmax", "--shape", "3x3,3x3"], "softmax takes x: give 1 to 1"),
    (["tune", "softmax", "--shape", "3x3", "--budget", "0"], "--budget"),
    (["explain", "softmax", "--shape", "3x4", "--device", "nowhere:0"], "UnknownDeviceError"),
    (["explain", "softmax", "--shape", "3x4", "--attr", "axis"], "write name=value"),
    (["info", "--nope"], "No such option"),
    (["plot"], "give bench JSON files and -o PATH"),
    (["plot", "bad.json", "-o", "x.svg"], "ConfigError: cannot read the bench figures bad.json"),
    (["plot", "missing.json", "-o", "x.svg"], "does not exist"),
    (["plot", "--page", "bad.json", "-o", "x.svg"], "--page redraws the page"),
])
def test_user_errors_are_one_line_and_status_2(args: list[str], says: str, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.json").write_text("{not json")
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("opruntime: ") and captured.err.count("\n") == 1, captured.err
    assert says in captured.err and "Traceback" not in captured.err


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    plain = run("explain", "softmax", "--shape", "3x4", "--attr", "axsi=0", tmp_path=tmp_path)
    assert plain.returncode == 2 and plain.stderr.count("\n") == 1 and "Traceback" not in plain.stderr
    debug = run("--debug", "explain", "softmax", "--shape", "3x4", "--attr", "axsi=0", tmp_path=tmp_path)
    assert debug.returncode == 2 and "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.rstrip().splitlines()[-1] == plain.stderr.rstrip()


def test_a_reader_that_stops_early_ends_it_quietly(tmp_path: Path) -> None:
    first = run(tmp_path=tmp_path, shell="{opr} info 2>err.txt | head -1")
    assert first.stdout == f"opruntime {opr.__version__}\n"
    # head -n 0 exits before the command writes: every write meets a closed pipe
    for command in ("info", "bench softmax --shape 8x16 --repeats 3 --peers none"):
        closed = run(tmp_path=tmp_path, shell="{opr} " + command + " 2>err.txt | head -n 0; echo ${PIPESTATUS[0]}")
        assert closed.stdout.strip() == "1", closed.stdout  # the Python docs' recipe: status 1, nothing said
        assert (tmp_path / "err.txt").read_text() == ""


# -- one JSON convention, strict, SI units -------------------------------------------------------------
def test_info_lists_the_operators_caches_and_settings(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--json"]) == 0
    data = strict_json(capsys.readouterr().out)
    assert [o["name"] for o in data["operators"]] == list(OPS)
    matmul = next(o for o in data["operators"] if o["name"] == "matmul")
    assert matmul["operands"] == ["a", "b"] and matmul["bound"] == "compute" and "numpy" in matmul["peers"]
    caches = {c["name"]: c for c in data["caches"]}
    assert set(caches) == {c.name for c in CACHES} and caches["plans"]["capacity"] > 0
    assert data["settings"]["tune_budget"] == settings().tune_budget and "tune_budget" in data["settings"]
    assert main(["info"]) == 0
    text = capsys.readouterr().out
    assert "\noperators:\n" in text and "matmul(a, b)" in text and "\ncaches:\n" in text
    assert "Settings(" not in text  # a table, not the repr
    settings_rows = text.split("\nsettings:\n", 1)[1].splitlines()
    assert settings_rows[0].split() == ["setting", "value", "set", "by"]
    assert any(row.split()[:2] == ["tune_budget", str(settings().tune_budget)] for row in settings_rows)


def test_json_flag_and_output_file_on_every_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "explain.json"
    assert main(["explain", "conv2d", "--shape", "1x3x8x8,4x3x3x3", "--attr", "padding=1", "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert "chosen" in captured.out.lower() and captured.err == f"wrote {out}\n"  # the table still printed
    from_file = strict_json(out.read_text())
    assert main(["explain", "conv2d", "--shape", "1x3x8x8,4x3x3x3", "--attr", "padding=1", "--json"]) == 0
    assert strict_json(capsys.readouterr().out) == from_file
    assert from_file["chosen"] in {c["label"] for c in from_file["candidates"]}
    for args in (["cache", "path"], ["cache", "list"], ["cache", "clear"]):
        assert main([*args, "--json"]) == 0
        assert isinstance(strict_json(capsys.readouterr().out), (dict, list))


def test_bench_json_is_strict_and_in_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "matmul", "--shape", "33x17,17x9", "--device", "cpu", "--repeats", "3",
                 "--peers", "numpy", "--json"]) == 0
    data = strict_json(capsys.readouterr().out)  # stdout is the JSON alone
    (r,) = data["results"]
    assert r["flops"] == 2 * 33 * 17 * 9 and isinstance(r["bytes"], int) and r["bytes"] > 0
    assert isinstance(r["time_s"], float) and r["time_s"] > 0 and r["overhead_s"] >= 0
    p10, p90 = r["spread_s"]["opruntime"]
    assert p10 <= r["time_s"] <= p90 and set(r["spread_s"]) >= {"opruntime", "direct", "overhead", "peer:numpy"}
    assert isinstance(r["noisy"], list) and "numpy" in r["ratios"]


def test_bench_runs_a_suites_cases_of_the_named_operators(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    ran = []

    def record(case, device, **kw):  # noqa: ANN001, ANN003 - bench.run_case's signature
        ran.append(case)
        return bench.Result(case.op, case.label, case.dtype, device.name, error="RuntimeError: not timed")

    monkeypatch.setattr(bench, "run_case", record)
    main(["bench", "matmul", "softmax", "--suite", "cpu", "--device", "cpu", "--json"])
    capsys.readouterr()
    want = [c for c in bench.SUITES["cpu"] if c.op in ("matmul", "softmax")]
    assert ran == want and {c.op for c in want} == {"matmul", "softmax"}  # (none there: a usage error, below)


def test_bench_json_turns_nan_into_null(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def failing(case, device, **kw):  # noqa: ANN001, ANN003 - bench.run_case's signature
        return bench.Result(case.op, case.label, case.dtype, device.name, error="RuntimeError: no")

    monkeypatch.setattr(bench, "run_case", failing)
    assert main(["bench", "softmax", "--shape", "8x16", "--repeats", "3", "--json"]) == 1  # a failed case
    (r,) = strict_json(capsys.readouterr().out)["results"]
    assert r["time_s"] is None and r["rate"] is None and r["flops"] is None and r["error"] == "RuntimeError: no"


def test_bench_json_records_the_command_and_plot_draws_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``bench -o`` records its command line (the performance page prints it under each chart), and
    ``opruntime plot`` draws the file; the page's tool reads the same command back."""
    data = tmp_path / "softmax 1.json"  # a space: the recorded command quotes it
    args = ["bench", "softmax", "--shape", "8x16", "--repeats", "3", "--peers", "numpy", "-o", str(data)]
    assert main(args) == 0
    capsys.readouterr()
    recorded = strict_json(data.read_text())
    assert recorded["command"] == f"opruntime bench softmax --shape 8x16 --repeats 3 --peers numpy -o '{data}'"
    from opruntime.tools import plot

    assert plot.load_source(data).command == recorded["command"]
    pytest.importorskip("matplotlib")
    svg = tmp_path / "softmax.svg"
    assert main(["plot", str(data), "-o", str(svg), "--op", "softmax", "--title", "softmax on cpu"]) == 0
    assert capsys.readouterr().err == f"wrote {svg}\n"
    assert "<svg" in svg.read_text() and "softmax on cpu" in svg.read_text()


def test_tune_and_cache_list(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["tune", "conv2d", "--shape", "2x8x12x12,8x8x1x1", "--attr", "padding=1", "--device", "cpu",
            "--budget", "1"]
    assert main([*args, "--json"]) == 0
    (row,) = strict_json(capsys.readouterr().out)
    assert isinstance(row["time_s"], float) and 0 < row["time_s"] < 1 and isinstance(row["tuning_s"], float)
    assert row["winner"].startswith("numpy.conv2d.") and row["op"] == "conv2d"
    assert main(["cache", "list"]) == 0
    text = capsys.readouterr().out
    assert "2x8x12x12 x 8x8x1x1" in text and "numpy.conv2d." in text
    assert "padding=(1, 1, 1, 1)" in text and "groups" not in text  # the attributes that differ from the defaults
    assert "|" not in text and "(1 entries in" in text  # readable, not the raw key
    assert main(["cache", "list", "--json"]) == 0
    (entry,) = strict_json(capsys.readouterr().out)
    assert entry["key"].startswith("conv2d|") and entry["shapes"] == [[2, 8, 12, 12], [8, 8, 1, 1]]
    assert entry["attrs"]["padding"] == [1, 1, 1, 1] and entry["dtypes"] == ["float32", "float32"]
    assert entry["device_name"] == "cpu" and entry["time_s"] == pytest.approx(row["time_s"])


def test_problem_fields_reads_exact_and_pow2_keys() -> None:
    exact = "softmax|((4, 6),)|float32|((1, 4),)|[('axis', -1)]"
    assert problem_fields(exact) == {"op": "softmax", "shapes": [[4, 6]], "dtypes": ["float32"],
                                     "attrs": {"axis": -1}, "bucket": "exact", "layout": "strided"}
    pow2 = "matmul|pow2((32, 16), (16, 8))|float16,float16|c,c|[]"
    assert problem_fields(pow2) == {"op": "matmul", "shapes": [[32, 16], [16, 8]], "dtypes": ["float16", "float16"],
                                    "attrs": {}, "bucket": "pow2", "layout": "contiguous"}
    assert problem_fields("odd|key") == {"op": "odd"}


def test_cache_export_and_import_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "e.json"
    assert main(["cache", "export", str(path)]) == 0
    assert capsys.readouterr().out == f"exported 0 entries to {path}\n"
    assert main(["cache", "import", str(path), "--json"]) == 0
    assert strict_json(capsys.readouterr().out) == {"imported": 0, "path": str(path)}


# -- tables, progress ----------------------------------------------------------------------------------
def test_tables_fit_100_columns_and_are_plain_off_a_terminal(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    cpu = opr.Device("cpu")
    results = [bench.run_case(Case(((2, 8, 12, 12), (8, 8, 3, 3)), {"padding": 1}, op="conv2d"), cpu, repeats=3,
                              kernels=True, peers=["numpy", "torch", "jax", "onnx"]),
               bench.run_case(Case(((8, 16),), op="softmax"), cpu, repeats=3, peers=["numpy", "torch", "jax"])]
    text = bench.format_table(results, width=100)  # as a 100-column terminal shows it
    assert all(len(line) <= 100 for line in text.splitlines()), text
    cells = " ".join(text.split())
    assert "numpy.conv2d." in text and "softmax 8x16 float32" in cells and "vs numpy" in text
    assert main(["info"]) == 0  # off a terminal (captured): plain text, whole rows, no colour
    info = capsys.readouterr().out
    assert "\x1b[" not in info and any(line.split()[:2] == ["cpu", "x86_64"] or line.startswith("cpu ")
                                        for line in info.splitlines())
    rows = [line for line in info.splitlines() if line.startswith("scaled_dot_product_attention(")]
    assert rows and "enable_gqa)" in rows[0]  # not wrapped


def test_progress_is_silent_off_a_terminal() -> None:
    stream = io.StringIO()
    with Progress(2, "bench", stream=stream, delay=0) as p:
        p.update(0, "first")
        p.candidate(1, 3, SimpleNamespace(label="k[x=1]"))
        p.candidate(3, 3, None)
    assert stream.getvalue() == ""


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_draws_a_rich_bar_on_a_terminal() -> None:
    stream = Terminal()
    with Progress(4, "bench", stream=stream, delay=0) as p:
        p.update(1, "softmax 8x16")
        assert p.bar is not None and p.bar.tasks[0].completed == 1 and p.bar.tasks[0].total == 4
        p.candidate(2, 5, SimpleNamespace(label="k[x=1]"))
        assert p.bar.tasks[0].total == 5 and "k[x=1]" in p.bar.tasks[0].description
    assert p.bar is None and "bench" in stream.getvalue()
    later = Progress(4, "bench", stream=Terminal(), delay=60)
    later.update(1, "quick")  # work shorter than the delay shows no bar
    assert later.bar is None and later.stream.getvalue() == ""


def test_strict_turns_every_non_finite_into_null() -> None:
    data = {"a": float("nan"), "b": [float("inf"), -float("inf"), 1.5], "c": (np.float32(2.0), np.int64(3)),
            "d": bench.Result("matmul", "p", "float32", "cpu")}
    text = output.dumps(data)
    back = strict_json(text)
    assert back["a"] is None and back["b"] == [None, None, 1.5] and back["c"] == [2.0, 3]
    assert back["d"]["time_s"] is None and back["d"]["op"] == "matmul"


# -- the bench's cases, units and peers ---------------------------------------------------------------
def test_suites_are_the_operators_own():
    for suite in ("cpu", "overhead", "gpu"):
        assert bench.SUITES[suite] == [c for op in OPS.values() for c in op.bench.get(suite, ())]
    assert bench.SUITES["demo"] == bench.SUITES["cpu"] + bench.SUITES["overhead"]
    assert all(c.op in OPS for cases in bench.SUITES.values() for c in cases)


def test_parse_case_builds_the_operators_case():
    case = bench.parse_case("conv2d", "1x3x8x8,4x3x3x3", "float16", ["padding=1", "stride=[2,1]", "groups=1"])
    assert case == Case(((1, 3, 8, 8), (4, 3, 3, 3)), {"padding": 1, "stride": (2, 1), "groups": 1}, "float16",
                        op="conv2d")
    with pytest.raises(ShapeError, match="softmax takes x: give 1 to 1"):
        bench.parse_case("softmax", "3x3,3x3", "float32", [])
    with pytest.raises(ShapeError, match="bad shape"):
        bench.parse_case("softmax", "3xa", "float32", [])
    with pytest.raises(NoKernelError, match="did you mean 'softmax'"):
        bench.parse_case("softmx", "3x3", "float32", [])
    assert bench.parse_attr("is_causal=True") == ("is_causal", True) and bench.parse_attr("m=x") == ("m", "x")


def test_bench_reports_the_rate_the_operator_is_bound_by():
    cpu = opr.Device("cpu")
    mm = bench.run_case(Case(((16, 8), (8, 4)), op="matmul"), cpu, repeats=3, peers=["numpy"])
    sm = bench.run_case(Case(((6, 10),), {"axis": 0}, op="softmax"), cpu, repeats=3, peers=[])
    assert not mm.error and not sm.error and (mm.unit, sm.unit) == ("GFLOP/s", "GB/s")
    assert mm.rate == pytest.approx(mm.flops / mm.time_s / 1e9) and sm.rate == pytest.approx(sm.bytes / sm.time_s / 1e9)
    assert "numpy" in mm.peers and not sm.peers
    assert 0 < mm.select_s < mm.time_s


def test_peers_come_from_the_operator(capsys: pytest.CaptureFixture[str]):
    seen = []

    def numpy_peer(lib, x, axis=-1):
        seen.append((lib, axis))
        return lib.exp(x)

    def torch_peer(lib, x, axis=-1):
        raise ValueError("not this one")

    op = SimpleNamespace(peers={"numpy": numpy_peer, "jax": lambda jax, x, axis=-1: NotImplemented,
                                "torch": torch_peer, "triton": numpy_peer})
    case = Case(((3, 4),), {"axis": 1}, op="softmax")
    host = [np.ones((3, 4), np.float32)]
    found = peers.contenders(op, case, host, opr.Device("cpu"), host[0])
    assert seen == [(np, 1)] and "numpy" in found  # with lib=numpy and the case's attributes, run once to check
    assert "triton" not in found and "cupy" not in found  # not on this device: left out quietly
    call, sync = found["numpy"]
    call()
    sync()
    assert seen == [(np, 1), (np, 1)]
    err = capsys.readouterr().err
    if peers._installed("jax"):
        assert "peer jax:" in err and "NotImplemented" in err  # answered NotImplemented: skipped, with why
    if peers._installed("torch"):
        assert "peer torch: ValueError: not this one" in err
    assert "triton" not in err and "cupy" not in err
    assert peers.contenders(op, case, host, opr.Device("cpu"), host[0], wanted=[]) == {}


def test_copy_baseline_moves_the_bytes_of_memory_bound_operators_only():
    cpu = opr.Device("cpu")
    sm = bench.run_case(Case(((64, 256),), {"axis": -1}, op="softmax"), cpu, repeats=3, peers=["copy"])
    mm = bench.run_case(Case(((16, 8), (8, 4)), op="matmul"), cpu, repeats=3, peers=["copy"])
    assert not sm.error and set(sm.peers) == {"copy"} and sm.peer_ratios["copy"] > 0
    assert not mm.error and not mm.peers  # compute-bound: no copy to measure it against
    call, sync = peers._copy(sm.bytes, peers.Where(True))
    dst, src = call.args
    assert dst.nbytes == src.nbytes == sm.bytes // 2  # reads and writes the operator's bytes in all
    call()
    sync()
    assert (dst == 1).all()
    assert peers._copy(100, peers.Where(False)) is None  # neither the host nor a CUDA device: no copy to time


def test_kernels_only_times_the_candidates_named():
    cpu, case = opr.Device("cpu"), Case(((1, 4, 9, 9), (4, 4, 3, 3)), {"padding": 1}, op="conv2d")
    host = [np.ones(s, np.float32) for s in case.shapes]
    order = [c.label for c in OPS["conv2d"].plan(host, cpu, dict(case.attrs), settings()).order]
    other = next(k for k in order[1:] if "numba" not in k)  # (nothing to compile)
    some = bench.run_case(case, cpu, repeats=3, kernels=[other], peers=[])
    assert not some.error and some.kernel == order[0]
    assert set(some.candidates) == {order[0], other}  # the chosen kernel always, then the one named
    assert len(order) > 2  # so that some were left out


def test_peers_run_where_the_provider_says_the_data_lives():
    def device(dlpack, accelerator=False):
        def dlpack_device(data):
            if dlpack is None:
                raise AttributeError("no __dlpack_device__")
            return dlpack

        return SimpleNamespace(provider=SimpleNamespace(dlpack_device=dlpack_device, accelerator=accelerator))

    assert peers.where(device((1, 0)), None) == peers.Where(True)
    assert peers.where(device(None), None) == peers.Where(True)  # no DLPack, no accelerator: the host
    assert peers.where(device((2, 3), accelerator=True), None) == peers.Where(False, 3)  # CUDA device 3
    # an accelerator whose DLPack export is a host copy (OpenCL on a GPU) is not the host
    assert peers.where(device((1, 0), accelerator=True), None) == peers.Where(False)
    assert peers.where(device(None, accelerator=True), None) == peers.Where(False)
