"""The fleet views over slices in NVIDIA's names (``--api-profile nvidia``, driver gpu.nvidia.com):
the plugin's own description of a simulated MIG node, with NVIDIA's health taints."""

from __future__ import annotations

import json
from typing import Any

from fleetfix import run
from kubefake import FakeKube

from dra_driver.apiprofile import NVIDIA_PROFILE
from dra_driver.k8s.client import SLICES
from dra_driver.node.discovery.profiles import load_profile
from e2e.generators.fleet import published_slices

DRIVER = "gpu.nvidia.com"


def nvidia_fleet() -> FakeKube:
    kube = FakeKube()
    for body in published_slices(load_profile("a100-mig"), "node-a", driver=DRIVER, api_profile=NVIDIA_PROFILE):
        for device in body["spec"].get("devices", []):
            if device["name"] == "gpu-3":
                device["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]
            if device["name"] == "gpu-1-mig-7g40gb-0-0":
                device["taints"] = [{"key": "gpu.nvidia.com/unmonitored", "effect": "None"}]
        kube.add(SLICES, body)
    return kube


def rows(*argv: str) -> dict[str, dict[str, Any]]:
    rc, out, err = run(nvidia_fleet(), "get", "gpus", "-A", "-o", "json", *argv)
    assert rc == 0, err
    return {d["device"]: d for d in json.loads(out)["devices"]}


def test_get_gpus_reads_nvidias_names_with_the_profile_or_the_driver_name() -> None:
    for argv in (("--api-profile", "nvidia"), ("--driver-name", DRIVER)):
        found = rows(*argv)
        assert set(found) >= {"gpu-0-mig-1g5gb-19-0", "gpu-2-mig-1g10gb-15-6", "gpu-3"}
        mig = found["gpu-0-mig-2g10gb-14-2"]
        assert (mig["type"], mig["model"], mig["migProfile"]) == ("mig", "NVIDIA A100-SXM4-40GB", "2g.10gb")
        assert mig["state"] == "free" and mig["health"] == "healthy"
        tainted = found["gpu-3"]
        assert (tainted["state"], tainted["health"]) == ("tainted", "unhealthy")
        assert tainted["taints"] == ["gpu.nvidia.com/xid=79:NoSchedule"]
        # unmonitored only tells (effect None): healthy, not tainted, listed.
        told = found["gpu-1-mig-7g40gb-0-0"]
        assert (told["state"], told["health"], told["taints"]) == ("free", "healthy", ["gpu.nvidia.com/unmonitored:None"])


def test_the_text_says_the_health_once() -> None:
    rc, out, _ = run(nvidia_fleet(), "get", "gpus", "-A", "--api-profile", "nvidia")
    row = next(line for line in out.splitlines() if " gpu-3 " in line)
    assert rc == 0 and "unhealthy" in row and "gpu.nvidia.com/xid" not in row
