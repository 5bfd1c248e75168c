"""Keeping many decoded API objects in less memory: what informer transforms are made of.

A decoded object is a tree of dicts and lists. Two things make it bigger than it needs to be for a
reader that only reads it:

* ``metadata.managedFields``, the server-side-apply bookkeeping, often a third of an object, which
  nothing here reads (and a PUT without it keeps the server's copy);
* repetition: 40,000 GPUs carry the same ``{"string": "NVIDIA H100 80GB HBM3"}``, the same
  ``{"version": "580.95.5"}``, the same ``{"value": "81559Mi"}``; decoded, each is its own dict.
  :class:`Interner` makes equal ones one object: a slice keeps a fraction of its decoded size, a
  slice of many MIG placements the smallest. Equal strings elsewhere are not worth the lookups:
  measured, they save little memory for much more time (the figures: docs/scale.md#the-codes-figures).

Objects shared this way must not be edited in place; the controller copies before it edits (see
:mod:`dra_driver.k8s.claims`), and the engine only reads.
"""

from __future__ import annotations

from typing import Any

from dra_driver.k8s.objects import Obj

_SCALARS = frozenset((str, int, float, bool, type(None)))


def without_managed_fields(obj: Obj) -> Obj:
    """``obj`` without ``metadata.managedFields`` (edited in place, and returned)."""
    m = obj.get("metadata")
    if isinstance(m, dict):
        m.pop("managedFields", None)
    return obj


class Interner:
    """Makes equal flat dicts (every value a scalar) one object, and equal maps of them too, shared
    by every map handed to :meth:`share` so far: 40,000 GPUs then carry one
    ``{"string": "NVIDIA H100 80GB HBM3"}``, and the MIG placements of every H100 one set of
    counters per placement.

    Most values have one string field (``{"string": ...}``, ``{"value": "80Gi"}``; a slice list
    of 5,000 nodes hands over ~2 million of them): those are found by field, then by the string
    itself. Every other value is found by a hash of its content, and a match is compared before it
    is used, so a collision only costs a missed share. Each table is bounded: past ``limit``
    entries it starts afresh. What was shared stays shared; later maps share among themselves
    again. Threads may share one: a race costs a missed share, never a wrong value.
    """

    def __init__(self, limit: int = 50_000) -> None:
        self.limit = limit
        self._known: dict[int, dict[str, Any]] = {}
        self._strings: dict[str, dict[str, dict[str, Any]]] = {}
        """``{field: string}`` dicts by field, then by string."""

    def __len__(self) -> int:
        return len(self._known) + sum(map(len, self._strings.values()))

    def share(self, mapping: Any) -> Any:
        """``mapping`` with each flat dict among its values replaced by the shared equal one (in
        place), or the shared map equal to it when every value is such a dict."""
        if type(mapping) is not dict:
            return mapping
        known = self._known
        strings = self._strings
        whole = True
        for name, value in mapping.items():
            if type(value) is not dict:
                whole = False
                continue
            if len(value) == 1:
                for field, scalar in value.items():
                    kind = type(scalar)
                    if kind is str:
                        # The commonest value by far ({"string": ...}, {"value": "80Gi"}): two
                        # lookups on hashes that strings keep, no key to build, nothing to compare.
                        by_scalar = strings.get(field)
                        if by_scalar is None:
                            by_scalar = strings[field] = {}
                        shared = by_scalar.get(scalar)
                        if shared is not None:
                            mapping[name] = shared
                        elif len(by_scalar) < self.limit:
                            by_scalar[scalar] = value
                        else:
                            strings[field] = {scalar: value}
                        continue
                    if kind not in _SCALARS:
                        whole = False
                        break
                    key = hash((field, scalar, kind))
                    shared = known.get(key)
                    if shared is not None and shared == value and _same_types(shared, value):
                        mapping[name] = shared
                    else:
                        self._put(key, value)
                continue
            kinds = tuple(map(type, value.values()))
            if not _SCALARS.issuperset(kinds):
                whole = False
                continue
            key = hash((tuple(value.items()), kinds))
            shared = known.get(key)
            if shared is not None and shared == value and _same_types(shared, value):
                mapping[name] = shared
            else:
                self._put(key, value)
        if not whole:
            return mapping
        # Its values are shared objects now: an equal map holds the very same ones.
        names, ids = tuple(mapping), tuple(map(id, mapping.values()))
        key = hash((names, ids))
        shared = known.get(key)
        if shared is not None and tuple(shared) == names and tuple(map(id, shared.values())) == ids:
            return shared
        self._put(key, mapping)
        return mapping

    def _put(self, key: int, value: dict[str, Any]) -> None:
        if len(self._known) >= self.limit:
            self._known.clear()
        self._known[key] = value


def _same_types(a: dict[str, Any], b: dict[str, Any]) -> bool:
    # 1, 1.0 and True are equal in Python, not in JSON.
    return all(type(x) is type(y) for x, y in zip(a.values(), b.values(), strict=True))
