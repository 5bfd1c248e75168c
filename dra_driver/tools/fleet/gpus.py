"""``get gpus`` (also ``devices``): one row per device of the driver, filtered by node, model, state
and a CEL selector. The selector is compiled and evaluated by the engine's request-selector path
(:func:`dra_driver.allocator.groups.outcome`, read as the cluster's scheduler reads a device): a device
it selects is one a request with that selector could get; a device it fails on is left out, and
the report says how many and the first error. Pure."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver.allocator.cel.compile import compile_selector
from dra_driver.allocator.cel.errors import CelCompileError, CelRuntimeError
from dra_driver.allocator.devicestates import FREE
from dra_driver.allocator.inventory import Inventory
from dra_driver.allocator.rules import SchedulerRules
from dra_driver.tools.fleet.args import FleetError
from dra_driver.tools.fleet.devices import DeviceRow, Holder, row_document, unhealthy_taint_keys
from dra_driver.tools.fleet.selects import outcomes
from dra_driver.tools.fleet.table import table


@dataclass(frozen=True)
class Filters:
    node: str | None = None
    model: str | None = None
    free: bool = False
    selector: str | None = None


def selected(rows: Sequence[DeviceRow], filters: Filters, inventory: Inventory,
             rules: SchedulerRules) -> tuple[list[DeviceRow], list[str]]:
    """The rows the filters keep, and what the selector could not decide (``N device(s): error``).
    ``inventory``: the one the rows' devices are of. FleetError for a selector that does not
    compile (the message names the expression and where)."""
    kept = [r for r in rows if (filters.node is None or r.node == filters.node)
            and (filters.model is None or filters.model.lower() in r.model.lower())
            and (not filters.free or r.state == FREE)]
    if filters.selector is None:
        return kept, []
    try:
        compiled = compile_selector(filters.selector)
    except CelCompileError as exc:
        raise FleetError(f"invalid --selector {filters.selector!r}: {exc.message}") from None
    of = outcomes(compiled, inventory, rules)
    out: list[DeviceRow] = []
    failed: dict[str, int] = {}
    for r in kept:
        if r.source is None:
            continue
        verdict = of(r.source.device)
        if isinstance(verdict, CelRuntimeError):
            failed[verdict.message] = failed.get(verdict.message, 0) + 1
        elif verdict is True:
            out.append(r)
    return out, [f"{n} device(s): {message}" for message, n in sorted(failed.items())]


def holder_text(h: Holder, hidden: bool = False) -> str:
    """``ns/claim (ns/pod, ...)``; where the pods were not read, whether they were hidden (403) or
    of a namespace not asked for (``-n``)."""
    if h.pods is None:
        return f"{h.claim} ({'pods hidden' if hidden else 'pods not read: another namespace'})"
    return f"{h.claim} ({', '.join(h.pods) or 'no pod'})"


def gpus_report(rows: Sequence[DeviceRow], *, hidden: str | None, withheld_hidden: str | None,
                not_decided: list[str], unreadable: list[str], rules: SchedulerRules) -> dict[str, Any]:
    """The document ``get gpus -o json`` prints (docs/fleet.md)."""
    report: dict[str, Any] = {"kind": "GpuList", "rules": rules.label, "devices": [row_document(r) for r in rows]}
    if hidden:
        report["podsHidden"] = hidden
    if withheld_hidden:
        report["withheldUnknown"] = withheld_hidden
    if not_decided:
        report["selectorErrors"] = not_decided
    if unreadable:
        report["unreadable"] = unreadable
    return report


def _state(doc: Mapping[str, Any]) -> str:
    return f"{doc['state']} ({doc['detail']})" if doc.get("detail") else str(doc["state"])


def _profile(doc: Mapping[str, Any]) -> str:
    if doc.get("canMake") is not None:
        return "dynamic"
    if not doc.get("migProfile"):
        return "-"
    return f"{doc['migProfile']} (of {doc['parent']})" if doc.get("parent") else str(doc["migProfile"])


def _health(doc: Mapping[str, Any]) -> str:
    # The health column says what the plugin's own health taints say; the others are listed.
    own = unhealthy_taint_keys(str(doc.get("driver") or ""))
    taints = [t for t in doc.get("taints") or [] if re.split("[=:]", str(t), maxsplit=1)[0] not in own]
    return ", ".join([str(doc.get("health") or "-"), *taints])


def _holders(doc: Mapping[str, Any], hidden: bool) -> str:
    return "; ".join(holder_text(Holder(h["claim"], h["pods"]), hidden) for h in doc.get("holders") or []) or "-"


def render_gpus(report: Mapping[str, Any], *, wide: bool = False) -> str:
    devices = report.get("devices") or []
    if not devices:
        lines = ["no devices"]
    else:
        headers = ["NODE", "DEVICE", "MODEL", "MEMORY", "MIG", "HEALTH", "STATE", "HOLDERS"]
        if wide:
            headers += ["POOL", "CAN MAKE", "CAPACITY USED"]
        rows = []
        for d in devices:
            row = [d["node"], d["device"], d["model"] or "-", d["memory"] or "-", _profile(d), _health(d), _state(d),
                   _holders(d, bool(report.get("podsHidden")))]
            if wide:
                can = d.get("canMake")
                row += [d["pool"] or "-",
                        "-" if can is None else ", ".join(f"{p} x{n}" for p, n in can.items()) or "nothing",
                        ", ".join(f"{k} {v['used']}/{v['total']}" for k, v in (d.get("capacityUsed") or {}).items())
                        or "-"]
            rows.append(row)
        lines = [table(headers, rows)]
    lines += notes(report)
    return "\n".join(lines)


def notes(report: Mapping[str, Any]) -> list[str]:
    """The lines under a table: what was hidden, not decided or not readable."""
    out = []
    if report.get("podsHidden"):
        out.append(f"pod names hidden: {report['podsHidden']}; the claims are shown")
    if report.get("withheldUnknown"):
        out.append(f"withheld devices unknown: {report['withheldUnknown']}")
    for line in report.get("selectorErrors") or []:
        out.append(f"selector failed on {line}")
    for line in report.get("unreadable") or []:
        out.append(f"not readable, left out: {line}")
    return out
