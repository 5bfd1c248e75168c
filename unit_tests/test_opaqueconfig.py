"""Which opaque config applies to each device of a claim, in this driver's API or NVIDIA's: precedence,
NVIDIA's kinds by device type, per-device MPS limits, and NVIDIA's published example configs."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from dra_driver import CONFIG_API_VERSION
from dra_driver.gpuconfig import EXCLUSIVE, ConfigError, GpuConfig, MpsSettings, SharingConfig, Strategy, TimeSliceInterval
from dra_driver.nvidiaconfig import API_VERSION, NvidiaConfig
from dra_driver.opaqueconfig import RequestConfigError, Target, decode, resolve_sharing

DRIVER = "gpu.nvidia.com"
GPU0 = Target("gpu", "gpu-0", False, "GPU-0000")
GPU1 = Target("gpu", "gpu-1", False, "GPU-1111")
MIG0 = Target("mig", "gpu-2-mig-1g5gb-19-0", True, "MIG-2222")


def nvidia(sharing: Any = None, kind: str = "GpuConfig") -> dict[str, Any]:
    out: dict[str, Any] = {"apiVersion": API_VERSION, "kind": kind}
    if sharing is not None:
        out["sharing"] = sharing
    return out


def ours(sharing: Any = None) -> dict[str, Any]:
    out: dict[str, Any] = {"apiVersion": CONFIG_API_VERSION, "kind": "GpuConfig"}
    if sharing is not None:
        out["sharing"] = sharing
    return out


def entry(params: Any, requests: list[str] | None = None, source: str = "FromClaim",
          driver: str = DRIVER) -> dict[str, Any]:
    return {"source": source, "requests": requests or [], "opaque": {"driver": driver, "parameters": params}}


TS_LONG = SharingConfig(Strategy.TIME_SLICING, TimeSliceInterval.LONG)


def refused(configs: list[Any], targets: list[Target]) -> RequestConfigError:
    with pytest.raises(RequestConfigError) as info:
        resolve_sharing(configs, targets, DRIVER)
    return info.value


class TestDecode:
    def test_the_api_version_picks_the_api(self) -> None:
        assert isinstance(decode(ours()), GpuConfig)
        assert isinstance(decode(nvidia()), NvidiaConfig)

    def test_neither_api(self) -> None:
        with pytest.raises(ConfigError) as info:
            decode({"apiVersion": "example.com/v1", "kind": "GpuConfig"})
        assert str(info.value) == (f"apiVersion: must be {CONFIG_API_VERSION!r} or {API_VERSION!r}, "
                                   "got 'example.com/v1'")
        with pytest.raises(ConfigError) as info:
            decode({"kind": "GpuConfig"})
        assert str(info.value).endswith("got nothing")


class TestWhichApplies:
    def test_both_apis_beside_each_other(self) -> None:
        configs = [entry(ours({"strategy": "MPS"}), ["a"]),
                   entry(nvidia({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}), ["b"])]
        a, b = Target("a", "gpu-0", False, "GPU-0"), Target("b", "gpu-1", False, "GPU-1")
        assert resolve_sharing(configs, [a, b], DRIVER) == [SharingConfig(Strategy.MPS, None, MpsSettings()), TS_LONG]

    def test_later_wins_across_apis(self) -> None:
        configs = [entry(nvidia({"strategy": "MPS"}), source="FromClass"), entry(ours({"strategy": "TimeSlicing"}))]
        assert resolve_sharing(configs, [GPU0], DRIVER)[0].strategy is Strategy.TIME_SLICING

    def test_other_drivers_configs_are_not_read(self) -> None:
        configs = [entry(nvidia(kind="VfioDeviceConfig"), driver="gpu.dra-driver.io")]
        assert resolve_sharing(configs, [GPU0], DRIVER) == [EXCLUSIVE]

    def test_a_gpu_config_for_every_request_passes_over_mig_devices(self) -> None:
        # As in their driver: a config without requests applies to the devices of its type only.
        configs = [entry(nvidia({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}))]
        assert resolve_sharing(configs, [GPU0, MIG0], DRIVER) == [TS_LONG, EXCLUSIVE]
        configs.append(entry(nvidia({"strategy": "MPS"}, kind="MigDeviceConfig")))
        assert [s.strategy for s in resolve_sharing(configs, [GPU0, MIG0], DRIVER)] == \
            [Strategy.TIME_SLICING, Strategy.MPS]

    def test_a_lower_entry_of_the_right_type_applies(self) -> None:
        configs = [entry(nvidia({"strategy": "MPS"}, kind="MigDeviceConfig")),
                   entry(nvidia({"strategy": "TimeSlicing"}))]
        assert resolve_sharing(configs, [MIG0], DRIVER)[0].strategy is Strategy.MPS

    def test_a_config_naming_a_request_of_the_other_type_is_an_error(self) -> None:
        error = refused([entry(nvidia({"strategy": "TimeSlicing"}), ["mig"])], [MIG0])
        assert error.request == "mig"
        assert str(error) == ("devices.config[0].opaque.parameters.kind: GpuConfig cannot be applied to device "
                              "'gpu-2-mig-1g5gb-19-0' of request 'mig', a MIG device; use MigDeviceConfig")
        error = refused([entry(nvidia(kind="MigDeviceConfig"), ["gpu"])], [GPU0])
        assert "a full GPU; use GpuConfig" in str(error)

    def test_our_config_applies_to_both_types(self) -> None:
        assert resolve_sharing([entry(ours({"strategy": "MPS"}))], [GPU0, MIG0], DRIVER) == \
            [SharingConfig(Strategy.MPS, None, MpsSettings())] * 2

    def test_an_invalid_overridden_entry_is_still_an_error(self) -> None:
        configs = [entry(nvidia({"strategy": "MPS", "mpsConfig": {"bogus": 1}})), entry(ours())]
        error = refused(configs, [GPU0])
        assert str(error).startswith("devices.config[0].opaque.parameters.sharing.mpsConfig.bogus: unknown field")

    def test_an_unsupported_kind_fails_the_request(self) -> None:
        configs = [entry({"apiVersion": API_VERSION, "kind": "VfioDeviceConfig",
                          "iommu": {"backendPolicy": "LegacyOnly", "enableAPIDevice": True}}, ["gpu"])]
        error = refused(configs, [GPU0])
        assert error.request == "gpu" and error.path == "devices.config[0].opaque.parameters.kind"
        assert "VfioDeviceConfig is NVIDIA's VFIO passthrough" in str(error)


class TestPerDeviceLimits:
    def mps(self, **mps_config: Any) -> list[dict[str, Any]]:
        return [entry(nvidia({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 40, **mps_config}}))]

    def test_by_index_in_uuid_order_and_by_uuid(self) -> None:
        # Their MPS daemon lists the config's devices by UUID, sorted; an index counts in that list.
        configs = self.mps(defaultPinnedDeviceMemoryLimit="8Gi", defaultPerDevicePinnedMemoryLimit={"1": "2Gi"})
        first, second = resolve_sharing(configs, [GPU1, GPU0], DRIVER)  # GPU-0000 is index 0
        assert first.mps == MpsSettings(40, "2Gi", 2 * 2**30)
        assert second.mps == MpsSettings(40, "8Gi", 8 * 2**30)
        by_uuid = self.mps(defaultPerDevicePinnedMemoryLimit={"GPU-0000": "1Gi"})
        assert [s.mps for s in resolve_sharing(by_uuid, [GPU0, GPU1], DRIVER)] == \
            [MpsSettings(40, "1Gi", 2**30), MpsSettings(40)]

    def test_mig_devices_by_their_own_uuid(self) -> None:
        configs = [entry(nvidia({"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {
            "MIG-2222": "3Gi"}}}, kind="MigDeviceConfig"))]
        assert resolve_sharing(configs, [MIG0], DRIVER)[0].mps == MpsSettings(None, "3Gi", 3 * 2**30)

    def test_the_devices_are_those_of_the_entry(self) -> None:
        # Two entries, one device each: index 0 is each entry's own device.
        configs = [entry(nvidia({"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"0": "1Gi"}}}),
                         ["a"]),
                   entry(nvidia({"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"0": "2Gi"}}}),
                         ["b"])]
        a, b = Target("a", "gpu-0", False, "GPU-0"), Target("b", "gpu-1", False, "GPU-1")
        assert [s.mps.default_pinned_device_memory_limit for s in resolve_sharing(configs, [a, b], DRIVER)
                if s.mps is not None] == ["1Gi", "2Gi"]

    def test_a_key_that_names_no_device(self) -> None:
        error = refused(self.mps(defaultPerDevicePinnedMemoryLimit={"2": "1Gi"}), [GPU0, GPU1])
        assert str(error) == ("devices.config[0].opaque.parameters.sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit"
                              ".2: names no device of this config, which applies to 2 device(s): indices 0 to 1 or "
                              "UUIDs GPU-0000, GPU-1111")
        assert "names no device" in str(refused(self.mps(defaultPerDevicePinnedMemoryLimit={"GPU-9": "1Gi"}), [GPU0]))

    def test_two_keys_for_one_device(self) -> None:
        error = refused(self.mps(defaultPerDevicePinnedMemoryLimit={"0": "1Gi", "GPU-0000": "2Gi"}), [GPU0])
        assert "names device GPU-0000, which '0' names too" in str(error)

    def test_a_device_without_uuid_yet(self) -> None:
        dynamic = Target("mig", "gpu-3-mig-1g5gb-19-0", True, "")
        configs = [entry(nvidia({"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"0": "1Gi"}}},
                                kind="MigDeviceConfig"))]
        assert "no UUID before it is created" in str(refused(configs, [dynamic]))
        # Without per-device limits a dynamic MIG device is fine.
        plain = [entry(nvidia({"strategy": "MPS"}, kind="MigDeviceConfig"))]
        assert resolve_sharing(plain, [dynamic], DRIVER)[0].strategy is Strategy.MPS


# NVIDIA's published quickstart configs, in their shapes (written here, not copied): each decodes to
# the sharing its README describes.
QUICKSTART_TEST5 = """
devices:
  requests:
  - name: ts-gpu
    exactly: {deviceClassName: gpu.nvidia.com}
  - name: mps-gpu
    exactly: {deviceClassName: gpu.nvidia.com}
  config:
  - requests: ["ts-gpu"]
    opaque:
      driver: gpu.nvidia.com
      parameters:
        apiVersion: resource.nvidia.com/v1beta1
        kind: GpuConfig
        sharing:
          strategy: TimeSlicing
          timeSlicingConfig:
            interval: Long
  - requests: ["mps-gpu"]
    opaque:
      driver: gpu.nvidia.com
      parameters:
        apiVersion: resource.nvidia.com/v1beta1
        kind: GpuConfig
        sharing:
          strategy: MPS
          mpsConfig:
            defaultActiveThreadPercentage: 50
            defaultPinnedDeviceMemoryLimit: 10Gi
"""

QUICKSTART_TEST6 = """
devices:
  requests:
  - name: gpu
    exactly:
      deviceClassName: gpu.nvidia.com
      selectors:
      - cel: {expression: "device.attributes['gpu.nvidia.com'].productName.lowerAscii().matches('^.*a100.*$')"}
  config:
  - requests: ["gpu"]
    opaque:
      driver: gpu.nvidia.com
      parameters:
        apiVersion: resource.nvidia.com/v1beta1
        kind: GpuConfig
        sharing: {strategy: TimeSlicing, timeSlicingConfig: {interval: Long}}
"""

QUICKSTART_VFIO = """
devices:
  requests:
  - name: gpu
    exactly: {deviceClassName: vfio.gpu.nvidia.com}
  config:
  - requests: ["gpu"]
    opaque:
      driver: gpu.nvidia.com
      parameters:
        apiVersion: resource.nvidia.com/v1beta1
        kind: VfioDeviceConfig
        iommu: {backendPolicy: LegacyOnly, enableAPIDevice: true}
"""


def allocated_configs(spec_text: str) -> list[dict[str, Any]]:
    """The claim spec's configs as the scheduler copies them into status.allocation.devices.config."""
    return [{**c, "source": "FromClaim"} for c in yaml.safe_load(spec_text)["devices"]["config"]]


class TestNvidiaExamples:
    def test_gpu_test5_time_slicing_long_and_mps(self) -> None:
        targets = [Target("ts-gpu", "gpu-0", False, "GPU-0"), Target("mps-gpu", "gpu-1", False, "GPU-1")]
        assert resolve_sharing(allocated_configs(QUICKSTART_TEST5), targets, DRIVER) == [
            TS_LONG, SharingConfig(Strategy.MPS, None, MpsSettings(50, "10Gi", 10 * 2**30))]

    def test_gpu_test6_time_slicing(self) -> None:
        assert resolve_sharing(allocated_configs(QUICKSTART_TEST6), [GPU0], DRIVER) == [TS_LONG]

    def test_vfio_is_refused_by_kind(self) -> None:
        error = refused(allocated_configs(QUICKSTART_VFIO), [GPU0])
        assert "VfioDeviceConfig is NVIDIA's VFIO passthrough" in str(error)
