"""What migrate says of each workload that asks for a device plugin name."""

from __future__ import annotations

from typing import Any

import pytest
from migfix import DRIVER, pod

from dra_driver.tools.migrate.classes import Backing, Served
from dra_driver.tools.migrate.workloads import report

SERVED = {
    "nvidia.com/gpu": Served("nvidia.com/gpu", f"nvidia-gpu.{DRIVER}", {Backing("gpu"): ["node-0001"]}),
    "nvidia.com/gpu.shared": Served("nvidia.com/gpu.shared", f"nvidia-gpu.shared.{DRIVER}",
                                    {Backing("gpu", 4): ["node-0002"]}),
}


@pytest.mark.parametrize("kind", ["Pod", "Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob"])
def test_every_workload_kind_is_read(kind: str) -> None:
    (row,) = report([pod("w", {"nvidia.com/gpu": "2", "cpu": "1"}, kind=kind)], SERVED, DRIVER)
    assert row["workload"] == f"{kind} ml/w" and row["resource"] == "nvidia.com/gpu" and row["count"] == 2
    assert row["served"] and row["deviceClass"] == f"nvidia-gpu.{DRIVER}" and row["meaning"] == "a full GPU"
    assert "template" not in row


def test_pods_of_a_controller_are_reported_through_it() -> None:
    owned = pod("w-1", {"nvidia.com/gpu": "1"})
    owned["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "w", "controller": True}]
    assert report([owned], SERVED, DRIVER) == []


def test_one_share_is_served_more_get_the_template() -> None:
    one, three = report([pod("a", {"nvidia.com/gpu.shared": "1"}), pod("b", {"nvidia.com/gpu.shared": "3"})],
                        SERVED, DRIVER)
    assert one["served"] and one["meaning"] == "one of 4 shares of a full GPU" and "template" not in one
    assert three["served"] and "possibly of different GPUs" in three["note"]
    request = three["template"]["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert request == {"deviceClassName": f"nvidia-gpu.shared.{DRIVER}", "capacity": {"requests": {"shares": "3"}}}
    assert three["template"]["metadata"] == {"name": "b-gpu", "namespace": "ml"}


def test_a_count_the_device_plugin_refused_says_so() -> None:
    refused = {"nvidia.com/gpu": Served("nvidia.com/gpu", "c", {Backing("gpu", 2, mps=True): ["n"]}, refused_more=True)}
    (row,) = report([pod("b", {"nvidia.com/gpu": "2"})], refused, DRIVER)
    assert row["note"].endswith("(the device plugin refused it: failRequestsGreaterThanOne)")
    assert row["meaning"] == "one of 2 MPS shares of a full GPU"


@pytest.mark.parametrize("resource, count, memory", [("aliyun.com/gpu-mem", "8", "8Gi"),
                                                     ("nvidia.com/gpumem", "3000", "3000Mi")])
def test_memory_extensions_get_a_memory_share_template(resource: str, count: str, memory: str) -> None:
    (row,) = report([pod("m", {resource: count})], SERVED, DRIVER)
    assert not row["served"] and row["deviceClass"] is None and "no DeviceClass can serve" in row["note"]
    exactly = row["template"]["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly == {"deviceClassName": f"shared-gpu.{DRIVER}", "capacity": {"requests": {"memory": memory}}}


def test_a_device_plugin_name_nothing_serves_says_so() -> None:
    (row,) = report([pod("x", {"nvidia.com/mig-2g.20gb": "1"})], SERVED, DRIVER)
    assert not row["served"] and "no node's config serves nvidia.com/mig-2g.20gb" in row["note"]


def test_fit_is_the_callers() -> None:
    seen: list[Any] = []

    def fit(obj: Any) -> str:
        seen.append(obj["metadata"]["name"])
        return "yes, node-0001"

    rows = report([pod("a", {"nvidia.com/gpu": "1"}), pod("cpu-only", {"cpu": "1"})], SERVED, DRIVER, fit)
    assert [r["fit"] for r in rows] == ["yes, node-0001"] and seen == ["a"]
    assert "fit" not in report([pod("a", {"nvidia.com/gpu": "1"})], SERVED, DRIVER)[0]
