"""Output for people: tables that fit the terminal width, colour only where it is welcome.

Colour goes only to a terminal, never to a file or a pipe, and never when ``NO_COLOR`` is set to
anything (https://no-color.org) or ``TERM`` is ``dumb``.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TextIO

WIDTH = 120
GAP = "  "
ELLIPSIS = "…"
_CODES = {"bold": "1", "green": "32", "yellow": "33", "red": "31", "dim": "2"}


def colour_enabled(stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    if env.get("NO_COLOR") or env.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def paint(text: str, style: str | None, enabled: bool) -> str:
    if not enabled or not style or not text:
        return text
    return f"\x1b[{_CODES[style]}m{text}\x1b[0m"


def truncate(text: str, width: int) -> str:
    """At most ``width`` characters; a cut shows as ``…``."""
    if len(text) <= width:
        return text
    return text[: max(0, width - 1)] + ELLIPSIS if width > 0 else ""


def fit_widths(natural: Sequence[int], total: int, minimum: Sequence[int]) -> list[int]:
    """Column widths that, with the gaps, fit ``total``: the widest column gives up a character
    until everything fits or every column is at its minimum."""
    widths = list(natural)
    budget = total - len(GAP) * (len(widths) - 1)
    while sum(widths) > budget:
        shrinkable = [i for i, w in enumerate(widths) if w > minimum[i]]
        if not shrinkable:
            break
        widest = max(shrinkable, key=lambda i: widths[i])
        widths[widest] -= 1
    return widths


@dataclass
class Row:
    cells: list[str]
    styles: list[str | None] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Long text (a reason) printed on lines of its own below the row, wrapped to the width."""


def render_table(header: Sequence[str], rows: Sequence[Row], *, width: int = WIDTH,
                 minimum: Sequence[int] | None = None, colour: bool = False) -> list[str]:
    """The table's lines, none longer than ``width`` characters (colour codes aside)."""
    natural = [max([len(header[i]), *(len(r.cells[i]) for r in rows)]) for i in range(len(header))]
    widths = fit_widths(natural, width, minimum or [min(8, n) for n in natural])
    lines = [paint(_line(header, widths), "bold", colour)]
    for row in rows:
        cells = [truncate(c, w).ljust(w) for c, w in zip(row.cells, widths, strict=True)]
        styles = row.styles or [None] * len(cells)
        lines.append(GAP.join(paint(c, s, colour) for c, s in zip(cells, styles, strict=True)).rstrip())
        for note in row.notes:
            lines += [paint(x, "dim", colour) for x in wrap(note, width, indent="    ")]
    return lines


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    return GAP.join(truncate(c, w).ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()


def wrap(text: str, width: int = WIDTH, indent: str = "") -> list[str]:
    """``text`` as lines of at most ``width`` characters; continuation lines indented 4 more."""
    return textwrap.wrap(text, width=width, initial_indent=indent, subsequent_indent=indent + "    ",
                         break_long_words=True, break_on_hyphens=False) or [indent.rstrip()]


def fit_lines(text: str, width: int = WIDTH) -> list[str]:
    """Every line of ``text`` kept, long ones wrapped under their own indentation."""
    out: list[str] = []
    for line in text.splitlines():
        if len(line) <= width:
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        out += wrap(line.strip(), width, indent)
    return out
