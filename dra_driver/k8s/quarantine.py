"""Objects that cannot be decoded, read around so that they fail nothing else.

The API server keeps a claim's opaque ``parameters`` (a ``RawExtension``) byte for byte: a lone
surrogate escape (``"\\ud800"``), a raw ``0xff`` byte or objects nested hundreds deep are stored and
served back inside the JSON of every list and watch that holds the claim. ``orjson`` refuses such
a document whole, so one tenant's claim used to fail every JSON list of claims in the cluster.

When a list page or a watch event does not decode, :func:`split_page` and :func:`split_event` cut
the document into its members by its structure alone (strings, brackets; iteratively, so depth
costs nothing) and each item is decoded on its own. An item that still fails becomes an
:class:`Undecodable`: what can be read of it without the offending bytes, its metadata and, for a
claim, the devices it holds (:func:`dra_driver.k8s.wire.allocation_view`, the form the accounting of
other claims reads), and why it failed. Fields the API server types (metadata, allocation results)
are always valid text: its decoder replaces what is not; only raw fields carry such bytes.

Callers leave an undecodable object out of what they hold and say so (log, metric, Event); the
informers keep the last version they could decode (:mod:`dra_driver.k8s.informer`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from dra_driver.k8s.bodies import AllocationView
from dra_driver.k8s.objects import Obj
from dra_driver.k8s.wire import allocation_view

UNDECODABLE = "UNDECODABLE"
"""The type of a watch event whose object could not be decoded; its ``object`` is the
:attr:`Undecodable.view` and its ``undecodable`` the :class:`Undecodable` itself."""

_STRUCTURE = re.compile(rb'["{}\[\]]')
_STRING_END = re.compile(rb'(?:[^"\\]|\\.)*"', re.S)
_SCALAR_END = re.compile(rb"[\s,}\]]")
_SPACE = re.compile(rb"\s*")


@dataclass(frozen=True)
class Undecodable:
    """An object that could not be decoded, as far as it could be read."""

    view: AllocationView
    """Its ``metadata`` (name, namespace, uid, resourceVersion) and ``status.allocation`` results,
    as :func:`dra_driver.k8s.wire.allocation_view` gives them (empty where unreadable)."""
    reason: str
    """The decoder's complaint, e.g. ``str is not valid UTF-8: surrogates not allowed``."""
    event_type: str = ""
    """For a watch event: ADDED, MODIFIED or DELETED; empty for a list item."""

    @property
    def namespace(self) -> str:
        return str(self.view["metadata"].get("namespace") or "")

    @property
    def name(self) -> str:
        return str(self.view["metadata"].get("name") or "")

    @property
    def uid(self) -> str:
        return str(self.view["metadata"].get("uid") or "")

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


def _skip_space(data: bytes, pos: int) -> int:
    m = _SPACE.match(data, pos)
    return m.end() if m else pos


def value_end(data: bytes, start: int) -> int:
    """Where the JSON value beginning at ``start`` ends (exclusive). ValueError when it does not."""
    if start >= len(data):
        raise ValueError("truncated JSON")
    first = data[start:start + 1]
    if first == b'"':
        m = _STRING_END.match(data, start + 1)
        if m is None:
            raise ValueError("unterminated string")
        return m.end()
    if first not in (b"{", b"["):
        m = _SCALAR_END.search(data, start)
        return m.start() if m else len(data)
    depth = 0
    pos = start
    while True:
        m = _STRUCTURE.search(data, pos)
        if m is None:
            raise ValueError("truncated JSON")
        c = m.group()
        if c == b'"':
            s = _STRING_END.match(data, m.end())
            if s is None:
                raise ValueError("unterminated string")
            pos = s.end()
            continue
        depth += 1 if c in (b"{", b"[") else -1
        pos = m.end()
        if depth == 0:
            return pos


def members(data: bytes, start: int) -> Iterator[tuple[str, int, int]]:
    """The members of the JSON object at ``start``: key and the value's byte range."""
    pos = _skip_space(data, start)
    if data[pos:pos + 1] != b"{":
        raise ValueError("not a JSON object")
    pos = _skip_space(data, pos + 1)
    if data[pos:pos + 1] == b"}":
        return
    while True:
        key_end = value_end(data, pos)
        key = orjson.loads(data[pos:key_end])
        pos = _skip_space(data, key_end)
        if data[pos:pos + 1] != b":":
            raise ValueError("expected ':' in a JSON object")
        vstart = _skip_space(data, pos + 1)
        vend = value_end(data, vstart)
        yield str(key), vstart, vend
        pos = _skip_space(data, vend)
        sep = data[pos:pos + 1]
        if sep == b"}":
            return
        if sep != b",":
            raise ValueError("expected ',' or '}' in a JSON object")
        pos = _skip_space(data, pos + 1)


def elements(data: bytes, start: int) -> Iterator[tuple[int, int]]:
    """The byte ranges of the elements of the JSON array at ``start``."""
    pos = _skip_space(data, start)
    if data[pos:pos + 1] != b"[":
        raise ValueError("not a JSON array")
    pos = _skip_space(data, pos + 1)
    if data[pos:pos + 1] == b"]":
        return
    while True:
        end = value_end(data, pos)
        yield pos, end
        pos = _skip_space(data, end)
        sep = data[pos:pos + 1]
        if sep == b"]":
            return
        if sep != b",":
            raise ValueError("expected ',' or ']' in a JSON array")
        pos = _skip_space(data, pos + 1)


def _member(data: bytes, start: int, path: tuple[str, ...]) -> Any:
    """The decoded value at ``path`` inside the object at ``start``; None where absent or unreadable."""
    try:
        for i, key in enumerate(path):
            found = next(((s, e) for k, s, e in members(data, start) if k == key), None)
            if found is None:
                return None
            if i == len(path) - 1:
                return orjson.loads(data[found[0]:found[1]])
            start = found[0]
    except ValueError:
        return None
    return None


def salvage(data: bytes, start: int, reason: str, event_type: str = "") -> Undecodable:
    """What can be read of the object at ``data[start:]``, which does not decode whole."""
    md = _member(data, start, ("metadata",))
    results = _member(data, start, ("status", "allocation", "devices", "results"))
    claim: Obj = {"metadata": md if isinstance(md, dict) else {}}
    if isinstance(results, list):
        claim["status"] = {"allocation": {"devices": {"results": results}}}
    view = allocation_view(claim)
    view["metadata"]["resourceVersion"] = str(claim["metadata"].get("resourceVersion") or "")
    return Undecodable(view, reason, event_type)


def decode_item(data: bytes, start: int, end: int) -> Obj | Undecodable | None:
    """One list item decoded on its own; None for an item that is not an object."""
    try:
        obj = orjson.loads(data[start:end])
    except ValueError as exc:  # orjson.JSONDecodeError: invalid text, too deep
        return salvage(data, start, str(exc))
    return obj if isinstance(obj, dict) else None


def split_page(data: bytes) -> tuple[Mapping[str, Any], list[Obj | Undecodable]]:
    """A list page that does not decode whole: its ``metadata`` and each of its items, decoded or not.
    ValueError when the page itself is not a JSON object with its items in an array."""
    page_md: Mapping[str, Any] = {}
    items: list[Obj | Undecodable] = []
    for key, vstart, vend in members(data, 0):
        if key == "metadata":
            md = orjson.loads(data[vstart:vend])
            page_md = md if isinstance(md, dict) else {}
        elif key == "items" and data[vstart:vstart + 1] == b"[":
            for start, end in elements(data, vstart):
                item = decode_item(data, start, end)
                if item is not None:
                    items.append(item)
    return page_md, items


def split_event(line: bytes) -> Obj:
    """A watch event that does not decode whole, as an :data:`UNDECODABLE` event. ValueError when
    not even its type and object can be told apart: the stream is out of step."""
    etype = ""
    obj_range: tuple[int, int] | None = None
    for key, vstart, vend in members(line, 0):
        if key == "type":
            etype = str(orjson.loads(line[vstart:vend]))
        elif key == "object":
            obj_range = (vstart, vend)
    if not etype or obj_range is None:
        raise ValueError("a watch event without type or object")
    start, end = obj_range
    try:
        orjson.loads(line[start:end])
    except ValueError as exc:
        bad = salvage(line, start, str(exc), etype)
        return {"type": UNDECODABLE, "object": bad.view, "undecodable": bad}
    raise ValueError("a watch event whose object decodes but whose envelope does not")
