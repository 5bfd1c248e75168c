"""The scale bench at 250 nodes (``python -m e2e.bench.scale --smoke``), as a test.

Its own control plane with kwok nodes (not the session's bed): 250 GPU nodes and 25 dynamic-MIG
nodes, 500 claims allocated (100 of them by the kube-scheduler), our controller started afresh several times,
probes, a backlog of pending claims (then listed by ``explain -A`` and explained again without pod
Events) and a run under a low API Priority and Fairness limit. What is
asserted is what 250 nodes can show: every claim allocated or explained, no error logged, and the
APF run; the latency and memory targets belong to ``make bench-scale`` at 5,000 nodes.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.bench.scale import curve as scale

pytestmark = [pytest.mark.testbed_only, pytest.mark.timeout(1500)]


@pytest.fixture(scope="module")
def smoke() -> Iterator[dict[str, Any]]:
    workdir = Path(tempfile.mkdtemp(prefix="dra-scale-smoke-"))
    lines: list[str] = []
    try:
        doc = scale.run_curve(scale.SMOKE, workdir, log=lambda line: (lines.append(line), print(line, flush=True)))
        yield {**doc, "log": lines}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def test_the_scheduler_allocates_every_fill_claim(smoke: dict[str, Any]) -> None:
    (run,) = smoke["runs"]
    (nodes,) = scale.SMOKE.sizes
    assert run["nodes"] == nodes and run["mig_nodes"] == scale.SMOKE.mig_nodes(nodes)
    assert run["fill"]["pods"] == scale.SMOKE.scheduled_pods
    assert run["held"]["claims"] + run["fill"]["pods"] == nodes * scale.SMOKE.claims_per_node
    # Every new node got its slices and every pod of the fill was bound (fill() raises otherwise).
    assert run["devices"] > nodes * 8 and run["fill"]["pods_per_s"] > 0


def test_every_pending_claim_is_resolved_or_explained(smoke: dict[str, Any]) -> None:
    (run,) = smoke["runs"]
    probes = [run["first_claim"], run["first_unsat"], *run["fit_probes"], *run["explain_probes"], run["cold_probe"]]
    assert all(p["latency_s"] is not None and p["evaluations"] >= 1 for p in probes), probes
    backlog = run["backlog"]
    assert backlog["explained"] == backlog["claims"] == scale.SMOKE.backlog_at_once, backlog
    assert run["startup"]["explained_s"] >= run["startup"]["synced_s"] > 0


def test_the_kept_backlog_is_listed_by_explain_and_explained_again_without_pod_events(smoke: dict[str, Any]) -> None:
    explained = smoke["explained_backlog"]
    assert not explained["failed"], explained["failed"]
    backlog = scale.SMOKE.backlog_at_once
    listing = explained["explain_all"]
    assert listing["pending"] == listing["listed"] == backlog and listing["reasons"] >= 1, listing
    on, off = explained["on"], explained["off"]
    assert on["explained"] == off["explained"] == backlog and off["explained_before_it"] == 0, (on, off)
    # The API server counted each run's patches of the claims; pods were told only in the first.
    for run in (on, off):
        assert run["writes"].get("resourceclaims PATCH 200", 0) >= backlog, run["writes"]
    assert on["told"].get("Pod", 0) > 0 and "Pod" not in off["told"], (on["told"], off["told"])
    assert sum(on["writes"].values()) > sum(off["writes"].values())


def test_no_error_logged(smoke: dict[str, Any]) -> None:
    (run,) = smoke["runs"]
    assert run["controller_problems"] == []


def test_the_low_apf_limit_bites(smoke: dict[str, Any]) -> None:
    # Without 429s the next test would prove nothing.
    assert smoke["apf"]["rejected"] > 0, smoke["apf"]


def test_under_a_low_apf_limit_every_claim_is_explained_and_no_429_surfaces(smoke: dict[str, Any]) -> None:
    apf = smoke["apf"]
    assert apf["explained"] == apf["claims"], apf
    assert apf["problems"] == [], apf["problems"]
