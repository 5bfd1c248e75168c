"""The bed itself: two beds coexist, and nothing is left behind when the owner dies or tears down."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from e2e.testbed import cluster
from e2e.testbed.clusterview import REPO, wait_for
from e2e.tooling import binaries

pytestmark = pytest.mark.testbed_only

OWNER = """
import json, sys, time
from pathlib import Path
from e2e.testbed import cluster
with cluster.running(nodes=("n1",), workdir=Path(sys.argv[1])) as c:
    print(json.dumps({"pids": [p.pid for p in c.procs.values()], "ports": list(c.ports.values())}), flush=True)
    time.sleep(600)
"""


def alive(pid: int) -> bool:
    """Running, or a zombie whose other threads have not all exited yet (they still hold its sockets)."""
    return cluster._alive(pid)


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def socket_inodes(pids: list[int]) -> set[int]:
    """The sockets these processes hold, by inode: unlike a port number, nobody else can own one."""
    inodes = set()
    for pid in pids:
        fds = Path(f"/proc/{pid}/fd")
        try:
            links = [os.readlink(fd) for fd in fds.iterdir()]
        except OSError:
            continue
        inodes |= {int(link[8:-1]) for link in links if link.startswith("socket:[")}
    return inodes


def listening(inodes: set[int]) -> set[int]:
    """Those of ``inodes`` that are still a listening TCP socket on this machine."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as handle:
            for row in handle.read().splitlines()[1:]:
                fields = row.split()
                if fields[3] == "0A" and int(fields[9]) in inodes:  # 0A: TCP_LISTEN
                    found.add(int(fields[9]))
    return found


def start_owner(workdir: Path) -> tuple[subprocess.Popen[str], dict[str, list[int]]]:
    proc = subprocess.Popen([sys.executable, "-c", OWNER, str(workdir)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"bed owner exited with {proc.wait()}"
    return proc, json.loads(line)


def test_two_beds_coexist_and_a_killed_owner_leaves_nothing(tmp_path: Path) -> None:
    first, a = start_owner(tmp_path / "a")
    second, b = start_owner(tmp_path / "b")
    try:
        assert set(a["ports"]).isdisjoint(b["ports"])
        assert all(alive(p) for p in a["pids"] + b["pids"])
        assert all(port_open(p) for p in (a["ports"][0], b["ports"][0]))  # both etcds answer
        a_listening = listening(socket_inodes(a["pids"]))
        assert a_listening, "the first bed's processes must hold listening sockets"
        first.send_signal(signal.SIGKILL)  # an interrupted test run: no finally block runs
        first.wait(10)
        wait_for("the killed owner's control plane to exit", lambda: not any(alive(p) for p in a["pids"]), 30)
        # Its own sockets, by inode: another process on the machine may take a freed port at once.
        wait_for("its sockets to close", lambda: not listening(a_listening), 30)
        assert all(alive(p) for p in b["pids"]), "the other bed must be untouched"
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                proc.terminate()
    second.wait(30)
    wait_for("the second bed to stop", lambda: not any(alive(p) for p in b["pids"]), 30)


def test_detached_bed_up_and_down(tmp_path: Path) -> None:
    workdir = tmp_path / "bed"
    run = [sys.executable, "-m", "e2e.testbed.cluster"]
    up = subprocess.run([*run, "up", "--workdir", str(workdir), "--nodes", "3"], cwd=REPO,
                        capture_output=True, text=True, timeout=180, check=False)
    assert up.returncode == 0, up.stderr
    state = json.loads((workdir / "state.json").read_text())
    pids, ports = [p["pid"] for p in state["pids"].values()], list(state["ports"].values())
    assert f"export KUBECONFIG={workdir / 'kubeconfig'}" in up.stdout
    assert all(alive(p) for p in pids)
    ours = listening(socket_inodes(pids))
    assert ours, "the bed's processes must hold listening sockets"
    nodes = subprocess.run([str(binaries.bin_dir() / "kubectl"), "--kubeconfig", str(workdir / "kubeconfig"), "get", "nodes",
                            "-o", "name"], capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert nodes == ["node/gpu-node-1", "node/gpu-node-2", "node/gpu-node-3"]
    started = time.monotonic()
    down = subprocess.run([*run, "down", "--workdir", str(workdir)], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=False)
    assert down.returncode == 0, down.stderr
    assert not any(alive(p) for p in pids), f"left running after {time.monotonic() - started:.1f}s"
    # Our processes released our sockets; whether another owner reuses a port number is not ours to check.
    assert not listening(ours), f"sockets still listening after down: {listening(ours)}"
    assert ports
    assert not workdir.exists()


NEXT_DRIVER = "next.testbed.example.com"


def next_scheduler_manifests(node: str) -> list[dict[str, object]]:
    """One device on one node, a class for it, a claim for one device and a pod that uses the claim."""
    return [
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "next"},
         "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{NEXT_DRIVER}"'}}]}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"{node}-next"},
         "spec": {"driver": NEXT_DRIVER, "nodeName": node,
                  "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                  "devices": [{"name": "gpu-0", "attributes": {"model": {"string": "testbed"}}}]}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "one", "namespace": "default"},
         "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "next"}}]}}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "uses-one", "namespace": "default"},
         "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "one"}],
                  "containers": [{"name": "c", "image": "testbed.invalid/pause", "resources": {"claims": [{"name": "gpu"}]}}]}},
    ]


@pytest.mark.next
@pytest.mark.skipif(binaries.scheduler_minor() is None,
                    reason=f"another minor's kube-scheduler not asked for ({binaries.SCHEDULER_ENV}=1.38: make e2e-next)")
def test_another_minors_scheduler_allocates_beside_the_control_plane(tmp_path: Path) -> None:
    """The mixed bed: the control plane of the default minor, the kube-scheduler of the next one, which
    accepts the bed's flags and gates and allocates a claim on a slice as the pod is scheduled."""
    minor = binaries.scheduler_minor()
    assert minor is not None
    with cluster.running(nodes=("n1",), workdir=tmp_path / "bed") as bed:
        assert bed.scheduler_minor == minor
        assert bed.scheduler_version == binaries.scheduler_version(minor)
        assert bed.scheduler_version.startswith(f"v{minor}.")
        server = json.loads(bed.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
        assert server == binaries.kubernetes_version() != bed.scheduler_version
        running = Path(f"/proc/{bed.procs['kube-scheduler'].pid}/exe").resolve()
        assert running == binaries.ensure_scheduler(minor, log=False).resolve()

        bed.kubectl("apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List",
                                                               "items": next_scheduler_manifests("n1")}))

        def allocation() -> dict[str, object] | None:
            claim = json.loads(bed.kubectl("get", "resourceclaim", "one", "-n", "default", "-o", "json").stdout)
            found: dict[str, object] | None = claim.get("status", {}).get("allocation")
            return found

        allocated = wait_for("the claim to be allocated by the kube-scheduler", allocation, 60)
        allocated.pop("allocationTimestamp", None)
        assert allocated == {
            "devices": {"results": [{"request": "gpu", "driver": NEXT_DRIVER, "pool": "n1", "device": "gpu-0"}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]},
        }
        wait_for("the pod to be bound to n1", lambda: bed.kubectl(
            "get", "pod", "uses-one", "-n", "default", "-o", "jsonpath={.spec.nodeName}").stdout == "n1", 30)
        exited = {name: proc.returncode for name, proc in bed.procs.items() if proc.poll() is not None}
        assert exited == {}, f"exited: {exited}; a flag or gate it does not know stops a component (logs in {bed.logs})"
