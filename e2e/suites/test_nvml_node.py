"""Nodes whose plugin runs the NVML backend, unchanged, on NVIDIA's mock DGX servers.

Each node's driver root holds the ``mock-nvml`` libnvidia-ml.so.1 (our cgo shim over go-nvml's mocks);
the plugin starts with ``--gpu-backend=nvml --nvidia-driver-root=<root>`` and goes through the real
pynvml. The mock's MIG state is the file ``DRA_MOCK_NVML_STATE`` names (written by the library after
every MIG change), so the tests see GPU instances appear and go in the "hardware" itself.

- ``nvml-h100``: a DGX H100 with ``--dynamic-mig``;
- ``nvml-a100``: a DGX A100 with static MIG seeded in the mock (3g.20gb + two 1g.5gb on GPU 0,
  7g.40gb on GPU 1).
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.suites.reliability import Supervisor, wait_serving
from e2e.testbed import mocknvml
from e2e.testbed.clusterview import DRIVER, Bed, attr, claim_of, observed, wait_for, wait_running
from e2e.testbed.nodes import SimNode

pytestmark = pytest.mark.testbed_only

H100, A100 = "nvml-h100", "nvml-a100"
A100_MIG = {0: [(2, 0), (0, 4), (0, 5)], 1: [(4, 0)]}  # (profile id, placement start) per GPU
STORM_FAILPOINTS = ("prepare.after-intent=0.1,prepare.after-started=0.1,prepare.after-cdi-write=0.1,"
                    "prepare.after-completed=0.1,unprepare.after-spec-delete=0.1,unprepare.after-checkpoint=0.1")
STORM_WAVES, STORM_WAVE_SIZE = 3, 4


@pytest.fixture(scope="module")
def nodes(bed: Bed) -> Iterator[dict[str, SimNode]]:
    fleet = bed.fleet
    made = {
        H100: SimNode(H100, "nvml-dgxh100", fleet.workdir / "nodes" / H100, nvml_machine="dgxh100",
                      flags=("--dynamic-mig",)),
        A100: SimNode(A100, "nvml-dgxa100", fleet.workdir / "nodes" / A100, nvml_machine="dgxa100"),
    }
    made[A100].root.mkdir(parents=True, exist_ok=True)
    made[A100].nvml_state.write_text(json.dumps(mocknvml.static_mig_state("dgxa100", A100_MIG)))
    try:
        for node in made.values():
            fleet.add_node(node)
        for name in made:
            wait_for(f"ResourceSlices of {name}", lambda n=name: node_slices(bed, n), timeout=120)
        yield made
    finally:
        for name in made:
            fleet.remove_node(name)
            bed.kubectl("delete", "resourceslices", f"--field-selector=spec.nodeName={name}", "--wait=false", check=False)
            bed.kubectl("delete", "node", name, "--wait=false", check=False)


def node_slices(bed: Bed, node: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = bed.get("resourceslices", selector=f"spec.nodeName={node},spec.driver={DRIVER}")["items"]
    return items


def devices_of(bed: Bed, node: str) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in node_slices(bed, node) for d in s["spec"].get("devices", [])}


def mock_state(node: SimNode) -> dict[str, Any]:
    return mocknvml.read_state(node.nvml_state)


def template(name: str, device_class: str, expression: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": device_class, "selectors": [{"cel": {"expression": expression}}]}}]}}}}


def pod(name: str, node: str, claim_template: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "terminationGracePeriodSeconds": 1,
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": claim_template}],
                     "containers": [{"name": "ctr0", "image": "busybox:1.36", "command": ["sleep", "86400"],
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}


def allocated_device(bed: Bed, ns: str, pod_name: str) -> dict[str, Any]:
    claim = claim_of(bed, ns, pod_name, "gpu")
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == 1, results
    device: dict[str, Any] = devices_of(bed, results[0]["pool"])[results[0]["device"]]
    return device


def visible_devices(bed: Bed, ns: str, pod_name: str) -> str:
    return str(observed(bed, ns, pod_name)["ctr0"]["env"].get("NVIDIA_VISIBLE_DEVICES"))


def gpu_instances_of(node: SimNode) -> list[tuple[int, dict[str, Any]]]:
    return mocknvml.gpu_instances(mock_state(node))


# --- slices ----------------------------------------------------------------------------------------

def test_h100_slices_as_the_api_server_stores_them(bed: Bed, nodes: dict[str, SimNode]) -> None:
    state = mock_state(nodes[H100])
    devices = devices_of(bed, H100)
    for gpu in state["gpus"]:
        i = gpu["index"]
        d = devices[f"gpu-{i}"]
        assert attr(d, "uuid") == gpu["uuid"]  # what the mock's NVML reported, through pynvml
        assert attr(d, "productName") == "NVIDIA H100 80GB HBM3"
        assert (attr(d, "architecture"), attr(d, "cudaComputeCapability")) == ("Hopper", "9.0.0")
        assert (attr(d, "driverVersion"), attr(d, "index"), attr(d, "minor")) == ("570.172.8", i, i)
        assert attr(d, "resource.kubernetes.io/pciBusID") == mocknvml.bus_id(i)
        assert attr(d, "resource.kubernetes.io/pcieRoot") == mocknvml.pcie_root(i)
        assert attr(d, "resource.kubernetes.io/numaNode") == mocknvml.numa_node(i)
        assert d["capacity"]["memory"]["value"] == "80Gi"
        # Dynamic MIG: every profile and placement the mock lists, sharing the GPU's counters.
        assert {f"gpu-{i}-mig-3g40gb-0", f"gpu-{i}-mig-3g40gb-4", f"gpu-{i}-mig-7g80gb-0",
                f"gpu-{i}-mig-1g10gb-me-6"} <= set(devices)
    part = devices["gpu-2-mig-3g40gb-4"]
    assert (attr(part, "type"), attr(part, "profile"), attr(part, "parentUUID")) == (
        "mig", "3g.40gb", state["gpus"][2]["uuid"])
    assert part["capacity"]["memory"]["value"] == "40Gi"
    assert sum(len(s["spec"].get("sharedCounters", [])) for s in node_slices(bed, H100)) == 8


def test_a100_static_mig_slices_follow_the_mock(bed: Bed, nodes: dict[str, SimNode]) -> None:
    state = mock_state(nodes[A100])
    devices = devices_of(bed, A100)
    gpu0 = state["gpus"][0]
    migs = {f"gpu-0-mig-{gi['id']}-0": (gi["profile"], gi["computeInstances"][0]["uuid"]) for gi in gpu0["gpuInstances"]}
    assert migs.keys() == {"gpu-0-mig-1-0", "gpu-0-mig-2-0", "gpu-0-mig-3-0"}
    for name, (profile, uuid) in migs.items():
        assert (attr(devices[name], "profile"), attr(devices[name], "uuid")) == (profile, uuid)
        assert attr(devices[name], "parentUUID") == gpu0["uuid"]
    assert attr(devices["gpu-1-mig-1-0"], "profile") == "7g.40gb"
    assert {"gpu-0", "gpu-1"}.isdisjoint(devices)  # MIG-enabled GPUs are published as their instances
    assert {f"gpu-{i}" for i in range(2, 8)} <= set(devices)
    assert attr(devices["gpu-4"], "productName") == "Mock NVIDIA A100-SXM4-40GB"


# --- pods -------------------------------------------------------------------------------------------

def test_whole_gpu_pod_sees_the_gpu_nvml_reported(bed: Bed, ns: str, nodes: dict[str, SimNode]) -> None:
    bed.apply([template("whole", "gpu.gpu.dra-driver.io", 'device.attributes["gpu.dra-driver.io"].index == 5'),
               pod("whole", H100, "whole")], ns=ns)
    wait_running(bed, ns, "whole", timeout=120)
    device = allocated_device(bed, ns, "whole")
    assert device["name"] == "gpu-5"
    assert visible_devices(bed, ns, "whole") == mock_state(nodes[H100])["gpus"][5]["uuid"] == attr(device, "uuid")
    assert gpu_instances_of(nodes[H100]) == []  # a whole GPU needs no MIG change


def test_dynamic_mig_instance_exists_in_the_mock_for_the_pods_life(bed: Bed, ns: str, nodes: dict[str, SimNode]) -> None:
    h100 = nodes[H100]
    bed.apply([template("part", "mig.gpu.dra-driver.io",
                        'device.attributes["gpu.dra-driver.io"].parentIndex == 6 && '
                        'device.attributes["gpu.dra-driver.io"].profile == "3g.40gb"'),
               pod("part", H100, "part")], ns=ns)
    wait_running(bed, ns, "part", timeout=120)
    device = allocated_device(bed, ns, "part")
    start = int(device["name"].rsplit("-", 1)[1])
    held = [gi for i, gi in gpu_instances_of(h100) if i == 6]
    assert [(gi["profile"], gi["placement"]["start"]) for gi in held] == [("3g.40gb", start)]
    assert visible_devices(bed, ns, "part") == held[0]["computeInstances"][0]["uuid"]  # the MIG device NVML made

    bed.delete("pod", "part", ns)
    wait_for("the GPU instance destroyed in the mock", lambda: gpu_instances_of(h100) == [], timeout=90)
    assert mock_state(h100)["gpus"][6]["migMode"] == 1  # MIG mode stays, as on a GPU


# --- restarts and failures ----------------------------------------------------------------------------

def restart_plugin(bed: Bed, node: SimNode, sig: int = signal.SIGKILL, fail: str = "") -> None:
    """Kill the node's plugin and start it again, with a fault injected into the mock when asked."""
    fleet = bed.fleet
    fleet.procs.kill(f"plugin-{node.name}", sig)
    fleet.procs.start(f"plugin-{node.name}", node.plugin_args(fleet.kubeconfig),
                      env={"DRA_MOCK_NVML_FAIL": fail} if fail else None)
    wait_serving(bed, node.name, timeout=90)


def test_a_killed_plugin_comes_back_to_the_mig_instance_it_made(bed: Bed, ns: str, nodes: dict[str, SimNode]) -> None:
    h100 = nodes[H100]
    bed.apply([template("kept", "mig.gpu.dra-driver.io",
                        'device.attributes["gpu.dra-driver.io"].parentIndex == 7 && '
                        'device.attributes["gpu.dra-driver.io"].profile == "1g.10gb"'),
               pod("kept", H100, "kept")], ns=ns)
    wait_running(bed, ns, "kept", timeout=120)
    before = [gi for i, gi in gpu_instances_of(h100) if i == 7]
    assert len(before) == 1
    restart_plugin(bed, h100)
    assert [gi for i, gi in gpu_instances_of(h100) if i == 7] == before  # the instance outlived the plugin
    bed.delete("pod", "kept", ns)
    wait_for("the restarted plugin to destroy the GPU instance", lambda: gpu_instances_of(h100) == [], timeout=90)


def test_a_failed_compute_instance_is_rolled_back_and_named_on_the_pod(bed: Bed, ns: str,
                                                                       nodes: dict[str, SimNode]) -> None:
    h100 = nodes[H100]
    restart_plugin(bed, h100, signal.SIGTERM, fail="nvmlGpuInstanceCreateComputeInstance=19")
    try:
        bed.apply([template("rolled", "mig.gpu.dra-driver.io",
                            'device.attributes["gpu.dra-driver.io"].parentIndex == 4 && '
                            'device.attributes["gpu.dra-driver.io"].profile == "2g.20gb"'),
                   pod("rolled", H100, "rolled")], ns=ns)

        def failure() -> str | None:
            for e in bed.get("events", ns=ns)["items"]:
                if e.get("reason") == "FailedPrepareDynamicResources" and "compute instance" in e.get("message", ""):
                    return str(e["message"])
            return None

        message = wait_for("the prepare failure on the pod", failure, timeout=120)
        assert "creating the compute instance: the GPU is in use" in message and "NVML error 19" in message
        assert "internal error" not in message  # an NVML failure is expected, not a bug
        assert gpu_instances_of(h100) == []  # the GPU instance made before the failure was destroyed
    finally:
        restart_plugin(bed, h100, signal.SIGTERM)
    wait_running(bed, ns, "rolled", timeout=150)  # the kubelet's retry succeeds once NVML does
    assert [gi["profile"] for i, gi in gpu_instances_of(h100) if i == 4] == ["2g.20gb"]
    bed.delete("pod", "rolled", ns)
    wait_for("the GPU instance destroyed", lambda: gpu_instances_of(h100) == [], timeout=90)


def test_crash_storm_leaves_exactly_the_running_pods_mig_instances(bed: Bed, ns: str, nodes: dict[str, SimNode]) -> None:
    """SIGKILLs at the failpoints of prepare and unprepare while waves of dynamic-MIG pods come and go:
    afterwards the mock holds one GPU instance per running pod, the one it sees, and none once they go."""
    h100 = nodes[H100]
    bed.apply([template("storm", "mig.gpu.dra-driver.io", 'device.attributes["gpu.dra-driver.io"].profile == "1g.10gb"')],
              ns=ns)
    supervisor = Supervisor(bed, H100, STORM_FAILPOINTS, seed=4242).start()
    previous: list[str] = []
    try:
        for wave in range(STORM_WAVES):
            names = [f"s{wave}-{i}" for i in range(STORM_WAVE_SIZE)]
            bed.apply([pod(name, H100, "storm") for name in names], ns=ns)
            if previous:  # unprepare the last wave while this one prepares
                bed.kubectl("delete", "pods", "-n", ns, "--wait=false", *previous)
            for name in names:
                wait_running(bed, ns, name, timeout=240)
            previous = names
    finally:
        supervisor.stop()
    assert supervisor.kills > 0, "no failpoint fired: the storm proved nothing"
    running = {p["metadata"]["name"] for p in bed.get("pods", ns=ns)["items"]
               if p.get("status", {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")}
    assert running == set(previous)

    def agree() -> bool:
        held = {gi["computeInstances"][0]["uuid"] for _, gi in gpu_instances_of(h100)}
        return held == {visible_devices(bed, ns, name) for name in previous}

    wait_for("the mock's GPU instances to be exactly the running pods'", agree, timeout=120, interval=2)
    bed.kubectl("delete", "pods", "-n", ns, "--all", "--wait=false")
    wait_for("every GPU instance destroyed", lambda: gpu_instances_of(h100) == [], timeout=180, interval=2)
