"""Health taints under ``--api-profile nvidia``: NVIDIA's keys, one per kind of event."""

from __future__ import annotations

from typing import Any

import pytest
from nodefix import build_devices

from dra_driver.apiprofile import NVIDIA_PROFILE
from dra_driver.node.describe.devices import describe
from dra_driver.node.publish.checker import check_device
from dra_driver.node.publish.health import HealthFileError, HealthMonitor, HealthReport, health_taint, parse_health_file
from dra_driver.node.publish.healthboard import HealthBoard

DRIVER = "gpu.nvidia.com"
DEVICES = build_devices()
GPU0, GPU1, GPU2 = (DEVICES[f"gpu-{i}"].gpu.uuid for i in range(3))


def test_each_kind_of_event_has_nvidias_key() -> None:
    assert health_taint(HealthReport("Unhealthy", "XID 79", 79), NVIDIA_PROFILE) == ("gpu.nvidia.com/xid", "79",
                                                                                     "NoSchedule")
    assert health_taint(HealthReport("Unhealthy", "GPU is lost", lost=True), NVIDIA_PROFILE) == (
        "gpu.nvidia.com/gpu-lost", "", "NoSchedule")
    assert health_taint(HealthReport("Unknown", "no events"), NVIDIA_PROFILE) == ("gpu.nvidia.com/unmonitored", "",
                                                                                  "None")
    assert health_taint(HealthReport("Unhealthy", "double-bit ECC error"), NVIDIA_PROFILE) == (
        "gpu.nvidia.com/xid", "double-bit-ECC-error", "NoSchedule")
    assert health_taint(HealthReport("Healthy"), NVIDIA_PROFILE) is None
    # This driver's own profile: one key, and nothing for Unknown.
    assert health_taint(HealthReport("Unhealthy", "XID 79", 79)) == ("gpu.dra-driver.io/unhealthy", "XID-79",
                                                                      "NoSchedule")
    assert health_taint(HealthReport("Unknown", "no events")) is None


def test_the_monitor_publishes_nvidias_taints_and_removes_them() -> None:
    devices_json, _ = describe(DEVICES, DRIVER, False, profile=NVIDIA_PROFILE)
    published: list[list[dict[str, Any]]] = []
    changes: list[str] = []
    monitor = HealthMonitor(DEVICES, devices_json, HealthBoard(sorted(DEVICES)), lambda d: published.append(d),
                            on_change=lambda c: changes.append(c.describe()), profile=NVIDIA_PROFILE)
    monitor.set_reports({GPU0: HealthReport("Unhealthy", "XID 79", 79),
                         GPU1: HealthReport("Unhealthy", "GPU is lost", lost=True),
                         GPU2: HealthReport("Unknown", "not monitored")})
    taints = {d["name"]: d["taints"] for d in published[-1] if d.get("taints")}
    assert taints["gpu-0"] == [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]
    assert taints["gpu-1"] == [{"key": "gpu.nvidia.com/gpu-lost", "effect": "NoSchedule"}]
    assert taints["gpu-2-mig-0"] == [{"key": "gpu.nvidia.com/unmonitored", "effect": "None"}]
    for device in published[-1]:
        assert check_device(device, DRIVER) == [], device["name"]
    assert "gpu-0 Unhealthy: XID 79; tainted gpu.nvidia.com/xid=79:NoSchedule, new claims go elsewhere" in changes
    assert any(c.endswith("tainted gpu.nvidia.com/unmonitored (effect None: only told)") for c in changes)
    monitor.set_reports({})
    assert not any(d.get("taints") for d in published[-1])
    assert "gpu-1 healthy again after GPU is lost; taint gpu.nvidia.com/gpu-lost removed" in changes


def test_the_health_file_says_a_gpu_is_lost() -> None:
    assert parse_health_file('{"gpu-1": {"lost": true}}')["gpu-1"].lost is True
    with pytest.raises(HealthFileError, match=r"gpu-1\.lost: must be true or false, got str"):
        parse_health_file('{"gpu-1": {"lost": "yes"}}')
