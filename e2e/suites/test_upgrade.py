"""Zero-gap upgrades of the node plugin (issue 31) on the real node, under a stream of GPU pods.

The chart's rolling update (``kubeletPlugin.rollingUpdate``, maxSurge 1) starts the new plugin pod B
beside the old A on each node; both run with ``--rolling-update --pod-uid <their pod>``, so their
sockets differ, and the kubelet (>= 1.33) sends its calls to the newest registered one. Here the real
kubelet on ``real-node-1`` sees exactly that: instance A serves a stream of short GPU pods (pods start
while others are deleted), B starts in the middle and registers, then A gets SIGTERM (or SIGKILL).

What must hold, counted from the kubelet's own log and Events (``e2e/suites/podstream.py``) and from
the node's files under the plugins' own lock (``<state dir>/serialize.lock``: no call is half-way):

* no failed NodePrepareResources / NodeUnprepareResources (SIGKILL: at most one per pod, the call
  in flight on A; the kubelet's retry goes to B);
* every pod runs, then is deleted cleanly (gone, its claim unprepared);
* the CDI specs on disk and the checkpoint agree (same claims, same CDI devices), no GPU in two
  exclusive claims' specs, no device in two allocated claims;
* pod start p99 during the upgrade <= 1.5 x the p99 of the same stream without one, in the same run:
  asserted by ``--long``, which runs the issue's own stream (2 pods/s for 90 s). The short stream of
  ``make test`` has 40 pods a phase, so its p99 is its slowest pod: on this 2-core machine one pod
  slowed by the machine's other work moved the ratio between 0.6 and 1.74 over five runs of the
  same code, either phase being the slow one. It is printed and recorded there, not asserted.

A one-line summary per phase is printed; the figures go to ``e2e/results/upgrade.json``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dra_driver.k8s.client import CLAIMS, RestKubeApi
from dra_driver.node.prepare.checkpoint import ClaimState
from dra_driver.ondisk import PUBLISHER_LOCK_FILE, SERIALIZE_LOCK_FILE, SocketPaths, socket_paths
from e2e.bench.common import machine_facts
from e2e.suites.podstream import (
    PREPARE_FAILED,
    PREPARE_FAILED_EVENT,
    RESULTS,
    PodStream,
    StreamPlan,
    failure_lines,
    kubelet_failures,
    pod_problems,
    warning_events,
)
from e2e.suites.reliability import (
    allocate,
    checkpoint_at,
    exclusive_conflicts,
    record,
    spec_problems,
    state_problems,
)
from e2e.testbed.clusterview import DRIVER, Bed, attr, slice_devices, wait_for
from e2e.testbed.dracalls import Claim, DraClient

pytestmark = pytest.mark.testbed_only

SHORT = StreamPlan(rate=1.0, seconds=30.0, linger=2.0)
"""Scaled down for a 2-core machine and CI's budget; at most six pods at once (the node has eight GPUs)."""
LONG = StreamPlan(rate=2.0, seconds=90.0, linger=1.0)
SWITCH_AT = 0.4
"""When B starts, as a fraction of the stream: pods before, during and after the switch."""
P99_FACTOR = 1.5
TEMPLATE = "stream-gpu"


# --- the plugin instances ---------------------------------------------------------------------------


@dataclass
class Instances:
    """The plugin instances on the real node, as a DaemonSet's pods during a rolling update."""

    node: Any
    current: str = ""
    pod_uids: dict[str, str] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)

    def start_next(self) -> str:
        """Start one more instance (a new pod UID) and wait until the kubelet registered it."""
        name = f"plugin-{len(self.pod_uids)}"
        self.pod_uids[name] = str(uuid.uuid4())
        started = time.monotonic()
        self.node.start_plugin(name=name, pod_uid=self.pod_uids[name])
        self.events.append({"started": name, "registered_after_s": round(time.monotonic() - started, 2)})
        return name

    def sockets(self, name: str) -> SocketPaths:
        return socket_paths(DRIVER, self.node.registry_dir, self.node.plugins_dir / DRIVER, self.pod_uids[name])

    def stop(self, name: str, sig: signal.Signals) -> dict[str, Any]:
        """Signal an instance and wait for it to exit: its exit code, how long it took, what it left."""
        sockets = self.sockets(name)
        proc = self.node.procs.procs.pop(name)
        started = time.monotonic()
        proc.send_signal(sig)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait(timeout=10)
            code = f"did not exit within 30 s of {sig.name} (killed: {code})"
        outcome = {"stopped": name, "signal": sig.name, "exit_code": code,
                   "exit_s": round(time.monotonic() - started, 2),
                   "sockets_left": [str(p) for p in (sockets.registration, sockets.dra) if p.exists()]}
        self.events.append(outcome)
        return outcome

    def switch(self, sig: signal.Signals) -> dict[str, Any]:
        """The rolling update of one node: B up and registered beside A, then A stopped with ``sig``;
        then how long until an instance (B, the only one left) holds ``publisher.lock`` again."""
        old = self.current
        self.current = self.start_next()
        outcome = self.stop(old, sig)
        stopped = time.monotonic()
        outcome["publisher_after_s"] = None
        with contextlib.suppress(AssertionError):  # None: the test says so after the stream
            wait_for(f"{self.current} holding {PUBLISHER_LOCK_FILE}", lambda: publisher_held(self.node), 30, 0.2)
            outcome["publisher_after_s"] = round(time.monotonic() - stopped, 2)
        return outcome


def publisher_held(node: Any) -> bool:
    """Whether a plugin instance holds ``publisher.lock`` (a try without waiting fails)."""
    path = node.state_dir / PUBLISHER_LOCK_FILE
    if not path.exists():
        return False
    with open(path, "rb") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


@pytest.fixture(scope="module")
def instances(real_node: Any) -> Iterator[Instances]:
    """The real node's plugin as the chart runs it: one rolling-update instance to start with."""
    got = Instances(real_node)
    real_node.procs.stop("plugin")
    got.current = got.start_next()
    yield got


# --- the node's files under the plugins' lock --------------------------------------------------------


@contextlib.contextmanager
def plugins_locked(node: Any) -> Iterator[bool]:
    """Hold ``serialize.lock``, as a plugin call does; False (nothing held) when no plugin made it."""
    lock = node.state_dir / SERIALIZE_LOCK_FILE
    if not lock.exists():
        yield False
        return
    with open(lock, "rb") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def node_files_problems(node: Any, crashed: bool) -> list[str]:
    """Checkpoint against CDI specs, read between the plugins' batches (a claim may be recorded
    ahead of its preparation, nothing more). After a SIGKILL (``crashed``) a claim may be left
    PrepareStarted, with or without its spec, until the kubelet's retry."""
    entries, _ = checkpoint_at(node.state_dir, node.node_name)
    if crashed:
        unfinished = {u for u, e in entries.items() if e.state is ClaimState.PREPARE_STARTED}
        return [p for p in spec_problems(entries, node.cdi_dir) if not any(u in p for u in unfinished)] + [
            f"exclusive conflict {c}" for c in exclusive_conflicts(entries)]
    return state_problems(node.node_name, node.state_dir, node.cdi_dir, None, calls_in_flight=True) + \
        spec_problems(entries, node.cdi_dir)


def double_allocations(api: RestKubeApi, ns: str) -> list[str]:
    """Devices in more than one allocated claim of ``ns`` at once (the scheduler's side)."""
    holders: dict[tuple[str, str], list[str]] = {}
    for claim in api.list(CLAIMS, namespace=ns).items:
        for r in claim.get("status", {}).get("allocation", {}).get("devices", {}).get("results", []):
            holders.setdefault((r["pool"], r["device"]), []).append(claim["metadata"]["name"])
    return [f"{pool}/{device} in {names}" for (pool, device), names in holders.items() if len(names) > 1]


class Watchdog:
    """Every ``interval`` seconds during a stream: the node's files under the lock, the claims' allocations."""

    def __init__(self, node: Any, ns: str, crashed: Callable[[], bool], interval: float = 2.0) -> None:
        self.node, self.ns, self.crashed, self.interval = node, ns, crashed, interval
        self.api = RestKubeApi.from_kubeconfig(str(node.kubeconfig))
        self.checks = 0
        self.problems: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="upgrade-watchdog", daemon=True)

    def __enter__(self) -> Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                with plugins_locked(self.node) as held:
                    found = node_files_problems(self.node, self.crashed()) if held else []
                found += double_allocations(self.api, self.ns)
            except Exception as exc:  # a file half-written under the lock is a finding too
                held, found = True, [f"check failed: {exc!r}"]
            self.checks += held
            self.problems += [f"{time.strftime('%H:%M:%S')} {p}" for p in found]


# --- one phase of the stream ------------------------------------------------------------------------


def stream_pod(node: Any) -> Callable[[str], dict[str, Any]]:
    from e2e.testbed.realnode import pod_overrides

    def pod(name: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
            **pod_overrides(node.node_name),
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": TEMPLATE}],
            "containers": [{"name": "ctr0", "image": "busybox:1.36",
                            "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"],
                            "resources": {"claims": [{"name": "gpu"}]}}]}}
    return pod


def template() -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": TEMPLATE},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": f"gpu.{DRIVER}"}}]}}}}


def run_phase(bed: Bed, node: Any, ns: str, plan: StreamPlan, name: str,
              during: Callable[[PodStream], dict[str, Any]] | None = None,
              crashed: Callable[[], bool] = lambda: False) -> dict[str, Any]:
    """The stream in ``ns`` (``during`` runs beside it), then everything it leaves to judge."""
    bed.apply([template()], ns=ns)
    kubelet_log = node.logs / "kubelet.log"
    offset = kubelet_log.stat().st_size
    stream = PodStream(str(node.kubeconfig), ns, plan, stream_pod(node), prefix=f"{name}-")
    outcome: dict[str, Any] = {}
    with Watchdog(node, ns, crashed) as watchdog:
        stream.start()
        try:
            if during is not None:
                outcome = during(stream)
            stream.finish()
        finally:
            stream.cleanup()
    summary = stream.summary()
    # Every pod is gone: every claim of the namespace must be unprepared, and nothing else disturbed.
    left: list[str] = []

    def quiet() -> bool:
        with plugins_locked(node):
            entries, _ = checkpoint_at(node.state_dir, node.node_name)
            left[:] = [f"{e.ref} still in the checkpoint" for e in entries.values() if e.namespace == ns]
            left.extend(node_files_problems(node, crashed=False))
        return not left

    with contextlib.suppress(AssertionError):  # reported below
        wait_for(f"the claims of {ns} unprepared", quiet, 60, interval=1)
    with open(kubelet_log, "rb") as f:
        f.seek(offset)
        said = f.read().decode(errors="replace")
    failures = kubelet_failures(said, ns)
    # This phase's pods and their claims (named after them) only: a test may run several phases in ns.
    events = warning_events([e for e in bed.get("events", ns=ns)["items"]
                             if e.get("involvedObject", {}).get("name", "").startswith(f"{name}-")])
    per_pod: dict[str, int] = {}
    for line in said.splitlines():
        if PREPARE_FAILED in line and f'pod="{ns}/' in line:
            pod = line.split(f'pod="{ns}/', 1)[1].split('"', 1)[0]
            per_pod[pod] = per_pod.get(pod, 0) + 1
    result = {
        **summary, **outcome,
        "kubelet_failed_prepare": failures["prepare"], "kubelet_failed_unprepare": failures["unprepare"],
        "failed_prepare_events": events.get(PREPARE_FAILED_EVENT, 0), "warning_events": events,
        "most_failed_prepares_of_one_pod": max(per_pod.values(), default=0),
        "failure_lines": failure_lines(said, ns),
        "watchdog_checks": watchdog.checks, "watchdog_problems": watchdog.problems[:10],
        "left_after_stream": left[:10],
    }
    return result


def report(capsys: pytest.CaptureFixture[str], key: str, phase: str, r: dict[str, Any]) -> None:
    line = (f"[upgrade] {key}/{phase}: {r['pods']} pods at {r['rate_per_s']}/s over {r['created_over_s']} s "
            f"({r['held_back']} held back at {r['max_alive']} alive), running {r['running']}, "
            f"never running {len(r['never_running'])}, not gone {len(r['not_gone'])}; kubelet failed "
            f"NodePrepareResources {r['kubelet_failed_prepare']} / NodeUnprepareResources "
            f"{r['kubelet_failed_unprepare']}, {PREPARE_FAILED_EVENT} events {r['failed_prepare_events']}; "
            f"start p50 {r['start_p50_ms']} ms p99 {r['start_p99_ms']} ms; state checks {r['watchdog_checks']} "
            f"with {len(r['watchdog_problems'])} problems, left {len(r['left_after_stream'])}")
    if r.get("p99_vs_baseline") is not None:
        line += f"; start p99 / the baseline's {r['p99_vs_baseline']} (target <= {P99_FACTOR})"
    with capsys.disabled():
        print("\n" + line)


def save(key: str, value: dict[str, Any]) -> None:
    record("real_node", key, {**value, "machine": machine_facts(),
                              "command": "make e2e PYTEST_ARGS='-k test_upgrade'"}, results=RESULTS)


def assert_clean(r: dict[str, Any], what: str) -> None:
    """Every pod ran and went, the stream's own calls worked, the node's files always agreed."""
    assert not pod_problems(r), f"{what}: {pod_problems(r)}"
    assert r["watchdog_checks"], f"{what}: no {SERIALIZE_LOCK_FILE} to check the node's files under"
    assert not r["watchdog_problems"], f"{what}: node state during the stream: {r['watchdog_problems']}"
    assert not r["left_after_stream"], f"{what}: after the stream: {r['left_after_stream']}"


def assert_no_failures(r: dict[str, Any], what: str) -> None:
    assert (r["kubelet_failed_prepare"], r["kubelet_failed_unprepare"], r["failed_prepare_events"]) == (0, 0, 0), \
        f"{what}: the kubelet saw failed calls: {r['failure_lines']}"


# --- the tests -------------------------------------------------------------------------------------


def upgrade_under_load(bed: Bed, ns: str, node: Any, instances: Instances, plan: StreamPlan, key: str,
                       capsys: pytest.CaptureFixture[str], *, gate_p99: bool) -> None:
    # The baseline stream is there for the p99 gate alone; the short variant does not gate, and its
    # stream without an upgrade is what the real-node tests already run.
    baseline: dict[str, Any] = {"start_p99_ms": None}
    if gate_p99:
        baseline = run_phase(bed, node, ns, plan, "base")
        report(capsys, key, "baseline", baseline)
        save(f"{key}_baseline", {"what": "the pod stream, no upgrade", **baseline})
        assert_clean(baseline, "baseline")
        assert_no_failures(baseline, "baseline")

    def switch(stream: PodStream) -> dict[str, Any]:
        wait_for("the middle of the stream", lambda: stream.elapsed() >= SWITCH_AT * plan.seconds, plan.seconds)
        return {"switch_at_s": round(stream.elapsed(), 1), **instances.switch(signal.SIGTERM)}

    upgrade = run_phase(bed, node, ns, plan, "up", during=switch)
    upgrade["p99_vs_baseline"] = round(upgrade["start_p99_ms"] / baseline["start_p99_ms"], 2) \
        if upgrade["start_p99_ms"] and baseline["start_p99_ms"] else None
    report(capsys, key, "upgrade (SIGTERM)", upgrade)
    save(key, {"what": "the same stream; B started beside A in its middle, registered, then A got SIGTERM",
               **upgrade, "baseline_start_p99_ms": baseline["start_p99_ms"]})
    assert upgrade["exit_code"] == 0 and upgrade["exit_s"] <= 10, \
        f"A exited with {upgrade['exit_code']} after {upgrade['exit_s']} s of SIGTERM"
    assert not upgrade["sockets_left"], f"A left its sockets: {upgrade['sockets_left']}"
    assert upgrade["publisher_after_s"] is not None, f"B did not take {PUBLISHER_LOCK_FILE} over within 30 s"
    assert_clean(upgrade, "upgrade")
    assert_no_failures(upgrade, "upgrade")
    assert not gate_p99 or upgrade["start_p99_ms"] <= P99_FACTOR * baseline["start_p99_ms"], \
        f"pod start p99 {upgrade['start_p99_ms']} ms during the upgrade, {baseline['start_p99_ms']} ms without"


@pytest.mark.timeout(600)
def test_upgrade_under_load(bed: Bed, ns: str, real_node: Any, instances: Instances,
                            capsys: pytest.CaptureFixture[str]) -> None:
    upgrade_under_load(bed, ns, real_node, instances, SHORT, "sigterm", capsys, gate_p99=False)


@pytest.mark.long
@pytest.mark.timeout(1200)
def test_upgrade_under_load_long(bed: Bed, ns: str, real_node: Any, instances: Instances,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    upgrade_under_load(bed, ns, real_node, instances, LONG, "sigterm_long", capsys, gate_p99=True)


@pytest.mark.timeout(600)
def test_upgrade_with_sigkill_under_load(bed: Bed, ns: str, real_node: Any, instances: Instances,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A dies at once (SIGKILL) after B registered: a call in flight on A may fail, once; the kubelet's
    retry goes to B. Nothing is lost, nothing prepared twice, no GPU in two claims."""
    killed = threading.Event()

    def switch(stream: PodStream) -> dict[str, Any]:
        wait_for("the middle of the stream", lambda: stream.elapsed() >= SWITCH_AT * SHORT.seconds, SHORT.seconds)
        at = round(stream.elapsed(), 1)
        killed.set()  # from here the node's files may hold A's unfinished work
        return {"switch_at_s": at, **instances.switch(signal.SIGKILL)}

    r = run_phase(bed, real_node, ns, SHORT, "kill", during=switch, crashed=killed.is_set)
    report(capsys, "sigkill", "upgrade (SIGKILL)", r)
    save("sigkill", {"what": "the stream; B started beside A in its middle, registered, then A got SIGKILL", **r})
    assert r["exit_code"] == -signal.SIGKILL
    assert r["publisher_after_s"] is not None, f"no instance took {PUBLISHER_LOCK_FILE} over from the killed one"
    assert_clean(r, "SIGKILL")
    assert r["most_failed_prepares_of_one_pod"] <= 1, f"a pod's prepare failed more than once: {r['failure_lines']}"
    assert r["kubelet_failed_unprepare"] <= 1, f"unprepare failed more than once: {r['failure_lines']}"


def devices_of(response: Any) -> list[tuple[tuple[str, ...], str, str, tuple[str, ...]]]:
    return sorted((tuple(d.request_names), d.pool_name, d.device_name, tuple(d.cdi_device_ids)) for d in response.devices)


def journal_mark(checkpoint: Path) -> tuple[bytes, int]:
    """(snapshot line, size) of the checkpoint: where the records a round appends will start."""
    if not checkpoint.exists():
        return b"", 0
    data = checkpoint.read_bytes()
    return data.split(b"\n", 1)[0], len(data)


def preparations(checkpoint: Path, uid: str, mark: tuple[bytes, int]) -> int:
    """Journal records since ``mark`` that set ``uid`` PrepareCompleted: one per preparation (a repeated
    prepare of a prepared claim answers from the checkpoint and writes nothing). A save that compacted
    the file meanwhile (a process's first) folds its record into the new snapshot, so then the count
    may come out one short, never too high."""
    data = checkpoint.read_bytes()
    snapshot, rest = data.split(b"\n", 1)
    if snapshot == mark[0] and len(data) >= mark[1]:
        rest = data[mark[1]:]
    count = 0
    for line in rest.decode().splitlines():
        entry = json.loads(line).get("record", {}).get("set", {}).get(uid)
        count += bool(entry and entry.get("state") == ClaimState.PREPARE_COMPLETED.value)
    return count


@pytest.mark.timeout(300)
def test_two_instances_answer_for_one_claim_at_once(bed: Bed, ns: str, real_node: Any, instances: Instances,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A and B both up and called for the same claim at the same moment, straight on their DRA sockets:
    the same devices from both, one preparation in the checkpoint; then unprepared by one and prepared
    by the other, in turns, and unprepared by both at once."""
    api = RestKubeApi.from_kubeconfig(str(real_node.kubeconfig))
    taken = {(r["pool"], r["device"]) for c in api.list(CLAIMS).items
             for r in c.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])}
    free = sorted(name for (pool, name), d in slice_devices(bed).items()
                  if pool == real_node.node_name and attr(d, "type") == "gpu" and (pool, name) not in taken)
    assert free, "no free GPU on the real node"
    claim: Claim = allocate(api, ns, "both", real_node.node_name, free[0], sharing="Exclusive")
    uid = claim[2]
    first = instances.current
    second = instances.start_next()
    clients = [DraClient(instances.sockets(name).dra) for name in (first, second)]
    checkpoint = real_node.state_dir / "checkpoint.json"
    rounds = 8
    seen: dict[str, Any] = {"rounds": rounds, "prepares_per_round": []}

    def at_once(call: str) -> list[Any]:
        barrier = threading.Barrier(len(clients))

        def one(client: DraClient) -> Any:
            barrier.wait()
            return getattr(client, call)([claim])[uid]

        with ThreadPoolExecutor(len(clients)) as pool:
            return list(pool.map(one, clients))

    def prepared_once(what: str) -> None:
        with plugins_locked(real_node):
            entries, _ = checkpoint_at(real_node.state_dir, real_node.node_name)
            problems = spec_problems(entries, real_node.cdi_dir)
        assert list(entries) == [uid] and entries[uid].state is ClaimState.PREPARE_COMPLETED, f"{what}: {entries}"
        assert not problems, f"{what}: {problems}"

    def unprepared(what: str) -> None:
        with plugins_locked(real_node):
            problems = state_problems(real_node.node_name, real_node.state_dir, real_node.cdi_dir, set())
        assert not problems, f"{what}: {problems}"

    try:
        expected = None
        for i in range(rounds):
            mark = journal_mark(checkpoint)
            both = at_once("prepare")
            assert [r.error for r in both] == ["", ""], f"round {i}: {[r.error for r in both]}"
            got = [devices_of(r) for r in both]
            assert got[0] == got[1] and got[0], f"round {i}: A answered {got[0]}, B {got[1]}"
            expected = expected or got[0]
            assert got[0] == expected, f"round {i}: {got[0]}, earlier {expected}"
            seen["prepares_per_round"].append(preparations(checkpoint, uid, mark))
            prepared_once(f"round {i} after both prepared")
            # One instance unprepares, the other prepares again: each re-reads what the other wrote.
            by, other = (clients[0], clients[1]) if i % 2 == 0 else (clients[1], clients[0])
            assert by.unprepare([claim])[uid].error == ""
            unprepared(f"round {i} after one unprepared")
            again = other.prepare([claim])[uid]
            assert again.error == "" and devices_of(again) == expected, f"round {i}: {again}"
            prepared_once(f"round {i} after the other prepared")
            assert [r.error for r in at_once("unprepare")] == ["", ""]
            unprepared(f"round {i} after both unprepared")
    finally:
        for c in clients:
            c.close()
        outcome = instances.stop(second, signal.SIGTERM)
        api.delete(CLAIMS, "both", namespace=ns)
    with capsys.disabled():
        print(f"\n[upgrade] two instances, one claim: {rounds} rounds of prepare on both at once, "
              f"preparations (journal records) per round {seen['prepares_per_round']}")
    save("two_instances_one_claim", {"what": "NodePrepareResources for one claim on A and B at once, then "
                                             "unprepare/prepare across them", **seen, "second_stopped": outcome})
    counts = seen["prepares_per_round"]
    assert all(n <= 1 for n in counts), f"prepared more than once: {counts}"
    assert sum(counts) >= rounds - 1, f"preparations not found in the journal (one compaction may hide one): {counts}"
    assert outcome["exit_code"] == 0
