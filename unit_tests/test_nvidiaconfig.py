"""NVIDIA's opaque config API (resource.nvidia.com/v1beta1) decoded into this driver's sharing: what
their driver accepts decodes to the sharing it means, what it refuses is refused with the field."""

from __future__ import annotations

from typing import Any

import pytest
from fuzzing import mutate
from hypothesis import given
from hypothesis import strategies as st

from dra_driver.gpuconfig import EXCLUSIVE, ConfigError, MpsSettings, SharingConfig, Strategy, TimeSliceInterval
from dra_driver.nvidiaconfig import API_VERSION, Kind, MemoryLimit, NvidiaConfig, decode, is_nvidia


def gpu(sharing: Any = None, kind: str = "GpuConfig", **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"apiVersion": API_VERSION, "kind": kind, **extra}
    if sharing is not None:
        out["sharing"] = sharing
    return out


def mig(sharing: Any = None) -> dict[str, Any]:
    return gpu(sharing, kind="MigDeviceConfig")


def refused(parameters: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        decode(parameters)
    return info.value


class TestAccepted:
    def test_no_sharing_is_not_shared(self) -> None:
        assert decode(gpu()) == NvidiaConfig(Kind.GPU_CONFIG, EXCLUSIVE)
        assert decode(mig()) == NvidiaConfig(Kind.MIG_DEVICE_CONFIG, EXCLUSIVE)
        assert decode(gpu(sharing=None)).sharing is EXCLUSIVE
        assert decode({**gpu(), "sharing": None}).sharing is EXCLUSIVE

    @pytest.mark.parametrize("interval", ["Default", "Short", "Medium", "Long"])
    def test_time_slicing_intervals(self, interval: str) -> None:
        config = decode(gpu({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}))
        assert config.sharing == SharingConfig(Strategy.TIME_SLICING, TimeSliceInterval(interval))

    def test_time_slicing_without_interval_is_default(self) -> None:
        # Their Normalize fills in Default when timeSlicingConfig is left out.
        assert decode(gpu({"strategy": "TimeSlicing"})).sharing.interval is TimeSliceInterval.DEFAULT
        assert decode(gpu({"strategy": "TimeSlicing", "timeSlicingConfig": {}})).sharing.interval \
            is TimeSliceInterval.DEFAULT

    def test_mps_with_their_fields(self) -> None:
        config = decode(gpu({"strategy": "MPS", "mpsConfig": {
            "defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi",
            "defaultPerDevicePinnedMemoryLimit": {"1": "4Gi", "GPU-aaaa-bbbb": "2Gi", "0": 3 * 2**30},
            "multiUser": False}}))
        assert config.sharing == SharingConfig(Strategy.MPS, None, MpsSettings(50, "10Gi", 10 * 2**30))
        assert config.per_device_pinned_memory == (
            ("0", MemoryLimit(str(3 * 2**30), 3 * 2**30)), ("1", MemoryLimit("4Gi", 4 * 2**30)),
            ("GPU-aaaa-bbbb", MemoryLimit("2Gi", 2 * 2**30)))

    def test_mps_without_config(self) -> None:
        assert decode(gpu({"strategy": "MPS"})).sharing == SharingConfig(Strategy.MPS, None, MpsSettings())
        assert decode(gpu({"strategy": "MPS", "mpsConfig": {}})).sharing.mps == MpsSettings()

    def test_a_limit_may_be_a_json_number(self) -> None:
        # Go's resource.Quantity reads a number as well as a string.
        limit = decode(gpu({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": 2**30}})).sharing.mps
        assert limit == MpsSettings(None, str(2**30), 2**30)
        as_float = decode(gpu({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": float(2**30)}}))
        assert as_float.sharing.mps == limit

    def test_mig_device_config(self) -> None:
        assert decode(mig({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 25}})).sharing == \
            SharingConfig(Strategy.MPS, None, MpsSettings(25))
        # Their MIG Validate lets TimeSlicing through; it sets nothing (no interval on a MIG device).
        assert decode(mig({"strategy": "TimeSlicing"})).sharing == \
            SharingConfig(Strategy.TIME_SLICING, TimeSliceInterval.DEFAULT)

    def test_is_nvidia(self) -> None:
        assert is_nvidia(gpu())
        assert not is_nvidia({"apiVersion": "gpu.dra-driver.io/v1alpha1"})
        assert not is_nvidia("resource.nvidia.com/v1beta1")


class TestRefused:
    @pytest.mark.parametrize(("parameters", "path"), [
        ({**gpu(), "metadata": {}}, "metadata"),
        (gpu({"strategy": "MPS", "mps": {}}), "sharing.mps"),  # this driver's spelling, not theirs
        (gpu({"strategy": "TimeSlicing", "timeSlicing": {}}), "sharing.timeSlicing"),
        (gpu({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long", "length": 1}}),
         "sharing.timeSlicingConfig.length"),
        (gpu({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercent": 50}}),
         "sharing.mpsConfig.defaultActiveThreadPercent"),
        (gpu({"Strategy": "MPS"}), "sharing.Strategy"),  # case matters, as in their decoder
        (mig({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}), "sharing.timeSlicingConfig"),
    ])
    def test_unknown_field_is_named(self, parameters: dict[str, Any], path: str) -> None:
        error = refused(parameters)
        assert error.path == path
        assert str(error).startswith(f"{path}: unknown field (allowed: ")

    def test_mps_config_with_time_slicing(self) -> None:
        error = refused(gpu({"strategy": "TimeSlicing", "mpsConfig": {"defaultActiveThreadPercentage": 50}}))
        assert str(error) == "sharing.mpsConfig: cannot be used with strategy TimeSlicing"
        # Their MIG path ignores it silently; here it is refused too, never dropped.
        assert refused(mig({"strategy": "TimeSlicing", "mpsConfig": {}})).path == "sharing.mpsConfig"

    def test_time_slicing_config_with_mps(self) -> None:
        error = refused(gpu({"strategy": "MPS", "timeSlicingConfig": {"interval": "Long"}}))
        assert str(error) == "sharing.timeSlicingConfig: cannot be used with strategy MPS"

    @pytest.mark.parametrize(("strategy", "message"), [
        (None, "sharing.strategy: must be set: TimeSlicing or MPS"),
        ("Exclusive", "sharing.strategy: must be one of TimeSlicing, MPS, got 'Exclusive'"),
        ("mps", "sharing.strategy: must be one of TimeSlicing, MPS, got 'mps'"),
        (1, "sharing.strategy: must be a string, one of TimeSlicing, MPS; got integer"),
    ])
    def test_strategy(self, strategy: Any, message: str) -> None:
        sharing = {} if strategy is None else {"strategy": strategy}
        assert str(refused(gpu(sharing))).startswith(message)

    def test_interval(self) -> None:
        error = refused(gpu({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "VeryLong"}}))
        assert str(error) == ("sharing.timeSlicingConfig.interval: must be one of Default, Short, Medium, Long, "
                              "got 'VeryLong'")

    @pytest.mark.parametrize(("value", "message"), [
        (101, "must be between 1 and 100, got 101"),
        (-1, "must be between 1 and 100, got -1"),
        (0, "must be between 1 and 100, got 0"),
        ("50", "must be an integer, got string"),
        (True, "must be an integer, got boolean"),
    ])
    def test_active_thread_percentage(self, value: Any, message: str) -> None:
        error = refused(gpu({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": value}}))
        assert str(error) == f"sharing.mpsConfig.defaultActiveThreadPercentage: {message}"

    @pytest.mark.parametrize(("value", "message"), [
        ("1M", "must be at least 1Mi, got '1M'"),  # their Megabyte() is 0 for it: "value set too low"
        ("ten", "must be a quantity such as \"10Gi\" or \"512M\", got 'ten'"),
        ([], "must be a quantity string such as \"10Gi\", got array"),
    ])
    def test_pinned_memory_limit(self, value: Any, message: str) -> None:
        error = refused(gpu({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": value}}))
        assert str(error) == f"sharing.mpsConfig.defaultPinnedDeviceMemoryLimit: {message}"

    def test_per_device_limits(self) -> None:
        def per_device(value: Any) -> ConfigError:
            return refused(gpu({"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": value}}))
        assert per_device(["1Gi"]).path == "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit"
        assert per_device({"gpu-0": "1Gi"}).path == "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.gpu-0"
        assert "index among the config's devices" in str(per_device({"-1": "1Gi"}))
        assert str(per_device({"0": "1M"})) == \
            "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit.0: must be at least 1Mi, got '1M'"

    def test_multi_user(self) -> None:
        error = refused(gpu({"strategy": "MPS", "mpsConfig": {"multiUser": True}}))
        assert error.path == "sharing.mpsConfig.multiUser" and "not supported by this driver" in str(error)
        assert refused(gpu({"strategy": "MPS", "mpsConfig": {"multiUser": "yes"}})).detail == \
            "must be a boolean, got string"

    @pytest.mark.parametrize(("kind", "feature"), [
        ("VfioDeviceConfig", "VFIO passthrough"),
        ("ComputeDomainChannelConfig", "ComputeDomains (IMEX channels)"),
        ("ComputeDomainDaemonConfig", "ComputeDomains (IMEX daemons)"),
        ("ComputeDomain", "ComputeDomains"),
    ])
    def test_kinds_of_features_this_driver_lacks(self, kind: str, feature: str) -> None:
        # The kind is the answer, before any field of it (a VfioDeviceConfig's iommu is no unknown field).
        error = refused({"apiVersion": API_VERSION, "kind": kind, "iommu": {"backendPolicy": "LegacyOnly"},
                         "domainID": "x"})
        assert error.path == "kind"
        assert str(error).startswith(f"kind: {kind} is NVIDIA's {feature}")
        assert "which this driver does not support" in str(error)

    def test_kind_and_version(self) -> None:
        assert str(refused({"apiVersion": API_VERSION})) == "kind: must be set: GpuConfig or MigDeviceConfig"
        assert str(refused(gpu(kind="MigConfig"))) == "kind: must be one of GpuConfig, MigDeviceConfig, got 'MigConfig'"
        assert refused({"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"}).path == "apiVersion"
        assert str(refused("GpuConfig")) == "must be an object, got string"
        assert refused(gpu("MPS")).path == "sharing"


VALID = [
    gpu(),
    gpu({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}),
    gpu({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi",
                                          "defaultPerDevicePinnedMemoryLimit": {"0": "1Gi"}, "multiUser": False}}),
    mig({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 10}}),
]


@given(st.data())
def test_mutated_valid_configs_decode_or_name_a_field(data: st.DataObject) -> None:
    """Any change to a valid config decodes, or fails with a message that starts with a field's path."""
    try:
        config = decode(mutate(data.draw(st.sampled_from(VALID)), data))
    except ConfigError as exc:
        assert (exc.path and str(exc).startswith(exc.path + ": ")) or str(exc).startswith("must be an object"), str(exc)
        return
    assert isinstance(config, NvidiaConfig)
