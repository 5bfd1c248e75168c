"""The DeviceClasses migrate generates, checked by evaluating their selectors on published devices."""

from __future__ import annotations

from typing import Any

import pytest
from migfix import DRIVER, slice_of

from dra_driver.allocator.cel.compile import compile_selector, device_activation
from dra_driver.apiprofile import NVIDIA_DRIVER_NAME, NVIDIA_PROFILE
from dra_driver.node.discovery.profiles import load_profile
from dra_driver.tools.migrate.classes import (
    Backing,
    advertised_profiles,
    class_name,
    mig_profiles,
    plan_classes,
    profile_classes,
)
from dra_driver.tools.migrate.config import MigrateError, parse_config
from e2e.generators.fleet import published_slices

NONE = parse_config("version: v1\nflags: {migStrategy: none}\n", "none")
MIXED = parse_config("version: v1\nflags: {migStrategy: mixed}\n", "mixed")
SINGLE = parse_config("version: v1\nflags: {migStrategy: single}\n", "single")


def sharing(rename: bool, replicas: int = 4, kind: str = "timeSlicing", name: str = "gpu") -> Any:
    return parse_config(f"version: v1\nsharing:\n  {kind}:\n    renameByDefault: {str(rename).lower()}\n"
                        f"    resources: [{{name: {name}, replicas: {replicas}}}]\n", f"{kind}-{rename}")


def selected(cls: dict[str, Any], slices: list[dict[str, Any]], driver: str = DRIVER) -> list[str]:
    """The devices (node/name) the class's selectors take, as the scheduler's CEL evaluates them."""
    selectors = [compile_selector(s["cel"]["expression"]) for s in cls["spec"]["selectors"]]
    out = []
    for sl in slices:
        for device in sl["spec"]["devices"]:
            act = device_activation(driver, device.get("attributes"), device.get("capacity"),
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


# --- under --api-profile nvidia: the chart installs NVIDIA's gpu.nvidia.com (nvidia.com/gpu) and mig.nvidia.com

NV = NVIDIA_DRIVER_NAME


def nvidia_slices(n: int, profile: str) -> list[dict[str, Any]]:
    return published_slices(load_profile(profile), f"node-{n:04d}", driver=NV, api_profile=NVIDIA_PROFILE)


def installed_chart(extended: bool = True) -> list[dict[str, Any]]:
    """The chart's classes as the cluster holds them (``deviceClasses.extendedResourceName: ""``: none serves a name)."""
    bodies = profile_classes(NV)
    for body in bodies:
        body["metadata"]["labels"] = {"app.kubernetes.io/managed-by": "Helm"}
        if not extended:
            body["spec"].pop("extendedResourceName", None)
    return bodies


def test_nvidias_profile_classes_are_the_profile_modules() -> None:
    assert [(c["metadata"]["name"], c["spec"].get("extendedResourceName"), c["spec"]["selectors"][0]["cel"]["expression"])
            for c in profile_classes(NV)] == [
        ("gpu.nvidia.com", "nvidia.com/gpu", "device.driver == 'gpu.nvidia.com' && "
                                             "device.attributes['gpu.nvidia.com'].type == 'gpu'"),
        ("mig.nvidia.com", None, "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'")]
    # this driver's own chart classes serve no name but nvidia-gpu.<driver>, which is migrate's own name for it
    assert [c["metadata"]["name"] for c in profile_classes(DRIVER)] == [f"gpu.{DRIVER}", f"mig.{DRIVER}"]


@pytest.mark.parametrize("installed", [False, True])
def test_under_nvidias_profile_gpu_nvidia_com_serves_nvidia_gpu(installed: bool) -> None:
    """No second class for nvidia.com/gpu: the chart's gpu.nvidia.com serves it, whether the chart is
    installed yet or not (Kubernetes allows one class per extendedResourceName)."""
    slices = nvidia_slices(1, "a100-mig") + nvidia_slices(2, "h100-8x")
    plan = plan_classes({"node-0001": MIXED, "node-0002": NONE}, mig_profiles(slices, NV),
                        installed_chart() if installed else [], NV)
    gpu = plan.served["nvidia.com/gpu"]
    assert (gpu.class_name, gpu.generated, gpu.installed) == ("gpu.nvidia.com", False, installed)
    names = {c["metadata"]["name"] for c in plan.classes}
    assert "nvidia-gpu.gpu.nvidia.com" not in names and not names & {"gpu.nvidia.com", "mig.nvidia.com"}
    assert "nvidia.com/gpu" not in {c["spec"]["extendedResourceName"] for c in plan.classes}
    # the MIG profiles still get migrate's classes, under the profile's driver and its device names
    mig = by_resource(plan.classes)["nvidia.com/mig-1g.5gb"]
    assert mig["metadata"]["name"] == "nvidia-mig-1g.5gb.gpu.nvidia.com"
    chosen = selected(mig, slices, NV)
    assert chosen and all(d.startswith("node-0001/gpu-") and "-mig-1g5gb-" in d for d in chosen)
    # where the chart is not installed yet, its class is what the fleet view's fit is given
    assert [c["metadata"]["name"] for c in plan.assumed] == ([] if installed else ["gpu.nvidia.com"])
    assert selected(profile_classes(NV)[0], slices, NV) == ["node-0001/gpu-3"] + [f"node-0002/gpu-{i}" for i in range(8)]


def test_under_nvidias_profile_single_needs_the_charts_name_freed() -> None:
    slices = nvidia_slices(1, "a100-mig")
    with pytest.raises(MigrateError, match=r"nvidia.com/gpu would be claimed by two DeviceClasses: gpu.nvidia.com "
                                           r"\(the chart's under --api-profile nvidia, not installed yet\) and "
                                           r"nvidia-gpu.gpu.nvidia.com; .*extendedResourceName to \"\""):
        plan_classes({"node-0001": SINGLE}, mig_profiles(slices, NV), [], NV)
    with pytest.raises(MigrateError, match=r"claimed by two DeviceClasses: gpu.nvidia.com \(existing\) and "):
        plan_classes({"node-0001": SINGLE}, mig_profiles(slices, NV), installed_chart(), NV)


def test_under_nvidias_profile_with_the_name_freed_a_class_is_generated_beside_the_charts() -> None:
    """deviceClasses.extendedResourceName "": gpu.nvidia.com serves no name, so migrate's class does;
    the chart's classes are never replaced (NVIDIA's claims name them), and the report says which one
    selects the same devices."""
    slices = nvidia_slices(1, "a100-mig")
    plan = plan_classes({"node-0001": SINGLE}, mig_profiles(slices, NV), installed_chart(extended=False), NV)
    (cls,) = plan.classes
    assert cls["metadata"]["name"] == "nvidia-gpu.gpu.nvidia.com" and plan.assumed == []
    assert plan.served["nvidia.com/gpu"].same_devices == "mig.nvidia.com"
    assert selected(cls, slices, NV) == selected(profile_classes(NV)[1], slices, NV)
    plan = plan_classes({"node-0001": NONE}, mig_profiles(slices, NV), installed_chart(extended=False), NV)
    assert [c["metadata"]["name"] for c in plan.classes] == ["nvidia-gpu.gpu.nvidia.com"]
    assert plan.served["nvidia.com/gpu"].same_devices == "gpu.nvidia.com"
