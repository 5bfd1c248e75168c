"""A node with one device the API server would refuse publishes its other devices, and says so.

The node's simulated profile gives one GPU a model whose compute capability has a 19-digit number:
described as the version ``8.1234567890123456789.0``, which 1.37 still accepts and 1.38 refuses
(18 digits at most). The plugin must leave that device out, publish the others, and tell it: a
``DeviceWithheld`` Event on the Node, ``dra_driver_plugin_devices_withheld``, and ``/readyz``
(while ``/healthz``, the liveness check, stays 200).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from e2e.testbed.clusterview import DRIVER, Bed, wait_for
from e2e.testbed.nodes import SimNode

pytestmark = pytest.mark.testbed_only

NODE = "withheld-node"
REPORTER = "gpu.dra-driver.io/kubelet-plugin"
BAD_CAPABILITY = "8.1234567890123456789"

PROFILE = {
    "description": "three L4s, one of them reporting a compute capability no 1.38 API server accepts",
    "driverVersion": "580.95.05",
    "cudaDriverVersion": "13.0",
    "models": {
        "l4": {"productName": "NVIDIA L4", "brand": "Nvidia", "architecture": "Ada Lovelace",
               "cudaComputeCapability": "8.9", "memoryMiB": 23034, "multiprocessors": 58},
        "odd": {"productName": "NVIDIA L4", "brand": "Nvidia", "architecture": "Ada Lovelace",
                "cudaComputeCapability": BAD_CAPABILITY, "memoryMiB": 23034, "multiprocessors": 58},
    },
    "gpus": [
        {"index": 0, "model": "l4", "pciBusId": "0000:01:00.0", "numaNode": 0},
        {"index": 1, "model": "odd", "pciBusId": "0000:02:00.0", "numaNode": 0},
        {"index": 2, "model": "l4", "pciBusId": "0000:03:00.0", "numaNode": 0},
    ],
}


@pytest.fixture(scope="module")
def node(bed: Bed) -> Iterator[SimNode]:
    fleet = bed.fleet
    root = fleet.workdir / "nodes" / NODE
    root.mkdir(parents=True, exist_ok=True)
    profile = root / "profile.yaml"
    profile.write_text(yaml.safe_dump(PROFILE))
    made = SimNode(NODE, str(profile), root)
    try:
        fleet.add_node(made)
        yield made
    finally:
        fleet.remove_node(NODE)
        bed.kubectl("delete", "resourceslices", f"--field-selector=spec.nodeName={NODE}", "--wait=false", check=False)
        bed.kubectl("delete", "node", NODE, "--wait=false", check=False)


def published(bed: Bed) -> list[str]:
    items = bed.get("resourceslices", selector=f"spec.nodeName={NODE},spec.driver={DRIVER}")["items"]
    return sorted(d["name"] for s in items for d in s["spec"].get("devices") or [])


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def withheld_events(bed: Bed) -> list[dict[str, Any]]:
    items = bed.get("events.events.k8s.io", ns="default")["items"]
    return [e for e in items if e.get("reportingController") == REPORTER and e.get("reason") == "DeviceWithheld"
            and e.get("regarding", {}).get("kind") == "Node" and e.get("regarding", {}).get("name") == NODE]


def test_the_good_devices_are_published_and_the_bad_one_is_told(bed: Bed, node: SimNode) -> None:
    wait_for("the node's two good devices in its ResourceSlices", lambda: published(bed) == ["gpu-0", "gpu-2"],
             timeout=120)
    (event,) = wait_for("a DeviceWithheld Event on the Node", lambda: withheld_events(bed), timeout=60)
    assert event["type"] == "Warning"
    assert "gpu-1" in event["note"] and "version-18-digits" in event["note"] and BAD_CAPABILITY in event["note"]

    withheld = {s.labels["reason"]: s.value for fam in text_string_to_metric_families(get(node.health_port, "/metrics")[1])
                for s in fam.samples if s.name == "dra_driver_plugin_devices_withheld"}
    assert withheld["version-18-digits"] == 1 and sum(withheld.values()) == 1, withheld

    status, body = get(node.health_port, "/readyz")
    assert status == 503 and "gpu-1 (version-18-digits)" in body, body
    assert get(node.health_port, "/healthz")[0] == 200  # degraded, alive: the kubelet must not restart it
    # Still the same after a resync: the bad device is never written.
    assert published(bed) == ["gpu-0", "gpu-2"]

    # The controller reads the Event back: its device metric counts the device by the model the
    # Event names (the note carries the driver and the model: the device is in no slice).
    assert f"device gpu-1 of driver {DRIVER} (NVIDIA L4) is not published" in event["note"], event["note"]

    def counted() -> dict[str, float] | None:
        found = {s.labels["state"]: s.value
                 for fam in text_string_to_metric_families(get(bed.fleet.controller_port, "/metrics")[1])
                 for s in fam.samples if s.name == "dra_driver_controller_devices" and s.labels["model"] == "NVIDIA L4"}
        return found if found.get("withheld") else None

    by_state = wait_for("the controller's count of the withheld L4", counted, timeout=90)
    print(f"\ncontroller's count of NVIDIA L4: {by_state}")
    assert by_state["withheld"] == 1, by_state
