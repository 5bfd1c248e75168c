"""The release that e2e/suites/kind/run-e2e.sh installed, and helpers to look at kind nodes as hosts."""


from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver.ondisk import SocketPaths, socket_paths
from e2e.testbed.clusterview import DRIVER, REPO, Bed, wait_for

CHART = REPO / "deploy" / "helm" / "dra-driver"
ALTERNATIVE_ROOT = "/var/lib/kubelet-alternative"
ROOT_LABEL = "e2e.dra-driver.io/kubelet-root"


@dataclass
class Install:
    """The release run-e2e.sh installed, and the tools to change it."""

    bed: Bed
    namespace: str
    release: str
    image: str
    cluster: str
    helm_bin: str
    kind_bin: str
    profile: str

    def helm(self, *args: str, timeout: float = 420) -> str:
        return run([self.helm_bin, "--kubeconfig", str(self.bed.kubeconfig), *args], timeout=timeout).stdout

    def upgrade(self, *sets: str) -> None:
        self.helm("upgrade", self.release, str(CHART), "-n", self.namespace, "--reset-then-reuse-values", "--wait",
                  "--timeout", "5m", *sets)
        self.rollout()

    def install(self, *sets: str) -> None:
        repo, tag = self.image.rsplit(":", 1)
        self.helm("install", self.release, str(CHART), "-n", self.namespace, "--create-namespace", "--wait",
                  "--timeout", "5m", "--set", f"image.repository={repo}", "--set", f"image.tag={tag}",
                  "--set", "image.pullPolicy=Never", "--set", "gpuBackend=simulated", "--set", "logFormat=console",
                  "--set", f"simulatedProfile={self.profile}",
                  "--set-json", f'kubeletPlugin.nodeSelector={{"{ROOT_LABEL}":"default"}}', *sets)
        self.rollout()

    def rollout(self) -> None:
        self.bed.kubectl("-n", self.namespace, "rollout", "status", f"daemonset/{self.release}-kubelet-plugin",
                         "--timeout=300s", timeout=320)

    def plugin_pods(self) -> list[dict[str, Any]]:
        return self._pods("kubelet-plugin")

    def controller_pods(self) -> list[dict[str, Any]]:
        return self._pods("controller")

    def _pods(self, component: str) -> list[dict[str, Any]]:
        """The release's live pods of one component (not those already terminating)."""
        pods = self.bed.get("pods", ns=self.namespace)["items"]
        return [p for p in pods if p["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
                and not p["metadata"].get("deletionTimestamp")]

    def load_image(self, image: str) -> None:
        run([self.kind_bin, "load", "docker-image", image, "--name", self.cluster], timeout=300)

    def node_slices(self, node: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.bed.get(
            "resourceslices", selector=f"spec.nodeName={node},spec.driver={DRIVER}")["items"]
        return items


def run(cmd: Sequence[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, check=False, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd[:4])} failed: {proc.stderr.strip()}"
    return proc


def on_node(node: str, script: str) -> str:
    """A shell script run on a kind node (its container): the host a plugin writes to."""
    return run(["docker", "exec", node, "sh", "-c", script]).stdout


def plugin_sockets(pod: dict[str, Any], kubelet_root: str = "/var/lib/kubelet") -> SocketPaths:
    """Where a plugin pod's sockets are on its node: named after the pod, as the chart's rolling
    updates (the default) have them."""
    return socket_paths(DRIVER, Path(kubelet_root) / "plugins_registry", Path(kubelet_root) / "plugins" / DRIVER,
                        str(pod["metadata"]["uid"]))


def cdi_specs(node: str) -> list[str]:
    return [n for n in on_node(node, "ls -1 /var/run/cdi 2>/dev/null || true").split() if "dra-driver" in n]


def nodes_labelled(bed: Bed, value: str) -> list[str]:
    items = bed.get("nodes")["items"]
    return sorted(n["metadata"]["name"] for n in items if n["metadata"].get("labels", {}).get(ROOT_LABEL) == value)


def claim_and_pod(ns: str, name: str, node: str | None = None) -> list[dict[str, Any]]:
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 1, "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
        "containers": [{"name": "ctr0", "image": "busybox:1.36", "command": ["sleep", "86400"],
                        "resources": {"claims": [{"name": "gpu"}]}}]}
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return [
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": ns},
         "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": f"gpu.{DRIVER}"}}]}}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns}, "spec": spec},
    ]


def wait_gone(bed: Bed, what: str, probe: Any, timeout: float = 120) -> None:
    wait_for(what, lambda: not probe(), timeout=timeout, interval=2)


def pod_json(bed: Bed, ns: str, name: str) -> dict[str, Any] | None:
    proc = bed.kubectl("get", "pod", name, "-n", ns, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None
