"""The plugin's HTTP port: /healthz, /livez and /readyz."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from dra_driver.node.kubelet import httpport


@pytest.mark.parametrize(("problem", "status"), [(None, 200), ("registration socket gone", 503)])
def test_healthz(problem: str | None, status: int) -> None:
    server = httpport.serve(0, lambda: problem, host="127.0.0.1")
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


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_degraded_publishing_is_not_ready_but_alive() -> None:
    """A withheld device makes /readyz fail and leaves /healthz and /livez (the liveness probe) alone."""
    degraded: list[str | None] = ["publishing degraded: 1 device(s) withheld"]
    server = httpport.serve(0, lambda: None, host="127.0.0.1", degraded_fn=lambda: degraded[0])
    port = server.server_address[1]
    try:
        assert _get(port, "/healthz")[0] == 200 and _get(port, "/livez")[0] == 200
        assert _get(port, "/readyz") == (503, "publishing degraded: 1 device(s) withheld\n")
        degraded[0] = None
        assert _get(port, "/readyz") == (200, "ok\n")
    finally:
        server.shutdown()


def test_readyz_also_fails_when_the_sockets_do() -> None:
    server = httpport.serve(0, lambda: "registration socket gone", host="127.0.0.1", degraded_fn=lambda: None)
    try:
        assert _get(server.server_address[1], "/readyz")[0] == 503
    finally:
        server.shutdown()
