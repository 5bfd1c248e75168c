"""`dra-driver probe`: a startup/liveness check that really talks to the plugin's gRPC sockets.

Exit 0 when the registration socket answers GetInfo as a DRA plugin and the DRA socket it names
accepts a connection; otherwise exit 1 with one line saying what is wrong.

The plugin's HTTP port answers the same check on ``/healthz`` and ``/livez``. ``/readyz`` adds
whether publishing is degraded (a device withheld from the ResourceSlices because the API server
would refuse it), with the devices and rules in its body. Degraded is *not ready*, never *not
alive*: the liveness and startup probes stay on the socket check, so the kubelet does not restart a
plugin that serves the node's other GPUs (a restart would withhold the same device again). The
kubelet keeps calling a plugin that is not Ready: registration goes through the sockets.

The chart wires a readiness probe to ``/readyz`` only on request
(``kubeletPlugin.probes.readiness.enabled``): with the default surge rollout the old pod goes only
once the new one is Ready, so one degraded node would stop the DaemonSet's rollout everywhere, the
rollout of a fix included. What an operator sees by default is the ``DeviceWithheld`` Event on
the Node, ``dra_driver_plugin_devices_withheld{reason}`` (the one to alert on) and the log line.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import grpc

from dra_driver import httpserve
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


READY_PATH = "/readyz"


def serve_healthz(port: int, check_fn: Callable[[], str | None], host: str = "0.0.0.0",
                  pages: Mapping[str, Callable[[], tuple[bytes, str]]] | None = None,
                  degraded_fn: Callable[[], str | None] | None = None) -> httpserve.Server:
    """``GET /healthz`` (and ``/livez``): 200 when ``check_fn`` finds nothing wrong, else 503 with
    the problem; ``/readyz`` also asks ``degraded_fn``. ``pages`` adds more paths (``/metrics``),
    each answering ``(body, content type)``."""
    def answer(problem: str | None) -> tuple[int, bytes, str]:
        return (503, f"{problem}\n".encode(), "text/plain") if problem else (200, b"ok\n", "text/plain")

    def health() -> tuple[int, bytes, str]:
        return answer(check_fn())

    def ready() -> tuple[int, bytes, str]:
        return answer(check_fn() or (degraded_fn() if degraded_fn is not None else None))

    def ok(page: Callable[[], tuple[bytes, str]]) -> httpserve.Page:
        return lambda: (200, *page())

    routes: dict[str, httpserve.Page] = {path: health for path in httpserve.HEALTH_PATHS}
    routes[READY_PATH] = ready
    routes.update({path: ok(page) for path, page in (pages or {}).items()})
    server = httpserve.bind(host, port, routes)
    httpserve.serve_in_background(server, "healthz")
    return server
