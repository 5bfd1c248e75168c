"""`make demo`: the local bed with simulated GPUs, the example pods, what each pod got, and the
fleet as `kubectl dra get gpus` and `kubectl dra top` show it.

Everything is torn down at the end unless --keep is given (then `make demo-down` stops it).
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from dra_driver.tools.explain import command as explain
from e2e.demo.fleetview import fleet_report, gpus_excerpt, top_lines
from e2e.demo.terminal import Row, colour_enabled, fit_lines, render_table
from e2e.testbed.cluster import Cluster, stop_detached
from e2e.testbed.clusterview import (
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
from e2e.testbed.nodes import NodeFleet
from e2e.testbed.nodes import stop_detached as stop_fleet
from e2e.tooling import binaries

DEMO_EXAMPLES = ("single-gpu", "two-pods-distinct-gpus", "same-numa-pair", "h100-by-product",
                 "memory-40gi", "mig-1g", "first-available", "unsatisfiable")
WORKDIR = Path(".run/demo")


HEADER = ["POD", "PHASE", "DEVICE", "MODEL", "SEEN IN THE CONTAINER"]
# Pod and device names and UUIDs are what the demo shows, so they are never cut; the model gives way.
# "SEEN" is NVIDIA_VISIBLE_DEVICES as the container saw it.
MIN_WIDTHS = [24, 7, 24, 10, 40]
PHASE_STYLE = {"Running": "green", "Pending": "yellow", "Failed": "red"}


CONTROLLER = f"{DRIVER}/controller"


def pod_events_text(bed: Bed, ns: str, pod: str) -> str:
    """What ``kubectl describe pod`` says from ``Events:`` on: for a pending pod, the part a person reads."""
    text = bed.kubectl("describe", "pod", pod, "-n", ns).stdout
    return text[text.find("Events:"):].rstrip() if "Events:" in text else ""


def model_of(device: dict[str, Any]) -> str:
    name = str(attr(device, "productName") or "?").removeprefix("NVIDIA ")
    profile = attr(device, "profile")
    return f"{name} {profile}" if profile else name


def pod_rows(bed: Bed, ns: str, docs: list[dict[str, Any]], scenario: str) -> list[Row]:
    """One line per allocated device (the pod's name on the first), a pending claim's reason below."""
    rows: list[Row] = []
    for pod in names_of(docs, "Pod"):
        obj = bed.get("pod", pod, ns)
        phase = obj.get("status", {}).get("phase", "?")
        label = pod if pod.startswith(scenario) else f"{scenario}/{pod}"
        devices: list[dict[str, Any]] = []
        reasons: list[str] = []
        for st in obj.get("status", {}).get("resourceClaimStatuses", []):
            claim = bed.get("resourceclaim", st["resourceClaimName"], ns)
            found = allocated(bed, claim)
            devices += found
            note = claim["metadata"].get("annotations", {}).get(f"{DRIVER}/explanation-summary")
            if note and not found:
                reasons.append(f"why: {note}")
        seen: set[str] = set()
        if phase == "Running":
            seen = {u for v in observed(bed, ns, pod).values()
                    for u in v["env"].get("NVIDIA_VISIBLE_DEVICES", "").split(",") if u}
        uuids = {str(attr(d, "uuid")) for d in devices}
        extra = sorted(seen - uuids)
        if extra:
            reasons.append(f"the container also saw {', '.join(extra)}, which the claim was not allocated")
        style = PHASE_STYLE.get(phase)
        if not devices:
            rows.append(Row([label, phase, "-", "-", "-"], [None, style, None, None, None], reasons))
            continue
        for i, d in enumerate(devices):
            uuid = str(attr(d, "uuid"))
            shown = uuid if uuid in seen else ("not seen" if phase == "Running" else "-")
            first = i == 0
            rows.append(Row([label if first else "", phase if first else "", f"{d['_result']['pool']}/{d['name']}",
                             model_of(d), shown],
                            [None, style, None, None, None if uuid in seen or phase != "Running" else "red"],
                            reasons if i == len(devices) - 1 else []))
    return rows


def print_table(rows: list[Row], colour: bool) -> None:
    for line in render_table(HEADER, rows, minimum=MIN_WIDTHS, colour=colour):
        print(line)


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
    colour = colour_enabled(sys.stdout)

    def progress(line: str) -> None:
        print(f"[{time.monotonic() - started:5.0f}s] {line}", flush=True)

    progress("building or reusing the Kubernetes control plane (the nodes are kubelet peers: no kubelet)")
    bin_dir = binaries.ensure(kubelet=False)
    progress(f"binaries ready in {bin_dir}")
    cluster = Cluster(workdir=(WORKDIR / "bed").resolve(), bin_dir=bin_dir, tie_to_parent=False)
    fleet = NodeFleet(workdir=WORKDIR.resolve(), kubeconfig=cluster.kubeconfig, node_names=cluster.nodes, detached=True)
    try:
        cluster.start(progress=progress)
        progress("starting node plugins, kubelet peers, controller")
        fleet.start()
        (WORKDIR / "fleet.json").write_text(json.dumps(fleet.procs.identities()))
        bed = Bed(kubeconfig=cluster.kubeconfig, kubectl_bin=str(bin_dir / "kubectl"), fleet=fleet, cluster=cluster)
        bed.apply(load_manifests(DEVICECLASSES) + fence_manifests())
        for node in cluster.nodes:
            wait_for(f"slices of {node}", lambda n=node: bed.get(
                "resourceslices", selector=f"spec.nodeName={n},spec.driver={DRIVER}")["items"], 60)
        progress("ResourceSlices published; applying the examples")
        rows: list[Row] = []
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
                for pod in names_of(docs, "Pod"):
                    wait_for(f"the controller's reason on {ns}/{pod}",
                             lambda ns=ns, pod=pod: CONTROLLER in pod_events_text(bed, ns, pod), 60)
            rows += pod_rows(bed, ns, docs, scenario)
        progress("examples settled")
        print()
        print_table(rows, colour)
        for ns, docs, scenario in applied:
            if scenario != "unsatisfiable":
                continue
            pod = names_of(docs, "Pod")[0]
            print(f"\n$ kubectl describe pod {pod} -n {ns}    # its Events")
            print("\n".join(fit_lines(pod_events_text(bed, ns, pod))))
            print(f"\n$ kubectl dra explain pod/{pod} -n {ns}")
            out = io.StringIO()
            explain.main(f"pod/{pod}", namespace=ns, kubeconfig=str(cluster.kubeconfig), out=out, err=out)
            print("\n".join(fit_lines(out.getvalue())))
        print("\n$ kubectl dra get gpus -A    # cut: the devices not free (held, tainted, withheld) and who holds them")
        print("\n".join(gpus_excerpt(fleet_report("get", "gpus", "-A", kubeconfig=cluster.kubeconfig))))
        print("\n$ kubectl dra top")
        print("\n".join(top_lines(fleet_report("top", kubeconfig=cluster.kubeconfig))))
        print(f"demo took {time.monotonic() - started:.0f}s")
        if args.keep:
            print(f"bed kept: export KUBECONFIG={cluster.kubeconfig}")
            print(f"try: PATH=$PWD/.venv/bin:$PATH {bin_dir / 'kubectl'} dra explain -A; stop with: make demo-down")
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
