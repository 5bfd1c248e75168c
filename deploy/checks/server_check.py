"""Validate the deploy/ manifests against a real API server (Kubernetes 1.36+).

    python deploy/checks/server_check.py --kubeconfig PATH [--kubectl PATH] [--keep]

1. Creates scratch namespaces (``dra-check-driver``, ``dra-check-examples`` and
   ``dra-check-admin`` labelled ``resource.kubernetes.io/admin-access=true``, each with a
   ``default`` ServiceAccount in case no controller-manager runs).
2. ``kubectl apply --dry-run=server`` of everything deploy/checks/render.py prints (chart,
   DeviceClasses, examples).
3. Applies the chart's RBAC and ValidatingAdmissionPolicy for real under the release name
   ``dra-check`` and checks, by impersonating the plugin's ServiceAccount with a node name in
   its user extra, that it may write ResourceSlices of its own node, pool and driver only, and its
   driver's ``status.devices`` entries of claims on its own node only; and with ``kubectl auth
   can-i`` that the controller cannot write ResourceSlices.
4. Checks that the admin-access example is refused in an unlabelled namespace.
5. Deletes what it created (unless ``--keep``).

Works against the local test bed's API server (no controller-manager needed) or a kind cluster.
Exit status 0 when every check passed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import render  # noqa: E402  (deploy/checks/render.py)

RELEASE = "dra-check"
NS_DRIVER, NS_EXAMPLES, NS_ADMIN = "dra-check-driver", "dra-check-examples", "dra-check-admin"
DRIVER = "gpu.dra-driver.io"


def serves_v1_device_taint_rules(k: Callable[..., subprocess.CompletedProcess[str]]) -> bool:
    proc = k("get", "--raw", "/apis/resource.k8s.io/v1")
    if proc.returncode != 0:
        return False
    return any(r.get("name") == "devicetaintrules" for r in json.loads(proc.stdout).get("resources", []))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--kubectl", default=shutil.which("kubectl") or "kubectl")
    parser.add_argument("--keep", action="store_true", help="leave the scratch objects in place")
    args = parser.parse_args(argv)
    failures: list[str] = []

    def k(*a: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([args.kubectl, "--kubeconfig", args.kubeconfig, *a], input=stdin, text=True,
                              capture_output=True, check=False, timeout=120)

    def expect(ok: bool, what: str, detail: str = "") -> None:
        print(f"{'ok  ' if ok else 'FAIL'} {what}" + (f": {detail.strip()[:300]}" if detail and not ok else ""))
        if not ok:
            failures.append(what)

    for ns in (NS_DRIVER, NS_EXAMPLES, NS_ADMIN):
        k("create", "namespace", ns)
        k("create", "serviceaccount", "default", "-n", ns)
    k("label", "namespace", NS_ADMIN, "resource.kubernetes.io/admin-access=true", "--overwrite")

    chart = yaml.safe_dump_all(render.chart_documents(NS_DRIVER, release=RELEASE), explicit_start=True)
    examples = render.example_documents(NS_EXAMPLES, NS_ADMIN)
    if not serves_v1_device_taint_rules(k):
        # resource.k8s.io/v1 DeviceTaintRule is Kubernetes 1.37+; on older servers that example is left out.
        examples = [d for d in examples if d.get("kind") != "DeviceTaintRule"]
        print("skip DeviceTaintRule example: the server does not serve resource.k8s.io/v1 devicetaintrules")
    rest = yaml.safe_dump_all(render.deviceclass_documents() + examples, explicit_start=True)
    proc = k("apply", "--dry-run=server", "-f", "-", stdin=chart + rest)
    expect(proc.returncode == 0, "server-side dry run of chart, DeviceClasses and examples", proc.stderr)

    admin = (render.EXAMPLES_DIR / "admin-access" / "admin-access.yaml").read_text()
    proc = k("apply", "--dry-run=server", "-n", NS_EXAMPLES, "-f", "-", stdin=admin)
    expect(proc.returncode != 0 and "admin-access" in proc.stderr, "admin access refused in an unlabelled namespace",
           proc.stdout + proc.stderr)

    policy_kinds = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
                    "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    policy = [d for d in render.chart_documents(NS_DRIVER, release=RELEASE) if d["kind"] in policy_kinds]
    policy_yaml = yaml.safe_dump_all(policy, explicit_start=True)
    proc = k("apply", "-f", "-", stdin=policy_yaml)
    expect(proc.returncode == 0, "apply RBAC and admission policy", proc.stderr)
    time.sleep(3)  # policy and RBAC caches

    plugin = [f"--as=system:serviceaccount:{NS_DRIVER}:{RELEASE}-dra-driver-kubelet-plugin"]
    on_a = [*plugin, "--as-user-extra=authentication.kubernetes.io/node-name=node-a"]

    def slice_doc(name: str, node: str, driver: str = DRIVER, pool: str | None = None, generation: int = 1) -> str:
        return yaml.safe_dump({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}]}})

    for attempt in range(10):  # the policy may need a moment to become active
        proc = k(*on_a, "create", "-f", "-", stdin=slice_doc("dra-check-b", "node-b"))
        if proc.returncode != 0 or attempt == 9:
            break
        k("delete", "resourceslice", "dra-check-b", "--wait=false")
        time.sleep(2)
    expect(proc.returncode != 0 and "ValidatingAdmissionPolicy" in proc.stderr, "plugin may not create another node's slice",
           proc.stdout + proc.stderr)
    proc = k(*on_a, "create", "-f", "-", stdin=slice_doc("dra-check-a", "node-a"))
    expect(proc.returncode == 0, "plugin may create its own node's slice", proc.stderr)
    # Its own nodeName but node-b's pool, at a higher generation: it would shadow node-b's devices.
    proc = k(*on_a, "create", "-f", "-", stdin=slice_doc("dra-check-p", "node-a", pool="node-b", generation=9))
    expect(proc.returncode != 0 and "ValidatingAdmissionPolicy" in proc.stderr and "pool node-b" in proc.stderr,
           "plugin may not create a slice of another node's pool", proc.stdout + proc.stderr)
    own = json.loads(k(*on_a, "get", "resourceslice", "dra-check-a", "-o", "json").stdout or "{}")
    own.setdefault("spec", {})["pool"] = {"name": "node-b", "generation": 9, "resourceSliceCount": 1}
    proc = k(*on_a, "replace", "-f", "-", stdin=json.dumps(own))
    # The API server keeps spec.pool.name immutable (seen on 1.37.2), so an update cannot do it either.
    expect(proc.returncode != 0 and ("pool node-b" in proc.stderr or "field is immutable" in proc.stderr),
           "plugin may not move its own slice into another node's pool", proc.stdout + proc.stderr)
    proc = k(*on_a, "create", "-f", "-", stdin=slice_doc("dra-check-x", "node-a", "x.example.com"))
    expect(proc.returncode != 0, "plugin may not create another driver's slice", proc.stdout + proc.stderr)
    proc = k(*plugin, "create", "-f", "-", stdin=slice_doc("dra-check-n", "node-a"))
    expect(proc.returncode != 0 and "no node name" in proc.stderr, "plugin without node name in its token is refused",
           proc.stdout + proc.stderr)
    proc = k(*plugin, "--as-user-extra=authentication.kubernetes.io/node-name=node-b", "delete", "resourceslice",
             "dra-check-a")
    expect(proc.returncode != 0, "plugin may not delete another node's slice", proc.stdout + proc.stderr)
    proc = k(*on_a, "delete", "resourceslice", "dra-check-a")
    expect(proc.returncode == 0, "plugin may delete its own node's slice", proc.stderr)

    claim_status_checks(k, expect, plugin, on_a)

    controller = [f"--as=system:serviceaccount:{NS_DRIVER}:{RELEASE}-dra-driver-controller"]
    for verb, want in (("create resourceslices", "no"), ("delete resourceslices", "no"), ("list resourceslices", "yes"),
                       ("patch resourceclaims/status", "yes"), ("update resourceclaims/binding", "yes"),
                       (f"update leases/dra-driver-controller -n {NS_DRIVER}", "yes"),
                       (f"update leases/other -n {NS_DRIVER}", "no"),
                       # Every informer of the controller lists and watches cluster-wide (reconciler.py);
                       # a missing one only shows in-cluster, as a controller that never gets ready.
                       *((f"{verb} {res}", "yes") for verb in ("list", "watch") for res in (
                           "resourceclaims", "pods", "resourceslices", "deviceclasses", "resourceclaimtemplates"))):
        proc = k("auth", "can-i", *verb.split(), *controller)
        expect(proc.stdout.strip() == want, f"controller can-i {verb} == {want}", proc.stdout + proc.stderr)
    for verb, want in (("get resourceclaims", "yes"), ("list resourceclaims", "no"), ("list nodes", "no"),
                       ("list pods", "no"), ("create resourceslices", "yes")):
        proc = k("auth", "can-i", *verb.split(), *plugin)
        expect(proc.stdout.strip() == want, f"plugin can-i {verb} == {want}", proc.stdout + proc.stderr)

    if not args.keep:
        k("delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=policy_yaml)
        for name in ("dra-check-a", "dra-check-b", "dra-check-x", "dra-check-n", "dra-check-p"):
            k("delete", "resourceslice", name, "--ignore-not-found", "--wait=false")
        k("delete", "resourceclaim", "dra-check-status", "-n", NS_EXAMPLES, "--ignore-not-found", "--wait=false")
        k("delete", "namespace", NS_DRIVER, NS_EXAMPLES, NS_ADMIN, "--wait=false")
    print(f"server checks: {'all passed' if not failures else f'{len(failures)} failed'}")
    return 1 if failures else 0


def claim_status_checks(k: Callable[..., subprocess.CompletedProcess[str]], expect: Callable[..., None],
                        plugin: list[str], on_a: list[str]) -> None:
    """The plugin's claim status writes, for real: its own driver's ``status.devices`` entries of a claim
    allocated to its node, by server-side apply, and nothing else (granular status authorization)."""
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "dra-check-status", "namespace": NS_EXAMPLES},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpu.dra-driver.io"}}]}}}
    k("delete", "resourceclaim", "dra-check-status", "-n", NS_EXAMPLES, "--ignore-not-found", "--wait=true")
    k("create", "-f", "-", stdin=yaml.safe_dump(claim))
    allocation = {"status": {"allocation": {
        "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": "gpu-0"},
                                {"request": "gpu", "driver": "nic.example.com", "pool": "node-a", "device": "nic-0"}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}}}}
    proc = k("patch", "resourceclaim", "dra-check-status", "-n", NS_EXAMPLES, "--subresource=status", "--type=merge",
             "-p", json.dumps(allocation))
    expect(proc.returncode == 0, "allocate the claim-status test claim to node-a", proc.stderr)

    def apply_status(who: list[str], driver: str, uuid: str) -> subprocess.CompletedProcess[str]:
        # Each write changes the entry: an apply that changes nothing is not authorized at all.
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": "dra-check-status", "namespace": NS_EXAMPLES},
                "status": {"devices": [{"driver": driver, "pool": "node-a", "device": "gpu-0" if driver == DRIVER else "nic-0",
                                        "data": {"uuid": uuid}}]}}
        return k(*who, "apply", "--server-side", "--force-conflicts", "--subresource=status", f"--field-manager={driver}",
                 "-f", "-", stdin=yaml.safe_dump(body))

    proc = apply_status(on_a, DRIVER, "GPU-from-node-a")
    expect(proc.returncode == 0, "plugin on node-a may write its driver's status.devices of a claim on node-a",
           proc.stdout + proc.stderr)
    proc = apply_status([*plugin, "--as-user-extra=authentication.kubernetes.io/node-name=node-b"], DRIVER,
                        "GPU-from-node-b")
    expect(proc.returncode != 0 and "resourceclaims/driver" in proc.stderr,
           "plugin on node-b may not write status.devices of a claim on node-a", proc.stdout + proc.stderr)
    proc = apply_status(on_a, "nic.example.com", "NIC-from-node-a")
    expect(proc.returncode != 0 and "resourceclaims/driver" in proc.stderr,
           "plugin may not write another driver's status.devices", proc.stdout + proc.stderr)
    proc = k(*on_a, "patch", "resourceclaim", "dra-check-status", "-n", NS_EXAMPLES, "--subresource=status",
             "--type=merge", "-p", json.dumps({"status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]}}))
    expect(proc.returncode != 0, "plugin may not change a claim's reservedFor", proc.stdout + proc.stderr)


if __name__ == "__main__":
    sys.exit(main())
