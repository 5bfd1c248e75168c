"""Operating the driver on the local bed as an operator would: the plugin's /metrics after a real
workload, Events on the Node and the claim (kubectl describe shows them), repeats folded into one
series across a crash loop, the dashboard's queries against live endpoints, and a debug bundle.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dra_driver.node.discovery.nvml import nvml_available
from e2e.suites.dashboard import exported_families, family, queried_metrics
from e2e.suites.reliability import log_path, plugin_name, restart_plugin_clean, start_plugin, wait_serving
from e2e.testbed.clusterview import DRIVER, REPO, Bed, wait_for, wait_running

pytestmark = pytest.mark.testbed_only

REPORTER = "gpu.dra-driver.io/kubelet-plugin"
GPU_NODE, MIG_NODE = "gpu-node-1", "gpu-node-2"
SECRET_VALUE = "s3cr3t-do-not-ship"
# Seeded where the bundle's redaction must reach (a command line, annotations of a pod and a claim).
SECRET_COMMAND, SECRET_NOTE, SECRET_CLAIM_NOTE = "s3cr3t-cmd-7781", "s3cr3t-note-5531", "s3cr3t-claim-note-2290"


# --- helpers ------------------------------------------------------------------------------------------


def page(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text: str = resp.read().decode()
        return text


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((f"dra_driver_plugin_{name}", tuple(sorted(labels.items()))), 0.0)


def node_events(bed: Bed, node: str, reason: str) -> list[dict[str, Any]]:
    items = bed.get("events.events.k8s.io", ns="default")["items"]
    return [e for e in items if e.get("reportingController") == REPORTER and e.get("reason") == reason
            and e.get("regarding", {}).get("kind") == "Node" and e.get("regarding", {}).get("name") == node]


def claim_events(bed: Bed, ns: str, claim: str, reason: str) -> list[dict[str, Any]]:
    items = bed.get("events.events.k8s.io", ns=ns)["items"]
    return [e for e in items if e.get("reportingController") == REPORTER and e.get("reason") == reason
            and e.get("regarding", {}).get("kind") == "ResourceClaim" and e.get("regarding", {}).get("name") == claim]


def gpu_pod(name: str, node: str, env: list[dict[str, Any]] | None = None,
            config: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpu.dra-driver.io"}}]}
    if config is not None:
        devices["config"] = [{"requests": ["gpu"], "opaque": {"driver": DRIVER, "parameters": config}}]
    return [
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": f"{name}-gpu"},
         "spec": {"devices": devices}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
         "spec": {"nodeSelector": {"kubernetes.io/hostname": node}, "terminationGracePeriodSeconds": 1,
                  "resourceClaims": [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}],
                  "containers": [{"name": "ctr0", "image": "busybox:1.36", "command": ["sleep", "86400"],
                                  "env": env or [], "resources": {"claims": [{"name": "gpu"}]}}]}},
    ]


# --- metrics and health Events ------------------------------------------------------------------------


@pytest.mark.timeout(600)
def test_metrics_after_a_workload_and_xid_events_on_the_node(bed: Bed, ns: str) -> None:
    node = bed.fleet.nodes[GPU_NODE]
    health_file = node.root / "health-operability.json"
    health_file.write_text("{}")
    restart_plugin_clean(bed, GPU_NODE, (f"--health-file={health_file}",))
    try:
        bed.apply(gpu_pod("worker", GPU_NODE), ns=ns)
        wait_running(bed, ns, "worker", timeout=120)
        used = bed.get("resourceclaim", "worker-gpu", ns)["status"]["allocation"]["devices"]["results"][0]["device"]
        sick = "gpu-7" if used != "gpu-7" else "gpu-6"

        health_file.write_text(json.dumps({sick: {"health": "Unhealthy", "reason": "XID 79", "xid": 79}}))
        # Earlier tests' Events about other devices of this node are still there (test_health's gpu-3).
        (unhealthy,) = wait_for(f"a DeviceUnhealthy Event on the Node for {sick}",
                                lambda: [e for e in node_events(bed, GPU_NODE, "DeviceUnhealthy")
                                         if sick in e.get("note", "")], 60)
        assert unhealthy["type"] == "Warning" and unhealthy["reportingInstance"] == GPU_NODE
        assert sick in unhealthy["note"] and "XID 79" in unhealthy["note"] and "NoSchedule" in unhealthy["note"]
        with_xid = page(node.health_port)
        assert value(with_xid, "xid_events_total", xid="79") == 1
        assert value(with_xid, "devices", type="gpu", health="Unhealthy") == 1

        health_file.write_text("{}")
        (recovered,) = wait_for(f"a DeviceRecovered Event for {sick}",
                                lambda: [e for e in node_events(bed, GPU_NODE, "DeviceRecovered")
                                         if sick in e.get("note", "")], 60)
        assert recovered["type"] == "Normal" and sick in recovered["note"] and "XID 79" in recovered["note"]
        described = bed.kubectl("describe", "node", GPU_NODE).stdout
        assert "DeviceUnhealthy" in described and "DeviceRecovered" in described and "XID 79" in described, described[-3000:]

        text = page(node.health_port)
        assert value(text, "prepare_duration_seconds_count", result="success") >= 1
        assert value(text, "prepare_duration_seconds_bucket", result="success", le="+Inf") >= 1
        assert value(text, "prepared_claims") == 1
        assert value(text, "devices", type="gpu", health="Healthy") == 8
        assert value(text, "devices", type="gpu", health="Unhealthy") == 0
        assert value(text, "cdi_spec_writes_total", result="success") >= 1
        assert value(text, "checkpoint_write_duration_seconds_count") >= 2
        assert value(text, "resourceslice_writes_total", operation="update") >= 2, "taint and untaint re-publish"
        assert value(text, "xid_events_total", xid="79") == 1
        build = [dict(lbl) for (n, lbl), v in samples(text).items() if n == "dra_driver_plugin_build_info" and v == 1]
        assert [(b["backend"], b["version"]) for b in build] == [("simulated", "0.1.0")], build
        families = exported_families(text)
        for name in ("nvml_errors_total", "resourceslice_publish_errors_total", "unprepare_duration_seconds",
                     "events_dropped_total"):
            assert f"dra_driver_plugin_{name}" in families, name
        claim_uid = bed.get("resourceclaim", "worker-gpu", ns)["metadata"]["uid"]
        assert claim_uid not in text and "worker" not in text, "no claim or pod in a label"

        bed.kubectl("delete", "pod", "worker", "-n", ns, "--wait=true", "--timeout=60s")
        bed.kubectl("delete", "resourceclaim", "worker-gpu", "-n", ns, "--wait=true", "--timeout=60s")
        wait_for("the unprepare in the metrics",
                 lambda: value(page(node.health_port), "unprepare_duration_seconds_count", result="success") >= 1, 60)
        assert value(page(node.health_port), "prepared_claims") == 0
    finally:
        bed.kubectl("delete", "pod", "worker", "-n", ns, "--wait=true", "--timeout=60s", check=False)
        health_file.write_text("{}")
        restart_plugin_clean(bed, GPU_NODE)


def test_every_dashboard_query_is_exported_by_the_running_plugin_and_controller(bed: Bed) -> None:
    port = bed.fleet.nodes[GPU_NODE].health_port
    live = exported_families(page(port)) | exported_families(page(bed.fleet.controller_port))
    missing = sorted(q for q in queried_metrics() if family(q, live) is None)
    assert not missing, f"the dashboard queries metrics the bed's plugin and controller do not export: {missing}"
    # The fleet panels' gauges are counted at the controller's resync: a series of each, not only
    # its TYPE line, and free devices of some model (the bed's GPUs are mostly free).
    fleet = sorted(q for q in queried_metrics() if q.startswith("dra_driver_controller_device"))
    assert fleet == ["dra_driver_controller_device_shares", "dra_driver_controller_devices"], fleet

    def counted() -> dict[str, list[tuple[dict[str, str], float]]]:
        found: dict[str, list[tuple[dict[str, str], float]]] = {}
        for (name, labels), v in samples(page(bed.fleet.controller_port)).items():
            found.setdefault(name, []).append((dict(labels), v))
        return found if all(found.get(f) for f in fleet) else {}

    series = wait_for("the controller's device count", counted, 30)
    free = {lbl["model"]: v for lbl, v in series["dra_driver_controller_devices"] if lbl["state"] == "free"}
    assert any("H100" in model and n > 0 for model, n in free.items()), free
    models = {lbl["model"] for lbl, _ in series["dra_driver_controller_devices"]}
    assert {lbl["model"] for lbl, _ in series["dra_driver_controller_device_shares"]} == models


# --- checkpoint, crash loop, failed prepare -----------------------------------------------------------


def test_quarantined_checkpoint_is_an_event_on_the_node(bed: Bed) -> None:
    state_dir = Path(bed.fleet.nodes[MIG_NODE].state_dir)
    bed.fleet.procs.stop(plugin_name(MIG_NODE))
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    before = set(state_dir.glob("checkpoint.json.corrupt-*"))
    (state_dir / "checkpoint.json").write_bytes(b'{"kind": "DraDriverCheckpoint", "version": 1, "chec')
    seen = {e["metadata"]["name"] for e in node_events(bed, MIG_NODE, "CheckpointQuarantined")}
    try:
        start_plugin(bed, MIG_NODE)
        wait_serving(bed, MIG_NODE)
        (copy,) = set(state_dir.glob("checkpoint.json.corrupt-*")) - before

        def new_event() -> list[dict[str, Any]]:
            return [e for e in node_events(bed, MIG_NODE, "CheckpointQuarantined") if e["metadata"]["name"] not in seen]

        (event,) = wait_for("a CheckpointQuarantined Event on the Node", new_event, 60)
        assert event["type"] == "Warning" and event["action"] == "Recover"
        assert "not valid JSON" in event["note"] and str(copy) in event["note"], event["note"]
        described = bed.kubectl("describe", "node", MIG_NODE).stdout
        assert "CheckpointQuarantined" in described and copy.name in described, described[-3000:]
    finally:
        restart_plugin_clean(bed, MIG_NODE)


@pytest.mark.skipif(nvml_available()[0], reason="this machine has NVML: the nvml backend would start")
def test_without_nvml_the_plugin_stays_up_and_restarts_are_one_event_series(bed: Bed) -> None:
    """The plugin asked for NVML where there is none stays up and publishes nothing (it used to exit
    1: a crash loop on every CPU node); each restart adds to one Event instead of writing a new one.
    A Node of its own (a plugin publishing nothing removes its node's slices), and its own
    directories and port, so that the bed's running plugins are left alone."""
    import signal
    import socket
    import tempfile

    fleet = bed.fleet
    node = fleet.nodes[MIG_NODE]
    cpu = "cpu-node-without-nvml"
    bed.kubectl("create", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "Node",
                                                             "metadata": {"name": cpu}}), check=False)
    before = {e["metadata"]["name"]: e.get("series", {}).get("count", 1)
              for e in node_events(bed, cpu, "GpuBackendUnavailable")}
    with tempfile.TemporaryDirectory(prefix="dra-nonvml-", dir="/tmp") as tmp, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        dirs = (f"--node-name={cpu}", f"--kubelet-registry-dir={tmp}/reg", f"--kubelet-plugins-dir={tmp}/plugins",
                f"--state-dir={tmp}/state", f"--cdi-root={tmp}/cdi", f"--health-port={port}", "--no-rolling-update")
        args = node.plugin_args(fleet.kubeconfig, ("--gpu-backend=nvml", *dirs))
        for run in range(3):
            proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            try:
                def counted(run: int = run) -> bool:
                    events = node_events(bed, cpu, "GpuBackendUnavailable")
                    return bool(events) and events[0].get("series", {}).get("count", 1) == \
                        before.get(events[0]["metadata"]["name"], 0) + run + 1

                wait_for(f"start {run + 1} counted in the Event", lambda p=proc: counted() or p.poll() is not None, 60)
                assert proc.poll() is None, "the plugin exited"
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=10) as resp:
                    assert resp.status == 200 and "NVML is not available" in resp.read().decode()
                assert value(page(port), "not_publishing", reason="backend_unavailable") == 1
            finally:
                proc.send_signal(signal.SIGTERM)
                out, _ = proc.communicate(timeout=30)
            assert proc.returncode == 0 and "Traceback" not in out, out[-2000:]
            assert "publishing no devices" in out, out[-2000:]
    (event,) = node_events(bed, cpu, "GpuBackendUnavailable")
    assert "NVML" in event["note"] and "publishing nothing" in event["note"], event["note"]
    assert "GpuBackendUnavailable" in bed.kubectl("describe", "node", cpu).stdout
    bed.kubectl("delete", "node", cpu, "--wait=false", check=False)


def test_failed_prepare_is_an_event_on_the_claim(bed: Bed, ns: str) -> None:
    bad = {"apiVersion": "gpu.dra-driver.io/v1alpha1", "kind": "GpuConfig", "sharing": {"strategy": "Sometimes"}}
    bed.apply(gpu_pod("misconfigured", GPU_NODE, config=bad), ns=ns)
    offset = log_path(bed, plugin_name(GPU_NODE)).stat().st_size
    (event,) = wait_for("a PrepareFailed Event on the claim",
                        lambda: claim_events(bed, ns, "misconfigured-gpu", "PrepareFailed"), 90)
    assert event["type"] == "Warning" and event["reportingInstance"] == GPU_NODE
    assert "invalid gpu.dra-driver.io config" in event["note"] and "Sometimes" in event["note"], event["note"]
    assert event["regarding"]["uid"] == bed.get("resourceclaim", "misconfigured-gpu", ns)["metadata"]["uid"]
    # The kubelet retries; the retries fold into the same Event.
    def retries_counted() -> bool:
        events = claim_events(bed, ns, "misconfigured-gpu", "PrepareFailed")
        return bool(events) and events[0].get("series", {}).get("count", 1) > 1

    wait_for("the retries counted in the series", retries_counted, 120, 2)
    assert len(claim_events(bed, ns, "misconfigured-gpu", "PrepareFailed")) == 1
    with open(log_path(bed, plugin_name(GPU_NODE)), "rb") as f:
        f.seek(offset)
        said = [json.loads(x) for x in f.read().decode(errors="replace").splitlines() if x.startswith("{")]
    errors = {x.get("error") for x in said if x.get("event") == "cannot prepare claim"}
    assert event["note"] in errors, "the Event says what the kubelet was told"
    assert "PrepareFailed" in bed.kubectl("describe", "resourceclaim", "misconfigured-gpu", "-n", ns).stdout


# --- debug bundle -------------------------------------------------------------------------------------


def test_debug_bundle_is_complete_and_redacted(bed: Bed, ns: str, tmp_path: Path) -> None:
    env = [{"name": "API_KEY", "value": SECRET_VALUE}]
    docs = gpu_pod("bundled", GPU_NODE, env=env)
    # sh -c takes the word after the script as $0: there only to be seen in the pod's spec.
    docs[1]["spec"]["containers"][0]["command"] = ["sh", "-c", "sleep 86400", SECRET_COMMAND]
    bed.apply(docs, ns=ns)
    bed.kubectl("annotate", "pod", "bundled", "-n", ns, "note=Authorization: Bearer abcdefghijklmnopqrstuvwxyz0123",
                f"deploy.example.com/access-token={SECRET_NOTE}")
    bed.kubectl("annotate", "resourceclaim", "bundled-gpu", "-n", ns, f"team.example.com/notes={SECRET_CLAIM_NOTE}")
    wait_running(bed, ns, "bundled", timeout=120)
    node = bed.fleet.nodes[GPU_NODE]
    out = tmp_path / "bundle.tar.gz"
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "dra_driver", "debug-bundle", f"--kubeconfig={bed.kubeconfig}", f"--node={GPU_NODE}",
         f"--state-dir={node.state_dir}", f"--cdi-root={node.cdi_dir}",
         f"--metrics-url=http://127.0.0.1:{node.health_port}/metrics", "-o", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=180)
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    assert "not collected" not in proc.stderr, proc.stderr
    assert out.stat().st_mode & 0o077 == 0, "the bundle is for its owner only"
    with tarfile.open(out) as tar:
        files = {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    for name in ("manifest.json", "cluster/resourceslices.json", "cluster/deviceclasses.json", "cluster/resourceclaims.json",
                 "cluster/explanations.json", "cluster/pods.json", "cluster/events.json", "cluster/nodes.json",
                 "cluster/controller-leader-lease.json", f"node/{GPU_NODE}/state/checkpoint.json",
                 f"node/{GPU_NODE}/metrics.txt"):
        assert name in files, f"{name} missing from {sorted(files)}"
    manifest = json.loads(files["manifest.json"])
    assert manifest["notCollected"] == [] and manifest["versions"]["kubernetes"]["gitVersion"].startswith("v1.3")
    doc = {k: json.loads(v) for k, v in files.items() if k.startswith("cluster/")}
    claim = bed.get("resourceclaim", "bundled-gpu", ns)
    uid = claim["metadata"]["uid"]
    assert f"{ns}/bundled-gpu" in doc["cluster/explanations.json"]
    assert doc["cluster/explanations.json"][f"{ns}/bundled-gpu"]["state"] == "allocated"
    assert any(p["metadata"]["name"] == "bundled" for p in doc["cluster/pods.json"])
    assert {s["spec"]["nodeName"] for s in doc["cluster/resourceslices.json"]} >= {GPU_NODE, MIG_NODE}
    assert doc["cluster/controller-leader-lease.json"][0]["spec"]["holderIdentity"]
    assert uid in files[f"node/{GPU_NODE}/state/checkpoint.json"].decode()
    assert any(k.startswith(f"node/{GPU_NODE}/cdi/") and uid in k for k in files), "the claim's CDI spec"
    assert b"dra_driver_plugin_prepared_claims" in files[f"node/{GPU_NODE}/metrics.txt"]
    kubeconfig = bed.kubeconfig.read_text()
    token = kubeconfig.split("token:")[-1].split()[0].strip("\"'") if "token:" in kubeconfig else None
    for name, data in files.items():
        text = data.decode(errors="replace")
        assert SECRET_VALUE not in text, f"{name} leaks an environment value"
        assert "abcdefghijklmnopqrstuvwxyz0123" not in text, f"{name} leaks a bearer token"
        for seeded in (SECRET_COMMAND, SECRET_NOTE, SECRET_CLAIM_NOTE):
            assert seeded not in text, f"{name} leaks {seeded}"
        if token:
            assert token not in text, f"{name} leaks the kubeconfig's token"
    pod = next(p for p in doc["cluster/pods.json"] if p["metadata"]["name"] == "bundled")
    assert pod["spec"]["containers"][0]["env"] == [{"name": "API_KEY", "value": "<redacted>"}]
    assert pod["spec"]["containers"][0]["command"] == ["<redacted>"] * 4
    assert took < 60, f"a bundle of a small cluster took {took:.1f}s"


# --- the demo's table ---------------------------------------------------------------------------------


def test_demo_table_of_real_pods_fits_120_columns(bed: Bed, ns: str) -> None:
    from e2e.demo import run as demo
    from e2e.testbed.clusterview import example

    rows = []
    for scenario in ("same-numa-pair", "mig-1g", "unsatisfiable"):
        docs = example(scenario)
        bed.apply(docs, ns=ns)
    for scenario in ("same-numa-pair", "mig-1g"):
        for pod in [d["metadata"]["name"] for d in example(scenario) if d["kind"] == "Pod"]:
            wait_running(bed, ns, pod, timeout=120)

    def explained() -> bool:
        claims = bed.get("resourceclaims", ns=ns)["items"]
        return any(f"{DRIVER}/explanation-summary" in c["metadata"].get("annotations", {}) for c in claims)

    wait_for("the unsatisfiable claim explained", explained, 60)
    for scenario in ("same-numa-pair", "mig-1g", "unsatisfiable"):
        rows += demo.pod_rows(bed, ns, example(scenario), scenario)
    lines = demo.render_table(demo.HEADER, rows, minimum=demo.MIN_WIDTHS)
    text = "\n".join(lines)
    assert max(len(line) for line in lines) <= 120, text
    assert text.count("Running") == 2 and "Pending" in text and "    why: " in text, text
    uuids = [c.cells[4] for c in rows if c.cells[4].startswith(("GPU-", "MIG-"))]
    assert len(uuids) == 3, f"two GPUs of same-numa-pair and one MIG device, each seen in its container: {text}"
