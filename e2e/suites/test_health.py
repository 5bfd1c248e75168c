"""GPU health on the local bed: an injected XID taints the device, the scheduler avoids it, the
kubelet hears about it; recovery lifts the taint and the waiting claim gets its GPU.

gpu-node-1's plugin is restarted with ``--health-file``; the test writes that file the way an
operator (or a fault injector) would, and puts the plugin back as it was afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from e2e.suites.reliability import record, restart_plugin_clean
from e2e.testbed.clusterview import DRIVER, REPO, Bed, attr, slice_devices, wait_for, wait_running

NODE = "gpu-node-1"
DEVICE = "gpu-3"
TAINT_KEY = "gpu.dra-driver.io/unhealthy"


def taints(bed: Bed) -> list[dict[str, Any]]:
    return list(slice_devices(bed).get((NODE, DEVICE), {}).get("taints") or [])


def peer_health(bed: Bed) -> dict[str, Any]:
    path: Path = bed.fleet.nodes[NODE].peer_state_dir / "health.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    entry: dict[str, Any] = data.get(DRIVER, {}).get(f"{NODE}/{DEVICE}", {})
    return entry


def claim_and_pod(ns: str, uuid: str) -> list[dict[str, Any]]:
    return [
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "sick-gpu", "namespace": ns},
         "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
             "deviceClassName": "gpu.gpu.dra-driver.io",
             "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].uuid == "{uuid}"'}}]}}]}}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "wants-sick-gpu", "namespace": ns},
         "spec": {"terminationGracePeriodSeconds": 1, "resourceClaims": [{"name": "gpu", "resourceClaimName": "sick-gpu"}],
                  "containers": [{"name": "ctr0", "image": "busybox:1.36", "command": ["sleep", "86400"],
                                  "resources": {"claims": [{"name": "gpu"}]}}]}},
    ]


def explain(bed: Bed, ns: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "dra_driver", "explain", f"{ns}/sick-gpu",
                           f"--kubeconfig={bed.kubeconfig}"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.testbed_only
@pytest.mark.smoke
def test_unhealthy_gpu_is_tainted_reported_and_recovers(bed: Bed, ns: str) -> None:
    node = bed.fleet.nodes[NODE]
    health_file = node.root / "health.json"
    health_file.write_text("{}")
    figures: dict[str, Any] = {"node": NODE, "device": DEVICE}
    restart_plugin_clean(bed, NODE, (f"--health-file={health_file}",))
    try:
        wait_for("gpu-3 published without taints", lambda: (NODE, DEVICE) in slice_devices(bed) and not taints(bed), 60)
        uuid = attr(slice_devices(bed)[(NODE, DEVICE)], "uuid")

        start = time.monotonic()
        health_file.write_text(json.dumps({DEVICE: {"health": "Unhealthy", "reason": "XID 79", "xid": 79}}))
        (taint,) = wait_for("the unhealthy taint on gpu-3", lambda: taints(bed), 60, 0.2)
        figures["seconds_to_taint"] = round(time.monotonic() - start, 2)
        assert taint["key"] == TAINT_KEY and taint["value"] == "XID-79" and taint["effect"] == "NoSchedule", taint
        wait_for("the kubelet peer to hear gpu-3 is Unhealthy", lambda: peer_health(bed).get("health") == "Unhealthy", 30, 0.2)
        figures["seconds_to_health_stream"] = round(time.monotonic() - start, 2)
        assert "XID 79" in peer_health(bed)["message"]
        others = [d for (pool, name), d in slice_devices(bed).items() if pool == NODE and name != DEVICE and d.get("taints")]
        assert not others, f"only {DEVICE} may be tainted: {[d['name'] for d in others]}"

        bed.apply(claim_and_pod(ns, uuid), ns=ns)
        text = wait_for("explain to name the taint", lambda: (out := explain(bed, ns)) and TAINT_KEY in out and out, 60, 1)
        assert "XID-79" in text and "NoSchedule" in text, text
        time.sleep(3)  # the scheduler had its chances: the claim must still be waiting
        claim = bed.get("resourceclaim", "sick-gpu", ns)
        assert not claim.get("status", {}).get("allocation"), "a claim got the tainted GPU"
        assert bed.get("pod", "wants-sick-gpu", ns)["status"].get("phase") == "Pending"

        start = time.monotonic()
        health_file.write_text("{}")
        wait_for("the taint to be lifted", lambda: not taints(bed), 60, 0.2)
        figures["seconds_to_untaint"] = round(time.monotonic() - start, 2)
        wait_for("the kubelet peer to hear gpu-3 is Healthy", lambda: peer_health(bed).get("health") == "Healthy", 30, 0.2)
        wait_running(bed, ns, "wants-sick-gpu", timeout=120)
        figures["seconds_to_allocated_after_recovery"] = round(time.monotonic() - start, 2)
        results = bed.get("resourceclaim", "sick-gpu", ns)["status"]["allocation"]["devices"]["results"]
        assert [(r["pool"], r["device"]) for r in results] == [(NODE, DEVICE)]
        figures.update(injections=1, taints_seen=1, recoveries=1, restarts_for_recovery=0, passed=True)
        record("health", "health_file_xid79", figures)
    finally:
        bed.kubectl("delete", "pod", "wants-sick-gpu", "-n", ns, "--wait=true", "--timeout=60s", check=False)
        health_file.write_text("{}")
        restart_plugin_clean(bed, NODE)
