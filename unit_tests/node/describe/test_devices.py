import itertools
import re
from dataclasses import replace
from fractions import Fraction
from typing import Any

import pytest

from dra_driver.k8s.quantity import format_canonical, parse_quantity
from dra_driver.node.describe.devices import (
    ATTR_NUMA_NODE,
    ATTR_PCI_BUS_ID,
    ATTR_PCIE_ROOT,
    AllocatableDevice,
    describe,
    enumerate_devices,
    is_semver,
    profile_label,
    to_semver,
)
from dra_driver.node.discovery.model import Gpu, MigPlacement
from dra_driver.node.discovery.simulated import SimulatedBackend
from dra_driver.node.publish.checker import check_device

DRIVER = "gpu.example.com"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def gpus(profile: str) -> list[Gpu]:
    return SimulatedBackend(profile, "node-a").discover()


def test_semver() -> None:
    assert to_semver("580.95.05") == "580.95.5"
    assert to_semver("580.65.06") == "580.65.6"
    assert to_semver("9.0") == "9.0.0"
    assert to_semver("13.0") == "13.0.0"
    assert to_semver("535") == "535.0.0"
    # A fourth number is build metadata: valid, and ordered by the first three.
    assert to_semver("6.19.14.31400000") == "6.19.14+31400000"
    assert to_semver("1.2.3.04.5") == "1.2.3+04.5"
    for bad in ("", "v1.0", "1.x", "1..2", "\u0661.\u0662"):
        with pytest.raises(ValueError):
            to_semver(bad)
    assert is_semver("1.0.0") and not is_semver("01.0.0") and not is_semver("1.0")


@pytest.mark.parametrize(
    ("value", "binary", "text"),
    [
        (80 * 1024**3, True, "80Gi"),
        (81559 * 1024**2, True, "81559Mi"),
        (40960 * 1024**2, True, "40Gi"),
        (1025, True, "1025"),
        (1000, True, "1k"),
        (0, True, "0"),
        (14, False, "14"),
        (1, False, "1"),
        (7000, False, "7k"),
        (132, False, "132"),
    ],
)
def test_format_quantity_is_canonical(value: int, binary: bool, text: str) -> None:
    assert format_canonical(value, binary) == text
    assert parse_quantity(text).value == value


def test_names_static() -> None:
    devices = enumerate_devices(gpus("a100-mig"), dynamic_mig=False)
    assert list(devices) == [
        "gpu-0-mig-1-0", "gpu-0-mig-2-0", "gpu-0-mig-3-0", "gpu-0-mig-4-0",
        "gpu-1-mig-1-0",
        "gpu-2-mig-1-0", "gpu-2-mig-2-0", "gpu-2-mig-3-0",
        "gpu-3",
    ]
    assert all(d.kind == "mig" for n, d in devices.items() if "mig" in n)
    assert devices["gpu-3"].kind == "gpu" and devices["gpu-0-mig-4-0"].mig is not None
    h100 = enumerate_devices(gpus("h100-8x"), dynamic_mig=False)
    assert list(h100) == [f"gpu-{i}" for i in range(8)]


def test_names_dynamic() -> None:
    devices = enumerate_devices(gpus("h100-8x"), dynamic_mig=True)
    per_gpu = [n for n in devices if n.startswith("gpu-0")]
    assert per_gpu[0] == "gpu-0"
    assert "gpu-0-mig-1g10gb-0" in per_gpu and "gpu-0-mig-1g10gb-6" in per_gpu
    assert "gpu-0-mig-3g40gb-4" in per_gpu and "gpu-0-mig-7g80gb-0" in per_gpu
    assert len(per_gpu) == 1 + 7 + 4 + 3 + 2 + 1 + 1
    assert all(DNS_LABEL.match(n) and len(n) <= 63 for n in devices)
    dyn = devices["gpu-0-mig-1g20gb-2"]
    assert dyn.mig_profile is not None and dyn.placement == MigPlacement(2, 2) and dyn.kind == "mig"
    # non-MIG-capable GPUs are unaffected by the flag
    assert list(enumerate_devices(gpus("mixed-l4-t4"), True)) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert profile_label("1g.10gb+me") == "1g10gb-me"


def test_gpu_attributes() -> None:
    devices, counters = describe(enumerate_devices(gpus("h100-8x"), False), DRIVER, False)
    assert counters == []
    d = devices[5]
    attrs = d["attributes"]
    assert d["name"] == "gpu-5"
    assert attrs["type"] == {"string": "gpu"}
    assert attrs["uuid"]["string"].startswith("GPU-")
    assert attrs["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert attrs["brand"] == {"string": "Nvidia"}
    assert attrs["architecture"] == {"string": "Hopper"}
    assert attrs["cudaComputeCapability"] == {"version": "9.0.0"}
    assert attrs["driverVersion"] == {"version": "580.95.5"}
    assert attrs["cudaDriverVersion"] == {"version": "13.0.0"}
    assert attrs["index"] == {"int": 5} and attrs["minor"] == {"int": 5}
    assert attrs[ATTR_PCI_BUS_ID] == {"string": "0000:9a:00.0"}
    assert attrs[ATTR_PCIE_ROOT] == {"string": "pci0000:80"}
    assert attrs[ATTR_NUMA_NODE] == {"int": 1}
    assert d["capacity"] == {"memory": {"value": "81559Mi"}, "multiprocessors": {"value": "132"}}
    assert "consumesCounters" not in d


def test_unknown_numa_not_published() -> None:
    devices, _ = describe(enumerate_devices(gpus("mixed-l4-t4"), False), DRIVER, False)
    assert ATTR_NUMA_NODE in devices[0]["attributes"]
    assert ATTR_NUMA_NODE not in devices[2]["attributes"]
    assert devices[2]["attributes"]["productName"] == {"string": "Tesla T4"}
    assert devices[2]["attributes"]["cudaComputeCapability"] == {"version": "7.5.0"}
    assert devices[2]["capacity"]["memory"] == {"value": "15Gi"}


def test_static_mig_attributes() -> None:
    gs = gpus("a100-mig")
    devices, counters = describe(enumerate_devices(gs, False), DRIVER, False)
    assert counters == []
    d = devices[3]
    assert d["name"] == "gpu-0-mig-4-0"
    a = d["attributes"]
    assert a["type"] == {"string": "mig"} and a["profile"] == {"string": "3g.20gb"}
    assert a["uuid"]["string"].startswith("MIG-")
    assert a["parentUUID"] == {"string": gs[0].uuid} and a["parentIndex"] == {"int": 0}
    assert a[ATTR_PCI_BUS_ID] == {"string": "0000:07:00.0"}
    assert "index" not in a and "minor" not in a
    assert d["capacity"] == {"memory": {"value": "20096Mi"}, "multiprocessors": {"value": "42"}}
    assert "consumesCounters" not in d


@pytest.mark.parametrize("profile", ["h100-8x", "a100-mig", "mixed-l4-t4", "kind-mixed"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_limits_hold(profile: str, dynamic: bool) -> None:
    devices, counters = describe(enumerate_devices(gpus(profile), dynamic), DRIVER, dynamic)
    names = [d["name"] for d in devices]
    assert len(names) == len(set(names))
    for d in devices:
        assert check_device(d, DRIVER) == []
        assert len(d["attributes"]) + len(d["capacity"]) <= 32
        for key, value in d["attributes"].items():
            ((kind, v),) = value.items()
            if kind in ("string", "version"):
                assert len(v) <= 64
            if kind == "version":
                assert is_semver(v), (key, v)
        assert len(d.get("consumesCounters", [])) <= 2
    for cs in counters:
        assert len(cs["counters"]) <= 32 and DNS_LABEL.match(cs["name"])
        assert all(DNS_LABEL.match(c) for c in cs["counters"])


def test_a_version_that_is_no_semver_is_published_as_it_is_for_the_checker_to_withhold() -> None:
    gpu = replace(gpus("mixed-l4-t4")[0], driver_version="580.95.x")
    (device,), _ = describe(enumerate_devices([gpu], False), DRIVER, False)
    assert device["attributes"]["driverVersion"] == {"version": "580.95.x"}
    assert [v.rule for v in check_device(device, DRIVER)] == ["version"]


def test_long_strings_are_cut_to_64_bytes_not_characters() -> None:
    gpu = replace(gpus("mixed-l4-t4")[0], product_name="é" * 40 + "x", architecture="a" * 70)
    (device,), _ = describe(enumerate_devices([gpu], False), DRIVER, False)
    assert device["attributes"]["productName"] == {"string": "é" * 32}
    assert device["attributes"]["architecture"] == {"string": "a" * 64}
    assert check_device(device, DRIVER) == []


def _consumption(device: dict[str, Any]) -> dict[str, Fraction]:
    (entry,) = device["consumesCounters"]
    return {k: parse_quantity(v["value"]).value for k, v in entry["counters"].items()}


def _fits(counter_set: dict[str, Any], *devices: dict[str, Any]) -> bool:
    capacity = {k: parse_quantity(v["value"]).value for k, v in counter_set["counters"].items()}
    used: dict[str, Fraction] = {}
    for d in devices:
        for k, v in _consumption(d).items():
            used[k] = used.get(k, Fraction(0)) + v
    return all(used[k] <= capacity[k] for k in used)  # type: ignore[operator]


def _overlap(a: AllocatableDevice, b: AllocatableDevice) -> bool:
    pa, pb = a.placement, b.placement
    if pa is None or pb is None:
        return True  # the full GPU overlaps everything
    return pa.start < pb.start + pb.size and pb.start < pa.start + pa.size


@pytest.mark.parametrize("profile", ["h100-8x", "a100-mig"])
def test_dynamic_counters_pairwise_exclusive_iff_overlapping(profile: str) -> None:
    gs = gpus(profile)
    alloc = enumerate_devices(gs, True)
    devices, counters = describe(alloc, DRIVER, True)
    assert len(counters) == len(gs)
    sets = {cs["name"]: cs for cs in counters}
    by_name = {d["name"]: d for d in devices}
    gpu0 = [n for n in alloc if n == "gpu-0" or n.startswith("gpu-0-")]
    cs = sets["gpu-0-counter-set"]
    assert all(by_name[n]["consumesCounters"][0]["counterSet"] == "gpu-0-counter-set" for n in gpu0)
    # the full GPU consumes exactly the whole set
    assert by_name["gpu-0"]["consumesCounters"][0]["counters"] == cs["counters"]
    for a, b in itertools.combinations(gpu0, 2):
        both = _fits(cs, by_name[a], by_name[b])
        assert both == (not _overlap(alloc[a], alloc[b])), (a, b)
    for n in gpu0:
        assert _fits(cs, by_name[n])


@pytest.mark.parametrize(
    "layout",
    [
        ["gpu-0-mig-1g10gb-0", "gpu-0-mig-1g10gb-1", "gpu-0-mig-1g10gb-2", "gpu-0-mig-1g10gb-3",
         "gpu-0-mig-1g10gb-4", "gpu-0-mig-1g10gb-5", "gpu-0-mig-1g10gb-6"],
        ["gpu-0-mig-4g40gb-0", "gpu-0-mig-3g40gb-4"],
        ["gpu-0-mig-3g40gb-0", "gpu-0-mig-3g40gb-4"],
        ["gpu-0-mig-1g20gb-0", "gpu-0-mig-1g20gb-2", "gpu-0-mig-1g20gb-4", "gpu-0-mig-1g20gb-6"],
        ["gpu-0-mig-2g20gb-0", "gpu-0-mig-2g20gb-2", "gpu-0-mig-3g40gb-4"],
    ],
)
def test_valid_h100_layouts_fit(layout: list[str]) -> None:
    devices, counters = describe(enumerate_devices(gpus("h100-8x"), True), DRIVER, True)
    by_name = {d["name"]: d for d in devices}
    assert _fits(counters[0], *(by_name[n] for n in layout))


def test_valid_a100_layouts_fit_and_invalid_do_not() -> None:
    devices, counters = describe(enumerate_devices(gpus("a100-mig"), True), DRIVER, True)
    by_name = {d["name"]: d for d in devices}
    cs = next(c for c in counters if c["name"] == "gpu-3-counter-set")
    ok = ["gpu-3-mig-1g5gb-0", "gpu-3-mig-1g5gb-1", "gpu-3-mig-2g10gb-2", "gpu-3-mig-3g20gb-4"]
    assert _fits(cs, *(by_name[n] for n in ok))
    assert _fits(cs, *(by_name[f"gpu-3-mig-1g10gb-{s}"] for s in (0, 2, 4, 6)))
    assert not _fits(cs, by_name["gpu-3-mig-4g20gb-0"], by_name["gpu-3-mig-2g10gb-2"])
    assert not _fits(cs, by_name["gpu-3"], by_name["gpu-3-mig-1g5gb-6"])


def test_dynamic_counter_set_contents() -> None:
    _, counters = describe(enumerate_devices(gpus("a100-mig"), True), DRIVER, True)
    c = counters[0]["counters"]
    assert counters[0]["name"] == "gpu-0-counter-set"
    assert c["memory"] == {"value": "40Gi"} and c["multiprocessors"] == {"value": "108"}
    assert c["compute-slices"] == {"value": "7"}
    assert [k for k in c if k.startswith("memory-slice-")] == [f"memory-slice-{i}" for i in range(8)]


def test_dynamic_mig_device_attributes() -> None:
    gs = gpus("h100-8x")
    devices, _ = describe(enumerate_devices(gs, True), DRIVER, True)
    d = next(d for d in devices if d["name"] == "gpu-1-mig-2g20gb-4")
    a = d["attributes"]
    assert a["type"] == {"string": "mig"} and a["profile"] == {"string": "2g.20gb"}
    assert "uuid" not in a  # does not exist until prepared
    assert a["parentUUID"] == {"string": gs[1].uuid} and a["parentIndex"] == {"int": 1}
    assert d["capacity"] == {"memory": {"value": "20096Mi"}, "multiprocessors": {"value": "32"}}
    counters = d["consumesCounters"][0]["counters"]
    assert {k for k in counters if k.startswith("memory-slice")} == {"memory-slice-4", "memory-slice-5"}
    assert counters["compute-slices"] == {"value": "2"}


def test_driver_name_required() -> None:
    with pytest.raises(ValueError):
        describe({}, "", False)
