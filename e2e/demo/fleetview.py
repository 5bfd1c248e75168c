"""The fleet views at the end of `make demo`: `kubectl dra get gpus -A` and `kubectl dra top`, run
in-process as kubectl runs the plugin, cut to what a person reads in 120 columns: of `get gpus`,
the devices that are not free (the examples' pods on their devices, shares, taints, withheld ones)
with the columns that say where, what and who (node, device, model, MIG profile, state, and the
pods, or the claim of a holder without one), then one line counting the free devices per node;
`top` whole (a line per model and per DeviceClass).
"""

from __future__ import annotations

import io
import json
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dra_driver import cli
from dra_driver.allocator.devicestates import FREE
from dra_driver.flags import resolve_environment
from dra_driver.k8s.client import KubeApi
from dra_driver.tools.fleet import command, top
from e2e.demo.terminal import Row, render_table

HEADER = ("NODE", "DEVICE", "MODEL", "MIG", "STATE", "PODS (OR CLAIM)")
MIN_WIDTHS = (10, 13, 10, 6, 9, 56)
"""The pods give way last: a demo pod's `namespace/name` is up to 54 characters."""


def fleet_report(*argv: str, kubeconfig: Path | None = None, api: KubeApi | None = None) -> dict[str, Any]:
    """What ``kubectl dra ARGV -o json`` prints, as a document; RuntimeError with its one line on failure."""
    parser = cli.build_parser(cli.KUBECTL_PLUGIN, kubectl_plugin=True)
    words = [*argv, "-o", "json"] + ([f"--kubeconfig={kubeconfig}"] if kubeconfig is not None else [])
    args = resolve_environment(parser.parse_args(cli.kubectl_booleans(words, parser.error)))
    out, err = io.StringIO(), io.StringIO()
    if command.main(args, prog=f"kubectl dra {args.command}", api=api, out=out, err=err) != 0:
        raise RuntimeError(err.getvalue().strip())
    doc: dict[str, Any] = json.loads(out.getvalue())
    return doc


def _holders(device: Mapping[str, Any]) -> str:
    shown = []
    for h in device.get("holders") or []:
        pods = h.get("pods")
        shown += pods if pods else [str(h.get("claim"))]
    return ", ".join(dict.fromkeys(shown)) or "-"


def gpus_excerpt(report: Mapping[str, Any]) -> list[str]:
    """``get gpus`` cut to the devices that are not free, in at most 120 columns, and a line counting
    those left out per node (none when every device is shown)."""
    devices = report.get("devices") or []
    kept = [d for d in devices if d.get("state") != FREE]
    free = Counter(str(d.get("node")) for d in devices if d.get("state") == FREE)
    rows = [Row([str(d.get("node")), str(d.get("device")), str(d.get("model") or "-").removeprefix("NVIDIA "),
                 str(d.get("migProfile") or "-"),
                 f"{d.get('state')} ({d['detail']})" if d.get("detail") else str(d.get("state")), _holders(d)])
            for d in kept]
    lines = render_table(HEADER, rows, minimum=MIN_WIDTHS) if rows else ([] if free else ["no devices"])
    if free:
        per_node = ", ".join(f"{node} {n}" for node, n in sorted(free.items()))
        lines.append(f"... and {sum(free.values())} free devices not shown ({per_node}): kubectl dra get gpus --free")
    return lines


def top_lines(report: Mapping[str, Any]) -> list[str]:
    return top.render_top(report).splitlines()
