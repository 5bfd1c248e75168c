"""`dra-driver probe`: a startup/liveness check that really talks to the plugin's gRPC sockets.

Exit 0 when the registration socket answers GetInfo as a DRA plugin and the DRA socket it names
accepts a connection; otherwise exit 1 with one line saying what is wrong.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
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


def serve_healthz(port: int, check_fn: Callable[[], str | None], host: str = "0.0.0.0") -> ThreadingHTTPServer:
    """``GET /healthz``: 200 when ``check_fn`` finds nothing wrong, else 503 with the problem."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] not in ("/healthz", "/livez", "/readyz"):
                self.send_error(404)
                return
            problem = check_fn()
            body = (f"{problem}\n" if problem else "ok\n").encode()
            self.send_response(503 if problem else 200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return  # probes every few seconds would drown the real log

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="healthz", daemon=True).start()
    return server
