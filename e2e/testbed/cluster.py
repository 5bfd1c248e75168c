"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager, kube-scheduler.

Every process runs from the binaries built by ``binaries.py``; the kube-scheduler may be another
pinned minor's (``scheduler_minor``, ``DRA_TESTBED_SCHEDULER``). Ports are chosen at random so two
beds can coexist, and each child is tied to its parent (PR_SET_PDEATHSIG) when the bed is owned by
a test run, so an interrupted run leaves nothing behind. A detached bed (``make cluster-up``) is
torn down from its pid file.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.testbed import pids
from e2e.tooling import binaries

# Valid on every minor the bed runs, 1.36 to 1.38: 1.38 removed DynamicResourceAllocation (naming it
# stops a component from starting) and locked DRAPartitionableDevices, DRADeviceBindingConditions,
# DRADeviceTaints and DRADeviceTaintRules on (setting one false is an error).
FEATURE_GATES = {
    "DRAPartitionableDevices": True,
    "DRAConsumableCapacity": True,
    "DRADeviceTaints": True,
    "DRAPrioritizedList": True,
    "DRAAdminAccess": True,
    "DRAExtendedResource": True,
    "DRAResourceClaimDeviceStatus": True,
}
DEFAULT_NODES = ("gpu-node-1", "gpu-node-2")
ADMIN_USER = "testbed-admin"


def feature_gate_flag() -> str:
    return ",".join(f"{k}={str(v).lower()}" for k, v in FEATURE_GATES.items())


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def die_with_parent() -> None:
    # PR_SET_PDEATHSIG = 1: the kernel kills the child when the parent thread exits, which covers a
    # test runner killed with SIGKILL. SIGKILL, not SIGTERM: a kube-apiserver whose etcd died with it
    # can spend a minute in graceful shutdown, and a disposable bed has nothing to save.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, int(signal.SIGKILL))


def stop_process(proc: subprocess.Popen[Any] | None, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout``: a process given the chance to clean up, never waited
    on forever."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {proc.stderr.strip()}")


def make_pki(pki: Path) -> None:
    """A CA, the apiserver serving certificate and the service-account signing key."""
    pki.mkdir(parents=True, exist_ok=True)
    os.chmod(pki, 0o700)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "30", "-subj", "/CN=dra-driver-testbed-ca", cwd=pki)
    (pki / "san.cnf").write_text(
        "[v3]\nsubjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,"
        "DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
        "extendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n"
    )
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "apiserver.key", "-out", "apiserver.csr",
             "-subj", "/CN=kube-apiserver", cwd=pki)
    _openssl("x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "apiserver.crt", "-days", "30", "-extfile", "san.cnf", "-extensions", "v3", cwd=pki)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=pki)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def write_kubeconfig(path: Path, server: str, ca: Path, token: str, user: str) -> None:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "testbed", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "testbed", "context": {"cluster": "testbed", "user": user}}],
        "current-context": "testbed",
    }
    path.write_text(json.dumps(doc, indent=2))
    os.chmod(path, 0o600)


@dataclass
class Cluster:
    workdir: Path
    nodes: tuple[str, ...] = DEFAULT_NODES
    tie_to_parent: bool = True
    bin_dir: Path = field(default_factory=binaries.ensure)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    identities: dict[str, pids.Identity] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    admin_token: str = field(default_factory=lambda: secrets.token_hex(16))
    # Flags after the bed's own, per component; a flag given twice takes the later value.
    apiserver_args: tuple[str, ...] = ()
    controller_manager_args: tuple[str, ...] = ()
    scheduler_args: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    """Token users besides the admin, in no group of their own (RBAC and API Priority and Fairness
    see them as themselves, not as system:masters): :meth:`user_kubeconfig`."""
    user_tokens: dict[str, str] = field(default_factory=dict)
    scheduler_minor: str | None = field(default_factory=binaries.scheduler_minor)
    """Another pinned minor's kube-scheduler beside this control plane (e.g. ``"1.38"``); None: the
    control plane's own. Defaults to what ``DRA_TESTBED_SCHEDULER`` asks for."""
    scheduler_version: str = ""
    """What the running kube-scheduler's ``--version`` says (``v1.38.0-beta.0``), once started."""

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    def user_kubeconfig(self, user: str) -> Path:
        return self.workdir / f"kubeconfig-{user}"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def pki(self) -> Path:
        return self.workdir / "pki"

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    def kubectl(self, *args: str, input_text: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            input=input_text, capture_output=True, text=True, check=False, timeout=120,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self, timeout: float = 120.0, progress: Callable[[str], None] | None = None) -> None:
        """Start and wait until ready; ``progress`` hears one line per phase with the time so far."""
        started = time.monotonic()

        def phase(what: str) -> None:
            if progress is not None:
                progress(f"bed: {what} ({time.monotonic() - started:.1f}s)")

        self.workdir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        make_pki(self.pki)
        self.ports = {name: free_port() for name in ("etcd", "etcd-peer", "apiserver")}
        self.user_tokens = {user: secrets.token_hex(16) for user in self.users}
        (self.pki / "tokens.csv").write_text(
            f'{self.admin_token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n'
            + "".join(f"{token},{user},{user}\n" for user, token in self.user_tokens.items()))
        write_kubeconfig(self.kubeconfig, self.server, self.pki / "ca.crt", self.admin_token, ADMIN_USER)
        for user, token in self.user_tokens.items():
            write_kubeconfig(self.user_kubeconfig(user), self.server, self.pki / "ca.crt", token, user)
        self._write_state()
        try:
            self._start_etcd()
            self._start_apiserver()
            phase("etcd and kube-apiserver started")
            self._wait_ready(deadline=started + timeout)
            phase("kube-apiserver ready")
            self._start("kube-controller-manager", [
                f"--kubeconfig={self.kubeconfig}",
                "--secure-port=0",
                "--leader-elect=false",
                f"--service-account-private-key-file={self.pki / 'sa.key'}",
                f"--root-ca-file={self.pki / 'ca.crt'}",
                "--controllers=*",
                f"--feature-gates={feature_gate_flag()}",
                *self.controller_manager_args,
            ])
            scheduler = self._scheduler_binary()
            self.scheduler_version = binary_version(scheduler)
            self._start("kube-scheduler", [
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--secure-port=0",
                "--leader-elect=false",
                f"--feature-gates={feature_gate_flag()}",
                *self.scheduler_args,
            ], binary=scheduler)
            phase(f"kube-controller-manager and kube-scheduler {self.scheduler_version} started")
            self.register_nodes()
            phase(f"nodes registered: {', '.join(self.nodes)}")
            self._wait_default_service_account(deadline=started + timeout)
            phase("control plane ready")
        except BaseException:
            self.stop()
            raise

    def _start_etcd(self) -> None:
        client = f"http://127.0.0.1:{self.ports['etcd']}"
        peer = f"http://127.0.0.1:{self.ports['etcd-peer']}"
        self._start("etcd", [
            "--name=testbed",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=testbed={peer}",
            "--listen-metrics-urls=",
            # The bed's data is disposable; skipping fsync keeps a test run off the disk's floor.
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ])

    def _start_apiserver(self) -> None:
        pki = self.pki
        self._start("kube-apiserver", [
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
            f"--secure-port={self.ports['apiserver']}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            # Since 1.37 the reconciler of the "kubernetes" Service's endpoints refuses a loopback
            # address; nothing on the bed reaches the API server through that Service.
            "--endpoint-reconciler-type=none",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--token-auth-file={pki / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--allow-privileged=true",
            # A real node on the bed (realnode.py) has a hostname nothing resolves; its InternalIP works.
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--feature-gates={feature_gate_flag()}",
            "--runtime-config=resource.k8s.io/v1beta2=true,resource.k8s.io/v1alpha3=true",
            "--enable-priority-and-fairness=false",
            "--profiling=false",
            *self.apiserver_args,
        ])

    def _scheduler_binary(self) -> Path:
        if self.scheduler_minor is None:
            return self.bin_dir / binaries.SCHEDULER
        return binaries.ensure_scheduler(self.scheduler_minor)

    def _start(self, name: str, args: list[str], binary: Path | None = None) -> None:
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 - the child owns it until exit
        self.procs[name] = subprocess.Popen(
            [str(binary or self.bin_dir / name), *args],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent if self.tie_to_parent else None,
            start_new_session=not self.tie_to_parent,
        )
        log.close()
        recorded = pids.identify(self.procs[name].pid)
        if recorded is not None:
            self.identities[name] = recorded
        self._write_state()

    def _write_state(self) -> None:
        # Each process with its start time, so that a later `down` signals it only while it is still
        # the process this bed started (pids wrap; the bed runs as root).
        state = {"pids": {k: s.to_json() for k, s in self.identities.items() if k in self.procs}, "ports": self.ports,
                 "kubeconfig": str(self.kubeconfig), "nodes": list(self.nodes)}
        (self.workdir / "state.json").write_text(json.dumps(state, indent=2))

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with {proc.returncode}; last log lines:\n{tail}")

    def _wait_ready(self, deadline: float) -> None:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        req = urllib.request.Request(f"{self.server}/readyz", headers={"Authorization": f"Bearer {self.admin_token}"})
        last = ""
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError) as exc:
                last = str(exc)
            time.sleep(0.25)
        raise TimeoutError(f"kube-apiserver not ready at {self.server}: {last}")

    def _wait_default_service_account(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            self._check_alive()
            if self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0:
                return
            time.sleep(0.3)
        raise TimeoutError("the controller-manager did not create the default ServiceAccount in time")

    def register_nodes(self) -> None:
        for name in self.nodes:
            node = {
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {
                    "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64", "dra-driver.io/simulated-gpus": "true"}},
            }
            self.kubectl("apply", "-f", "-", input_text=json.dumps(node))
            self.mark_node_ready(name)

    def mark_node_ready(self, name: str) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status = {"status": {
            "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"},
            "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "test bed node", "lastHeartbeatTime": now, "lastTransitionTime": now}],
        }}
        self.kubectl("patch", "node", name, "--subresource=status", "--type=merge", "-p", json.dumps(status))

    def stop(self) -> None:
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self.procs.clear()
        self._write_state()


def binary_version(binary: Path) -> str:
    """The release a Kubernetes binary says it is (``Kubernetes v1.38.0-beta.0`` -> ``v1.38.0-beta.0``)."""
    proc = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=False, timeout=30)
    words = proc.stdout.split()
    if proc.returncode != 0 or len(words) != 2 or words[0] != "Kubernetes":
        raise RuntimeError(f"{binary} --version did not name a Kubernetes release "
                           f"(exit {proc.returncode}): {(proc.stdout + proc.stderr).strip()[-500:]}")
    return words[1]


def stop_detached(workdir: Path) -> None:
    """Stop a bed started by another process (``make cluster-down``), from its pid file."""
    state_file = workdir / "state.json"
    if not state_file.exists():
        return
    recorded = [pids.from_json(v) for v in json.loads(state_file.read_text()).get("pids", {}).values()]
    started = [s for s in recorded if s is not None]
    if len(started) < len(recorded):
        print(f"bed: {len(recorded) - len(started)} process(es) in {state_file} were recorded without a start "
              "time (an older bed): left alone, stop them by hand if they are still running", file=sys.stderr)
    for s in reversed(started):
        pids.send(s, signal.SIGTERM, group=True)
    deadline = time.monotonic() + 15
    for s in started:
        while time.monotonic() < deadline and _running(s):
            time.sleep(0.1)
        if _running(s):
            pids.send(s, signal.SIGKILL, group=True)
    # Down means gone: a killed process still holds its sockets until its exit completes.
    killed = time.monotonic() + 10
    while time.monotonic() < killed and any(_running(s) for s in started):
        time.sleep(0.05)
    shutil.rmtree(workdir, ignore_errors=True)


def _running(recorded: pids.Identity) -> bool:
    return _alive(recorded.pid) and pids.is_running(recorded)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie left for its parent counts as gone, but only once all its threads are: a thread-group
    # leader shows Z while its other threads are still exiting and still hold its sockets and files.
    return any(state != "Z" for state in _task_states(pid))


def _task_states(pid: int) -> list[str]:
    states = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                states.append((task / "stat").read_text().rsplit(")", 1)[-1].split()[0])
    return states


@contextlib.contextmanager
def running(nodes: tuple[str, ...] = DEFAULT_NODES, workdir: Path | None = None,
            keep: Callable[[], bool] = lambda: False, scheduler_minor: str | None = None) -> Iterator[Cluster]:
    """A bed for the duration of a with-block (pytest fixtures use this); ``scheduler_minor`` as on
    :class:`Cluster`, by default what ``DRA_TESTBED_SCHEDULER`` asks for."""
    owned = workdir is None
    path = workdir or Path(tempfile.mkdtemp(prefix="dra-testbed-"))
    cluster = Cluster(workdir=path, nodes=nodes, scheduler_minor=scheduler_minor or binaries.scheduler_minor())
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
        if owned and not keep():
            shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Start or stop the local Kubernetes test bed.")
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--workdir", default=".run/bed", type=Path)
    parser.add_argument("--nodes", type=int, default=len(DEFAULT_NODES), help="number of simulated GPU nodes")
    args = parser.parse_args(argv)
    if args.action == "down":
        stop_detached(args.workdir)
        print(f"test bed in {args.workdir} stopped")
        return 0
    if (args.workdir / "state.json").exists():
        stop_detached(args.workdir)
    nodes = tuple(f"gpu-node-{i + 1}" for i in range(args.nodes))
    started = time.monotonic()
    cluster = Cluster(workdir=args.workdir.resolve(), nodes=nodes, tie_to_parent=False)
    try:
        cluster.start(progress=lambda line: print(line, flush=True))
    except (RuntimeError, TimeoutError) as exc:
        print(f"cluster-up failed: {exc}", file=sys.stderr)
        return 1
    print(f"test bed ready in {time.monotonic() - started:.1f}s: nodes {', '.join(nodes)}; "
          f"kube-scheduler {cluster.scheduler_version}")
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
