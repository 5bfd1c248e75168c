"""Time-slices programmed on the GPUs: the decisions, nvidia-smi's command lines, and the state's
prepare, unprepare, failure and crash paths (the FakeGpuControl of nodefix holds the GPUs)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from crashes import Crash
from nodefix import TS, Env, gpu_config, make_claim

from dra_driver import failpoints
from dra_driver.gpuconfig import SharingConfig, Strategy, TimeSliceInterval
from dra_driver.node.prepare.entries import ClaimEntry, ClaimState, DeviceKind, PreparedDevice
from dra_driver.node.prepare.gpupolicy import (
    GpuPolicyError,
    SmiControl,
    TimeSlicer,
    time_slice_of,
    to_reset,
    to_set,
    tool_environment,
)

LONG = {"strategy": "TimeSlicing", "timeSlicing": {"interval": "Long"}}
GPU0 = "GPU-00000000-0000-0000-0000-000000000000"
GPU1 = "GPU-00000001-0000-0000-0000-000000000000"


def entry(uid: str, *devices: tuple[str, SharingConfig, DeviceKind]) -> ClaimEntry:
    return ClaimEntry(uid=uid, namespace="ns", name=uid, state=ClaimState.PREPARE_COMPLETED, devices=tuple(
        PreparedDevice(pool="n", device=f"d-{i}", requests=("r",), cdi_device_ids=(), sharing=sharing,
                       gpu_uuid=gpu, kind=kind) for i, (gpu, sharing, kind) in enumerate(devices)))


def ts(interval: TimeSliceInterval = TimeSliceInterval.DEFAULT) -> SharingConfig:
    return SharingConfig(Strategy.TIME_SLICING, interval)


# --- decisions --------------------------------------------------------------------------------


def test_only_whole_time_sliced_gpus_set_an_interval() -> None:
    e = entry("a", (GPU0, ts(TimeSliceInterval.LONG), DeviceKind.GPU), (GPU1, ts(), DeviceKind.MIG),
              ("GPU-x", SharingConfig(), DeviceKind.GPU), ("GPU-y", SharingConfig(Strategy.MPS), DeviceKind.GPU))
    assert [time_slice_of(d) for d in e.devices] == [TimeSliceInterval.LONG, None, None, None]


def test_a_gpu_is_set_by_its_first_claim_and_reset_after_its_last() -> None:
    a = entry("a", (GPU0, ts(TimeSliceInterval.SHORT), DeviceKind.GPU))
    b = entry("b", (GPU0, ts(TimeSliceInterval.SHORT), DeviceKind.GPU), (GPU1, ts(), DeviceKind.GPU))
    assert [(c.gpu_uuid, c.interval) for c in to_set(a, [])] == [(GPU0, TimeSliceInterval.SHORT)]
    assert [c.gpu_uuid for c in to_set(b, [a])] == [GPU1], "GPU 0 has its interval from claim a"
    assert [c.gpu_uuid for c in to_set(a, [a])] == [GPU0], "a claim is not its own other"
    assert [c.gpu_uuid for c in to_reset([a], [b])] == []
    assert [c.gpu_uuid for c in to_reset([b], [a])] == [GPU1]
    assert [(c.gpu_uuid, c.reset) for c in to_reset([a, b], [])] == [(GPU0, True), (GPU1, True)]


class Control:
    def __init__(self, mode: str = "Default") -> None:
        self.mode, self.calls = mode, list[tuple[str, str]]()

    def compute_mode(self, gpu_uuid: str) -> str:
        return self.mode

    def set_compute_mode(self, gpu_uuid: str, mode: str) -> None:
        self.calls.append(("mode", mode))

    def set_time_slice(self, gpu_uuid: str, value: int) -> None:
        self.calls.append(("slice", str(value)))


def test_the_compute_mode_goes_to_default_before_the_interval() -> None:
    control = Control()
    TimeSlicer(control).set_for(entry("a", (GPU0, ts(TimeSliceInterval.MEDIUM), DeviceKind.GPU)), [])
    assert control.calls == [("mode", "DEFAULT"), ("slice", "2")]


def test_a_gpu_someone_else_put_in_another_mode_is_refused_untouched() -> None:
    control = Control("Exclusive_Process")
    with pytest.raises(GpuPolicyError, match=f"GPU {GPU0} is in compute mode Exclusive_Process, which this driver"):
        TimeSlicer(control).set_for(entry("a", (GPU0, ts(), DeviceKind.GPU)), [])
    assert control.calls == []


# --- nvidia-smi -------------------------------------------------------------------------------


def fake_smi(root: Path, body: str) -> Path:
    tool = root / "usr/bin/nvidia-smi"
    tool.parent.mkdir(parents=True, exist_ok=True)
    tool.write_text(f"#!/bin/sh\necho \"$@\" >> {root}/calls\n{body}\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return tool


def test_nvidia_smi_command_lines(tmp_path: Path) -> None:
    fake_smi(tmp_path, 'case "$1" in --query-gpu=*) echo Default;; esac')
    control = SmiControl(tmp_path)
    assert control.compute_mode(GPU0) == "Default"
    control.set_compute_mode(GPU0, "DEFAULT")
    control.set_time_slice(GPU0, 3)
    assert (tmp_path / "calls").read_text().splitlines() == [
        f"--query-gpu=compute_mode --format=csv,noheader -i {GPU0}", f"-i {GPU0} -c DEFAULT",
        f"compute-policy -i {GPU0} --set-timeslice=3"]


def test_a_missing_nvidia_smi_says_where_it_was_looked_for(tmp_path: Path) -> None:
    with pytest.raises(GpuPolicyError, match=rf"none under --nvidia-driver-root {tmp_path} \(searched {tmp_path}/usr/bin"):
        SmiControl(tmp_path).set_time_slice(GPU0, 1)


def test_a_failing_nvidia_smi_gives_its_last_line(tmp_path: Path) -> None:
    fake_smi(tmp_path, 'echo "Insufficient Permissions" >&2; exit 4')
    with pytest.raises(GpuPolicyError, match=f"setting the time-slice of GPU {GPU0} to 1: nvidia-smi compute-policy "
                                             f"-i {GPU0} --set-timeslice=1 exited 4: Insufficient Permissions"):
        SmiControl(tmp_path).set_time_slice(GPU0, 1)


def test_a_hung_nvidia_smi_times_out(tmp_path: Path) -> None:
    fake_smi(tmp_path, "sleep 5")
    with pytest.raises(GpuPolicyError, match=r"did not answer within 0\.2s"):
        SmiControl(tmp_path, timeout_s=0.2).compute_mode(GPU0)


def test_the_tools_find_their_libraries_in_the_driver_root(tmp_path: Path) -> None:
    (tmp_path / "usr/lib64").mkdir(parents=True)
    assert tool_environment(tmp_path)["LD_LIBRARY_PATH"] == str(tmp_path / "usr/lib64")
    assert "LD_LIBRARY_PATH" not in tool_environment(Path("/"))


# --- the prepare state ------------------------------------------------------------------------


def test_two_claims_with_one_interval_set_it_once_and_reset_it_after_the_last(env: Env) -> None:
    refs = [env.reader.add(make_claim(n, [("gpu", "gpu-0")], config=[gpu_config(LONG)])) for n in "ab"]
    assert env.state.prepare([refs[0]])[refs[0].uid].ok
    assert env.state.prepare([refs[1]])[refs[1].uid].ok
    assert env.gpus.sets() == [(GPU0, "3")]
    assert env.gpus.modes == {GPU0: "Default"}
    assert env.state.unprepare([refs[0]]) == {refs[0].uid: None}
    assert env.gpus.sets() == [(GPU0, "3")], "claim b still time-slices GPU 0"
    assert env.state.unprepare([refs[1]]) == {refs[1].uid: None}
    assert env.gpus.sets() == [(GPU0, "3"), (GPU0, "0")]


def test_one_batch_sets_a_shared_gpu_once(env: Env) -> None:
    refs = [env.reader.add(make_claim(n, [("gpu", "gpu-0")], config=[gpu_config(TS)])) for n in "ab"]
    assert all(o.ok for o in env.state.prepare(refs).values())
    assert env.gpus.sets() == [(GPU0, "0")]
    assert env.state.unprepare(refs) == {r.uid: None for r in refs}
    assert env.gpus.sets() == [(GPU0, "0"), (GPU0, "0")]


def test_an_interval_conflict_names_the_other_claim_and_changes_nothing(env: Env) -> None:
    a = env.reader.add(make_claim("a", [("gpu", "gpu-0")], config=[gpu_config(LONG)]))
    b = env.reader.add(make_claim("b", [("gpu", "gpu-0")], config=[gpu_config(TS)]))
    assert env.state.prepare([a])[a.uid].ok
    out = env.state.prepare([b])[b.uid]
    assert out.error is not None and f"claim default/a ({a.uid}) with sharing TimeSlicing:Long" in out.error
    assert env.gpus.sets() == [(GPU0, "3")]
    assert not env.spec_exists(b.uid) and b.uid not in env.state.prepared_claims()


def test_a_foreign_compute_mode_fails_the_claim_with_nothing_left_behind(env: Env) -> None:
    env.gpus.modes[GPU0] = "Exclusive_Process"
    ref = env.reader.add(make_claim("a", [("gpu", "gpu-0")], config=[gpu_config(TS)]))
    out = env.state.prepare([ref])[ref.uid]
    assert out.error is not None and "is in compute mode Exclusive_Process, which this driver did not set" in out.error
    assert not env.spec_exists(ref.uid) and env.checkpoint() == {}
    assert [c for c in env.gpus.calls if c[0] != "compute_mode"] == [(("set_time_slice", GPU0, "0"))], \
        "only the default put back, the mode left as its owner set it"
    assert env.gpus.modes[GPU0] == "Exclusive_Process"


def test_a_failed_set_is_reported_and_undone(env: Env) -> None:
    env.gpus.fail["set_time_slice"] = "nvidia-smi exited 4: Insufficient Permissions"
    ref = env.reader.add(make_claim("a", [("gpu", "gpu-0")], config=[gpu_config(LONG)]))
    out = env.state.prepare([ref])[ref.uid]
    assert out.error == "nvidia-smi exited 4: Insufficient Permissions"
    assert not env.spec_exists(ref.uid) and env.checkpoint() == {}


def test_a_failed_reset_keeps_the_claim_for_the_kubelets_retry(env: Env) -> None:
    ref = env.reader.add(make_claim("a", [("gpu", "gpu-0")], config=[gpu_config(LONG)]))
    assert env.state.prepare([ref])[ref.uid].ok
    env.gpus.fail["set_time_slice"] = "nvidia-smi did not answer within 30s"
    error = env.state.unprepare([ref])[ref.uid]
    assert error is not None and "nvidia-smi did not answer" in error
    assert ref.uid in env.checkpoint()
    del env.gpus.fail["set_time_slice"]
    assert env.state.unprepare([ref]) == {ref.uid: None}
    assert env.gpus.time_slices[GPU0] == 0 and env.checkpoint() == {}


def test_exclusive_and_mig_claims_leave_the_policy_alone(env: Env) -> None:
    refs = [env.reader.add(make_claim("a", [("gpu", "gpu-1")])),
            env.reader.add(make_claim("b", [("gpu", "gpu-2-mig-0")], config=[gpu_config(TS)]))]
    assert all(o.ok for o in env.state.prepare(refs).values())
    assert env.state.unprepare(refs) == {r.uid: None for r in refs}
    assert env.gpus.calls == []


@pytest.mark.parametrize("point", ["prepare.after-started", "prepare.after-time-slice", "prepare.after-cdi-write",
                                   "prepare.after-completed"])
def test_a_crash_in_prepare_leaves_the_gpu_as_the_checkpoint_says(env: Env, crashing: None, point: str) -> None:
    ref = env.reader.add(make_claim("a", [("gpu", "gpu-0")], config=[gpu_config(LONG)]))
    failpoints.configure({failpoints.ENV: f"{point}=1"})
    with pytest.raises(Crash):
        env.state.prepare([ref])
    failpoints.configure({})
    env.state = env.new_state()
    kept = ref.uid in env.state.prepared_claims()
    assert env.gpus.time_slices.get(GPU0, 0) == (3 if kept else 0)
    assert env.state.prepare([ref])[ref.uid].ok and env.gpus.time_slices[GPU0] == 3
    assert env.state.unprepare([ref]) == {ref.uid: None} and env.gpus.time_slices[GPU0] == 0


@pytest.mark.parametrize("point", ["unprepare.after-spec-delete", "unprepare.after-time-slice",
                                   "unprepare.after-checkpoint"])
def test_a_crash_in_unprepare_leaves_no_interval_behind(env: Env, crashing: None, point: str) -> None:
    a, b = refs = [env.reader.add(make_claim(n, [("gpu", "gpu-0")], config=[gpu_config(LONG)])) for n in "ab"]
    assert all(o.ok for o in env.state.prepare(refs).values())
    assert env.state.unprepare([a]) == {a.uid: None}
    assert env.gpus.time_slices[GPU0] == 3, "claim b still runs with its interval"
    failpoints.configure({failpoints.ENV: f"{point}=1"})
    with pytest.raises(Crash):
        env.state.unprepare([b])
    failpoints.configure({})
    env.state = env.new_state()
    kept = b.uid in env.state.prepared_claims()
    assert env.gpus.time_slices[GPU0] == (3 if kept else 0), "the GPU as the checkpoint says"
    assert env.state.unprepare([b]) == {b.uid: None}
    assert env.gpus.time_slices[GPU0] == 0 and env.checkpoint() == {}
