"""GpuConfig decoding and config precedence."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dra_driver import CONFIG_API_VERSION, DEFAULT_DRIVER_NAME
from dra_driver.gpuconfig import (
    DEFAULT_CONFIG,
    EXCLUSIVE,
    ConfigError,
    SharingConfig,
    Strategy,
    TimeSliceInterval,
    decode,
    decode_sharing,
    encode,
    matching_configs,
    request_matches,
)
from dra_driver.opaqueconfig import Target
from dra_driver.opaqueconfig import resolve_sharing as resolve_claim

DRIVER = DEFAULT_DRIVER_NAME
REPO = Path(__file__).resolve().parents[1]


def cfg(sharing: Any = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"apiVersion": CONFIG_API_VERSION, "kind": "GpuConfig", **extra}
    if sharing is not None:
        out["sharing"] = sharing
    return out


def resolve_sharing(configs: Any, request: str, driver: str) -> SharingConfig:
    """The sharing of one full GPU allocated for ``request``."""
    return resolve_claim(configs, [Target(request, "gpu-0", False, "GPU-0")], driver)[0]


def entry(params: Any, source: str = "FromClaim", requests: list[str] | None = None, driver: str = DRIVER) -> dict:
    return {"source": source, "requests": requests or [], "opaque": {"driver": driver, "parameters": params}}


class TestDecode:
    def test_minimal_is_exclusive(self) -> None:
        assert decode(cfg()) == DEFAULT_CONFIG
        assert decode(cfg()).sharing.strategy is Strategy.EXCLUSIVE
        assert not decode(cfg()).sharing.allows_sharing

    def test_time_slicing_default_interval(self) -> None:
        s = decode(cfg({"strategy": "TimeSlicing"})).sharing
        assert s.strategy is Strategy.TIME_SLICING and s.interval is TimeSliceInterval.DEFAULT
        assert s.describe() == "TimeSlicing:Default"

    def test_time_slicing_long(self) -> None:
        s = decode(cfg({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}})).sharing
        assert s.interval is TimeSliceInterval.LONG
        assert s.describe() == "TimeSlicing:Long"
        assert s.allows_sharing

    def test_mps(self) -> None:
        s = decode(cfg({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 50,
                                                   "defaultPinnedDeviceMemoryLimit": "10Gi"}})).sharing
        assert s.mps is not None
        assert s.mps.default_active_thread_percentage == 50
        assert s.mps.default_pinned_device_memory_limit_bytes == 10 * 2**30
        assert s.describe() == "MPS:defaultActiveThreadPercentage=50,defaultPinnedDeviceMemoryLimit=10Gi"

    def test_mps_without_limits(self) -> None:
        s = decode(cfg({"strategy": "MPS"})).sharing
        assert s.describe() == "MPS"

    def test_nulls_are_absent(self) -> None:
        assert decode(cfg({"strategy": None, "timeSlicing": None, "mps": None})) == DEFAULT_CONFIG

    def test_round_trip(self) -> None:
        for sharing in ({"strategy": "Exclusive"}, {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Short"}},
                        {"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 1}}):
            c = decode(cfg(sharing))
            assert decode(encode(c)) == c
            assert decode_sharing(c.sharing.to_dict()) == c.sharing

    @pytest.mark.parametrize(
        ("params", "path", "fragment"),
        [
            ([], "", "must be an object, got array"),
            (cfg(foo=1), "foo", "unknown field"),
            ({"kind": "GpuConfig"}, "apiVersion", "got nothing"),
            ({"apiVersion": "gpu.dra-driver.io/v1", "kind": "GpuConfig"}, "apiVersion", "'gpu.dra-driver.io/v1'"),
            ({"apiVersion": CONFIG_API_VERSION, "kind": "MigConfig"}, "kind", "'MigConfig'"),
            ({"apiVersion": CONFIG_API_VERSION}, "kind", "got nothing"),
            (cfg("MPS"), "sharing", "must be an object, got string"),
            (cfg({"strategy": "Shared"}), "sharing.strategy", "must be one of Exclusive, TimeSlicing, MPS"),
            (cfg({"strategy": 3}), "sharing.strategy", "must be a string"),
            (cfg({"strategy": "MPS", "extra": True}), "sharing.extra", "unknown field"),
            (cfg({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Forever"}}),
             "sharing.timeSlicing.interval", "must be one of Default, Short, Medium, Long"),
            (cfg({"strategy": "TimeSlicing", "timeSlicing": {"intervl": "Long"}}),
             "sharing.timeSlicing.intervl", "unknown field"),
            (cfg({"strategy": "TimeSlicing", "timeSlicing": []}), "sharing.timeSlicing", "must be an object"),
            (cfg({"timeSlicing": {"interval": "Long"}}), "sharing.timeSlicing",
             "only allowed with strategy TimeSlicing"),
            (cfg({"strategy": "TimeSlicing", "mps": {}}), "sharing.mps", "only allowed with strategy MPS"),
            (cfg({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 150}}),
             "sharing.mps.defaultActiveThreadPercentage", "must be between 1 and 100, got 150"),
            (cfg({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 0}}),
             "sharing.mps.defaultActiveThreadPercentage", "must be between 1 and 100, got 0"),
            (cfg({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": "50"}}),
             "sharing.mps.defaultActiveThreadPercentage", "must be an integer, got string"),
            (cfg({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": True}}),
             "sharing.mps.defaultActiveThreadPercentage", "must be an integer, got boolean"),
            (cfg({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 50.5}}),
             "sharing.mps.defaultActiveThreadPercentage", "must be an integer, got number"),
            (cfg({"strategy": "MPS", "mps": {"defaultPinnedDeviceMemoryLimit": "ten gigs"}}),
             "sharing.mps.defaultPinnedDeviceMemoryLimit", "must be a quantity"),
            (cfg({"strategy": "MPS", "mps": {"defaultPinnedDeviceMemoryLimit": "-1Gi"}}),
             "sharing.mps.defaultPinnedDeviceMemoryLimit", "at least 1Mi"),
            (cfg({"strategy": "MPS", "mps": {"defaultPinnedDeviceMemoryLimit": ["1Gi"]}}),
             "sharing.mps.defaultPinnedDeviceMemoryLimit", "got array"),
        ],
    )
    def test_errors_name_the_field(self, params: Any, path: str, fragment: str) -> None:
        with pytest.raises(ConfigError) as info:
            decode(params)
        assert info.value.path == path
        assert str(info.value).startswith(f"{path}: " if path else "")
        assert fragment in str(info.value)

    def test_example_message(self) -> None:
        with pytest.raises(ConfigError, match=r"^sharing\.mps\.defaultActiveThreadPercentage: must be between 1 "
                                              r"and 100, got 150$"):
            decode(cfg({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 150}}))

    @settings(max_examples=300, deadline=None)
    @given(st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
        lambda children: st.lists(children, max_size=3) | st.dictionaries(
            st.sampled_from(["apiVersion", "kind", "sharing", "strategy", "mps", "timeSlicing", "interval",
                             "defaultActiveThreadPercentage", "defaultPinnedDeviceMemoryLimit", "x"]),
            children, max_size=4),
        max_leaves=12,
    ))
    def test_never_anything_but_config_error(self, value: Any) -> None:
        for candidate in (value, cfg(value)):
            with contextlib.suppress(ConfigError):
                decode(candidate)


class TestCompatibility:
    def test_rules(self) -> None:
        ex = decode(cfg()).sharing
        ts_d = decode(cfg({"strategy": "TimeSlicing"})).sharing
        ts_l = decode(cfg({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}})).sharing
        mps_a = decode(cfg({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 10}})).sharing
        mps_b = decode(cfg({"strategy": "MPS"})).sharing
        assert not ex.compatible_with(ex)
        assert not ex.compatible_with(ts_d) and not ts_d.compatible_with(ex)
        assert ts_d.compatible_with(ts_d)
        assert not ts_d.compatible_with(ts_l)
        assert mps_a.compatible_with(mps_b)
        assert not mps_a.compatible_with(ts_d)


class TestPrecedence:
    def test_request_matching(self) -> None:
        assert request_matches([], "gpu")
        assert request_matches(None, "gpu/sub")
        assert request_matches(["gpu"], "gpu")
        assert request_matches(["gpu"], "gpu/big")  # main request covers its subrequests
        assert request_matches(["gpu/big"], "gpu/big")
        assert not request_matches(["gpu/big"], "gpu/small")
        assert not request_matches(["gpu/big"], "gpu")
        assert not request_matches(["other"], "gpu")
        assert not request_matches(["gp"], "gpu")

    def test_no_config_is_exclusive(self) -> None:
        assert resolve_sharing([], "gpu", DRIVER) == EXCLUSIVE
        assert resolve_sharing(None, "gpu", DRIVER) == EXCLUSIVE

    def test_other_driver_ignored_even_if_invalid(self) -> None:
        configs = [entry({"garbage": True}, driver="other.example.com")]
        assert resolve_sharing(configs, "gpu", DRIVER) == EXCLUSIVE

    def test_claim_beats_class_regardless_of_order(self) -> None:
        configs = [
            entry(cfg({"strategy": "MPS"}), source="FromClaim"),
            entry(cfg({"strategy": "TimeSlicing"}), source="FromClass"),
        ]
        assert resolve_sharing(configs, "gpu", DRIVER).strategy is Strategy.MPS
        assert [m.index for m in matching_configs(configs, "gpu", DRIVER)] == [1, 0]

    def test_later_wins_within_source(self) -> None:
        configs = [
            entry(cfg({"strategy": "MPS"})),
            entry(cfg({"strategy": "TimeSlicing", "timeSlicing": {"interval": "Short"}})),
        ]
        s = resolve_sharing(configs, "gpu", DRIVER)
        assert s.strategy is Strategy.TIME_SLICING and s.interval is TimeSliceInterval.SHORT

    def test_request_filter(self) -> None:
        configs = [
            entry(cfg({"strategy": "MPS"}), requests=["a"]),
            entry(cfg({"strategy": "TimeSlicing"}), requests=["b/big"]),
        ]
        assert resolve_sharing(configs, "a", DRIVER).strategy is Strategy.MPS
        assert resolve_sharing(configs, "a/x", DRIVER).strategy is Strategy.MPS
        assert resolve_sharing(configs, "b/big", DRIVER).strategy is Strategy.TIME_SLICING
        assert resolve_sharing(configs, "b/small", DRIVER).strategy is Strategy.EXCLUSIVE
        assert resolve_sharing(configs, "c", DRIVER).strategy is Strategy.EXCLUSIVE

    def test_invalid_overridden_config_still_errors_with_index(self) -> None:
        configs = [
            entry(cfg({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 150}})),
            entry(cfg({"strategy": "MPS"})),
        ]
        with pytest.raises(ConfigError) as info:
            resolve_sharing(configs, "gpu", DRIVER)
        assert str(info.value) == ("devices.config[0].opaque.parameters.sharing.mps.defaultActiveThreadPercentage: "
                                   "must be between 1 and 100, got 150")

    def test_entries_without_opaque_skipped(self) -> None:
        assert resolve_sharing([{"source": "FromClaim"}, "junk"], "gpu", DRIVER) == EXCLUSIVE


class TestDocs:
    def test_schema_is_json_and_matches_api(self) -> None:
        schema = json.loads((REPO / "api/config/v1alpha1/gpuconfig.schema.json").read_text())
        assert schema["properties"]["apiVersion"]["const"] == CONFIG_API_VERSION
        assert schema["properties"]["kind"]["const"] == "GpuConfig"
        assert schema["additionalProperties"] is False
        sharing = schema["$defs"]["sharing"]
        assert set(sharing["properties"]) == {"strategy", "timeSlicing", "mps"}
        assert set(schema["$defs"]["mps"]["properties"]) == {"defaultActiveThreadPercentage",
                                                             "defaultPinnedDeviceMemoryLimit"}

    def test_readme_examples_decode(self) -> None:
        import yaml

        text = (REPO / "api/config/v1alpha1/README.md").read_text()
        blocks = text.split("```yaml\n")[1:]
        found = 0
        for block in blocks:
            doc = yaml.safe_load(block.split("```", 1)[0])
            spec = doc.get("spec", {})
            configs = (spec.get("devices", {}) or {}).get("config", []) + spec.get("config", [])
            for c in configs:
                decode(c["opaque"]["parameters"])
                found += 1
        assert found >= 3
