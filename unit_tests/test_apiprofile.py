"""The API profiles' names: this driver's own, and NVIDIA's DRA driver's as its code writes them."""

from __future__ import annotations

import pytest

from dra_driver import apiprofile
from dra_driver.apiprofile import NVIDIA_PROFILE, OWN


def test_the_own_profile_keeps_its_names() -> None:
    assert OWN.gpu_device_name(index=1, minor=3) == "gpu-1"
    assert OWN.static_mig_device_name(1, 3, gpu_instance_id=7, compute_instance_id=0, profile="1g.10gb",
                                      profile_id=19, placement_start=6) == "gpu-1-mig-7-0"
    assert OWN.dynamic_mig_device_name(1, 3, profile="1g.10gb+me", profile_id=20, placement_start=6) == (
        "gpu-1-mig-1g10gb-me-6")
    assert OWN.counter_set_name(1, 3) == "gpu-1-counter-set"
    assert OWN.taints.all == ("gpu.dra-driver.io/unhealthy",)
    assert [(c.name, c.device_type, c.extended_resource_name) for c in OWN.device_classes("gpu.example.org")] == [
        ("gpu.gpu.example.org", "gpu", None), ("mig.gpu.example.org", "mig", None)]
    assert OWN.driver_name(None) == "gpu.dra-driver.io" and OWN.driver_name("gpu.example.org") == "gpu.example.org"


def test_nvidias_names_are_by_minor_profile_id_and_placement() -> None:
    assert NVIDIA_PROFILE.gpu_device_name(index=1, minor=3) == "gpu-3"
    for name in (NVIDIA_PROFILE.static_mig_device_name(1, 3, gpu_instance_id=7, compute_instance_id=0,
                                                       profile="1g.10gb", profile_id=19, placement_start=6),
                 NVIDIA_PROFILE.dynamic_mig_device_name(1, 3, profile="1g.10gb", profile_id=19, placement_start=6)):
        assert name == "gpu-3-mig-1g10gb-19-6"
    assert NVIDIA_PROFILE.counter_set_name(1, 3) == "gpu-3-counter-set"
    assert NVIDIA_PROFILE.cdi_kind("gpu.nvidia.com") == "k8s.gpu.nvidia.com/claim"
    assert NVIDIA_PROFILE.taints.all == ("gpu.nvidia.com/xid", "gpu.nvidia.com/gpu-lost", "gpu.nvidia.com/unmonitored")
    assert [(c.name, c.device_type, c.extended_resource_name) for c in NVIDIA_PROFILE.device_classes("gpu.nvidia.com")] == [
        ("gpu.nvidia.com", "gpu", "nvidia.com/gpu"), ("mig.nvidia.com", "mig", None)]
    assert apiprofile.class_selector("gpu.nvidia.com", "mig") == (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'")


def test_profiles_by_name_and_by_driver() -> None:
    assert apiprofile.get("nvidia") is NVIDIA_PROFILE and apiprofile.get("dra-driver") is OWN
    with pytest.raises(ValueError, match="--api-profile must be one of dra-driver, nvidia, got 'nv'"):
        apiprofile.get("nv")
    assert apiprofile.for_driver("gpu.nvidia.com") is NVIDIA_PROFILE
    assert apiprofile.for_driver("gpu.dra-driver.io") is OWN and apiprofile.for_driver("gpu.example.org") is OWN
    with pytest.raises(ValueError, match=r"publishes as gpu\.nvidia\.com"):
        NVIDIA_PROFILE.driver_name("gpu.example.org")


def test_nvidias_driver_name_goes_with_nvidias_profile_only() -> None:
    with pytest.raises(ValueError, match="it goes with --api-profile nvidia"):
        OWN.driver_name("gpu.nvidia.com")
