"""The liveness probe: the CLI check of the sockets."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver.node.kubelet import probe


def test_missing_socket_is_reported(tmp_path: Path) -> None:
    problem = probe.check(tmp_path / "nope-reg.sock", "gpu.dra-driver.io")
    assert problem is not None and "does not exist" in problem


def test_main_exits_non_zero_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert probe.main(str(tmp_path / "x.sock"), "gpu.dra-driver.io") == 1
    err = capsys.readouterr().err
    assert err.startswith("probe: ") and err.count("\n") == 1
