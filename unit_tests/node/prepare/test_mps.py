"""MPS control daemons: which GPUs get one and with what defaults, the container's edits, and the
state's prepare, unprepare, failure and crash paths (FakeDaemons holds the daemons in memory; the
real process handling runs against the stand-in tool in unit_tests/e2e_tools/testbed/test_standins.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from crashes import Crash
from nodefix import GPU0_UUID as GPU0
from nodefix import MPS, Env, MpsEnv, env_of, gpu_config, make_claim, share

from dra_driver import failpoints
from dra_driver.gpuconfig import MpsSettings, SharingConfig, Strategy
from dra_driver.node.prepare.entries import ClaimEntry, ClaimState, DeviceKind, PreparedDevice
from dra_driver.node.prepare.gpupolicy import GpuPolicyError
from dra_driver.node.prepare.mps import (
    Defaults,
    container_edits,
    control_commands,
    daemon_dir,
    to_stop,
    wanted,
)
from dra_driver.node.prepare.state import DeviceState

GPU1 = "GPU-00000001-0000-0000-0000-000000000000"


def mps(pct: int | None = None, mem: int | None = None) -> SharingConfig:
    return SharingConfig(Strategy.MPS, None, MpsSettings(pct, f"{mem}" if mem else None, mem))


def entry(uid: str, *devices: tuple[str, SharingConfig, DeviceKind]) -> ClaimEntry:
    return ClaimEntry(uid=uid, namespace="ns", name=uid, state=ClaimState.PREPARE_COMPLETED, devices=tuple(
        PreparedDevice(pool="n", device=f"d-{i}", requests=("r",), cdi_device_ids=(), sharing=sharing,
                       gpu_uuid=gpu, kind=kind) for i, (gpu, sharing, kind) in enumerate(devices)))


def test_a_daemons_defaults_are_the_smallest_limits_of_its_claims() -> None:
    a = entry("a", (GPU0, mps(50, 10 * 2**30), DeviceKind.GPU))
    b = entry("b", (GPU0, mps(30), DeviceKind.GPU), (GPU1, mps(), DeviceKind.GPU))
    c = entry("c", (GPU1, mps(20), DeviceKind.MIG), ("GPU-x", SharingConfig(), DeviceKind.GPU))
    assert wanted([a, b, c]) == {GPU0: Defaults(30, 10 * 2**30), GPU1: Defaults(None, None)}
    assert control_commands(Defaults(30, 10 * 2**30)) == [
        "set_default_active_thread_percentage 30", "set_default_device_pinned_mem_limit 0 10240M"]
    assert control_commands(Defaults()) == []
    assert to_stop([a], [b]) == [] and to_stop([b], [a]) == [GPU1] and to_stop([a, b], [c]) == [GPU0, GPU1]


def test_the_container_gets_the_daemons_directories(tmp_path: Path) -> None:
    edits = container_edits(tmp_path, [GPU0])
    assert edits["env"] == ["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps"]
    assert [(m["hostPath"], m["containerPath"]) for m in edits["mounts"]] == [
        (f"{tmp_path}/mps/{GPU0}/pipe", "/tmp/nvidia-mps"), (f"{tmp_path}/mps/{GPU0}/log", "/var/log/nvidia-mps"),
        ("/dev/shm", "/dev/shm")]
    assert container_edits(tmp_path, []) == {}
    with pytest.raises(GpuPolicyError, match="is not a GPU UUID"):
        daemon_dir(tmp_path, "../etc")


def test_three_shares_one_daemon_three_clients_stopped_after_the_last(menv: MpsEnv) -> None:
    refs = [menv.reader.add(make_claim(f"c{i}", [share("gpu-0", f"{10 * (i + 1)}Gi")],
                                       config=[gpu_config({"strategy": "MPS"})])) for i in range(3)]
    for ref in refs:
        assert menv.state.prepare([ref])[ref.uid].ok
    assert menv.daemons.starts == [GPU0], "one daemon for the GPU"
    assert menv.daemons.live[GPU0] == Defaults(None, 10 * 2**30), "the smallest share is the default"
    for i, ref in enumerate(refs):
        spec = menv.spec(ref.uid)
        assert "mounts" not in spec["containerEdits"], "the daemon's edits are the MPS device's, not the claim's"
        (device,) = spec["devices"]
        env = env_of(device["containerEdits"])
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={10240 * (i + 1)}M"
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
        mounts = device["containerEdits"]["mounts"]
        assert {m["containerPath"] for m in mounts} == {"/tmp/nvidia-mps", "/var/log/nvidia-mps", "/dev/shm"}
    for ref in refs[:2]:
        assert menv.state.unprepare([ref]) == {ref.uid: None}
    assert menv.daemons.stops == []
    assert menv.state.unprepare([refs[2]]) == {refs[2].uid: None}
    assert menv.daemons.stops == [GPU0] and menv.daemons.live == {}


def test_a_daemon_that_cannot_start_fails_the_claim_with_nothing_left(menv: MpsEnv) -> None:
    menv.daemons.fail = "the MPS control daemon of GPU x did not become ready within 30s"
    ref = menv.reader.add(make_claim("a", [("gpu", "gpu-0")], config=[gpu_config(MPS)]))
    out = menv.state.prepare([ref])[ref.uid]
    assert out.error == menv.daemons.fail
    assert not menv.spec_exists(ref.uid) and menv.checkpoint() == {} and menv.daemons.live == {}


def test_mps_on_two_gpus_in_one_claim_is_refused(menv: MpsEnv) -> None:
    ref = menv.reader.add(make_claim("a", [("gpu", "gpu-0"), ("gpu", "gpu-1")], config=[gpu_config(MPS)]))
    out = menv.state.prepare([ref])[ref.uid]
    assert out.error is not None and "MPS on 2 GPUs in one claim is not supported" in out.error
    assert menv.daemons.live == {} and menv.checkpoint() == {}


def test_a_restart_adopts_a_running_daemon_and_starts_a_dead_one(menv: MpsEnv) -> None:
    ref = menv.reader.add(make_claim("a", [("gpu", "gpu-0")], config=[gpu_config(MPS)]))
    assert menv.state.prepare([ref])[ref.uid].ok
    menv.state.close()
    menv.state = menv.new_state()
    assert menv.daemons.starts == [GPU0], "adopted, not started twice"
    del menv.daemons.live[GPU0]  # it died
    assert menv.state.dead_mps() == [GPU0]
    assert menv.state.restart_mps() == {}
    assert menv.daemons.starts == [GPU0, GPU0] and menv.state.dead_mps() == []


@pytest.mark.parametrize("point", ["prepare.after-started", "prepare.after-mps-start", "prepare.after-cdi-write",
                                   "prepare.after-completed"])
def test_a_crash_in_prepare_leaves_a_daemon_only_for_a_prepared_claim(menv: MpsEnv, crashing: None,
                                                                      point: str) -> None:
    ref = menv.reader.add(make_claim("a", [("gpu", "gpu-0")], config=[gpu_config(MPS)]))
    failpoints.configure({failpoints.ENV: f"{point}=1"})
    with pytest.raises(Crash):
        menv.state.prepare([ref])
    failpoints.configure({})
    menv.state = menv.new_state()
    kept = ref.uid in menv.state.prepared_claims()
    assert set(menv.daemons.live) == ({GPU0} if kept else set())
    assert menv.state.prepare([ref])[ref.uid].ok and set(menv.daemons.live) == {GPU0}
    assert menv.state.unprepare([ref]) == {ref.uid: None} and menv.daemons.live == {}


@pytest.mark.parametrize("point", ["unprepare.after-spec-delete", "unprepare.after-mps-stop",
                                   "unprepare.after-checkpoint"])
def test_a_crash_in_unprepare_keeps_the_daemon_of_a_claim_still_running(menv: MpsEnv, crashing: None,
                                                                        point: str) -> None:
    a, b = refs = [menv.reader.add(make_claim(n, [share("gpu-0", "10Gi")], config=[gpu_config({"strategy": "MPS"})]))
                   for n in "ab"]
    assert all(o.ok for o in menv.state.prepare(refs).values())
    assert menv.state.unprepare([a]) == {a.uid: None}
    failpoints.configure({failpoints.ENV: f"{point}=1"})
    with pytest.raises(Crash):
        menv.state.unprepare([b])
    failpoints.configure({})
    menv.state = menv.new_state()
    kept = b.uid in menv.state.prepared_claims()
    assert set(menv.daemons.live) == ({GPU0} if kept else set()), "a daemon exactly when a claim uses it"
    assert menv.state.unprepare([b]) == {b.uid: None}
    assert menv.daemons.live == {} and not (menv.tmp / "state" / "mps" / GPU0).exists()


def test_without_daemons_mps_claims_get_their_limits_alone(env: Env) -> None:
    assert isinstance(env.state, DeviceState) and not env.state.runs_mps
    ref = env.reader.add(make_claim("a", [("gpu", "gpu-0")], config=[gpu_config(MPS)]))
    assert env.state.prepare([ref])[ref.uid].ok
    spec = env.spec(ref.uid)
    (device,) = spec["devices"]
    assert "mounts" not in spec["containerEdits"] and "mounts" not in device["containerEdits"]
    assert env_of(device["containerEdits"])["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"


def test_two_plugin_instances_of_a_node_share_one_daemon(menv: MpsEnv) -> None:
    """A rolling update: instance B starts beside A on the same state directory, takes new claims, and
    A goes; the daemon A started is adopted, never started twice, and stops after the last claim."""
    a_ref = menv.reader.add(make_claim("a", [share("gpu-0", "10Gi")], config=[gpu_config({"strategy": "MPS"})]))
    assert menv.state.prepare([a_ref])[a_ref.uid].ok
    second = menv.new_state()
    b_ref = menv.reader.add(make_claim("b", [share("gpu-0", "20Gi")], config=[gpu_config({"strategy": "MPS"})]))
    assert second.prepare([b_ref])[b_ref.uid].ok
    assert menv.daemons.starts == [GPU0]
    menv.state.close()
    assert second.unprepare([a_ref]) == {a_ref.uid: None} and menv.daemons.live
    assert second.unprepare([b_ref]) == {b_ref.uid: None}
    assert menv.daemons.stops == [GPU0] and menv.daemons.live == {}
    second.close()
