"""One GPU, one driver, on the bed's real API server: a Node that advertises ``nvidia.com/gpu`` (as
NVIDIA's device plugin has the kubelet do) gets its ResourceSlices withdrawn by the running plugin,
with a DevicePluginPresent Event, and back when the resource goes (PublishingResumed); and the
chart's rolling-update kubelet check, run with ``helm template --dry-run=server`` (lookup reads the
real Nodes), looks only at the nodes the plugin DaemonSet selects.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from e2e.testbed.clusterview import DRIVER, REPO, Bed, wait_for
from e2e.tooling import gotools

# helm: run last (e2e/suites/conftest.py), as make test's background worker builds helm during make e2e.
pytestmark = [pytest.mark.testbed_only, pytest.mark.helm]

REPORTER = "gpu.dra-driver.io/kubelet-plugin"
GPU_NODE = "gpu-node-1"
OLD_NODE = "cpu-node-old-kubelet"
CHART = REPO / "deploy" / "helm" / "dra-driver"


def node_events(bed: Bed, node: str, reason: str) -> dict[str, int]:
    """The plugin's Events of ``reason`` on ``node``: name -> series count."""
    items = bed.get("events.events.k8s.io", ns="default")["items"]
    return {e["metadata"]["name"]: e.get("series", {}).get("count", 1) for e in items
            if e.get("reportingController") == REPORTER and e.get("reason") == reason
            and e.get("regarding", {}).get("name") == node}


def notes(bed: Bed, node: str, reason: str) -> list[str]:
    items = bed.get("events.events.k8s.io", ns="default")["items"]
    return [str(e.get("note")) for e in items if e.get("reportingController") == REPORTER
            and e.get("reason") == reason and e.get("regarding", {}).get("name") == node]


def devices(bed: Bed, node: str) -> int:
    slices = bed.get("resourceslices", selector=f"spec.nodeName={node},spec.driver={DRIVER}")["items"]
    return sum(len(s["spec"].get("devices", [])) for s in slices)


def status_patch(bed: Bed, node: str, ops: list[dict[str, Any]], check: bool = True) -> None:
    bed.kubectl("patch", "node", node, "--subresource=status", "--type=json", "-p", json.dumps(ops), check=check)


def advertise(bed: Bed, node: str, quantity: str | None) -> None:
    fields = ("capacity", "allocatable")
    if quantity is None:
        status_patch(bed, node, [{"op": "remove", "path": f"/status/{f}/nvidia.com~1gpu"} for f in fields], check=False)
    else:
        status_patch(bed, node, [{"op": "add", "path": f"/status/{f}/nvidia.com~1gpu", "value": quantity} for f in fields])


def test_a_node_served_by_the_device_plugin_publishes_nothing_while_it_is(bed: Bed) -> None:
    before = wait_for(f"{GPU_NODE}'s devices", lambda: devices(bed, GPU_NODE), 60)
    seen = {reason: node_events(bed, GPU_NODE, reason) for reason in ("DevicePluginPresent", "PublishingResumed")}

    def new(reason: str) -> bool:
        return any(count != seen[reason].get(name) for name, count in node_events(bed, GPU_NODE, reason).items())

    try:
        advertise(bed, GPU_NODE, "8")
        # The plugin reads its Node every 30 s.
        wait_for(f"{GPU_NODE}'s devices withdrawn", lambda: devices(bed, GPU_NODE) == 0, 90, 1)
        wait_for("a DevicePluginPresent Event", lambda: new("DevicePluginPresent"), 30)
        note = notes(bed, GPU_NODE, "DevicePluginPresent")[0]
        assert f"node {GPU_NODE} advertises nvidia.com/gpu" in note and "--ignore-device-plugin" in note, note
    finally:
        advertise(bed, GPU_NODE, None)
    wait_for(f"{GPU_NODE}'s devices back", lambda: devices(bed, GPU_NODE) == before, 90, 1)
    wait_for("a PublishingResumed Event", lambda: new("PublishingResumed"), 30)


def helm_template(bed: Bed, *values: str) -> subprocess.CompletedProcess[str]:
    """``helm template`` with lookup against the bed (``--dry-run=server``); the version is told, as
    helm template assumes 1.20 otherwise."""
    helm = gotools.ensure(["helm"], log=False) / "helm"
    version = json.loads(bed.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
    return subprocess.run([str(helm), "template", "dra-driver", str(CHART), "-n", "dra-driver", "--dry-run=server",
                           "--kube-version", version.lstrip("v"), "--kubeconfig", str(bed.kubeconfig), *values],
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_rolling_update_check_reads_only_the_nodes_the_plugin_goes_to(bed: Bed) -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": OLD_NODE, "labels": {"role": "cpu"}}}
    bed.kubectl("create", "-f", "-", input_text=json.dumps(node))
    try:
        status_patch(bed, OLD_NODE, [{"op": "add", "path": "/status/nodeInfo", "value": {"kubeletVersion": "v1.32.4"}}])
        # A CPU node (no GPU label) with an old kubelet: no plugin goes there, nothing to refuse.
        ok = helm_template(bed)
        assert ok.returncode == 0, ok.stderr
        assert "kind: DaemonSet" in ok.stdout
        bed.kubectl("label", "node", OLD_NODE, "nvidia.com/gpu.present=true")
        refused = helm_template(bed)
        assert refused.returncode != 0 and f"node {OLD_NODE} runs kubelet v1.32.4" in refused.stderr, refused.stderr
        # Selected by the operator's own nodeSelector (on top of the label) only when it matches.
        elsewhere = helm_template(bed, "--set", "kubeletPlugin.nodeSelector.role=gpu")
        assert elsewhere.returncode == 0, elsewhere.stderr
    finally:
        bed.kubectl("delete", "node", OLD_NODE, "--wait=false", check=False)
