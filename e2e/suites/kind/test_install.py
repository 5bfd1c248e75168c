"""The chart as installed: its pods register with real kubelets, publish from inside the pod, elect a
leader with in-cluster credentials, and are held to their permissions by the real API server."""

from __future__ import annotations

import json
from typing import Any

from e2e.suites.kind.install import Install, nodes_labelled, on_node, plugin_sockets
from e2e.testbed.clusterview import wait_for

# Run inside a pod with its own ServiceAccount token: POST a ResourceSlice for ``node`` with
# dryRun=All (authorization and admission run in full, nothing is stored), in pool ``argv[2]`` if
# given (else the node's). Prints the HTTP status and the API server's message.
CREATE_SLICE = r"""
import json, os, ssl, sys, urllib.error, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
base = "https://%s:%s" % (os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"])
node = sys.argv[1]
pool = sys.argv[2] if len(sys.argv) > 2 else node
body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"generateName": "e2e-rbac-"},
        "spec": {"driver": "gpu.dra-driver.io", "nodeName": node,
                 "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1}, "devices": []}}
req = urllib.request.Request(base + "/apis/resource.k8s.io/v1/resourceslices?dryRun=All", method="POST",
                             data=json.dumps(body).encode(),
                             headers={"Authorization": "Bearer " + open(sa + "/token").read(),
                                      "Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, context=ssl.create_default_context(cafile=sa + "/ca.crt")) as resp:
        print(json.dumps({"code": resp.status, "message": ""}))
except urllib.error.HTTPError as err:
    print(json.dumps({"code": err.code, "message": json.loads(err.read()).get("message", "")}))
"""


def exec_python(install: Install, pod: str, container: str, script: str, *args: str) -> dict[str, Any]:
    proc = install.bed.kubectl("exec", "-n", install.namespace, pod, "-c", container, "--",
                               "/opt/dra-driver/bin/python", "-c", script, *args)
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def logs(install: Install, pod: str, container: str) -> str:
    return install.bed.kubectl("logs", "-n", install.namespace, pod, "-c", container).stdout


def test_plugin_pods_ready_registered_and_publishing(install: Install) -> None:
    workers = nodes_labelled(install.bed, "default")
    pods = install.plugin_pods()
    assert sorted(p["spec"]["nodeName"] for p in pods) == workers, "one plugin pod per selected worker"
    for pod in pods:
        name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
        ready = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
        assert ready.get("Ready") == "True", f"plugin pod {name} not Ready: {pod['status'].get('conditions')}"
        # The kubelet took the registration: the plugin logs the kubelet's NotifyRegistrationStatus,
        # and the sockets are where the kubelet looks (its root on the host, the node container).
        wait_for(f"{name} registered with the kubelet of {node}",
                 lambda n=name: "registered with the kubelet" in logs(install, n, "plugin"), timeout=60)
        sockets = plugin_sockets(pod)
        on_node(node, f"test -S {sockets.registration} && test -S {sockets.dra}")
        slices = install.node_slices(node)
        assert slices, f"no ResourceSlice of {node}"
        assert sum(len(s["spec"].get("devices", [])) for s in slices) >= 6, "the profile's GPUs and MIG devices"
        # Written by the plugin (its field manager; the only ServiceAccount allowed to write
        # slices is the plugin's, see the RBAC tests below).
        full = json.loads(install.bed.kubectl("get", "resourceslices", "-o", "json", "--show-managed-fields",
                                              "--field-selector", f"spec.nodeName={node}").stdout)["items"]
        managers = {m.get("manager") for s in full for m in s["metadata"].get("managedFields", [])}
        assert "dra-driver-plugin" in managers, f"slices of {node} were written by {managers}"


def test_controller_runs_in_cluster_and_holds_the_lease(install: Install) -> None:
    (pod,) = install.controller_pods()
    name = pod["metadata"]["name"]
    ready = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
    assert ready.get("Ready") == "True", f"controller {name} not Ready"
    lease = wait_for("the controller's Lease", lambda: (lambda p: json.loads(p.stdout) if p.returncode == 0 else None)(
        install.bed.kubectl("get", "lease", "dra-driver-controller", "-n", install.namespace, "-o", "json", check=False)),
        timeout=60)
    assert lease["spec"]["holderIdentity"].startswith(name), f"Lease held by {lease['spec'].get('holderIdentity')}, not {name}"
    text = logs(install, name, "controller")
    assert "leader_elect=True" in text or '"leader_elect": true' in text
    # The chart's Role lets it list the Node Events (in default) its device metric counts withheld devices from.
    assert "cannot read the DeviceWithheld Events" not in text, text[-2000:]


def test_plugin_may_write_only_its_own_nodes_slice(install: Install) -> None:
    workers = nodes_labelled(install.bed, "default")
    other = nodes_labelled(install.bed, "alternative")[0]
    pod = install.plugin_pods()[0]
    own = exec_python(install, pod["metadata"]["name"], "plugin", CREATE_SLICE, pod["spec"]["nodeName"])
    assert own["code"] == 201, f"the plugin may not create its own node's slice: {own}"
    assert pod["spec"]["nodeName"] in workers
    theirs = exec_python(install, pod["metadata"]["name"], "plugin", CREATE_SLICE, other)
    # RBAC lets the plugin write slices; the per-node admission policy refuses another node's.
    assert theirs["code"] in (403, 422), f"the plugin could create {other}'s slice: {theirs}"
    assert other in theirs["message"] or "node" in theirs["message"].lower(), theirs
    # Its own node, but the other node's pool: it would shadow that node's devices.
    shadow = exec_python(install, pod["metadata"]["name"], "plugin", CREATE_SLICE, pod["spec"]["nodeName"], other)
    assert shadow["code"] in (403, 422) and f"pool {other}" in shadow["message"], shadow


def test_controller_cannot_write_slices(install: Install) -> None:
    (pod,) = install.controller_pods()
    node = nodes_labelled(install.bed, "default")[0]
    result = exec_python(install, pod["metadata"]["name"], "controller", CREATE_SLICE, node)
    assert result["code"] == 403, f"the controller could create a ResourceSlice: {result}"
    assert "forbidden" in result["message"].lower(), result
