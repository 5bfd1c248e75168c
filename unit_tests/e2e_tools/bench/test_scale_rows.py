"""The scale bench's arithmetic (e2e/bench/scale_rows.py): how each row follows from the figures."""

from __future__ import annotations

import json
import math

import pytest

from e2e.bench.scale_rows import (
    Backlog,
    Curve,
    HistogramReading,
    Targets,
    backlog_outcome,
    backlog_seconds,
    fit_linear,
    histogram,
    log_problems,
    markdown_tables,
    mean_since,
    metric_value,
    project,
    rows,
)

METRICS = """\
# HELP dra_driver_controller_resolve_duration_seconds Time to resolve one ResourceClaim
# TYPE dra_driver_controller_resolve_duration_seconds histogram
dra_driver_controller_resolve_duration_seconds_bucket{le="0.001"} 0
dra_driver_controller_resolve_duration_seconds_bucket{le="+Inf"} 3
dra_driver_controller_resolve_duration_seconds_count 3
dra_driver_controller_resolve_duration_seconds_sum 0.75
apiserver_flowcontrol_rejected_requests_total{flow_schema="scale-bench-controller",priority_level="p",reason="queue-full"} 4
apiserver_flowcontrol_rejected_requests_total{flow_schema="scale-bench-controller",priority_level="p",reason="time-out"} 2
apiserver_flowcontrol_rejected_requests_total{flow_schema="other",priority_level="q",reason="concurrency-limit"} 100
"""


def test_metric_value_sums_the_samples_whose_labels_match() -> None:
    assert metric_value(METRICS, "apiserver_flowcontrol_rejected_requests_total",
                        {"flow_schema": "scale-bench-controller"}) == 6
    assert metric_value(METRICS, "apiserver_flowcontrol_rejected_requests_total") == 106
    assert metric_value(METRICS, "no_such_metric") == 0


def test_one_evaluation_between_two_readings_is_its_exact_duration() -> None:
    before = histogram(METRICS, "dra_driver_controller_resolve_duration_seconds")
    assert before == HistogramReading(3, 0.75)
    assert mean_since(before, HistogramReading(4, 1.0)) == pytest.approx(0.25)
    assert mean_since(before, HistogramReading(5, 1.75)) == pytest.approx(0.5)
    assert mean_since(before, before) is None


def test_fit_recovers_per_object_slopes() -> None:
    # rss = 40 + 0.02/device + 0.01/claim + 0.005/pod, sampled where the variables move apart.
    def rss(d: float, c: float, p: float) -> float:
        return 40 + 0.02 * d + 0.01 * c + 0.005 * p

    points = [(4000, 0, 0), (4000, 2000, 2000), (4000, 2000, 3000), (8000, 2000, 3000), (8000, 4000, 5000),
              (8000, 4000, 6000)]
    fit = fit_linear([{"devices": d, "claims": c, "pods": p, "rss": rss(d, c, p)} for d, c, p in points],
                     ("devices", "claims", "pods"), "rss")
    assert fit.intercept == pytest.approx(40)
    assert fit.slopes["devices"] == pytest.approx(0.02)
    assert fit.slopes["claims"] == pytest.approx(0.01)
    assert fit.slopes["pods"] == pytest.approx(0.005)
    assert fit.predict({"devices": 40_000, "claims": 20_000, "pods": 150_000}) == pytest.approx(rss(40_000, 20_000, 150_000))


def test_fit_refuses_variables_that_always_move_together() -> None:
    # Claims and pods in lockstep: no data can say which of them costs the memory.
    samples = [{"claims": c, "pods": 2 * c, "rss": 10 + c} for c in (0, 100, 200, 300)]
    with pytest.raises(ValueError, match="independently"):
        fit_linear(samples, ("claims", "pods"), "rss")
    with pytest.raises(ValueError, match="samples"):
        fit_linear(samples[:2], ("claims", "pods"), "rss")


def test_project_says_whether_a_value_is_measured_or_extrapolated() -> None:
    measured = project([(500, 1.0), (5000, 9.0)], 5000)
    assert measured.measured and measured.value == 9.0 and "measured at 5,000" in measured.basis
    line = project([(500, 1.0), (1000, 2.0), (2000, 4.0)], 5000)
    assert not line.measured and line.value == pytest.approx(10.0)
    assert "extrapolated to 5,000 nodes from 500 to 2,000" in line.basis
    one = project([(500, 0.3)], 5000)
    assert not one.measured and one.value == pytest.approx(3.0) and "proportionally" in one.basis


def test_backlog_complete_and_incomplete() -> None:
    done = backlog_outcome(4, 100.0, [101.0, 102.0, 103.0, 110.0], window_s=5.0, waited_s=10.0)
    assert done == Backlog(claims=4, explained=4, within_window=3, window_s=5.0, all_explained_s=10.0, claims_per_s=0.4)
    assert backlog_seconds(done) == (10.0, True)
    partial = backlog_outcome(10, 0.0, [1.0, 2.0], window_s=60.0, waited_s=75.0)
    assert partial.all_explained_s is None and partial.within_window == 2
    seconds, complete = backlog_seconds(partial)
    assert not complete and seconds == pytest.approx(10 / (2 / 75.0))


def test_log_problems_finds_errors_tracebacks_and_surfaced_429s() -> None:
    lines = [
        json.dumps({"event": "claim explained", "level": "info"}),
        json.dumps({"event": "list/watch failed", "level": "warning", "error": "ApiError 429 TooManyRequests"}),
        json.dumps({"event": "processing failed, retrying", "level": "warning", "error": "409 Conflict"}),
        json.dumps({"event": "allocation fence not in force", "level": "error"}),
        json.dumps({"event": "throttled by the API server, waiting", "level": "info", "status": 429}),
        "Traceback (most recent call last):",
        "",
    ]
    problems = log_problems(lines)
    assert len(problems) == 3
    assert "429 TooManyRequests" in problems[0] and "fence" in problems[1] and problems[2].startswith("Traceback")


def _curve() -> Curve:
    def rss(d: float, c: float, p: float) -> float:
        return 60 + 0.01 * d + 0.02 * c + 0.004 * p

    samples = []
    for n, prev in ((500, 0), (1000, 500), (2000, 1000)):
        d = 8 * n + 15 * n
        for c, p in ((4 * prev, 6 * prev), (4 * n, 4 * n + 2 * prev), (4 * n, 6 * n)):
            samples.append({"devices": d, "claims": c, "pods": p, "rss_mib": rss(d, c, p)})
    return Curve(
        first_claim_s=[(500, 0.4), (1000, 0.8), (2000, 1.6)],
        first_claim_cache_mib=[(500, 20), (1000, 40), (2000, 80)],
        fit_p50_ms=[(500, 50), (1000, 100), (2000, 200)],
        explain_p50_ms=[(500, 120), (1000, 240), (2000, 480)],
        explain_extra_mib=[(500, 80), (1000, 160), (2000, 320)],
        startup_s=[(500, 2.0), (1000, 4.0), (2000, 8.0)],
        devices=[(500, 11_500), (1000, 23_000), (2000, 46_000)],
        rss_samples=samples,
    )


def test_rows_state_every_target_at_5000_nodes_with_their_basis() -> None:
    backlog = backlog_outcome(10_000, 0.0, [float(i) / 100 for i in range(1, 5001)], window_s=60.0, waited_s=75.0)
    apf = {"claims": 100, "explained": 100, "problems": [], "rejected": 12}
    out, figures = rows(_curve(), Targets(), throughput=(66.7, 133.4, 2000), backlog=backlog, apf=apf)
    by = {r.what.split(" at 5,000")[0]: r for r in out}
    assert by["resolution throughput, our claims/s ÷ kube-scheduler pods/s"].value == pytest.approx(0.5)
    first = by["first claim after start"]
    assert first.value == pytest.approx(4.0) and first.limit == 1.0 and "extrapolated" in first.basis
    assert by["startup: process start -> informers synced and first pending claim explained"].value == pytest.approx(20.0)
    assert by["resolve one fitting claim, 20,000 claims allocated, p50"].value == pytest.approx(500)
    rss = next(r for r in out if r.what.startswith("controller RSS"))
    devices = 23 * 5000
    assert rss.value == pytest.approx(60 + 0.01 * devices + 0.02 * 20_000 + 0.004 * 150_000)
    assert "extrapolated from 9 fresh starts" in rss.basis
    assert figures["rss_mib_at_40000_devices"] == pytest.approx(60 + 400 + 400 + 600, abs=0.1)
    assert figures["rss_fit"]["slopes"]["pods"] == pytest.approx(0.004)
    backlog_row = next(r for r in out if r.what.startswith("backlog"))
    assert backlog_row.value == pytest.approx(10_000 / (5000 / 75.0)) and backlog_row.basis.startswith("projected")
    apf_rows = [r for r in out if "Priority and Fairness" in r.what]
    assert [r.value for r in apf_rows] == [0.0, 12.0]


def test_rows_without_enough_rss_samples_say_so_instead_of_guessing() -> None:
    curve = Curve(rss_samples=[{"devices": 1.0, "claims": 0.0, "pods": 0.0, "rss_mib": 50.0}], devices=[(500, 1.0)])
    out, figures = rows(curve, Targets(), throughput=None, backlog=None, apf=None)
    assert len(out) == 1 and math.isnan(out[0].value) and out[0].basis.startswith("not computed")
    assert figures["rss_fit"] is None


def test_markdown_tables_show_each_row_with_its_basis_and_each_size() -> None:
    document = {
        "targets": [{"what": "first claim after start at 5,000 nodes [extrapolated to 5,000 nodes from 500 to 2,000]",
                     "value": 4.0, "limit": 1.0, "unit": "s", "comparison": "<=", "pass": False}],
        "figures": {"sizes": [{
            "nodes": 500, "mig_nodes": 50, "devices": 11600,
            "rss_samples": [{"claims": 2000, "pods": 3000, "rss_mib": 180.4}],
            "first_claim": {"latency_s": 2.4, "cache_mib": 350.0},
            "fit_probes": [{"latency_s": 0.2}, {"latency_s": 0.3}, {"latency_s": None}],
            "explain_probes": [{"latency_s": 0.4}],
            "backlog": {"claims_per_s": 1.8}, "fill": {"pods_per_s": 8.3}, "startup": {"explained_s": 4.6}}]},
    }
    text = markdown_tables(document)
    assert ("| first claim after start at 5,000 nodes | 4.00 s | <= 1.0 s | **no** | "
            "extrapolated to 5,000 nodes from 500 to 2,000 |") in text
    assert ("| 500 (+50) | 11,600 | 2,000 | 3,000 | 180 MiB | 2.40 s, +350 MiB | 200 ms | 400 ms | 1.8 | 8.3 | 4.6 s |"
            in text)
