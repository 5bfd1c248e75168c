"""Text bound for a person's terminal, made safe to print.

Names, CEL selectors, messages and annotations in a report come from whoever wrote the objects. A
control character among them (an escape sequence, a carriage return that overwrites the line
before it, a bidirectional override that reorders what the reader sees) would reach the admin's
terminal as a command, not as text; :func:`printable` shows each one as its escape instead.
"""

from __future__ import annotations

import re

from dra_driver.k8s.client import ApiError

# C0 controls but tab and newline, DEL, C1 controls, and Unicode's bidirectional embeddings,
# overrides and isolates and the line and paragraph separators.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every control character written as ``\\xNN`` or ``\\uNNNN``; tabs and the
    report's own newlines stay."""
    return _CONTROL.sub(_escape, text)


def one_line(message: object) -> str:
    """A message as one line (a YAML or server error may span several), safe for a terminal."""
    return printable(" ".join(str(message).split()))


def api_error_line(exc: ApiError) -> str:
    """What a command says of an API error, in one line: unreachable, not allowed, or the error."""
    if exc.unreachable:
        return f"cannot reach the cluster: {one_line(exc.message or exc.reason)}"
    if exc.unauthorized or exc.forbidden:
        return f"not allowed: {one_line(exc)}"
    return f"API error: {one_line(exc)}"
