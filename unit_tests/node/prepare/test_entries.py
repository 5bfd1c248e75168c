"""The checkpoint's records (dra_driver/node/prepare/entries.py): what a device's JSON holds comes back
byte for byte (a rollback reads what this release writes), with its sharing decoded once and its kind
an enum."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.gpuconfig import EXCLUSIVE, MpsSettings, SharingConfig, Strategy, TimeSliceInterval
from dra_driver.node.prepare.entries import ClaimEntry, ClaimState, DeviceKind, PreparedDevice
from dra_driver.node.prepare.journal import canonical

UID = "0b6f7c7e-8d8a-4c1e-9f55-3f1d0c2a9b10"


def device_json(sharing: Any, kind: str = "gpu") -> dict[str, Any]:
    return {
        "pool": "node-a", "device": "gpu-0", "requests": ["gpu"], "cdiDeviceIDs": [f"k8s.gpu.dra-driver.io/claim={UID}-gpu-0"],
        "sharing": sharing, "shareID": None, "adminAccess": False, "uuid": "GPU-a", "gpuUUID": "GPU-a",
        "gpuMinor": 0, "migCaps": [], "migInstance": None, "kind": kind, "placement": None,
        "consumedCapacity": {}, "memoryShareBytes": None, "computeSharePercent": None,
    }


@pytest.mark.parametrize(("sharing", "decoded"), [
    ({"strategy": "Exclusive"}, EXCLUSIVE),
    ({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}},
     SharingConfig(Strategy.TIME_SLICING, TimeSliceInterval.LONG)),
    ({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"}},
     SharingConfig(Strategy.MPS, None, MpsSettings(50, "10Gi", 10 * 2**30))),
    ({"strategy": "MPS", "mps": {}}, SharingConfig(Strategy.MPS, None, MpsSettings())),
], ids=["exclusive", "time-slicing", "mps-limits", "mps"])
def test_sharing_is_decoded_once_and_written_back_the_same(sharing: dict[str, Any], decoded: SharingConfig) -> None:
    raw = device_json(sharing)
    dev = PreparedDevice.from_dict(raw)
    assert dev.sharing == decoded
    assert canonical(dev.to_dict()) == canonical(raw)


@pytest.mark.parametrize("sharing", [
    {"strategy": "Gang"},  # a strategy this release does not know: Exclusive here, kept in the file
    {"strategy": "TimeSlicing"},  # spelled without the interval this release always writes
])
def test_sharing_this_release_would_not_write_is_kept_as_read(sharing: dict[str, Any]) -> None:
    raw = device_json(sharing)
    dev = PreparedDevice.from_dict(raw)
    assert canonical(dev.to_dict()) == canonical(raw)
    if sharing["strategy"] == "Gang":
        assert dev.sharing == EXCLUSIVE


def test_a_device_made_at_prepare_writes_its_sharing_in_the_api_form() -> None:
    dev = PreparedDevice("node-a", "gpu-0", ("gpu",), (), SharingConfig(Strategy.TIME_SLICING, TimeSliceInterval.SHORT))
    assert dev.to_dict()["sharing"] == {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Short"}}
    assert PreparedDevice.from_dict(dev.to_dict()) == dev


def test_kind_is_an_enum_written_as_before() -> None:
    mig = PreparedDevice.from_dict(device_json({"strategy": "Exclusive"}, kind="mig"))
    assert mig.kind is DeviceKind.MIG and mig.to_dict()["kind"] == "mig"
    without = device_json({"strategy": "Exclusive"})
    del without["kind"]  # written before the field existed: a whole GPU
    assert PreparedDevice.from_dict(without).kind is DeviceKind.GPU
    with pytest.raises(ValueError, match="unknown device kind 'vgpu'"):
        PreparedDevice.from_dict(device_json({"strategy": "Exclusive"}, kind="vgpu"))
    with pytest.raises(ValueError, match="sharing must be an object"):
        PreparedDevice.from_dict(device_json("Exclusive"))


def test_an_entry_round_trips() -> None:
    entry = ClaimEntry(UID, "ns", "c", ClaimState.PREPARE_COMPLETED,
                       (PreparedDevice.from_dict(device_json({"strategy": "Gang"})),),
                       boot_id="b", updated="2026-01-01T00:00:00.000000Z", pod_claim_name="gpu")
    again = ClaimEntry.from_dict(UID, entry.to_dict())
    assert again == entry and canonical(again.to_dict()) == canonical(entry.to_dict())
