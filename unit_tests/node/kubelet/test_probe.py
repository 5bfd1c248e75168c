"""The liveness probe: the CLI check of the sockets and the /healthz endpoint."""

from __future__ import annotations

import urllib.error
import urllib.request
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


@pytest.mark.parametrize(("problem", "status"), [(None, 200), ("registration socket gone", 503)])
def test_healthz(problem: str | None, status: int) -> None:
    server = probe.serve_healthz(0, lambda: problem, host="127.0.0.1")
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                code, body = resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            code, body = exc.code, exc.read().decode()
        assert code == status
        assert (problem or "ok") in body
    finally:
        server.shutdown()
