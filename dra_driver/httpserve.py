"""The small HTTP server behind the node plugin's and the controller's ``/healthz`` and ``/metrics``.

Each program names its pages; a page answers ``(status, body, content type)``. Query strings are
ignored, requests are not logged (probes every few seconds would drown the real log), and any
other path is a 404.

Built on :mod:`socketserver` rather than :mod:`http.server`: these pages are read by probes and
Prometheus, one GET per connection, and ``http.server`` brings ``html``, ``mimetypes`` and an
email-header parser for nothing the pages use, memory in the node plugin, whose memory is measured
against a Go driver's (docs/benchmarks.md#the-codes-figures). The request line and headers are
bounded in size and count and read with a timeout, so a client that never finishes its request costs
one thread for that long; at most :data:`MAX_CONNECTIONS` are served at once, and a connection
beyond them is answered ``503`` at once and closed, so a flood of connections costs a bounded number
of threads, not one each.
"""

from __future__ import annotations

import contextlib
import socketserver
import threading
from collections.abc import Callable, Mapping
from http import HTTPStatus
from io import BufferedIOBase
from typing import Any

from dra_driver import logs

Page = Callable[[], tuple[int, bytes, str]]
HEALTH_PATHS = ("/healthz", "/livez", "/readyz")
MAX_LINE = 8192
MAX_HEADERS = 100
READ_TIMEOUT = 10.0
MAX_CONNECTIONS = 16
"""Connections served at once, one thread each; probes and a scrape need a few."""

_log = logs.get("http")


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type[socketserver.BaseRequestHandler],
                 max_connections: int) -> None:
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            # Answered here, on the serving thread: a short write into a fresh socket's buffer.
            with contextlib.suppress(OSError):
                request.sendall(_response(HTTPStatus.SERVICE_UNAVAILABLE, b"busy\n", "text/plain"))
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: its slot is free again, the error goes on
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def _status_line(code: int) -> bytes:
    try:
        phrase = HTTPStatus(code).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {code} {phrase}\r\n".encode("latin-1")


def _response(code: int, body: bytes, ctype: str, head_only: bool = False) -> bytes:
    head = (_status_line(code) + f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode("latin-1"))
    return head if head_only else head + body


def _read_request(rfile: BufferedIOBase) -> tuple[str, str] | HTTPStatus | None:
    """``(method, path)`` of the request on ``rfile``, the status to refuse it with, or None when
    the client closed the connection without a request."""
    line = rfile.readline(MAX_LINE + 1)
    if not line:
        return None
    if len(line) > MAX_LINE:
        return HTTPStatus.REQUEST_URI_TOO_LONG
    parts = line.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return HTTPStatus.BAD_REQUEST
    for _ in range(MAX_HEADERS + 1):
        header = rfile.readline(MAX_LINE + 1)
        if len(header) > MAX_LINE:
            return HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE
        if header in (b"\r\n", b"\n", b""):
            return parts[0], parts[1]
    return HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE


def bind(host: str, port: int, pages: Mapping[str, Page]) -> Server:
    """A server bound to ``host:port`` (port 0: any free one), not yet serving."""
    routes = dict(pages)

    class Handler(socketserver.StreamRequestHandler):
        timeout = READ_TIMEOUT

        def handle(self) -> None:
            # A client that goes away (timeout, reset, closed early) ends its request quietly:
            # socketserver would print a traceback for it.
            with contextlib.suppress(OSError):
                self.wfile.write(self._answer())

        def _answer(self) -> bytes:
            request = _read_request(self.rfile)
            if request is None:
                return b""
            if isinstance(request, HTTPStatus):
                return _response(request, f"{request.phrase}\n".encode(), "text/plain")
            method, path = request
            if method not in ("GET", "HEAD"):
                return _response(HTTPStatus.METHOD_NOT_ALLOWED, b"only GET\n", "text/plain")
            page = routes.get(path.split("?", 1)[0])
            if page is None:
                return _response(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")
            try:
                code, body, ctype = page()
            except Exception:  # last resort: a failing page answers 500, the server goes on
                _log.exception("page failed", path=path)
                code, body, ctype = HTTPStatus.INTERNAL_SERVER_ERROR, b"internal error, see the log\n", "text/plain"
            return _response(code, body, ctype, head_only=method == "HEAD")

    return Server((host, port), Handler, MAX_CONNECTIONS)


def serve_in_background(server: Server, name: str) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)
    thread.start()
    return thread
