"""The stand-in driver tools of e2e/testbed/standins, driven by the plugin's own callers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.node.prepare.gpupolicy import GpuPolicyError, SmiControl
from dra_driver.node.prepare.mps import Defaults, MpsDaemons
from e2e.testbed.standins import install

GPU = "GPU-11111111-2222-3333-4444-555555555555"


def test_nvidia_smi_holds_the_compute_mode_and_time_slice_and_records_each_call(tmp_path: Path) -> None:
    root = install.install(tmp_path)
    smi = SmiControl(root)
    assert smi.compute_mode(GPU) == "Default"
    smi.set_compute_mode(GPU, "EXCLUSIVE_PROCESS")
    assert smi.compute_mode(GPU) == "Exclusive_Process"
    smi.set_compute_mode(GPU, "DEFAULT")
    smi.set_time_slice(GPU, 3)
    assert install.gpus(root) == {GPU: {"computeMode": "Default", "timeslice": 3}}
    assert install.calls(root) == [
        ["--query-gpu=compute_mode", "--format=csv,noheader", "-i", GPU], ["-i", GPU, "-c", "EXCLUSIVE_PROCESS"],
        ["--query-gpu=compute_mode", "--format=csv,noheader", "-i", GPU], ["-i", GPU, "-c", "DEFAULT"],
        ["compute-policy", "-i", GPU, "--set-timeslice=3"]]


def test_nvidia_smi_refuses_what_its_help_does_not_list(tmp_path: Path) -> None:
    smi = SmiControl(install.install(tmp_path))
    with pytest.raises(GpuPolicyError, match="exited 2: Invalid combination of input arguments"):
        smi.set_time_slice(GPU, 4)
    with pytest.raises(GpuPolicyError, match="exited 6: No devices were found"):
        smi.set_time_slice("0000:01:00.0", 1)


# --- the MPS control daemon -------------------------------------------------------------------


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[MpsDaemons]:
    root = install.install(tmp_path / "root")
    found = MpsDaemons(root, tmp_path / "state", SmiControl(root), ready_timeout_s=5)
    yield found
    for gpu in found.known():
        found.stop(gpu)


def test_a_daemon_starts_takes_its_defaults_and_stops(daemons: MpsDaemons) -> None:
    root = daemons.driver_root
    assert daemons.ensure(GPU, Defaults(40, 3 * 2**30)) == "started"
    assert install.gpus(root)[GPU]["computeMode"] == "Exclusive_Process"
    assert daemons.ask(GPU, ["get_default_active_thread_percentage", "get_default_device_pinned_mem_limit 0"]) \
        == "40.0\n3072M\n"
    assert daemons.ensure(GPU, Defaults(30)) == "adopted", "a second start finds the first daemon"
    starts = [c for c in install.mps_calls(root) if c.get("args") == ["-d"]]
    assert len(starts) == 1 and starts[0]["visible"] == GPU
    assert daemons.stop(GPU) is True
    assert not daemons.running(GPU) and daemons.known() == []
    assert install.gpus(root)[GPU]["computeMode"] == "Default"
    commands = [c["command"] for c in install.mps_calls(root) if "daemon" in c]
    assert "set_default_active_thread_percentage 30" in commands and commands[-1] == "quit"


def test_a_daemon_not_ready_in_time_is_ended_and_the_gpu_restored(daemons: MpsDaemons) -> None:
    install.set_mps(daemons.driver_root, readyDelay=30)
    daemons.ready_timeout_s = 0.5
    with pytest.raises(GpuPolicyError, match=f"the MPS control daemon of GPU {GPU} did not become ready within 0.5s"):
        daemons.ensure(GPU, Defaults())
    assert daemons.known() == [] and install.gpus(daemons.driver_root)[GPU]["computeMode"] == "Default"


def test_a_foreign_compute_mode_is_left_alone(daemons: MpsDaemons) -> None:
    SmiControl(daemons.driver_root).set_compute_mode(GPU, "PROHIBITED")
    with pytest.raises(GpuPolicyError, match="is in compute mode Prohibited, which this driver did not set"):
        daemons.ensure(GPU, Defaults())
    assert daemons.known() == [] and install.gpus(daemons.driver_root)[GPU]["computeMode"] == "Prohibited"
    assert [c for c in install.mps_calls(daemons.driver_root) if c.get("args") == ["-d"]] == []


def test_a_missing_mps_control_is_named(tmp_path: Path) -> None:
    root = install.install(tmp_path, ("nvidia-smi",))
    with pytest.raises(GpuPolicyError, match=f"MPS needs nvidia-cuda-mps-control from the NVIDIA driver, and there is "
                                             f"none under --nvidia-driver-root {tmp_path}"):
        MpsDaemons(root, tmp_path / "state", SmiControl(root)).ensure(GPU, Defaults())
