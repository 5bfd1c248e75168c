"""How values are written into API object fields: ``metav1.MicroTime`` timestamps, and text bounded
in bytes (the API server counts a note's or an annotation's size in bytes of UTF-8)."""

from __future__ import annotations

from datetime import UTC, datetime


def micro_time(when: datetime) -> str:
    """``metav1.MicroTime`` JSON form."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def cut(text: str, limit: int, mark: str = "...") -> str:
    """``text`` in at most ``limit`` bytes: cut at a character boundary, ``mark`` appended."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[: limit - len(mark.encode())].decode(errors="ignore") + mark


def one_line(text: str, limit: int, mark: str = "...") -> str:
    """Every run of whitespace (newlines too) as one space, then :func:`cut` to ``limit`` bytes."""
    return cut(" ".join(text.split()), limit, mark)
