"""The scale bench: our controller beside the kube-scheduler, on the real control plane, at 500 to 5,000 GPU nodes.

``make bench-scale`` (``python -m e2e.bench.scale``) runs the curve; ``--smoke`` runs 250 nodes
with smaller workloads (``e2e/suites/test_scale_smoke.py`` runs that in ``make e2e``).

The cluster
===========
The bed's control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, built from
the pins) with API Priority and Fairness on, as in production; kwok (``e2e/testbed/kwok.py``)
keeps the Nodes Ready and runs the pods bound to them. Per GPU node one ResourceSlice as our
plugin writes it (``e2e/generators/fleet.py``: 8 GPUs, H100/A100/L4/T4 in turn), plus one node in ten
with the dynamic-MIG catalogue (500 at 5,000 nodes, each ~150 partitionable devices in four
slices). The DeviceClasses are the shipped ones (``deploy/deviceclasses``).

The sizes grow one cluster: 500, then 1,000, 2,000 and 5,000 GPU nodes; each step adds the nodes
and slices, then brings the cluster to 4 allocated claims per GPU node, then adds 2 pods per node
that need no claim (bound by name). At 5,000 nodes that is 20,000 claims allocated and 30,000 pods.
Of the claims, a few per size go through the kube-scheduler (pods with a claim from a
ResourceClaimTemplate, four shapes: any GPU, an H100 by product name, >= 40Gi of memory, a 1g MIG
device) and are timed: 250 at the first size, then about a minute of binding at the rate the
previous size predicts (at least 60: about 230, 140 and 60 at 1,000, 2,000 and 5,000 nodes). The
others are written as the scheduler writes them (the claim's ``status.allocation`` of one GPU of
the pod's node and ``reservedFor`` the pod, bound to that node), half of each plain node's GPUs: on
this machine the scheduler binds under 10 pods/s at 500 nodes and about 1 at 5,000 (CPU-bound), so
20,000 through it would take hours.

Our controller runs as ``dra-driver controller`` does in production (``python -OO``, leader
election, its informers, its queue, its writes), under its own user (cluster-admin by RBAC; not
``system:masters``, so API Priority and Fairness applies to it), and is started afresh for each
measurement that needs a fresh process.

What is measured at each size
=============================
* **scheduler pods/s**: the fill's pods, first create -> last pod bound, with our controller
  stopped (and, for our claims/s, no pod for the scheduler): each side is timed alone, since on
  two cores the other's CPU would be timed too.
* **controller RSS with all informers synced** (VmRSS of a fresh process, once ``/healthz``
  answers 200 and its warm-up has ended, and 2 s after) at three points per size: after the new nodes, after the fill, after
  the plain pods. A least-squares fit over devices and claims (a claim's pod moves with it) gives
  their slopes. A plain pod's cost (the controller keeps none) is measured in one process: the
  after-the-fill controller's VmRSS before the plain pods are created and once their watch events
  have reached it (two fresh starts of the same state differ by more than 6,000 plain pods could
  cost). The 150,000-pod figure is extrapolated from these; the first sample of a size that failed
  later is kept in the fit.
* **first claim after start**: in that last fresh process, one pending claim that fits (its pod
  names a scheduler that does not exist, so the claim waits for our controller alone). Its time is
  the controller's own ``resolve_duration_seconds`` observation (the histogram's sum moves by
  exactly that one evaluation); the caches it builds are VmRSS after - VmRSS before.
* **a claim whose selector nothing has evaluated yet**: in the same process, right after that first
  claim and before any other selector, one unsatisfiable claim whose selector compares memory with
  a literal no claim has had; its time is the same histogram's, summed over its claim's evaluations
  (one, unless its pod's event came late): what a person's first ``explain`` of a new template costs
  the engine, and what the controller meets with that template's first claim.
* **resolve one fitting claim** and **explain one unsatisfiable claim**: more such probes, one at a
  time, p50 of the same per-evaluation time.
* **the explanation's extra memory**: a second fresh process whose first claim is an unsatisfiable
  one; its peak RSS growth (VmHWM, reset before the claim through ``/proc/<pid>/clear_refs``) less
  the fitting first claim's. In a warm process the explanation reuses memory the allocator already
  holds and RSS hardly moves, which would hide it; the warm peak growth is kept as a figure too.
* **backlog**: pending unsatisfiable claims, 10,000 at the largest size (one per two nodes below
  it), their pods created first, the claims then all at once, while no controller runs (creating
  10,000 takes this machine a minute or two by itself); then a fresh controller, and the time from
  its informers' sync until every claim carries its explanation (annotation seen on a watch),
  waiting at most 75 s. Our claims/s is this rate. It runs last in a size; at the last planned size
  its claims are not deleted. The API server's own count of writes to claims and Events
  (``apiserver_request_total`` by resource, verb and code, whatever the outcome) is read before
  the controller's spawn and once it has stood still after the last explanation; the bench writes
  neither then, nor does kwok (it writes Leases and Node status).
  When the largest planned size does not run (skipped for the budget, or failed), one backlog of
  10,000 runs after the sizes on a fresh controller: at the largest size that ran, or on the
  larger cluster a failed size left (the conservative reading); without time for it, the row is
  projected and says so.
* **the explained backlog** (the 10,000 kept at the end): ``python -m dra_driver explain -A`` as a
  user runs it, three times, each from process start to exit, with what it listed; then the same
  claims, our annotations cleared, explained again by a fresh controller with ``--no-pod-events``,
  its writes counted the same way: the pod Events' cost is the factor of the two counts (the same
  claims and pods; why not a second backlog: ``explained_backlog_phase``). The Events each of the
  two controllers wrote, by the kind of object they are about, are counted from the Events
  themselves (their ``reportingInstance`` is the controller's identity). Skipped, and said, when
  the budget has no room for it.
* **startup**: a fresh process with one pending unsatisfiable claim waiting: spawn -> ``/healthz``
  200 (informers synced) -> the claim's explanation seen. Three fresh processes in turn, each with
  a claim of its own; the row is their median (one start alone moved by half from run to run on
  this machine), and every sample is kept in the result.
* **API Priority and Fairness** (at the first size): a FlowSchema sends the controller's user to a
  PriorityLevelConfiguration with 1 nominal share and no queue (``Reject``), so the API server
  answers 429 beyond 3 seats; a fresh controller must still explain every pending claim and log no
  error. Its start-up LISTs meet 429s; while it explains, a few threads of the bench send GETs in
  the same flow so that its writes meet them too. The API server's count of rejected requests, less
  those the bench's own threads got, shows that the limit bit on the controller.
* **profile**: py-spy samples the controller during the probes at the largest size; the breakdown
  by function is in the result and the raw stacks in ``scale-profile.txt``.

Each row of the issue is then stated at 5,000 nodes: measured where that size ran, else
extrapolated along the curve (``e2e/bench/scale/rows.py`` says how, row by row).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dra_driver.k8s.client import CLAIMS, PODS, ApiError, Obj, Resource
from e2e.bench.common import REPO, RESULTS, Result, machine_facts, percentile, summary_markdown
from e2e.bench.scale.cluster import (
    APF_NAME,
    APISERVER_ARGS,
    CONTROL_PLANE_QPS,
    CONTROLLER_USER,
    FIT_SHAPES,
    FLOWSCHEMAS,
    NO_SCHEDULER,
    NS_APF,
    NS_BACKLOG,
    NS_FILL,
    NS_PROBE,
    PRIORITY_LEVELS,
    QUEUE_DEPTH,
    RESOLVE_HISTOGRAM,
    UNSAT_SHAPES,
    ControllerProcess,
    ScaleCluster,
    Tracker,
    claim_body,
    cold_shape,
    create,
    delete,
    has_explanation,
    pod_body,
)
from e2e.bench.scale.rows import (
    Backlog,
    Curve,
    HistogramReading,
    Targets,
    api_writes,
    backlog_outcome,
    cold_selector_ms,
    expected_pods_per_s,
    explain_listing,
    fill_deadline_s,
    fill_pods,
    fleet_view_rows,
    histogram,
    log_problems,
    markdown_tables,
    mean_since,
    metric_value,
    rows,
    size_seconds,
    where_backlog_ran,
    writes_since,
)
from e2e.bench.sharedbed import BenchBed
from e2e.testbed import kwok as kwok_mod
from e2e.testbed.cluster import Cluster
from e2e.tooling import binaries, bytecode, gotools

SIZES = (500, 1000, 2000, 5000)
BUDGET_S = 28 * 60
SETTLE_S = 5.0  # for watch events to reach a running controller: it reads thousands a second
"""``make bench-scale`` must end within 30 minutes; a size whose estimate would overrun this is not
started, and the rows are extrapolated from the sizes that ran."""


@dataclass(frozen=True)
class Plan:
    sizes: tuple[int, ...] = SIZES
    mig_per: int = 10
    """One dynamic-MIG node per this many GPU nodes (0: none)."""
    claims_per_node: int = 4
    """Claims allocated per GPU node (20,000 at 5,000 nodes)."""
    scheduled_pods: int = 250
    """Of those, per size, at most how many go through the kube-scheduler (timed; all of them at the
    first size); the rest are written."""
    scheduled_least: int = 60
    scheduled_s: float = 60.0
    """Above the first size, the pods timed through the scheduler are about this many seconds of
    binding at the rate expected from the previous size, and at least ``scheduled_least``
    (``rows.fill_pods``): about 1 pod/s at 5,000 nodes."""
    plain_pods_per_node: int = 2
    backlog_per_node: float = 0.5
    """The backlog below the largest size, for the curve."""
    backlog_at_once: int = 10_000
    """The backlog row's size, at the largest size; when that size does not fit the budget, one more
    backlog of this size runs at the largest size that did."""
    fit_samples: int = 9
    explain_samples: int = 5
    startup_samples: int = 3
    apf_claims: int = 100
    backlog_window_s: float = 60.0
    backlog_wait_s: float = 75.0
    apf_wait_s: float = 180.0
    budget_s: float = BUDGET_S
    profile: bool = True
    at_once_sync_s: float = 90.0
    """For the budget: a fresh controller's sync before a backlog run of its own (36 s at 5,000 nodes)."""
    explain_all_samples: int = 3
    fleet_claims: int = 30_000
    """Claims allocated when the fleet views are timed: :meth:`ScaleCluster.hold_more` writes what
    the sizes left short (10,000 at 5,000 nodes, on the spare quarter of every plain node's GPUs)."""
    fleet_samples: int = 3
    """Runs of each fleet view (``kubectl dra get gpus -A``, ...); 0: the stage is not run."""
    fit_count: int = 1000
    settle_most_s: float = 120.0
    """How long, after the last claim was explained, the API server's count of writes may take to
    stand still: the pods' Events go out after the claims' explanations, one writer at the budget's
    pace (10,000 take about a minute); it returns as soon as the count stands still."""

    def mig_nodes(self, nodes: int) -> int:
        return nodes // self.mig_per if self.mig_per else 0

    def backlog(self, nodes: int) -> int:
        return self.backlog_at_once if nodes == self.sizes[-1] else min(int(self.backlog_per_node * nodes),
                                                                       self.backlog_at_once)

    def at_once_s(self) -> float:
        """For the budget, a backlog run of its own after the sizes: a fresh controller's sync, the
        pods created first (well over 100/s), the wait. Nothing is deleted after it."""
        return self.at_once_sync_s + self.backlog_at_once / 100 + self.backlog_wait_s

    def explained_backlog_s(self, backlog: Mapping[str, Any]) -> float:
        """For the budget, what follows the kept ``backlog`` (:func:`backlog_phase`'s document),
        read off its own run: ``explain -A`` runs (10 s each: twice the target), our annotations
        cleared (150 claims/s, below what the bench's writers reach on the slower machine), a fresh
        controller's sync and explaining as long as the backlog's took, and 15 s for the writes to
        settle and the Events to be listed. Fixed allowances for the sync and the wait were twice
        what the run needs and left it out on the slower machine (docs/scale.md)."""
        return (10 * self.explain_all_samples + int(backlog["claims"]) / 150 + float(backlog["synced_s"])
                + float(backlog["waited_s"]) + 15)

    def fleet_views_s(self, more_claims: int) -> float:
        """For the budget, the fleet views: the claims written (80/s, below the 106/s of the slower
        machine's 5,000-node run) and each view's runs (10 s each: three times the target)."""
        return more_claims / 80 + 10 * self.fleet_samples * len(FLEET_VIEWS)


FULL = Plan()
SMOKE = Plan(sizes=(250,), claims_per_node=2, scheduled_pods=100, plain_pods_per_node=1, backlog_at_once=100, fit_samples=5,
             explain_samples=3, startup_samples=1, apf_claims=60, backlog_wait_s=240.0, profile=False,
             explain_all_samples=1, fleet_samples=0)


# =========================================================================== measurements

def synced_sample(sc: ScaleCluster, label: str, timeout: float = 600) -> tuple[ControllerProcess, dict[str, Any]]:
    """A fresh controller, its VmRSS 2 s after its informers synced and its warm-up ended (the
    inventory and the DeviceClasses' groupings, built before its workers start), with the object
    counts it holds."""
    ctl = sc.controller(label)
    synced = ctl.wait_synced(timeout)
    ctl.wait_warm(timeout)
    time.sleep(2.0)
    mem = ctl.memory_mib()
    sample = {"devices": sc.devices, "claims": sc.claims, "pods": sc.pods, "plain_pods": sc.plain_pods,
              "nodes": sc.gpu_nodes,
              "slices": sc.slices, "rss_mib": round(mem["VmRSS"], 1), "hwm_mib": round(mem["VmHWM"], 1),
              "synced_s": round(synced, 2), "label": label, "process": label}
    sc.log(f"scale: fresh controller ({label}): synced {synced:.1f}s after spawn, RSS {mem['VmRSS']:.0f} MiB "
           f"({sc.devices} devices, {sc.claims} claims, {sc.pods} pods)")
    return ctl, sample


def later_sample(sc: ScaleCluster, ctl: ControllerProcess, first: dict[str, Any]) -> dict[str, Any]:
    """The VmRSS of ``ctl`` (sampled fresh as ``first``) again, once what changed since has reached
    its informers: not a fresh start, so kept out of the fit (``fresh``: False)."""
    time.sleep(SETTLE_S)
    mem = ctl.memory_mib()
    sample = {**first, "plain_pods": sc.plain_pods, "pods": sc.pods, "claims": sc.claims,
              "rss_mib": round(mem["VmRSS"], 1), "hwm_mib": round(mem["VmHWM"], 1),
              "label": f"{first['label']}-later", "fresh": False}
    sc.log(f"scale: the same controller ({first['label']}) {SETTLE_S:.0f}s after {sc.plain_pods - first['plain_pods']} "
           f"more plain pods: RSS {first['rss_mib']:.0f} -> {mem['VmRSS']:.0f} MiB")
    return sample


def _quiet(ctl: ControllerProcess, before: HistogramReading, deadline: float) -> HistogramReading:
    """The controller's resolve histogram once it has resolved something since ``before`` and its
    queue is empty and the count has held still for 0.3 s."""
    last: HistogramReading | None = None
    while time.monotonic() < deadline:
        text = ctl.metrics()
        now = histogram(text, RESOLVE_HISTOGRAM)
        if now.count > before.count and metric_value(text, QUEUE_DEPTH) == 0:
            if last is not None and last.count == now.count:
                return now
            last = now
            time.sleep(0.3)
            continue
        last = None
        time.sleep(0.01)
    raise TimeoutError(f"controller {ctl.label}: no resolve finished in time")


def probe(sc: ScaleCluster, ctl: ControllerProcess, name: str, spec: dict[str, Any], *, unsat: bool,
          timeout: float = 300) -> dict[str, Any]:
    """One pending claim for the controller alone; its resolve time and the RSS it moved."""
    create(sc.api, PODS, pod_body(name, claim=name, scheduler=NO_SCHEDULER), NS_PROBE)
    time.sleep(0.3)  # the pod's event reaches the controller before the claim exists: one evaluation
    before = ctl.resolves()
    ctl.reset_peak()
    mem0 = ctl.memory_mib()
    t0 = time.monotonic()
    create(sc.api, CLAIMS, claim_body(name, spec), NS_PROBE)
    deadline = t0 + timeout
    if unsat:
        wait_explained(sc, ctl, name, deadline, f"probe {name}: no explanation after {timeout:.0f}s", every=0.02)
    after = _quiet(ctl, before, deadline)
    seen_s = time.monotonic() - t0
    mem1 = ctl.memory_mib()
    sc.remove(NS_PROBE, [name])
    latency = mean_since(before, after)
    return {"latency_s": latency, "sum_s": after.sum - before.sum, "evaluations": after.count - before.count,
            "seen_s": round(seen_s, 3),
            "rss_before_mib": round(mem0["VmRSS"], 1), "rss_after_mib": round(mem1["VmRSS"], 1),
            "peak_growth_mib": round(mem1["VmHWM"] - mem0["VmRSS"], 1),
            "rss_growth_mib": round(mem1["VmRSS"] - mem0["VmRSS"], 1)}


def wait_explained(sc: ScaleCluster, ctl: ControllerProcess, name: str, deadline: float, late: str, *,
                   every: float) -> None:
    """Until the probe claim ``name`` carries its explanation; TimeoutError ``late`` after
    ``deadline`` (monotonic), the controller's own error if it exits."""
    while not sc.has_explanation(NS_PROBE, name):
        ctl.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(late)
        time.sleep(every)


def py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


@contextlib.contextmanager
def profiled(pid: int, out: Path, enabled: bool) -> Iterator[None]:
    spy = py_spy() if enabled else None
    if spy is None:
        yield
        return
    proc = subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", "100", "--format", "raw", "--output",
                             str(out), "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def profile_breakdown(stacks: Iterable[str], top: int = 15) -> dict[str, Any]:
    """Share of the controller's busy samples (its worker, in ``Controller.process``) per function
    of ours, inclusive: where a claim's time goes."""
    busy = 0
    per: dict[str, int] = {}
    for line in stacks:
        frames, _, count_text = line.rpartition(" ")
        if "Controller.process " not in frames and "Controller.process (" not in frames:
            continue
        try:
            count = int(count_text)
        except ValueError:
            continue
        busy += count
        names = {f.strip().rsplit(":", 1)[0] + ")" for f in frames.split(";") if "dra_driver/" in f}
        for fn in names:
            per[fn] = per.get(fn, 0) + count
    ranked = sorted(per.items(), key=lambda kv: -kv[1])[:top]
    return {"busy_samples": busy, "inclusive_percent": {k: round(100 * v / busy, 1) for k, v in ranked} if busy else {}}


@dataclass
class SizeRun:
    nodes: int
    mig_nodes: int = 0
    devices: int = 0
    slices: int = 0
    grow: dict[str, Any] = field(default_factory=dict)
    held: dict[str, Any] = field(default_factory=dict)
    fill: dict[str, Any] = field(default_factory=dict)
    plain: dict[str, Any] = field(default_factory=dict)
    rss_samples: list[dict[str, Any]] = field(default_factory=list)
    first_claim: dict[str, Any] = field(default_factory=dict)
    first_unsat: dict[str, Any] = field(default_factory=dict)
    fit_probes: list[dict[str, Any]] = field(default_factory=list)
    explain_probes: list[dict[str, Any]] = field(default_factory=list)
    cold_probe: dict[str, Any] = field(default_factory=dict)
    backlog: dict[str, Any] = field(default_factory=dict)
    startup: dict[str, Any] = field(default_factory=dict)
    controller_problems: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _p50_ms(probes: list[dict[str, Any]]) -> float | None:
    vals = [p["latency_s"] * 1000 for p in probes if p.get("latency_s") is not None]
    return round(percentile(vals, 50), 3) if vals else None


def run_size(sc: ScaleCluster, plan: Plan, out: SizeRun, previous: SizeRun | None, workdir: Path) -> list[str]:
    """One size of the curve on the growing cluster, recorded in ``out`` as it goes (so that a size
    that fails keeps what it measured, its first RSS sample above all); returns py-spy's stacks
    when profiled. Every controller it starts is stopped by the time it returns."""
    t_size = time.monotonic()
    nodes = out.nodes
    out.grow = sc.grow(nodes)
    out.mig_nodes, out.devices, out.slices = sc.mig_nodes, sc.devices, sc.slices
    problems = out.controller_problems

    def retire(ctl: ControllerProcess) -> None:
        ctl.stop()
        problems.extend(log_problems(ctl.log_lines()))

    ctl, sample = synced_sample(sc, f"{nodes}-nodes")
    out.rss_samples.append(sample)
    # Each side is timed while the other is idle: on two cores, running both would time the
    # contention, and our controller's CPU would slow the scheduler down to our advantage.
    retire(ctl)
    expected = expected_pods_per_s((previous.nodes, previous.fill["pods_per_s"]) if previous else None, nodes)
    pods = fill_pods(expected, most=plan.scheduled_pods, least=plan.scheduled_least, seconds=plan.scheduled_s)
    deadline = fill_deadline_s(pods, expected)
    scheduled = sc.fill_pods + pods
    out.held = sc.hold(nodes * plan.claims_per_node - scheduled)
    out.fill = {**sc.fill(scheduled, deadline),
                "expected_pods_per_s": round(expected, 2) if expected else None, "deadline_s": round(deadline)}
    ctl, sample = synced_sample(sc, f"{nodes}-filled")
    out.rss_samples.append(sample)
    out.plain = sc.add_plain_pods(nodes * plan.plain_pods_per_node)
    out.rss_samples.append(later_sample(sc, ctl, sample))
    retire(ctl)
    ctl, sample = synced_sample(sc, f"{nodes}-pods")
    out.rss_samples.append(sample)

    stacks: list[str] = []
    profile_file = workdir / f"profile-{nodes}.txt"
    with profiled(ctl.pid, profile_file, plan.profile and nodes == plan.sizes[-1]):
        first = probe(sc, ctl, f"first-{nodes}", FIT_SHAPES["any-gpu"], unsat=False)
        out.first_claim = {**first, "cache_mib": first["rss_growth_mib"]}
        sc.log(f"scale: first claim {first['latency_s'] * 1000 if first['latency_s'] else float('nan'):.0f} ms, "
               f"RSS +{first['rss_growth_mib']:.0f} MiB (peak +{first['peak_growth_mib']:.0f})")
        # Before any other selector: the process has evaluated none but its DeviceClasses'.
        out.cold_probe = probe(sc, ctl, f"cold-{nodes}", cold_shape(nodes), unsat=True)
        sc.log(f"scale: a claim with a new selector: {cold_selector_ms(out.cold_probe) or float('nan'):.0f} ms "
               f"({out.cold_probe['evaluations']:.0f} evaluation(s))")
        fit_names = list(FIT_SHAPES)
        for i in range(plan.fit_samples):
            out.fit_probes.append(probe(sc, ctl, f"fit-{nodes}-{i}", FIT_SHAPES[fit_names[i % len(fit_names)]],
                                        unsat=False))
        unsat_names = list(UNSAT_SHAPES)
        for i in range(plan.explain_samples):
            out.explain_probes.append(probe(sc, ctl, f"unsat-{nodes}-{i}", UNSAT_SHAPES[unsat_names[i % len(unsat_names)]],
                                            unsat=True))
    if profile_file.exists():
        stacks = profile_file.read_text(errors="replace").splitlines()
    sc.log(f"scale: fitting claim p50 {_p50_ms(out.fit_probes)} ms, unsatisfiable p50 {_p50_ms(out.explain_probes)} ms")
    retire(ctl)

    ctl, _ = synced_sample(sc, f"{nodes}-unsat-first")
    out.first_unsat = probe(sc, ctl, f"first-unsat-{nodes}", UNSAT_SHAPES["memory-1ti"], unsat=True)
    sc.log(f"scale: an unsatisfiable first claim: peak RSS +{out.first_unsat['peak_growth_mib']:.0f} MiB "
           f"(the fitting one: +{out.first_claim['peak_growth_mib']:.0f})")
    retire(ctl)

    out.startup = startup_phase(sc, nodes, plan.startup_samples, retire)

    # The backlog last: at the last planned size nothing follows it, and deleting 10,000 claims and
    # their pods would take minutes.
    last = nodes == plan.sizes[-1]
    out.backlog = backlog_phase(sc, plan, plan.backlog(nodes), f"{nodes}", remove=not last)
    problems.extend(out.backlog["problems"])
    out.seconds = round(time.monotonic() - t_size, 1)
    return stacks


def startup_phase(sc: ScaleCluster, nodes: int, samples: int, retire: Callable[[ControllerProcess], None]) -> dict[str, Any]:
    """``samples`` fresh processes in turn, each with one pending claim of its own waiting for it;
    the medians, and every sample."""
    taken = []
    for i in range(samples):
        name = f"startup-{nodes}-{i}"
        create(sc.api, PODS, pod_body(name, claim=name, scheduler=NO_SCHEDULER), NS_PROBE)
        create(sc.api, CLAIMS, claim_body(name, UNSAT_SHAPES["memory-1ti"]), NS_PROBE)
        ctl = sc.controller(f"{nodes}-startup-{i}")
        synced = ctl.wait_synced(600)
        wait_explained(sc, ctl, name, time.monotonic() + 600,
                       f"startup at {nodes} nodes: the pending claim was not explained in 600 s", every=0.05)
        explained = time.monotonic() - ctl.spawned
        retire(ctl)
        sc.remove(NS_PROBE, [name])
        taken.append({"synced_s": round(synced, 2), "explained_s": round(explained, 2)})
        sc.log(f"scale: startup {i + 1} of {samples}: informers synced {synced:.1f}s, first pending claim explained "
               f"{explained:.1f}s after spawn")
    return {"synced_s": statistics.median(t["synced_s"] for t in taken),
            "explained_s": statistics.median(t["explained_s"] for t in taken), "samples": taken}


def backlog_names(label: str, claims: int) -> list[str]:
    return [f"backlog-{label}-{i}" for i in range(claims)]


def settled_writes(sc: ScaleCluster, before: dict[str, float], most_s: float, quiet_s: float = 3.0) -> dict[str, int]:
    """The API server's count of explaining writes since ``before`` (``rows.api_writes``),
    read once it has stood still for ``quiet_s`` (the Events about a claim go out after its
    annotations), or ``most_s`` on."""
    deadline = time.monotonic() + most_s
    last = api_writes(sc.apiserver_metrics())
    still = time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - still < quiet_s:
        time.sleep(1.0)
        now = api_writes(sc.apiserver_metrics())
        if now != last:
            last, still = now, time.monotonic()
    return writes_since(before, last)


def backlog_phase(sc: ScaleCluster, plan: Plan, claims: int, label: str, *, remove: bool = True) -> dict[str, Any]:
    """``claims`` pending claims created at once, then a fresh controller: the time from its
    informers' sync until every claim carries its explanation, and the writes to claims and Events
    the API server counted from its spawn until they stood still (the bench writes neither then).

    The claims are created while no controller runs (the caller has stopped its own): on this machine
    creating 10,000 claims (and their pods) takes about a minute by itself, the API server and the
    bench's writers sharing two cores, so a backlog timed from the first create would time the
    bench. The creation time is recorded beside it, and so is spawn -> all explained. The fresh
    controller is stopped at the end; with ``remove``, the claims and their pods are then deleted
    (after the stop, or the controller would re-examine every claim on every deletion)."""
    names = backlog_names(label, claims)
    t_create = time.monotonic()
    sc.pending(NS_BACKLOG, names, UNSAT_SHAPES)
    created = time.monotonic() - t_create
    tracker = Tracker(sc.api, CLAIMS, NS_BACKLOG, has_explanation)
    before = api_writes(sc.apiserver_metrics())
    fresh = sc.controller(f"{label}-backlog")
    try:
        synced = fresh.wait_synced(600)
        t0 = fresh.spawned + synced
        tracker.wait(claims, t0 + plan.backlog_wait_s)
        waited = time.monotonic() - t0
        evaluations = fresh.resolves().count
        outcome: Backlog = backlog_outcome(claims, t0, [tracker.hits[n] for n in names if n in tracker.hits],
                                           plan.backlog_window_s, waited)
        writes = settled_writes(sc, before, plan.settle_most_s)
    finally:
        tracker.stop()
        fresh.stop()
    doc = {**asdict(outcome), "label": label, "reporter": fresh.identity, "writes": writes,
           "create_s": round(created, 2), "synced_s": round(synced, 2),
           "spawn_to_all_explained_s": round(synced + outcome.all_explained_s, 2) if outcome.all_explained_s else None,
           "waited_s": round(waited, 1), "evaluations": evaluations,
           "evaluations_per_s": round(evaluations / waited, 2) if waited else None,
           "problems": log_problems(fresh.log_lines())}
    sc.log(f"scale: backlog of {claims} (created in {created:.1f}s with no controller running): {outcome.explained} "
           f"explained ({outcome.within_window} within {outcome.window_s:.0f}s of a fresh controller's sync at "
           f"{synced:.1f}s), {outcome.claims_per_s:.1f} claims/s; {sum(writes.values())} writes to claims and Events")
    if remove:
        sc.remove(NS_BACKLOG, names)
    return doc


def explained_backlog_phase(sc: ScaleCluster, plan: Plan, on: dict[str, Any], elapsed: float) -> dict[str, Any] | None:
    """What the backlog kept at the end (``on``, :func:`backlog_phase`'s document) shows once
    explained: ``explain -A`` over it, then the same claims explained afresh by a controller with pod
    Events off, whose writes the API server counts as it counted the first run's. None when the
    budget has no room for it.

    The second run takes the same claims and pods, our annotations cleared (10,000 patches), rather
    than a second backlog: creating one takes this machine one to two minutes (20,000 objects),
    the comparison is then between the same objects, and the cluster still holds the one backlog
    ``explain -A`` was timed on. Its Events are new objects: an Event's name includes the
    controller's identity (``reportingInstance``), and each run's controller has its own."""
    if elapsed + plan.explained_backlog_s(on) > plan.budget_s:
        sc.log("scale: no time left for explain -A and the run without pod Events")
        return None
    doc: dict[str, Any] = {"nodes": sc.gpu_nodes, "claims": on["claims"], "failed": {}}
    try:
        doc["explain_all"] = explain_all(sc, plan.explain_all_samples)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        doc["failed"]["explain_all"] = str(exc)
        sc.log(f"scale: explain -A failed: {exc}")
    try:
        off = pod_events_off_phase(sc, plan, backlog_names(on["label"], on["claims"]), on["label"])
        told = sc.events_by_reporter(NS_BACKLOG)
    except (RuntimeError, TimeoutError, ApiError) as exc:
        doc["failed"]["pod_events_off"] = str(exc)
        sc.log(f"scale: the run without pod Events failed: {exc}")
        return doc
    doc["on"] = {k: on[k] for k in ("claims", "explained", "writes")} | {"told": told.get(on["reporter"], {})}
    doc["off"] = {**off, "told": told.get(off["reporter"], {})}
    return doc


def explain_all(sc: ScaleCluster, samples: int) -> dict[str, Any]:
    """``python -m dra_driver explain -A`` as a user runs it, ``samples`` times: each from process
    start to exit, with the CPU the process itself used (the rest of the time is the API server's
    and the wire's), and what the last one listed."""
    cmd = [sys.executable, "-m", "dra_driver", "explain", "-A", f"--kubeconfig={sc.cluster.kubeconfig}"]
    taken: list[float] = []
    cpu: list[float] = []
    stdout = ""
    for _ in range(samples):
        t0, c0 = time.monotonic(), _children_cpu_s()
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
        taken.append(round(time.monotonic() - t0, 2))
        cpu.append(round(_children_cpu_s() - c0, 2))
        if done.returncode != 0:
            raise RuntimeError(f"explain -A exited with {done.returncode}: {done.stderr.strip()[-500:]}")
        stdout = done.stdout
    try:
        listing = explain_listing(stdout)
    except ValueError as exc:
        raise RuntimeError(f"explain -A: {exc}") from None
    doc = {"seconds": statistics.median(taken), "samples": taken, "cpu_s": cpu, **listing,
           "stdout_bytes": len(stdout.encode())}
    sc.log(f"scale: explain -A listed {listing['pending']} pending claims in {listing['reasons']} reason(s) in "
           f"{', '.join(f'{t:.2f}' for t in taken)} s (its own CPU: {', '.join(f'{t:.2f}' for t in cpu)} s)")
    return doc


FLEET_VIEWS: dict[str, tuple[str, ...]] = {
    "get gpus -A": ("get", "gpus", "-A"),
    "get nodes": ("get", "nodes"),
    "top": ("top",),
    "fit --count 1000": ("fit", "--template", f"{NS_FILL}/any-gpu", "--count", "1000"),
}
"""The fleet views (issue 54) as a person runs them; ``fit`` of the one-GPU template the fill's
pods use (``--count`` is :attr:`Plan.fit_count`)."""


def fleet_views_phase(sc: ScaleCluster, plan: Plan, elapsed: float) -> dict[str, Any] | None:
    """The fleet views on the cluster as it is, once :attr:`Plan.fleet_claims` claims are allocated:
    each view ``plan.fleet_samples`` times from process start to exit, with its own CPU and peak
    RSS. None when the stage is off or the budget has no room for it."""
    more = max(0, plan.fleet_claims - sc.claims)
    if not plan.fleet_samples:
        return None
    if elapsed + plan.fleet_views_s(more) > plan.budget_s:
        sc.log("scale: no time left for the fleet views")
        return None
    doc: dict[str, Any] = {"nodes": sc.gpu_nodes, "mig_nodes": sc.mig_nodes, "devices": sc.devices, "failed": {}}
    if more:
        doc["written"] = sc.hold_more(more)
    doc |= {"claims_allocated": sc.claims, "pods": sc.pods, "views": {}}
    for name, argv in FLEET_VIEWS.items():
        if name.startswith("fit"):
            argv = (*argv[:-1], str(plan.fit_count))
        try:
            doc["views"][name] = fleet_view(sc, argv, plan.fleet_samples)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            doc["failed"][name] = str(exc)
            sc.log(f"scale: kubectl dra {name} failed: {exc}")
    return doc


def fleet_view(sc: ScaleCluster, argv: tuple[str, ...], samples: int) -> dict[str, Any]:
    """``python -m dra_driver ARGV`` (what ``kubectl dra`` runs), ``samples`` times: each from
    process start to exit, its own CPU (the kernel's account of that one child, :func:`os.wait4`),
    its peak RSS (its VmHWM, read while it runs: wait4's ``ru_maxrss`` of a child starts from the
    RSS of the process it was forked from, the bench's own 1.4 GiB), and what the last one printed."""
    cmd = [sys.executable, "-m", "dra_driver", *argv, f"--kubeconfig={sc.cluster.kubeconfig}"]
    taken: list[float] = []
    cpu: list[float] = []
    peak: list[float] = []
    stdout = ""
    for _ in range(samples):
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            t0 = time.monotonic()
            proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=err)
            try:
                status, usage, hwm = _wait4(proc.pid, 300)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise
            proc.returncode = os.waitstatus_to_exitcode(status)
            taken.append(round(time.monotonic() - t0, 2))
            cpu.append(round(usage.ru_utime + usage.ru_stime, 2))
            peak.append(round(hwm, 1))
            out.seek(0)
            err.seek(0)
            stdout = out.read().decode(errors="replace")
            if proc.returncode != 0:
                raise RuntimeError(f"{' '.join(argv)} exited with {proc.returncode}: "
                                   f"{err.read().decode(errors='replace').strip()[-500:]}")
    lines = stdout.splitlines()
    doc = {"seconds": statistics.median(taken), "samples": taken, "cpu_s": cpu, "peak_rss_mib": max(peak),
           "peak_rss_samples_mib": peak, "lines": len(lines), "first_line": lines[0][:200] if lines else "",
           "stdout_bytes": len(stdout.encode())}
    sc.log(f"scale: kubectl dra {' '.join(argv)}: {', '.join(f'{t:.2f}' for t in taken)} s (its own CPU: "
           f"{', '.join(f'{t:.2f}' for t in cpu)} s), peak RSS {max(peak):.0f} MiB, {len(lines)} lines")
    return doc


def _wait4(pid: int, timeout: float) -> tuple[int, resource.struct_rusage, float]:
    """:func:`os.wait4` of ``pid``, polling every 20 ms: its status, its rusage and the highest
    VmHWM (MiB) read from ``/proc/<pid>/status`` meanwhile; TimeoutExpired after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    hwm = 0.0
    while True:
        hwm = max(hwm, _hwm_mib(pid))
        found, status, usage = os.wait4(pid, os.WNOHANG)
        if found == pid:
            return status, usage, hwm
        if time.monotonic() > deadline:
            raise subprocess.TimeoutExpired([str(pid)], timeout)
        time.sleep(0.02)


def _hwm_mib(pid: int) -> float:
    """The process's VmHWM in MiB; 0 once it has exited (a zombie has no memory to report)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return 0.0


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def pod_events_off_phase(sc: ScaleCluster, plan: Plan, names: list[str], label: str) -> dict[str, Any]:
    """The claims ``names`` of the backlog, our annotations cleared, explained again by a fresh
    controller with ``--no-pod-events``: the writes the API server counted from its spawn until
    they stood still, as :func:`backlog_phase` counts them."""
    t0 = time.monotonic()
    sc.clear_explanations(NS_BACKLOG, names)
    cleared = time.monotonic() - t0
    tracker = Tracker(sc.api, CLAIMS, NS_BACKLOG, has_explanation)
    left = tracker.count()
    before = api_writes(sc.apiserver_metrics())
    ctl = sc.controller(f"{label}-no-pod-events", "--no-pod-events")
    try:
        synced = ctl.wait_synced(600)
        t_sync = ctl.spawned + synced
        tracker.wait(len(names), t_sync + plan.backlog_wait_s)
        took = time.monotonic() - t_sync
        explained = tracker.count()
        writes = settled_writes(sc, before, plan.settle_most_s)
    finally:
        tracker.stop()
        ctl.stop()
    sc.log(f"scale: without pod Events: {explained} of {len(names)} explained again {took:.1f}s after the sync "
           f"(our annotations cleared in {cleared:.1f}s); {sum(writes.values())} writes to claims and Events")
    return {"claims": len(names), "explained": explained, "explained_before_it": left, "clear_s": round(cleared, 1),
            "synced_s": round(synced, 2), "seconds": round(took, 1), "writes": writes, "reporter": ctl.identity,
            "problems": log_problems(ctl.log_lines())}


APF_OBJECTS: list[tuple[Resource, Obj]] = [
    (PRIORITY_LEVELS, {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration",
        "metadata": {"name": APF_NAME},
        "spec": {"type": "Limited", "limited": {"nominalConcurrencyShares": 1, "lendablePercent": 0,
                                                "borrowingLimitPercent": 0, "limitResponse": {"type": "Reject"}}}}),
    (FLOWSCHEMAS, {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema", "metadata": {"name": APF_NAME},
        "spec": {"priorityLevelConfiguration": {"name": APF_NAME}, "matchingPrecedence": 500,
                 "distinguisherMethod": {"type": "ByUser"},
                 "rules": [{"subjects": [{"kind": "User", "user": {"name": CONTROLLER_USER}}],
                            "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                               "clusterScope": True, "namespaces": ["*"]}],
                            "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}]}}),
]


class Noise:
    """Other requests in the controller's flow while it works (GETs from a few threads, each pausing
    between requests), so its writes meet 429s too, not only its start-up LISTs. Counts the 429s it
    gets itself, which the API server counts in the same flow. Plain HTTP, no retries: a client
    that honoured 429 would hide them from this count."""

    def __init__(self, cluster: Cluster, user: str, namespace: str, threads: int = 3, pause_s: float = 0.005) -> None:
        self.url = f"{cluster.server}/api/v1/namespaces/{namespace}/serviceaccounts/default"
        self.headers = {"Authorization": f"Bearer {cluster.user_tokens[user]}"}
        self.context = ssl.create_default_context(cafile=str(cluster.pki / "ca.crt"))
        self.pause_s = pause_s
        self.rejected = 0
        self.requests = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True, name=f"noise-{i}") for i in range(threads)]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            rejected = 0
            try:
                req = urllib.request.Request(self.url, headers=self.headers)
                with urllib.request.urlopen(req, context=self.context, timeout=30) as resp:
                    resp.read()
            except urllib.error.HTTPError as exc:
                rejected = int(exc.code == 429)
            except (urllib.error.URLError, OSError):
                pass
            with self._lock:
                self.requests += 1
                self.rejected += rejected
            self._stop.wait(self.pause_s)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)


def apf_phase(sc: ScaleCluster, plan: Plan) -> dict[str, Any]:
    """A fresh controller under a tiny APF priority level explains a batch of pending claims."""
    for res, body in APF_OBJECTS:
        create(sc.api, res, body)
    deadline = time.monotonic() + 60
    while not metric_value(sc.apiserver_metrics(), "apiserver_flowcontrol_nominal_limit_seats",
                           {"priority_level": APF_NAME}):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the API server did not take up PriorityLevelConfiguration {APF_NAME}")
        time.sleep(0.5)
    rejected_before = metric_value(sc.apiserver_metrics(), "apiserver_flowcontrol_rejected_requests_total",
                                   {"flow_schema": APF_NAME})
    names = [f"apf-{i}" for i in range(plan.apf_claims)]
    tracker = Tracker(sc.api, CLAIMS, NS_APF, has_explanation)
    ctl = sc.controller("apf")
    noise: Noise | None = None
    try:
        ctl.wait_synced(plan.apf_wait_s)
        noise = Noise(sc.cluster, CONTROLLER_USER, NS_APF)
        t0 = sc.pending(NS_APF, names, UNSAT_SHAPES)
        tracker.wait(len(names), t0 + plan.apf_wait_s)
        took = time.monotonic() - t0
        explained = tracker.count()
    finally:
        tracker.stop()
        if noise is not None:
            noise.stop()
    ctl.stop()
    text = sc.apiserver_metrics()
    rejected = metric_value(text, "apiserver_flowcontrol_rejected_requests_total", {"flow_schema": APF_NAME})
    seats = metric_value(text, "apiserver_flowcontrol_nominal_limit_seats", {"priority_level": APF_NAME})
    problems = log_problems(ctl.log_lines())
    for res, body in reversed(APF_OBJECTS):
        delete(sc.api, res, body["metadata"]["name"])
    sc.remove(NS_APF, names)
    doc = {"claims": len(names), "explained": explained, "seconds": round(took, 1),
           "rejected": rejected - rejected_before - noise.rejected, "nominal_seats": seats,
           "noise": {"requests": noise.requests, "rejected": noise.rejected},
           "problems": problems[:20], "problem_lines": len(problems)}
    sc.log(f"scale: APF: {explained} of {len(names)} explained in {took:.0f}s; the API server answered "
           f"{doc['rejected']:.0f} 429s to the controller's flow ({seats:.0f} seats); {len(problems)} problem lines logged")
    return doc


# =========================================================================== the whole run

def fits(next_nodes: int, elapsed: float, ran: list[SizeRun], budget: float) -> bool:
    """Whether the next size is expected to end within the budget (``rows.size_seconds``)."""
    estimate = size_seconds(next_nodes, [(r.nodes, r.seconds) for r in ran])
    return estimate is None or elapsed + estimate <= budget


def curve_of(runs: list[SizeRun], more_rss_samples: Iterable[dict[str, Any]] = ()) -> Curve:
    """The sizes' measurements as series; ``more_rss_samples``: those of a size that failed later."""
    c = Curve()
    for r in runs:
        n = float(r.nodes)
        fc = r.first_claim
        if fc.get("latency_s") is not None:
            c.first_claim_s.append((n, fc["latency_s"]))
            c.first_claim_cache_mib.append((n, fc["cache_mib"]))
        if (v := _p50_ms(r.fit_probes)) is not None:
            c.fit_p50_ms.append((n, v))
        if (v := _p50_ms(r.explain_probes)) is not None:
            c.explain_p50_ms.append((n, v))
        if r.first_unsat and fc:
            c.explain_extra_mib.append((n, r.first_unsat["peak_growth_mib"] - fc["peak_growth_mib"]))
        if (v := cold_selector_ms(r.cold_probe)) is not None:
            c.cold_selector_ms.append((n, v))
        if r.startup:
            c.startup_s.append((n, r.startup["explained_s"]))
        c.devices.append((n, float(r.devices)))
    for s in [x for r in runs for x in r.rss_samples] + list(more_rss_samples):
        # Samples written before they carried plain_pods: every claim is held by one pod.
        plain = s.get("plain_pods", s["pods"] - s["claims"])
        sample: dict[str, Any] = {"devices": float(s["devices"]), "claims": float(s["claims"]),
                                  "plain_pods": float(plain), "rss_mib": float(s["rss_mib"])}
        if "process" in s:
            sample["process"], sample["fresh"] = s["process"], s.get("fresh", True)
        c.rss_samples.append(sample)
    return c


def run_curve(plan: Plan, workdir: Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every size of ``plan`` that fits the budget; the measurements as a document."""
    started = time.monotonic()
    binaries.ensure()
    gotools.ensure([kwok_mod.TOOL])
    bytecode.shipped_python()
    sc = ScaleCluster(workdir, plan.mig_per, log)
    runs: list[SizeRun] = []
    apf: dict[str, Any] | None = None
    skipped: list[int] = []
    failed: dict[str, str] = {}
    failed_runs: list[SizeRun] = []
    stacks: list[str] = []
    at_once: dict[str, Any] | None = None
    at_once_failed: str | None = None
    explained: dict[str, Any] | None = None
    views: dict[str, Any] | None = None
    try:
        sc.start()
        for nodes in plan.sizes:
            if not fits(nodes, time.monotonic() - started, runs, plan.budget_s):
                skipped.append(nodes)
                log(f"scale: {nodes} nodes would not end within the {plan.budget_s / 60:.0f}-minute budget; "
                    "extrapolating from the sizes that ran")
                continue
            run = SizeRun(nodes)
            try:
                size_stacks = run_size(sc, plan, run, runs[-1] if runs else None, workdir)
            except (RuntimeError, TimeoutError) as exc:
                if not runs:
                    raise
                # The sizes that ran are still a curve: keep them, and what this one measured before it
                # failed (its RSS samples join the fit); say which size failed and why, and measure no
                # further size on a cluster that is now larger than the last size recorded.
                failed[str(nodes)] = str(exc)
                run.controller_problems += log_problems(sc.stop_controllers())
                failed_runs.append(run)
                log(f"scale: {nodes} nodes failed ({exc}); the rows come from the sizes that ran")
                break
            runs.append(run)
            stacks = size_stacks or stacks
            sc.check_alive()
            if apf is None:
                apf = apf_phase(sc, plan)
        if runs and runs[-1].backlog["claims"] < plan.backlog_at_once:
            try:
                at_once = at_once_phase(sc, plan, runs[-1], failed_runs[-1].nodes if failed_runs else None,
                                        time.monotonic() - started)
            except (RuntimeError, TimeoutError) as exc:
                # The curve is measured: the row is then projected from the largest size's backlog.
                at_once_failed = str(exc)
                log(f"scale: the backlog of {plan.backlog_at_once} failed ({exc}); its row is projected")
                runs[-1].controller_problems += log_problems(sc.stop_controllers())
        kept = at_once or (runs[-1].backlog if runs and runs[-1].nodes == plan.sizes[-1] else None)
        if kept is not None:
            explained = explained_backlog_phase(sc, plan, kept, time.monotonic() - started)
            if explained and explained.get("off"):
                runs[-1].controller_problems += explained["off"]["problems"]
        if runs:
            views = _fleet_views_or_failure(sc, plan, time.monotonic() - started)
    finally:
        sc.close()
    return {"runs": [asdict(r) for r in runs], "apf": apf, "skipped_sizes": skipped, "failed_sizes": failed,
            "failed_runs": [asdict(r) for r in failed_runs], "stacks": stacks,
            "backlog_at_once": at_once or (runs[-1].backlog if runs else None), "backlog_at_once_failed": at_once_failed,
            "explained_backlog": explained, "fleet_views": views, "seconds": round(time.monotonic() - started, 1)}


def _fleet_views_or_failure(sc: ScaleCluster, plan: Plan, elapsed: float) -> dict[str, Any] | None:
    try:
        return fleet_views_phase(sc, plan, elapsed)
    except (RuntimeError, TimeoutError, ApiError) as exc:  # the curve is measured: say so, keep it
        sc.log(f"scale: the fleet views failed: {exc}")
        return {"failed": {"fleet views": str(exc)}, "views": {}}


def run_fleet_views(plan: Plan, workdir: Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The fleet views' stage alone (``--fleet-views-only``): the cluster grown to the largest size
    at once, its claims allocated by writing (none through the scheduler), then the views."""
    started = time.monotonic()
    binaries.ensure()
    gotools.ensure([kwok_mod.TOOL])
    bytecode.shipped_python()
    sc = ScaleCluster(workdir, plan.mig_per, log)
    try:
        sc.start()
        grown = sc.grow(plan.sizes[-1])
        held = sc.hold(min(plan.fleet_claims, len(sc.writable)))
        plan = Plan(**{**asdict(plan), "budget_s": float("inf")})
        views = fleet_views_phase(sc, plan, 0.0) or {"failed": {"fleet views": "not run"}, "views": {}}
    finally:
        sc.close()
    return {"fleet_views": views, "grow": grown, "held": held, "seconds": round(time.monotonic() - started, 1)}


def fleet_result_of(doc: dict[str, Any], plan: Plan) -> Result:
    """``scale-fleet.json``: the fleet views' rows, measured on their own (``--fleet-views-only``)."""
    views = doc["fleet_views"]
    result = Result("scale-fleet", "Scale: the fleet views (kubectl dra get gpus, get nodes, top, fit) on kwok nodes", {
        "nodes": plan.sizes[-1], "mig_per": plan.mig_per, "fleet_claims": plan.fleet_claims,
        "samples": plan.fleet_samples, "fit_count": plan.fit_count, "kubernetes": binaries.kubernetes_version(),
        "kwok": gotools.TOOLS[kwok_mod.TOOL].version(), "apiserver": list(APISERVER_ARGS),
        "how": "the cluster grown to its size at once and every claim allocated by writing (none through the "
               "scheduler); each view from process start to exit"})
    result.started = time.time() - float(doc["seconds"])  # the run's start, for its date and duration
    result.figures.update({"fleet_views": views, "grow": doc.get("grow"), "held": doc.get("held"),
                           "run_seconds": doc["seconds"]})
    for row in fleet_view_rows(views, Targets(nodes=plan.sizes[-1])) if views.get("views") else []:
        result.target(f"{row.what} [{row.basis}]", row.value, row.limit, row.unit)
    for part, why in (views.get("failed") or {}).items():
        result.notes.append(f"{part}: failed: {why[:300]}")
    return result


def at_once_phase(sc: ScaleCluster, plan: Plan, largest: SizeRun, failed_size: int | None,
                  elapsed: float) -> dict[str, Any] | None:
    """The backlog row's run when the largest planned size did not run: ``backlog_at_once`` claims
    for a fresh controller on the cluster as it is, that of the largest size run, or larger when a
    later size failed (more nodes and claims: the conservative reading). None when the budget has
    no room left for it: the row is then projected from the largest size's own backlog."""
    label = f"{largest.nodes}-at-once"
    if elapsed + plan.at_once_s() > plan.budget_s:
        sc.log(f"scale: no time left for a backlog of {plan.backlog_at_once}; the row is projected from the "
               f"{largest.nodes}-node size's backlog of {largest.backlog['claims']}")
        return None
    doc = backlog_phase(sc, plan, plan.backlog_at_once, label, remove=False)
    largest.controller_problems += doc["problems"]
    # The cluster's counts are the bench's own: after a failed step they leave out what that step
    # had created, hence "at least" in the row's basis.
    return {**doc, "nodes": largest.nodes, "after_failed_size": failed_size,
            "cluster": {"nodes": sc.gpu_nodes, "devices": sc.devices, "claims": sc.claims, "pods": sc.pods}}


def result_of(doc: dict[str, Any], plan: Plan) -> Result:
    runs = [SizeRun(**r) for r in doc["runs"]]
    largest = runs[-1]
    targets = Targets(backlog=plan.backlog_at_once)
    at_once = doc["backlog_at_once"]
    backlog = Backlog(**{k: at_once[k] for k in ("claims", "explained", "within_window", "window_s",
                                                 "all_explained_s", "claims_per_s")})
    throughput = (at_once["claims_per_s"], largest.fill["pods_per_s"], largest.nodes)
    failed_samples = [s for r in doc.get("failed_runs", []) for s in r["rss_samples"]]
    explained = doc.get("explained_backlog")
    row_list, fit_figures = rows(curve_of(runs, failed_samples), targets, throughput=throughput, backlog=backlog,
                                 apf=doc["apf"], backlog_where=where_backlog_ran(
                                     at_once, largest.nodes, plan.backlog_at_once, doc.get("backlog_at_once_failed")),
                                 explained_backlog=explained,
                                 fleet_views=doc.get("fleet_views") if (doc.get("fleet_views") or {}).get("views")
                                 else None)
    result = Result("scale", "Scale: our controller beside the kube-scheduler on kwok nodes", {
        "sizes_planned": list(plan.sizes), "sizes_run": [r.nodes for r in runs], "sizes_skipped": doc["skipped_sizes"],
        "sizes_failed": doc.get("failed_sizes", {}),
        "plan": asdict(plan), "kubernetes": binaries.kubernetes_version(),
        "kwok": gotools.TOOLS[kwok_mod.TOOL].version(), "kwok_lease_seconds": kwok_mod.LEASE_SECONDS,
        "control_plane_client_limits": list(CONTROL_PLANE_QPS), "apiserver": list(APISERVER_ARGS),
        "controller": "python -OO -m dra_driver controller (leader election, informers, queue, writes), "
                      f"user {CONTROLLER_USER} (cluster-admin binding, subject to APF)",
        "fit_shapes": list(FIT_SHAPES), "unsatisfiable_shapes": list(UNSAT_SHAPES),
    })
    result.figures.update({"sizes": doc["runs"], "apf": doc["apf"], "backlog_at_once": at_once,
                           "explained_backlog": explained, "fleet_views": doc.get("fleet_views"), **fit_figures,
                           "failed_sizes_partial": doc.get("failed_runs", []), "run_seconds": doc["seconds"]})
    if doc.get("stacks"):
        result.figures["profile"] = {"nodes": largest.nodes, **profile_breakdown(doc["stacks"])}
        result.files["scale-profile.txt"] = "\n".join(doc["stacks"]) + "\n"
    for row in row_list:
        if math.isnan(row.value):
            result.notes.append(f"{row.what}: {row.basis}")
            continue
        result.target(f"{row.what} [{row.basis}]", row.value, row.limit, row.unit, higher_is_better=row.higher_is_better)
        if row.note:
            result.notes.append(f"{row.what}: {row.note}")
    if explained is None:
        result.notes.append("explain -A and the API writes with pod Events on against off: not measured (no backlog "
                            "kept at the end, or no time left for them)")
    for part, why in ((explained or {}).get("failed") or {}).items():
        result.notes.append(f"{part}: failed: {why[:300]}")
    if doc.get("fleet_views") is None and plan.fleet_samples:
        result.notes.append("the fleet views (kubectl dra get gpus, get nodes, top, fit): not measured (no time left)")
    for part, why in ((doc.get("fleet_views") or {}).get("failed") or {}).items():
        result.notes.append(f"{part}: failed: {why[:300]}")
    if at_once.get("after_failed_size"):
        result.notes.append(f"our claims/s (the throughput row) is the backlog's, run after the "
                            f"{at_once['after_failed_size']:,}-node size failed: on a larger cluster than "
                            f"{largest.nodes:,} nodes, where the scheduler's pods/s were measured")
    problems = [p for r in runs for p in r.controller_problems]
    result.notes.append(f"{len(problems)} problem lines in the controllers' logs outside the APF run"
                        + (f"; first: {problems[0][:300]}" if problems else ""))
    result.figures["headline"] = {
        "largest size run": f"{largest.nodes} GPU nodes + {largest.mig_nodes} dynamic-MIG ({largest.devices} devices)",
        "scheduler": f"{largest.fill['pods_per_s']} pods/s",
        "controller": f"{at_once['claims_per_s']:.1f} claims explained/s"}
    return result


def run(bed: BenchBed, quick: bool) -> Result:
    """``python -m e2e.bench --only scale``: the curve (``--quick``: the 500-node smoke)."""
    plan = SMOKE if quick else FULL
    doc = run_curve(plan, bed.workdir / "scale")
    result = result_of(doc, plan)
    _plot(doc, result, RESULTS)
    return result


def _plot(doc: dict[str, Any], result: Result, directory: Path) -> None:
    from e2e.bench.plot import plot_scale_curve

    path = plot_scale_curve(doc["runs"], directory / "scale-curve.png")
    result.notes.append(f"curve: {path.name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.bench.scale", description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="250 nodes, small workloads (what make e2e runs)")
    parser.add_argument("--sizes", type=lambda s: tuple(int(x) for x in s.split(",")),
                        help="comma-separated GPU node counts, e.g. 500,1000")
    parser.add_argument("--results", type=Path, default=RESULTS, help="directory for scale.json and the plot")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument("--fleet-views-only", action="store_true",
                        help="only the fleet views' stage, at the largest size (written to scale-fleet.json)")
    parser.add_argument("--mig-per", type=int,
                        help="one dynamic-MIG node per this many GPU nodes (default 10; 0: none, the fleet views' "
                             "cluster as issue 54 states it: 8 GPUs on every node and nothing else)")
    args = parser.parse_args(argv)
    plan = SMOKE if args.smoke else FULL
    if args.sizes:
        plan = Plan(**{**asdict(plan), "sizes": args.sizes})
    if args.mig_per is not None:
        plan = Plan(**{**asdict(plan), "mig_per": args.mig_per})
    workdir = Path(tempfile.mkdtemp(prefix="dra-scale-"))
    if args.fleet_views_only:
        return _fleet_views_main(plan if plan.fleet_samples else FULL, workdir, args)
    try:
        doc = run_curve(plan, workdir, log=lambda line: print(line, flush=True))
        result = result_of(doc, plan)
        _plot(doc, result, args.results)
        path = result.write(machine_facts(workdir), args.results)
        (args.results / "SUMMARY.md").write_text(summary_markdown(args.results))
    finally:
        if args.keep:
            print(f"scale: work directory kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    verdict = {True: "pass", False: "MISSED", None: "informational"}[result.passed]
    print(f"scale: {verdict} -> {path}")
    for t in result.targets:
        print(f"    {t['what']}: {t['value']} {t['unit']} ({t['comparison']} {t['limit']}) {'ok' if t['pass'] else 'MISSED'}")
    print(json.dumps(result.figures.get("profile", {}), indent=1))
    print(markdown_tables(json.loads(path.read_text())))
    return 0


def _fleet_views_main(plan: Plan, workdir: Path, args: argparse.Namespace) -> int:
    try:
        doc = run_fleet_views(plan, workdir, log=lambda line: print(line, flush=True))
        result = fleet_result_of(doc, plan)
        path = result.write(machine_facts(workdir), args.results)
        (args.results / "SUMMARY.md").write_text(summary_markdown(args.results))
    finally:
        if args.keep:
            print(f"scale: work directory kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"scale: {({True: 'pass', False: 'MISSED', None: 'informational'})[result.passed]} -> {path}")
    for t in result.targets:
        print(f"    {t['what']}: {t['value']} {t['unit']} ({t['comparison']} {t['limit']}) {'ok' if t['pass'] else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
