"""Reading decoded API objects (plain JSON dicts) defensively; matching and describing node selectors."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]
"""A Kubernetes object as a JSON dict."""

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


def as_mappings(value: Any) -> list[Mapping[str, Any]]:
    """The mappings of a JSON list (nothing for a value that is not a list; items that are not
    mappings left out)."""
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def as_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return as_mapping(obj.get("metadata"))


def resource_version(obj: Mapping[str, Any]) -> str:
    return str(meta(obj).get("resourceVersion", ""))


def key_of(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` for namespaced objects, ``name`` for cluster-scoped ones."""
    m = meta(obj)
    ns = m.get("namespace")
    name = str(m.get("name", ""))
    return f"{ns}/{name}" if ns else name


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


def selector_terms(selector: Any) -> Iterator[tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]]:
    """Each term of a NodeSelector as (its ``matchExpressions``, its ``matchFields``), read defensively."""
    for term in as_list(as_mapping(selector).get("nodeSelectorTerms")):
        term = as_mapping(term)
        yield ([as_mapping(r) for r in as_list(term.get("matchExpressions"))],
               [as_mapping(r) for r in as_list(term.get("matchFields"))])


def selector_matches(selector: Mapping[str, Any], node: Node) -> bool:
    if node.name is None:
        return True  # anonymous node: optimistic, the result carries the selector
    labels = None if node.labels is None else dict(node.labels)
    fields = {"metadata.name": node.name}
    return any(
        (exprs or flds)
        and (labels is None or all(_requirement_ok(r, labels) for r in exprs))
        and all(_requirement_ok(r, fields) for r in flds)
        for exprs, flds in selector_terms(selector)
    )


NODE_NAME_KEYS = ("metadata.name", "kubernetes.io/hostname")
"""A field and a label that name one node: what the scheduler writes for node-local devices."""


def describe_node_selector(allocation: Mapping[str, Any] | None) -> str:
    """``node X`` when an allocation's selector pins nodes by name, else compact JSON, or 'any node'."""
    sel = as_mapping(allocation).get("nodeSelector")
    if not sel:
        return "any node"
    names = [str(v) for exprs, flds in selector_terms(sel) for r in (*flds, *exprs)
             if r.get("key") in NODE_NAME_KEYS and r.get("operator") == "In" for v in as_list(r.get("values"))]
    if names:
        return "node " + ", ".join(dict.fromkeys(names))
    return "nodes matching " + json.dumps(sel, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
