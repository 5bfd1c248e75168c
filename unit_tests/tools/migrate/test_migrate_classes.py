"""The DeviceClasses migrate generates, checked by evaluating their selectors on published devices."""

from __future__ import annotations

from typing import Any

import pytest
from migfix import DRIVER, slice_of

from dra_driver.allocator.cel.compile import compile_selector, device_activation
from dra_driver.tools.migrate.classes import Backing, advertised_profiles, class_name, mig_profiles, plan_classes
from dra_driver.tools.migrate.config import MigrateError, parse_config

NONE = parse_config("version: v1\nflags: {migStrategy: none}\n", "none")
MIXED = parse_config("version: v1\nflags: {migStrategy: mixed}\n", "mixed")
SINGLE = parse_config("version: v1\nflags: {migStrategy: single}\n", "single")


def sharing(rename: bool, replicas: int = 4, kind: str = "timeSlicing", name: str = "gpu") -> Any:
    return parse_config(f"version: v1\nsharing:\n  {kind}:\n    renameByDefault: {str(rename).lower()}\n"
                        f"    resources: [{{name: {name}, replicas: {replicas}}}]\n", f"{kind}-{rename}")


def selected(cls: dict[str, Any], slices: list[dict[str, Any]]) -> list[str]:
    """The devices (node/name) the class's selectors take, as the scheduler's CEL evaluates them."""
    selectors = [compile_selector(s["cel"]["expression"]) for s in cls["spec"]["selectors"]]
    out = []
    for sl in slices:
        for device in sl["spec"]["devices"]:
            act = device_activation(DRIVER, device.get("attributes"), device.get("capacity"),
                                    bool(device.get("allowMultipleAllocations")))
            act.variables["driver"] = sl["spec"]["driver"]
            if all(s.evaluate(act) for s in selectors):
                out.append(f"{sl['spec']['nodeName']}/{device['name']}")
    return out


def by_resource(classes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["spec"]["extendedResourceName"]: c for c in classes}


def test_mixed_fleet_one_class_per_profile_present() -> None:
    slices = [slice_of(1, "a100-mig"), slice_of(2)]
    configs = {"node-0001": MIXED, "node-0002": MIXED}
    plan = plan_classes(configs, mig_profiles(slices, DRIVER), [], DRIVER)
    classes = by_resource(plan.classes)
    assert sorted(classes) == ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-1g.5gb",
                               "nvidia.com/mig-2g.10gb", "nvidia.com/mig-3g.20gb", "nvidia.com/mig-4g.20gb",
                               "nvidia.com/mig-7g.40gb"]
    assert classes["nvidia.com/mig-1g.5gb"]["metadata"]["name"] == f"nvidia-mig-1g.5gb.{DRIVER}"
    one_g = selected(classes["nvidia.com/mig-1g.5gb"], slices)
    assert one_g and all(d.startswith("node-0001/gpu-") and "-mig-" in d for d in one_g)
    # nvidia.com/gpu still means the full GPUs: the a100 node's one unpartitioned GPU and the h100's eight.
    assert selected(classes["nvidia.com/gpu"], slices) == ["node-0001/gpu-3"] + [f"node-0002/gpu-{i}" for i in range(8)]


def test_single_fleet_gpu_means_a_mig_device() -> None:
    slices = [slice_of(1, "a100-mig")]
    plan = plan_classes({"node-0001": SINGLE}, mig_profiles(slices, DRIVER), [], DRIVER)
    (cls,) = plan.classes
    assert cls["spec"]["extendedResourceName"] == "nvidia.com/gpu"
    chosen = selected(cls, slices)
    assert chosen and all("-mig-" in d for d in chosen)


def test_single_on_a_node_without_mig_is_its_full_gpus() -> None:
    slices = [slice_of(1, "a100-mig"), slice_of(2)]
    (cls,) = plan_classes({"node-0001": SINGLE, "node-0002": SINGLE}, mig_profiles(slices, DRIVER), [], DRIVER).classes
    chosen = selected(cls, slices)
    assert [f"node-0002/gpu-{i}" for i in range(8)] == [d for d in chosen if d.startswith("node-0002/")]
    # A selector cannot name a node: the MIG node's one unpartitioned GPU (a layout the device plugin's
    # single strategy refuses) is taken too.
    assert [d for d in chosen if d.startswith("node-0001/") and "-mig-" not in d] == ["node-0001/gpu-3"]


@pytest.mark.parametrize("rename, name", [(False, "nvidia.com/gpu"), (True, "nvidia.com/gpu.shared")])
def test_time_slicing_is_a_share_of_replicas(rename: bool, name: str) -> None:
    slices = [slice_of(1, shares=4), slice_of(2, shares=2)]
    plan = plan_classes({"node-0001": sharing(rename)}, mig_profiles(slices, DRIVER), [], DRIVER)
    (cls,) = plan.classes
    assert cls["spec"]["extendedResourceName"] == name and "config" not in cls["spec"]
    # Only devices published as 4 shares: node-0002's 2-share devices are another meaning.
    assert selected(cls, slices) == [f"node-0001/gpu-{i}" for i in range(8)]
    assert selected(cls, [slice_of(1)]) == []  # not published as shares: nothing
    assert plan.served[name].backings == {Backing("gpu", 4): ["node-0001"]}


def test_mps_adds_the_class_config() -> None:
    plan = plan_classes({"node-0001": sharing(True, 2, "mps")}, {}, [], DRIVER)
    (cls,) = plan.classes
    (config,) = cls["spec"]["config"]
    assert config["opaque"]["driver"] == DRIVER and config["opaque"]["parameters"]["sharing"] == {"strategy": "MPS"}


def test_one_name_two_meanings_one_class_takes_both() -> None:
    slices = [slice_of(1, shares=4), slice_of(2)]
    plan = plan_classes({"node-0001": sharing(False), "node-0002": NONE}, mig_profiles(slices, DRIVER), [], DRIVER)
    (cls,) = plan.classes
    assert " || " in cls["spec"]["selectors"][0]["cel"]["expression"]
    assert len(selected(cls, slices)) == 16


def test_plain_fleet_reuses_the_charts_class() -> None:
    chart = {"metadata": {"name": f"nvidia-gpu.{DRIVER}"}, "spec": {"extendedResourceName": "nvidia.com/gpu",
             "selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}' && "
                                                  f"device.attributes['{DRIVER}'].type == 'gpu'"}}]}}
    plan = plan_classes({"node-0002": NONE}, {"node-0002": set()}, [chart], DRIVER)
    assert plan.classes == [] and plan.served["nvidia.com/gpu"].class_name == f"nvidia-gpu.{DRIVER}"
    assert plan.served["nvidia.com/gpu"].current


def test_the_charts_class_is_not_replaced_behind_helm() -> None:
    chart = {"metadata": {"name": f"nvidia-gpu.{DRIVER}", "labels": {"app.kubernetes.io/managed-by": "Helm"}},
             "spec": {"extendedResourceName": "nvidia.com/gpu", "selectors": []}}
    with pytest.raises(MigrateError, match=f"DeviceClass nvidia-gpu.{DRIVER} is the chart's and serves nvidia.com/gpu "
                                           "otherwise: set the chart's deviceClasses.extendedResourceName"):
        plan_classes({"node-0001": SINGLE}, {"node-0001": {"1g.5gb"}}, [chart], DRIVER)


def test_profiles_the_device_plugin_advertises() -> None:
    nodes = [{"metadata": {"name": "a"}, "status": {"capacity": {"nvidia.com/mig-1g.5gb": "2", "nvidia.com/mig-2g.10gb": "0",
                                                                 "nvidia.com/gpu": "1"}}}]
    assert advertised_profiles(nodes) == {"a": {"1g.5gb"}}


def test_a_name_another_class_claims_is_an_error() -> None:
    other = {"metadata": {"name": "my-gpus"}, "spec": {"extendedResourceName": "nvidia.com/gpu", "selectors": []}}
    with pytest.raises(MigrateError, match=r"nvidia.com/gpu would be claimed by two DeviceClasses: my-gpus \(existing\) "
                                           rf"and nvidia-gpu.{DRIVER}"):
        plan_classes({"node-0001": SINGLE}, {"node-0001": {"1g.5gb"}}, [other], DRIVER)


def test_a_class_of_our_name_serving_another_name_is_an_error() -> None:
    other = {"metadata": {"name": f"nvidia-gpu.{DRIVER}"}, "spec": {"extendedResourceName": "example.com/x"}}
    with pytest.raises(MigrateError, match=f"DeviceClass nvidia-gpu.{DRIVER} exists and serves example.com/x"):
        plan_classes({"node-0001": SINGLE}, {"node-0001": {"1g.5gb"}}, [other], DRIVER)


def test_a_profile_no_node_has_is_an_error() -> None:
    config = parse_config("version: v1\nflags: {migStrategy: mixed}\nsharing:\n  timeSlicing:\n"
                          "    resources: [{name: mig-3g.40gb, replicas: 2}]\n", "shared-mig")
    with pytest.raises(MigrateError, match=f"config shared-mig: MIG profile 3g.40gb .nvidia.com/mig-3g.40gb. is "
                                           f"published by no node of driver {DRIVER}"):
        plan_classes({"node-0001": config}, {"node-0001": {"1g.5gb"}}, [], DRIVER)


def test_mps_on_some_nodes_only_is_an_error() -> None:
    with pytest.raises(MigrateError, match=r"nvidia\.com/gpu is MPS-shared on nodes node-0001 and not on others"):
        plan_classes({"node-0001": sharing(False, 4, "mps"), "node-0002": sharing(False, 4)}, {}, [], DRIVER)


def test_unknown_configs_are_left_out_and_names_are_valid() -> None:
    assert plan_classes({"node-0001": None}, {}, [], DRIVER).classes == []
    assert class_name("nvidia.com/mig-1g.10gb", DRIVER) == f"nvidia-mig-1g.10gb.{DRIVER}"
    with pytest.raises(MigrateError, match="is not a valid DeviceClass name"):
        class_name("nvidia.com/A..b", DRIVER)
