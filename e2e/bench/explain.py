"""``dra-driver explain`` latency for one claim on the resolution benchmark's cluster.

Measured in this process through :func:`dra_driver.tools.explain.command.main` (a new REST client per call,
GET of the claim, LIST of slices and classes, the protobuf LIST of every claim's allocation, the
engine, JSON rendering): that is the command without Python start-up. The fetch and the evaluation
are also timed apart, and the real command (``python -m dra_driver explain``) is timed as a
subprocess, start-up included.

Then, in process on the scale bench's 40,000 GPUs (and 8,000, for the slope), a claim whose selector
nothing has evaluated yet (:mod:`e2e.bench.coldexplain`).

Claims explained: a pending 1-GPU claim (unsatisfiable when the resolution benchmark filled
every GPU before, satisfiable otherwise: the engine then explains every device) and, when there
is one, a claim the scheduler allocated.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from typing import Any

from dra_driver.allocator.resolve import Engine
from dra_driver.k8s.client import CLAIMS, SLICES, RestKubeApi
from dra_driver.tools.explain import claim
from dra_driver.tools.explain import command as explain
from e2e.bench import coldexplain
from e2e.bench.common import REPO, Result, summarize_ms
from e2e.bench.resolution import CLAIM_SPEC, FAKE_DRIVER, ensure_cluster
from e2e.bench.resolution import NAMESPACE as SCHED_NAMESPACE
from e2e.bench.sharedbed import BenchBed

NAMESPACE = "bench-explain"


def _time_main(ref: str, kubeconfig: str, samples: int) -> tuple[list[float], dict[str, Any]]:
    times = []
    report: dict[str, Any] = {}
    for _ in range(samples):
        out, err = io.StringIO(), io.StringIO()
        t0 = time.perf_counter()
        code = explain.main(ref, kubeconfig=kubeconfig, output="json", driver=FAKE_DRIVER, out=out, err=err)
        times.append(time.perf_counter() - t0)
        if code != 0:
            raise RuntimeError(f"explain {ref} failed: {err.getvalue()}")
        report = json.loads(out.getvalue())
    return times, report


def _time_parts(ref: str, kubeconfig: str, samples: int) -> dict[str, list[float]]:
    ns, name = ref.split("/")
    api = RestKubeApi.from_kubeconfig(kubeconfig, request_timeout=15.0)
    fetch, evaluate = [], []
    try:
        for _ in range(samples):
            t0 = time.perf_counter()
            obj, slices, classes, claims = claim.fetch(api, ns, name)
            t1 = time.perf_counter()
            claim.build_report(obj, slices, classes, claims, engine=Engine(), driver=FAKE_DRIVER)
            evaluate.append(time.perf_counter() - t1)
            fetch.append(t1 - t0)
    finally:
        api.close()
    return {"fetch": fetch, "evaluate": evaluate}


def _time_command(ref: str, kubeconfig: str, samples: int) -> list[float]:
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "dra_driver", "explain", ref, "--kubeconfig", kubeconfig, "-o", "json",
                        "--driver-name", FAKE_DRIVER],
                       cwd=REPO, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return times


def run(bed: BenchBed, quick: bool) -> Result:
    samples = 10 if quick else 50
    cmd_samples = 3 if quick else 10
    ensure_cluster(bed)
    bed.namespace(NAMESPACE)
    kubeconfig = str(bed.kubeconfig)
    try:
        bed.api.create(CLAIMS, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                "metadata": {"name": "pending", "namespace": NAMESPACE}, "spec": CLAIM_SPEC},
                       namespace=NAMESPACE)
    except Exception as exc:
        if "AlreadyExists" not in str(exc) and "409" not in str(exc):
            raise
    all_claims = bed.api.list(CLAIMS).items
    allocated = next((c for c in all_claims if c["metadata"]["namespace"] == SCHED_NAMESPACE
                      and (c.get("status") or {}).get("allocation")), None)
    slice_objs = bed.api.list(SLICES).items
    slices = len(slice_objs)
    devices = sum(len((s.get("spec") or {}).get("devices") or []) for s in slice_objs)
    result = Result("explain", "explain latency", {
        "samples": samples, "command_samples": cmd_samples, "claims_in_cluster": len(all_claims),
        "slices_in_cluster": slices, "devices_in_cluster": devices,
    })
    explain.main(f"{NAMESPACE}/pending", kubeconfig=kubeconfig, output="json", driver=FAKE_DRIVER, out=io.StringIO(),
                 err=io.StringIO())
    pending, report = _time_main(f"{NAMESPACE}/pending", kubeconfig, samples)
    parts = _time_parts(f"{NAMESPACE}/pending", kubeconfig, samples)
    command = _time_command(f"{NAMESPACE}/pending", kubeconfig, cmd_samples)
    pend = summarize_ms(pending)
    result.figures.update({
        "pending_claim_state": report.get("state"),
        "pending_in_process": pend,
        "pending_fetch": summarize_ms(parts["fetch"]),
        "pending_evaluate": summarize_ms(parts["evaluate"]),
        "pending_command_with_python_startup": summarize_ms(command),
    })
    if allocated is not None:
        ref = f"{SCHED_NAMESPACE}/{allocated['metadata']['name']}"
        times, rep = _time_main(ref, kubeconfig, samples)
        result.figures["allocated_claim_state"] = rep.get("state")
        result.figures["allocated_in_process"] = summarize_ms(times)
    result.figures["headline"] = {"command incl. Python start-up (p50)":
                                  f"{result.figures['pending_command_with_python_startup']['p50_ms']:.0f} ms"}
    result.target(f"explain a pending claim ({report.get('state')}), in process, p50", pend["p50_ms"], 50, "ms")
    cold = coldexplain.figures(quick)
    result.figures["cold_selector"] = cold
    small, big = (cold[f"{nodes * 8}_devices"] for nodes in coldexplain.NODES)
    result.target(f"explain one claim, cold selector cache, {big['devices']:,} devices, in process, p50", big["p50_ms"],
                  coldexplain.TARGET_MS, "ms")
    result.notes.append(
        f"{len(all_claims)} claims, {slices} slices with {devices} devices in the cluster; "
        f"pending claim ({report.get('state')}): p50 "
        f"{pend['p50_ms']} ms / p99 {pend['p99_ms']} ms in process (fetch p50 {result.figures['pending_fetch']['p50_ms']} ms, "
        f"evaluate p50 {result.figures['pending_evaluate']['p50_ms']} ms); the command with Python start-up p50 "
        f"{result.figures['pending_command_with_python_startup']['p50_ms']:.0f} ms."
    )
    result.notes.append(
        f"a claim whose selector nothing has evaluated (a cold cache), resolved and explained in process on the "
        f"scale bench's fleet: p50 {small['p50_ms']} ms on {small['devices']:,} devices, {big['p50_ms']} ms on "
        f"{big['devices']:,} (CPU p50 {small['cpu_p50_ms']} and {big['cpu_p50_ms']} ms)."
    )
    return result
