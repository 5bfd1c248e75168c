"""What an e2e test sees of a cluster: kubectl, the example manifests and what each container got.

The same code serves the local bed (the kubelet peer records container edits in a pod annotation)
and kind (real containers print their env and /dev, read from the logs).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "deploy" / "examples"
DEVICECLASSES = REPO / "deploy" / "deviceclasses"
FENCE_POLICY = REPO / "deploy" / "helm" / "dra-driver" / "files" / "allocation-fence-policy.yaml"
DRIVER = "gpu.dra-driver.io"
CONTAINERS_ANNOTATION = "e2e.dra-driver.io/containers"
EXPLANATION_ANNOTATION = f"{DRIVER}/explanation"
SUMMARY_ANNOTATION = f"{DRIVER}/explanation-summary"
EXPLAINED_BY_ANNOTATION = f"{DRIVER}/explained-by"


@dataclass
class Bed:
    kubeconfig: Path
    kubectl_bin: str
    kind: bool = False
    fleet: Any = None
    """The local NodeFleet (None on kind): lets reliability tests kill and restart plugins."""
    cluster: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def kubectl(self, *args: str, input_text: str | None = None, check: bool = True,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([self.kubectl_bin, "--kubeconfig", str(self.kubeconfig), *args],
                              input=input_text, capture_output=True, text=True, check=False, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc

    def get(self, kind: str, name: str | None = None, ns: str | None = None, selector: str | None = None) -> Any:
        args = ["get", kind, "-o", "json"]
        if name:
            args.insert(2, name)
        if ns:
            args += ["-n", ns]
        if selector:
            args += ["--field-selector", selector]
        return json.loads(self.kubectl(*args).stdout)

    def apply(self, docs: Iterable[dict[str, Any]], ns: str | None = None, server_dry_run: bool = False) -> None:
        args = ["apply", "-f", "-"]
        if ns:
            args += ["-n", ns]
        if server_dry_run:
            args += ["--dry-run=server"]
        self.kubectl(*args, input_text=yaml.safe_dump_all(list(docs)))

    def delete(self, kind: str, name: str, ns: str, wait: bool = True) -> None:
        self.kubectl("delete", kind, name, "-n", ns, f"--wait={str(wait).lower()}", "--timeout=60s")

    def plugin_log(self, node: str) -> str:
        """The node plugin's log on ``node``: its log file on the bed, its pod's log on kind."""
        if not self.kind:
            return str((self.fleet.procs.logs / f"plugin-{node}.log").read_text(errors="replace"))
        ns = os.environ.get("E2E_DRIVER_NAMESPACE", "dra-driver")
        pods = self.get("pods", ns=ns, selector=f"spec.nodeName={node}")["items"]
        names = [p["metadata"]["name"] for p in pods
                 if p["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "kubelet-plugin"]
        assert names, f"no kubelet-plugin pod on {node} in {ns}"
        return "".join(self.kubectl("logs", name, "-n", ns, "-c", "plugin").stdout for name in names)


def load_manifests(path: Path) -> list[dict[str, Any]]:
    files = sorted(path.glob("*.yaml")) if path.is_dir() else [path]
    docs: list[dict[str, Any]] = []
    for f in files:
        docs += [d for d in yaml.safe_load_all(f.read_text()) if d]
    return docs


def fence_manifests(ledger_namespace: str = "kube-system") -> list[dict[str, Any]]:
    """The allocation-fence policy as the chart ships it, bound to the ledger of a controller whose
    namespace is ``ledger_namespace`` (the bed's controller runs with kube-system)."""
    binding = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": "allocation-fence.gpu.dra-driver.io"},
               "spec": {"policyName": "allocation-fence.gpu.dra-driver.io", "validationActions": ["Deny"],
                        "paramRef": {"name": "dra-driver-allocations", "namespace": ledger_namespace,
                                     "parameterNotFoundAction": "Allow"}}}  # fmt: skip
    return [*load_manifests(FENCE_POLICY), binding]


def example(name: str) -> list[dict[str, Any]]:
    return load_manifests(EXAMPLES / name)


def names_of(docs: Iterable[dict[str, Any]], kind: str) -> list[str]:
    return [d["metadata"]["name"] for d in docs if d.get("kind") == kind]


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 90.0, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last seen: {last!r}")


def pod_phase(bed: Bed, ns: str, pod: str) -> str:
    return str(bed.get("pod", pod, ns).get("status", {}).get("phase", ""))


def wait_running(bed: Bed, ns: str, pod: str, timeout: float = 90.0) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        obj: dict[str, Any] = bed.get("pod", pod, ns)
        phase = obj.get("status", {}).get("phase")
        if phase == "Failed":
            raise AssertionError(f"pod {ns}/{pod} failed: {obj['status'].get('message')}")
        return obj if phase == "Running" else None

    try:
        result: dict[str, Any] = wait_for(f"pod {ns}/{pod} to run", probe, timeout)
    except AssertionError as exc:
        # "last seen: None" alone says nothing; the scheduler's and kubelet's own words do.
        status = bed.get("pod", pod, ns).get("status", {})
        said = [f"{c.get('type')}={c.get('status')} {c.get('reason', '')}: {c.get('message', '')}"
                for c in status.get("conditions", [])]
        raise AssertionError(f"{exc}; phase {status.get('phase')!r}, conditions {said}") from None
    return result


def observed(bed: Bed, ns: str, pod: str) -> dict[str, dict[str, Any]]:
    """Per container: the env and device nodes the container really got."""
    obj = bed.get("pod", pod, ns)
    if not bed.kind:
        raw = obj["metadata"].get("annotations", {}).get(CONTAINERS_ANNOTATION)
        assert raw, f"pod {ns}/{pod} has no {CONTAINERS_ANNOTATION} annotation"
        data: dict[str, dict[str, Any]] = json.loads(raw)
        return data
    result: dict[str, dict[str, Any]] = {}
    for c in obj["spec"]["containers"]:
        logs = bed.kubectl("logs", pod, "-n", ns, "-c", c["name"]).stdout
        # The example containers print `env` lines and `ls -l /dev/nvidia*` lines.
        env = dict(line.split("=", 1) for line in logs.splitlines() if "=" in line and "/dev/" not in line)
        result[c["name"]] = {"env": env, "devices": [{"path": path} for path in listed_devices(logs)]}
    return result


def listed_devices(ls_output: str) -> list[str]:
    """Device paths in ``ls -l /dev/nvidia*`` output: files name themselves; a directory
    (``/dev/nvidia-caps``) is a ``/dev/nvidia-caps:`` header followed by its entries' bare names."""
    paths: list[str] = []
    folder = ""
    for line in ls_output.splitlines():
        if line.startswith("/dev/") and line.endswith(":"):
            folder = line[:-1]
        elif not line.strip():
            folder = ""
        elif folder and line[:1] in ("c", "b"):
            paths.append(f"{folder}/{line.split()[-1]}")
        else:
            paths += [tok for tok in line.split() if tok.startswith("/dev/")]
    return paths


def claim_of(bed: Bed, ns: str, pod: str, pod_claim: str) -> dict[str, Any]:
    """The ResourceClaim behind a pod's claim entry (generated from a template or named)."""
    def probe() -> str | None:
        obj = bed.get("pod", pod, ns)
        for entry in obj["spec"].get("resourceClaims", []):
            if entry["name"] == pod_claim and entry.get("resourceClaimName"):
                return str(entry["resourceClaimName"])
        for st in obj.get("status", {}).get("resourceClaimStatuses", []):
            if st["name"] == pod_claim and st.get("resourceClaimName"):
                return str(st["resourceClaimName"])
        return None

    name = wait_for(f"claim {pod_claim} of {ns}/{pod}", probe, 30)
    claim: dict[str, Any] = bed.get("resourceclaim", name, ns)
    return claim


def slice_devices(bed: Bed) -> dict[tuple[str, str], dict[str, Any]]:
    """Every published device of our driver, keyed by (pool, device)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for s in bed.get("resourceslices", selector=f"spec.driver={DRIVER}")["items"]:
        for d in s["spec"].get("devices", []):
            out[(s["spec"]["pool"]["name"], d["name"])] = d
    return out


def allocated(bed: Bed, claim: dict[str, Any]) -> list[dict[str, Any]]:
    """The claim's allocated devices, as published in the slices (attributes and capacity)."""
    devices = slice_devices(bed)
    results = claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
    return [devices[(r["pool"], r["device"])] | {"_result": r} for r in results if r["driver"] == DRIVER]


def attr(device: dict[str, Any], name: str) -> Any:
    value = device.get("attributes", {}).get(name, {})
    for kind in ("string", "int", "bool", "version"):
        if kind in value:
            return value[kind]
    return None


def kubectl_binary(bin_dir: Path | None) -> str:
    if bin_dir is not None:
        return str(bin_dir / "kubectl")
    found = shutil.which("kubectl")
    if not found:
        raise RuntimeError("kubectl not found on PATH")
    return found


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes")
