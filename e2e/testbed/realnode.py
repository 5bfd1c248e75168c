"""One real node on the test bed: containerd (CDI on), runc, the real kubelet and our node plugin.

Everything lives under one temporary root (short, for unix-socket paths)::

    <root>/containerd/{root,state,containerd.sock}   containerd 2.x, config.toml
    <root>/cni/{net.d,data}                          a CNI ``bridge`` network (an isolated L2 segment, no host IP)
    <root>/kubelet                                   --root-dir: plugins_registry/, plugins/, pods/, pki/
    <root>/cdi                                       cdi_spec_dirs of containerd = --cdi-root of our plugin
    <root>/devroot/dev                               --dev-root: character devices for the simulated GPUs
    <root>/images                                    the OCI archives imported with ``ctr``
    <root>/logs                                      one log per process

The node registers as ``real-node-1`` with the taint ``dra-driver.io/real-node=true:NoSchedule``
so the bed's other scenarios never land on it; pods meant for it carry a nodeSelector and a
toleration (``pod_overrides()``).

Simulated GPUs on a real runtime: the plugin writes CDI specs whose device nodes have
``hostPath`` under ``--dev-root``. A CDI runtime fills a node's type/major/minor from ``stat`` of
the host path and refuses anything that is not a device, so the plain files the simulated backend
creates would fail container creation. Before the plugin starts, ``make_device_nodes`` creates the
same paths as character devices (major 195 as the NVIDIA driver uses: ``nvidiaN`` = 195:N,
``nvidiactl`` = 195:255; ``nvidia-uvm*`` and ``nvidia-caps/*`` get the majors 235/236). The
simulated backend leaves existing paths alone. Opening them fails (no driver), listing works.

Processes are tied to the parent (PR_SET_PDEATHSIG) unless detached (``up`` from a shell);
``down`` stops them from ``state.json``, unmounts what the kubelet and containerd left mounted
under the root, and removes the root.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.testbed import images, pids
from e2e.testbed.cluster import FEATURE_GATES, free_port
from e2e.testbed.nodes import DRIVER_NAME, REPO, Processes
from e2e.tooling import binaries, bytecode, gotools, prereqs, runtime

NODE_NAME = "real-node-1"
PROFILE = "h100-8x"
TAINT_KEY = "dra-driver.io/real-node"
NODE_LABEL = "dra-driver.io/real-node"


def pod_overrides(node_name: str = NODE_NAME) -> dict[str, Any]:
    """What a pod spec needs to run on the real node."""
    return {
        "nodeSelector": {"kubernetes.io/hostname": node_name},
        "tolerations": [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
    }


def _device_numbers(rel: str) -> tuple[int, int]:
    """The numbers the simulated backend gives the node (never the NVIDIA driver's)."""
    from dra_driver.node.discovery.simulated import CAPS_MAJOR, NVIDIA_MAJOR, UVM_MAJOR

    name = Path(rel).name
    if name == "nvidiactl":
        return NVIDIA_MAJOR, 255
    if name == "nvidia-uvm":
        return UVM_MAJOR, 0
    if name == "nvidia-uvm-tools":
        return UVM_MAJOR, 1
    if name.startswith("nvidia-cap"):
        return CAPS_MAJOR, int(name.removeprefix("nvidia-cap"))
    if name.startswith("nvidia") and name[6:].isdigit():
        return NVIDIA_MAJOR, int(name[6:])
    raise ValueError(f"no device numbers for {rel}")


def make_device_nodes(dev_root: Path, profile: str, node_name: str) -> list[Path]:
    """Create the simulated GPUs' /dev entries under ``dev_root`` as character devices."""
    from dra_driver.node.discovery.simulated import SimulatedBackend

    with tempfile.TemporaryDirectory(prefix="dra-devs-") as staging:
        SimulatedBackend(profile, node_name, dev_root=Path(staging))
        rels = sorted(str(p.relative_to(staging)) for p in Path(staging).rglob("*") if p.is_file())
    made = []
    for rel in rels:
        path = dev_root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        major, minor = _device_numbers(rel)
        if path.exists() and not stat.S_ISCHR(path.stat().st_mode):
            path.unlink()
        if not path.exists():
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
            os.chmod(path, 0o666)  # mknod's mode passes through the umask
        made.append(path)
    return made


def host_ip() -> str:
    """The machine's first non-loopback IPv4 address: the kubelet refuses a loopback node IP, and
    without an InternalIP the apiserver cannot reach the kubelet for ``kubectl logs``."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True,
                         text=True, check=False).stdout
    for line in out.splitlines():
        fields = line.split()
        if "inet" in fields:
            return fields[fields.index("inet") + 1].split("/")[0]
    raise RuntimeError("the real node needs a non-loopback IPv4 address (`ip -4 addr show scope global` lists none)")


def _toml_str(value: str) -> str:
    return json.dumps(value)


@dataclass(frozen=True)
class NvmlDriver:
    """A fake NVIDIA driver install (e2e/testbed/fakedriver.py) with the mock NVML of one DGX."""

    driver_root: Path
    sys_root: Path
    toolkit_bin: Path
    environment: dict[str, str]

    @classmethod
    def make(cls, root: Path, machine: str = "dgxh100") -> NvmlDriver:
        from e2e.testbed import fakedriver, mocknvml

        driver_root = fakedriver.make_driver_root(root / "driver")
        sys_root = mocknvml.make_sysfs(root / "sys")
        return cls(driver_root, sys_root, fakedriver.toolkit_bin(),
                   mocknvml.environment(machine, root / "mock-nvml-state.json"))


@dataclass
class RealNode:
    kubeconfig: Path
    root: Path
    node_name: str = NODE_NAME
    profile: str = PROFILE
    detached: bool = False
    k8s_bin: Path = field(default_factory=binaries.ensure)
    rt_bin: Path = field(default_factory=runtime.ensure)
    procs: Processes = field(init=False)
    kubelet_port: int = 0
    node_ip: str = field(default_factory=lambda: host_ip())
    timings: dict[str, float] = field(default_factory=dict)
    cleanup_interval: float = 5.0
    """The plugin's --cleanup-interval: short, so that tests see a stale claim unprepared soon."""

    def __post_init__(self) -> None:
        self.procs = Processes(self.root / "logs", detached=self.detached)

    # paths -------------------------------------------------------------------------------------
    @property
    def containerd_dir(self) -> Path:
        return self.root / "containerd"

    @property
    def containerd_sock(self) -> Path:
        return self.containerd_dir / "containerd.sock"

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def registry_dir(self) -> Path:
        return self.kubelet_dir / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        return self.kubelet_dir / "plugins"

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    @property
    def dev_root(self) -> Path:
        return self.root / "devroot"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def health_file(self) -> Path:
        """The plugin's ``--health-file``: absent or ``{}`` is all healthy; tests write faults here."""
        return self.root / "health.json"

    # helpers -----------------------------------------------------------------------------------
    def kubectl(self, *args: str, input_text: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(self.k8s_bin / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
                              input=input_text, capture_output=True, text=True, check=False, timeout=120)
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(self.rt_bin / "ctr"), "--address", str(self.containerd_sock), "-n", "k8s.io", *args],
                              capture_output=True, text=True, check=False, timeout=300)
        if check and proc.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def _wait(self, what: str, probe: Any, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.procs.check_alive()
            got = probe()
            if got:
                return got
            time.sleep(0.25)
        raise TimeoutError(f"real node: timed out after {timeout:.0f}s waiting for {what}")

    def _timed(self, name: str, started: float) -> None:
        self.timings[name] = round(time.monotonic() - started, 1)

    # lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for d in (self.containerd_dir, self.kubelet_dir, self.registry_dir, self.plugins_dir, self.cdi_dir,
                  self.dev_root, self.logs, self.root / "cni" / "net.d", self.root / "pod-logs"):
            d.mkdir(parents=True, exist_ok=True)
        self._write_state()
        try:
            t = time.monotonic()
            self.start_containerd()
            self._timed("containerd", t)
            t = time.monotonic()
            self.import_images()
            self._timed("images", t)
            t = time.monotonic()
            self.start_kubelet()
            self._timed("kubelet-node-ready", t)
            t = time.monotonic()
            make_device_nodes(self.dev_root, self.profile, self.node_name)
            self.start_plugin()
            self._timed("plugin-registered", t)
        except BaseException:
            self.stop()
            raise

    def _containerd_config(self) -> str:
        cd = self.containerd_dir
        cni = runtime.cni_bin_dir()
        q = _toml_str
        return f"""version = 3
root = {q(str(cd / 'root'))}
state = {q(str(cd / 'state'))}
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
                    "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs"]

[grpc]
  address = {q(str(self.containerd_sock))}

[ttrpc]
  address = {q(str(self.containerd_sock) + '.ttrpc')}

[metrics]
  address = ""

[plugins.'io.containerd.internal.v1.opt']
  path = {q(str(cd / 'opt'))}

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = {q(images.PAUSE_IMAGE)}

[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  # This VM's root lacks CAP_SYS_RESOURCE, so no process may lower its oom_score_adj (the kubelet
  # asks -998 for sandboxes): containers get at least containerd's own score instead.
  restrict_oom_score_adj = true
  cdi_spec_dirs = [{q(str(self.cdi_dir))}]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      snapshotter = "overlayfs"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = {q(str(self.rt_bin / 'runc'))}
        SystemdCgroup = false
        Root = {q(str(cd / 'runc'))}
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [{q(str(cni))}]
    conf_dir = {q(str(self.root / 'cni' / 'net.d'))}
    max_conf_num = 1
"""

    @property
    def bridge(self) -> str:
        # Unique per root (interface names are at most 15 bytes); removed again by cleanup_root.
        return "drarn" + hashlib.sha256(str(self.root).encode()).hexdigest()[:8]

    def _cni_config(self) -> dict[str, Any]:
        # A bridge with no address on the host side, no gateway, no masquerading and no forwarding:
        # each pod gets eth0 on an isolated L2 segment, the host's routes and sysctls stay as they are.
        return {
            "cniVersion": "1.0.0", "name": "testbed",
            "plugins": [{
                "type": "bridge", "bridge": self.bridge, "isGateway": False, "ipMasq": False,
                "ipam": {"type": "host-local", "dataDir": str(self.root / "cni" / "data"),
                         "ranges": [[{"subnet": "10.244.0.0/16"}]]},
            }],
        }

    def start_containerd(self) -> None:
        config = self.containerd_dir / "config.toml"
        config.write_text(self._containerd_config())
        (self.root / "cni" / "net.d" / "10-testbed.conflist").write_text(json.dumps(self._cni_config(), indent=2))
        env = {"PATH": f"{self.rt_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        self.procs.start("containerd", [str(self.rt_bin / "containerd"), "--config", str(config),
                                        "--log-level", "info"], env=env)
        self._write_state()
        self._wait("containerd socket", lambda: self.containerd_sock.exists()
                   and self.ctr("version", check=False).returncode == 0, 60)

    def import_images(self) -> None:
        for name, archive in images.build_all(self.root / "images").items():
            self.ctr("images", "import", "--platform", "linux/amd64", "--snapshotter", "overlayfs", str(archive))
            if name not in self.ctr("images", "ls", "-q").stdout.split():
                raise RuntimeError(f"ctr import of {archive} did not create {name}")

    def _kubelet_config(self) -> dict[str, Any]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": self.node_ip,
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzPort": 0,
            # The bed's apiserver has no kubelet client certificate: it reaches the kubelet (logs)
            # anonymously. Bound to the node IP of a throwaway VM only.
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [],
            "failSwapOn": False,
            "failCgroupV1": False,
            "featureGates": dict(FEATURE_GATES),
            "containerRuntimeEndpoint": f"unix://{self.containerd_sock}",
            "podLogsDir": str(self.root / "pod-logs"),
            "registerNode": True,
            "registerWithTaints": [{"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}],
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "localStorageCapacityIsolation": False,
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "5s",
            "syncFrequency": "10s",
            "resolvConf": "/etc/resolv.conf",
            "staticPodPath": "",
        }

    def start_kubelet(self) -> None:
        self.kubelet_port = free_port()
        config = self.kubelet_dir / "config.yaml"
        config.write_text(json.dumps(self._kubelet_config(), indent=2))
        self.procs.start("kubelet", [
            str(self.k8s_bin / "kubelet"),
            f"--config={config}",
            f"--kubeconfig={self.kubeconfig}",
            f"--root-dir={self.kubelet_dir}",
            f"--cert-dir={self.kubelet_dir / 'pki'}",
            f"--hostname-override={self.node_name}",
            f"--node-ip={self.node_ip}",
            f"--node-labels={NODE_LABEL}=true",
            "--v=2",
        ])
        self._write_state()

        def ready() -> bool:
            proc = self.kubectl("get", "node", self.node_name, "-o", "json", check=False)
            if proc.returncode != 0:
                return False
            conds = json.loads(proc.stdout).get("status", {}).get("conditions", [])
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

        self._wait(f"node {self.node_name} Ready", ready, 120)

    @property
    def state_dir(self) -> Path:
        """The simulated backend's ``--state-dir``: the checkpoint and the locks every instance shares."""
        return self.root / "plugin-state"

    def start_plugin(self, nvml: NvmlDriver | None = None, name: str = "plugin", pod_uid: str | None = None) -> None:
        """The plugin on the simulated backend, or (``nvml``) on the mock NVML in a fake driver root
        with the NVIDIA Container Toolkit's edits; each backend keeps its own checkpoint.

        ``pod_uid``: one instance of a rolling update (``--rolling-update``, as the chart runs it), whose
        sockets are named after its pod, so that several ``name``s can serve the node side by side."""
        if nvml is None:
            backend = ["--gpu-backend=simulated", f"--simulated-profile={self.profile}",
                       f"--state-dir={self.state_dir}", f"--health-file={self.health_file}"]
            env = {"PYTHONPATH": str(REPO)}
        else:
            backend = ["--gpu-backend=nvml", f"--nvidia-driver-root={nvml.driver_root}", f"--sysfs-root={nvml.sys_root}",
                       f"--nvidia-ctk-path={nvml.toolkit_bin / 'nvidia-ctk'}", f"--state-dir={self.root / 'plugin-state-nvml'}",
                       "--no-health-monitoring"]
            env = {"PYTHONPATH": str(REPO), **nvml.environment}
        rolling = [] if pod_uid is None else ["--rolling-update", f"--pod-uid={pod_uid}"]
        before = self.registrations(name)  # a restart waits for the new process's own line
        self.procs.start(name, [
            *bytecode.shipped_python(), "-m", "dra_driver", "kubelet-plugin",
            f"--node-name={self.node_name}",
            f"--driver-name={DRIVER_NAME}",
            *backend,
            f"--kubelet-registry-dir={self.registry_dir}",
            f"--kubelet-plugins-dir={self.plugins_dir}",
            f"--cdi-root={self.cdi_dir}",
            f"--dev-root={self.dev_root}",
            f"--kubeconfig={self.kubeconfig}",
            "--log-format=json",
            f"--cleanup-interval={self.cleanup_interval:g}",
            f"--stale-claim-grace={self.cleanup_interval:g}",
            *rolling,
        ], env=env)
        self._write_state()
        self._wait("the kubelet to register our plugin", lambda: self.registrations(name) > before, 60)

    def container_log_file(self, namespace: str, pod: str, container: str) -> Path | None:
        """The CRI log file containerd writes for a container (``<podLogsDir>/<ns>_<pod>_<uid>/<ctr>/N.log``)."""
        files = sorted((self.root / "pod-logs").glob(f"{namespace}_{pod}_*/{container}/*.log"))
        return files[-1] if files else None

    def registrations(self, name: str = "plugin") -> int:
        """How often the kubelet confirmed a registration (NotifyRegistrationStatus(registered=true))
        to the plugin instance ``name``."""
        log = self.logs / f"{name}.log"
        return log.read_text(errors="replace").count("registered with the kubelet") if log.exists() else 0

    def _write_state(self) -> None:
        state = {"pids": self.procs.identities(), "root": str(self.root), "node": self.node_name,
                 "kubeconfig": str(self.kubeconfig), "kubelet_port": self.kubelet_port, "timings": self.timings}
        (self.root / "state.json").write_text(json.dumps(state, indent=2))

    def stop(self, delete_node: bool = True) -> None:
        # Pods first, so the kubelet unprepares and containerd stops the shims while both are alive.
        for name in [n for n in self.procs.procs if n.startswith("plugin")]:  # every instance
            self.procs.stop(name)
        self.procs.stop("kubelet")
        self._remove_containers()
        self.procs.stop_all()
        cleanup_root(self.root)
        if delete_node:
            self.kubectl("delete", "node", self.node_name, "--wait=false", check=False)
        self._write_state()

    def _remove_containers(self) -> None:
        if "containerd" not in self.procs.procs:
            return
        with contextlib.suppress(Exception):
            tasks = self.ctr("tasks", "ls", "-q", check=False).stdout.split()
            for task in tasks:
                self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
            deadline = time.monotonic() + 10
            while tasks and time.monotonic() < deadline:
                tasks = self.ctr("tasks", "ls", "-q", check=False).stdout.split()
                for task in tasks:
                    self.ctr("tasks", "delete", task, check=False)
                time.sleep(0.2)
            for c in self.ctr("containers", "ls", "-q", check=False).stdout.split():
                self.ctr("containers", "delete", c, check=False)


def _mounts_under(root: Path) -> list[str]:
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == str(root) or point.startswith(str(root) + "/"):
            found.append(point)
    return found


def cleanup_root(root: Path) -> None:
    """Unmount what the kubelet and containerd left under ``root`` (deepest first) and kill stray shims."""
    for _ in range(3):
        points = _mounts_under(root)
        if not points:
            break
        for point in sorted(points, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)
    # Shims outlive containerd by design; those of this node name its state dir on their command line.
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = (pid_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if "containerd-shim-runc-v2" in cmdline and str(root) in cmdline:
                os.kill(int(pid_dir.name), signal.SIGKILL)
    bridge = "drarn" + hashlib.sha256(str(root).encode()).hexdigest()[:8]
    if Path(f"/sys/class/net/{bridge}").exists():
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, check=False)
    # The kubelet links container logs into /var/log/containers; drop the links into this root.
    logs = Path("/var/log/containers")
    if logs.is_dir():
        for link in logs.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and os.readlink(link).startswith(str(root)):
                    link.unlink()


def stop_detached(root: Path) -> None:
    state_file = root / "state.json"
    if not state_file.exists():
        return
    state = json.loads(state_file.read_text())
    recorded: dict[str, object] = state.get("pids", {})
    for name in ("plugin", "kubelet", "containerd"):
        started = pids.from_json(recorded.get(name))
        if started is not None and pids.send(started, signal.SIGTERM, group=True):
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and pids.is_running(started):
                time.sleep(0.1)
            pids.send(started, signal.SIGKILL, group=True)
    cleanup_root(root)
    kubeconfig = state.get("kubeconfig")
    if kubeconfig and Path(kubeconfig).exists():
        subprocess.run([str(binaries.bin_dir() / "kubectl"), "--kubeconfig", kubeconfig, "delete", "node",
                        state.get("node", NODE_NAME), "--wait=false"], capture_output=True, check=False)
    shutil.rmtree(root, ignore_errors=True)


OWNER_FILE = "owner.pid"


def checkout_root(checkout: Path = REPO) -> Path:
    """The detached node's root for one checkout: short (unix-socket paths), and its own per clone.

    ``dra-rnd-`` rather than ``dra-rn-``: the sweep of killed test runs must never touch it.
    """
    return Path("/tmp") / f"dra-rnd-{hashlib.sha256(str(checkout.resolve()).encode()).hexdigest()[:10]}"


def short_root() -> Path:
    # Unix socket paths are limited to 107 bytes; the kubelet's plugin sockets nest deeply.
    sweep_abandoned_roots()
    root = Path(tempfile.mkdtemp(prefix="dra-rn-", dir="/tmp"))
    (root / OWNER_FILE).write_text(str(os.getpid()))
    return root


def sweep_abandoned_roots() -> list[Path]:
    """Clean the roots of test runs that were killed outright: their shims and mounts outlive them."""
    swept = []
    for root in Path("/tmp").glob("dra-rn-*"):
        try:
            owner = int((root / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # not ours, or still being set up
        if Path(f"/proc/{owner}").exists():
            continue
        cleanup_root(root)
        shutil.rmtree(root, ignore_errors=True)
        swept.append(root)
    return swept


@contextlib.contextmanager
def running(kubeconfig: Path, root: Path | None = None, keep: bool = False) -> Iterator[RealNode]:
    owned = root is None
    node = RealNode(kubeconfig=kubeconfig, root=root or short_root())
    node.start()
    try:
        yield node
    finally:
        node.stop()
        if owned and not keep:
            shutil.rmtree(node.root, ignore_errors=True)


def preflight() -> list[str]:
    """What this machine lacks for a real node (empty when nothing is known to be missing)."""
    problems = []
    if os.geteuid() != 0:
        problems.append(f"containerd, runc and the kubelet need root (running as uid {os.geteuid()})")
    try:
        prereqs.find_busybox()
    except RuntimeError as exc:
        problems.append(str(exc))
    try:
        runtime.bin_dir()  # its cache key reads Go's version and libseccomp's: either may be missing
    except gotools.ToolError as exc:
        problems.append(str(exc))
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Start or stop a real kubelet + containerd node on the test bed.")
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--kubeconfig", type=Path, default=Path(".run/bed/kubeconfig"))
    parser.add_argument("--root", type=Path, default=None,
                        help="the node's root (default: one per checkout, so two clones never share a node)")
    args = parser.parse_args(argv)
    root = (args.root or checkout_root()).resolve()
    if args.action == "down":
        stop_detached(root)
        print(f"real node in {root} stopped")
        return 0
    if not args.kubeconfig.exists():
        print(f"real node: no control plane at {args.kubeconfig}: start one with `make cluster-up` "
              "(or pass --kubeconfig of a bed kept by `make demo KEEP=1`)", file=sys.stderr)
        return 1
    if (root / "state.json").exists():
        stop_detached(root)
    problems = preflight()
    if problems:
        print("real node cannot start:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    node = RealNode(kubeconfig=args.kubeconfig.resolve(), root=root, detached=True)
    started = time.monotonic()
    try:
        node.start()
    except (RuntimeError, TimeoutError) as exc:
        print(f"real node failed: {exc}\nlogs: {node.logs}", file=sys.stderr)
        return 1
    print(f"real node {node.node_name} ready in {time.monotonic() - started:.1f}s {node.timings}; root {root}")
    print(f"pods for it need: {json.dumps(pod_overrides())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
