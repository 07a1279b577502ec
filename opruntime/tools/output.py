"""What the ``opruntime`` command writes: strict JSON and rich tables.

One JSON convention for every command: ``--json`` prints the data as JSON on stdout instead of
the table, ``-o/--output PATH`` writes the same JSON to a file (the table still printed). The JSON
is strict (``allow_nan=False``: NaN and infinities become ``null``) and its numbers are in SI
units, the unit in the key's name (``time_s``, ``bytes``).

Tables are rich tables: fitted to the terminal on a terminal (readable at 100 columns: long
cells wrap); elsewhere (a pipe, a log, a file) plain text with no colour and no wrapping, so that
``grep`` finds whole rows.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from rich import box
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

#: the width of tables off a terminal: wide enough that rows never wrap
UNWRAPPED = 100_000


def strict(value: Any) -> Any:
    """``value`` made plain JSON data: NaN and infinities are None, tuples lists, dataclasses
    dicts, NumPy scalars Python numbers; anything else unknown is its ``str``."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return strict(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [strict(v) for v in value]
    item = getattr(value, "item", None)  # NumPy scalars
    if callable(item) and getattr(value, "shape", None) == ():
        return strict(item())
    return str(value)


def dumps(value: Any) -> str:
    """Strict JSON text of ``value`` (see :func:`strict`); ``allow_nan=False`` guarantees it."""
    return json.dumps(strict(value), indent=1, allow_nan=False)


def emit(data: Any, *, as_json: bool, output: str | None, show: Any) -> None:
    """The one output convention: JSON on stdout with ``as_json``, else ``show()`` (the human
    form); with ``output``, the JSON also goes to that file (and ``wrote PATH`` to stderr)."""
    text = dumps(data)
    if output:
        try:
            Path(output).write_text(text + "\n")
        except OSError as exc:
            import click

            raise click.FileError(output, hint=exc.strerror or str(exc)) from None
    if as_json:
        sys.stdout.write(text + "\n")
    else:
        show()
    if output:
        print(f"wrote {output}", file=sys.stderr)


def console(file: TextIO | None = None) -> Console:
    """A console on ``file`` (stdout): on a terminal, rich's own (the terminal's width, colour);
    off one, no colour and no wrapping, whatever ``COLUMNS`` says, so that a log keeps whole rows."""
    stream = file if file is not None else sys.stdout
    tty = bool(getattr(stream, "isatty", lambda: False)())
    return Console(file=stream, width=None if tty else UNWRAPPED, highlight=False, soft_wrap=False, emoji=False,
                   markup=False)


def table(head: Sequence[str], rows: Iterable[Sequence[Any]], *, right: Iterable[str] = (),
          wrap: Iterable[str] | None = None, title: str | None = None) -> Table:
    """A plain table (a rule under the header, no borders, two spaces between columns); columns
    named in ``right`` are right-aligned (numbers). When it is too wide, the columns named in
    ``wrap`` (default: all) wrap; the others keep their width."""
    aligned = set(right)
    wrapping = set(head if wrap is None else wrap)
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0), title=title,
              title_justify="left", title_style="", header_style="bold")
    for h in head:
        t.add_column(h, justify="right" if h in aligned else "left", overflow="fold", no_wrap=h not in wrapping)
    for row in rows:
        t.add_row(*(Text(str(c)) for c in row))  # Text: "[x=1]" in a kernel's label is not markup
    return t


def show(*items: RenderableType) -> None:
    """Print tables and lines on stdout through :func:`console`; off a terminal, without the
    spaces that pad a table's last column."""
    out = console()
    if out.is_terminal:
        for item in items:
            out.print(item)
        return
    import io

    buf = io.StringIO()
    plain = Console(file=buf, width=out.width, highlight=False, soft_wrap=False, emoji=False, markup=False,
                    color_system=None)
    for item in items:
        plain.print(item)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines()))


def render(item: RenderableType, width: int = 100) -> str:
    """The plain text of ``item`` at ``width`` columns, lines stripped (the tests, the docs)."""
    import io

    buf = io.StringIO()
    Console(file=buf, width=width, highlight=False, emoji=False, markup=False, color_system=None).print(item)
    return "".join(line.rstrip() + "\n" for line in buf.getvalue().splitlines())


def seconds(s: float | None) -> str:
    """A time for a table: ``52.02 us``, ``1.234 ms``, ``2.50 s``; ``-`` when unknown."""
    if s is None or not math.isfinite(s):
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.2f} us"
    return f"{s * 1e3:.3f} ms" if s < 1 else f"{s:.2f} s"


def span(lo: float, hi: float) -> str:
    """A spread for a table, in the unit of its upper end: ``51.1-53.9 ms``; ``-`` when unknown."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "-"
    scale, unit = (1e6, "us") if hi < 1e-3 else (1e3, "ms") if hi < 1 else (1.0, "s")
    return f"{lo * scale:.3g}-{hi * scale:.3g} {unit}"
