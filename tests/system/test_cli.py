"""The ``opruntime`` command (``opruntime.tools.cli``): what ``info`` lists, the bench reading its
suites, units and peers from the operators, and progress that never writes a carriage return into
a pipe."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

import opruntime as opr
from opruntime.lru import CACHES
from opruntime.ops import OPS
from opruntime.ops.base import Case
from opruntime.tools import bench, peers
from opruntime.tools.cli import main
from opruntime.tools.progress import Progress


def test_info_lists_the_operators_and_the_bounded_caches(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [o["name"] for o in data["operators"]] == list(OPS)
    matmul = next(o for o in data["operators"] if o["name"] == "matmul")
    assert matmul["operands"] == ["a", "b"] and matmul["bound"] == "compute" and "numpy" in matmul["peers"]
    caches = {c["name"]: c for c in data["caches"]}
    assert set(caches) == {c.name for c in CACHES} and "plans" in caches
    assert caches["plans"]["capacity"] > 0 and caches["plans"]["size"] >= 0
    assert main(["info"]) == 0
    text = capsys.readouterr().out
    assert "\noperators:\n" in text and "matmul(a, b)" in text and "\ncaches (entries / capacity):\n" in text


def test_suites_are_the_operators_own():
    for suite in ("cpu", "overhead", "gpu"):
        assert bench.SUITES[suite] == [c for op in OPS.values() for c in op.bench.get(suite, ())]
    assert bench.SUITES["demo"] == bench.SUITES["cpu"] + bench.SUITES["overhead"]
    assert all(c.op in OPS for cases in bench.SUITES.values() for c in cases)


def test_parse_case_builds_the_operators_case():
    case = bench.parse_case("conv2d", "1x3x8x8,4x3x3x3", "float16", ["padding=1", "stride=[2,1]", "groups=1"])
    assert case == Case(((1, 3, 8, 8), (4, 3, 3, 3)), {"padding": 1, "stride": (2, 1), "groups": 1}, "float16",
                        op="conv2d")
    with pytest.raises(SystemExit, match="softmax takes x: give 1 to 1"):
        bench.parse_case("softmax", "3x3,3x3", "float32", [])


def test_bench_reports_the_rate_the_operator_is_bound_by():
    cpu = opr.Device("cpu")
    mm = bench.run_case(Case(((16, 8), (8, 4)), op="matmul"), cpu, repeats=2, peers=["numpy"])
    sm = bench.run_case(Case(((6, 10),), {"axis": 0}, op="softmax"), cpu, repeats=2, peers=[])
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


def test_progress_lines_off_a_terminal():
    stream = io.StringIO()
    with Progress(2, "bench", stream=stream) as p:
        p.update(0, "first")
        p.candidate(1, 3, SimpleNamespace(label="k[x=1]"))
        p.candidate(3, 3, None)
    assert stream.getvalue() == "[1/2] first\n[2/3] bench: k[x=1]\n"


def test_tune_and_bench_write_no_carriage_return_into_a_pipe(tmp_path):
    env = {**os.environ, "OPRUNTIME_CACHE_DIR": str(tmp_path / "c"), "OPRUNTIME_PLUGINS": "numpy"}
    for args in (["tune", "conv2d", "--shape", "2x8x12x12,8x8x1x1", "--device", "cpu"],
                 ["bench", "softmax", "--shape", "8x16", "--repeats", "2", "--peers", "numpy"]):
        out = subprocess.run([sys.executable, "-m", "opruntime.tools", *args], capture_output=True, text=True,
                             env=env, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert "\r" not in out.stderr and out.stderr.startswith("[1/"), out.stderr
    listed = subprocess.run([sys.executable, "-m", "opruntime.tools", "cache", "list"], env=env,
                            capture_output=True, text=True, cwd=tmp_path)
    assert "numpy.conv2d." in listed.stdout and "(1 entries in" in listed.stdout
