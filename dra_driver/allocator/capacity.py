"""Consumable capacity: what a request consumes on a shareable device under its requestPolicy, and
how to say why it cannot, in the scheduler's terms (``consumable_capacity.go`` of the incubating
allocator: calculateConsumedCapacity, violatesPolicy, requestsContainNonExistCapacity)."""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from dra_driver.allocator.inventory import Device, quantity_or_none
from dra_driver.k8s.objects import as_list, as_mapping
from dra_driver.k8s.quantity import Quantity, format_canonical, format_quantity


def show(value: Fraction) -> str:
    """A quantity for people, in the API server's canonical spelling (``8Gi``, not ``8589934592``)."""
    if value.denominator == 1 and value >= 0:
        return format_canonical(value.numerator)
    return format_quantity(value)


def round_up(requested: Quantity, policy: Mapping[str, Any]) -> Quantity:
    """The amount a request consumes under the device's requestPolicy (scheduler's
    calculateConsumedCapacity): up to ``min`` and then to the next ``step`` of a validRange, or
    up to the next validValue; unchanged when nothing fits (:func:`violates` then rejects it)."""
    vr = as_mapping(policy.get("validRange"))
    lo = quantity_or_none(vr.get("min")) if vr else None
    if lo is not None:
        if requested.value < lo.value:
            return lo
        step = quantity_or_none(vr.get("step"))
        if step is None or step.value <= 0:
            return requested
        steps = -((lo.value - requested.value) // step.value)  # ceil((requested - min) / step)
        rounded = lo.value + steps * step.value
        if rounded == requested.value:
            return requested
        # The scheduler builds this amount as a new BinarySI quantity, so its status says "30Gi".
        return Quantity(rounded, format_canonical(rounded.numerator) if rounded.denominator == 1 else "")
    return next((v for v in _valid_values(policy) if v.value >= requested.value), requested)


def _valid_values(policy: Mapping[str, Any]) -> list[Quantity]:
    parsed = (quantity_or_none(v) for v in as_list(policy.get("validValues")))
    return sorted((q for q in parsed if q is not None), key=lambda q: q.value)


def violates(value: Quantity, policy: Mapping[str, Any]) -> bool:
    """Whether ``value`` breaks the device's requestPolicy (scheduler's violatesPolicy): the
    default never does; a validRange bounds it by ``max`` and the ``step`` grid from ``min``;
    validValues must contain it."""
    default = quantity_or_none(policy.get("default"))
    if default is not None and default.value == value.value:
        return False
    vr = policy.get("validRange")
    if isinstance(vr, Mapping):
        hi, lo, step = (quantity_or_none(vr.get(k)) for k in ("max", "min", "step"))
        if hi is not None and value.value > hi.value:
            return True
        return step is not None and step.value > 0 and (value.value - (lo.value if lo else 0)) % step.value != 0
    valid = [q.value for q in _valid_values(policy)]
    return bool(valid) and value.value not in valid


def capacities(dev: Device, qualified: bool = False) -> dict[str, tuple[Quantity, Mapping[str, Any]]]:
    """The device's capacities by published name (1.36, 1.37) or, with the rules'
    ``qualified_names`` (1.38), by fully-qualified name (:attr:`Device.qualified_capacity`)."""
    if not qualified:
        return dev.capacity
    return {name: (value, policy) for name, (value, policy, _) in dev.qualified_capacity.items()}


def status_name(dev: Device, name: str, qualified: bool = False) -> str:
    """The ``consumedCapacity`` key of a capacity :func:`capacities` calls ``name``: as the device
    published it (1.38 ``capacityNameForStatus``; up to 1.37 the names are as published anyway)."""
    return dev.qualified_capacity[name][2] if qualified else name


def _qualify(dev: Device, name: str) -> str:
    return name if "/" in name else f"{dev.key[0]}/{name}"


def missing_capacity(dev: Device, requests: Mapping[str, Quantity], qualified: bool = False) -> str | None:
    """The first capacity ``requests`` names that ``dev`` does not publish, else None.

    Up to 1.37 names are compared exactly as written, with no driver domain added to either side,
    like the scheduler's requestsContainNonExistCapacity: ``<driver>/memory`` does not name
    ``memory``; 1.38 (``qualified``) resolves both sides against the device's driver.  Such a
    device is skipped (not an error): another device may publish the name."""
    if qualified:
        found = dev.qualified_capacity
        return next((name for name in requests if _qualify(dev, name) not in found), None)
    return next((name for name in requests if name not in dev.capacity), None)


def requested_twice(dev: Device, requests: Mapping[str, Quantity], qualified: bool = False) -> str | None:
    """1.38's error for a request that names one of the device's capacities both ways (``memory``
    and ``<driver>/memory``: resolveCapacityRequests, #142202), None when it does not, or when a
    name is missing on the device (the device is then skipped).  Up to 1.37 the two are different
    names and never an error."""
    if not qualified or len(requests) < 2 or missing_capacity(dev, requests, qualified) is not None:
        return None
    seen: dict[str, str] = {}
    for name in requests:
        key = _qualify(dev, name)
        if key in seen:
            ident = key.partition("/")[2]
            return f"capacity \"{ident}\" requested both as \"{name}\" and as \"{seen[key]}\""
        seen[key] = name
    return None


def _resolved(dev: Device, requests: Mapping[str, Quantity], qualified: bool) -> dict[str, Quantity]:
    """``requests`` keyed like :func:`capacities` (their names checked already)."""
    return {_qualify(dev, name): q for name, q in requests.items()} if qualified else dict(requests)


def _amount(requested: Quantity | None, total: Quantity, policy: Mapping[str, Any]) -> Quantity:
    if requested is not None:
        return round_up(requested, policy) if policy else requested
    default = quantity_or_none(policy.get("default")) if policy else None
    return default if default is not None else total


def consumption(dev: Device, requests: Mapping[str, Quantity], qualified: bool = False) -> dict[str, Quantity] | None:
    """Capacity a request would consume on ``dev`` (keyed like :func:`capacities`), None if
    impossible (or, 1.38, an error: :func:`requested_twice`).

    Every capacity the device publishes is consumed, the unrequested ones at the policy's default
    or in full, and each amount must satisfy the requestPolicy and fit the total."""
    if missing_capacity(dev, requests, qualified) is not None or requested_twice(dev, requests, qualified):
        return None
    wanted = _resolved(dev, requests, qualified)
    out: dict[str, Quantity] = {}
    for name, (total, policy) in capacities(dev, qualified).items():
        value = _amount(wanted.get(name), total, policy)
        if (policy and violates(value, policy)) or value.value > total.value:
            return None
        out[name] = value
    return out


# --------------------------------------------------------------------------- for people


def policy_text(policy: Mapping[str, Any]) -> str:
    """The requestPolicy's valid amounts: ``valid range 8Gi to 80Gi in steps of 8Gi``."""
    vr = as_mapping(policy.get("validRange"))
    if vr:
        lo, hi, step = (quantity_or_none(vr.get(k)) for k in ("min", "max", "step"))
        text = f"valid range {show(lo.value) if lo else '0'} to {show(hi.value)}" if hi else (
            f"valid range from {show(lo.value) if lo else '0'}, no maximum")
        return text + (f" in steps of {show(step.value)}" if step is not None and step.value > 0 else "")
    values = _valid_values(policy)
    if values:
        return "valid values " + ", ".join(show(v.value) for v in values)
    default = quantity_or_none(policy.get("default"))
    return f"default {show(default.value)}" if default is not None else "no restriction"


def capacity_problem(dev: Device, requests: Mapping[str, Quantity], qualified: bool = False) -> str | None:
    """Why ``requests`` cannot be consumed on ``dev`` at all, telling a requestPolicy that forbids
    the amount from an amount larger than the device; None when :func:`consumption` succeeds."""
    missing = missing_capacity(dev, requests, qualified)
    if missing is not None:
        published = ", ".join(f"`{n}`" for n in dev.capacity) or "no capacity"
        return f"capacity `{missing}` is not published by this device; it publishes {published}"
    twice = requested_twice(dev, requests, qualified)
    if twice is not None:
        return f"{twice}, an error to kube-scheduler 1.38"
    wanted = _resolved(dev, requests, qualified)
    for name, (total, policy) in capacities(dev, qualified).items():
        requested = wanted.get(name)
        value = _amount(requested, total, policy)
        shown = status_name(dev, name, qualified)
        asked = f"asked {show(requested.value)}" if requested is not None else (
            f"not requested, so it would consume {show(value.value)}")
        if policy and violates(value, policy):
            return f"{shown}: {asked}, which the device's requestPolicy does not allow ({policy_text(policy)})"
        if value.value > total.value:
            rounded = f" → {show(value.value)}" if requested is not None and value.value != requested.value else ""
            return f"{shown}: {asked}{rounded}, more than the device's {show(total.value)}"
    return None


def rounding_note(name: str, requested: Quantity | None, consumed: Fraction, policy: Mapping[str, Any]) -> str:
    """What one capacity consumes and why: ``memory: asked 7Gi → consumes 8Gi (step 1Gi)``."""
    if requested is None:
        default = quantity_or_none(policy.get("default")) if policy else None
        why = "the requestPolicy's default" if default is not None and default.value == consumed else "all of it"
        return f"{name}: not requested → consumes {show(consumed)} ({why})"
    if requested.value == consumed:
        return f"{name}: {show(consumed)}"
    vr = as_mapping(policy.get("validRange"))
    lo, step = (quantity_or_none(vr.get(k)) for k in ("min", "step")) if vr else (None, None)
    if lo is not None and requested.value < lo.value:
        why = f"minimum {show(lo.value)}"
    elif step is not None:
        why = f"step {show(step.value)}"
    else:
        why = policy_text(policy)
    return f"{name}: asked {show(requested.value)} → consumes {show(consumed)} ({why})"
