"""`make demo`: the local bed with simulated GPUs, the example pods, and what each pod got.

Everything is torn down at the end unless --keep is given (then `make demo-down` stops it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from dra_driver.controller import explain
from e2e.bed import (
    DEVICECLASSES,
    DRIVER,
    Bed,
    allocated,
    attr,
    example,
    fence_manifests,
    load_manifests,
    names_of,
    observed,
    wait_for,
)
from e2e.testbed import binaries
from e2e.testbed.cluster import Cluster, stop_detached
from e2e.testbed.nodes import NodeFleet
from e2e.testbed.nodes import stop_detached as stop_fleet

DEMO_EXAMPLES = ("single-gpu", "two-pods-distinct-gpus", "same-numa-pair", "h100-by-product",
                 "memory-40gi", "mig-1g", "first-available", "unsatisfiable")
WORKDIR = Path(".run/demo")


def pod_rows(bed: Bed, ns: str, docs: list[dict[str, Any]], scenario: str) -> list[list[str]]:
    rows = []
    for pod in names_of(docs, "Pod"):
        obj = bed.get("pod", pod, ns)
        phase = obj.get("status", {}).get("phase", "?")
        devices: list[str] = []
        for st in obj.get("status", {}).get("resourceClaimStatuses", []):
            claim = bed.get("resourceclaim", st["resourceClaimName"], ns)
            for d in allocated(bed, claim):
                devices.append(f"{d['_result']['pool']}/{d['name']} ({attr(d, 'productName')}"
                               + (f" {attr(d, 'profile')}" if attr(d, "profile") else "") + ")")
            note = claim["metadata"].get("annotations", {}).get(f"{DRIVER}/explanation-summary")
            if note and not devices:
                devices.append(f"pending: {note}")
        visible = ""
        if phase == "Running":
            views = observed(bed, ns, pod)
            visible = ",".join(sorted({v["env"].get("NVIDIA_VISIBLE_DEVICES", "") for v in views.values()} - {""}))
        rows.append([scenario, pod, phase, "; ".join(devices) or "-", visible or "-"])
    return rows


def print_table(rows: list[list[str]]) -> None:
    header = ["EXAMPLE", "POD", "PHASE", "ALLOCATED DEVICES", "NVIDIA_VISIBLE_DEVICES (seen in the container)"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))


def down() -> None:
    state = WORKDIR / "fleet.json"
    if state.exists():
        stop_fleet(json.loads(state.read_text()))
    stop_detached(WORKDIR / "bed")
    shutil.rmtree(WORKDIR, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep", action="store_true", help="leave the bed running (stop with make demo-down)")
    parser.add_argument("--down", action="store_true", help="stop a kept demo")
    args = parser.parse_args(argv)
    if args.down:
        down()
        print("demo stopped")
        return 0
    down()
    started = time.monotonic()
    print("building or reusing the Kubernetes binaries ...", flush=True)
    bin_dir = binaries.ensure()
    cluster = Cluster(workdir=(WORKDIR / "bed").resolve(), bin_dir=bin_dir, tie_to_parent=False)
    fleet = NodeFleet(workdir=WORKDIR.resolve(), kubeconfig=cluster.kubeconfig, node_names=cluster.nodes, detached=True)
    try:
        cluster.start()
        print(f"control plane ready after {time.monotonic() - started:.0f}s; starting node plugins, kubelet peers, controller",
              flush=True)
        fleet.start()
        (WORKDIR / "fleet.json").write_text(json.dumps(fleet.procs.pids()))
        bed = Bed(kubeconfig=cluster.kubeconfig, kubectl_bin=str(bin_dir / "kubectl"), fleet=fleet, cluster=cluster)
        bed.apply(load_manifests(DEVICECLASSES) + fence_manifests())
        for node in cluster.nodes:
            wait_for(f"slices of {node}", lambda n=node: bed.get(
                "resourceslices", selector=f"spec.nodeName={n},spec.driver={DRIVER}")["items"], 60)
        rows: list[list[str]] = []
        applied = []
        for i, scenario in enumerate(DEMO_EXAMPLES):
            ns = f"demo-{i}-{scenario}"[:63]
            bed.kubectl("create", "namespace", ns)
            wait_for("default ServiceAccount", lambda ns=ns: bed.kubectl("get", "sa", "default", "-n", ns,
                                                                         check=False).returncode == 0, 30)
            docs = example(scenario)
            bed.apply(docs, ns=ns)
            applied.append((ns, docs, scenario))
        for ns, docs, scenario in applied:
            for pod in names_of(docs, "Pod"):
                if scenario != "unsatisfiable":
                    wait_for(f"{ns}/{pod} to run", lambda ns=ns, pod=pod: bed.get("pod", pod, ns).get(
                        "status", {}).get("phase") in ("Running", "Failed"), 90)
            if scenario == "unsatisfiable":
                time.sleep(6)
            rows += pod_rows(bed, ns, docs, scenario)
        print()
        print_table(rows)
        for ns, docs, scenario in applied:
            if scenario != "unsatisfiable":
                continue
            for st in bed.get("pod", names_of(docs, "Pod")[0], ns).get("status", {}).get("resourceClaimStatuses", []):
                ref = f"{ns}/{st['resourceClaimName']}"
                print(f"\n$ dra-driver explain {ref}")
                explain.main(ref, kubeconfig=str(cluster.kubeconfig))
        print(f"demo took {time.monotonic() - started:.0f}s")
        if args.keep:
            print(f"bed kept: export KUBECONFIG={cluster.kubeconfig}; try: dra-driver explain <ns>/<claim>; "
                  "stop with: make demo-down")
        return 0
    except (RuntimeError, TimeoutError, AssertionError) as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        print(f"logs: {WORKDIR.resolve()}/logs and {WORKDIR.resolve()}/bed/logs", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            fleet.stop()
            cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
