"""Regenerate the command outputs the docs show, so that no sample goes stale.

A page marks a sample with the command that makes it, and the fenced block up to the closing
marker is this script's to write::

    <!-- sample: opruntime explain softmax --shape 64x1000 -->
    ```text
    $ opruntime explain softmax --shape 64x1000
    ...the command's output...
    ```
    <!-- /sample -->

``| head N`` after the command keeps the first N lines of its output (and a ``...`` line), for a
long one such as ``opruntime info``. Commands run as a user runs them: the ``opruntime`` script
of this environment in a child process, from an empty folder, with a fresh tuning cache, a
100-column terminal without colour and no ``OPRUNTIME_*`` variable; the cache folder and the
home folder are written as ``~/.cache/opruntime`` and ``~`` in the page.

    python scripts/gen_samples.py            # rewrite the samples that changed
    python scripts/gen_samples.py --check    # exit 1 when a committed sample is stale

The check compares the structure of the output, not its every character: each line that starts
at the left margin (headings, table rows, the explain lines) by its first word, with numbers
read as 0 and a table's rule as one character. A CLI that prints other sections, columns or rows fails it; another machine's CPU
name, core count, versions or timings do not. ``tests/system/test_doc_samples.py`` runs the check.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The pages that hold samples.
PAGES = (*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md")
SAMPLE = re.compile(r"(?P<open><!-- sample: (?P<cmd>.+?) -->\n)(?P<body>.*?)(?P<close><!-- /sample -->)", re.S)
HEAD = re.compile(r"\s*\|\s*head\s+(\d+)\s*$")
TIMEOUT_S = 300


@dataclass(frozen=True)
class Sample:
    """One marked sample of a page: the command line as the marker gives it, and the block."""

    page: Path
    command: str
    body: str

    @property
    def argv(self) -> list[str]:
        """The command's arguments, without the ``| head N``."""
        return shlex.split(HEAD.sub("", self.command))

    @property
    def head(self) -> int | None:
        m = HEAD.search(self.command)
        return int(m.group(1)) if m else None


def samples(pages: Iterable[Path] = PAGES) -> list[Sample]:
    """Every marked sample of ``pages``."""
    return [Sample(page, m.group("cmd"), m.group("body")) for page in pages if page.is_file()
            for m in SAMPLE.finditer(page.read_text())]


def _executable(name: str) -> str:
    """The console script ``name`` of this environment (beside ``sys.executable``), else on PATH."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        raise SystemExit(f"gen_samples: no {name!r} command in this environment: pip install -e . first")
    return found


def run(sample: Sample) -> str:
    """The block the page should hold: the prompt line and the command's output, made stable."""
    argv = sample.argv
    with tempfile.TemporaryDirectory(prefix="opruntime-samples-") as tmp:
        cache, cwd = Path(tmp) / "cache", Path(tmp) / "cwd"
        cwd.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPRUNTIME_")}
        env |= {"OPRUNTIME_CACHE_DIR": str(cache), "COLUMNS": "100", "LINES": "50", "NO_COLOR": "1",
                "TERM": "dumb", "PYTHONWARNINGS": "ignore"}
        proc = subprocess.run([_executable(argv[0]), *argv[1:]], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=TIMEOUT_S)
        if proc.returncode != 0:
            raise SystemExit(f"gen_samples: `{sample.command}` ({sample.page.name}) exited {proc.returncode}:\n"
                             f"{proc.stderr[-2000:]}")
        out = proc.stdout.replace(str(cache), "~/.cache/opruntime").replace(str(cwd), ".")
    out = out.replace(str(Path.home()), "~")
    lines = [line.rstrip() for line in out.rstrip().splitlines()]
    if sample.head is not None and len(lines) > sample.head:
        lines = [*lines[: sample.head], "..."]
    return "```text\n$ " + " ".join(argv) + "\n" + "\n".join(lines) + "\n```\n"


def skeleton(block: str) -> list[str]:
    """What the check compares: the first word of each line at the left margin, numbers as 0 and a
    table's rule as one character (its width follows the columns')."""
    words = []
    for line in block.splitlines():
        if line.strip() and not line[0].isspace() and not line.startswith("```"):
            words.append(re.sub(r"([─━═-])\1+", r"\1", re.sub(r"\d+", "0", line.split()[0])))
    return words


def update(pages: Iterable[Path] = PAGES, check: bool = False) -> list[Sample]:
    """Run every sample of ``pages``; rewrite the stale ones unless ``check``. Returns the stale ones
    (by structure when checking, by text when writing)."""
    found = samples(pages)
    fresh = {s: run(s) for s in found}

    def is_stale(s: Sample) -> bool:
        return skeleton(s.body) != skeleton(fresh[s]) if check else s.body != fresh[s]

    stale = [s for s in found if is_stale(s)]
    if not check:
        for page in {s.page for s in stale}:
            made = {s.command: fresh[s] for s in found if s.page == page}
            page.write_text(SAMPLE.sub(lambda m, made=made: m.group("open") + made[m.group("cmd")] + m.group("close"),
                                       page.read_text()))
    return stale


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when a sample is stale; write nothing")
    args = ap.parse_args(argv)
    stale = update(check=args.check)
    for s in stale:
        where = s.page.relative_to(ROOT) if s.page.is_relative_to(ROOT) else s.page
        print(("stale: " if args.check else "wrote: ") + f"{where}: {s.command}", file=sys.stderr)
    if stale and args.check:
        print("run `python scripts/gen_samples.py` and commit the pages", file=sys.stderr)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
