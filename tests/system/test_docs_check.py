"""scripts/docs_check.py: the site checked in a real browser. Its logic (pages, links, anchors,
console errors) without a browser, then one run of headless Chromium on a three-page site with a
console error, a missing image, a broken link and an overflowing table (skipped without chromium)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("docs_check", ROOT / "scripts" / "docs_check.py")
dc = importlib.util.module_from_spec(_spec)
sys.modules["docs_check"] = dc  # its dataclasses look their module up
_spec.loader.exec_module(dc)

ORIGIN = "http://127.0.0.1:8000"


def _site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    for rel in ["index.html", "api/index.html", "404.html", "img/a.svg"]:
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text("x")
    return site


def test_site_pages_and_files(tmp_path: Path) -> None:
    site = _site(tmp_path)
    assert dc.site_pages(site) == ["/", "/api/"]  # 404.html is no page of the nav
    assert dc.site_file(site, "/api/") == site / "api" / "index.html"
    assert dc.site_file(site, "/img/a.svg") == site / "img" / "a.svg"
    assert dc.site_file(site, "/missing/") is None


def test_broken_links_and_anchors(tmp_path: Path) -> None:
    site = _site(tmp_path)
    home = dc.PageReport("/", links=[f"{ORIGIN}/api/#run", f"{ORIGIN}/api/#gone", f"{ORIGIN}/nowhere/",
                                     f"{ORIGIN}/img/a.svg", "https://example.com/x#y", f"{ORIGIN}/#top"],
                         ids={"top"})
    api = dc.PageReport("/api/", links=[f"{ORIGIN}/"], ids={"run"})
    broken = dc.broken_links({"/": home, "/api/": api}, site, ORIGIN)
    assert broken == {"/": [f"{ORIGIN}/api/#gone: /api/ has no anchor #gone",
                            f"{ORIGIN}/nowhere/: no such file in the site"]}


def test_console_errors_leave_out_refused_outside_requests() -> None:
    cdn = "https://cdn.example/lib.js"
    events = [
        {"method": "Runtime.consoleAPICalled", "params": {"type": "error", "args": [{"value": "boom"}]}},
        {"method": "Runtime.consoleAPICalled", "params": {"type": "log", "args": [{"value": "fine"}]}},
        {"method": "Runtime.exceptionThrown",
         "params": {"exceptionDetails": {"exception": {"description": "TypeError: x\n    at f (a.js:1)"}}}},
        {"method": "Runtime.exceptionThrown",  # the same again: reported once
         "params": {"exceptionDetails": {"exception": {"description": "TypeError: x\n    at f (a.js:1)"}}}},
        {"method": "Log.entryAdded", "params": {"entry": {"level": "error", "text": "Failed", "url": cdn}}},
        {"method": "Log.entryAdded", "params": {"entry": {"level": "error", "text": "CSP", "url": f"{ORIGIN}/a.js"}}},
        {"method": "Log.entryAdded",  # a failed request: the server's log reports it
         "params": {"entry": {"level": "error", "source": "network", "text": "404", "url": f"{ORIGIN}/a.png"}}},
        {"method": "Runtime.exceptionThrown",
         "params": {"exceptionDetails": {"exception": {"description": f"ReferenceError: Invalid script: {cdn}"}}}},
    ]
    assert dc.console_errors(events, ORIGIN, {cdn}) == ["boom", "TypeError: x", f"CSP {ORIGIN}/a.js"]


def test_page_problems() -> None:
    rep = dc.PageReport("/p/", errors=["boom"], broken_images=["img/x.svg"], scroll_width=1500, width=1280)
    assert rep.problems() == ["console: boom", "image did not load: img/x.svg",
                              "the page is 1500 px wide in a 1280 px window: something overflows"]
    assert dc.PageReport("/q/", scroll_width=1280, width=1280).problems() == []


@pytest.mark.skipif(not any(shutil.which(b) for b in dc.BROWSERS), reason="no chromium (apt-get install chromium)")
def test_chromium_finds_each_kind_of_problem(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "ok").mkdir(parents=True)
    (site / "img.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"></svg>')
    (site / "index.html").write_text(
        '<html><body><h1 id="top">home</h1><img src="img.svg"><img src="missing.png">'
        '<a href="ok/#here">ok</a><a href="ok/#not-there">anchor</a><a href="gone/">gone</a>'
        '<script>console.error("boom")</script><script src="https://cdn.example.com/draw.js"></script></body></html>')
    (site / "ok" / "index.html").write_text(
        '<html><body><p id="here">fine</p><a href="../#top">home</a><img src="../img.svg">'
        '<link rel="stylesheet" href="https://fonts.example.com/css">'
        '<table style="width:3000px"><tr><td>wide</td></tr></table></body></html>')
    shot = tmp_path / "shot.png"
    problems, outside = dc.check_site(site, dc.find_browser(), shot, "/ok/", timeout=60, log=lambda _: None)
    got = sorted(re.sub(r"http://127\.0\.0\.1:\d+", "SITE", p) for p in problems)
    wide = [p for p in got if p.startswith("/ok/: the page is ")]
    assert len(wide) == 1 and re.fullmatch(r"/ok/: the page is 3\d{3} px wide in a 1280 px window: something overflows",
                                           wide[0])
    assert sorted(set(got) - set(wide)) == [
        "/: broken link SITE/gone/: no such file in the site",
        "/: broken link SITE/ok/#not-there: /ok/ has no anchor #not-there",
        "/: console: HTTP 404 for /missing.png",
        "/: console: boom",
        "/: image did not load: missing.png",
        "/: needs a script from outside the site (offline it is lost): https://cdn.example.com/draw.js",
    ]
    assert outside == {"/": {"https://cdn.example.com/draw.js"}, "/ok/": {"https://fonts.example.com/css"}}
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
