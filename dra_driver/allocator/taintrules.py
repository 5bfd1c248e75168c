"""DeviceTaintRules merged into the devices they select, as the kube-scheduler sees them.

The scheduler never reads a rule on its own: its ResourceSlice tracker
(``k8s.io/dynamic-resource-allocation/resourceslice/tracker``, ``applyPatches``) hands the
allocator copies of the slices in which each device a rule selects carries the rule's taint after
its own. A rule selects by ``spec.deviceSelector``'s ``driver``, ``pool`` and ``device``, each
matching when unset; a rule without a selector selects nothing. The taint then acts as a
published one: ``NoSchedule`` and ``NoExecute`` keep the device from any request that does not
tolerate it, ``None`` (and an effect the scheduler does not know) from none. The rule's slices
stay as the driver wrote them: only the engine's copy carries the taint.

The copy of a taint a rule added names the rule under :data:`RULE_KEY`, a key no API object has,
so that an explanation can say which rule keeps a device out of service.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from dra_driver.k8s.bodies import RawSlice
from dra_driver.k8s.objects import Obj, as_list, as_mapping, as_str, meta

RULE_KEY = "deviceTaintRule"
"""Where the engine's copy of a taint keeps the name of the DeviceTaintRule that added it."""


@dataclass(frozen=True)
class TaintRule:
    """What the scheduler reads of one DeviceTaintRule."""

    name: str
    driver: str | None
    pool: str | None
    device: str | None
    taint: Mapping[str, Any]

    def selects(self, driver: str, pool: str, device: str) -> bool:
        return ((self.driver is None or self.driver == driver) and (self.pool is None or self.pool == pool)
                and (self.device is None or self.device == device))


def taint_rule(obj: Mapping[str, Any]) -> TaintRule | None:
    """The rule as the scheduler applies it; None for one that selects nothing (no selector)."""
    spec = as_mapping(obj.get("spec"))
    selector = spec.get("deviceSelector")
    if not isinstance(selector, Mapping):
        return None
    taint = {k: v for k, v in as_mapping(spec.get("taint")).items() if k in ("key", "value", "effect", "timeAdded")}
    name = as_str(meta(obj).get("name")) or "<unnamed>"
    return TaintRule(name, as_str(selector.get("driver")), as_str(selector.get("pool")), as_str(selector.get("device")),
                     {**taint, RULE_KEY: name})


def taint_rules(objs: Iterable[Mapping[str, Any]]) -> list[TaintRule]:
    """The rules that select something, by name: the scheduler's order is its cache's, which
    changes only which of a device's taints an explanation names first."""
    rules = [r for o in objs if (r := taint_rule(o)) is not None]
    return sorted(rules, key=lambda r: r.name)


def with_taint_rules(slices: Iterable[RawSlice], rules: Sequence[TaintRule]) -> list[RawSlice]:
    """``slices`` with each rule's taint appended to the devices it selects. A slice no rule
    touches is handed on as the same object (so the inventory lends its digested pool to the next
    build), a touched one as a copy: the informer's objects are never changed."""
    if not rules:
        return list(slices)
    out: list[RawSlice] = []
    for sl in slices:
        spec = as_mapping(sl.get("spec"))
        driver = as_str(spec.get("driver")) or ""
        pool = as_str(as_mapping(spec.get("pool")).get("name")) or ""
        applying = [r for r in rules if (r.driver is None or r.driver == driver) and (r.pool is None or r.pool == pool)]
        out.append(_patched(sl, spec, driver, pool, applying) if applying else sl)
    return out


def _patched(sl: RawSlice, spec: Mapping[str, Any], driver: str, pool: str,
             rules: Sequence[TaintRule]) -> RawSlice:
    devices: list[Any] = []
    touched = False
    for raw in as_list(spec.get("devices")):
        dev = as_mapping(raw)
        name = as_str(dev.get("name")) or ""
        added = [dict(r.taint) for r in rules if r.selects(driver, pool, name)]
        if added:
            touched = True
            raw = {**dev, "taints": [*as_list(dev.get("taints")), *added]}
        devices.append(raw)
    if not touched:
        return sl
    patched: Obj = {**sl, "spec": {**spec, "devices": devices}}
    return cast(RawSlice, patched)
