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
    pids, ports = list(state["pids"].values()), list(state["ports"].values())
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
