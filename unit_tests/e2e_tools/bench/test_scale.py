"""The scale bench's decisions that need no cluster (e2e/bench/scale/curve.py): the budget, the curve's samples."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from e2e.bench.scale.curve import BUDGET_S, FULL, SizeRun, curve_of, fits
from e2e.tooling import binaries, bytecode, gotools


def _run(nodes: int, seconds: float, samples: list[dict[str, float]] | None = None) -> SizeRun:
    return SizeRun(nodes, devices=int(23.2 * nodes), seconds=seconds, rss_samples=samples or [])


def test_the_budget_skips_a_size_that_would_overrun_it() -> None:
    ran = [_run(500, 122.3), _run(1000, 180.2), _run(2000, 357.5)]
    assert fits(500, 0.0, [], BUDGET_S)
    # The last run started 5,000 nodes about 690 s in: x3 of 357.5 s does not fit 28 minutes.
    assert not fits(5000, 690.0, ran, BUDGET_S)
    # With its fill shortened (2,000 nodes in about 310 s, 5,000 started about 650 s in), it does.
    assert fits(5000, 650.0, [*ran[:2], _run(2000, 310.0)], BUDGET_S)


def test_the_at_once_backlog_reserves_a_sync_its_pods_and_the_wait() -> None:
    assert FULL.at_once_s() == pytest.approx(90 + 10_000 / 100 + 75)


def test_what_follows_the_kept_backlog_is_reserved_from_that_backlogs_own_run() -> None:
    # The 10,000 of 2026-11-28's slower machine: synced 12.8 s after spawn, all explained 64.9 s later.
    backlog = {"claims": 10_000, "synced_s": 12.8, "waited_s": 64.9}
    assert FULL.explained_backlog_s(backlog) == pytest.approx(3 * 10 + 10_000 / 150 + 12.8 + 64.9 + 15)


def test_the_curve_takes_a_failed_sizes_samples_and_older_ones_without_plain_pods() -> None:
    old = {"devices": 11_600, "claims": 2000, "pods": 3000, "rss_mib": 134.2}
    new = {"devices": 11_600, "claims": 2000, "pods": 2000, "plain_pods": 0, "rss_mib": 123.0}
    failed = {"devices": 116_000, "claims": 8000, "pods": 12_000, "plain_pods": 4000, "rss_mib": 433.0}
    curve = curve_of([_run(500, 122.3, [new, old])], [failed])
    assert [s["plain_pods"] for s in curve.rss_samples] == [0.0, 1000.0, 4000.0]
    assert curve.rss_samples[-1] == {"devices": 116_000.0, "claims": 8000.0, "plain_pods": 4000.0, "rss_mib": 433.0}
    assert curve.devices == [(500.0, 11_600.0)]


# --------------------------------------------------------------------------- run_curve's flow, on fakes


class FakeController:
    def __init__(self, label: str) -> None:
        self.label, self.pid, self.spawned, self.proc = label, 1, 0.0, object()

    def wait_synced(self, timeout: float) -> float:
        return 1.0

    def wait_warm(self, timeout: float) -> float:
        return 1.5

    def check_alive(self) -> None:
        pass

    def stop(self) -> None:
        self.proc = None

    def log_lines(self) -> list[str]:
        return []


class FakeCluster:
    """What run_size asks of ScaleCluster, with the bench's bookkeeping; ``fail_fill_at`` nodes: the
    fill runs out of time there, as the 5,000-node size did."""

    fail_fill_at = 0

    def __init__(self, workdir: object, mig_per: int, log: Any) -> None:
        self.mig_per, self.log, self.api = mig_per, log, None
        self.gpu_nodes = self.mig_nodes = self.slices = self.devices = 0
        self.fill_pods = self.held_claims = self.plain_pods = self.more_claims = 0
        self.writable: list[tuple[str, str, str]] = []
        self.fills: list[tuple[int, float]] = []
        self.started: list[FakeController] = []
        self.stopped_all = 0

    def start(self) -> None:
        pass

    close = check_alive = start

    @property
    def claims(self) -> int:
        return self.fill_pods + self.held_claims + self.more_claims

    @property
    def pods(self) -> int:
        return self.claims + self.plain_pods

    def grow(self, nodes: int) -> dict[str, Any]:
        self.gpu_nodes, self.mig_nodes = nodes, nodes // self.mig_per
        self.devices = int(23.2 * nodes)
        self.writable = [("n", "p", f"d{i}") for i in range(4 * nodes)]
        return {}

    def hold(self, claims: int) -> dict[str, Any]:
        self.held_claims = claims
        return {}

    def hold_more(self, claims: int) -> dict[str, Any]:
        self.more_claims += claims
        return {"claims": claims}

    def fill(self, claims: int, timeout_s: float) -> dict[str, Any]:
        pods = claims - self.fill_pods
        self.fills.append((pods, timeout_s))
        if self.gpu_nodes == self.fail_fill_at:
            raise RuntimeError(f"the kube-scheduler bound {pods - 26} of {pods} pods in {timeout_s:.0f}s")
        self.fill_pods = claims
        return {"pods": pods, "pods_per_s": 4800 / self.gpu_nodes}

    def add_plain_pods(self, pods: int) -> dict[str, Any]:
        self.plain_pods = pods
        return {}

    def controller(self, label: str) -> FakeController:
        ctl = FakeController(label)
        self.started.append(ctl)
        return ctl

    def has_explanation(self, namespace: str, name: str) -> bool:
        return True

    def remove(self, namespace: str, names: Any) -> None:
        pass

    def stop_controllers(self) -> list[str]:
        self.stopped_all += 1
        return []

    def events_by_reporter(self, namespace: str) -> dict[str, dict[str, int]]:
        return {"on": {"Pod": 10_000, "ResourceClaim": 9000}, "off": {"ResourceClaim": 10_000}}


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """run_curve with the cluster, the controllers and the measurements faked; what they were asked."""
    from e2e.bench.scale import curve as scale

    seen: dict[str, Any] = {"backlogs": [], "clusters": [], "explained": [], "views": []}

    def cluster(*args: Any) -> FakeCluster:
        sc = FakeCluster(*args)
        seen["clusters"].append(sc)
        return sc

    def sample(sc: FakeCluster, label: str, timeout: float = 600) -> tuple[FakeController, dict[str, Any]]:
        rss = 80 + 0.0025 * sc.devices + 0.01 * sc.claims
        return sc.controller(label), {"devices": sc.devices, "claims": sc.claims, "pods": sc.pods,
                                      "plain_pods": sc.plain_pods, "nodes": sc.gpu_nodes, "rss_mib": rss,
                                      "label": label, "process": label}

    def later(sc: FakeCluster, ctl: FakeController, first: dict[str, Any]) -> dict[str, Any]:
        return {**first, "plain_pods": sc.plain_pods, "pods": sc.pods, "label": f"{first['label']}-later", "fresh": False}

    def backlog(sc: FakeCluster, plan: Any, claims: int, label: str, *, remove: bool = True) -> dict[str, Any]:
        seen["backlogs"].append((label, claims, remove, sc.gpu_nodes))
        return {"claims": claims, "explained": claims, "within_window": claims, "window_s": 60.0,
                "all_explained_s": claims / 100, "claims_per_s": 100.0, "problems": [], "label": label,
                "synced_s": 10.0, "waited_s": claims / 100,
                "reporter": "on", "writes": {"resourceclaims PATCH 200": claims, "events POST 201": 2 * claims - 1000}}

    def explain_all(sc: FakeCluster, samples: int) -> dict[str, Any]:
        seen["explained"].append(("explain -A", samples, sc.gpu_nodes))
        return {"seconds": 2.5, "samples": [2.5] * samples, "pending": 10_000, "reasons": 3, "listed": 10_000}

    def off(sc: FakeCluster, plan: Any, names: list[str], label: str) -> dict[str, Any]:
        seen["explained"].append(("no pod events", len(names), names[0], label))
        return {"claims": len(names), "explained": len(names), "explained_before_it": 0, "reporter": "off",
                "writes": {"resourceclaims PATCH 200": len(names), "events POST 201": len(names)},
                "problems": ["an error line"]}

    def view(sc: FakeCluster, argv: tuple[str, ...], samples: int) -> dict[str, Any]:
        seen["views"].append((argv, samples, sc.gpu_nodes, sc.claims))
        return {"seconds": 2.0, "samples": [2.0] * samples, "cpu_s": [1.5] * samples, "peak_rss_mib": 400.0,
                "lines": 40_001}

    probe = {"latency_s": 0.01, "sum_s": 0.01, "evaluations": 1, "rss_growth_mib": 1.0, "peak_growth_mib": 1.0}
    monkeypatch.setattr(scale, "fleet_view", view)
    monkeypatch.setattr(scale, "ScaleCluster", cluster)
    monkeypatch.setattr(scale, "synced_sample", sample)
    monkeypatch.setattr(scale, "later_sample", later)
    monkeypatch.setattr(scale, "backlog_phase", backlog)
    monkeypatch.setattr(scale, "explain_all", explain_all)
    monkeypatch.setattr(scale, "pod_events_off_phase", off)
    monkeypatch.setattr(scale, "probe", lambda *a, **k: dict(probe))
    monkeypatch.setattr(scale, "apf_phase", lambda sc, plan: {"claims": 1, "explained": 1, "problems": [], "rejected": 3})
    monkeypatch.setattr(scale, "create", lambda *a, **k: {})
    for mod, name in ((binaries, "ensure"), (gotools, "ensure"), (bytecode, "shipped_python")):
        monkeypatch.setattr(mod, name, lambda *a, **k: None)
    return seen


def _plan(**kw: Any) -> Any:
    from e2e.bench.scale.curve import Plan

    return Plan(sizes=(500, 1000, 2000, 5000), profile=False, **kw)


def test_a_size_that_fails_keeps_its_samples_and_the_10000_backlog_runs_on_the_cluster_it_left(
        fake: dict[str, Any], tmp_path: Path) -> None:
    from e2e.bench.scale import curve as scale

    FakeCluster.fail_fill_at = 5000
    try:
        doc = scale.run_curve(_plan(), tmp_path, log=lambda line: None)
    finally:
        FakeCluster.fail_fill_at = 0
    (sc,) = fake["clusters"]
    # 250 pods at the first size, then about a minute at the rate the last size predicts.
    assert [pods for pods, _ in sc.fills] == [250, 250, 144, 60]
    assert sc.fills[-1][1] == pytest.approx(120 + 3 * 60 / (4800 / 5000))
    assert [r["nodes"] for r in doc["runs"]] == [500, 1000, 2000] and list(doc["failed_sizes"]) == ["5000"]
    assert sc.stopped_all == 1 and all(c.proc is None for c in sc.started[:-1])
    (partial,) = doc["failed_runs"]
    assert [s["label"] for s in partial["rss_samples"]] == ["5000-nodes"]
    # The sizes' own backlogs are deleted, the one after the failure is not (nothing follows it).
    assert fake["backlogs"] == [("500", 250, True, 500), ("1000", 500, True, 1000), ("2000", 1000, True, 2000),
                                ("2000-at-once", 10_000, False, 5000)]
    at_once = doc["backlog_at_once"]
    assert at_once["after_failed_size"] == 5000 and at_once["cluster"]["nodes"] == 5000

    monkey = pytest.MonkeyPatch()
    monkey.setattr(binaries, "kubernetes_version", lambda: "v0")
    try:
        result = scale.result_of(doc, _plan())
    finally:
        monkey.undo()
    row = next(t for t in result.targets if t["what"].startswith("backlog of 10,000"))
    assert "after the 5,000-node size failed" in row["what"] and "conservative reading" in row["what"]
    assert result.figures["rss_fit"]["samples"] == 10
    assert result.figures["failed_sizes_partial"][0]["nodes"] == 5000


def test_the_kept_backlog_is_listed_by_explain_then_explained_again_without_pod_events(
        fake: dict[str, Any], tmp_path: Path) -> None:
    from e2e.bench.scale import curve as scale

    doc = scale.run_curve(_plan(), tmp_path, log=lambda line: None)
    # Only the backlog kept at the end, once explained: explain -A first, then the same claims again.
    assert fake["explained"] == [("explain -A", 3, 5000), ("no pod events", 10_000, "backlog-5000-0", "5000")]
    explained = doc["explained_backlog"]
    assert explained["nodes"] == 5000 and explained["claims"] == 10_000 and not explained["failed"]
    assert explained["on"]["told"] == {"Pod": 10_000, "ResourceClaim": 9000}
    assert explained["off"]["told"] == {"ResourceClaim": 10_000}
    assert doc["runs"][-1]["controller_problems"] == ["an error line"]

    monkey = pytest.MonkeyPatch()
    monkey.setattr(binaries, "kubernetes_version", lambda: "v0")
    try:
        result = scale.result_of(doc, _plan())
    finally:
        monkey.undo()
    rows = {t["what"].partition(" [")[0]: t for t in result.targets}
    writes = rows["API writes for 10,000 pending pods, pod Events on ÷ off"]
    assert writes["value"] == pytest.approx(29_000 / 20_000) and writes["pass"]
    assert rows["explain -A with 10,000 pending claims: the answer"]["value"] == 2.5
    cold = rows["explain one claim whose selector nothing has evaluated yet (a new literal) at 5,000 nodes"]
    assert cold["value"] == pytest.approx(10.0) and "measured at 5,000 nodes" in cold["what"]


def test_an_explained_backlog_that_does_not_fit_the_budget_is_left_out(fake: dict[str, Any], tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from e2e.bench.scale import curve as scale

    monkeypatch.setattr(scale.Plan, "explained_backlog_s", lambda self, backlog: self.budget_s + 1)
    doc = scale.run_curve(_plan(), tmp_path, log=lambda line: None)
    assert doc["explained_backlog"] is None and fake["explained"] == []
    monkeypatch.setattr(binaries, "kubernetes_version", lambda: "v0")
    result = scale.result_of(doc, _plan())
    assert not any("pod Events" in t["what"] or "explain -A" in t["what"] for t in result.targets)
    assert any(n.startswith("explain -A and the API writes") for n in result.notes)


def test_a_failed_explain_or_run_without_pod_events_is_said_and_leaves_the_other(
        fake: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from e2e.bench.scale import curve as scale

    def broken(*a: Any) -> dict[str, Any]:
        raise RuntimeError("explain -A exited with 1: dra-driver explain: cannot reach the cluster")

    def slow(*a: Any) -> dict[str, Any]:
        raise TimeoutError("controller 99-5000-no-pod-events: informers not synced 600s after start")

    monkeypatch.setattr(scale, "explain_all", broken)
    monkeypatch.setattr(scale, "pod_events_off_phase", slow)
    doc = scale.run_curve(_plan(), tmp_path, log=lambda line: None)
    explained = doc["explained_backlog"]
    assert set(explained["failed"]) == {"explain_all", "pod_events_off"} and "on" not in explained
    monkeypatch.setattr(binaries, "kubernetes_version", lambda: "v0")
    result = scale.result_of(doc, _plan())
    assert not any("pod Events" in t["what"] or "explain -A" in t["what"] for t in result.targets)
    assert any(n.startswith("explain_all: failed: explain -A exited with 1") for n in result.notes)
    assert any(n.startswith("pod_events_off: failed: controller") for n in result.notes)


def test_a_size_skipped_for_the_budget_gets_its_10000_backlog_at_the_largest_size_that_ran(
        fake: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from e2e.bench.scale import curve as scale

    monkeypatch.setattr(scale, "fits", lambda nodes, *a: nodes < 5000)
    doc = scale.run_curve(_plan(), tmp_path, log=lambda line: None)
    assert doc["skipped_sizes"] == [5000] and not doc["failed_sizes"]
    assert fake["backlogs"][-1] == ("2000-at-once", 10_000, False, 2000)
    assert doc["backlog_at_once"]["after_failed_size"] is None
    assert fake["explained"][-1] == ("no pod events", 10_000, "backlog-2000-at-once-0", "2000-at-once")


def test_without_time_for_it_the_10000_backlog_is_projected(fake: dict[str, Any], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from e2e.bench.scale import curve as scale

    monkeypatch.setattr(scale, "fits", lambda nodes, *a: nodes < 5000)
    doc = scale.run_curve(_plan(budget_s=100.0), tmp_path, log=lambda line: None)
    assert [b[0] for b in fake["backlogs"]] == ["500", "1000", "2000"]
    assert doc["backlog_at_once"]["claims"] == 1000
    assert doc["explained_backlog"] is None and fake["explained"] == [], "its backlog was deleted"


def test_the_last_planned_size_keeps_its_backlog_and_needs_no_other(fake: dict[str, Any], tmp_path: Path) -> None:
    from e2e.bench.scale import curve as scale

    doc = scale.run_curve(_plan(), tmp_path, log=lambda line: None)
    assert [r["nodes"] for r in doc["runs"]] == [500, 1000, 2000, 5000]
    assert fake["backlogs"][-1] == ("5000", 10_000, False, 5000)
    assert doc["backlog_at_once"]["claims"] == 10_000
    assert all(c.proc is None for c in fake["clusters"][0].started)


def test_the_startup_row_is_the_median_of_fresh_processes_taken_in_turn(
        fake: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from e2e.bench.scale import curve as scale

    ages = iter([9.0, 3.0, 5.0])
    real = FakeCluster.controller

    def controller(self: FakeCluster, label: str) -> FakeController:
        ctl = real(self, label)
        if "startup" in label:
            ctl.spawned = time.monotonic() - next(ages)  # explained that long after its spawn
        return ctl

    monkeypatch.setattr(FakeCluster, "controller", controller)
    doc = scale.run_curve(scale.Plan(sizes=(500,), profile=False), tmp_path, log=lambda line: None)
    (sc,) = fake["clusters"]
    starts = [c for c in sc.started if "startup" in c.label]
    assert [c.label for c in starts] == ["500-startup-0", "500-startup-1", "500-startup-2"]
    assert all(c.proc is None for c in starts), "each is stopped before the next starts"
    startup = doc["runs"][0]["startup"]
    assert [round(s["explained_s"]) for s in startup["samples"]] == [9, 3, 5]
    assert startup["explained_s"] == pytest.approx(5.0, abs=0.5) and startup["synced_s"] == 1.0


@pytest.mark.parametrize("module", ["e2e.bench.scale", "e2e.bench.scale.inprocess", "e2e.bench.scale.fleetviews"])
def test_the_commands_parse_their_arguments(module: str) -> None:
    """``python -m e2e.bench.scale`` (make bench-scale) and the in-process bench start from their
    folder: only ``--help``, nothing is measured."""
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=root, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: python -m {module} ")


# --- the fleet views (issue 54) ------------------------------------------------------------------


def test_the_fleet_views_run_last_with_30000_claims_allocated(fake: dict[str, Any], tmp_path: Path) -> None:
    from e2e.bench.scale import curve as scale

    doc = scale.run_curve(_plan(), tmp_path, log=lambda line: None)
    views = doc["fleet_views"]
    assert views["claims_allocated"] == 30_000 and views["written"] == {"claims": 10_000} and not views["failed"]
    assert [v[0][:2] for v in fake["views"]] == [("get", "gpus"), ("get", "nodes"), ("top",), ("fit", "--template")]
    assert fake["views"][-1][0][-2:] == ("--count", "1000")
    assert {(v[1], v[2], v[3]) for v in fake["views"]} == {(3, 5000, 30_000)}
    monkey = pytest.MonkeyPatch()
    monkey.setattr(binaries, "kubernetes_version", lambda: "v0")
    try:
        result = scale.result_of(doc, _plan())
    finally:
        monkey.undo()
    rows = {t["what"].partition(" [")[0]: t for t in result.targets}
    top = rows["kubectl dra top on 5,000 nodes, 40,000 GPUs, 30,000 claims allocated"]
    assert top["value"] == 2.0 and top["limit"] == 3.0 and top["pass"]
    assert "process start to exit" in top["what"] and "peak RSS 400 MiB" in top["what"]


def test_without_time_for_them_the_fleet_views_are_said_not_measured(fake: dict[str, Any], tmp_path: Path) -> None:
    from e2e.bench.scale import curve as scale

    doc = scale.run_curve(_plan(fleet_claims=10**9), tmp_path, log=lambda line: None)  # a write that takes years
    assert doc["fleet_views"] is None and fake["views"] == []
    monkey = pytest.MonkeyPatch()
    monkey.setattr(binaries, "kubernetes_version", lambda: "v0")
    try:
        result = scale.result_of(doc, _plan())
    finally:
        monkey.undo()
    assert any(n.startswith("the fleet views (kubectl dra get gpus, get nodes, top, fit): not measured") for n in result.notes)
    assert scale.fleet_views_phase(fake["clusters"][-1], scale.SMOKE, 0.0) is None  # make e2e's smoke: no stage


def test_the_fleet_views_stage_runs_alone_at_the_largest_size(fake: dict[str, Any], tmp_path: Path) -> None:
    from e2e.bench.scale import curve as scale

    doc = scale.run_fleet_views(_plan(), tmp_path, log=lambda line: None)
    sc = fake["clusters"][-1]
    assert sc.gpu_nodes == 5000 and sc.held_claims == 20_000 and sc.more_claims == 10_000 and sc.fill_pods == 0
    monkey = pytest.MonkeyPatch()
    monkey.setattr(binaries, "kubernetes_version", lambda: "v0")
    try:
        result = scale.fleet_result_of(doc, _plan())
    finally:
        monkey.undo()
    assert result.name == "scale-fleet" and len(result.targets) == 4 and result.passed


def test_a_fleet_view_is_timed_from_process_start_to_exit_with_its_peak_rss(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from e2e.bench.scale import curve as scale

    sc = SimpleNamespace(cluster=SimpleNamespace(kubeconfig=tmp_path / "none"), log=lambda line: None)
    ballast = bytearray(400 * 2**20)  # the bench's own RSS, which a forked child's ru_maxrss starts from
    ballast[::4096] = b"x" * len(ballast[::4096])
    done = scale.fleet_view(sc, ("get", "gpus", "--help"), 1)  # type: ignore[arg-type]
    assert done["lines"] > 5 and 10 < done["peak_rss_mib"] < 300 and done["samples"][0] > 0
    del ballast
    with pytest.raises(RuntimeError, match=r"get gpus exited with 1: dra-driver get: kubeconfig .* does not exist"):
        scale.fleet_view(sc, ("get", "gpus"), 1)  # type: ignore[arg-type]
