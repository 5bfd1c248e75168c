"""Keeping many decoded API objects in less memory: what informer transforms are made of.

A decoded object is a tree of dicts and lists. Two things make it bigger than it needs to be for a
reader that only reads it:

* ``metadata.managedFields``, the server-side-apply bookkeeping, often a third of an object, which
  nothing here reads (and a PUT without it keeps the server's copy);
* repetition: 40,000 GPUs carry the same ``{"string": "NVIDIA H100 80GB HBM3"}``, the same
  ``{"version": "580.95.5"}``, the same ``{"value": "81559Mi"}``; decoded, each is its own dict and
  its own string. :class:`Interner` makes equal ones one object.

Objects shared this way must not be edited in place; the controller copies before it edits (see
:mod:`dra_driver.k8s.claims`), and the engine only reads.
"""

from __future__ import annotations

from typing import Any

from dra_driver.k8s.client import Obj

_SCALARS = (str, int, float, bool, type(None))
MAX_INTERNED_STRING = 64
"""Longer strings are rarely repeated (messages, certificates) and are left alone."""


def without_managed_fields(obj: Obj) -> Obj:
    """``obj`` without ``metadata.managedFields`` (edited in place, and returned)."""
    m = obj.get("metadata")
    if isinstance(m, dict):
        m.pop("managedFields", None)
    return obj


class Interner:
    """Returns a decoded JSON tree in which equal short strings and equal flat dicts (every value a
    scalar) are one object, shared with every tree interned before.

    The table of known values is bounded: past ``limit`` entries it starts afresh. What was shared
    stays shared; later trees share among themselves again. Not thread-safe: one per informer.
    """

    def __init__(self, limit: int = 50_000) -> None:
        self.limit = limit
        self._known: dict[Any, Any] = {}

    def __call__(self, value: Any) -> Any:
        kind = type(value)
        if kind is dict:
            out = {k: self(v) for k, v in value.items()}
            if all(type(v) in _SCALARS for v in out.values()):
                # Types are part of the key: 1, 1.0 and True are equal in Python, not in JSON.
                return self._one((dict, *((k, type(v), v) for k, v in out.items())), out)
            return out
        if kind is list:
            return [self(v) for v in value]
        if kind is str and len(value) <= MAX_INTERNED_STRING:
            return self._one(value, value)
        return value

    def __len__(self) -> int:
        return len(self._known)

    def _one(self, key: Any, value: Any) -> Any:
        known = self._known.get(key)
        if known is not None:
            return known
        if len(self._known) >= self.limit:
            self._known = {}
        self._known[key] = value
        return value
