"""Raw requests to the bed's API server, and a loopback proxy in front of it that can answer 404
for one API group.

:func:`send_raw` sends bytes exactly as given (a client that encodes JSON cannot send a raw
``0xff`` or a lone surrogate escape). :class:`ApiProxy` listens on 127.0.0.1 in plain HTTP and
forwards every request to the API server with the kubeconfig's own credentials over its TLS; while
:attr:`ApiProxy.refused_group` is set, requests under ``/apis/<group>/`` get the answer a server
without that group gives (``404 page not found``), which names no object. A process pointed at
:meth:`ApiProxy.kubeconfig` sees the real API server, or one that has lost the group.
"""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from dra_driver.k8s.credentials import Credentials, load_credentials
from dra_driver.k8s.transport import Transport

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "authorization"}


def _upstream(credentials: Credentials, timeout: float) -> tuple[http.client.HTTPConnection, Transport, str | None]:
    conn, authorization = credentials.connection()
    transport = Transport(conn, 1)
    return transport.take(timeout), transport, authorization


def send_raw(kubeconfig: Path, method: str, path: str, body: bytes | None = None,
             content_type: str = "application/json") -> tuple[int, bytes]:
    """One request with ``body`` sent byte for byte; the status and the body of the answer."""
    http_conn, transport, authorization = _upstream(load_credentials(str(kubeconfig)), 30)
    headers = {"Accept": "application/json", "Content-Type": content_type}
    if authorization:
        headers["Authorization"] = authorization
    try:
        http_conn.request(method, transport.target(path), body=body, headers=headers)
        resp = http_conn.getresponse()
        return resp.status, resp.read()
    finally:
        http_conn.close()


class ApiProxy:
    """See the module docstring; :meth:`close` stops it."""

    def __init__(self, kubeconfig: Path) -> None:
        self.credentials = load_credentials(str(kubeconfig))
        self.refused_group: str | None = None
        self.refused: list[str] = []
        """The paths answered 404 while the group was refused."""
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                group = outer.refused_group
                if group is not None and self.path.startswith(f"/apis/{group}/"):
                    with outer._lock:
                        outer.refused.append(self.path.split("?", 1)[0])
                    data = b"404 page not found\n"
                    self.send_response(404)
                    self.send_header("Content-Type", "text/plain; charset=utf-8")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                try:
                    conn, transport, authorization = _upstream(outer.credentials, 330)
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                    if authorization:
                        headers["Authorization"] = authorization
                    conn.request(self.command, transport.target(self.path), body=body, headers=headers)
                    resp = conn.getresponse()
                except OSError as exc:
                    self.send_error(502, f"upstream: {exc}")
                    return
                try:
                    # The body is streamed and ends with the connection (a watch has no length).
                    self.send_response(resp.status)
                    for k, v in resp.getheaders():
                        if k.lower() not in HOP_BY_HOP:
                            self.send_header(k, v)
                    self.send_header("Connection", "close")
                    self.end_headers()
                    self.close_connection = True
                    while chunk := resp.read1(65536):
                        self.wfile.write(chunk)
                        self.wfile.flush()
                except (OSError, ValueError, http.client.HTTPException):
                    pass  # the client went away, or the upstream did (a broken chunk reads as ValueError)
                finally:
                    conn.close()

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

            def log_message(self, *_args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="api-proxy", daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig for the proxy (no credentials: the proxy adds its own), written to ``path``."""
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": "proxy",
               "clusters": [{"name": "proxy", "cluster": {"server": self.url}}],
               "users": [{"name": "proxy", "user": {}}],
               "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "proxy"}}]}
        path.write_text(yaml.safe_dump(doc))
        path.chmod(0o600)
        return path

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
