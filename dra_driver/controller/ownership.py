"""Which pending claims are another driver's to explain.

Two drivers' controllers can watch one cluster: this driver's two API profiles side by side, or
this driver beside another vendor's. Each reads only its own driver's opaque config, so the two
can word one claim's explanation differently, and, writing the same annotations, would overwrite
each other for as long as the claim waits. So a claim that only another driver could serve is left
to that driver's controller once it has explained it (the explanation names the driver that wrote
it, :func:`dra_driver.controller.annotations.explained_by`); until then, or where that driver has no
explaining controller, this one explains it as before.

A request alternative is another driver's when its DeviceClass's selectors, or its own, pin
``device.driver`` to names that are not ours: a top-level conjunct ``device.driver == 'x'`` (either
way round) or ``device.driver in ['x', 'y']``. Nothing else is read into an expression, so a
selector this cannot read keeps the claim ours; a claim is another driver's only when every one of
its alternatives is pinned elsewhere. A request whose DeviceClass does not exist stays ours.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from dra_driver.k8s.bodies import DeviceClasses

_QUOTED = r"""(?:'(?P<{0}>[^'\\]*)'|"(?P<{1}>[^"\\]*)")"""
_EQUALS = re.compile(rf"^device\.driver\s*==\s*{_QUOTED.format('a', 'b')}$|^{_QUOTED.format('c', 'd')}\s*==\s*device\.driver$")
_IN_LIST = re.compile(r"^device\.driver\s+in\s*\[(?P<items>[^\]]*)\]$")
_ITEM = re.compile(r"""^\s*(?:'([^'\\]*)'|"([^"\\]*)")\s*$""")


def _unquoted(text: str) -> Iterator[tuple[int, str, int]]:
    """Each character of ``text`` outside string literals, its index, and the bracket depth before it."""
    depth, quote, i = 0, "", 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        else:
            yield i, ch, depth
            depth += (ch in "([{") - (ch in ")]}")
        i += 1


def _strip_parens(text: str) -> str:
    """``text`` without parentheses that enclose all of it."""
    text = text.strip()
    while text.startswith("(") and text.endswith(")") and next(
            (i for i, ch, depth in _unquoted(text) if ch in ")]}" and depth == 1), -1) == len(text) - 1:
        text = text[1:-1].strip()
    return text


def conjuncts(expression: str) -> list[str]:
    """The top-level ``&&`` operands of ``expression`` (outside brackets and strings). An
    expression with a top-level ``||`` or ternary is one operand: what it pins cannot be read."""
    text = _strip_parens(expression)
    parts: list[str] = []
    start = 0
    for i, ch, depth in _unquoted(text):
        if depth != 0 or i < start:
            continue
        if text.startswith("||", i) or (ch == "?" and text[i - 1:i] != "."):
            return [text]  # a disjunction or a ternary (``.?`` is an optional field, not one)
        if text.startswith("&&", i):
            parts.append(text[start:i])
            start = i + 2
    parts.append(text[start:])
    return [_strip_parens(p) for p in parts]


def pinned_drivers(expression: str) -> frozenset[str] | None:
    """The driver names ``expression`` restricts devices to, or None when it pins none that can
    be read. Several pinning conjuncts intersect."""
    pinned: frozenset[str] | None = None
    for part in conjuncts(expression):
        names: frozenset[str] | None = None
        if (m := _EQUALS.match(part)) is not None:
            names = frozenset(v for v in m.groups() if v is not None)
        elif (m := _IN_LIST.match(part)) is not None:
            items = [_ITEM.match(x) for x in m.group("items").split(",")] if m.group("items").strip() else []
            if all(items):
                names = frozenset(next(g for g in it.groups() if g is not None) for it in items if it is not None)
        if names is not None:
            pinned = names if pinned is None else pinned & names
    return pinned


def _selector_expressions(selectors: Any) -> Iterator[str]:
    for sel in selectors if isinstance(selectors, list) else []:
        cel = sel.get("cel") if isinstance(sel, Mapping) else None
        expr = cel.get("expression") if isinstance(cel, Mapping) else None
        if isinstance(expr, str):
            yield expr


def alternatives(claim: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Each way a request of ``claim`` can be met: its ``exactly`` or each ``firstAvailable`` entry."""
    spec = claim.get("spec")
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    for req in (devices.get("requests") if isinstance(devices, Mapping) else None) or []:
        if not isinstance(req, Mapping):
            continue
        if isinstance(exactly := req.get("exactly"), Mapping):
            yield exactly
        for sub in req.get("firstAvailable") or []:
            if isinstance(sub, Mapping):
                yield sub


def alternative_drivers(alternative: Mapping[str, Any], classes: DeviceClasses) -> frozenset[str] | None:
    """The drivers one request alternative can be served by, when its selectors and its class's
    pin them; None when they can be any (or its class is missing)."""
    cls = classes.get(str(alternative.get("deviceClassName") or ""))
    if cls is None:
        return None
    spec = cls.get("spec")
    expressions = [*_selector_expressions(spec.get("selectors") if isinstance(spec, Mapping) else None),
                   *_selector_expressions(alternative.get("selectors"))]
    pinned: frozenset[str] | None = None
    for expr in expressions:
        names = pinned_drivers(expr)
        if names is not None:
            pinned = names if pinned is None else pinned & names
    return pinned


def foreign_drivers(claim: Mapping[str, Any], classes: DeviceClasses, driver: str) -> list[str] | None:
    """The other drivers ``claim`` is entirely for, sorted, when no alternative of it could be
    served by ``driver``; None when the claim is (also) ours or says nothing that can be read."""
    named: set[str] = set()
    seen = False
    for alt in alternatives(claim):
        seen = True
        drivers = alternative_drivers(alt, classes)
        if drivers is None or driver in drivers:
            return None
        named |= drivers
    return sorted(named) if seen else None
