"""Our node plugin against a Go baseline on the upstream kubeletplugin helper, on the real kubelet.

Both plugins are registered with the bed's real node (``e2e/testbed/realnode.py``: the real
kubelet, containerd and runc) at the same time and get the same pods in the same run, so every
figure is a ratio measured under the same load:

* the baseline is ``baseline-driver`` (``e2e/tooling/gotools/baseline-driver``): our own minimal
  driver on ``k8s.io/dynamic-resource-allocation/kubeletplugin`` at the bed's Kubernetes, writing a
  CDI spec with the same device nodes as ours and a checkpoint, both atomically;
* both publish 16 simulated H100s (a 16-GPU copy of the ``h100-8x`` profile, so a 16-pod burst
  fits on one driver's devices);
* sequential pods alternate between the drivers (which goes first alternates too); a burst is
  16 pods of one driver created at once, then 16 of the other;
* per call latency is what the kubelet observes: its ``-v=4`` lines "Calling NodePrepareResources
  rpc" / "Done calling NodePrepareResources rpc" (and the Unprepare pair), paired by claim UID;
  the verbosity is raised at run time through the node proxy's ``/debug/flags/v``;
* pod create → Running is the client's view (create call to the first poll that sees Running);
* RSS is each plugin's VmRSS after the workload;
* CPU per pod is each plugin's user + system time over a phase (all its threads, ended ones too,
  idle wake-ups included) divided by the pods it served in that phase;
* the profile: when ``py-spy`` is installed (``pip install py-spy``), a further sequential phase of
  our pods only, after the measured ones (so the sampler cannot skew them), is sampled at 1 kHz;
  :func:`profile_breakdown` turns the stacks of the gRPC prepare handler into milliseconds per call
  by part of the path, and the raw stacks go to ``real_node-profile.txt`` next to the results.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dra_driver.k8s.client import CLAIMS, DEVICE_CLASSES, PODS, SLICES, ApiError
from dra_driver.node.settings import DEFAULT_CLEANUP_INTERVAL
from e2e.bench.common import Result, summarize_ms
from e2e.bench.plugin import vm_rss_kib
from e2e.bench.sharedbed import BenchBed, parallel, wait_until
from e2e.testbed import images, realnode
from e2e.testbed.nodes import DRIVER_NAME
from e2e.tooling import gotools

NAMESPACE = "bench-real-node"
BASELINE_DRIVER = "baseline.dra-driver.io"
GPUS = 16
BURST = 16
CLASSES = {
    "ours": ("bench-ours", f"device.driver == '{DRIVER_NAME}' && device.attributes['{DRIVER_NAME}'].type == 'gpu'"),
    "baseline": ("bench-baseline", f"device.driver == '{BASELINE_DRIVER}'"),
}
DRIVERS = {"ours": DRIVER_NAME, "baseline": BASELINE_DRIVER}

# klog's text header: I1123 22:40:01.123456   12345 file.go:97] "message" key=value ...
_KLOG = re.compile(r"^[IWE](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d{6})\s+\d+ \S+\] \"([^\"]+)\"(.*)$")
_DRIVER = re.compile(r'driverName="([^"]+)"')
_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_EVENTS = {
    "Calling NodePrepareResources rpc": ("prepare", "start"),
    "Done calling NodePrepareResources rpc": ("prepare", "done"),
    # 1.36 and 1.37 spell the unprepare call's start in the singular.
    "Calling NodeUnprepareResource rpc": ("unprepare", "start"),
    "Calling NodeUnprepareResources rpc": ("unprepare", "start"),
    "Done calling NodeUnprepareResources rpc": ("unprepare", "done"),
}


@dataclass(frozen=True)
class RpcEvent:
    seconds: float
    """Seconds since midnight (klog prints no year; a run never spans more than a day)."""
    driver: str
    method: str
    phase: str
    uids: frozenset[str]


def parse_kubelet_log(lines: Iterable[str]) -> list[RpcEvent]:
    """The kubelet's DRA rpc start/done lines (``-v=4``), in log order."""
    events = []
    for line in lines:
        m = _KLOG.match(line)
        if not m or m.group(7) not in _EVENTS:
            continue
        driver = _DRIVER.search(m.group(8))
        if not driver:
            continue
        h, mi, s, us = (int(m.group(i)) for i in (3, 4, 5, 6))
        method, phase = _EVENTS[m.group(7)]
        events.append(RpcEvent(h * 3600 + mi * 60 + s + us / 1e6, driver.group(1), method, phase,
                               frozenset(_UID.findall(m.group(8)))))
    return events


def call_durations(events: Sequence[RpcEvent], driver: str, method: str, uids: set[str]) -> tuple[list[float], int]:
    """Seconds per call of ``method`` to ``driver`` for calls about ``uids``, and how many never completed.

    A call's start and done lines are paired by the claim UIDs they name (the request's claims, the
    response's map keys): the kubelet's calls for different pods overlap in a burst.
    """
    open_calls: dict[frozenset[str], float] = {}
    durations = []
    for e in events:
        if e.driver != driver or e.method != method or not (e.uids & uids):
            continue
        if e.phase == "start":
            open_calls[e.uids] = e.seconds
            continue
        key = next((k for k in open_calls if k <= e.uids), None)
        if key is not None:
            durations.append((e.seconds - open_calls.pop(key)) % 86400)
    return durations, len(open_calls)


PROFILE_RATE_HZ = 1000
# Where a sample's time goes: the step of the first of these frames met walking its stack from the
# leaf up (an atomic write counts for the file it writes; a wait for the group commit for itself).
PROFILE_PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("logging (structlog)", ("structlog/", "dra_driver/logs.py", "logging/__init__.py")),
    ("claim read (HTTP, TLS, JSON)", ("RestKubeApi", "dra_driver/k8s/transport.py", "http/client.py", "ssl.py")),
    ("device metadata files", ("MetadataFiles", "_write_metadata", "dra_driver/node/prepare/metadata.py")),
    ("CDI spec (build + atomic write)", ("CdiSpecs", "Materializer.write (", "dra_driver/node/prepare/cdi.py",
                                         "dra_driver/node/prepare/edits.py")),
    ("checkpoint (journal record + fdatasync, or a snapshot)", ("CheckpointStore",)),
    ("claim status report", ("ClaimStatusWriter",)),
    ("metrics", ("dra_driver/node/metrics.py", "dra_driver/metrics.py")),
    ("group commit (queueing, bookkeeping)", ("GroupCommit",)),
    ("gRPC server and protobuf", ("grpc/", "google/protobuf/", "dra_driver/_proto/", "dra_driver/node/kubelet/grpc.py")),
    ("prepare logic (config, sharing, devices)", (
        *(f"dra_driver/node/prepare/{m}.py" for m in ("state", "config", "exclusive", "ledger", "reading", "materialize",
                                                      "claimstatus")),
        "dra_driver/gpuconfig.py")),
)
PREPARE_ENTRY = "NodePrepareResources"


def profile_breakdown(collapsed: Iterable[str], rate_hz: int, calls: int) -> dict[str, float]:
    """Milliseconds per prepare call by part of the path, from py-spy's raw (collapsed) stacks.

    Only stacks under the gRPC prepare handler count; each sample is ``1000 / rate_hz`` ms of the
    handler's wall time, on the CPU or not (recorded with ``--idle``: waits on I/O, fsync and locks
    are part of a call's latency).
    """
    parts: dict[str, float] = {}
    per_sample = 1000.0 / rate_hz / calls
    for line in collapsed:
        stack, _, count = line.rstrip().rpartition(" ")
        frames = stack.split(";")
        if not count.isdigit() or not any(PREPARE_ENTRY in f for f in frames):
            continue
        part = next((name for f in reversed(frames) for name, marks in PROFILE_PARTS if any(m in f for m in marks)),
                    "other")
        parts[part] = parts.get(part, 0.0) + int(count) * per_sample
    return {k: round(v, 2) for k, v in sorted(parts.items(), key=lambda kv: -kv[1])}


def py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def sixteen_gpu_profile(path: Path) -> Path:
    """``h100-8x`` with twice the GPUs: a 16-pod burst of one driver needs 16 devices."""
    base = yaml.safe_load((Path(realnode.__file__).resolve().parents[2] / "dra_driver" / "profiles" / "h100-8x.yaml")
                          .read_text())
    gpus = []
    for i in range(GPUS):
        gpu = dict(base["gpus"][i % 8])
        gpu["index"] = i
        gpu["pciBusId"] = f"0000:{0x10 + i * 0x0e:02x}:00.0"
        gpu["numaNode"] = i * 2 // GPUS
        gpus.append(gpu)
    base["gpus"] = gpus
    base["description"] = f"{GPUS}x NVIDIA H100 80GB HBM3 (bench profile)"
    path.write_text(yaml.safe_dump(base, sort_keys=False))
    return path


@dataclass
class Run:
    bed: BenchBed
    node: realnode.RealNode
    created: dict[str, list[str]] = field(default_factory=lambda: {"ours": [], "baseline": []})
    startup: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    seq: int = 0

    def _objects(self, who: str) -> tuple[dict[str, Any], dict[str, Any]]:
        self.seq += 1
        name = f"{who}-{self.seq}"
        claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
                 "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASSES[who][0]}}]}}}
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
               "spec": {"terminationGracePeriodSeconds": 1, "restartPolicy": "Never",
                        "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                        "containers": [{"name": "c", "image": images.BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                                        "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"],
                                        "resources": {"claims": [{"name": "gpu"}]}}],
                        **realnode.pod_overrides(self.node.node_name)}}
        return claim, pod

    def start_pods(self, who: str, count: int, phase: str) -> list[str]:
        """Create ``count`` claims + pods at once; wait until all run; record create → Running."""
        pairs = [self._objects(who) for _ in range(count)]
        api = self.bed.api
        claims = parallel(lambda p: api.create(CLAIMS, p[0], namespace=NAMESPACE), pairs)
        self.created[who] += [c["metadata"]["uid"] for c in claims]
        started: dict[str, float] = {}

        def create(pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
            started[pair[1]["metadata"]["name"]] = time.monotonic()
            api.create(PODS, pair[1], namespace=NAMESPACE)

        parallel(create, pairs)
        names = set(started)
        running: dict[str, float] = {}

        def all_running() -> bool:
            for pod in api.list(PODS, namespace=NAMESPACE).items:
                name = pod["metadata"]["name"]
                if name in names and name not in running:
                    if pod.get("status", {}).get("phase") == "Running":
                        running[name] = time.monotonic()
                    elif pod.get("status", {}).get("phase") in ("Failed", "Succeeded"):
                        raise RuntimeError(f"pod {NAMESPACE}/{name} ended: {pod.get('status')}")
            return len(running) == len(names)

        wait_until(f"{count} {who} pods Running on {self.node.node_name}", all_running, timeout=180, interval=0.05)
        self.startup.setdefault(phase, {}).setdefault(who, []).extend(running[n] - started[n] for n in names)
        return sorted(names)

    def delete_pods(self, names: Sequence[str]) -> None:
        """Delete pods (the kubelet unprepares), wait until they are gone, then delete their claims."""
        api = self.bed.api
        parallel(lambda n: api.delete(PODS, n, namespace=NAMESPACE), names)

        def gone() -> bool:
            left = {p["metadata"]["name"] for p in api.list(PODS, namespace=NAMESPACE).items}
            return not (left & set(names))

        wait_until(f"{len(names)} pods deleted", gone, timeout=180, interval=0.1)
        for n in names:
            with contextlib.suppress(ApiError):
                api.delete(CLAIMS, n, namespace=NAMESPACE)


def profile_phase(run_: Run, pid: int, pods: int) -> tuple[set[str], list[str]] | None:
    """Sequential pods of ours under py-spy; the claim UIDs and the collapsed stacks (or None: no py-spy)."""
    spy = py_spy()
    if spy is None:
        return None
    out = Path(tempfile.mkdtemp(prefix="bench-profile-")) / "real_node-profile.txt"
    before = set(run_.created["ours"])
    proc = subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", str(PROFILE_RATE_HZ), "--format", "raw",
                             "--threads", "--idle", "--nonblocking", "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)  # attached
        for _ in range(pods):
            run_.delete_pods(run_.start_pods("ours", 1, "profiled"))
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    stacks = out.read_text().splitlines() if out.exists() else []
    shutil.rmtree(out.parent, ignore_errors=True)
    if not stacks:
        raise RuntimeError(f"real_node bench: py-spy ({spy}) recorded nothing for pid {pid}; it needs ptrace")
    return set(run_.created["ours"]) - before, stacks


def set_kubelet_verbosity(node: realnode.RealNode, level: int) -> None:
    """The kubelet's ``/debug/flags/v`` through the API server's node proxy (a PUT)."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as body:
        body.write(str(level))
        body.flush()
        node.kubectl("replace", "--raw", f"/api/v1/nodes/{node.node_name}/proxy/debug/flags/v", "-f", body.name)


def start_baseline(node: realnode.RealNode) -> int:
    binary = gotools.ensure(["baseline-driver"]) / "baseline-driver"
    proc = node.procs.start("baseline", [
        str(binary), f"--driver-name={BASELINE_DRIVER}", f"--node-name={node.node_name}",
        f"--kubeconfig={node.kubeconfig}", f"--kubelet-registry-dir={node.registry_dir}",
        f"--plugin-dir={node.plugins_dir / BASELINE_DRIVER}", f"--cdi-root={node.cdi_dir}",
        f"--dev-root={node.dev_root}", f"--state-dir={node.root / 'baseline-state'}", f"--devices={GPUS}",
    ])
    return proc.pid


def published(bed: BenchBed, driver: str, node_name: str) -> int:
    return sum(len(s["spec"].get("devices", [])) for s in bed.api.list(SLICES).items
               if s["spec"].get("driver") == driver and s["spec"].get("nodeName") == node_name)


@contextlib.contextmanager
def real_node(bed: BenchBed) -> Iterator[realnode.RealNode]:
    problems = realnode.preflight()
    if problems:
        raise RuntimeError("real_node bench: the real node cannot start here:\n  " + "\n  ".join(problems))
    root = realnode.short_root()
    # Our plugin as deployed: its default sweep for stale claims (one GET per prepared claim), not
    # the tests' 5 s; the baseline has no such sweep.
    node = realnode.RealNode(kubeconfig=bed.kubeconfig, root=root,
                             profile=str(sixteen_gpu_profile(root / "bench-16x.yaml")),
                             cleanup_interval=DEFAULT_CLEANUP_INTERVAL)
    node.start()
    try:
        yield node
    finally:
        node.stop()
        shutil.rmtree(root, ignore_errors=True)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and all its threads, living or gone (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ratio(ours: float, base: float) -> float:
    return ours / base if base else float("inf")


def run(bed: BenchBed, quick: bool) -> Result:
    sequential = 6 if quick else 24
    bursts = 1 if quick else 3
    result = Result("real_node", "Real kubelet: ours ÷ Go baseline (kubeletplugin helper)",
                    {"sequential_pods_per_driver": sequential, "bursts_per_driver": bursts, "burst_size": BURST,
                     "gpus_per_driver": GPUS, "baseline": f"baseline-driver on kubeletplugin "
                                                          f"{gotools.TOOLS['baseline-driver'].version()}"})
    for name, expr in CLASSES.values():
        with contextlib.suppress(ApiError):
            bed.api.create(DEVICE_CLASSES, {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                                            "metadata": {"name": name},
                                            "spec": {"selectors": [{"cel": {"expression": expr}}]}})
    bed.namespace(NAMESPACE)
    with real_node(bed) as node:
        baseline_pid = start_baseline(node)
        for who, driver in DRIVERS.items():
            wait_until(f"{who}'s {GPUS} devices published", lambda d=driver: published(bed, d, node.node_name) == GPUS,
                       timeout=120, interval=0.5)
        set_kubelet_verbosity(node, 4)
        run_ = Run(bed, node)
        # One pod each first: the image, the first CDI refresh and the plugins' first connections stay out.
        for who in DRIVERS:
            run_.delete_pods(run_.start_pods(who, 1, "warm-up"))
        warm = {who: set(uids) for who, uids in run_.created.items()}
        pids = {"ours": node.procs.procs["plugin"].pid, "baseline": baseline_pid}
        cpu = {who: [cpu_seconds(pid)] for who, pid in pids.items()}
        for i in range(sequential):
            for who in (("ours", "baseline") if i % 2 == 0 else ("baseline", "ours")):
                run_.delete_pods(run_.start_pods(who, 1, "sequential"))
        seq_uids = {who: set(uids) - warm[who] for who, uids in run_.created.items()}
        for who, pid in pids.items():
            cpu[who].append(cpu_seconds(pid))
        for i in range(bursts):
            for who in (("ours", "baseline") if i % 2 == 0 else ("baseline", "ours")):
                run_.delete_pods(run_.start_pods(who, BURST, "burst"))
        time.sleep(1.0)  # the last unprepare's "Done" line
        burst_uids = {who: set(uids) - warm[who] - seq_uids[who] for who, uids in run_.created.items()}
        for who, pid in pids.items():
            cpu[who].append(cpu_seconds(pid))
        rss = {who: vm_rss_kib(pid) for who, pid in pids.items()}
        profile = profile_phase(run_, pids["ours"], 6 if quick else 20)
        events = parse_kubelet_log((node.logs / "kubelet.log").read_text(errors="replace").splitlines())
        for log in ("kubelet", "plugin", "baseline"):  # the node's root goes with it: keep its logs to read
            shutil.copy(node.logs / f"{log}.log", Path(tempfile.gettempdir()) / f"bench-real-node-{log}.log")

    # Everything each plugin did while its pods came and went (prepare, unprepare, status writes, logs),
    # per pod: in a burst the node's CPUs are busy starting containers, so CPU is what calls wait for.
    pods = {"sequential": sequential, "burst": bursts * BURST}
    figures: dict[str, Any] = {"rss_kib": rss, "pod_start_ms": {}, "calls": {}, "cpu_ms_per_pod": {
        phase: {who: round((cpu[who][i + 1] - cpu[who][i]) * 1000 / pods[phase], 2) for who in pids}
        for i, phase in enumerate(pods)}}
    if profile is not None:
        uids, stacks = profile
        durations, _ = call_durations(events, DRIVER_NAME, "prepare", uids)
        figures["profile"] = {"calls": len(durations), "rate_hz": PROFILE_RATE_HZ,
                              "kubelet_observed_ms": summarize_ms(durations),
                              "ms_per_call": profile_breakdown(stacks, PROFILE_RATE_HZ, len(durations))}
        figures["profile"]["handler_ms_per_call"] = round(sum(figures["profile"]["ms_per_call"].values()), 2)
        result.files["real_node-profile.txt"] = "\n".join(stacks) + "\n"
    else:
        result.notes.append("No profile: py-spy is not installed (pip install py-spy).")
    headline: dict[str, str] = {}
    stats: dict[str, dict[str, dict[str, float]]] = {}
    for label, uids, method in (("prepare sequential", seq_uids, "prepare"), ("unprepare sequential", seq_uids, "unprepare"),
                                ("prepare burst", burst_uids, "prepare"), ("unprepare burst", burst_uids, "unprepare")):
        stats[label] = {}
        for who, driver in DRIVERS.items():
            durations, unfinished = call_durations(events, driver, method, uids[who])
            if not durations or unfinished:
                raise RuntimeError(f"real_node bench: {label} for {who}: {len(durations)} calls paired in the kubelet "
                                   f"log, {unfinished} without a 'Done' line (is the kubelet at -v=4?)")
            stats[label][who] = summarize_ms(durations)
            figures["calls"].setdefault(label, {})[who] = {"n": len(durations), **stats[label][who],
                                                            "samples_ms": [round(d * 1000, 3) for d in durations]}
    for phase in ("sequential", "burst"):
        figures["pod_start_ms"][phase] = {who: summarize_ms(v) for who, v in run_.startup[phase].items()}
    for label in stats:
        o, b = stats[label]["ours"], stats[label]["baseline"]
        for q in ("p50", "p90", "p99"):
            k = f"{q}_ms"
            headline[f"{label} {q}"] = f"{o[k]:.1f} / {b[k]:.1f} ms = {ratio(o[k], b[k]):.2f}"
    for phase in ("sequential", "burst"):
        o, b = figures["pod_start_ms"][phase]["ours"], figures["pod_start_ms"][phase]["baseline"]
        headline[f"pod create → Running p50, {phase}"] = (
            f"{o['p50_ms']:.0f} / {b['p50_ms']:.0f} ms = {ratio(o['p50_ms'], b['p50_ms']):.2f}")
    for phase, per_pod in figures["cpu_ms_per_pod"].items():
        headline[f"plugin CPU per pod, {phase}"] = (f"{per_pod['ours']:.1f} / {per_pod['baseline']:.1f} ms = "
                                                    f"{ratio(per_pod['ours'], per_pod['baseline']):.2f}")
    headline["plugin RSS"] = (f"{rss['ours']['VmRSS'] / 1024:.1f} / {rss['baseline']['VmRSS'] / 1024:.1f} MiB = "
                              f"{ratio(rss['ours']['VmRSS'], rss['baseline']['VmRSS']):.2f}")
    figures["headline"] = headline
    result.figures = figures
    # The "done when": ours ÷ baseline in one run.
    for label in ("prepare sequential", "prepare burst"):
        for q in ("p50", "p90"):
            result.target(f"{label} {q}, ours ÷ baseline", ratio(stats[label]["ours"][f"{q}_ms"],
                                                                           stats[label]["baseline"][f"{q}_ms"]),
                          1.0, "")
    result.target("unprepare sequential p50, ours ÷ baseline",
                  ratio(stats["unprepare sequential"]["ours"]["p50_ms"],
                        stats["unprepare sequential"]["baseline"]["p50_ms"]),
                  1.0, "")
    result.target("plugin RSS, ours ÷ baseline", ratio(rss["ours"]["VmRSS"], rss["baseline"]["VmRSS"]), 1.2, "")
    result.notes.append("Each ratio is ours ÷ baseline from the same run on the same kubelet; the figures in "
                        "`headline` are ours / baseline. Per-call latency is the kubelet's own view (its -v=4 log).")
    return result
