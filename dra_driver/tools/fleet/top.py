"""``top``: the cluster's devices by model and by DeviceClass, as total, allocated (whole or in
shares), free and unhealthy, and how many nodes have every device of that model free (room for a
job that wants them all). A device is of a class when the class's CEL selectors all select it,
evaluated by the engine's selector path as the scheduler evaluates a class. Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dra_driver.allocator.cel.compile import compile_selector
from dra_driver.allocator.cel.errors import CelCompileError
from dra_driver.allocator.devicestates import ALLOCATED, FREE, SHARED, WITHHELD
from dra_driver.allocator.inventory import Device, Inventory
from dra_driver.allocator.rules import SchedulerRules
from dra_driver.k8s.bodies import RawDeviceClass
from dra_driver.k8s.objects import as_mapping, as_mappings, meta
from dra_driver.tools.fleet.devices import UNHEALTHY, DeviceRow
from dra_driver.tools.fleet.selects import outcomes
from dra_driver.tools.fleet.table import table


def counts(rows: Sequence[DeviceRow]) -> dict[str, int]:
    """total, allocated, shared, free, unhealthy and nodesAllFree of a set of devices."""
    by_node: dict[str, list[DeviceRow]] = {}
    for r in rows:
        by_node.setdefault(r.node, []).append(r)
    return {
        "total": len(rows),
        "allocated": sum(r.state == ALLOCATED for r in rows),
        "shared": sum(r.state == SHARED for r in rows),
        "free": sum(r.state == FREE for r in rows),
        "unhealthy": sum(r.health == UNHEALTHY for r in rows),
        "nodesAllFree": sum(all(r.state == FREE for r in node) for node in by_node.values()),
    }


def class_selects(device_class: RawDeviceClass, inventory: Inventory, rules: SchedulerRules) -> Callable[[Device], bool]:
    """Whether a DeviceClass's selectors all select a device of ``inventory``; a selector that
    does not compile selects nothing (as the scheduler fails every claim of that class)."""
    expressions = [str(as_mapping(s.get("cel")).get("expression", ""))
                   for s in as_mappings(as_mapping(device_class.get("spec")).get("selectors"))]
    try:
        compiled = [outcomes(compile_selector(e), inventory, rules) for e in expressions]
    except CelCompileError:
        return lambda _dev: False
    return lambda dev: all(of(dev) is True for of in compiled)


def top_report(rows: Sequence[DeviceRow], classes: Sequence[RawDeviceClass], inventory: Inventory,
               rules: SchedulerRules) -> dict[str, Any]:
    """The document ``top -o json`` prints (docs/fleet.md); withheld devices count under neither.
    ``inventory``: the one the rows' devices are of."""
    published = [r for r in rows if r.state != WITHHELD]
    models: dict[str, list[DeviceRow]] = {}
    for r in published:
        models.setdefault(r.model_label, []).append(r)
    by_class = []
    for cls in sorted(classes, key=lambda c: str(meta(c).get("name", ""))):
        selects = class_selects(cls, inventory, rules)
        members = [r for r in published if r.source is not None and selects(r.source.device)]
        if members:
            by_class.append({"deviceClass": str(meta(cls).get("name", "")), **counts(members)})
    return {
        "kind": "GpuTop",
        "rules": rules.label,
        "models": [{"model": m, **counts(rs)} for m, rs in sorted(models.items())],
        "deviceClasses": by_class,
        "withheld": sum(r.state == WITHHELD for r in rows),
    }


COLUMNS = ("total", "allocated", "shared", "free", "unhealthy", "nodesAllFree")
HEADERS = ("TOTAL", "ALLOCATED", "SHARED", "FREE", "UNHEALTHY", "NODES ALL FREE")


def render_top(report: Mapping[str, Any]) -> str:
    lines = [table(("MODEL", *HEADERS), [[m["model"], *(str(m[c]) for c in COLUMNS)] for m in report.get("models") or []])
             if report.get("models") else "no devices"]
    if report.get("deviceClasses"):
        lines += ["", table(("DEVICECLASS", *HEADERS),
                            [[c["deviceClass"], *(str(c[k]) for k in COLUMNS)] for c in report["deviceClasses"]])]
    if report.get("withheld"):
        lines += ["", f"withheld (not published by their nodes): {report['withheld']}"]
    return "\n".join(lines)
