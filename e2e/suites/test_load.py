"""Load: many claims prepared and unprepared at once over the plugins' real sockets.

Claims are created with allocations written directly (TimeSlicing config, so several share one
GPU), then NodePrepareResources / NodeUnprepareResources come from many threads, one claim per call
as the kubelet sends them for separate pods. Figures go to ``reliability.json`` under ``crash.load*``.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from dra_driver.k8s.client import RestKubeApi
from dra_driver.node.prepare.reading import CLAIM_READ_CONCURRENCY
from e2e.suites.reliability import allocate, checkpoint_entries, node_state_problems, plugin_name, record
from e2e.testbed.clusterview import DRIVER, Bed, slice_devices, wait_for
from e2e.testbed.dracalls import DraClient, dra_socket, timed

pytestmark = pytest.mark.testbed_only
NODES = ("gpu-node-1", "gpu-node-2")


def fds(pid: int) -> dict[str, int]:
    """Open descriptors by kind: files (a path), sockets, and the rest (pipes, eventfds, epoll)."""
    counts = {"files": 0, "sockets": 0, "other": 0}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except FileNotFoundError:  # closed while listing
            continue
        kind = "files" if target.startswith("/") else "sockets" if target.startswith("socket:") else "other"
        counts[kind] += 1
    return counts


def fd_growth(before: dict[str, int], after: dict[str, int]) -> list[str]:
    """What grew more than a bounded pool explains.

    A file left open per claim (a CDI spec, the checkpoint, a lock) would show as growth in
    ``files``, which has no pool behind it, so none is allowed. Sockets may grow up to the API
    connection pool (it fills only as far as a round's peak concurrency, which varies), plus the
    test's own two DRA connections if the server has not noticed their close yet.
    """
    problems = []
    if after["files"] > before["files"]:
        problems.append(f"open files {before['files']} -> {after['files']}")
    if after["sockets"] > before["sockets"] + CLAIM_READ_CONCURRENCY + 2:
        problems.append(f"sockets {before['sockets']} -> {after['sockets']} (pool holds {CLAIM_READ_CONCURRENCY})")
    if after["other"] > before["other"] + 2:
        problems.append(f"pipes/eventfds {before['other']} -> {after['other']}")
    return problems


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 1)


def load(bed: Bed, ns: str, n: int, key: str) -> None:
    # Exclusive claims of earlier tests (namespaces still being deleted) would refuse to share.
    wait_for("nodes without prepared claims",
             lambda: all(not checkpoint_entries(bed, node)[0] for node in NODES), timeout=120, interval=1)
    api = RestKubeApi.from_kubeconfig(str(bed.kubeconfig))
    gpus: dict[str, list[str]] = {node: [] for node in NODES}
    for (pool, name), dev in slice_devices(bed).items():
        if pool in gpus and dev.get("attributes", {}).get("type", {}).get("string") == "gpu":
            gpus[pool].append(name)
    plan = [(f"load-{i}", NODES[i % 2], sorted(gpus[NODES[i % 2]])[i // 2 % len(gpus[NODES[i % 2]])]) for i in range(n)]
    with ThreadPoolExecutor(16) as pool:
        claims = list(pool.map(lambda c: (c[1], allocate(api, ns, *c)), plan))
    callers = {node: DraClient(dra_socket(bed, node)) for node in NODES}
    pids = {node: bed.fleet.procs.procs[plugin_name(node)].pid for node in NODES}

    def call(kind: str, node: str, claim: tuple[str, str, str]) -> tuple[float, str]:
        try:
            took, out = timed(getattr(callers[node], kind), [claim])
        except Exception as exc:
            return 0.0, f"{kind} {claim[1]}: {exc}"
        error = out[claim[2]].error if claim[2] in out else "no result"
        return took, f"{kind} {claim[1]}: {error}" if error else ""

    def round_trip(batch: list[tuple[str, tuple[str, str, str]]]) -> tuple[list[Any], list[Any], float, float,
                                                                          dict[str, dict[str, int]]]:
        started = time.monotonic()
        with ThreadPoolExecutor(32) as pool:
            prepared = list(pool.map(lambda c: call("prepare", *c), batch))
        prepare_s = time.monotonic() - started
        specs = {node: {"claim": len(list(bed.fleet.nodes[node].cdi_dir.glob(f"k8s.{DRIVER}-claim_*.json"))),
                        "metadata": len(list(bed.fleet.nodes[node].cdi_dir.glob(f"{DRIVER}_metadata_*.json")))}
                 for node in NODES}
        started = time.monotonic()
        with ThreadPoolExecutor(32) as pool:
            unprepared = list(pool.map(lambda c: call("unprepare", *c), batch))
        return prepared, unprepared, prepare_s, time.monotonic() - started, specs

    try:
        # A first concurrent round fills the lazily grown pools (gRPC threads, API connections): not a leak.
        warm_prepared, warm_unprepared, *_ = round_trip(claims[:64])
        time.sleep(1)
        fds_before = {node: fds(pid) for node, pid in pids.items()}
        prepared, unprepared, prepare_s, unprepare_s, specs_while_prepared = round_trip(claims)
        for c in callers.values():
            c.close()
        time.sleep(1)
        fds_after = {node: fds(pid) for node, pid in pids.items()}
    finally:
        # Allocated claims hold their GPUs in the scheduler's eyes; leaving them to the namespace
        # deletion would starve the next test's pods on these nodes.
        bed.kubectl("delete", "resourceclaims", "--all", "-n", ns, "--wait=false", check=False)
    errors = [e for _, e in warm_prepared + warm_unprepared + prepared + unprepared if e]
    leftovers = [x for node in NODES for x in node_state_problems(bed, node, set())]
    result = {
        "what": "claims with TimeSlicing allocations written by the test; prepare all, then unprepare all, "
                "one claim per call from 32 threads over the real sockets",
        "claims": n, "nodes": len(NODES), "errors": errors[:10], "error_count": len(errors),
        "prepare": {"seconds": round(prepare_s, 2), "p50_ms": p([t for t, _ in prepared], 0.5),
                    "p99_ms": p([t for t, _ in prepared], 0.99), "max_ms": p([t for t, _ in prepared], 1.0)},
        "unprepare": {"seconds": round(unprepare_s, 2), "p50_ms": p([t for t, _ in unprepared], 0.5),
                      "p99_ms": p([t for t, _ in unprepared], 0.99), "max_ms": p([t for t, _ in unprepared], 1.0)},
        "cdi_specs_while_prepared": specs_while_prepared,
        "fds_before": fds_before, "fds_after": fds_after, "lost": leftovers,
    }
    record("crash", key, result)
    assert not errors, errors[:10]
    # One spec per claim, and one device metadata spec per claim (each has one request).
    assert sum(s["claim"] for s in specs_while_prepared.values()) == n, specs_while_prepared
    assert sum(s["metadata"] for s in specs_while_prepared.values()) == n, specs_while_prepared
    assert not leftovers, leftovers
    grown = {node: g for node in NODES if (g := fd_growth(fds_before[node], fds_after[node]))}
    assert not grown, grown


def test_load(bed: Bed, ns: str) -> None:
    load(bed, ns, 100, "load")


@pytest.mark.long
def test_load_long(bed: Bed, ns: str) -> None:
    load(bed, ns, 500, "load_long")
