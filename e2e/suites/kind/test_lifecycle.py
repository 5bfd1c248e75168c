"""The release's life as an operator lives it: upgrade with GPU pods running, a node whose kubelet
runs at a non-default root, uninstall. The tests run in file order; each leaves the release installed
for the next, except the last."""

from __future__ import annotations

import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dra_driver.node.prepare.checkpoint import CheckpointStore
from e2e.bench.common import machine_facts
from e2e.suites.kind.install import (
    ALTERNATIVE_ROOT,
    ROOT_LABEL,
    Install,
    cdi_specs,
    claim_and_pod,
    nodes_labelled,
    on_node,
    plugin_sockets,
    pod_json,
    run,
    wait_gone,
)
from e2e.suites.podstream import (
    PREPARE_FAILED_EVENT,
    RESULTS,
    PodStream,
    StreamPlan,
    failure_lines,
    kubelet_failures,
    pod_problems,
    warning_events,
)
from e2e.suites.reliability import record
from e2e.testbed.clusterview import DRIVER, wait_for, wait_running

CHECKPOINT = f"/var/lib/kubelet/plugins/{DRIVER}/checkpoint.json"


def prepared(node: str, path: str = CHECKPOINT) -> set[str]:
    """The claim UIDs that the node's checkpoint holds, read as the plugin reads it (a journal:
    an unprepared claim's UID stays in the file, in the record that removed it)."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "checkpoint.json").write_text(on_node(node, f"cat {path}"))
        store = CheckpointStore(Path(tmp), node, DRIVER, boot_id="")
        entries = store.load()
        assert store.quarantined is None, f"{path} on {node}: {store.quarantine_reason}"
        return set(entries)


def container_id(install: Install, ns: str, pod: str) -> str:
    obj = install.bed.get("pod", pod, ns)
    (status,) = obj["status"]["containerStatuses"]
    assert status["restartCount"] == 0, f"{ns}/{pod} restarted"
    return str(status["containerID"])


def claim_uid(install: Install, ns: str, name: str) -> str:
    return str(install.bed.get("resourceclaim", name, ns)["metadata"]["uid"])


def test_upgrade_keeps_running_pods_and_the_checkpoint(install: Install, ns: str) -> None:
    bed = install.bed
    bed.apply(claim_and_pod(ns, "before"), ns=ns)
    pod = wait_running(bed, ns, "before", timeout=120)
    node = pod["spec"]["nodeName"]
    before_uid = claim_uid(install, ns, "before")
    before_ctr = container_id(install, ns, "before")
    assert before_uid in prepared(node), "the prepared claim is in the host's checkpoint"
    old_pods = {p["metadata"]["name"] for p in install.plugin_pods()}

    # A new image tag, as a release upgrade brings: the DaemonSet rolls its pods.
    repo = install.image.rsplit(":", 1)[0]
    upgraded = f"{repo}:e2e-upgrade"
    run(["docker", "tag", install.image, upgraded])
    install.load_image(upgraded)
    install.upgrade("--set", "image.tag=e2e-upgrade")

    new_pods = install.plugin_pods()
    assert not old_pods & {p["metadata"]["name"] for p in new_pods}, "the plugin pods were replaced"
    assert all(p["spec"]["containers"][0]["image"].endswith(":e2e-upgrade") for p in new_pods)
    assert container_id(install, ns, "before") == before_ctr, "the GPU pod kept running through the upgrade"
    assert before_uid in prepared(node), "the checkpoint survived the upgrade"
    assert any(before_uid in spec for spec in cdi_specs(node)), "the running pod's CDI spec is kept"

    # The new plugin prepares new claims, and unprepares the one prepared before it started.
    bed.apply(claim_and_pod(ns, "after"), ns=ns)
    wait_running(bed, ns, "after", timeout=120)
    after_uid = claim_uid(install, ns, "after")
    for name in ("before", "after"):
        bed.delete("pod", name, ns)
    for uid in (before_uid, after_uid):
        wait_gone(bed, f"the CDI spec of claim {uid} on {node}", lambda u=uid: [s for s in cdi_specs(node) if u in s], 60)
    assert before_uid not in prepared(node), "the unprepared claim left the checkpoint"


STREAM = StreamPlan(rate=0.5, seconds=40.0, linger=2.0, max_alive=3)
"""The worker's profile (kind-mixed) has four full GPUs: three pods at most, so none waits for one."""
STREAM_TAG = "e2e-stream"


def plugin_pods_on(install: Install, node: str) -> int:
    """The release's plugin pods on ``node``, terminating ones included."""
    pods = install.bed.get("pods", ns=install.namespace, selector=f"spec.nodeName={node}")["items"]
    return sum(p["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "kubelet-plugin" for p in pods)


def test_upgrade_under_a_pod_stream(install: Install, ns: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``helm upgrade`` to a new image tag in the middle of a stream of short GPU pods on one worker:
    with the chart's rolling update (the default) the kubelet sees no failed NodePrepareResources or
    NodeUnprepareResources, and every pod runs and is deleted cleanly."""
    bed = install.bed
    (worker,) = nodes_labelled(bed, "default")
    # The new tag is in the nodes before the stream, as a registry would have it.
    repo = install.image.rsplit(":", 1)[0]
    run(["docker", "tag", install.image, f"{repo}:{STREAM_TAG}"])
    install.load_image(f"{repo}:{STREAM_TAG}")
    bed.apply([{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "stream"},
                "spec": {"spec": {"devices": {"requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": f"gpu.{DRIVER}"}}]}}}}], ns=ns)

    def pod(name: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
            "nodeSelector": {"kubernetes.io/hostname": worker}, "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "stream"}],
            "containers": [{"name": "ctr0", "image": "busybox:1.36",
                            "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"],
                            "resources": {"claims": [{"name": "gpu"}]}}]}}

    since = on_node(worker, "date +%s").strip()
    stream = PodStream(str(bed.kubeconfig), ns, STREAM, pod).start()
    overlap: list[float] = []  # moments with two plugin pods on the worker
    upgrading = threading.Event()

    def watch_overlap() -> None:
        while upgrading.is_set():
            if plugin_pods_on(install, worker) > 1:
                overlap.append(time.monotonic())
            time.sleep(0.5)

    try:
        wait_for("the middle of the stream", lambda: stream.elapsed() >= 0.4 * STREAM.seconds, STREAM.seconds)
        upgrading.set()
        watcher = threading.Thread(target=watch_overlap, daemon=True)
        watcher.start()
        started = time.monotonic()
        install.upgrade("--set", f"image.tag={STREAM_TAG}")
        upgrade_s = time.monotonic() - started
        upgrading.clear()
        watcher.join(timeout=10)
        stream.finish()
    finally:
        upgrading.clear()
        stream.cleanup()
    journal = on_node(worker, f"journalctl -u kubelet --no-pager --since @{since}")
    summary = stream.summary()
    failures = kubelet_failures(journal, ns)
    events = warning_events(bed.get("events", ns=ns)["items"])
    result = {
        **summary, "helm_upgrade_s": round(upgrade_s, 1),
        "two_plugin_pods_s": round(overlap[-1] - overlap[0], 1) if overlap else 0.0,
        "kubelet_failed_prepare": failures["prepare"], "kubelet_failed_unprepare": failures["unprepare"],
        "failed_prepare_events": events.get(PREPARE_FAILED_EVENT, 0), "warning_events": events,
        "failure_lines": failure_lines(journal, ns),
    }
    with capsys.disabled():
        print(f"\n[upgrade] kind {worker}: {summary['pods']} pods at {STREAM.rate}/s, running {summary['running']}, "
              f"not gone {len(summary['not_gone'])}; helm upgrade {result['helm_upgrade_s']} s, two plugin pods for "
              f"~{result['two_plugin_pods_s']} s; kubelet failed NodePrepareResources {failures['prepare']} / "
              f"NodeUnprepareResources {failures['unprepare']}, {PREPARE_FAILED_EVENT} events "
              f"{result['failed_prepare_events']}; start p50 {summary['start_p50_ms']} ms p99 {summary['start_p99_ms']} ms")
    record("kind", "helm_upgrade_stream", {
        "what": "helm upgrade to a new image tag in the middle of a pod stream on one kind worker",
        "command": "make e2e-kind", **result, "machine": machine_facts()}, results=RESULTS)
    assert [p["spec"]["containers"][0]["image"] for p in install.plugin_pods()] == [f"{repo}:{STREAM_TAG}"]
    assert not pod_problems(summary), pod_problems(summary)
    assert (failures["prepare"], failures["unprepare"], result["failed_prepare_events"]) == (0, 0, 0), \
        f"the kubelet saw failed calls: {result['failure_lines']}"


def test_kubelet_at_a_non_default_root(install: Install, ns: str) -> None:
    """k0s, MicroK8s and k3s run the kubelet elsewhere than /var/lib/kubelet: one value moves every path."""
    bed = install.bed
    (node,) = nodes_labelled(bed, "alternative")
    try:
        install.upgrade("--set", f"kubelet.rootDir={ALTERNATIVE_ROOT}",
                        "--set-json", f'kubeletPlugin.nodeSelector={{"{ROOT_LABEL}":"alternative"}}')
        (pod,) = install.plugin_pods()
        assert pod["spec"]["nodeName"] == node
        moved, default = plugin_sockets(pod, ALTERNATIVE_ROOT), plugin_sockets(pod)
        on_node(node, f"test -S {moved.registration} && test -S {moved.dra} && test ! -e {default.registration}")
        wait_for(f"ResourceSlices of {node}", lambda: install.node_slices(node), timeout=90)
        bed.apply(claim_and_pod(ns, "alt", node=node), ns=ns)
        wait_running(bed, ns, "alt", timeout=120)
        uid = claim_uid(install, ns, "alt")
        assert uid in prepared(node, f"{ALTERNATIVE_ROOT}/plugins/{DRIVER}/checkpoint.json")
        bed.delete("pod", "alt", ns)
        wait_gone(bed, f"the CDI spec of claim {uid}", lambda: [s for s in cdi_specs(node) if uid in s], 60)
    finally:
        install.upgrade("--set", "kubelet.rootDir=/var/lib/kubelet",
                        "--set-json", f'kubeletPlugin.nodeSelector={{"{ROOT_LABEL}":"default"}}')
    # The plugin left the node; its kubelet deletes the driver's slices there after a grace period.
    # Until then the scheduler could still allocate them, to a claim no plugin would prepare.
    wait_gone(bed, f"the ResourceSlices of {node}, deleted by its kubelet", lambda: install.node_slices(node), 180)


def test_uninstall_leaves_no_slices_and_no_specs(install: Install, ns: str) -> None:
    """Also what happens to a GPU pod running across an uninstall (README, "Uninstalling"): it keeps
    running; deleted while no plugin serves its node, it stays Terminating, because the kubelet
    cannot unprepare its claim; a reinstall lets the kubelet finish, from the checkpoint the
    uninstall left on the host."""
    bed = install.bed
    (worker,) = nodes_labelled(bed, "default")
    bed.apply(claim_and_pod(ns, "across", node=worker), ns=ns)
    pod = wait_running(bed, ns, "across", timeout=120)
    node = pod["spec"]["nodeName"]
    uid = claim_uid(install, ns, "across")
    ctr = container_id(install, ns, "across")

    install.helm("uninstall", install.release, "-n", install.namespace, "--wait", "--timeout", "3m")
    wait_gone(bed, "the plugin pods", install.plugin_pods, 120)
    classes = [c["metadata"]["name"] for c in bed.get("deviceclasses")["items"] if c["metadata"]["name"].endswith(DRIVER)]
    assert not classes, f"DeviceClasses left behind: {classes}"
    assert container_id(install, ns, "across") == ctr, "the running GPU pod kept running"

    bed.kubectl("delete", "pod", "across", "-n", ns, "--wait=false")
    time.sleep(20)
    stuck = pod_json(bed, ns, "across")
    assert stuck is not None and stuck["metadata"].get("deletionTimestamp"), \
        "expected the pod to stay Terminating while no plugin can unprepare its claim"

    install.install()
    wait_gone(bed, "the Terminating pod, once the reinstalled plugin unprepares its claim",
              lambda: pod_json(bed, ns, "across"), 180)
    wait_gone(bed, f"the CDI spec of claim {uid}", lambda: [s for s in cdi_specs(node) if uid in s], 60)

    # With no GPU pods left, an uninstall leaves nothing of the driver in the cluster or on the nodes.
    install.helm("uninstall", install.release, "-n", install.namespace, "--wait", "--timeout", "3m")
    wait_gone(bed, "the plugin pods", install.plugin_pods, 120)
    wait_gone(bed, "every ResourceSlice of the driver (the kubelet deletes an unregistered driver's slices)",
              lambda: [s["metadata"]["name"] for s in bed.get("resourceslices")["items"] if s["spec"]["driver"] == DRIVER],
              180)
    for worker in nodes_labelled(bed, "default") + nodes_labelled(bed, "alternative"):
        assert not cdi_specs(worker), f"CDI specs left on {worker}: {cdi_specs(worker)}"
        sockets = on_node(worker, f"ls /var/lib/kubelet/plugins_registry {ALTERNATIVE_ROOT}/plugins_registry 2>/dev/null || true")
        assert DRIVER not in sockets, f"registration socket left on {worker}: {sockets}"
    leftovers = json.loads(bed.kubectl("get", "clusterroles,clusterrolebindings,validatingadmissionpolicies",
                                       "-o", "json").stdout)["items"]
    # Every release of the chart has "dra-driver" in its names: the nvidia-profile release's stay.
    named = [o["metadata"]["name"] for o in leftovers if install.release in o["metadata"]["name"]
             and o["metadata"].get("labels", {}).get("app.kubernetes.io/instance", install.release) == install.release]
    assert not named, f"cluster-scoped objects left behind: {named}"
