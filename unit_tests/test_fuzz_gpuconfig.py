"""Fuzzing the opaque GpuConfig decoder: any JSON gives a GpuConfig or a ConfigError naming a field."""

from __future__ import annotations

from typing import Any

from fuzzing import TEXT, json_values, mutate
from hypothesis import given
from hypothesis import strategies as st

from dra_driver import CONFIG_API_VERSION
from dra_driver.gpuconfig import ConfigError, GpuConfig, decode, encode
from dra_driver.opaqueconfig import Target, resolve_sharing

DRIVER = "gpu.dra-driver.io"
VALID = [
    {"apiVersion": CONFIG_API_VERSION, "kind": "GpuConfig"},
    {"apiVersion": CONFIG_API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing",
                                                                        "timeSlicing": {"interval": "Long"}}},
    {"apiVersion": CONFIG_API_VERSION, "kind": "GpuConfig", "sharing": {
        "strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"}}},
]


def check(parameters: Any) -> None:
    try:
        config = decode(parameters)
    except ConfigError as exc:
        message = str(exc)
        if exc.path:
            # The path names the offending field (for an unknown field: that field, spelled as given).
            assert message.startswith(exc.path + ": ")
        else:  # only the document itself can be wrong without a field to blame
            assert message.startswith("must be an object"), message
        assert "Traceback" not in message and len(message) < 10_000
        return
    assert isinstance(config, GpuConfig)
    assert decode(encode(config)) == config, "a decoded config must round-trip"


@given(json_values())
def test_arbitrary_json(value: Any) -> None:
    check(value)


@given(st.data())
def test_mutated_valid_configs(data: st.DataObject) -> None:
    check(mutate(data.draw(st.sampled_from(VALID)), data))


NVIDIA_VALID = [
    {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {
        "strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"0": "1Gi", "GPU-1": "2Gi"}}}},
    {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing"}},
]


@given(st.lists(st.one_of(json_values(10), st.fixed_dictionaries({
    "source": st.sampled_from(["FromClass", "FromClaim", "Other"]),
    "requests": st.one_of(st.lists(st.one_of(TEXT, st.sampled_from(["a", "b"])), max_size=3), json_values(3)),
    "opaque": st.fixed_dictionaries({"driver": st.sampled_from([DRIVER, "other"]),
                                     "parameters": st.one_of(st.sampled_from(VALID + NVIDIA_VALID),
                                                             json_values(10))}),
})), max_size=5), TEXT)
def test_resolve_config_over_arbitrary_config_lists(configs: list[Any], request: str) -> None:
    """Either API, full GPUs and MIG devices, UUIDs known or not: a sharing per device, or an error
    that names the entry's field."""
    targets = [Target(request, "gpu-0", False, "GPU-0"), Target("a", "gpu-1", False, "GPU-1"),
               Target("b", "gpu-2-mig-0", True, "MIG-2"), Target("b", "gpu-3-mig-1", True, "")]
    try:
        assert len(resolve_sharing(configs, targets, DRIVER)) == len(targets)
    except ConfigError as exc:
        assert str(exc).startswith("devices.config["), str(exc)


def test_regression_empty_unknown_field_is_named() -> None:
    # Found by test_arbitrary_json: {"": null} gave "unknown field (...)" with an empty path.
    for value, path in (({"": None}, "''"), ({1: 2}, "1"),
                        ({"apiVersion": CONFIG_API_VERSION, "kind": "GpuConfig", "sharing": {"": 1}}, "sharing.''")):
        try:
            decode(value)
        except ConfigError as exc:
            assert exc.path == path
            assert str(exc).startswith(f"{path}: unknown field")
        else:
            raise AssertionError(f"{value!r} decoded")


def test_regression_huge_integer_memory_limit_is_rejected_like_its_string() -> None:
    # Found by test_regression_examples' round-trip check: 10**400 as a JSON integer decoded, but the
    # stored text form ("1000...") did not, so a prepared claim's config could not be read back.
    for mem in (10**400, str(10**400)):
        value = {"apiVersion": CONFIG_API_VERSION, "kind": "GpuConfig",
                 "sharing": {"strategy": "MPS", "mps": {"defaultPinnedDeviceMemoryLimit": mem}}}
        try:
            decode(value)
        except ConfigError as exc:
            assert exc.path == "sharing.mps.defaultPinnedDeviceMemoryLimit"
        else:
            raise AssertionError(f"{mem!r} accepted")


def test_regression_examples() -> None:
    # Shapes that once looked risky: non-string keys, huge numbers, nested nonsense.
    for value in ({1: 2}, {"apiVersion": CONFIG_API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": ["MPS"]}},
                  {"apiVersion": CONFIG_API_VERSION, "kind": "GpuConfig",
                   "sharing": {"strategy": "MPS", "mps": {"defaultPinnedDeviceMemoryLimit": 10**400}}},
                  {"apiVersion": CONFIG_API_VERSION, "kind": "GpuConfig",
                   "sharing": {"strategy": "MPS", "mps": {"defaultPinnedDeviceMemoryLimit": "1e309"}}}):
        check(value)
