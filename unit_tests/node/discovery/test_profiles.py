"""Strict parsing of simulated node profiles: every bad profile names the field path."""

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.node.discovery.profiles import load_profile, parse_profile

BASE: dict[str, Any] = {
    "driverVersion": "580.95.05",
    "cudaDriverVersion": "13.0",
    "models": {
        "a100": {
            "productName": "NVIDIA A100-SXM4-40GB", "brand": "Nvidia", "architecture": "Ampere",
            "cudaComputeCapability": "8.0", "memoryMiB": 40960, "multiprocessors": 108,
            "migProfiles": [
                {"name": "1g.5gb", "memoryMiB": 4864, "multiprocessors": 14, "computeSlices": 1, "memorySlices": 1,
                 "placements": [0, 1, 2, 3, 4, 5, 6]},
                {"name": "3g.20gb", "memoryMiB": 20096, "multiprocessors": 42, "computeSlices": 3,
                 "memorySlices": 4, "placements": [0, 4]},
                {"name": "7g.40gb", "memoryMiB": 40320, "multiprocessors": 98, "computeSlices": 7,
                 "memorySlices": 8, "placements": [0]},
            ],
        },
        "t4": {"productName": "Tesla T4", "brand": "Tesla", "architecture": "Turing",
               "cudaComputeCapability": "7.5", "memoryMiB": 15360, "multiprocessors": 40},
    },
    "gpus": [
        {"index": 0, "model": "a100", "pciBusId": "0000:07:00.0", "numaNode": 0, "pcieRoot": "pci0000:00"},
        {"index": 1, "model": "a100", "pciBusId": "0000:0f:00.0",
         "mig": {"enabled": True, "instances": [{"profile": "3g.20gb", "placement": 0},
                                                {"profile": "1g.5gb", "placement": 4}]}},
        {"index": 2, "model": "t4", "pciBusId": "0000:81:00.0", "numaNode": None},
    ],
}


def test_base_is_valid() -> None:
    profile = parse_profile(copy.deepcopy(BASE))
    assert [g.index for g in profile.gpus] == [0, 1, 2]
    assert [i.gpu_instance_id for i in profile.gpus[1].instances] == [1, 2]


def _mutate(fn: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    fn(data)
    return data


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(data: dict[str, Any]) -> None:
        parts = path.split(".")
        target: Any = data
        for part in parts[:-1]:
            target = target[int(part)] if part.isdigit() else target[part]
        last = parts[-1]
        if value is _DELETE:
            del target[int(last) if last.isdigit() else last]
        else:
            target[int(last) if last.isdigit() else last] = value
    return apply


_DELETE = object()

CASES = [
    # (mutation, expected path, reason fragment)
    (_set("bogus", 1), "bogus", "unknown field"),
    (_set("driverVersion", _DELETE), "driverVersion", "required"),
    (_set("driverVersion", 580), "driverVersion", "non-empty string"),
    (_set("driverVersion", "580.x"), "driverVersion", "does not match"),
    (_set("cudaDriverVersion", "13"), "cudaDriverVersion", "does not match"),
    (_set("models", {}), "models", "non-empty mapping"),
    (_set("models.a100.memoryMiB", "40GB"), "models.a100.memoryMiB", "integer"),
    (_set("models.a100.multiprocessors", True), "models.a100.multiprocessors", "integer"),
    (_set("models.a100.colour", "green"), "models.a100.colour", "unknown field"),
    (_set("models.a100.migProfiles.0.name", "1g-5gb"), "models.a100.migProfiles[0].name", "does not match"),
    (_set("models.a100.migProfiles.1.placements", [0, 2]), "models.a100.migProfiles[1].placements[1]",
     "not aligned"),
    (_set("models.a100.migProfiles.1.placements", [0, 0]), "models.a100.migProfiles[1].placements[1]",
     "duplicate"),
    (_set("models.a100.migProfiles.1.placements", []), "models.a100.migProfiles[1].placements", "at least one"),
    (_set("models.a100.migProfiles.1.placements", [8]), "models.a100.migProfiles[1].placements[0]", "past"),
    (_set("models.a100.migProfiles.2.memoryMiB", 99999), "models.a100.migProfiles[2].memoryMiB", "larger"),
    (_set("models.a100.migProfiles.1.name", "1g.5gb"), "models.a100.migProfiles[1].name", "duplicate"),
    (_set("gpus", []), "gpus", "at least one"),
    (_set("gpus", {"index": 0}), "gpus", "must be a list"),
    (_set("gpus.0.model", "h100"), "gpus[0].model", "unknown model"),
    (_set("gpus.0.index", -1), "gpus[0].index", ">= 0"),
    (_set("gpus.0.index", "0"), "gpus[0].index", "integer"),
    (_set("gpus.2.index", 0), "gpus[2].index", "duplicate"),
    (_set("gpus.2.minor", 1), "gpus[2].minor", "duplicate"),
    (_set("gpus.2.pciBusId", "0000:07:00.0"), "gpus[2].pciBusId", "duplicate"),
    (_set("gpus.2.pciBusId", "bus-7"), "gpus[2].pciBusId", "not a PCI bus ID"),
    (_set("gpus.0.pcieRoot", "root0"), "gpus[0].pcieRoot", "does not match"),
    (_set("gpus.0.numaNode", "0"), "gpus[0].numaNode", "integer"),
    (_set("gpus.0.pciBusId", _DELETE), "gpus[0].pciBusId", "required"),
    (_set("gpus.0.speed", 3), "gpus[0].speed", "unknown field"),
    (_set("gpus.2.mig", {"enabled": True}), "gpus[2].mig", "not MIG-capable"),
    (_set("gpus.1.mig.enabled", "yes"), "gpus[1].mig.enabled", "true or false"),
    (_set("gpus.1.mig.enabled", False), "gpus[1].mig.instances", "enabled is false"),
    (_set("gpus.1.mig.instances.1.profile", "2g.10gb"), "gpus[1].mig.instances[1].profile", "not a MIG profile"),
    (_set("gpus.1.mig.instances.1.placement", 7), "gpus[1].mig.instances[1].placement", "cannot start"),
    (_set("gpus.1.mig.instances.1.placement", 3), "gpus[1].mig.instances[1].placement", "overlaps"),
    (_set("gpus.1.mig.instances.1.profile", "7g.40gb"), "gpus[1].mig.instances[1].placement", "cannot start"),
    (_set("gpus.1.mig.instances.1.extra", 1), "gpus[1].mig.instances[1].extra", "unknown field"),
    (_set("gpus.1.mig.instances.1.placement", _DELETE), "gpus[1].mig.instances[1].placement", "required"),
    (_set("gpus.1.mig.instances.0.gpuInstanceId", 0), "gpus[1].mig.instances[0].gpuInstanceId", ">= 1"),
]


@pytest.mark.parametrize(("mutation", "path", "reason"), CASES, ids=[c[1] + ":" + c[2] for c in CASES])
def test_bad_profiles_name_the_field(mutation: Callable[[dict[str, Any]], None], path: str, reason: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_profile(_mutate(mutation))
    message = str(info.value)
    assert message.startswith(path + ":"), message
    assert reason in message, message


def test_instances_that_do_not_fit_compute() -> None:
    data = copy.deepcopy(BASE)
    data["gpus"][1]["mig"]["instances"] = [
        {"profile": "3g.20gb", "placement": 0}, {"profile": "3g.20gb", "placement": 4},
        {"profile": "1g.5gb", "placement": 6},
    ]
    with pytest.raises(ValueError, match=r"^gpus\[1\]\.mig\.instances\[2\]\.placement: .*overlaps"):
        parse_profile(data)


def test_duplicate_gpu_instance_ids() -> None:
    data = copy.deepcopy(BASE)
    for inst in data["gpus"][1]["mig"]["instances"]:
        inst["gpuInstanceId"] = 3
    with pytest.raises(ValueError, match=r"^gpus\[1\]\.mig\.instances\[1\]\.gpuInstanceId: duplicate"):
        parse_profile(data)


def test_not_a_mapping() -> None:
    with pytest.raises(ValueError, match="<root>: must be a mapping"):
        parse_profile(["a"])
    with pytest.raises(ValueError, match=r"^gpus\[0\]: must be a mapping"):
        parse_profile(_mutate(_set("gpus.0", "gpu")))


def test_bad_yaml_file(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("gpus: [\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_profile(f)
    f.write_text(yaml.safe_dump(_mutate(_set("gpus.0.model", "nope"))))
    with pytest.raises(ValueError, match=r"gpus\[0\]\.model"):
        load_profile(f)
