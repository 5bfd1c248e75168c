"""The /healthz and /metrics server: what probes and Prometheus send, and what they must not break."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from dra_driver import httpserve


@pytest.fixture
def port() -> Iterator[int]:
    pages: dict[str, httpserve.Page] = {"/metrics": lambda: (200, b"up 1\n", "text/plain; version=0.0.4")}
    server = httpserve.bind("127.0.0.1", 0, pages)
    httpserve.serve_in_background(server, "test-http")
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _get(port: int, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def test_a_page_with_its_type_and_length(port: int) -> None:
    status, headers, body = _get(port, "GET", "/metrics?name[]=up")
    assert (status, body) == (200, b"up 1\n")
    assert headers["content-type"] == "text/plain; version=0.0.4"
    assert headers["content-length"] == "5"


def test_head_sends_the_headers_only(port: int) -> None:
    reply = _raw(port, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 200 OK\r\n") and reply.endswith(b"\r\n\r\n")
    assert b"Content-Length: 5\r\n" in reply


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"GET /nope HTTP/1.1\r\n\r\n", b"404 Not Found"),
    (b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"405 Method Not Allowed"),
    (b"GARBAGE\r\n\r\n", b"400 Bad Request"),
    (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", b"414 Request-URI Too Long"),
    (b"GET /metrics HTTP/1.1\r\n" + b"X-A: b\r\n" * 101 + b"\r\n", b"431 Request Header Fields Too Large"),
    (b"GET /metrics HTTP/1.1\r\nX-Big: " + b"b" * 9000 + b"\r\n\r\n", b"431 Request Header Fields Too Large"),
])
def test_bad_requests_get_a_status_not_a_traceback(port: int, request_bytes: bytes, status: bytes,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    reply = _raw(port, request_bytes)
    assert reply.startswith(b"HTTP/1.1 " + status + b"\r\n")
    assert "Traceback" not in capsys.readouterr().err
    assert _get(port, "GET", "/metrics")[0] == 200  # and the server goes on


def test_a_client_that_never_finishes_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httpserve, "READ_TIMEOUT", 0.2)
    server = httpserve.bind("127.0.0.1", 0, {})
    httpserve.serve_in_background(server, "test-http")
    try:
        with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=5) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\n")
            t0 = time.monotonic()
            assert sock.recv(100) == b""  # closed by the server, without an answer
            assert time.monotonic() - t0 < 3
    finally:
        server.shutdown()
        server.server_close()


def test_the_plugin_does_not_import_http_server() -> None:
    code = ("import sys, dra_driver.node.plugin; "
            "print(sorted(m for m in ('http.server', 'html', 'mimetypes', 'shutil', 'tempfile') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_failing_page_is_a_500_and_a_log_line(capsys: pytest.CaptureFixture[str]) -> None:
    def broken() -> tuple[int, bytes, str]:
        raise RuntimeError("registry gone")

    server = httpserve.bind("127.0.0.1", 0, {"/metrics": broken})
    httpserve.serve_in_background(server, "test-http")
    try:
        status, _, body = _get(server.server_address[1], "GET", "/metrics")
        assert status == 500 and b"internal error" in body
    finally:
        server.shutdown()
        server.server_close()
    err = capsys.readouterr()
    assert "registry gone" in err.out + err.err  # the log line names the failure
    assert "Exception occurred during processing of request" not in err.err  # no socketserver traceback


def test_a_client_that_leaves_before_the_answer_costs_no_traceback(port: int, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\n")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # reset on close
    time.sleep(0.2)
    assert "Traceback" not in capsys.readouterr().err
    assert _get(port, "GET", "/metrics")[0] == 200


def test_connections_beyond_the_bound_are_refused_not_threaded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(httpserve, "MAX_CONNECTIONS", 3)
    server = httpserve.bind("127.0.0.1", 0, {"/healthz": lambda: (200, b"ok\n", "text/plain")})
    httpserve.serve_in_background(server, "test-http")
    port = server.server_address[1]
    before = threading.active_count()
    stalled = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]
    try:
        for sock in stalled:
            sock.sendall(b"GET /healthz HTTP/1.1\r\n")  # never finished: each holds its thread
        time.sleep(0.3)
        floods = [_raw(port, b"GET /healthz HTTP/1.1\r\n\r\n") for _ in range(20)]
        assert all(reply.startswith(b"HTTP/1.1 503 Service Unavailable\r\n") for reply in floods), floods[0]
        assert threading.active_count() - before <= 3
    finally:
        for sock in stalled:
            sock.close()
    # The slots come back as the stalled clients go.
    deadline = time.monotonic() + 5
    while _raw(port, b"GET /healthz HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 503") and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert _get(port, "GET", "/healthz")[0] == 200
    finally:
        server.shutdown()
        server.server_close()
