"""Running our node plugin the way the bed does, and talking to its sockets like the kubelet.

The plugin runs as its own process with exactly the flags ``e2e/testbed/nodes.py`` passes (the
Helm chart's flags with paths under a scratch directory); no kubelet peer runs, the benchmark
itself plays the kubelet's part (GetInfo, NotifyRegistrationStatus, Node(Un)PrepareResources).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from dra_driver._proto.dra.v1 import api_pb2 as dra_pb
from dra_driver._proto.dra.v1 import api_pb2_grpc as dra_grpc
from dra_driver._proto.pluginregistration import api_pb2 as reg_pb
from dra_driver._proto.pluginregistration import api_pb2_grpc as reg_grpc
from e2e.testbed.nodes import DRIVER_NAME, Processes, SimNode


@dataclass
class RunningPlugin:
    node: SimNode
    procs: Processes
    pid: int
    spawned: float
    """time.monotonic() just before the process was spawned."""

    @property
    def registration_socket(self) -> Path:
        return self.node.registry_dir / f"{DRIVER_NAME}-reg.sock"

    @property
    def dra_socket(self) -> Path:
        return self.node.plugins_dir / DRIVER_NAME / "dra.sock"

    def stop(self) -> None:
        self.procs.stop_all()


def start_plugin(root: Path, kubeconfig: Path, node_name: str, profile: str = "h100-8x",
                 extra: tuple[str, ...] = (), env: dict[str, str] | None = None) -> RunningPlugin:
    node = SimNode(node_name, profile, root / node_name)
    for d in (node.registry_dir, node.plugins_dir, node.cdi_dir, node.dev_root):
        d.mkdir(parents=True, exist_ok=True)
    procs = Processes(root / "logs")
    spawned = time.monotonic()
    proc = procs.start(f"plugin-{node_name}", node.plugin_args(kubeconfig, extra), env=env)
    return RunningPlugin(node, procs, proc.pid, spawned)


def get_info(socket: Path, timeout: float = 1.0) -> Any:
    with grpc.insecure_channel(f"unix:{socket}") as channel:
        return reg_grpc.RegistrationStub(channel).GetInfo(reg_pb.InfoRequest(), timeout=timeout)  # type: ignore[no-untyped-call]


def notify_registered(socket: Path, timeout: float = 1.0) -> None:
    with grpc.insecure_channel(f"unix:{socket}") as channel:
        reg_grpc.RegistrationStub(channel).NotifyRegistrationStatus(  # type: ignore[no-untyped-call]
            reg_pb.RegistrationStatus(plugin_registered=True), timeout=timeout)


def wait_get_info(plugin: RunningPlugin, timeout: float = 60.0) -> tuple[float, float]:
    """Seconds from spawn until the registration socket exists, and until it answers GetInfo."""
    deadline = time.monotonic() + timeout
    socket_at = None
    while time.monotonic() < deadline:
        plugin.procs.check_alive()
        if plugin.registration_socket.exists():
            socket_at = socket_at or time.monotonic()
            try:
                get_info(plugin.registration_socket, timeout=0.5)
                return socket_at - plugin.spawned, time.monotonic() - plugin.spawned
            except grpc.RpcError:
                pass
        time.sleep(0.005)
    raise TimeoutError(f"plugin did not answer GetInfo on {plugin.registration_socket}")


def vm_rss_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) of a process, in KiB, from /proc/<pid>/status."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0])
    return out


class DraClient:
    """NodePrepareResources / NodeUnprepareResources (v1) over the plugin's Unix socket."""

    def __init__(self, socket: Path) -> None:
        self.channel = grpc.insecure_channel(f"unix:{socket}")
        grpc.channel_ready_future(self.channel).result(timeout=30)
        self.stub = dra_grpc.DRAPluginStub(self.channel)  # type: ignore[no-untyped-call]

    @staticmethod
    def _claims(claims: Sequence[tuple[str, str, str]]) -> list[Any]:
        return [dra_pb.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]

    def prepare_request(self, claims: Sequence[tuple[str, str, str]]) -> Any:
        return dra_pb.NodePrepareResourcesRequest(claims=self._claims(claims))

    def unprepare_request(self, claims: Sequence[tuple[str, str, str]]) -> Any:
        return dra_pb.NodeUnprepareResourcesRequest(claims=self._claims(claims))

    def prepare(self, claims: Sequence[tuple[str, str, str]], timeout: float = 60.0) -> dict[str, str]:
        """Per claim UID: the error ("" when prepared)."""
        resp = self.stub.NodePrepareResources(self.prepare_request(claims), timeout=timeout)
        return {uid: r.error for uid, r in resp.claims.items()}

    def unprepare(self, claims: Sequence[tuple[str, str, str]], timeout: float = 60.0) -> dict[str, str]:
        resp = self.stub.NodeUnprepareResources(self.unprepare_request(claims), timeout=timeout)
        return {uid: r.error for uid, r in resp.claims.items()}

    def close(self) -> None:
        self.channel.close()


def check_errors(results: dict[str, str], expected: int, what: str) -> None:
    errors = {uid: e for uid, e in results.items() if e}
    if errors or len(results) != expected:
        sample = next(iter(errors.values()), "")
        raise RuntimeError(f"{what}: {len(errors)} of {len(results)} claims failed (expected {expected}): {sample}")
