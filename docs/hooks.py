"""mkdocs hooks (``hooks:`` in mkdocs.yml).

* Before each build, regenerate the reference pages from the code (``gen_reference.py``).
* List every ``docs/notes-*.md`` (written by the backend authors) under "Backend notes".
* Fill the operators' section of the API page from ``opruntime.ops`` (one entry per operator:
  adding an operator needs no edit here).
* Stand in for pages that other authors own but have not written yet, so that links to them
  work and ``mkdocs build --strict`` passes meanwhile.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

DOCS = Path(__file__).resolve().parent
#: page -> (title, what it will hold)
OWNED_ELSEWHERE = {
    "performance.md": ("Measured performance", "the measured benchmark tables, as ratios to the peers"),
    "conformance.md": ("Conformance suite", "how a backend author runs opruntime's conformance suite"),
    "jax.md": ("The JAX backend", "the JAX backend: devices, XLA and Pallas kernels"),
}


def _title(path: Path) -> str:
    m = re.search(r"^#\s+(.+)$", path.read_text(), re.M)
    return m.group(1).strip() if m else path.stem


def on_config(config: Any) -> Any:
    notes = sorted(DOCS.glob("notes-*.md"))
    if notes and config.nav is not None:
        config.nav.append({"Backend notes": [{_title(p): p.name} for p in notes]})
    return config


def on_pre_build(config: Any) -> None:
    sys.path.insert(0, str(DOCS))
    try:
        import gen_reference

        gen_reference.main([])
    finally:
        sys.path.remove(str(DOCS))


def on_files(files: Files, config: Any) -> Files:
    for name, (title, what) in OWNED_ELSEWHERE.items():
        if files.get_file_from_path(name) is None:
            text = f"# {title}\n\n!!! note \"Not written yet\"\n    This page will hold {what}.\n"
            files.append(File.generated(config, name, content=text))
    return files


OPERATORS_MARKER = "<!-- operators: one entry per operator of opruntime.ops, filled in by docs/hooks.py -->"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    if OPERATORS_MARKER not in markdown:
        return markdown
    from opruntime.ops import FUNCTIONS

    entries = "\n\n".join(f"::: {fn.__module__}.{name}" for name, fn in FUNCTIONS.items())
    return markdown.replace(OPERATORS_MARKER, entries)
