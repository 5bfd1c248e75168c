"""The chart's defaults on a mixed cluster, and a node served by NVIDIA's device plugin.

The kind cluster has two workers labelled as GPU nodes (one with GPU Feature Discovery's label, one
with NFD's) and a CPU-only one (kind-config.yaml). A second release installed with the defaults
(the image aside, and its own driver name so that it does not take the suite's) must put no plugin on
the CPU worker, crash-loop nowhere (kind has no NVML: the default nvml backend finds none) and let
``rollout status`` complete; with the GPU-node labels turned off it lands on the CPU worker too and
still stays up. Then the suite's own release: its worker's Node is patched to advertise
``nvidia.com/gpu`` as the device plugin would, and the plugin there withdraws its devices and says
why, until ``kubeletPlugin.ignoreDevicePlugin=true`` publishes them again.
"""

from __future__ import annotations

import json
from typing import Any

from e2e.suites.kind.install import CHART, Install, nodes_labelled
from e2e.testbed.clusterview import wait_for

REPORTER = "gpu.dra-driver.io/kubelet-plugin"
CPU_LABEL = "e2e.dra-driver.io/cpu-only"
DEFAULTS_RELEASE, DEFAULTS_NS, DEFAULTS_DRIVER = "defaults", "dra-defaults", "gpu.defaults.dra-driver.io"

READYZ = r"""
import json, urllib.error, urllib.request
try:
    with urllib.request.urlopen("http://127.0.0.1:8081/readyz", timeout=5) as r:
        out = {"code": r.status, "body": r.read().decode()}
except urllib.error.HTTPError as e:
    out = {"code": e.code, "body": e.read().decode()}
with urllib.request.urlopen("http://127.0.0.1:8081/metrics", timeout=5) as r:
    out["metrics"] = [l for l in r.read().decode().splitlines() if l.startswith("dra_driver_plugin_not_publishing")]
print(json.dumps(out))
"""


def node_events(install: Install, node: str, reason: str) -> list[dict[str, Any]]:
    items = install.bed.get("events.events.k8s.io", ns="default")["items"]
    return [e for e in items if e.get("reportingController") == REPORTER and e.get("reason") == reason
            and e.get("regarding", {}).get("kind") == "Node" and e.get("regarding", {}).get("name") == node]


def pods_of(install: Install, ns: str, release: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = install.bed.get("pods", ns=ns)["items"]
    return [p for p in items if p["metadata"].get("labels", {}).get("app.kubernetes.io/instance") == release
            and p["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "kubelet-plugin"
            and not p["metadata"].get("deletionTimestamp")]


def restarts(pod: dict[str, Any]) -> int:
    return sum(int(c.get("restartCount", 0)) for c in pod["status"].get("containerStatuses", []))


def readyz(install: Install, ns: str, pod: str) -> dict[str, Any]:
    proc = install.bed.kubectl("exec", "-n", ns, pod, "-c", "plugin", "--", "/opt/dra-driver/bin/python", "-c", READYZ)
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def device_count(install: Install, node: str, driver: str) -> int:
    slices = install.bed.get("resourceslices", selector=f"spec.nodeName={node},spec.driver={driver}")["items"]
    return sum(len(s["spec"].get("devices", [])) for s in slices)


def assert_up_publishing_nothing(install: Install, ns: str, pod: dict[str, Any], reason: str) -> None:
    name = pod["metadata"]["name"]
    ready = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
    assert ready.get("Ready") == "True" and restarts(pod) == 0, (name, pod["status"])
    answer = readyz(install, ns, name)
    assert answer["code"] == 200 and "publishing nothing" in answer["body"], answer
    # Prometheus' text format writes the gauge as a float ("1.0").
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in answer["metrics"]}
    assert values.get(f'dra_driver_plugin_not_publishing{{reason="{reason}"}}') == 1, answer


def test_defaults_put_no_plugin_on_a_cpu_node_and_crash_loop_nowhere(install: Install) -> None:
    bed = install.bed
    gpu_workers = sorted(nodes_labelled(bed, "default") + nodes_labelled(bed, "alternative"))
    cpu = sorted(n["metadata"]["name"] for n in bed.get("nodes")["items"]
                 if n["metadata"].get("labels", {}).get(CPU_LABEL) == "true")
    assert len(cpu) == 1 and len(gpu_workers) == 2, (cpu, gpu_workers)
    repo, tag = install.image.rsplit(":", 1)
    release = ["-n", DEFAULTS_NS]
    try:
        install.helm("install", DEFAULTS_RELEASE, str(CHART), *release, "--create-namespace", "--wait", "--timeout",
                     "5m", "--set", f"image.repository={repo}", "--set", f"image.tag={tag}",
                     "--set", "image.pullPolicy=Never", "--set", f"driverName={DEFAULTS_DRIVER}")
        ds = f"daemonset/{DEFAULTS_RELEASE}-dra-driver-kubelet-plugin"
        bed.kubectl(*release, "rollout", "status", ds, "--timeout=300s", timeout=320)
        status = bed.get("daemonset", f"{DEFAULTS_RELEASE}-dra-driver-kubelet-plugin", ns=DEFAULTS_NS)["status"]
        assert status["desiredNumberScheduled"] == 2 and status["numberReady"] == 2, status
        pods = pods_of(install, DEFAULTS_NS, DEFAULTS_RELEASE)
        assert sorted(p["spec"]["nodeName"] for p in pods) == gpu_workers, "no plugin on the CPU-only worker"
        # Ready needs the startup probe's pass, which a plugin that exits (it did within a second)
        # never gets; restarts stay 0 in assert_up_publishing_nothing.
        for pod in pods_of(install, DEFAULTS_NS, DEFAULTS_RELEASE):
            assert_up_publishing_nothing(install, DEFAULTS_NS, pod, "backend_unavailable")
            node = pod["spec"]["nodeName"]
            event = wait_for(f"GpuBackendUnavailable on {node}",
                             lambda: node_events(install, node, "GpuBackendUnavailable"), 60)[0]  # noqa: B023
            assert "NVML is not available" in event["note"] and "publishing nothing" in event["note"], event
            assert device_count(install, node, DEFAULTS_DRIVER) == 0
            text = bed.kubectl("logs", *release, pod["metadata"]["name"], "-c", "plugin").stdout
            assert "publishing no devices" in text and "Traceback" not in text, text[-3000:]

        # Every node, when asked: the CPU worker's plugin stays up as well.
        install.helm("upgrade", DEFAULTS_RELEASE, str(CHART), *release, "--reset-then-reuse-values", "--wait",
                     "--timeout", "5m", "--set-json", "kubeletPlugin.gpuNodeLabels=[]")
        bed.kubectl(*release, "rollout", "status", ds, "--timeout=300s", timeout=320)
        everywhere = pods_of(install, DEFAULTS_NS, DEFAULTS_RELEASE)
        assert sorted(p["spec"]["nodeName"] for p in everywhere) == sorted(gpu_workers + cpu)
        (on_cpu,) = [p for p in everywhere if p["spec"]["nodeName"] == cpu[0]]
        on_cpu = bed.get("pod", on_cpu["metadata"]["name"], ns=DEFAULTS_NS)
        assert_up_publishing_nothing(install, DEFAULTS_NS, on_cpu, "backend_unavailable")
    finally:
        install.helm("uninstall", DEFAULTS_RELEASE, *release, "--wait", "--timeout", "3m")
        bed.kubectl("delete", "namespace", DEFAULTS_NS, "--wait=false", check=False)


def patch_capacity(install: Install, node: str, quantity: str | None) -> None:
    """As NVIDIA's device plugin would have the kubelet do: nvidia.com/gpu in the Node's status."""
    ops = [{"op": "add", "path": f"/status/{f}/nvidia.com~1gpu", "value": quantity} for f in ("capacity", "allocatable")]
    if quantity is None:
        ops = [{"op": "remove", "path": f"/status/{f}/nvidia.com~1gpu"} for f in ("capacity", "allocatable")]
    install.bed.kubectl("patch", "node", node, "--subresource=status", "--type=json", "-p", json.dumps(ops),
                        check=quantity is not None)


def test_a_node_served_by_the_device_plugin_publishes_nothing_until_told(install: Install) -> None:
    (worker,) = nodes_labelled(install.bed, "default")
    driver = "gpu.dra-driver.io"
    before = device_count(install, worker, driver)
    assert before >= 6, "the profile's GPUs and MIG devices"
    seen = {e["metadata"]["name"]: e.get("series", {}).get("count", 1) for e in node_events(install, worker,
                                                                                         "DevicePluginPresent")}
    try:
        patch_capacity(install, worker, "8")
        # The plugin reads its Node every 30 s: the device plugin seen, the devices withdrawn.
        wait_for(f"{worker}'s devices withdrawn", lambda: device_count(install, worker, driver) == 0, 120, 2)
        (event,) = wait_for("a DevicePluginPresent Event", lambda: [
            e for e in node_events(install, worker, "DevicePluginPresent")
            if e.get("series", {}).get("count", 1) != seen.get(e["metadata"]["name"])], 60)
        assert "advertises nvidia.com/gpu" in event["note"] and "ignoreDevicePlugin" in event["note"], event
        (pod,) = [p for p in install.plugin_pods() if p["spec"]["nodeName"] == worker]
        assert_up_publishing_nothing(install, install.namespace, pod, "device_plugin")

        # The override, for a node being moved from the device plugin to DRA: published again.
        install.upgrade("--set", "kubeletPlugin.ignoreDevicePlugin=true")
        wait_for(f"{worker}'s devices back", lambda: device_count(install, worker, driver) == before, 120, 2)
        (pod,) = [p for p in install.plugin_pods() if p["spec"]["nodeName"] == worker]
        assert readyz(install, install.namespace, pod["metadata"]["name"])["body"] == "ok\n"
    finally:
        # Restored whatever happened above, so that the tests after this one find the node publishing.
        patch_capacity(install, worker, None)
        install.upgrade("--set", "kubeletPlugin.ignoreDevicePlugin=false")
        wait_for(f"{worker}'s devices published without the override",
                 lambda: device_count(install, worker, driver) == before, 120, 2)
