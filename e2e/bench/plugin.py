"""Running our node plugin the way the bed does, and talking to its sockets like the kubelet.

The plugin runs as its own process with exactly the flags ``e2e/testbed/nodes.py`` passes (the
Helm chart's flags with paths under a scratch directory); no kubelet peer runs, the benchmark
itself plays the kubelet's part (GetInfo, NotifyRegistrationStatus, Node(Un)PrepareResources).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

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
