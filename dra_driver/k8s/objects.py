"""Reading decoded API objects (plain JSON dicts) defensively, and matching node selectors."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# =========================================================================== helpers


_EMPTY: Mapping[str, Any] = {}


def as_mapping(value: Any) -> Mapping[str, Any]:
    # Decoded JSON is made of plain dicts; checking for them first skips the slow ABC isinstance
    # (a third of the inventory's digest time).
    if type(value) is dict:
        return value
    return value if isinstance(value, Mapping) else _EMPTY


def as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else []


def as_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# =========================================================================== nodes


@dataclass(frozen=True)
class Node:
    name: str | None
    labels: tuple[tuple[str, str], ...] | None = ()
    """None where the labels are not known (the node plugin reads no Node): label requirements then hold."""


def _requirement_ok(req: Mapping[str, Any], values: Mapping[str, str]) -> bool:
    key, op = as_str(req.get("key")) or "", as_str(req.get("operator")) or ""
    want = [str(v) for v in as_list(req.get("values"))]
    have = values.get(key)
    if op == "In":
        return have is not None and have in want
    if op == "NotIn":
        return have is None or have not in want
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt") and have is not None and len(want) == 1:
        try:
            a, b = int(have), int(want[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def selector_matches(selector: Mapping[str, Any], node: Node) -> bool:
    if node.name is None:
        return True  # anonymous node: optimistic, the result carries the selector
    labels = None if node.labels is None else dict(node.labels)
    fields = {"metadata.name": node.name}
    for term in as_list(selector.get("nodeSelectorTerms")):
        term = as_mapping(term)
        exprs, flds = as_list(term.get("matchExpressions")), as_list(term.get("matchFields"))
        if (
            (exprs or flds)
            and (labels is None or all(_requirement_ok(as_mapping(r), labels) for r in exprs))
            and all(_requirement_ok(as_mapping(r), fields) for r in flds)
        ):
            return True
    return False
