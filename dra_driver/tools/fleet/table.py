"""Rows as kubectl prints them: upper-case headers, columns padded to the widest cell, three
spaces apart. Pure."""

from __future__ import annotations

from collections.abc import Sequence


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = ([max(len(h), *map(len, column)) for h, column in zip(headers, zip(*rows, strict=True), strict=True)]
              if rows else [len(h) for h in headers])
    # One format for every line (a table of 40,000 devices is 320,000 cells).
    line = "   ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(line.format(*cells).rstrip() for cells in [headers, *rows])
