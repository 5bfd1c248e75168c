"""The fleet view (issue 54) on the bed's real control plane: ``get gpus``, ``get nodes``, ``top``, ``fit``.

- ``fit``'s prediction against the real kube-scheduler, the test that matters: for a template,
  ``fit --count 100`` says K and names the nodes; K+1 pods made from the template are given to
  the scheduler, and exactly K are scheduled, on those nodes, and one stays pending. For whole GPUs
  (one of them taken out by a DeviceTaintRule), static MIG devices, memory shares and a
  matchAttribute constraint, on two nodes added for this module, with models no other node has, so
  that K is small and no other test's claims count. Marked ``next``: ``make e2e-next`` runs them
  against the 1.38 kube-scheduler (``fit`` then uses that scheduler's rules).
- ``get gpus`` after those pods: each pod on the device of its claim's ``status.allocation``, a
  shared GPU with its claims and what each consumed, the tainted device as tainted, the device
  the node plugin withheld as withheld (with the rule).
- The commands through kubectl's own plugin lookup (``kubectl dra ...``, ``kubectl-dra`` on PATH)
  with ``-n``, ``-A``, ``--context`` and ``-o json``: the JSON's keys (docs/fleet.md).
- Bad input: one line, exit status 1, no traceback.

The plugin lookup and bad-input tests use no node of their own, so they also run on kind.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.testbed.clusterview import DRIVER, Bed, claim_of, wait_for, wait_running
from e2e.testbed.nodes import SimNode
from e2e.tooling import binaries

NODE_A, NODE_B = "fleet-a", "fleet-b"
"""Two nodes of their own: ``fleet-b``'s plugin runs with ``--consumable-shares=memory``."""
GPU_CLASS, MIG_CLASS, SHARED_CLASS = (f"{c}.{DRIVER}" for c in ("gpu", "mig", "shared-gpu"))
TAINT_KEY = f"{DRIVER}/maintenance"
BAD_CAPABILITY = "8.1234567890123456789"  # a version 1.38 refuses: the plugin withholds the device

MODELS: dict[str, dict[str, Any]] = {
    "a10": {"productName": "NVIDIA A10", "cudaComputeCapability": "8.6", "memoryMiB": 23028, "multiprocessors": 72},
    "a2": {"productName": "NVIDIA A2", "cudaComputeCapability": "8.6", "memoryMiB": 15356, "multiprocessors": 10},
    "a6000": {"productName": "NVIDIA RTX A6000", "cudaComputeCapability": "8.6", "memoryMiB": 49140,
              "multiprocessors": 84},
    "a16": {"productName": "NVIDIA A16", "cudaComputeCapability": "8.6", "memoryMiB": 15356, "multiprocessors": 40},
    "a40": {"productName": "NVIDIA A40", "cudaComputeCapability": "8.6", "memoryMiB": 46068, "multiprocessors": 84},
    "l40s": {"productName": "NVIDIA L40S", "cudaComputeCapability": "8.9", "memoryMiB": 46068, "multiprocessors": 142},
    "odd": {"productName": "NVIDIA L4", "cudaComputeCapability": BAD_CAPABILITY, "memoryMiB": 23034,
            "multiprocessors": 58},
    "a30": {"productName": "NVIDIA A30", "cudaComputeCapability": "8.0", "memoryMiB": 24576, "multiprocessors": 56,
            "migProfiles": [
                {"name": "1g.6gb", "memoryMiB": 5836, "multiprocessors": 14, "computeSlices": 1, "memorySlices": 1,
                 "placements": [0, 1, 2, 3]},
                {"name": "2g.12gb", "memoryMiB": 11904, "multiprocessors": 28, "computeSlices": 2, "memorySlices": 2,
                 "placements": [0, 2]},
                {"name": "4g.24gb", "memoryMiB": 24064, "multiprocessors": 56, "computeSlices": 4, "memorySlices": 4,
                 "placements": [0]}]},
}


def _gpu(index: int, model: str, numa: int, mig: list[tuple[str, int]] | None = None) -> dict[str, Any]:
    gpu: dict[str, Any] = {"index": index, "model": model, "pciBusId": f"0000:{0x10 + index:02x}:00.0", "numaNode": numa}
    if mig is not None:
        gpu["mig"] = {"enabled": True, "instances": [{"profile": p, "placement": s} for p, s in mig]}
    return gpu


def _profile(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    models = {k: {"brand": "Nvidia", "architecture": "Ampere", **v} for k, v in MODELS.items()}
    return {"driverVersion": "580.95.05", "cudaDriverVersion": "13.0", "models": models, "gpus": gpus}


# What each scenario counts on (K, by node), by hand:
# - whole A10s: one on each node and a second on fleet-a that a DeviceTaintRule takes out: 2 (a:1, b:1);
# - MIG 1g.6gb: two on fleet-a's A30, one on fleet-b's: 3 (a:2, b:1);
# - 20Gi shares of an L40S (45Gi): two per GPU, two GPUs on fleet-b only: 4 (b:4);
# - two A40s on one NUMA node: fleet-a's two are on different NUMA nodes, fleet-b has two on NUMA 0
#   and one on NUMA 1: 1 (b:1), where counting GPUs alone would say 2;
# - a pod with two claims of one A16 each, all on one node: three A16s on each node; with one such
#   pod placed, 1 more (on the other node), where counting GPUs alone would say 2;
# - two RTX A6000s, else one A2 (firstAvailable): fleet-a has two A6000s and an A2, fleet-b one A6000
#   and two A2s: 4 (a:2 as one of each, b:2 as A2s).
PROFILES = {
    NODE_A: _profile([_gpu(0, "a10", 0), _gpu(1, "a10", 1), _gpu(2, "a40", 0), _gpu(3, "a40", 1),
                      _gpu(4, "a30", 0, [("1g.6gb", 0), ("1g.6gb", 1), ("2g.12gb", 2)]),
                      _gpu(5, "a16", 1), _gpu(6, "a16", 1), _gpu(7, "a16", 1),
                      _gpu(8, "a6000", 0), _gpu(9, "a6000", 0), _gpu(10, "a2", 1)]),
    NODE_B: _profile([_gpu(0, "a10", 0), _gpu(1, "a40", 0), _gpu(2, "a40", 0), _gpu(3, "a40", 1), _gpu(4, "l40s", 1),
                      _gpu(5, "l40s", 1), _gpu(6, "a30", 1, [("1g.6gb", 0), ("2g.12gb", 2)]), _gpu(7, "odd", 1),
                      _gpu(8, "a16", 0), _gpu(9, "a16", 0), _gpu(10, "a16", 0),
                      _gpu(11, "a6000", 0), _gpu(12, "a2", 1), _gpu(13, "a2", 1)]),
}
PUBLISHED = {NODE_A: 13, NODE_B: 14}
"""Devices each node publishes: its GPUs without MIG, and the MIG devices (fleet-b's gpu-7 withheld)."""
FLAGS = {NODE_A: (), NODE_B: ("--consumable-shares=memory",)}


def published(bed: Bed, node: str) -> list[dict[str, Any]]:
    items = bed.get("resourceslices", selector=f"spec.nodeName={node},spec.driver={DRIVER}")["items"]
    return [d for s in items for d in s["spec"].get("devices") or []]


def ready(bed: Bed, node: str) -> bool:
    proc = bed.kubectl("get", "node", node, "-o", "json", check=False)
    if proc.returncode != 0:
        return False
    conditions = json.loads(proc.stdout).get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


@pytest.fixture(scope="module")
def fleet_nodes(bed: Bed) -> Iterator[tuple[str, str]]:
    if bed.fleet is None:
        pytest.skip("adds simulated nodes: needs the local bed's processes")
    minor = binaries.scheduler_minor()
    if minor:  # make e2e-next: the prediction is checked against that scheduler, or not at all
        assert bed.cluster.scheduler_version.startswith(f"v{minor}."), bed.cluster.scheduler_version
    fleet = bed.fleet
    try:
        for name, profile in PROFILES.items():
            root = fleet.workdir / "nodes" / name
            root.mkdir(parents=True, exist_ok=True)
            (root / "profile.yaml").write_text(yaml.safe_dump(profile))
            fleet.add_node(SimNode(name, str(root / "profile.yaml"), root, flags=FLAGS[name]))
        for name, count in PUBLISHED.items():
            def up(n: str = name, c: int = count) -> bool:
                return len(published(bed, n)) == c and ready(bed, n)

            wait_for(f"{name}'s {count} devices published and the node ready", up, 90)
        yield NODE_A, NODE_B
    finally:
        # The scenarios' pods would go with their namespaces, but only while the nodes' kubelet peers
        # run: gone at once instead, as the nodes go too.
        for name in PROFILES:
            bed.kubectl("delete", "pods", "-A", f"--field-selector=spec.nodeName={name}", "--force", "--grace-period=0",
                        "--wait=false", check=False)
        for name in PROFILES:
            fleet.remove_node(name)
            bed.kubectl("delete", "resourceslices", f"--field-selector=spec.nodeName={name}", "--wait=false", check=False)
            bed.kubectl("delete", "node", name, "--wait=false", check=False)


# --------------------------------------------------------------------------- running the commands


def scheduler_rules() -> list[str]:
    """``fit`` with the rules of the scheduler that runs: the 1.38 one beside the 1.37 API server
    under ``make e2e-next``, else the API server's (``auto``)."""
    minor = binaries.scheduler_minor()
    return ["--scheduler-rules", minor] if minor else []


def dra(bed: Bed, *args: str) -> subprocess.CompletedProcess[str]:
    """``dra-driver ARGS`` against the bed."""
    return subprocess.run([sys.executable, "-m", "dra_driver", *args, "--kubeconfig", str(bed.kubeconfig)],
                          capture_output=True, text=True, timeout=90, check=False)


def dra_json(bed: Bed, *args: str) -> dict[str, Any]:
    proc = dra(bed, *args, "-o", "json")
    assert proc.returncode == 0, (args, proc.stderr)
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def one_line_failure(proc: subprocess.CompletedProcess[str], says: str) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == "" and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert says in proc.stderr, proc.stderr
    return proc.stderr


# --------------------------------------------------------------------------- fit against the scheduler


def template(name: str, device_class: str, selector: str, *, count: int = 1, memory: str | None = None,
             match: str | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": device_class, "count": count,
                               "selectors": [{"cel": {"expression": selector}}]}
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if match is not None:
        devices["constraints"] = [{"requests": ["gpu"], "matchAttribute": match}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": devices}}}


def pod(name: str, template_name: str, claims: tuple[str, ...] = ("gpu",)) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "terminationGracePeriodSeconds": 0,
        "resourceClaims": [{"name": c, "resourceClaimTemplateName": template_name} for c in claims],
        "containers": [{"name": "ctr0", "image": "busybox:1.36", "command": ["sh", "-c", "sleep 86400"],
                        "resources": {"claims": [{"name": c} for c in claims]}}]}}


def product(name: str) -> str:
    return f'device.attributes["{DRIVER}"].productName == "{name}"'


def unschedulable(p: dict[str, Any]) -> bool:
    return any(c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
               for c in p.get("status", {}).get("conditions") or [])


def placement(bed: Bed, ns: str, prefix: str) -> tuple[dict[str, str], list[str]]:
    """The pods named ``prefix-*`` the scheduler bound (pod -> node), and those it found no room for."""
    pods = [p for p in bed.get("pods", ns=ns)["items"] if p["metadata"]["name"].startswith(f"{prefix}-")]
    bound = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")}
    waiting = [p["metadata"]["name"] for p in pods if not p["spec"].get("nodeName") and unschedulable(p)]
    return bound, waiting


def predict_then_schedule(bed: Bed, ns: str, tmpl: dict[str, Any], expect: dict[str, int], *,
                          target: tuple[str, ...] = (), claims: tuple[str, ...] = ("gpu",),
                          make: Callable[[str], dict[str, Any]] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """``fit --count 100`` of ``tmpl`` (or of ``target``, a pod), then K+1 pods from it (``make``) to
    the scheduler: exactly K bound, on the nodes ``fit`` named, each pod's ``claims`` on its node.
    ``expect``: K by node, as counted by hand (so that a ``fit`` and a scheduler wrong the same way,
    or a K of 0, cannot pass). The report, and where each pod went."""
    name = tmpl["metadata"]["name"]
    bed.apply([tmpl], ns=ns)
    started = time.monotonic()
    report = dra_json(bed, "fit", *(target or ("--template", f"{ns}/{name}")), "-n", ns, "--count", "100",
                      *scheduler_rules())
    took = time.monotonic() - started
    k = report["fits"]
    assert report["kind"] == "GpuFit" and report["asked"] == 100, report
    assert (k, report["nodes"]) == (sum(expect.values()), expect), report
    failure = report["firstFailure"]
    assert failure["try"] == k + 1 and failure["state"] == "unsatisfiable" and failure["summary"], report

    bed.apply([(make or (lambda p: pod(p, name)))(f"{name}-{i}") for i in range(k + 1)], ns=ns)

    def settled() -> tuple[dict[str, str], list[str]] | None:
        bound, waiting = placement(bed, ns, name)
        return (bound, waiting) if len(bound) + len(waiting) == k + 1 else None

    bound, waiting = wait_for(f"{k} of {k + 1} pods bound and one unschedulable", settled, 90)
    time.sleep(2.0)  # a pod bound late would show now
    assert placement(bed, ns, name) == (bound, waiting)
    assert len(bound) == k and len(waiting) == 1, (bound, waiting)
    assert dict(Counter(bound.values())) == report["nodes"], (bound, report)
    for p, node in bound.items():
        for pod_claim in claims:
            results = claim_of(bed, ns, p, pod_claim)["status"]["allocation"]["devices"]["results"]
            assert {r["pool"] for r in results} == {node}, (p, pod_claim, node, results)
    print(f"\nfit {name}: {k} ({report['nodes']}, {report['models']}) in {took:.1f}s; the scheduler bound {bound}")
    return report, bound


def holders_by_device(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["node"], d["device"]): d for d in doc["devices"]}


@pytest.mark.testbed_only
@pytest.mark.next
def test_fit_whole_gpus_with_a_tainted_one_and_the_holders(bed: Bed, ns: str, fleet_nodes: tuple[str, str]) -> None:
    rule = f"fleet-{ns}"
    bed.apply([{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule", "metadata": {"name": rule},
                "spec": {"deviceSelector": {"driver": DRIVER, "pool": NODE_A, "device": "gpu-1"},
                         "taint": {"key": TAINT_KEY, "value": "planned", "effect": "NoSchedule"}}}])
    try:
        wait_for("the taint in get gpus", lambda: holders_by_device(
            dra_json(bed, "get", "gpus", "--node", NODE_A))[(NODE_A, "gpu-1")]["state"] == "tainted", 30)
        report, bound = predict_then_schedule(bed, ns, template("a10", GPU_CLASS, product("NVIDIA A10")),
                                              {NODE_A: 1, NODE_B: 1})
        assert report["models"] == {"NVIDIA A10": 2}, report
        for p in bound:
            wait_running(bed, ns, p, timeout=60)
        view = holders_by_device(dra_json(bed, "get", "gpus", "-n", ns, "--model", "A10"))
        for p in bound:
            claim = claim_of(bed, ns, p, "gpu")
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            row = view[(result["pool"], result["device"])]
            holder = (f"{ns}/{claim['metadata']['name']}", [f"{ns}/{p}"])
            assert [(h["claim"], h["pods"]) for h in row["holders"]] == [holder], row
            assert row["state"] == ("allocated" if result["pool"] == NODE_A else "shared"), row  # fleet-b's GPUs are shareable
        tainted = view[(NODE_A, "gpu-1")]
        assert tainted["state"] == "tainted" and tainted["detail"] == "NoSchedule" and not tainted["holders"], tainted
        assert tainted["taints"] == [f"{TAINT_KEY}=planned:NoSchedule"], tainted
    finally:
        bed.kubectl("delete", "devicetaintrule", rule, "--ignore-not-found", check=False)


@pytest.mark.testbed_only
@pytest.mark.next
def test_fit_mig_devices(bed: Bed, ns: str, fleet_nodes: tuple[str, str]) -> None:
    selector = f'{product("NVIDIA A30")} && device.attributes["{DRIVER}"].profile == "1g.6gb"'
    report, _ = predict_then_schedule(bed, ns, template("a30-1g", MIG_CLASS, selector), {NODE_A: 2, NODE_B: 1})
    assert sum(report["models"].values()) == 3, report


@pytest.mark.testbed_only
@pytest.mark.next
def test_fit_memory_shares_and_what_each_consumed(bed: Bed, ns: str, fleet_nodes: tuple[str, str]) -> None:
    report, bound = predict_then_schedule(bed, ns, template("l40s-20g", SHARED_CLASS, product("NVIDIA L40S"), memory="20Gi"),
                                          {NODE_B: 4})
    assert report["models"] == {"NVIDIA L40S": 4}, report
    view = [d for d in dra_json(bed, "get", "gpus", "-n", ns, "--node", NODE_B, "--model", "L40S")["devices"]]
    assert [d["device"] for d in view] == ["gpu-4", "gpu-5"], view
    claims = {claim_of(bed, ns, p, "gpu")["metadata"]["name"]: p for p in bound}
    seen = {}
    for d in view:
        assert d["state"] == "shared" and d["detail"].startswith("2 claims, 40Gi/"), d
        assert d["capacityUsed"]["memory"]["used"] == "40Gi", d
        for h in d["holders"]:
            assert h["share"] and h["consumedCapacity"]["memory"] == "20Gi", h
            seen[h["claim"]] = h["pods"]
    assert seen == {f"{ns}/{c}": [f"{ns}/{p}"] for c, p in claims.items()}, seen


@pytest.mark.testbed_only
@pytest.mark.next
def test_fit_a_match_attribute_constraint(bed: Bed, ns: str, fleet_nodes: tuple[str, str]) -> None:
    tmpl = template("a40-pair", GPU_CLASS, product("NVIDIA A40"), count=2, match="resource.kubernetes.io/numaNode")
    report, _ = predict_then_schedule(bed, ns, tmpl, {NODE_B: 1})
    assert report["models"] == {"NVIDIA A40": 2}, report


@pytest.mark.testbed_only
@pytest.mark.next
def test_fit_a_prioritized_list(bed: Bed, ns: str, fleet_nodes: tuple[str, str]) -> None:
    tmpl = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "a6000-or-a2"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
                {"name": "big", "deviceClassName": GPU_CLASS, "count": 2,
                 "selectors": [{"cel": {"expression": product("NVIDIA RTX A6000")}}]},
                {"name": "small", "deviceClassName": GPU_CLASS,
                 "selectors": [{"cel": {"expression": product("NVIDIA A2")}}]}]}]}}}}
    report, bound = predict_then_schedule(bed, ns, tmpl, {NODE_A: 2, NODE_B: 2})
    assert report["models"] == {"NVIDIA RTX A6000": 2, "NVIDIA A2": 3}, report
    results = [r for p in bound for r in claim_of(bed, ns, p, "gpu")["status"]["allocation"]["devices"]["results"]]
    taken = Counter(r["request"] for r in results)
    assert taken == {"gpu/big": 2, "gpu/small": 3}, taken


@pytest.mark.testbed_only
@pytest.mark.next
def test_fit_a_pod_puts_its_claims_on_one_node(bed: Bed, ns: str, fleet_nodes: tuple[str, str]) -> None:
    both = ("a", "b")
    tmpl = template("a16", GPU_CLASS, product("NVIDIA A16"))
    bed.apply([tmpl, pod("first", "a16", both)], ns=ns)
    placed = wait_for("the first pod bound", lambda: bed.get("pod", "first", ns)["spec"].get("nodeName"), 60)
    other = NODE_B if placed == NODE_A else NODE_A
    report, _ = predict_then_schedule(bed, ns, tmpl, {other: 1}, target=("pod/first",), claims=both,
                                      make=lambda name: pod(name, "a16", both))
    assert report["target"] == f"pod {ns}/first" and report["models"] == {"NVIDIA A16": 2}, report


@pytest.mark.testbed_only
def test_a_withheld_device_shows_as_withheld(bed: Bed, fleet_nodes: tuple[str, str]) -> None:
    rows = wait_for("fleet-b's withheld GPU in get gpus", lambda: [
        d for d in dra_json(bed, "get", "gpus", "--node", NODE_B)["devices"] if d["state"] == "withheld"], 60)
    assert [(d["device"], d["health"], d["holders"]) for d in rows] == [("gpu-7", "", [])], rows
    assert "version-18-digits" in rows[0]["detail"] and BAD_CAPABILITY in rows[0]["detail"], rows
    nodes = {n["node"]: n for n in dra_json(bed, "get", "nodes", "--node", NODE_B)["nodes"]}
    assert [w["device"] for w in nodes[NODE_B]["withheld"]] == ["gpu-7"], nodes


# --------------------------------------------------------------------------- kubectl's plugin lookup


def kubectl_dra(bed: Bed, env: dict[str, str], *args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``kubectl dra ARGS``: the bed's kubectl finds the plugin on PATH and runs it."""
    return subprocess.run([bed.kubectl_bin, "dra", *args, "--kubeconfig", str(kubeconfig or bed.kubeconfig)],
                          capture_output=True, text=True, timeout=90, env=env, check=False)


def kubectl_dra_json(bed: Bed, env: dict[str, str], *args: str, kubeconfig: Path | None = None) -> dict[str, Any]:
    proc = kubectl_dra(bed, env, *args, "-o", "json", kubeconfig=kubeconfig)
    assert proc.returncode == 0, (args, proc.stderr)
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def kubeconfig_with(bed: Bed, path: Path, name: str, namespace: str, *, token: str | None = None,
                    server: str | None = None) -> Path:
    """A copy of the bed's kubeconfig with one more context, ``name``, in ``namespace`` (as the user
    of ``token``, at ``server``, where given)."""
    doc = yaml.safe_load(bed.kubeconfig.read_text())
    [ctx] = doc["contexts"]
    context = {**ctx["context"], "namespace": namespace}
    if token is not None:
        doc["users"].append({"name": f"{name}-user", "user": {"token": token}})
        context["user"] = f"{name}-user"
    if server is not None:
        [cluster] = [c for c in doc["clusters"] if c["name"] == ctx["context"]["cluster"]]
        doc["clusters"].append({"name": f"{name}-cluster", "cluster": {**cluster["cluster"], "server": server}})
        context["cluster"] = f"{name}-cluster"
    doc["contexts"].append({"name": name, "context": context})
    path.write_text(yaml.safe_dump(doc))
    return path


GPU_KEYS = {"kind", "rules", "devices"}
DEVICE_KEYS = {"node", "driver", "pool", "device", "type", "model", "memory", "migProfile", "parent", "health", "taints",
               "state", "detail", "holders"}
HOLDER_KEYS = {"claim", "pods", "consumedCapacity", "share", "adminAccess"}
OPTIONAL_GPU_KEYS = {"podsHidden", "withheldUnknown", "selectorErrors", "unreadable", "rulesWarning"}
OPTIONAL_DEVICE_KEYS = {"capacityUsed", "canMake"}


def assert_gpu_schema(doc: dict[str, Any]) -> None:
    assert doc["kind"] == "GpuList" and GPU_KEYS <= set(doc) <= GPU_KEYS | OPTIONAL_GPU_KEYS, sorted(doc)
    assert doc["devices"], doc
    for d in doc["devices"]:
        assert DEVICE_KEYS <= set(d) <= DEVICE_KEYS | OPTIONAL_DEVICE_KEYS, sorted(d)
        assert d["driver"] == DRIVER and d["state"] in ("free", "allocated", "shared", "tainted", "blocked", "withheld"), d
        for h in d["holders"]:
            assert set(h) == HOLDER_KEYS, sorted(h)


def held_by(doc: dict[str, Any], claim: str) -> list[dict[str, Any]]:
    return [h for d in doc["devices"] for h in d["holders"] if h["claim"] == claim]


def test_kubectl_dra_get_gpus_namespace_all_and_context(bed: Bed, ns: str, plugin_path: dict[str, str], tmp_path: Path) -> None:
    bed.apply([template("one", GPU_CLASS, "true"), pod("one", "one")], ns=ns)
    wait_running(bed, ns, "one", timeout=120)
    claim = claim_of(bed, ns, "one", "gpu")
    name = f"{ns}/{claim['metadata']['name']}"
    (result,) = claim["status"]["allocation"]["devices"]["results"]

    in_ns = kubectl_dra_json(bed, plugin_path, "get", "gpus", "-n", ns)
    assert_gpu_schema(in_ns)
    [row] = [d for d in in_ns["devices"] if (d["pool"], d["device"]) == (result["pool"], result["device"])]
    assert [(h["claim"], h["pods"]) for h in row["holders"]] == [(name, [f"{ns}/one"])], row
    assert row["state"] in ("allocated", "shared"), row

    everywhere = kubectl_dra_json(bed, plugin_path, "get", "gpus", "-A")
    assert_gpu_schema(everywhere)
    assert [h["pods"] for h in held_by(everywhere, name)] == [[f"{ns}/one"]], held_by(everywhere, name)
    other = kubectl_dra_json(bed, plugin_path, "get", "devices", "-n", "default")
    assert [h["pods"] for h in held_by(other, name)] == [None], "a holder of a namespace not read shows no pods"

    config = kubeconfig_with(bed, tmp_path / "kubeconfig", "team", ns)
    by_context = kubectl_dra_json(bed, plugin_path, "get", "gpus", "--context", "team", kubeconfig=config)
    assert held_by(by_context, name) == held_by(in_ns, name), by_context

    nodes = kubectl_dra_json(bed, plugin_path, "get", "nodes")
    assert nodes["kind"] == "GpuNodeList" and nodes["nodes"], nodes
    for n in nodes["nodes"]:
        assert {"node", "gpus", "sharesInUse", "sharedDevices", "migDevices", "taints", "withheld"} <= set(n), sorted(n)
    assert result["pool"] in {n["node"] for n in nodes["nodes"]}
    top = kubectl_dra_json(bed, plugin_path, "top")
    assert top["kind"] == "GpuTop" and {"rules", "models", "deviceClasses", "withheld"} <= set(top), sorted(top)
    for r in [*top["models"], *top["deviceClasses"]]:
        assert {"total", "allocated", "shared", "free", "unhealthy", "nodesAllFree"} <= set(r), r
    assert sum(r["allocated"] + r["shared"] for r in top["models"]) >= 1, top
    fitted = kubectl_dra_json(bed, plugin_path, "fit", "--template", "one", "-n", ns)
    assert {"kind", "target", "rules", "asked", "fits", "nodes", "models"} <= set(fitted), sorted(fitted)
    assert fitted["target"] == f"ResourceClaimTemplate {ns}/one" and fitted["asked"] == 1, fitted


# --------------------------------------------------------------------------- bad input


def test_bad_input_is_one_line_and_exit_1(bed: Bed, ns: str, plugin_path: dict[str, str], tmp_path: Path) -> None:
    one_line_failure(kubectl_dra(bed, plugin_path, "fit", "--template", "nope", "-n", ns),
                     f"ResourceClaimTemplate {ns}/nope not found")
    one_line_failure(kubectl_dra(bed, plugin_path, "fit", "pod/nope", "-n", ns), f"Pod {ns}/nope not found")

    expression = "device.driver =="
    said = one_line_failure(kubectl_dra(bed, plugin_path, "get", "gpus", "--selector", expression),
                            f"invalid --selector {expression!r}")
    assert "offset 16" in said, said

    other_class = f"tpu-{ns}.example.com"
    bed.apply([{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": other_class},
                "spec": {"selectors": [{"cel": {"expression": 'device.driver == "tpu.example.com"'}}]}}])
    try:
        claim = tmp_path / "tpu.yaml"
        claim.write_text(yaml.safe_dump({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                         "metadata": {"name": "tpu"},
                                         "spec": {"devices": {"requests": [{"name": "tpu", "exactly": {
                                             "deviceClassName": other_class}}]}}}))
        one_line_failure(kubectl_dra(bed, plugin_path, "fit", "-f", str(claim), "-n", ns),
                         f"is a claim of tpu.example.com, not of {DRIVER}")
    finally:
        bed.kubectl("delete", "deviceclass", other_class, "--wait=false", check=False)

    # A user who may read what the device view needs cluster-wide, and pods and templates in this
    # namespace only.
    viewer = f"fleet-view-{ns}"
    bed.kubectl("create", "serviceaccount", "viewer", "-n", ns)
    bed.kubectl("create", "clusterrole", viewer, "--verb=get,list",
                "--resource=resourceslices.resource.k8s.io,deviceclasses.resource.k8s.io,"
                "devicetaintrules.resource.k8s.io,resourceclaims.resource.k8s.io")
    try:
        bed.kubectl("create", "clusterrolebinding", viewer, f"--clusterrole={viewer}", f"--serviceaccount={ns}:viewer")
        bed.kubectl("create", "role", "viewer", "-n", ns, "--verb=get,list",
                    "--resource=pods,resourceclaimtemplates.resource.k8s.io")
        bed.kubectl("create", "rolebinding", "viewer", "-n", ns, "--role=viewer", f"--serviceaccount={ns}:viewer")
        token = bed.kubectl("create", "token", "viewer", "-n", ns).stdout.strip()
        config = kubeconfig_with(bed, tmp_path / "viewer", "viewer", ns, token=token)
        forbidden = one_line_failure(kubectl_dra(bed, plugin_path, "fit", "--template", "kube-system/anything",
                                                 "--context", "viewer", kubeconfig=config), "not allowed")
        assert "kube-system" in forbidden, forbidden
        # Pods it may not list are hidden, not an error: the claims still show.
        hidden = wait_for("the viewer's permissions", lambda: (proc := kubectl_dra(
            bed, plugin_path, "get", "gpus", "-n", "kube-system", "-o", "json", "--context", "viewer",
            kubeconfig=config)).returncode == 0 and json.loads(proc.stdout), 30)
        assert "kube-system" in hidden["podsHidden"], hidden.get("podsHidden")
    finally:
        bed.kubectl("delete", "clusterrolebinding", viewer, "--ignore-not-found", check=False)
        bed.kubectl("delete", "clusterrole", viewer, "--ignore-not-found", check=False)

    config = kubeconfig_with(bed, tmp_path / "gone", "gone", ns, server="https://127.0.0.1:9")
    one_line_failure(kubectl_dra(bed, plugin_path, "get", "gpus", "--context", "gone", kubeconfig=config),
                     "cannot reach the cluster")
    one_line_failure(kubectl_dra(bed, plugin_path, "top", "--context", "gone", kubeconfig=config),
                     "cannot reach the cluster")


# --------------------------------------------------------------------------- migrate's fit


@pytest.mark.testbed_only
def test_migrate_says_whether_each_workload_fits_now(bed: Bed, ns: str, tmp_path: Path) -> None:
    """migrate's report, through the API client it reads with, answers with the fleet view's fit."""
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"}, "spec": {
        "suspend": True, "parallelism": 2, "template": {"spec": {"restartPolicy": "Never", "containers": [{
            "name": "ctr0", "image": "busybox:1.36", "command": ["true"], "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}
    bed.apply([job], ns=ns)
    config = tmp_path / "device-plugin.yaml"
    config.write_text("version: v1\nflags: {migStrategy: none}\n")
    proc = dra(bed, "migrate", "-f", str(config))
    assert proc.returncode == 0, proc.stderr
    [line] = [line for line in proc.stdout.splitlines() if f"Job {ns}/train nvidia.com/gpu: 1" in line]
    assert "; fits now: yes, all 2 pods, on " in line, line
