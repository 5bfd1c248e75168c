"""kwok on the bed: thousands of Nodes kept Ready, and the pods bound to them run, with no kubelet.

kwok (``sigs.k8s.io/kwok``, pinned in ``gotools/kwok``) manages the Nodes that carry
:data:`NODE_ANNOTATION`: it fills in their status, renews their Lease and plays its pod stages on
the pods bound to them (Pending -> Running, and deletion). The stages are kwok's own, read from the
pinned module (``kustomize/stage``) in the Go module cache, where the build left it; go.sum
checks their bytes like the rest of the module.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.testbed.cluster import die_with_parent, stop_process
from e2e.tooling import gotools
from e2e.tooling.toolsets import KWOK_TOOL as TOOL

NODE_ANNOTATION = "kwok.x-k8s.io/node"
NODE_ANNOTATION_VALUE = "fake"
STAGES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
)
# kwok renews a Lease every quarter of its duration. A kubelet's 40 s (a write every 10 s per node)
# is 500 writes/s at 5,000 nodes, which a 2-core machine would spend on heartbeats instead of the
# workload (400 s: one write per node every 100 s); the controller-manager's grace period must then
# outlast a renewal (LEASE_GRACE_ARGS).
LEASE_SECONDS = 400
LEASE_GRACE_ARGS = ("--node-monitor-grace-period=480s",)


def module_dir() -> Path:
    """kwok's source at its pin, from the module cache (downloaded, and checked, on a miss)."""
    tool = gotools.TOOLS[TOOL]
    proc = subprocess.run(["go", "mod", "download", "-json", f"{tool.module}@{tool.version()}"], cwd=tool.folder,
                          env=gotools.go_env(), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise gotools.ToolError(f"kwok: cannot find {tool.module}@{tool.version()} in the module cache: "
                                f"{proc.stderr.strip()[-2000:]}")
    return Path(json.loads(proc.stdout)["Dir"])


def stage_files(root: Path | None = None) -> list[Path]:
    base = (root or module_dir()) / "kustomize" / "stage"
    files = [base / s for s in STAGES]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise gotools.ToolError(f"kwok: the pinned module has no stage file {', '.join(missing)}; "
                                "were the stages moved in a new kwok release?")
    return files


def fake_node(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Node for kwok to manage."""
    return {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "annotations": {NODE_ANNOTATION: NODE_ANNOTATION_VALUE},
        "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                   "type": "kwok", **(labels or {})}}}


def is_ready(node: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (node.get("status") or {}).get("conditions") or [])


@dataclass
class Kwok:
    """One kwok process against a bed, logging to ``<logs>/kwok.log``."""

    kubeconfig: Path
    logs: Path
    lease_seconds: int = LEASE_SECONDS
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> None:
        binary = gotools.ensure([TOOL]) / "kwok"
        args = [str(binary), f"--kubeconfig={self.kubeconfig}",
                f"--manage-nodes-with-annotation-selector={NODE_ANNOTATION}={NODE_ANNOTATION_VALUE}",
                f"--node-lease-duration-seconds={self.lease_seconds}",
                # kwok hands out pod IPs from this range; its /24 default runs out at 254 pods.
                "--cidr=10.128.0.0/9",
                # Its INFO level logs every Lease renewal: megabytes a minute at 5,000 nodes.
                "--v=WARN",
                *(f"--config={f}" for f in stage_files())]
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / "kwok.log", "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         preexec_fn=die_with_parent)

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = (self.logs / "kwok.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"kwok exited with {self.proc.returncode}:\n{tail}")

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None

    def wait_running(self, timeout: float = 60.0) -> None:
        """Until kwok has started its controllers (it logs them), or raise with its log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            if "Starting" in (self.logs / "kwok.log").read_text(errors="replace"):
                return
            time.sleep(0.2)
        raise TimeoutError(f"kwok did not start within {timeout:.0f}s; see {self.logs / 'kwok.log'}")
