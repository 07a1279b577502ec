#!/usr/bin/env python3
"""Check the docs site in a real browser: every page rendered by headless Chromium.

    python scripts/docs_check.py                       # build the site (mkdocs --strict), then check it
    python scripts/docs_check.py --site build/site     # check a site already built
    python scripts/docs_check.py --screenshot perf.png # also a screenshot of the performance page

The site is served on 127.0.0.1 (``http.server``, a free port) and each page (every ``*.html`` the
build wrote, but 404.html) is loaded in Debian's ``chromium``, driven through the Chrome DevTools
Protocol over a pipe (``--remote-debugging-pipe``: no websocket library, no browser download).
A page fails on

* a console error, an uncaught exception, or a browser log entry at level "error";
* a local request answered with an HTTP error (a missing image, stylesheet or script);
* an image that did not load (``naturalWidth == 0``);
* a link to a page of the site that does not exist, or to an anchor that page does not have;
* a page wider than the window (a table or an image that overflows instead of scrolling in its box);
* a script asked from outside the site (a CDN's): offline, the page loses what it draws (a diagram).

Requests that leave 127.0.0.1 (web fonts, a CDN's script) are refused, so that the result does not
depend on the network; they are listed at the end (without them the site falls back to the
browser's fonts; an outside script fails the page, above). Exit status:
0 when every page passes, 1 when one fails, 2 when the check cannot run (no chromium, no site).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import http.server
import itertools
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urldefrag, urlsplit

ROOT = Path(__file__).resolve().parents[1]
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")
WIDTH, HEIGHT = 1280, 900
#: what each page reports back from the browser, once loaded and its images settled
PROBE = """(async () => {
  const imgs = [...document.images];
  await Promise.all(imgs.map(i => i.complete ? null : new Promise(r => { i.onload = i.onerror = r; })));
  const width = document.documentElement.clientWidth;
  return {
    brokenImages: imgs.filter(i => i.naturalWidth === 0).map(i => i.getAttribute('src')),
    links: [...document.querySelectorAll('a[href]')].map(a => a.href),
    ids: [...document.querySelectorAll('[id]')].map(e => e.id),
    scrollWidth: document.documentElement.scrollWidth,
    width: width,
  };
})()"""


class CheckError(RuntimeError):
    """The check could not run (no browser, no site, the browser stopped answering)."""


@dataclass
class PageReport:
    """What one page did in the browser."""

    path: str  # the site path, "/performance/"
    errors: list[str] = field(default_factory=list)  # console errors, exceptions, failed local requests
    broken_images: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)
    scroll_width: int = 0
    width: int = 0
    outside_scripts: list[str] = field(default_factory=list)  # scripts asked from outside the site

    def problems(self) -> list[str]:
        """Everything wrong with the page alone (its links are checked against the other pages)."""
        out = [f"console: {e}" for e in self.errors]
        out += [f"image did not load: {src}" for src in self.broken_images]
        if self.width and self.scroll_width > self.width:
            out.append(f"the page is {self.scroll_width} px wide in a {self.width} px window: something overflows")
        out += [f"needs a script from outside the site (offline it is lost): {url}" for url in self.outside_scripts]
        return out


# -- the site: files, links --------------------------------------------------------------------------
def site_pages(site: Path) -> list[str]:
    """The site path of every HTML page the build wrote ("/", "/api/", ...), 404.html left out."""
    pages = []
    for f in sorted(site.rglob("*.html")):
        rel = f.relative_to(site).as_posix()
        if rel == "404.html":
            continue
        pages.append("/" + (rel[: -len("index.html")] if rel.endswith("index.html") else rel))
    return sorted(pages)


def site_file(site: Path, path: str) -> Path | None:
    """The file that serves ``path`` ("/api/" -> api/index.html), or None when there is none."""
    f = site / unquote(path).lstrip("/")
    if f.is_dir():
        f = f / "index.html"
    return f if f.is_file() else None


def broken_links(reports: dict[str, PageReport], site: Path, origin: str) -> dict[str, list[str]]:
    """Per page, its links into the site that lead nowhere: a missing file, or an anchor missing from
    the page it names (checked for the pages rendered; other files only for existence)."""
    out: dict[str, list[str]] = {}
    for page, rep in reports.items():
        for href in dict.fromkeys(rep.links):
            url, frag = urldefrag(href)
            if not url.startswith(origin + "/"):
                continue  # another site, mailto:, javascript:
            path = urlsplit(url).path or "/"
            target = reports.get(path) or reports.get(path + "/")
            if site_file(site, path) is None:
                out.setdefault(page, []).append(f"{href}: no such file in the site")
            elif frag and target is not None and unquote(frag) not in target.ids:
                out.setdefault(page, []).append(f"{href}: {target.path} has no anchor #{frag}")
    return out


def is_local(url: str, origin: str) -> bool:
    """Whether the browser may fetch ``url``: the site itself, or data the page carries inline."""
    return url.startswith((origin + "/", "data:", "blob:", "about:")) or url == origin


# -- serving ---------------------------------------------------------------------------------------
class _Handler(http.server.SimpleHTTPRequestHandler):
    failures: list[tuple[str, int]]

    def log_message(self, format: str, *args: Any) -> None:  # quiet; errors are kept instead
        pass

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if isinstance(code, int) and code >= 400 or str(code).isdigit() and int(code) >= 400:
            self.failures.append((self.path, int(code)))


@contextlib.contextmanager
def serve(site: Path) -> Iterator[tuple[str, list[tuple[str, int]]]]:
    """Serve ``site`` on 127.0.0.1 (a free port) in a thread; yields the origin and the list the
    server appends each failed request to (path, HTTP status)."""
    failures: list[tuple[str, int]] = []
    handler = type("Handler", (_Handler,), {"failures": failures})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", failures
    finally:
        server.shutdown()
        server.server_close()


# -- the browser, through the DevTools protocol over a pipe ------------------------------------------
def find_browser(explicit: str | None = None) -> str:
    """The Chromium binary: ``explicit``, $CHROMIUM, or the first of BROWSERS on the PATH."""
    for name in (explicit, os.environ.get("CHROMIUM"), *BROWSERS):
        if name and (path := shutil.which(name)):
            return path
    raise CheckError("no Chromium found: install Debian's package (apt-get install chromium; `make docs-check` "
                     "does it), or name the binary with --chromium or $CHROMIUM")


class Browser:
    """Headless Chromium and one tab, driven through the DevTools protocol on fds 3 and 4."""

    def __init__(self, binary: str, profile: str, timeout: float = 30.0) -> None:
        self.timeout = timeout
        cmd_r, self._cmd_w = os.pipe()  # we write commands; the browser reads them as fd 3
        self._res_r, res_w = os.pipe()  # the browser writes answers and events as fd 4
        args = [binary, "--headless", "--remote-debugging-pipe", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--mute-audio",
                "--disable-background-networking", "--disable-component-update", "--hide-scrollbars",
                f"--user-data-dir={profile}", f"--window-size={WIDTH},{HEIGHT}", "about:blank"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # Chromium's sandbox refuses to run as root

        def to_fds() -> None:
            os.dup2(cmd_r, 3)
            os.dup2(res_w, 4)

        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, pass_fds=(3, 4), preexec_fn=to_fds)
        os.close(cmd_r)
        os.close(res_w)
        self._ids = itertools.count(1)
        self._buf = b""
        self.events: list[dict[str, Any]] = []
        self.origin = ""  # requests outside it are refused (set by the caller)
        self.refused: set[str] = set()
        self.refused_scripts: set[str] = set()  # the refused requests for a script
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable", session=True)
        self.call("Fetch.enable", {"patterns": [{"urlPattern": "*"}]}, session=True)
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False}, session=True)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._cmd_w)
        with contextlib.suppress(OSError):
            os.close(self._res_r)
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _send(self, method: str, params: dict[str, Any] | None = None, session: bool = False) -> int:
        msg_id = next(self._ids)
        msg: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        return msg_id

    def _read(self, deadline: float) -> dict[str, Any] | None:
        """The next message, or None at the deadline; requests paused by Fetch are answered here."""
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self._res_r], [], [], left)
            if ready:
                chunk = os.read(self._res_r, 1 << 16)
                if not chunk:
                    raise CheckError(f"Chromium exited (status {self.proc.poll()})")
                self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        msg = json.loads(raw)
        if msg.get("method") == "Fetch.requestPaused":
            p = msg["params"]
            if is_local(p["request"]["url"], self.origin):
                self._send("Fetch.continueRequest", {"requestId": p["requestId"]}, session=True)
            else:
                self.refused.add(p["request"]["url"])
                if p.get("resourceType") == "Script":
                    self.refused_scripts.add(p["request"]["url"])
                self._send("Fetch.failRequest", {"requestId": p["requestId"], "errorReason": "BlockedByClient"},
                           session=True)
        return msg

    def call(self, method: str, params: dict[str, Any] | None = None, session: bool = False) -> dict[str, Any]:
        """Send a command and return its result; events that arrive meanwhile are kept."""
        msg_id = self._send(method, params, session)
        deadline = time.monotonic() + self.timeout
        while (msg := self._read(deadline)) is not None:
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise CheckError(f"{method}: {msg['error'].get('message', msg['error'])}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)
        raise CheckError(f"Chromium did not answer {method} within {self.timeout:.0f} s")

    def wait_event(self, name: str, timeout: float) -> bool:
        """Wait for event ``name`` (kept with the others); False at the timeout."""
        deadline = time.monotonic() + timeout
        while (msg := self._read(deadline)) is not None:
            if "method" in msg:
                self.events.append(msg)
                if msg["method"] == name:
                    return True
        return False

    def settle(self, seconds: float) -> None:
        """Let the page run ``seconds`` more (late scripts, late errors), keeping its events."""
        self.wait_event("", seconds)

    def load(self, url: str) -> None:
        self.events.clear()
        self.call("Page.navigate", {"url": url}, session=True)
        if not self.wait_event("Page.loadEventFired", self.timeout):
            raise CheckError(f"{url} did not finish loading within {self.timeout:.0f} s")
        self.settle(0.3)

    def evaluate(self, script: str) -> Any:
        res = self.call("Runtime.evaluate", {"expression": script, "awaitPromise": True, "returnByValue": True},
                        session=True)
        if "exceptionDetails" in res:
            raise CheckError(f"the probe failed: {res['exceptionDetails'].get('text')}")
        return res["result"].get("value")

    def screenshot(self, path: Path, max_height: int) -> None:
        """A PNG of the page at the window's width, as tall as the page (at most ``max_height``)."""
        height = self.evaluate("document.documentElement.scrollHeight")
        clip = {"x": 0, "y": 0, "width": WIDTH, "height": min(int(height), max_height), "scale": 1}
        shot = self.call("Page.captureScreenshot", {"format": "png", "clip": clip, "captureBeyondViewport": True},
                         session=True)
        path.write_bytes(base64.b64decode(shot["data"]))


def console_errors(events: list[dict[str, Any]], origin: str, refused: set[str] = frozenset()) -> list[str]:
    """The errors among a page's DevTools events (each one's first line, once), but those that a
    refused outside request caused: a log entry for a URL outside ``origin``, or a message that
    names one of the ``refused`` URLs (a script that could not be loaded from a CDN)."""
    out: list[str] = []
    for ev in events:
        p = ev.get("params", {})
        if ev.get("method") == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
        elif ev.get("method") == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            out.append(d.get("exception", {}).get("description") or d.get("text", "exception"))
        elif ev.get("method") == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            entry = p["entry"]
            url = entry.get("url", "")
            if entry.get("source") == "network" or url and not is_local(url, origin):
                continue  # a failed request: the server reports the local ones, outside ones were refused
            out.append(f"{entry.get('text', '')} {url}".strip())
    firsts = (e.strip().splitlines()[0] if e.strip() else e for e in out)
    return list(dict.fromkeys(e for e in firsts if not any(u in e for u in refused)))


# -- the check -------------------------------------------------------------------------------------
def check_site(site: Path, browser_bin: str, screenshot: Path | None = None, shot_page: str = "/performance/",
               max_height: int = 8000, timeout: float = 30.0,
               log: Any = print) -> tuple[list[str], dict[str, set[str]]]:
    """Render every page of ``site``; returns the problems found (one line each) and, per page, the
    outside URLs it asked for (refused: not checked)."""
    pages = site_pages(site)
    if not pages:
        raise CheckError(f"{site} holds no HTML page: build the site first (mkdocs build)")
    reports: dict[str, PageReport] = {}
    outside: dict[str, set[str]] = {}
    with tempfile.TemporaryDirectory(prefix="docs-check-") as profile, serve(site) as (origin, failures):
        browser = Browser(browser_bin, profile, timeout)
        browser.origin = origin
        try:
            for path in pages:
                failures.clear()
                browser.refused, browser.refused_scripts = set(), set()
                browser.load(origin + path)
                probe = browser.evaluate(PROBE)
                errors = console_errors(browser.events, origin, browser.refused)
                rep = PageReport(path, errors, probe["brokenImages"], probe["links"], set(probe["ids"]),
                                 probe["scrollWidth"], probe["width"], sorted(browser.refused_scripts))
                # /favicon.ico: the browser's own guess when a page names no icon, not a request of the page
                rep.errors += [f"HTTP {code} for {url}" for url, code in failures if url != "/favicon.ico"]
                reports[path] = rep
                if browser.refused:
                    outside[path] = browser.refused
                log(f"{'ok  ' if not rep.problems() else 'FAIL'} {path}")
                if screenshot is not None and path == shot_page:
                    browser.screenshot(screenshot, max_height)
        finally:
            browser.close()
        links = broken_links(reports, site, origin)
    problems = [f"{p}: {msg}" for p, rep in reports.items() for msg in rep.problems()]
    problems += [f"{p}: broken link {msg}" for p, msgs in links.items() for msg in msgs]
    if screenshot is not None and shot_page not in reports:
        problems.append(f"no page {shot_page} to take the screenshot of")
    return problems, outside


def build_site(dest: Path) -> None:
    """``mkdocs build --strict`` into ``dest`` (the repository's mkdocs.yml)."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(dest)], cwd=ROOT,
                         env=env, capture_output=True, text=True)
    if res.returncode:
        raise CheckError(f"mkdocs build --strict failed:\n{res.stderr or res.stdout}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--site", type=Path, help="a built site to check (default: build one with mkdocs --strict)")
    ap.add_argument("--chromium", help="the browser binary (default: $CHROMIUM, else chromium on the PATH)")
    ap.add_argument("--screenshot", type=Path, help="write a PNG of the performance page here")
    ap.add_argument("--screenshot-page", default="/performance/", help="the page of --screenshot (default: %(default)s)")
    ap.add_argument("--max-height", type=int, default=8000, help="the screenshot's height limit in px (default: 8000)")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds a page may take to load (default: 30)")
    args = ap.parse_args(argv)
    start = time.monotonic()
    try:
        browser = find_browser(args.chromium)
        with tempfile.TemporaryDirectory(prefix="docs-site-") as tmp:
            site = args.site
            if site is None:
                site = Path(tmp) / "site"
                build_site(site)
            elif not site.is_dir():
                raise CheckError(f"no site at {site}: build it (make docs) or leave out --site")
            problems, refused = check_site(site, browser, args.screenshot, args.screenshot_page, args.max_height,
                                           args.timeout)
    except CheckError as e:
        print(f"docs-check: {e}", file=sys.stderr)
        return 2
    if refused:
        print("outside requests, refused and not checked (offline, these pages lose what they bring):")
        by_url: dict[str, list[str]] = {}
        for page, urls in refused.items():
            for u in sorted({urlsplit(u).netloc + urlsplit(u).path for u in urls}):
                by_url.setdefault(u, []).append(page)
        for u, pages in by_url.items():
            print(f"  {u}: {', '.join(pages) if len(pages) <= 3 else f'{len(pages)} pages'}")
    if args.screenshot:
        print(f"screenshot: {args.screenshot}")
    took = time.monotonic() - start
    if problems:
        print(f"\n{len(problems)} problem(s) ({took:.1f} s):", *problems, sep="\n  ")
        return 1
    print(f"every page passed ({took:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
