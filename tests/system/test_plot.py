"""``python -m opruntime.tools.plot``: the performance page's charts (peer time / opruntime time per
case, one panel per device), its summary table, and that docs/performance.md shows the figures of
docs/data/current.json."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from opruntime.errors import ConfigError
from opruntime.tools import plot
from opruntime.tools.bench import Result

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "docs" / "data" / "current.json"


def _texts(svg: str) -> list[str]:
    """The text of an SVG drawn with svg.fonttype "none": its <text> elements, in order."""
    return [re.sub(r"<[^>]+>", "", t).strip() for t in re.findall(r"<text[^>]*>(.*?)</text>", svg, re.S)]


def _bench_file(tmp_path: Path, results: list[Result], name: str = "run.json", **extra: str) -> Path:
    """A file as `opruntime bench --json` writes it: date, devices, each result's fields and ratios."""
    path = tmp_path / name
    path.write_text(json.dumps({"date": "2026-11-24 10:00:00", "devices": {}, **extra,
                                "results": [asdict(r) | {"ratios": r.ratios()} for r in results]}))
    return path


def _conv(device: str = "cuda:0", dtype: str = "float32", torch: float = 1.25, jax: float = 0.5) -> Result:
    return Result("conv2d", "32x64x56x56 x 64x64x3x3 stride=1,padding=1", dtype, device, "k", time_s=2e-4,
                  peer_ratios={"torch": torch, "jax": jax})


# -- reading bench files -------------------------------------------------------------------------
def test_load_source_reads_what_bench_writes(tmp_path: Path) -> None:
    path = _bench_file(tmp_path, [_conv(), _conv("cpu", torch=0.8)], command="opruntime bench --suite gpu")
    src = plot.load_source(path)
    assert src.command == "opruntime bench --suite gpu" and src.date
    assert [r.device for r in src.results] == ["cuda:0", "cpu"]
    assert src.results[1].ratios() == {"torch": 0.8, "jax": 0.5}
    assert src.device_label("cuda:0") == "cuda:0"  # no description in the file: the bare name


def test_load_source_takes_the_ratios_of_older_files(tmp_path: Path) -> None:
    path = tmp_path / "old.json"  # before peer_ratios, the file had only "ratios"
    path.write_text(json.dumps({"date": "2026-11-22", "devices": {"cpu": {"description": "x86_64"}}, "results": [
        {"op": "matmul", "problem": "4x4 x 4x4", "dtype": "float32", "device": "cpu", "time_s": 1e-6,
         "ratios": {"numpy": 0.5}}]}))
    src = plot.load_source(path)
    assert src.results[0].ratios() == {"numpy": 0.5} and src.device_label("cpu") == "x86_64 (cpu)"


@pytest.mark.parametrize("content, words", [
    ("not json", ["cannot read"]),
    ('{"date": "x"}', ["no \"results\" list"]),
    ('{"date": "x", "results": [{"op": "matmul", "problem": "p", "dtype": "float32", "device": "cpu"}]}',
     ["results[0]", "time_s"]),
    ('{"results": []}', ["no \"date\""]),
])
def test_load_source_names_what_is_wrong(tmp_path: Path, content: str, words: list[str]) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError) as e:
        plot.load_source(path)
    assert str(path) in str(e.value) and all(w in str(e.value) for w in words)


# -- labels and charts -----------------------------------------------------------------------------
@pytest.mark.parametrize("op, problem, dtype, with_op, want", [
    ("conv2d", "32x64x56x56 x 64x64x3x3 stride=1,padding=1", "float32", False,
     ("32x64x56x56, 64x64x3x3", "fp32 stride=1,padding=1")),
    ("scaled_dot_product_attention", "4x16x4096x128 x 4x16x4096x128 x 4x16x4096x128 is_causal=True", "float16",
     False, ("3 × 4x16x4096x128", "fp16 is_causal=True")),
    ("matmul", "1024x1024 x 1024x1024", "bfloat16", False, ("1024x1024, 1024x1024", "bf16")),
    ("relu", "8192x8192", "float16", True, ("relu 8192x8192", "fp16")),
    ("resnet50", "batch=32 size=224", "float16", False, ("resnet50", "fp16 batch=32 size=224")),
    ("transformer_block", "batch=8 heads=12 captured", "float16", False,
     ("transformer_block", "fp16 batch=8 heads=12 captured")),
])
def test_case_label(op: str, problem: str, dtype: str, with_op: bool, want: tuple[str, str]) -> None:
    assert plot.case_label(Result(op, problem, dtype, "cpu"), with_op) == want


def test_case_label_marks_a_case_timed_as_device_graphs() -> None:
    r = Result("layer_norm", "8192x768 x 768 x 768 normalized_shape=768", "float16", "cuda:0", graphs=True)
    assert plot.case_label(r) == ("8192x768, 768, 768", "fp16 normalized_shape=768 (graphs)")


def test_ratio_chart_draws_every_case_and_peer_at_the_page_width(tmp_path: Path) -> None:
    out = tmp_path / "c.svg"
    panels = [("H100 (cuda:0)", [_conv(), _conv(dtype="float16", torch=0.55, jax=3.3)]),
              ("cpu", [_conv("cpu", torch=2.64, jax=1.1)])]
    plot.ratio_chart(panels, out, "conv2d")
    svg = out.read_text()
    assert re.search(r'<svg[^>]* width="540pt"', svg)  # 540 pt = 720 CSS px: the text column's width
    texts = _texts(svg)
    for want in ["conv2d", "H100 (cuda:0)", "cpu", "PyTorch", "JAX (XLA)", "1.25", "0.50", "0.55", "3.30", "2.64",
                 "1.10", "1×"]:
        assert want in texts, want
    assert "fp16 stride=1,padding=1" in " ".join(texts)
    assert "Date" not in svg and "<dc:date>" not in svg  # reproducible: no timestamp


def test_ratio_chart_refuses_nothing_to_draw(tmp_path: Path) -> None:
    no_peer = Result("matmul", "4x4 x 4x4", "float32", "cpu", time_s=1e-6)
    with pytest.raises(ConfigError, match="nothing to draw"):
        plot.ratio_chart([("cpu", [no_peer])], tmp_path / "c.svg", "matmul")


# -- the page --------------------------------------------------------------------------------------
def _page(tmp_path: Path, headline: list[dict[str, str]]) -> plot.Page:
    src = plot.load_source(_bench_file(tmp_path, [_conv(), _conv("cpu", torch=0.8, jax=1.7)], command="bench it"))
    chart = plot.Chart("conv2d", "conv2d", ("conv2d",), (src,), tuple(headline))
    return plot.Page(tmp_path / "current.json", tmp_path / "perf.md", tmp_path / "img", (chart,), {})


def test_summary_table_names_the_fastest_peer(tmp_path: Path) -> None:
    table = plot.summary_table(_page(tmp_path, [{"device": "cuda:0", "op": "conv2d"}, {"device": "cpu"}]))
    rows = table.splitlines()[2:]
    assert rows[0].endswith("| 200.0 µs | JAX (XLA) | 0.50× |")  # jax is the faster peer: the smaller ratio
    assert rows[1].endswith("| 200.0 µs | PyTorch | 0.80× |")


def test_summary_table_takes_the_copy_for_a_yardstick_not_a_peer(tmp_path: Path) -> None:
    r = _conv("cpu", torch=0.8, jax=1.7)
    r.peer_ratios["copy"] = 0.3  # 30% of the copy bandwidth: the smallest ratio, but no library
    src = plot.load_source(_bench_file(tmp_path, [r]))
    chart = plot.Chart("conv2d", "conv2d", ("conv2d",), (src,), ({"device": "cpu"},))
    page = plot.Page(tmp_path / "current.json", tmp_path / "perf.md", tmp_path / "img", (chart,), {})
    assert plot.summary_table(page).splitlines()[2].endswith("| PyTorch | 0.80× |")


def test_summary_table_headline_must_name_one_result(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="matches 2 results"):
        plot.summary_table(_page(tmp_path, [{"op": "conv2d"}]))


def test_render_page_fills_the_marked_section(tmp_path: Path) -> None:
    page = _page(tmp_path, [{"device": "cpu"}])
    page.page.write_text(f"# Perf\n\nbefore\n\n{plot.BEGIN.format(manifest='x')}\nold\n{plot.END}\n\nafter\n")
    text = plot.render_page(page)[page.page]
    assert text.startswith("# Perf\n\nbefore\n\n<!-- BEGIN figures") and text.endswith(f"{plot.END}\n\nafter\n")
    assert "old" not in text and "![conv2d" in text and "(img/perf-conv2d.svg)" in text
    assert "`bench it`" in text  # the command next to the chart
    assert (tmp_path / "img" / "perf-conv2d.svg").is_file()
    page.page.write_text("# Perf\n")
    with pytest.raises(ConfigError, match="no generated section"):
        plot.render_page(page)


def test_main_draws_one_chart_and_reports_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _bench_file(tmp_path, [_conv(), Result("relu", "8x8", "float32", "cpu", time_s=1e-6,
                                                  peer_ratios={"torch": 2.0})])
    out = tmp_path / "one.svg"
    assert plot.main([str(data), "-o", str(out), "--op", "relu"]) == 0
    texts = _texts(out.read_text())
    assert "2.00" in texts and "1.25" not in texts  # relu only
    (tmp_path / "bad.json").write_text("{}")
    assert plot.main([str(tmp_path / "bad.json"), "-o", str(out)]) == 2
    assert "bad.json" in capsys.readouterr().err


def test_performance_page_shows_the_current_figures(tmp_path: Path) -> None:
    """docs/performance.md's generated section and its charts are those that docs/data/current.json
    gives now (the charts compared by their text: every label and every ratio)."""
    page = plot.load_page(MANIFEST)
    text = page.page.read_text()
    assert plot.page_section(page) in text, (
        "docs/performance.md is stale: run `python -m opruntime.tools.plot --page docs/data/current.json`")
    for chart in page.charts:
        fresh = tmp_path / f"{chart.name}.svg"
        plot.ratio_chart(chart.panels(), fresh, chart.title)
        assert _texts(page.svg(chart).read_text()) == _texts(fresh.read_text()), (
            f"{page.svg(chart)} is stale: run `python -m opruntime.tools.plot --page docs/data/current.json`")
