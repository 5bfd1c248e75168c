"""The fleet commands' own work at fleet scale, in this process: ``python -m e2e.bench.scale.fleetviews``.

``get gpus -A``, ``get nodes``, ``top`` and ``fit --template ... --count 1000`` of a one-GPU
template (issue 54), each through :func:`dra_driver.tools.fleet.command.main` as ``kubectl dra``
runs it, with a client at the module boundary that serves a cluster built here instead of the
API server's: 5,000 nodes of 8 GPUs whose slices are the plugin's own (:mod:`e2e.generators.fleet`,
read as the slice informer reads them), the shipped DeviceClasses, 30,000 claims allocated (the
first six GPUs of every node, each claim reduced as the protobuf list of allocations gives it)
and a Running pod per claim. What this times is the command less Python's start, the HTTP round
trips and the protobuf decoding: the scale bench (``make bench-scale``, :mod:`e2e.bench.scale.curve`)
times the real process against the real API server.

Each command runs in a fresh interpreter of its own, ``--samples`` times: the first run's wall
and CPU seconds (cold caches, as in a person's run) and the best, and the peak RSS the command adds
to a process that already holds the cluster (VmHWM, reset through ``/proc/self/clear_refs`` before
each run, less VmRSS before). ``--profile`` adds cProfile's top functions by own time
(``FLEET_SORT``, ``FLEET_TOP`` to change); ``--json PATH`` writes every figure. A profiling script,
not a test: ``unit_tests/tools/fleet`` holds the results to what the slower paths gave.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from dra_driver import cli
from dra_driver.controller.views import slice_view
from dra_driver.flags import resolve_environment
from dra_driver.k8s.client import (
    CLAIM_TEMPLATES,
    DEVICE_CLASSES,
    DEVICE_TAINT_RULES,
    EVENTS,
    PODS,
    SLICES,
    ApiError,
    ListResult,
    Resource,
)
from dra_driver.k8s.objects import Obj
from dra_driver.k8s.wire import Reduced, allocation_view
from dra_driver.tools.fleet import command
from e2e.bench.common import REPO
from e2e.bench.scale.cluster import FIT_SHAPES, NS_FILL, NS_HELD
from e2e.generators.fleet import DRIVER, GPUS_PER_NODE, node_name, plugin_slices

TEMPLATE = "any-gpu"
COMMANDS: dict[str, tuple[str, ...]] = {
    "get gpus -A": ("get", "gpus", "-A"),
    "get nodes": ("get", "nodes"),
    "top": ("top",),
    "fit --count 1000": ("fit", "--template", f"{NS_FILL}/{TEMPLATE}", "--count", "1000"),
}


class Cluster:
    """What the API server would answer, already decoded: the client's reads and nothing else."""

    def __init__(self, nodes: int, claims_per_node: int, mig_nodes: int = 0) -> None:
        if not 0 <= claims_per_node <= GPUS_PER_NODE:
            raise ValueError(f"claims per node must be 0..{GPUS_PER_NODE}")
        view = slice_view()
        # The dynamic-MIG nodes first (as the scale bench adds them), their claims none.
        raw = plugin_slices(nodes + mig_nodes, mig_nodes=mig_nodes)
        mig = {node_name(i) for i in range(mig_nodes)}
        self.slices = [view(s) for s in raw]
        self.classes = [d for p in sorted((REPO / "deploy" / "deviceclasses").glob("*.yaml"))
                        for d in yaml.safe_load_all(p.read_text()) if d]
        self.claims: list[Obj] = []
        self.pods: list[Obj] = []
        for body in raw:
            node, pool = body["spec"]["nodeName"], body["spec"]["pool"]["name"]
            for dev in ([] if node in mig else body["spec"].get("devices") or [])[:claims_per_node]:
                name = f"held-{len(self.claims)}"
                result = {"request": "gpu", "driver": DRIVER, "pool": pool, "device": dev["name"]}
                self.claims.append(dict(allocation_view({
                    "metadata": {"name": name, "namespace": NS_HELD, "uid": f"claim-{name}"},
                    "status": {"allocation": {"devices": {"results": [result]}}}})))
                self.pods.append({"metadata": {"name": name, "namespace": NS_HELD, "uid": f"pod-{name}"},
                                  "spec": {"nodeName": node, "resourceClaims": [{"name": "gpu", "resourceClaimName": name}]},
                                  "status": {"phase": "Running"}})
        self.template = {"metadata": {"name": TEMPLATE, "namespace": NS_FILL}, "spec": {"spec": FIT_SHAPES[TEMPLATE]}}

    def list(self, res: Resource, *, namespace: str | None = None, field_selector: str | None = None,
             cached: bool = False, reduced: Reduced[Any] | None = None) -> ListResult:
        items: dict[str, list[Obj]] = {SLICES.plural: self.slices, DEVICE_CLASSES.plural: self.classes,
                                       DEVICE_TAINT_RULES.plural: [], EVENTS.plural: [], PODS.plural: self.pods}
        found = items[res.plural]
        return ListResult([o for o in found if namespace is None or o["metadata"].get("namespace") == namespace], "1")

    def list_claim_allocations(self) -> ListResult:
        return ListResult(list(self.claims), "1")

    def get(self, res: Resource, name: str, *, namespace: str | None = None) -> Obj:
        if res.plural == CLAIM_TEMPLATES.plural and (namespace, name) == (NS_FILL, TEMPLATE):
            return self.template
        raise ApiError(404, "NotFound", f"{res.plural} {name!r} not found")


def run_command(cluster: Cluster, argv: tuple[str, ...]) -> str:
    parser = cli.build_parser(cli.KUBECTL_PLUGIN, kubectl_plugin=True)
    args = parser.parse_args(cli.kubectl_booleans(list(argv), parser.error))
    resolve_environment(args)
    out, err = io.StringIO(), io.StringIO()
    rc = command.main(args, prog=f"kubectl dra {args.command}", api=cluster,  # type: ignore[arg-type]
                      out=out, err=err, server_version=lambda: "v1.37.2")
    if rc != 0:
        raise RuntimeError(f"kubectl dra {' '.join(argv)}: {err.getvalue().strip()}")
    return out.getvalue()


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def measure(cluster: Cluster, name: str, argv: tuple[str, ...], samples: int, profile: bool) -> dict[str, Any]:
    walls, cpus, peaks = [], [], []
    out = ""
    for _ in range(samples):
        before = _status_mib("VmRSS")
        reset = _reset_peak()
        t0, c0 = time.perf_counter(), time.process_time()
        out = run_command(cluster, argv)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        if reset:
            peaks.append(_status_mib("VmHWM") - before)
    doc: dict[str, Any] = {"command": f"kubectl dra {' '.join(argv)}", "first_wall_s": round(walls[0], 3),
                           "first_cpu_s": round(cpus[0], 3), "wall_s": round(min(walls), 3),
                           "cpu_s": round(min(cpus), 3), "samples_wall_s": [round(w, 3) for w in walls],
                           "peak_rss_growth_mib": round(max(peaks), 1) if peaks else None,
                           "stdout_bytes": len(out.encode()), "first_line": out.splitlines()[0] if out else ""}
    if profile:
        prof = cProfile.Profile()
        prof.enable()
        run_command(cluster, argv)
        prof.disable()
        text = io.StringIO()
        order, top = os.environ.get("FLEET_SORT", "tottime"), int(os.environ.get("FLEET_TOP", "15"))
        pstats.Stats(prof, stream=text).sort_stats(order).print_stats(top)
        doc["profile"] = text.getvalue()
    return doc


def child(args: argparse.Namespace, name: str) -> dict[str, Any]:
    """``name`` measured in a fresh interpreter (caches cold, as in a person's run; its own peak RSS)."""
    cmd = [sys.executable, "-m", "e2e.bench.scale.fleetviews", "--nodes", str(args.nodes), "--claims-per-node",
           str(args.claims_per_node), "--mig-nodes", str(args.mig_nodes), "--samples", str(args.samples), "--only", name,
           "--json", "-"]
    if args.profile:
        cmd.append("--profile")
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{name}: {done.stderr.strip()[-500:]}")
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.bench.scale.fleetviews", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--claims-per-node", type=int, default=6, help="GPUs allocated per node (of 8)")
    parser.add_argument("--mig-nodes", type=int, default=0,
                        help="dynamic-MIG nodes besides (the scale bench has one per ten GPU nodes)")
    parser.add_argument("--samples", type=int, default=3, help="runs per command, in one process: the first is cold")
    parser.add_argument("--only", choices=sorted(COMMANDS), help="one command, in this process")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--json", help="write every figure there (-: stdout, and nothing else)")
    args = parser.parse_args(argv)
    say = (lambda _line: None) if args.json == "-" else (lambda line: print(line, flush=True))
    doc: dict[str, Any]
    if args.only is None:
        doc = {"nodes": args.nodes, "mig_nodes": args.mig_nodes, "gpus": args.nodes * GPUS_PER_NODE, "commands": {}}
        for name in COMMANDS:
            one = child(args, name)
            doc["claims"], doc["fixture_rss_mib"] = one["claims"], one["rss_with_cluster_mib"]
            found = doc["commands"][name] = one["commands"][name]
            say(f"  {name}: {found['first_wall_s']:.2f}s wall ({found['first_cpu_s']:.2f}s CPU) cold, best "
                f"{found['wall_s']:.2f}s; peak RSS +{found['peak_rss_growth_mib']} MiB over the "
                f"{one['rss_with_cluster_mib']:.0f} MiB holding the cluster; {found['first_line'][:90]!r}")
            if args.profile:
                say(found["profile"])
    else:
        t0 = time.perf_counter()
        cluster = Cluster(args.nodes, args.claims_per_node, args.mig_nodes)
        doc = {"nodes": args.nodes, "mig_nodes": args.mig_nodes, "devices": sum(
                   len(s["spec"].get("devices") or []) for s in cluster.slices), "claims": len(cluster.claims),
               "pods": len(cluster.pods), "fixture_s": round(time.perf_counter() - t0, 1),
               "rss_with_cluster_mib": round(_status_mib("VmRSS"), 1),
               "commands": {args.only: measure(cluster, args.only, COMMANDS[args.only], args.samples, args.profile)}}
        found = doc["commands"][args.only]
        say(f"  {args.only}: {found['first_wall_s']:.2f}s wall ({found['first_cpu_s']:.2f}s CPU) cold, best "
            f"{found['wall_s']:.2f}s")
        if args.profile:
            say(found["profile"])
    if args.json == "-":
        print(json.dumps(doc, indent=1))
    elif args.json is not None:
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
