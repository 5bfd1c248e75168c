"""Consumable shares: the flag, what the node publishes, and how Prepare treats shares."""

from __future__ import annotations

import argparse
import hashlib
import json
import uuid
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nodefix import DRIVER, MPS, NODE, TS, Env, build_devices, env_of, gpu_config, make_claim, make_gpu

from dra_driver.gpuconfig import decode_sharing
from dra_driver.k8s.quantity import parse_quantity
from dra_driver.node.describe.devices import describe, describe_device, enumerate_devices
from dra_driver.node.describe.shares import DISABLED, ConsumableShares, SharesMode, parse_consumable_shares, shared_capacity
from dra_driver.node.prepare.calls import ShareError
from dra_driver.node.prepare.checkpoint import CheckpointStore, canonical
from dra_driver.node.prepare.exclusive import coexistence_problem
from dra_driver.node.prepare.plan import ShareAmounts, mps_for_share, share_amounts
from dra_driver.node.settings import add_plugin_arguments, plugin_settings

GI = 2**30
MI = 2**20
H100_MEMORY = 81559 * MI
MEMORY_MODE = ConsumableShares(SharesMode.MEMORY)
FOUR = ConsumableShares(SharesMode.COUNT, 4)


# --- the flag ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "want"), [
    ("disabled", DISABLED), ("", DISABLED), ("memory", MEMORY_MODE), ("Unlimited", ConsumableShares(SharesMode.UNLIMITED)),
    ("4", FOUR), ("1", ConsumableShares(SharesMode.COUNT, 1)),
])
def test_parse(text: str, want: ConsumableShares) -> None:
    assert parse_consumable_shares(text) == want


@pytest.mark.parametrize("text", ["0", "-1", "mem", "4.5", "1e3", "99999999"])
def test_parse_rejects_with_the_flag_named(text: str) -> None:
    with pytest.raises(ValueError, match="--consumable-shares must be disabled, memory, unlimited or an integer"):
        parse_consumable_shares(text)


def _settings(*argv: str) -> Any:
    parser = argparse.ArgumentParser()
    add_plugin_arguments(parser)
    return plugin_settings(parser.parse_args(["--node-name=n", *argv]))


def test_settings_flag_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _settings().consumable_shares == DISABLED
    assert _settings("--consumable-shares=memory").consumable_shares == MEMORY_MODE
    monkeypatch.setenv("CONSUMABLE_SHARES", "4")
    assert _settings().consumable_shares == FOUR
    with pytest.raises(SystemExit):  # argparse: argument --consumable-shares: must be disabled, ...
        _settings("--consumable-shares=lots")


def test_settings_carry_sharing_strategies_and_health_flag() -> None:
    settings = _settings("--sharing-strategies=Exclusive,MPS", "--no-health-monitoring")
    assert settings.sharing_strategies == ("Exclusive", "MPS")
    assert settings.health_monitoring is False


# --- publishing ----------------------------------------------------------------------------------

def _q(text: str) -> Fraction:
    return parse_quantity(text).value


def api_policy_errors(capacity: dict[str, Any]) -> list[str]:
    """The API server's checks of a validRange request policy (resource/v1 validation)."""
    errors = []
    total = _q(capacity["value"])
    policy = capacity["requestPolicy"]
    default, rng = _q(policy["default"]), policy["validRange"]
    low = _q(rng["min"])
    if low > total:
        errors.append("min is larger than capacity")
    if default < low:
        errors.append("default is less than min")
    if "max" in rng:
        high = _q(rng["max"])
        if low > high or high > total or default > high:
            errors.append("max out of order")
    if "step" in rng:
        step = _q(rng["step"])
        if step <= 0 or low + step > total:
            errors.append("one step is larger than capacity")
        for value in [default] + ([_q(rng["max"])] if "max" in rng else []):
            if (value - low) % step:
                errors.append(f"{value} is not a multiple of the step from min")
    return errors


@given(memory_mib=st.integers(min_value=2, max_value=4 * 2**20), sms=st.integers(min_value=0, max_value=500),
       mode=st.sampled_from([MEMORY_MODE, ConsumableShares(SharesMode.UNLIMITED), FOUR,
                             ConsumableShares(SharesMode.COUNT, 1)]))
def test_every_published_policy_passes_api_validation(memory_mib: int, sms: int, mode: ConsumableShares) -> None:
    capacity = shared_capacity(memory_mib * MI, sms, mode)
    for name, entry in capacity.items():
        assert api_policy_errors(entry) == [], (name, entry)
    assert ("multiprocessors" in capacity) == (sms > 0)
    assert ("shares" in capacity) == (mode.mode is SharesMode.COUNT)


def test_memory_mode_policy_on_an_h100() -> None:
    cap = shared_capacity(H100_MEMORY, 132, MEMORY_MODE)
    assert cap["memory"] == {"value": "81559Mi", "requestPolicy": {
        "default": "79Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}}
    assert cap["multiprocessors"] == {"value": "132", "requestPolicy": {
        "default": "0", "validRange": {"min": "0", "step": "1"}}}
    # A claim that asks for nothing takes 79Gi: less than one step is left, so nothing fits beside it.
    assert H100_MEMORY - 79 * GI < GI


def test_count_mode_policy() -> None:
    cap = shared_capacity(40 * GI, 108, FOUR)
    assert cap["memory"]["requestPolicy"] == {"default": "0", "validRange": {"min": "0", "step": "1Gi"}}
    assert cap["shares"] == {"value": "4", "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "4", "step": "1"}}}


def test_small_device_steps_in_mebibytes() -> None:
    cap = shared_capacity(1536 * MI, 0, MEMORY_MODE)
    assert cap["memory"]["requestPolicy"] == {"default": "1536Mi", "validRange": {"min": "1Mi", "step": "1Mi"}}


def test_which_devices_are_published_as_shareable() -> None:
    devices = build_devices()
    shareable = {name for name, d in devices.items() if describe_device(d, True, MEMORY_MODE).get("allowMultipleAllocations")}
    # Full GPUs and static MIG devices; never a GPU with a dynamic-MIG catalogue nor its partitions.
    assert shareable == {"gpu-0", "gpu-1", "gpu-2", "gpu-2-mig-0", "gpu-2-mig-1"}
    assert not any(describe_device(d, True).get("allowMultipleAllocations") for d in devices.values())
    mig = describe_device(devices["gpu-2-mig-0"], False, MEMORY_MODE)
    assert mig["capacity"]["memory"]["requestPolicy"]["default"] == "10Gi"
    assert mig["capacity"]["multiprocessors"]["value"] == "16"
    plain = describe_device(devices["gpu-0"], False)
    assert "requestPolicy" not in plain["capacity"]["memory"]


def test_describe_passes_the_mode_to_every_device() -> None:
    gpus = [make_gpu(0), make_gpu(1)]
    devices_json, counters = describe(enumerate_devices(gpus, False), DRIVER, False, FOUR)
    assert counters == []
    assert [d["allowMultipleAllocations"] for d in devices_json] == [True, True]
    assert all(d["capacity"]["shares"]["value"] == "4" for d in devices_json)


# --- reading a share -----------------------------------------------------------------------------

def test_share_amounts() -> None:
    got = share_amounts({"memory": "30Gi", f"{DRIVER}/shares": "2", "multiprocessors": "66"}, DRIVER, 80 * GI, 132, FOUR)
    assert got == ShareAmounts({"memory": "30Gi", "shares": "2", "multiprocessors": "66"}, 30 * GI, 50)
    assert share_amounts(None, DRIVER, 80 * GI, 132, FOUR) == ShareAmounts({})
    # Zero is "none of it": no memory share, and the compute share comes from what was consumed.
    assert share_amounts({"memory": "0", "shares": "1"}, DRIVER, 80 * GI, 132, FOUR) == ShareAmounts(
        {"memory": "0", "shares": "1"}, None, 25)
    assert share_amounts({"multiprocessors": "1"}, DRIVER, 80 * GI, 132, DISABLED).compute_percent == 1


@pytest.mark.parametrize(("consumed", "needle"), [
    ({"memory": "lots"}, "consumedCapacity['memory'] is not a quantity"),
    ({"memory": "-1Gi"}, "whole non-negative"),
    ({"memory": "81Gi"}, "more than the device's 80Gi"),
    ({"shares": "5"}, "more than the device's 4"),
    (["memory"], "must be an object"),
])
def test_share_amounts_refuses(consumed: Any, needle: str) -> None:
    with pytest.raises(ShareError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        share_amounts(consumed, DRIVER, 80 * GI, 132, FOUR)


def test_mps_limits_come_from_the_share() -> None:
    mps = decode_sharing({"strategy": "MPS"})
    got = mps_for_share(mps, ShareAmounts({}, 30 * GI, 50))
    assert got.mps is not None
    assert (got.mps.default_active_thread_percentage, got.mps.default_pinned_device_memory_limit) == (50, "30Gi")
    assert decode_sharing(got.to_dict()) == got  # the checkpoint keeps it
    tighter = decode_sharing({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 20,
                                                          "defaultPinnedDeviceMemoryLimit": "10Gi"}})
    assert mps_for_share(tighter, ShareAmounts({}, 30 * GI, 50)) == tighter
    assert mps_for_share(decode_sharing(TS), ShareAmounts({}, 30 * GI, 50)) == decode_sharing(TS)
    with pytest.raises(ShareError, match=r"defaultPinnedDeviceMemoryLimit 40Gi is more than this share's memory \(30Gi\)"):
        mps_for_share(decode_sharing({"strategy": "MPS", "mps": {"defaultPinnedDeviceMemoryLimit": "40Gi"}}),
                      ShareAmounts({}, 30 * GI, None))
    with pytest.raises(ShareError, match=r"defaultActiveThreadPercentage 60 is more than this share's compute \(50%\)"):
        mps_for_share(decode_sharing({"strategy": "MPS", "mps": {"defaultActiveThreadPercentage": 60}}),
                      ShareAmounts({}, None, 50))


LONG = {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}


@pytest.mark.parametrize(("a", "a_share", "b", "b_share", "ok"), [
    (None, True, None, True, True),
    (None, True, TS, True, True),  # no config = the Default interval
    (LONG, True, LONG, True, True),
    (LONG, True, None, True, False),
    (MPS, True, {"strategy": "MPS"}, True, True),
    (MPS, True, None, True, False),
    (None, True, None, False, False),  # a share beside an exclusive holder
    (TS, True, TS, False, False),
    (TS, False, TS, False, True),
    (None, False, None, False, False),
])
def test_coexistence(a: Any, a_share: bool, b: Any, b_share: bool, ok: bool) -> None:
    sa, sb = decode_sharing(a), decode_sharing(b)
    assert (coexistence_problem(sa, a_share, sb, b_share) is None) is ok
    assert (coexistence_problem(sb, b_share, sa, a_share) is None) is ok


# --- Prepare ------------------------------------------------------------------------------------

def share(device: str, request: str = "gpu", **consumed: str) -> dict[str, Any]:
    result: dict[str, Any] = {"request": request, "device": device, "shareID": str(uuid.uuid4())}
    if consumed:
        result["consumedCapacity"] = consumed
    return result


class ShareEnv(Env):
    def state_options(self) -> dict[str, Any]:
        return {"consumable_shares": FOUR}


@pytest.fixture
def senv(tmp_path: Path) -> ShareEnv:
    return ShareEnv(tmp_path)


def device_env(spec: dict[str, Any], i: int) -> dict[str, str]:
    return env_of(spec["devices"][i]["containerEdits"])


def test_two_claims_share_one_gpu_and_each_container_is_told_its_share(senv: ShareEnv) -> None:
    ra, rb = share("gpu-0", memory="30Gi", shares="1"), share("gpu-0", memory="30Gi", shares="3")
    a = senv.reader.add(make_claim("a", [ra]))
    b = senv.reader.add(make_claim("b", [rb]))
    out = senv.state.prepare([a, b])
    assert out[a.uid].error is None and out[b.uid].error is None
    for ref, result, percent in ((a, ra, "25"), (b, rb, "75")):
        [dev] = out[ref.uid].devices
        assert dev.share_id == result["shareID"]
        assert dev.cdi_device_ids == (f"k8s.{DRIVER}/claim={ref.uid}-gpu-0-{result['shareID']}",)
        spec = senv.spec(ref.uid)
        assert spec["devices"][0]["name"] == f"{ref.uid}-gpu-0-{result['shareID']}"
        got = device_env(spec, 0)
        assert got["DRA_GPU_0_SHARE_ID"] == result["shareID"]
        assert got["DRA_GPU_0_MEMORY_SHARE"] == "30Gi"
        assert got["DRA_GPU_0_MEMORY_SHARE_BYTES"] == str(30 * GI)
        assert got["DRA_GPU_0_COMPUTE_SHARE_PERCENT"] == percent
        assert senv.checkpoint()[ref.uid]["devices"][0]["memoryShareBytes"] == 30 * GI


def test_a_share_that_consumed_no_memory_is_told_nothing_about_memory(senv: ShareEnv) -> None:
    out = senv.prepare_one(make_claim("a", [share("gpu-0", memory="0", shares="1")]))
    assert out.error is None
    [uid] = senv.state.prepared_claims()
    got = device_env(senv.spec(uid), 0)
    assert "DRA_GPU_0_MEMORY_SHARE" not in got and got["DRA_GPU_0_COMPUTE_SHARE_PERCENT"] == "25"


def test_two_shares_of_one_gpu_in_one_claim_are_two_cdi_devices(senv: ShareEnv) -> None:
    big, small = share("gpu-0", "big", memory="40Gi"), share("gpu-0", "small", memory="10Gi")
    claim = make_claim("c", [big, small], config=[gpu_config({"strategy": "MPS"})])
    uid = claim["metadata"]["uid"]
    out = senv.prepare_one(claim)
    assert out.error is None
    assert [d.request_names for d in out.devices] == [("big",), ("small",)]
    spec = senv.spec(uid)
    assert [d["name"] for d in spec["devices"]] == [f"{uid}-gpu-0-{big['shareID']}", f"{uid}-gpu-0-{small['shareID']}"]
    assert device_env(spec, 0)["DRA_GPU_0_MEMORY_SHARE"] == "40Gi"
    assert device_env(spec, 1)["DRA_GPU_1_MEMORY_SHARE"] == "10Gi"
    claim_env = env_of(spec["containerEdits"])
    assert claim_env["DRA_GPU_COUNT"] == "2"
    # One container, one MPS client of that GPU: the pinned-memory limit is both shares together, on each.
    assert device_env(spec, 0)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=51200M"
    assert device_env(spec, 1)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=51200M"


def test_mps_share_gets_limits_from_what_it_consumed(senv: ShareEnv) -> None:
    claim = make_claim("m", [share("gpu-0", memory="30Gi", shares="2")], config=[gpu_config({"strategy": "MPS"})])
    uid = claim["metadata"]["uid"]
    assert senv.prepare_one(claim).error is None
    claim_env = device_env(senv.spec(uid), 0)
    assert claim_env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=30720M"
    assert claim_env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"


def test_mps_limit_larger_than_the_share_is_refused(senv: ShareEnv) -> None:
    result = share("gpu-0", memory="30Gi")
    claim = make_claim("m", [result], config=[gpu_config({"strategy": "MPS", "mps": {"defaultPinnedDeviceMemoryLimit": "40Gi"}})])
    error = senv.prepare_one(claim).error or ""
    assert f"config for request 'gpu' does not fit its share {result['shareID']} of device gpu-0" in error
    assert "defaultPinnedDeviceMemoryLimit 40Gi is more than this share's memory (30Gi)" in error
    assert not senv.spec_exists(claim["metadata"]["uid"])


def test_share_beside_an_exclusive_claim_is_a_conflict_both_ways(senv: ShareEnv) -> None:
    exclusive = senv.reader.add(make_claim("x", [("gpu", "gpu-0")]))
    shared = senv.reader.add(make_claim("s", [share("gpu-0", memory="10Gi")]))
    assert senv.state.prepare([exclusive])[exclusive.uid].error is None
    error = senv.state.prepare([shared])[shared.uid].error or ""
    assert "device gpu-0 is already prepared for claim default/x" in error
    assert "a share of a GPU cannot be prepared beside a claim that holds it without one" in error
    senv.state.unprepare([exclusive])
    assert senv.state.prepare([shared])[shared.uid].error is None
    error = senv.state.prepare([exclusive])[exclusive.uid].error or ""
    assert "already prepared for claim default/s" in error and "as share" in error


def test_mps_and_plain_shares_do_not_mix(senv: ShareEnv) -> None:
    a = senv.reader.add(make_claim("a", [share("gpu-0", memory="10Gi")], config=[gpu_config({"strategy": "MPS"})]))
    b = senv.reader.add(make_claim("b", [share("gpu-0", memory="10Gi")]))
    c = senv.reader.add(make_claim("c", [share("gpu-0", memory="10Gi")], config=[gpu_config({"strategy": "MPS"})]))
    assert senv.state.prepare([a])[a.uid].error is None
    assert "shares of one GPU must all use MPS or none of them" in (senv.state.prepare([b])[b.uid].error or "")
    assert senv.state.prepare([c])[c.uid].error is None


def test_time_slice_of_shares_must_agree(senv: ShareEnv) -> None:
    a = senv.reader.add(make_claim("a", [share("gpu-0", memory="10Gi")], config=[gpu_config(LONG)]))
    b = senv.reader.add(make_claim("b", [share("gpu-0", memory="10Gi")]))
    c = senv.reader.add(make_claim("c", [share("gpu-0", memory="10Gi")], config=[gpu_config(LONG)]))
    assert senv.state.prepare([a])[a.uid].error is None
    assert "same TimeSlicing interval" in (senv.state.prepare([b])[b.uid].error or "")
    assert senv.state.prepare([c])[c.uid].error is None


def test_shares_never_add_up_to_more_memory_than_the_device_has(senv: ShareEnv) -> None:
    a = senv.reader.add(make_claim("a", [share("gpu-0", memory="50Gi")]))
    b = senv.reader.add(make_claim("b", [share("gpu-0", memory="40Gi")]))
    c = senv.reader.add(make_claim("c", [share("gpu-0", memory="30Gi")]))
    assert senv.state.prepare([a])[a.uid].error is None
    error = senv.state.prepare([b])[b.uid].error or ""
    assert "device gpu-0 has 80Gi of memory; shares already prepared for default/a (50Gi) and this claim's 40Gi" in error
    assert senv.state.prepare([c])[c.uid].error is None


@pytest.mark.parametrize(("result", "needle"), [
    ({"request": "gpu", "device": "gpu-0", "shareID": "share-1"}, "results[0]: shareID 'share-1' is not a lower-case"),
    ({"request": "gpu", "device": "gpu-0", "shareID": str(uuid.uuid4()).upper()}, "is not a lower-case RFC 4122 UUID"),
    ({**share("gpu-0"), "consumedCapacity": {"memory": "x"}}, "results[0] (device gpu-0): consumedCapacity['memory']"),
])
def test_bad_share_results_are_per_claim_errors(senv: ShareEnv, result: dict[str, Any], needle: str) -> None:
    claim = make_claim("bad", [result])
    assert needle in (senv.prepare_one(claim).error or "")
    assert senv.state.prepared_claims() == {}


def test_restart_and_reboot_keep_the_share(senv: ShareEnv) -> None:
    result = share("gpu-0", memory="30Gi", shares="2")
    ref = senv.reader.add(make_claim("a", [result], config=[gpu_config({"strategy": "MPS"})]))
    first = senv.state.prepare([ref])[ref.uid]
    before = senv.spec(ref.uid)
    senv.state.close()
    state = senv.new_state(boot="boot-2")  # a reboot: the spec is written again from the checkpoint
    assert state.prepare([ref])[ref.uid] == first
    assert senv.spec(ref.uid) == before
    other = senv.reader.add(make_claim("o", [share("gpu-0", memory="60Gi")], config=[gpu_config({"strategy": "MPS"})]))
    assert "this claim's 60Gi would exceed it" in (state.prepare([other])[other.uid].error or "")


def test_checkpoint_written_before_shares_still_loads(senv: ShareEnv) -> None:
    ref = senv.reader.add(make_claim("a", [("gpu", "gpu-1")]))
    assert senv.state.prepare([ref])[ref.uid].error is None
    store = CheckpointStore(senv.tmp / "state", NODE, DRIVER, boot_id=senv.boot)
    legacy = json.loads(store.encode(senv.state.prepared_claims()))
    for device in legacy["data"]["claims"][ref.uid]["devices"]:
        for key in ("consumedCapacity", "memoryShareBytes", "computeSharePercent"):
            del device[key]
    legacy["checksum"] = "sha256:" + hashlib.sha256(canonical(legacy["data"])).hexdigest()
    (senv.tmp / "state" / "checkpoint.json").write_text(json.dumps(legacy))
    loaded = store.load()
    assert store.quarantined is None
    assert loaded[ref.uid].devices[0].memory_share_bytes is None
    assert loaded[ref.uid].devices[0].consumed_capacity == {}


def test_static_mig_share(senv: ShareEnv) -> None:
    claim = make_claim("m", [share("gpu-2-mig-0", memory="4Gi", multiprocessors="8")])
    uid = claim["metadata"]["uid"]
    assert senv.prepare_one(claim).error is None
    got = device_env(senv.spec(uid), 0)
    assert got["DRA_GPU_0_UUID"] == "MIG-2-0"
    assert got["DRA_GPU_0_MEMORY_SHARE"] == "4Gi" and got["DRA_GPU_0_COMPUTE_SHARE_PERCENT"] == "50"
