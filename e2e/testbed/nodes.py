"""Simulated GPU nodes on the bed: per node, the kubelet peer and our node plugin, plus one controller.

The plugin gets exactly the flags the Helm chart's DaemonSet passes, only with every kubelet path
moved under the node's own directory so several nodes share one machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.testbed import mocknvml, pids
from e2e.testbed.cluster import die_with_parent, free_port, stop_process
from e2e.tooling import bytecode

DRIVER_NAME = "gpu.dra-driver.io"
REPO = Path(__file__).resolve().parents[2]

# Which simulated profile each node gets, so the scenarios find H100s, MIG-enabled A100s and a
# mixed node.
NODE_PROFILES = ("h100-8x", "a100-mig", "mixed-l4-t4")
REFUSED_NAMESPACE_LABEL = "e2e.dra-driver.io/controller-allocation-refused"
"""The bed's controller allocates annotated claims in every namespace but those with this label
(the chart's default allows none): the suites' fresh namespaces need no label, and a test of the
gate labels its own."""


@dataclass
class SimNode:
    name: str
    profile: str
    root: Path
    health_port: int = field(default_factory=free_port)
    """The plugin's /healthz and /metrics; kept across restarts so tests can always find it."""
    nvml_machine: str | None = None
    """Set: the plugin runs the NVML backend, unchanged, on this mock DGX (``e2e/testbed/mocknvml.py``)
    from a fake driver root, instead of simulated GPUs."""
    flags: tuple[str, ...] = ()
    """Plugin flags of this node on every start (``--dynamic-mig``)."""
    driver_name: str = DRIVER_NAME
    """The plugin's ``--driver-name``: a second driver on the bed (``gpu.nvidia.com`` with
    ``--api-profile=nvidia`` in ``flags``) runs beside the bed's own on nodes of its own."""

    @property
    def registry_dir(self) -> Path:
        return self.root / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        return self.root / "plugins"

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    @property
    def dev_root(self) -> Path:
        return self.root / "devroot"

    @property
    def state_dir(self) -> Path:
        return self.root / "plugin-state"

    @property
    def peer_state_dir(self) -> Path:
        return self.root / "peer-state"

    @property
    def driver_root(self) -> Path:
        return self.root / "driver-root"

    @property
    def sys_root(self) -> Path:
        return self.root / "sys"

    @property
    def nvml_state(self) -> Path:
        """The mock's MIG state (DRA_MOCK_NVML_STATE): what a test reads to see the GPU instances."""
        return self.root / "mock-nvml-state.json"

    def backend_args(self) -> list[str]:
        if self.nvml_machine is None:
            return ["--gpu-backend=simulated", f"--simulated-profile={self.profile}"]
        # The mock root holds libnvidia-ml alone: no driver for the toolkit to find (see e2e/testbed/fakedriver.py).
        return ["--gpu-backend=nvml", f"--nvidia-driver-root={self.driver_root}", f"--sysfs-root={self.sys_root}",
                "--no-driver-edits"]

    def plugin_env(self) -> dict[str, str]:
        return mocknvml.environment(self.nvml_machine, self.nvml_state) if self.nvml_machine else {}

    def prepare_nvml(self) -> None:
        """The driver root with the mock's libnvidia-ml.so.1 and a sysfs placing its GPUs."""
        if self.nvml_machine is not None:
            mocknvml.make_driver_root(self.driver_root)
            mocknvml.make_sysfs(self.sys_root)

    def plugin_args(self, kubeconfig: Path, extra: tuple[str, ...] = ()) -> list[str]:
        # The mock's environment rides on the command line (env(1) execs the plugin), so every way
        # of (re)starting a node's plugin gives it the same machine and MIG state.
        environment = [f"{k}={v}" for k, v in self.plugin_env().items()]
        return [
            *(["env", *environment] if environment else []),
            *bytecode.shipped_python(), "-m", "dra_driver", "kubelet-plugin",
            f"--node-name={self.name}",
            f"--driver-name={self.driver_name}",
            *self.backend_args(),
            f"--kubelet-registry-dir={self.registry_dir}",
            f"--kubelet-plugins-dir={self.plugins_dir}",
            f"--cdi-root={self.cdi_dir}",
            f"--state-dir={self.state_dir}",
            f"--dev-root={self.dev_root}",
            f"--kubeconfig={kubeconfig}",
            "--log-format=json",
            "--cleanup-interval=5",
            "--stale-claim-grace=5",  # a stale claim is unprepared within ~15 s (two sweeps, then the grace)
            f"--health-port={self.health_port}",
            *self.flags,
            *extra,
        ]

    def peer_args(self, kubeconfig: Path) -> list[str]:
        return [
            sys.executable, "-m", "e2e.kubelet_peer",
            f"--node-name={self.name}",
            f"--kubeconfig={kubeconfig}",
            f"--registry-dir={self.registry_dir}",
            f"--cdi-dir={self.cdi_dir}",
            f"--state-dir={self.peer_state_dir}",
        ]


@dataclass
class Processes:
    """Child processes with their logs, stopped together."""

    logs: Path
    detached: bool = False
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    started: dict[str, pids.Identity] = field(default_factory=dict)
    """What each pid named when it started: what :func:`stop_detached` checks before signalling."""

    def start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                args, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                preexec_fn=None if self.detached else die_with_parent,
                start_new_session=self.detached,
            )
        self.procs[name] = proc
        started = pids.identify(proc.pid)
        if started is not None:  # else it exited at once: check_alive reports it
            self.started[name] = started
        return proc

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.pop(name, None)
        self.started.pop(name, None)
        if proc and proc.poll() is None:
            proc.send_signal(sig)
            proc.wait(timeout=15)

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        self.started.pop(name, None)
        stop_process(proc, timeout=15)

    def stop_all(self) -> None:
        for name in reversed(list(self.procs)):
            self.stop(name)

    def identities(self) -> dict[str, dict[str, Any]]:
        """The running processes, as :func:`stop_detached` (another process) reads them from a file."""
        return {k: started.to_json() for k, started in self.started.items()}

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail}")


@dataclass
class NodeFleet:
    """The simulated nodes of a bed and the driver processes serving them."""

    workdir: Path
    kubeconfig: Path
    node_names: tuple[str, ...]
    detached: bool = False
    nodes: dict[str, SimNode] = field(default_factory=dict)
    procs: Processes = field(init=False)
    controller_port: int = field(default_factory=free_port)
    """The controller's /metrics and /healthz."""

    def __post_init__(self) -> None:
        self.procs = Processes(self.workdir / "logs", detached=self.detached)
        for i, name in enumerate(self.node_names):
            self.nodes[name] = SimNode(name, NODE_PROFILES[i % len(NODE_PROFILES)], self.workdir / "nodes" / name)

    def start(self, with_controller: bool = True, timeout: float = 60.0) -> None:
        self._start_nodes(list(self.nodes.values()), timeout)
        if with_controller:
            self.procs.start("controller", [
                *bytecode.shipped_python(), "-m", "dra_driver", "controller", f"--kubeconfig={self.kubeconfig}",
                f"--driver-name={DRIVER_NAME}", "--log-format=json", f"--metrics-port={self.controller_port}",
                "--leader-election-namespace=kube-system", "--resync-seconds=5",
                f"--allocation-namespace-selector=!{REFUSED_NAMESPACE_LABEL}",
            ])

    def _start_nodes(self, nodes: list[SimNode], timeout: float) -> None:
        for node in nodes:
            for d in (node.registry_dir, node.plugins_dir, node.cdi_dir, node.dev_root, node.peer_state_dir):
                d.mkdir(parents=True, exist_ok=True)
            node.prepare_nvml()
            (node.peer_state_dir / "ready").unlink(missing_ok=True)
            self.procs.start(f"peer-{node.name}", node.peer_args(self.kubeconfig))
        # As on a real node, the kubelet is up (and has wiped the node's slices) before the plugin.
        deadline = time.monotonic() + timeout
        for node in nodes:
            while not (node.peer_state_dir / "ready").exists():
                self.procs.check_alive()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the kubelet peer of {node.name} did not get ready")
                time.sleep(0.05)
            self.start_plugin(node.name)

    def add_node(self, node: SimNode, timeout: float = 60.0) -> None:
        """One more node (its kubelet peer registers it) with its plugin, on a fleet already running."""
        self.add_nodes([node], timeout)

    def add_nodes(self, nodes: list[SimNode], timeout: float = 60.0) -> None:
        """More nodes at once: their peers and plugins start side by side."""
        for node in nodes:
            self.nodes[node.name] = node
        self._start_nodes(nodes, timeout)

    def remove_node(self, name: str) -> None:
        """Stop a node's plugin and kubelet peer; its Node object and slices stay for the caller."""
        self.procs.stop(f"plugin-{name}")
        self.procs.stop(f"peer-{name}")
        self.nodes.pop(name, None)

    def start_plugin(self, node_name: str, extra: tuple[str, ...] = ()) -> None:
        self.procs.start(f"plugin-{node_name}", self.nodes[node_name].plugin_args(self.kubeconfig, extra))

    def wait_registered(self, timeout: float = 30.0) -> None:
        """Wait until every plugin created its registration socket."""
        deadline = time.monotonic() + timeout
        for node in self.nodes.values():
            sock = node.registry_dir / f"{node.driver_name}-reg.sock"
            while not sock.exists():
                self.procs.check_alive()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"plugin for {node.name} did not create {sock}")
                time.sleep(0.1)

    def stop(self) -> None:
        self.procs.stop_all()


def stop_detached(recorded: Mapping[str, object]) -> None:
    """Stop processes a detached fleet left running, from what :meth:`Processes.identities` wrote;
    a pid that names another process by now is left alone."""
    for name, value in recorded.items():
        started = pids.from_json(value)
        if started is None:
            print(f"not stopping {name} ({value!r}): recorded without its start time", file=sys.stderr)
            continue
        pids.send(started, signal.SIGTERM, group=True)
