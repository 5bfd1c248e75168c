"""``get nodes``: one row per node with devices of the driver: its GPUs by model (total and free),
the shares in use on them, its MIG devices, its taints and its withheld devices. Pure: read from
the device rows (:mod:`dra_driver.tools.fleet.devices`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from dra_driver.allocator.devicestates import FREE, SHARED, WITHHELD
from dra_driver.tools.fleet.devices import DeviceRow
from dra_driver.tools.fleet.table import table


def nodes_report(rows: Sequence[DeviceRow]) -> dict[str, Any]:
    """The document ``get nodes -o json`` prints (docs/fleet.md)."""
    by_node: dict[str, list[DeviceRow]] = {}
    for r in rows:
        by_node.setdefault(r.node, []).append(r)
    return {"kind": "GpuNodeList", "nodes": [node_document(node, devices) for node, devices in sorted(by_node.items())]}


def node_document(node: str, devices: Sequence[DeviceRow]) -> dict[str, Any]:
    gpus: dict[str, dict[str, int]] = {}
    mig: Counter[str] = Counter()
    mig_free: Counter[str] = Counter()
    taints: Counter[str] = Counter()
    for d in devices:
        if d.state == WITHHELD:
            continue
        if d.kind == "mig":
            mig[str(d.profile)] += 1
            mig_free[str(d.profile)] += d.state == FREE
        else:
            counts = gpus.setdefault(d.model or "unknown", {"total": 0, "free": 0})
            counts["total"] += 1
            counts["free"] += d.state == FREE
        taints.update(d.taints)
    return {
        "node": node,
        "gpus": dict(sorted(gpus.items())),
        "sharesInUse": sum(len([h for h in d.holders if h.share and not h.admin]) for d in devices if d.state == SHARED),
        "sharedDevices": sum(d.state == SHARED for d in devices),
        "migDevices": {p: {"total": n, "free": mig_free[p]} for p, n in sorted(mig.items())},
        "taints": dict(sorted(taints.items())),
        "withheld": [{"device": d.device, "rule": d.detail} for d in devices if d.state == WITHHELD],
    }


def _counts(counts: Mapping[str, Mapping[str, int]]) -> str:
    return ", ".join(f"{model} {c['free']}/{c['total']} free" for model, c in counts.items()) or "-"


def render_nodes(report: Mapping[str, Any], *, wide: bool = False) -> str:
    nodes = report.get("nodes") or []
    if not nodes:
        return "no nodes with devices of the driver"
    headers = ["NODE", "GPUS", "SHARES", "MIG", "TAINTS", "WITHHELD"]
    rows = []
    for n in nodes:
        taints = n["taints"]
        withheld = n["withheld"]
        rows.append([
            n["node"], _counts(n["gpus"]), str(n["sharesInUse"]), _counts(n["migDevices"]),
            (", ".join(f"{t} x{c}" for t, c in taints.items()) if wide else str(sum(taints.values()))) if taints else "-",
            (", ".join(f"{w['device']} ({w['rule']})" for w in withheld) if wide else str(len(withheld))) if withheld
            else "-",
        ])
    return table(headers, rows)
