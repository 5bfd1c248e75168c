"""The stand-in driver tools of e2e/testbed/standins, driven by the plugin's own callers."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver.node.prepare.gpupolicy import GpuPolicyError, SmiControl
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
