"""What a published device must be for the inventory to use it, checked as the API server would
have: every attribute has exactly one value type (a version one the scheduler's semver parses), and
every capacity and counter value is a quantity. A device that fails is reported among its pool's
problems; one whose attributes or capacity the CEL environment cannot convert is not ``cel_clean``
(:class:`~dra_driver.allocator.inventory.Device`). Each map is checked once per inventory build
(:func:`checked_once`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache, partial
from typing import Any

from dra_driver.allocator.cel.functions import SemverError, parse_semver
from dra_driver.k8s.objects import as_mapping
from dra_driver.k8s.quantity import QuantityError, parse_quantity

_ATTRIBUTE_TYPES: dict[str, type] = {"int": int, "bool": bool, "string": str, "version": str}


def attribute_value(av: Any) -> tuple[str, Any] | None:
    """(kind, value) of a published attribute value with exactly one value type set, else None."""
    av = as_mapping(av)
    if len(av) == 1:
        for kind, value in av.items():
            return (kind, value) if kind in _ATTRIBUTE_TYPES and value is not None else None
    found: tuple[str, Any] | None = None
    for kind in _ATTRIBUTE_TYPES:
        value = av.get(kind)
        if value is not None:
            if found is not None:
                return None
            found = (kind, value)
    return found


@lru_cache(maxsize=4096)
def semver_ok(text: str) -> bool:
    """Whether ``text`` is a version the scheduler's semver parses."""
    try:
        parse_semver(text)
    except SemverError:
        return False
    return True


def _parses(value: Any) -> bool:
    try:
        parse_quantity(value)
    except QuantityError:
        return False
    return True


@lru_cache(maxsize=4096)
def _quantity_text_ok(text: str) -> bool:
    return _parses(text)


def _is_quantity(value: Any) -> bool:
    # Every capacity and counter of every device on each inventory build: the usual text, memoized.
    return _quantity_text_ok(value) if type(value) is str else _parses(value)


def _cel_attribute_ok(kind: str, value: Any) -> bool:
    """Whether :func:`device_activation` converts an attribute whose one value is ``kind``:
    ``value`` without an error (the same checks; ``test_fuzz_slices`` holds the two to agreeing)."""
    if not isinstance(value, _ATTRIBUTE_TYPES[kind]) or (kind == "int" and isinstance(value, bool)):
        return False
    return kind != "version" or semver_ok(value)


Checked = tuple[Any, bool, tuple[str, ...]]
"""A map's check (:func:`checked_once`): the map itself (keeping its id its own), whether the CEL input
built from it has no error, and the problems found."""


def checked_once(checked: dict[int, Checked], value: Any, check: Callable[[Any], tuple[bool, tuple[str, ...]]]) -> Checked:
    """``check(value)``, once per map object in a build: decoded slices share equal maps (of 116,000
    devices at 5,000 nodes, 16 capacity maps and 68,000 attribute maps), and checking every
    attribute of every device was most of the inventory's build."""
    found = checked.get(id(value))
    if found is None:
        clean, problems = check(value)
        found = checked[id(value)] = (value, clean, problems)
    return found


def check_attributes(attributes: Any, checked: dict[int, Checked] | None = None) -> tuple[bool, tuple[str, ...]]:
    """Every attribute of a map. ``checked`` (the build's, :func:`checked_once`) keeps each value
    checked once: the decoded slices share equal values (a GPU's map is its own, by its UUID, but
    of its 13 values only the UUID's is)."""
    problems: list[str] = []
    cel_clean = True
    for aname, aval in as_mapping(attributes).items():
        if checked is None:
            clean, bad = _check_value(aval)
        else:
            found = checked.get(id(aval))
            if found is None:
                found = checked[id(aval)] = (aval, *_check_value(aval))  # the value kept: its id stays its own
            _, clean, bad = found
        if clean:
            continue
        cel_clean = False
        problems.extend(f"attribute {aname}: {p}" for p in bad)
    return cel_clean, tuple(problems)


def _check_value(aval: Any) -> tuple[bool, tuple[str, ...]]:
    """One attribute's value: whether the CEL input converts it, and what is wrong with it."""
    # The usual shape first.
    if type(aval) is dict and len(aval) == 1:
        ((kind, value),) = aval.items()
        if type(value) is _ATTRIBUTE_TYPES.get(kind) and (kind != "version" or semver_ok(value)):
            return True, ()
    found = attribute_value(aval)
    if found is None:
        return False, ("exactly one value type must be set",)
    return _cel_attribute_ok(*found), ()


def check_quantities(what: str, entries: Any) -> tuple[bool, tuple[str, ...]]:
    """A capacity or counter map: every entry's ``value`` a quantity."""
    problems = tuple(f"{what} {name}: invalid quantity" for name, entry in as_mapping(entries).items()
                     if not _is_quantity(as_mapping(entry).get("value")))
    return not problems, problems


check_capacity = partial(check_quantities, "capacity")
check_counters = partial(check_quantities, "consumesCounters")
