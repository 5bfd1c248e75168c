"""API server outage: the plugin keeps serving the kubelet, then slices and the controller recover.

The bed's kube-apiserver is stopped and started again on the same port and etcd; nothing of ours
is restarted. Figures go to ``e2e/results/reliability.json`` under ``crash.apiserver_outage*``.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from dra_driver.node.kubelet import probe
from e2e.suites.reliability import (
    checkpoint_entries,
    log_path,
    plugin_name,
    record,
    registration_socket,
    restart_plugin_clean,
    wait_serving,
)
from e2e.suites.test_crash import pod, templates
from e2e.testbed.apiproxy import ApiProxy
from e2e.testbed.clusterview import DRIVER, EXPLANATION_ANNOTATION, Bed, claim_of, example, wait_for, wait_running
from e2e.testbed.dracalls import DraClient, dra_socket, timed

pytestmark = pytest.mark.testbed_only
NODES = ("gpu-node-1", "gpu-node-2")


def slices_of(bed: Bed, node: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = bed.get("resourceslices", selector=f"spec.nodeName={node},spec.driver={DRIVER}")["items"]
    return items


def outage(bed: Bed, ns: str, seconds: float, key: str) -> None:
    cluster = bed.cluster
    bed.apply(templates(), ns=ns)
    bed.apply([pod("before", "gpu-node-1")], ns=ns)
    wait_running(bed, ns, "before", 120)
    claim = claim_of(bed, ns, "before", "gpu")
    prepared = (ns, claim["metadata"]["name"], claim["metadata"]["uid"])
    plugin_pids = {n: bed.fleet.procs.procs[plugin_name(n)].pid for n in NODES}
    caller = DraClient(dra_socket(bed, "gpu-node-1"))

    apiserver = cluster.procs["kube-apiserver"]
    getinfo: list[str | None] = []
    prepared_calls: list[tuple[float, str]] = []
    unknown_calls: list[tuple[float, str]] = []
    down = time.monotonic()
    try:
        # SIGKILL: a crashed or partitioned API server, and no graceful drain that takes half a minute.
        apiserver.kill()
        apiserver.wait(timeout=30)
        while time.monotonic() - down < seconds:
            getinfo += [probe.check(registration_socket(bed, n), DRIVER, timeout=5) for n in NODES]
            took, out = timed(caller.prepare, [prepared])
            prepared_calls.append((took, out[prepared[2]].error))
            unknown = (ns, "never-seen", str(uuid.uuid4()))
            took, out = timed(caller.prepare, [unknown])
            unknown_calls.append((took, out[unknown[2]].error))
            time.sleep(min(5.0, max(0.0, seconds - (time.monotonic() - down))))
    finally:
        cluster._start_apiserver()
        cluster._wait_ready(deadline=time.monotonic() + 120)
        caller.close()
    outage_s = time.monotonic() - down
    back = time.monotonic()

    # Slices: deleted behind the plugins' backs right after the outage, they must come back.
    for node in NODES:
        for s in slices_of(bed, node):
            bed.kubectl("delete", "resourceslice", s["metadata"]["name"], "--wait=false", check=False)
    for node in NODES:
        wait_for(f"slices of {node} re-published", lambda node=node: slices_of(bed, node), timeout=90, interval=1)
    republished_s = time.monotonic() - back

    # The controller explains a claim created after the outage.
    docs = example("unsatisfiable")
    bed.apply(docs, ns=ns)
    # kube-controller-manager creates the claim from the template; after a long outage its own
    # informers take a while to come back (claim_of's 30 s is for a healthy cluster).
    wait_for("the pod's generated claim", lambda: bed.get("resourceclaims", ns=ns)["items"][1:], timeout=120, interval=1)
    claim_created_s = time.monotonic() - back
    name = claim_of(bed, ns, "unsatisfiable", "gpu")["metadata"]["name"]
    wait_for("the controller's explanation",
             lambda: bed.get("resourceclaim", name, ns)["metadata"].get("annotations", {}).get(EXPLANATION_ANNOTATION),
             timeout=120, interval=1)
    explained_s = time.monotonic() - back
    # And the node side still prepares new pods.
    bed.apply([pod("after", "gpu-node-1")], ns=ns)
    wait_running(bed, ns, "after", 120)
    control_plane_exits = {k: p.returncode for k, p in cluster.procs.items() if p.poll() is not None}
    restarted = [n for n, pid in plugin_pids.items()
                 if bed.fleet.procs.procs[plugin_name(n)].pid != pid or bed.fleet.procs.procs[plugin_name(n)].poll() is not None]

    result = {
        "what": "kube-apiserver stopped and restarted on the same port; kubelet calls during the outage",
        "outage_seconds": round(outage_s, 1),
        "getinfo_calls": len(getinfo), "getinfo_failures": [g for g in getinfo if g],
        "prepare_of_prepared_claim": {"calls": len(prepared_calls), "errors": [e for _, e in prepared_calls if e],
                                      "max_seconds": round(max(t for t, _ in prepared_calls), 2)},
        "prepare_of_unknown_claim": {"calls": len(unknown_calls), "max_seconds": round(max(t for t, _ in unknown_calls), 2),
                                     "error": unknown_calls[0][1][:200]},
        "slices_republished_seconds_after_restart": round(republished_s, 1),
        "kcm_created_claim_seconds_after_restart": round(claim_created_s, 1),
        "controller_explained_seconds_after_restart": round(explained_s, 1),
        "plugins_restarted": restarted, "control_plane_exits": control_plane_exits, "lost": [],
    }
    record("crash", key, result)
    print(json.dumps(result, indent=1))
    assert not result["getinfo_failures"], result["getinfo_failures"]
    assert not result["prepare_of_prepared_claim"]["errors"]
    assert all("could not get ResourceClaim" in e for _, e in unknown_calls), unknown_calls
    assert result["prepare_of_unknown_claim"]["max_seconds"] < 30
    assert not restarted


def test_apiserver_outage(bed: Bed, ns: str) -> None:
    outage(bed, ns, 15, "apiserver_outage")


@pytest.mark.long
def test_apiserver_outage_long(bed: Bed, ns: str) -> None:
    outage(bed, ns, 60, "apiserver_outage_long")


# --- an API server that answers 404 for the whole resource.k8s.io group -------------------------------

SWEEP_SECONDS = 5.0  # the bed's --cleanup-interval (e2e/testbed/nodes.py)


def claim_state(bed: Bed, node: str, uid: str) -> tuple[dict[str, Any] | None, dict[str, bytes]]:
    """A claim's checkpoint entry and its CDI spec files, byte for byte."""
    entries, _ = checkpoint_entries(bed, node)
    entry = entries.get(uid)
    cdi = Path(bed.fleet.nodes[node].cdi_dir)
    return (entry.to_dict() if entry else None), {p.name: p.read_bytes() for p in sorted(cdi.glob(f"*{uid}*"))}


def resource_group_404(bed: Bed, ns: str, tmp_path: Path, seconds: float, key: str) -> None:
    node = "gpu-node-1"
    bed.apply(templates(), ns=ns)
    bed.apply([pod("kept", node)], ns=ns)
    wait_running(bed, ns, "kept", 120)
    claim = claim_of(bed, ns, "kept", "gpu")
    name, uid = claim["metadata"]["name"], claim["metadata"]["uid"]
    fleet = bed.fleet
    proxy = ApiProxy(fleet.kubeconfig)
    try:
        fleet.procs.stop(plugin_name(node))
        fleet.procs.start(plugin_name(node),
                          fleet.nodes[node].plugin_args(proxy.kubeconfig(tmp_path / "proxy.kubeconfig")))
        wait_serving(bed, node)
        log = log_path(bed, plugin_name(node))
        offset = log.stat().st_size
        before = claim_state(bed, node, uid)
        entries_before = len(checkpoint_entries(bed, node)[0])
        assert before[0] is not None and before[1], "the claim is prepared, with its CDI spec"
        proxy.refused_group = "resource.k8s.io"
        time.sleep(seconds)
        proxy.refused_group = None
        reads = [p for p in proxy.refused if p.endswith(f"/namespaces/{ns}/resourceclaims/{name}")]
        time.sleep(2 * SWEEP_SECONDS + 1)  # two sweeps that read the claim again, through the healed proxy
        after = claim_state(bed, node, uid)
        entries_after = len(checkpoint_entries(bed, node)[0])
        with open(log, "rb") as f:
            f.seek(offset)
            lines = [json.loads(x) for x in f.read().decode(errors="replace").splitlines() if x.startswith("{")]
    finally:
        restart_plugin_clean(bed, node)
        proxy.close()
    swept = [x for x in lines if "deleted from the API server" in str(x.get("event", ""))]
    result = {
        "what": "every request under /apis/resource.k8s.io/ answered 404 page not found by a loopback proxy in "
                f"front of the API server, for the plugin of {node}; stale-claim sweep every {SWEEP_SECONDS:g} s",
        "seconds": seconds, "claim_reads_answered_404": len(reads), "unprepared_by_the_sweep": len(swept),
        "checkpoint_entries": [entries_before, entries_after], "claim_state_unchanged": after == before,
        "lost": [x.get("claim") for x in swept],
    }
    record("crash", key, result)
    print(json.dumps(result, indent=1))
    assert len(reads) >= seconds / SWEEP_SECONDS - 2, f"the sweeps did not read the claim through the proxy: {reads}"
    assert not swept, swept
    assert after == before, "the claim's checkpoint entry or CDI spec changed"
    assert bed.get("pod", "kept", ns)["status"]["phase"] == "Running"


def test_resource_group_404_unprepares_nothing(bed: Bed, ns: str, tmp_path: Path) -> None:
    # 25 s of 404s: five sweeps, more than twice the two consecutive ones a deletion needs (the long
    # variant holds them for 180 s).
    resource_group_404(bed, ns, tmp_path, 25, "resource_group_404")


@pytest.mark.long
def test_resource_group_404_unprepares_nothing_long(bed: Bed, ns: str, tmp_path: Path) -> None:
    resource_group_404(bed, ns, tmp_path, 180, "resource_group_404_long")
