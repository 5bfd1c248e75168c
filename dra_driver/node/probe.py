"""`dra-driver probe`: a startup/liveness check that really talks to the plugin's gRPC sockets.

Exit 0 when the registration socket answers GetInfo as a DRA plugin and the DRA socket it names
accepts a connection; otherwise exit 1 with one line saying what is wrong.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc

from dra_driver._proto.pluginregistration import api_pb2 as reg_pb2
from dra_driver._proto.pluginregistration import api_pb2_grpc as reg_grpc


def check(registration_socket: Path, driver_name: str, timeout: float = 1.0) -> str | None:
    """None when healthy, else the problem in words."""
    if not registration_socket.is_socket():
        return f"registration socket {registration_socket} does not exist"
    with grpc.insecure_channel(f"unix:{registration_socket}") as channel:
        try:
            stub = reg_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            info = stub.GetInfo(reg_pb2.InfoRequest(), timeout=timeout)
        except grpc.RpcError as exc:
            return f"GetInfo on {registration_socket} failed: {exc.code().name} {exc.details()}"
    if info.type != "DRAPlugin" or info.name != driver_name:
        return f"{registration_socket} answers as {info.type}/{info.name}, expected DRAPlugin/{driver_name}"
    endpoint = Path(info.endpoint)
    with grpc.insecure_channel(f"unix:{endpoint}") as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            return f"DRA socket {endpoint} does not accept connections"
    return None


def main(registration_socket: str, driver_name: str) -> int:
    problem = check(Path(registration_socket), driver_name)
    if problem:
        print(f"probe: {problem}", file=sys.stderr)
        return 1
    return 0


def serve_healthz(port: int, check_fn: Callable[[], str | None], host: str = "0.0.0.0",
                  pages: Mapping[str, Callable[[], tuple[bytes, str]]] | None = None) -> ThreadingHTTPServer:
    """``GET /healthz``: 200 when ``check_fn`` finds nothing wrong, else 503 with the problem;
    ``pages`` adds more paths (``/metrics``), each answering ``(body, content type)``."""
    extra = dict(pages or {})

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path in extra:
                body, ctype = extra[path]()
                self._reply(200, body, ctype)
                return
            if path not in ("/healthz", "/livez", "/readyz"):
                self.send_error(404)
                return
            problem = check_fn()
            self._reply(503 if problem else 200, (f"{problem}\n" if problem else "ok\n").encode(), "text/plain")

        def _reply(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # probes every few seconds would drown the real log

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="healthz", daemon=True).start()
    return server
