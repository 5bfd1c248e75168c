"""Coming from NVIDIA's device plugin, on the chart as a user installed it (issue 55): ``dra-driver
migrate`` reads the device plugin's ``mixed`` config, keeps the chart's class for ``nvidia.com/gpu``,
creates a class per MIG profile the installed plugins publish, and a pod written for the device
plugin runs unchanged, on the device and node the report named.

The bed runs the same path against simulated nodes of a driver of its own
(``e2e/suites/test_migrate.py``); here the devices are the release's, on kind's default-root worker.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.suites.kind.install import Install, nodes_labelled
from e2e.testbed.clusterview import attr, observed, wait_running

DRIVER = "gpu.dra-driver.io"
MANAGED = "app.kubernetes.io/managed-by=dra-driver-migrate"
CHART_CLASS = f"nvidia-gpu.{DRIVER}"
PROFILES = ("1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb")  # the MIG devices of the kind-mixed profile


@pytest.fixture()
def migrated(install: Install, ns: str) -> Iterator[str]:
    """``ns``; at the end its pods go before it does (their claims unprepared while the classes that
    served them are there), then the classes migrate made."""
    yield ns
    bed = install.bed
    bed.kubectl("delete", "pods", "--all", "-n", ns, "--grace-period=0", "--wait=true", "--timeout=60s",
                check=False, timeout=90)
    bed.kubectl("delete", "deviceclass", "-l", MANAGED, "--ignore-not-found", check=False)


def device_plugin_pod(name: str, resource: str) -> dict[str, Any]:
    """A pod as the device plugin's users write one: the name in its limits, nothing else."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "terminationGracePeriodSeconds": 0, "restartPolicy": "Never",
        "containers": [{"name": "cuda", "image": "busybox:1.36",
                        "command": ["sh", "-c", "env | grep -E 'NVIDIA|DRA_' | sort; sleep 86400"],
                        "resources": {"limits": {resource: 1}}}]}}


def test_a_mixed_config_serves_the_device_plugins_names(install: Install, migrated: str, tmp_path: Path) -> None:
    bed, ns = install.bed, migrated
    (worker,) = nodes_labelled(bed, "default")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"version": "v1", "flags": {"migStrategy": "mixed"}}))
    bed.apply([device_plugin_pod("mig-pod", "nvidia.com/mig-1g.5gb")], ns=ns)  # waits: nothing serves the name yet
    proc = subprocess.run([sys.executable, "-m", "dra_driver", "migrate", "-f", str(config), "--apply",
                           "--kubeconfig", str(bed.kubeconfig)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    report = proc.stdout
    print(f"\nmigrate -f mixed --apply:\n{report}")
    # The chart's class is what migrate would write for a full GPU: it serves the name, none is made.
    assert re.search(rf"^  nvidia.com/gpu -> {re.escape(CHART_CLASS)} \(up to date\)$", report, re.MULTILINE), report
    assert f"deviceclass.resource.k8s.io/{CHART_CLASS} created" not in report, report
    listed = json.loads(bed.kubectl("get", "deviceclasses", "-l", MANAGED, "-o", "json").stdout)["items"]
    made = {c["metadata"]["name"] for c in listed}
    assert made == {f"nvidia-mig-{p}.{DRIVER}" for p in PROFILES}, made
    line = re.search(rf"^  Pod {ns}/mig-pod nvidia.com/mig-1g.5gb: 1 -> served by (\S+) as .*; fits now: (.*)$",
                     report, re.MULTILINE)
    assert line, report
    assert line.group(1) == f"nvidia-mig-1g.5gb.{DRIVER}" and re.fullmatch(rf"yes, on {worker} \(\d+\)", line.group(2)), \
        line.group(0)

    obj = wait_running(bed, ns, "mig-pod", timeout=120)
    assert obj["spec"]["nodeName"] == worker
    claim = bed.get("resourceclaim", obj["status"]["extendedResourceClaimStatus"]["resourceClaimName"], ns)
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    items = bed.get("resourceslices", selector=f"spec.nodeName={worker},spec.driver={DRIVER}")["items"]
    (device,) = [d for s in items for d in s["spec"].get("devices") or [] if d["name"] == result["device"]]
    assert (result["driver"], attr(device, "profile")) == (DRIVER, "1g.5gb"), (result, device)
    told = {v for k, v in observed(bed, ns, "mig-pod")["cuda"]["env"].items() if re.fullmatch(r"DRA_GPU_\d+_UUID", k)}
    assert told == {attr(device, "uuid")}, told
