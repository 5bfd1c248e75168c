"""NVIDIA's DRA driver's published examples, unchanged, against this driver under ``--api-profile nvidia``
(issue 55), on the bed's real control plane.

The profile runs as a second driver beside the bed's own, on simulated nodes of its own that this
module adds (``gpu.nvidia.com`` plugins, with NVIDIA's DeviceClasses made from
``dra_driver/apiprofile.py``, the names the chart installs): two ``nvidia-examples`` nodes (five
full A100s each, an A100 in MIG mode with gpu-test4's four devices, an H100 NVL with 1g.12gb MIG
devices), their plugins programming the GPUs through the stand-in ``nvidia-smi`` and MPS control
daemon (e2e/testbed/standins); and one node of one GPU per ``--consumable-shares`` mode (4,
memory, unlimited), one mode per plugin as a DaemonSet would have it; and the second release's
controller (``--api-profile nvidia``, a Lease and ledger of its own).

Each manifest of e2e/manifests/nvidia is applied as it is, and each pod must run with the devices
and the sharing NVIDIA's README gives it: which devices (the claim's ``status.allocation`` and the
``NVIDIA_VISIBLE_DEVICES`` the CDI spec set), the time-slice interval and the MPS daemon's
settings (what the stand-ins were asked), the shares each claim consumed. gpu-test6's selector
reads ``index``, which NVIDIA's driver no longer publishes, nor this profile: its pods stay pending
with the CEL error in the scheduler's condition, ``explain`` and the claim's explanation. The
refused manifests fail to prepare, the pod's event naming the field or the kind, and the
controller's Warning Event ``InvalidConfig`` names it too.

No manifest can say which nodes it runs on, and the examples' classes match every GPU of the
driver: DeviceTaintRules (``NoSchedule``, on whole pools) keep the examples off the nodes a test is
not about, the consumable-shares nodes for the quickstart and the others for each shares example.

On kind (the shared suite) every test runs against the chart installed a second time with
``apiProfile: nvidia``, ``simulatedProfile: nvidia-examples`` and ``simulated.driverRoot`` (the
stand-ins, copied onto the node by run-e2e.sh; the tests copy their records back) on the nodes
``E2E_NVIDIA_PROFILE_NODES`` names (worker 3), and is skipped, saying so, where it is not set. There
the first release's class serves ``nvidia.com/gpu`` (Kubernetes serves a name through one class,
and the shared scenarios use it): the full-GPU extended-resource example moves the name to this
release with ``helm upgrade`` and back, as an admin switching drivers would. The node has one
``consumableShares`` mode at a time: each shares example upgrades the release to its mode, and the
module puts ``disabled`` back at its end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.apiprofile import NVIDIA_DRIVER_NAME, NVIDIA_PROFILE, class_selector
from e2e.testbed.cluster import free_port
from e2e.testbed.clusterview import (
    EXPLAINED_BY_ANNOTATION,
    EXPLANATION_ANNOTATION,
    REPO,
    SUMMARY_ANNOTATION,
    Bed,
    attr,
    claim_of,
    load_manifests,
    names_of,
    observed,
    wait_for,
    wait_running,
)
from e2e.testbed.nodes import SimNode
from e2e.testbed.standins import install as standins
from e2e.tooling import bytecode

NVIDIA = NVIDIA_DRIVER_NAME
MANIFESTS = REPO / "e2e" / "manifests" / "nvidia"
QUICKSTART = ("nv-node-1", "nv-node-2")
"""Nodes of the built-in ``nvidia-examples`` profile: 5 full A100s, a MIG A100, a MIG H100 NVL."""
SHARES = {"nv-shares-4": "4", "nv-shares-memory": "memory", "nv-shares-unlimited": "unlimited"}
"""A node of one A100 per ``--consumable-shares`` mode."""
PUBLISHED = {**dict.fromkeys(QUICKSTART, 5 + 4 + 3), **dict.fromkeys(SHARES, 1)}
ONE_A100 = {
    "description": "1x NVIDIA A100-SXM4-40GB", "driverVersion": "580.95.05", "cudaDriverVersion": "13.0",
    "models": {"a100": {"productName": "NVIDIA A100-SXM4-40GB", "brand": "Nvidia", "architecture": "Ampere",
                        "cudaComputeCapability": "8.0", "memoryMiB": 40960, "multiprocessors": 108}},
    "gpus": [{"index": 0, "model": "a100", "pciBusId": "0000:07:00.0", "numaNode": 0}],
}
FENCE_KEY = "e2e.dra-driver.io/not-this-test"
CONTROLLER = "controller-nvidia"


def nvidia_classes() -> list[dict[str, Any]]:
    """NVIDIA's DeviceClasses, from the profile's ClassSpecs, as the chart renders them under apiProfile nvidia."""
    out = []
    for spec in NVIDIA_PROFILE.device_classes(NVIDIA):
        body: dict[str, Any] = {"selectors": [{"cel": {"expression": class_selector(NVIDIA, spec.device_type)}}]}
        if spec.extended_resource_name:
            body["extendedResourceName"] = spec.extended_resource_name
        out.append({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                    "metadata": {"name": spec.name, "labels": {"app.kubernetes.io/part-of": "dra-driver"}}, "spec": body})
    return out


def fence(node: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule", "metadata": {"name": f"e2e-fence-{node}"},
            "spec": {"deviceSelector": {"driver": NVIDIA, "pool": node},
                     "taint": {"key": FENCE_KEY, "value": "fenced", "effect": "NoSchedule"}}}


@dataclass
class Profiled:
    bed: Bed
    quickstart: tuple[str, ...]
    """The nodes of the ``nvidia-examples`` profile."""
    standin_roots: dict[str, Path]
    """Per node, the stand-ins' driver root: on this machine (the bed), or on the kind node."""
    fenced: set[str]
    changed: set[str] = field(default_factory=set)
    """On kind, the release values a test changed, to put back at the end of the module."""

    @property
    def on_kind(self) -> bool:
        return self.bed.fleet is None

    def standins(self, node: str) -> Path:
        """A folder on this machine to read the node's stand-ins' records from, as they are now
        (on kind, copied from the node)."""
        root = self.standin_roots[node]
        if not self.on_kind:
            return root
        here = Path(tempfile.gettempdir()) / f"e2e-standins-{node}"
        shutil.rmtree(here, ignore_errors=True)
        target = standins.state_dir(here)
        target.parent.mkdir(parents=True)
        copied = subprocess.run(["docker", "cp", f"{node}:{standins.state_dir(root)}", str(target)],
                                capture_output=True, text=True, timeout=60, check=False)
        assert copied.returncode == 0 or "Could not find" in copied.stderr, copied.stderr
        return here

    @contextlib.contextmanager
    def shares_node(self, mode: str) -> Iterator[str]:
        """A node whose plugin publishes its GPUs with ``--consumable-shares=mode``, the only one
        open meanwhile: on the bed the module's node of that mode; on kind the nvidia-profile node,
        its release upgraded to that mode (as an admin would; put back at the end of the module)."""
        if not self.on_kind:
            (node,) = [n for n, m in SHARES.items() if m == mode]
            self.open_only({node})
            try:
                yield node
            finally:
                self.open_only(set(self.quickstart))
            return
        (node,) = self.quickstart
        self.changed.add("consumableShares")
        self.set_shares(mode)
        yield node

    def set_shares(self, mode: str) -> None:
        """On kind: the nvidia-profile release upgraded to ``consumableShares=mode``, waited for
        until its node's GPUs are published so."""
        (node,) = self.quickstart
        release_upgrade(NV_RELEASE_ENV, f"consumableShares={mode}")
        wait_for(f"{node}'s GPUs published with --consumable-shares={mode}", lambda: all(
            shares_published(d, mode) for (pool, _), d in nv_devices(self.bed).items()
            if pool == node and attr(d, "type") == "gpu"), 120)

    @contextlib.contextmanager
    def serving_nvidia_gpu(self) -> Iterator[None]:
        """``nvidia.com/gpu`` served by ``gpu.nvidia.com``: on the bed the module's classes do; on
        kind the first release's class serves it (the shared scenarios use it), so it moves to this
        release for the test, as an admin switching drivers moves it, and back."""
        if not self.on_kind:
            yield
            return
        release_upgrade(OWN_RELEASE_ENV, "deviceClasses.extendedResourceName=")
        release_upgrade(NV_RELEASE_ENV, "deviceClasses.extendedResourceName=nvidia.com/gpu")
        try:
            time.sleep(1.0)  # the scheduler's informer sees the classes
            yield
        finally:
            release_upgrade(NV_RELEASE_ENV, "deviceClasses.extendedResourceName=")
            release_upgrade(OWN_RELEASE_ENV, "deviceClasses.extendedResourceName=nvidia.com/gpu")

    def open_only(self, nodes: set[str]) -> None:
        """Fence every node of the module but ``nodes``."""
        for node in sorted(self.fenced & nodes):
            self.bed.kubectl("delete", "devicetaintrule", f"e2e-fence-{node}", "--ignore-not-found")
        wanted = set(PUBLISHED) - nodes - self.fenced
        if wanted:
            self.bed.apply([fence(n) for n in sorted(wanted)])
        self.fenced = set(PUBLISHED) - nodes
        time.sleep(1.0)  # the scheduler's informer sees the rules


OWN_RELEASE_ENV = ("E2E_RELEASE", "E2E_DRIVER_NAMESPACE")
NV_RELEASE_ENV = ("E2E_NVIDIA_RELEASE", "E2E_NVIDIA_NAMESPACE")


def release_upgrade(release_env: tuple[str, str], *values: str) -> None:
    """``helm upgrade --reuse-values`` of a release run-e2e.sh installed (its name and namespace
    in the environment variables ``release_env``), with ``values`` set, waited for."""
    release, namespace = (os.environ[name] for name in release_env)
    cmd = [os.environ.get("HELM") or "helm", "upgrade", release, str(REPO / "deploy" / "helm" / "dra-driver"),
           "--namespace", namespace, "--reuse-values", *(a for v in values for a in ("--set", v)),
           "--wait", "--timeout", "5m"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=330, check=False)
    assert proc.returncode == 0, f"helm upgrade {release} {' '.join(values)}: {proc.stderr.strip()}"


def shares_published(device: dict[str, Any], mode: str) -> bool:
    """Whether a full GPU is published as ``--consumable-shares=mode`` publishes it."""
    capacity = device.get("capacity") or {}
    if mode == "disabled":
        return not device.get("allowMultipleAllocations")
    if not device.get("allowMultipleAllocations"):
        return False
    default = (capacity.get("memory") or {}).get("requestPolicy", {}).get("default")
    if mode == "memory":
        return "shares" not in capacity and default not in (None, "0")
    if mode == "unlimited":
        return "shares" not in capacity and default == "0"
    return bool((capacity.get("shares") or {}).get("value") == mode)


def nv_devices(bed: Bed) -> dict[tuple[str, str], dict[str, Any]]:
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for s in bed.get("resourceslices", selector=f"spec.driver={NVIDIA}")["items"]:
        for d in s["spec"].get("devices") or []:
            out[(s["spec"]["pool"]["name"], d["name"])] = d
    return out


@pytest.fixture(scope="module")
def profiled(bed: Bed) -> Iterator[Profiled]:
    if bed.fleet is None:
        yield from on_kind(bed)
        return
    fleet = bed.fleet
    roots: dict[str, Path] = {}
    state = Profiled(bed, QUICKSTART, roots, set(SHARES))
    nodes: list[SimNode] = []
    for name in QUICKSTART:
        root = fleet.workdir / "nodes" / name
        roots[name] = standins.install(root / "standin-driver-root")
        nodes.append(SimNode(name, "nvidia-examples", root, driver_name=NVIDIA,
                             flags=("--api-profile=nvidia", f"--nvidia-driver-root={roots[name]}")))
    for name, mode in SHARES.items():
        root = fleet.workdir / "nodes" / name
        root.mkdir(parents=True, exist_ok=True)
        (root / "profile.yaml").write_text(yaml.safe_dump(ONE_A100))
        nodes.append(SimNode(name, str(root / "profile.yaml"), root, driver_name=NVIDIA,
                             flags=("--api-profile=nvidia", f"--consumable-shares={mode}")))
    try:
        bed.apply(nvidia_classes() + [fence(n) for n in sorted(SHARES)])
        fleet.add_nodes(nodes)
        # The second release's controller: its own Lease and ledger, NVIDIA's config read for gpu.nvidia.com.
        fleet.procs.start(CONTROLLER, [
            *bytecode.shipped_python(), "-m", "dra_driver", "controller", f"--kubeconfig={fleet.kubeconfig}",
            "--api-profile=nvidia", "--log-format=json", f"--metrics-port={free_port()}",
            "--leader-election-namespace=kube-system", "--leader-election-id=dra-driver-controller-nvidia",
            "--allocation-ledger=kube-system/dra-driver-allocations-nvidia", "--resync-seconds=5"])
        wait_for("the nvidia-profile nodes' devices published",
                 lambda: Counter(pool for pool, _ in nv_devices(bed)) == Counter(PUBLISHED), 90)
        yield state
    finally:
        bed.kubectl("delete", "namespace", *example_namespaces(), "--ignore-not-found", "--wait=false", check=False)
        # The pods go with their namespaces; a node's peer must be there to unprepare their claims.
        wait_for("the examples' pods gone from the nvidia-profile nodes", lambda: not any(
            bed.get("pods", selector=f"spec.nodeName={n}")["items"] for n in PUBLISHED), 90, 1)
        for root in roots.values():
            for pid_file in (root.parent / "plugin-state").glob("mps/*/pipe/nvidia-cuda-mps-control.pid"):
                with contextlib.suppress(OSError, ValueError):
                    os.kill(int(pid_file.read_text()), signal.SIGKILL)
        fleet.procs.stop(CONTROLLER)
        for node in nodes:
            fleet.remove_node(node.name)
        bed.kubectl("delete", "resourceslices", f"--field-selector=spec.driver={NVIDIA}", "--wait=false", check=False)
        bed.kubectl("delete", "node", *PUBLISHED, "--wait=false", "--ignore-not-found", check=False)
        bed.kubectl("delete", "devicetaintrule", *(f"e2e-fence-{n}" for n in PUBLISHED), "--ignore-not-found",
                    check=False)
        bed.kubectl("delete", "deviceclass", *(c["metadata"]["name"] for c in nvidia_classes()),
                    "mig-1g-12gb.gpu.nvidia.com", "--ignore-not-found", check=False)


def example_namespaces() -> list[str]:
    return [d["metadata"]["name"] for f in sorted(MANIFESTS.rglob("*.yaml")) for d in load_manifests(f)
            if d["kind"] == "Namespace"]


def on_kind(bed: Bed) -> Iterator[Profiled]:
    """On kind the profile is the chart installed a second time (``apiProfile: nvidia``, its classes
    with it) on the nodes ``E2E_NVIDIA_PROFILE_NODES`` names, each of the ``nvidia-examples`` profile."""
    nodes = tuple(n for n in os.environ.get("E2E_NVIDIA_PROFILE_NODES", "").split(",") if n)
    if not nodes:
        pytest.skip("needs a release with apiProfile: nvidia and simulatedProfile: nvidia-examples on the nodes "
                    "named in E2E_NVIDIA_PROFILE_NODES")
    wait_for("the nvidia-profile release's devices published",
             lambda: {pool for pool, _ in nv_devices(bed)} >= set(nodes), 90)
    root = Path(os.environ.get("E2E_NVIDIA_STANDIN_ROOT") or "/nonexistent")
    state = Profiled(bed, nodes, dict.fromkeys(nodes, root), set())
    try:
        yield state
    finally:
        bed.kubectl("delete", "namespace", *example_namespaces(), "--ignore-not-found", "--wait=false", check=False)
        bed.kubectl("delete", "deviceclass", "mig-1g-12gb.gpu.nvidia.com", "--ignore-not-found", check=False)
        if "consumableShares" in state.changed:
            state.set_shares("disabled")



# --------------------------------------------------------------------------- what a pod got


def manifest(name: str) -> tuple[str, list[dict[str, Any]]]:
    docs = load_manifests(MANIFESTS / name)
    [namespace] = names_of(docs, "Namespace")
    return namespace, docs


def run(bed: Bed, name: str) -> tuple[str, list[dict[str, Any]]]:
    """Apply the manifest as it is; the namespace goes at the end of the test (and of the module)."""
    namespace, docs = manifest(name)
    bed.apply(docs)
    return namespace, docs


def results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = claim["status"]["allocation"]["devices"]["results"]
    assert {r["driver"] for r in found} == {NVIDIA}, found
    return found


def device_of(bed: Bed, result: dict[str, Any]) -> dict[str, Any]:
    return nv_devices(bed)[(result["pool"], result["device"])]


def visible(bed: Bed, ns: str, pod: str) -> dict[str, list[str]]:
    """Per container, the NVIDIA_VISIBLE_DEVICES its CDI edits set."""
    return {name: view["env"]["NVIDIA_VISIBLE_DEVICES"].split(",") for name, view in observed(bed, ns, pod).items()}


def own_devices(bed: Bed, ns: str, pod: str) -> dict[str, set[str]]:
    """Per container, the UUIDs of the devices whose CDI edits it got (``DRA_GPU_<i>_UUID``, set by
    each device's own edits: a container that names one request of the claim gets only its devices)."""
    return {name: {v for k, v in view["env"].items() if k.startswith("DRA_GPU_") and k.endswith("_UUID")}
            for name, view in observed(bed, ns, pod).items()}


def env_of(bed: Bed, ns: str, pod: str, container: str) -> dict[str, str]:
    env: dict[str, str] = observed(bed, ns, pod)[container]["env"]
    return env


def running_pods(bed: Bed, ns: str) -> list[dict[str, Any]]:
    return [p for p in bed.get("pods", ns=ns)["items"] if p.get("status", {}).get("phase") == "Running"]


def unschedulable(pod: dict[str, Any]) -> str | None:
    """The scheduler's word on a pod it could not place (``Unschedulable``, or ``SchedulerError``
    for a selector that fails to evaluate); None while it has said nothing."""
    for c in pod.get("status", {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason"):
            return f"{c['reason']}: {c.get('message', '')}"
    return None


def waiting(bed: Bed, ns: str, count: int) -> list[dict[str, Any]] | None:
    """The pods of ``ns`` the scheduler has said it cannot place, once ``count`` of them have (the
    scheduler tells each pod in turn: fewer is not yet an answer)."""
    found = [p for p in bed.get("pods", ns=ns)["items"] if unschedulable(p) is not None]
    return found if len(found) >= count else None


def pod_events(bed: Bed, ns: str, pod: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = bed.get("events", ns=ns)["items"]
    return [e for e in items if e.get("involvedObject", {}).get("name") == pod]


def full_gpu_name(device: dict[str, Any]) -> bool:
    return device["name"].startswith("gpu-") and device["name"].removeprefix("gpu-").isdigit()


# --------------------------------------------------------------------------- the quickstart


def test_gpu_test1_two_pods_each_with_a_gpu_of_its_own(bed: Bed, profiled: Profiled) -> None:
    ns, docs = run(bed, "gpu-test1.yaml")
    seen = {}
    for pod in names_of(docs, "Pod"):
        wait_running(bed, ns, pod)
        (result,) = results(claim_of(bed, ns, pod, "gpu"))
        device = device_of(bed, result)
        assert attr(device, "type") == "gpu" and full_gpu_name(device), device
        assert visible(bed, ns, pod) == {"ctr": [attr(device, "uuid")]}
        seen[pod] = (result["pool"], result["device"])
    assert len(set(seen.values())) == 2, seen
    bed.kubectl("delete", "namespace", ns, "--wait=false")


def test_gpu_test2_two_containers_share_the_pods_gpu(bed: Bed, profiled: Profiled) -> None:
    ns, _ = run(bed, "gpu-test2.yaml")
    wait_running(bed, ns, "pod")
    (result,) = results(claim_of(bed, ns, "pod", "shared-gpu"))
    uuid = attr(device_of(bed, result), "uuid")
    assert visible(bed, ns, "pod") == {"ctr0": [uuid], "ctr1": [uuid]}
    bed.kubectl("delete", "namespace", ns, "--wait=false")


def test_gpu_test3_two_pods_share_one_claim(bed: Bed, profiled: Profiled) -> None:
    ns, _ = run(bed, "gpu-test3.yaml")
    for pod in ("pod1", "pod2"):
        wait_running(bed, ns, pod)
    claim = bed.get("resourceclaim", "single-gpu", ns)
    (result,) = results(claim)
    uuid = attr(device_of(bed, result), "uuid")
    assert {r["name"] for r in claim["status"]["reservedFor"]} == {"pod1", "pod2"}
    assert visible(bed, ns, "pod1") == visible(bed, ns, "pod2") == {"ctr": [uuid]}
    assert {bed.get("pod", p, ns)["spec"]["nodeName"] for p in ("pod1", "pod2")} == {result["pool"]}
    bed.kubectl("delete", "namespace", ns, "--wait=false")


def test_gpu_test4_four_mig_devices_of_one_gpu_per_pod(bed: Bed, profiled: Profiled) -> None:
    """A MIG A100 with the four devices on each node: a replica per node runs, the others stay pending."""
    ns, _ = run(bed, "gpu-test4.yaml")
    mig_gpus = len(profiled.quickstart)
    wait_for(f"{mig_gpus} gpu-test4 replicas running", lambda: len(running_pods(bed, ns)) == mig_gpus, 90)
    parents = set()
    for pod in running_pods(bed, ns):
        name = pod["metadata"]["name"]
        by_request = {r["request"]: r for r in results(claim_of(bed, ns, name, "mig-devices"))}
        devices = {request: device_of(bed, r) for request, r in by_request.items()}
        profiles = {request: attr(d, "profile") for request, d in devices.items()}
        assert profiles == {"mig-1g-5gb-0": "1g.5gb", "mig-1g-5gb-1": "1g.5gb", "mig-2g-10gb": "2g.10gb",
                            "mig-3g-20gb": "3g.20gb"}, profiles
        (parent,) = {attr(d, "parentUUID") for d in devices.values()}
        parents.add(parent)
        for d in devices.values():
            assert d["name"].startswith("gpu-5-mig-") and attr(d, "type") == "mig", d["name"]
        seen = own_devices(bed, ns, name)
        for i, request in enumerate(("mig-1g-5gb-0", "mig-1g-5gb-1", "mig-2g-10gb", "mig-3g-20gb")):
            assert seen[f"ctr{i}"] == {attr(devices[request], "uuid")}, (request, seen)
    assert len(parents) == mig_gpus, parents
    pending = wait_for("the other replicas unschedulable", lambda: waiting(bed, ns, 4 - mig_gpus), 30)
    assert len(pending) == 4 - mig_gpus and len(bed.get("pods", ns=ns)["items"]) == 4, [
        unschedulable(p) for p in pending]
    bed.kubectl("delete", "namespace", ns, "--wait=false")


def policy_calls(root: Path, uuid: str) -> list[list[str]]:
    return [c for c in standins.calls(root) if uuid in c and "--query-gpu=compute_mode" not in c]


def test_gpu_test5_one_gpu_time_sliced_one_under_mps(bed: Bed, profiled: Profiled) -> None:
    ns, _ = run(bed, "gpu-test5.yaml")
    wait_running(bed, ns, "pod0")
    by_request = {r["request"]: r for r in results(claim_of(bed, ns, "pod0", "shared-gpus"))}
    ts, mps = (device_of(bed, by_request[r]) for r in ("ts-gpu", "mps-gpu"))
    assert ts["name"] != mps["name"] or by_request["ts-gpu"]["pool"] != by_request["mps-gpu"]["pool"]
    seen = own_devices(bed, ns, "pod0")
    assert seen == {"ts-ctr0": {attr(ts, "uuid")}, "ts-ctr1": {attr(ts, "uuid")},
                    "mps-ctr0": {attr(mps, "uuid")}, "mps-ctr1": {attr(mps, "uuid")}}, seen
    for ctr in ("ts-ctr0", "ts-ctr1"):
        env = env_of(bed, ns, "pod0", ctr)
        assert "Long" in {v for k, v in env.items() if k.endswith("_TIMESLICE_INTERVAL")}, env
        assert not any(k.startswith("CUDA_MPS_") for k in env), env
    for ctr in ("mps-ctr0", "mps-ctr1"):
        env = env_of(bed, ns, "pod0", ctr)
        # The limit's ordinal is the MPS GPU's place in the claim's NVIDIA_VISIBLE_DEVICES.
        ordinal = env["NVIDIA_VISIBLE_DEVICES"].split(",").index(attr(mps, "uuid"))
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50", env
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"{ordinal}=10240M", env
        assert env["CUDA_MPS_PIPE_DIRECTORY"], env
    ts_root = profiled.standins(by_request["ts-gpu"]["pool"])
    assert policy_calls(ts_root, attr(ts, "uuid")) == [
        ["-i", attr(ts, "uuid"), "-c", "DEFAULT"], ["compute-policy", "-i", attr(ts, "uuid"), "--set-timeslice=3"]]
    mps_root = profiled.standins(by_request["mps-gpu"]["pool"])
    check_mps_daemon(mps_root, attr(mps, "uuid"))
    bed.kubectl("delete", "namespace", ns, "--wait=false")


def check_mps_daemon(root: Path, uuid: str) -> None:
    """One MPS control daemon for the GPU, started with NVIDIA's defaults of the example (50% of the
    threads, 10Gi of pinned memory), and the GPU in Exclusive_Process."""
    calls = standins.mps_calls(root)
    starts = [c for c in calls if c.get("args") == ["-d"] and c.get("visible") == uuid]
    assert len(starts) == 1, calls
    commands = {c["command"] for c in calls if "daemon" in c and "command" in c}
    assert {"set_default_active_thread_percentage 50", "set_default_device_pinned_mem_limit 0 10240M"} <= commands, calls
    assert standins.gpus(root)[uuid]["computeMode"] == "Exclusive_Process"


def test_gpu_test_mps_two_containers_are_clients_of_one_daemon(bed: Bed, profiled: Profiled) -> None:
    ns, _ = run(bed, "gpu-test-mps.yaml")
    wait_running(bed, ns, "test-pod")
    (result,) = results(claim_of(bed, ns, "test-pod", "shared-gpu"))
    uuid = attr(device_of(bed, result), "uuid")
    assert visible(bed, ns, "test-pod") == {"mps-ctr0": [uuid], "mps-ctr1": [uuid]}
    for ctr in ("mps-ctr0", "mps-ctr1"):
        env = env_of(bed, ns, "test-pod", ctr)
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50" and env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10240M"
    check_mps_daemon(profiled.standins(result["pool"]), uuid)
    bed.kubectl("delete", "namespace", ns, "--wait=false")


def dra(bed: Bed, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dra_driver", *args, "--kubeconfig", str(bed.kubeconfig)],
                          capture_output=True, text=True, timeout=90, check=False)


def test_gpu_test6_selector_on_index_is_explained(bed: Bed, profiled: Profiled) -> None:
    """NVIDIA's plugin stopped publishing ``index``; on an A100 the selector's second half is a CEL
    runtime error: no replica is allocated, and the explanation says why."""
    ns, _ = run(bed, "gpu-test6.yaml")
    pods = wait_for("the four gpu-test6 replicas unschedulable", lambda: waiting(bed, ns, 4), 60)
    assert len(pods) == 4 and not running_pods(bed, ns)
    print(f"\ngpu-test6: the scheduler says: {sorted({str(unschedulable(p)) for p in pods})}")
    explained = dra(bed, "explain", f"pod/{pods[0]['metadata']['name']}", "-n", ns, "--api-profile", "nvidia")
    print(f"gpu-test6: explain says (exit {explained.returncode}):\n{explained.stdout}{explained.stderr}")
    assert "CEL runtime error: no such key: index" in explained.stdout, explained
    assert all("no such key: index" in str(unschedulable(p)) for p in pods)
    claim = claim_of(bed, ns, pods[0]["metadata"]["name"], "a100")["metadata"]["name"]
    wait_for("the controllers' explanation on the claim naming index", lambda: "no such key: index" in bed.get(
        "resourceclaim", claim, ns)["metadata"].get("annotations", {}).get(EXPLANATION_ANNOTATION, ""), 30)
    bed.kubectl("delete", "namespace", ns, "--wait=false")


# --------------------------------------------------------------------------- extended resources


def test_extended_resource_full_gpu(bed: Bed, profiled: Profiled) -> None:
    with profiled.serving_nvidia_gpu():
        ns, _ = run(bed, "extended-resource-gpu.yaml")
        wait_running(bed, ns, "gpu-full-pod")
    status = bed.get("pod", "gpu-full-pod", ns)["status"]
    claim = bed.get("resourceclaim", status["extendedResourceClaimStatus"]["resourceClaimName"], ns)
    (result,) = results(claim)
    device = device_of(bed, result)
    assert attr(device, "type") == "gpu" and full_gpu_name(device)
    assert visible(bed, ns, "gpu-full-pod") == {"cuda-container": [attr(device, "uuid")]}
    bed.kubectl("delete", "namespace", ns, "--wait=false")


def test_extended_resource_mig_1g_12gb(bed: Bed, profiled: Profiled) -> None:
    ns, _ = run(bed, "extended-resource-mig.yaml")
    try:
        wait_running(bed, ns, "mig-1g12gb-pod")
        status = bed.get("pod", "mig-1g12gb-pod", ns)["status"]
        claim = bed.get("resourceclaim", status["extendedResourceClaimStatus"]["resourceClaimName"], ns)
        (result,) = results(claim)
        device = device_of(bed, result)
        assert attr(device, "profile") == "1g.12gb" and device["name"].startswith("gpu-6-mig-1g12gb-"), device["name"]
        assert visible(bed, ns, "mig-1g12gb-pod") == {"cuda-container": [attr(device, "uuid")]}
    finally:
        bed.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        bed.kubectl("delete", "deviceclass", "mig-1g-12gb.gpu.nvidia.com", "--ignore-not-found", check=False)


# --------------------------------------------------------------------------- refused


@pytest.mark.parametrize(("name", "says"), [
    ("refused/unknown-field.yaml", "sharing.mpsConfig.activeThreads: unknown field"),
    ("refused/vfio-config.yaml", "VfioDeviceConfig is NVIDIA's VFIO passthrough"),
])
def test_a_refused_config_fails_to_prepare_naming_why(bed: Bed, profiled: Profiled, name: str, says: str) -> None:
    ns, docs = run(bed, name)
    (pod,) = names_of(docs, "Pod")

    def refused() -> list[str]:
        return [str(e.get("message")) for e in pod_events(bed, ns, pod)
                if e.get("reason") == "FailedPrepareDynamicResources" and says in str(e.get("message"))]

    messages = wait_for(f"{ns}/{pod}'s event naming {says!r}", refused, 60)

    def invalid() -> list[str]:
        items = bed.get("events", ns=ns)["items"]
        return [str(e.get("message")) for e in items if e.get("reason") == "InvalidConfig" and says in str(e.get("message"))]

    noted = wait_for(f"the nvidia-profile controller's InvalidConfig Event naming {says!r}", invalid, 30)
    print(f"\n{name}: controller: {noted[0]}")
    assert bed.get("pod", pod, ns)["status"].get("phase") == "Pending"
    print(f"\n{name}: {messages[0]}")
    bed.kubectl("delete", "namespace", ns, "--wait=false")


def test_a_waiting_claim_is_explained_by_its_own_drivers_controller_alone(bed: Bed, profiled: Profiled) -> None:
    """Both releases' controllers watch this claim; it is for ``gpu.nvidia.com`` only, so the
    nvidia-profile controller explains it (its config is invalid for NVIDIA's API) and the other
    leaves it alone: the explanation is written once, not overwritten back and forth."""
    ns = "gpu-explained-once"
    bad = {"opaque": {"driver": NVIDIA, "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "Bogus"}}}}
    bed.apply([
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "many", "namespace": ns},
         "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": NVIDIA, "count": 99}}],
                              "config": [bad]}}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "waits", "namespace": ns},
         "spec": {"containers": [{"name": "ctr", "image": "busybox:1.36", "command": ["sleep", "86400"],
                                  "resources": {"claims": [{"name": "gpu"}]}}],
                  "resourceClaims": [{"name": "gpu", "resourceClaimName": "many"}]}},
    ])
    try:
        def summary() -> str:
            return str(bed.get("resourceclaim", "many", ns)["metadata"].get("annotations", {}).get(SUMMARY_ANNOTATION, ""))

        said = wait_for("the nvidia-profile controller's explanation", lambda: summary().startswith(
            f"invalid configuration for {NVIDIA}") and summary(), 60)
        print(f"\nexplained: {said}")
        # Two controllers at odds rewrite it every few milliseconds, each in its own words; the
        # owner may still rewrite it (the cluster changes), always in NVIDIA's config's words.
        seen = set()
        for _ in range(20):
            notes = bed.get("resourceclaim", "many", ns)["metadata"].get("annotations", {})
            seen.add((notes.get(EXPLAINED_BY_ANNOTATION), notes.get(SUMMARY_ANNOTATION, "").partition(":")[0]))
            time.sleep(0.25)
        assert seen == {(NVIDIA, f"invalid configuration for {NVIDIA}")}, seen
    finally:
        bed.kubectl("delete", "namespace", ns, "--wait=false", check=False)


# --------------------------------------------------------------------------- consumable shares


def shares_run(bed: Bed, profiled: Profiled, name: str, mode: str, replicas: int) -> list[dict[str, Any]]:
    """The example's replicas on a node of ``mode`` (:meth:`Profiled.shares_node`), all sharing one
    full GPU, as NVIDIA's README has them: their results."""
    with profiled.shares_node(mode) as node:
        ns, _ = run(bed, name)
        wait_for(f"{replicas} replicas of {name} running", lambda: len(running_pods(bed, ns)) == replicas, 90)
        found = []
        for pod in running_pods(bed, ns):
            (result,) = results(claim_of(bed, ns, pod["metadata"]["name"], "gpu"))
            assert result["pool"] == node and result.get("shareID"), result
            device = device_of(bed, result)
            assert attr(device, "type") == "gpu" and full_gpu_name(device), device["name"]
            assert visible(bed, ns, pod["metadata"]["name"]) == {"ctr": [attr(device, "uuid")]}
            found.append(result)
        assert len({r["device"] for r in found}) == 1, found
        assert len({r["shareID"] for r in found}) == replicas
        bed.kubectl("delete", "namespace", ns, "--wait=false")
        # Their claims go before the node's next mode: a share is not held across a change of mode.
        wait_for(f"{ns}'s claims gone", lambda: not bed.get("resourceclaims", ns=ns)["items"], 90, 1)
        return found


def test_shares_integer_four_replicas_one_share_each(bed: Bed, profiled: Profiled) -> None:
    found = shares_run(bed, profiled, "shares-integer.yaml", "4", 4)
    assert all(r["consumedCapacity"].get("shares") == "1" for r in found), found


def test_shares_memory_two_replicas_of_4gi(bed: Bed, profiled: Profiled) -> None:
    found = shares_run(bed, profiled, "shares-memory.yaml", "memory", 2)
    assert all(r["consumedCapacity"].get("memory") == "4Gi" for r in found), found


def test_shares_unlimited_two_replicas_take_nothing(bed: Bed, profiled: Profiled) -> None:
    found = shares_run(bed, profiled, "shares-unlimited.yaml", "unlimited", 2)
    assert all(r["consumedCapacity"].get("memory") in ("0", None) for r in found), found
    print(f"\nshares-unlimited: consumed {[r['consumedCapacity'] for r in found]}")
