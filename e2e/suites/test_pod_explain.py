"""Why is my pod pending, answered where people look (issue 43), on the bed's real control plane.

- ``kubectl describe pod`` (the bed's kubectl) shows the controller's reason for a pod whose claim
  cannot be allocated, and that Event stops being repeated once the pod is scheduled or deleted.
- ``kubectl dra explain`` found through kubectl's own plugin lookup (``PATH``), for a pod with a
  template claim, with ``-n``, ``-A`` and ``--context``.
- Bad input: one line, exit 1, no traceback (unknown pod, pod without claims, another driver's
  claim, a namespace RBAC forbids, a context that is not there).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.testbed.clusterview import DRIVER, EXPLANATION_ANNOTATION, Bed, claim_of, example, wait_for, wait_running

REPORTER = f"{DRIVER}/controller"
GPU_CLASS = "gpu.gpu.dra-driver.io"
H100 = f'device.attributes["{DRIVER}"].productName.startsWith("NVIDIA H100")'
QUIET_SECONDS = 15.0
"""Longer than the Event recorder's 10 s between writes of a series: a repeat would show by then."""

pytestmark = pytest.mark.testbed_only


def pod_events(bed: Bed, ns: str, pod: str) -> list[dict[str, Any]]:
    """Our controller's Events about ``pod`` (events.k8s.io, as the controller writes them)."""
    items = bed.get("events.events.k8s.io", ns=ns)["items"]
    return [e for e in items if e.get("regarding", {}).get("kind") == "Pod" and e["regarding"].get("name") == pod
            and e.get("reportingController") == REPORTER]


def counts(events: list[dict[str, Any]]) -> dict[str, int]:
    return {e["metadata"]["name"]: (e.get("series") or {}).get("count", 1) for e in events}


def described_events(bed: Bed, ns: str, pod: str) -> str:
    return bed.kubectl("describe", "pod", pod, "-n", ns).stdout.split("Events:", 1)[-1]


def template_pod(name: str, count: int, selector: str) -> list[dict[str, Any]]:
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
                "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                    "deviceClassName": GPU_CLASS, "count": count, "selectors": [{"cel": {"expression": selector}}]}}]}}}}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "terminationGracePeriodSeconds": 1,
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": name}],
        "containers": [{"name": "ctr0", "image": "busybox:1.36", "command": ["sh", "-c", "sleep 86400"],
                        "resources": {"claims": [{"name": "gpu"}]}}]}}
    return [template, pod]


def assert_quiet(bed: Bed, ns: str, pod: str, before: dict[str, int]) -> None:
    time.sleep(QUIET_SECONDS)
    assert counts(pod_events(bed, ns, pod)) == before, "the controller went on telling a pod that no longer waits"


# --------------------------------------------------------------------------- kubectl describe pod


def test_describe_pod_shows_the_reason_until_the_pod_is_deleted(bed: Bed, ns: str) -> None:
    bed.apply(example("unsatisfiable"), ns=ns)
    claim = claim_of(bed, ns, "unsatisfiable", "gpu")["metadata"]["name"]
    line = f"claim gpu ({claim}): "
    events = str(wait_for("the controller's reason in kubectl describe pod",
                          lambda: out if line in (out := described_events(bed, ns, "unsatisfiable")) else None, 90, 1.0))
    assert "Unsatisfiable" in events and REPORTER in events, events
    assert "1Ti" in events or "0 candidates" in events, events
    [ev] = pod_events(bed, ns, "unsatisfiable")
    assert ev["type"] == "Warning" and ev["note"].startswith(line) and "\n" not in ev["note"], ev
    bed.delete("pod", "unsatisfiable", ns)
    assert_quiet(bed, ns, "unsatisfiable", counts(pod_events(bed, ns, "unsatisfiable")))


def test_the_reason_stops_once_the_pod_is_scheduled(bed: Bed, ns: str) -> None:
    """A pod waits for an H100 while another pod holds all eight; once that one goes, it is scheduled."""
    bed.apply(template_pod("holder", 8, H100), ns=ns)
    wait_running(bed, ns, "holder", timeout=120)
    bed.apply(template_pod("waiter", 1, H100), ns=ns)
    claim = claim_of(bed, ns, "waiter", "gpu")["metadata"]["name"]
    wait_for("the waiting pod told why", lambda: any(
        e["note"].startswith(f"claim gpu ({claim}): ") for e in pod_events(bed, ns, "waiter")), 90, 1.0)
    bed.delete("pod", "holder", ns)
    wait_running(bed, ns, "waiter", timeout=120)
    assert_quiet(bed, ns, "waiter", counts(pod_events(bed, ns, "waiter")))


# --------------------------------------------------------------------------- kubectl dra explain


def kubectl_dra(bed: Bed, env: dict[str, str], *args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``kubectl dra explain ARGS``: the bed's kubectl finds the plugin on PATH and runs it."""
    return subprocess.run([bed.kubectl_bin, "dra", "explain", *args, "--kubeconfig", str(kubeconfig or bed.kubeconfig)],
                          capture_output=True, text=True, timeout=90, env=env, check=False)


def with_context(bed: Bed, path: Path, name: str, namespace: str, token: str | None = None) -> Path:
    """A copy of the bed's kubeconfig with one more context, ``name``, in ``namespace`` (and as
    the user of ``token`` when given)."""
    doc = yaml.safe_load(bed.kubeconfig.read_text())
    [ctx] = doc["contexts"]
    user = ctx["context"]["user"]
    if token is not None:
        user = f"{name}-user"
        doc["users"].append({"name": user, "user": {"token": token}})
    doc["contexts"].append({"name": name, "context": {**ctx["context"], "user": user, "namespace": namespace}})
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture()
def explained(bed: Bed, ns: str) -> Iterator[str]:
    """The unsatisfiable example, explained by the controller: its claim's generated name."""
    bed.apply(example("unsatisfiable"), ns=ns)
    claim = claim_of(bed, ns, "unsatisfiable", "gpu")["metadata"]["name"]
    wait_for("the controller's explanation", lambda: EXPLANATION_ANNOTATION in (
        bed.get("resourceclaim", claim, ns)["metadata"].get("annotations") or {}), 90)
    yield claim


def test_kubectl_dra_explain_pod_namespace_all_and_context(bed: Bed, ns: str, explained: str, plugin_path: dict[str, str],
                                                           tmp_path: Path) -> None:
    by_pod = kubectl_dra(bed, plugin_path, "pod/unsatisfiable", "-n", ns)
    assert by_pod.returncode == 0, by_pod.stderr
    lines = by_pod.stdout.splitlines()
    assert lines[0].startswith(f"Pod {ns}/unsatisfiable (Pending)"), by_pod.stdout
    assert lines[1].startswith(f"claim gpu ({explained}): cannot be allocated: "), by_pod.stdout
    assert f"  Claim {ns}/{explained}: NOT allocated" in by_pod.stdout, by_pod.stdout
    as_yaml = yaml.safe_load(kubectl_dra(bed, plugin_path, "pod/unsatisfiable", "-n", ns, "-o", "yaml").stdout)
    assert as_yaml["claims"][0]["podClaim"] == "gpu" and as_yaml["claims"][0]["template"] == "unsatisfiable"

    listed = kubectl_dra(bed, plugin_path, "-A", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    groups = json.loads(listed.stdout)["groups"]
    [ours] = [g for g in groups if any(r["claim"] == f"{ns}/{explained}" for r in g["claims"])]
    assert ours["reason"] == "Unsatisfiable" and ours["summary"].startswith("cannot allocate"), ours
    in_ns = kubectl_dra(bed, plugin_path, "-n", ns, "-o", "wide")
    assert in_ns.returncode == 0 and f"  {ns}/{explained}  pods: unsatisfiable (claim gpu)" in in_ns.stdout, in_ns

    config = with_context(bed, tmp_path / "kubeconfig", "team", ns)
    by_context = kubectl_dra(bed, plugin_path, "pod/unsatisfiable", "--context", "team", kubeconfig=config)
    assert by_context.returncode == 0 and by_context.stdout == by_pod.stdout, by_context.stderr


def one_line_failure(proc: subprocess.CompletedProcess[str], says: str) -> None:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == "" and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert says in proc.stderr, proc.stderr


def test_kubectl_dra_bad_input(bed: Bed, ns: str, plugin_path: dict[str, str], tmp_path: Path) -> None:
    one_line_failure(kubectl_dra(bed, plugin_path, "pod/nope", "-n", ns), f"pod {ns}/nope not found")

    plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"}, "spec": {
        "containers": [{"name": "c", "image": "busybox:1.36", "command": ["sleep", "86400"]}]}}
    bed.apply([plain], ns=ns)
    one_line_failure(kubectl_dra(bed, plugin_path, "pod/plain", "-n", ns), f"pod {ns}/plain has no resource claims")

    other_class = f"tpu-{ns}.example.com"
    bed.apply([{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": other_class},
                "spec": {"selectors": [{"cel": {"expression": 'device.driver == "tpu.example.com"'}}]}}])
    try:
        bed.apply([{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "tpu"},
                    "spec": {"devices": {"requests": [{"name": "tpu", "exactly": {"deviceClassName": other_class}}]}}}],
                  ns=ns)
        one_line_failure(kubectl_dra(bed, plugin_path, "claim/tpu", "-n", ns), "is a claim of tpu.example.com")
    finally:
        bed.kubectl("delete", "deviceclass", other_class, "--wait=false", check=False)

    # A user who may read pods and claims in this namespace only.
    bed.kubectl("create", "serviceaccount", "reader", "-n", ns)
    bed.kubectl("create", "role", "reader", "-n", ns, "--verb=get,list,watch",
                "--resource=pods,resourceclaims.resource.k8s.io")
    bed.kubectl("create", "rolebinding", "reader", "-n", ns, "--role=reader", f"--serviceaccount={ns}:reader")
    token = bed.kubectl("create", "token", "reader", "-n", ns).stdout.strip()
    config = with_context(bed, tmp_path / "reader", "reader", ns, token)
    forbidden = kubectl_dra(bed, plugin_path, "pod/anything", "-n", "kube-system", "--context", "reader", kubeconfig=config)
    one_line_failure(forbidden, "not allowed")
    assert "kube-system" in forbidden.stderr, forbidden.stderr

    one_line_failure(kubectl_dra(bed, plugin_path, "pod/unsatisfiable", "--context", "nope"),
                     f"context 'nope' not found in kubeconfig {bed.kubeconfig}")
