"""`dra-driver probe`: a startup/liveness check that really talks to the plugin's gRPC sockets.

Exit 0 when the registration socket answers GetInfo as a DRA plugin and the DRA socket it names
accepts a connection; otherwise exit 1 with one line saying what is wrong. The plugin's HTTP port
(:mod:`~dra_driver.node.kubelet.httpport`) answers the same check on ``/healthz`` and ``/livez``.
"""

from __future__ import annotations

import sys
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
