"""What migrate says of each workload that asks for a device plugin name."""

from __future__ import annotations

from typing import Any

import pytest
from migfix import DRIVER, pod

from dra_driver.tools.migrate.classes import Backing, Served
from dra_driver.tools.migrate.workloads import FitAsk, pod_count, report

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


def test_fit_is_the_callers_asked_with_the_claim_after_the_switch() -> None:
    seen: list[FitAsk] = []

    def fit(ask: FitAsk) -> str:
        seen.append(ask)
        return "yes, on node-0001"

    planned = [{"metadata": {"name": f"nvidia-gpu.{DRIVER}"}}]
    two = pod("a", {"nvidia.com/gpu": "2"})
    two["spec"]["containers"].append({"name": "side", "resources": {"limits": {"nvidia.com/gpu": "2"}}})
    rows = report([two, pod("cpu-only", {"cpu": "1"})], SERVED, DRIVER, fit, planned)
    assert [r["fit"] for r in rows] == ["yes, on node-0001"]
    (asked,) = seen
    assert asked.workload is two and asked.pods == 1 and asked.classes == tuple(planned)
    # KEP-5004: per container and name, that many devices of the class that serves it
    assert asked.requests == ({"name": "gpu-0", "exactly": {"deviceClassName": f"nvidia-gpu.{DRIVER}", "count": 2}},
                              {"name": "gpu-1", "exactly": {"deviceClassName": f"nvidia-gpu.{DRIVER}", "count": 2}})
    assert "fit" not in report([pod("a", {"nvidia.com/gpu": "1"})], SERVED, DRIVER)[0]


def test_fit_asks_for_the_template_where_no_class_serves_and_not_where_nothing_does() -> None:
    seen: list[FitAsk] = []

    def fit(ask: FitAsk) -> str:
        seen.append(ask)
        return "no"

    (memory,) = report([pod("m", {"aliyun.com/gpu-mem": "8"})], SERVED, DRIVER, fit)
    assert memory["fit"] == "no" and seen[0].requests == ({"name": "gpu-0", "exactly": {
        "deviceClassName": f"shared-gpu.{DRIVER}", "capacity": {"requests": {"memory": "8Gi"}}}},)
    rows = report([pod("x", {"nvidia.com/mig-2g.20gb": "1", "nvidia.com/gpu": "1"})], SERVED, DRIVER, fit)
    assert len(rows) == 2 and all("fit" not in r for r in rows) and len(seen) == 1, "half a pod cannot be fitted"


@pytest.mark.parametrize(("kind", "spec", "pods"), [
    ("Pod", {}, 1), ("Deployment", {"replicas": 3}, 3), ("Deployment", {}, 1), ("StatefulSet", {"replicas": 0}, 0),
    ("Job", {"parallelism": 4}, 4), ("Job", {}, 1), ("CronJob", {"jobTemplate": {"spec": {"parallelism": 2}}}, 2),
    ("DaemonSet", {"replicas": 5}, None), ("Deployment", {"replicas": "3"}, 1),
])
def test_how_many_pods_run_at_once(kind: str, spec: dict[str, Any], pods: int | None) -> None:
    assert pod_count({"kind": kind, "spec": spec}) == pods
