"""The scale bench's arithmetic (e2e/bench/scale/rows.py): how each row follows from the figures."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import pytest

from e2e.bench.scale.rows import (
    Backlog,
    Curve,
    HistogramReading,
    Targets,
    api_writes,
    backlog_outcome,
    backlog_row,
    backlog_seconds,
    cold_selector_ms,
    expected_pods_per_s,
    explain_listing,
    explained_backlog_rows,
    fill_deadline_s,
    fill_pods,
    fit_linear,
    histogram,
    log_problems,
    markdown_tables,
    mean_since,
    metric_value,
    plain_pod_slope,
    project,
    rows,
    rss_rows,
    size_seconds,
    where_backlog_ran,
    writes_since,
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
    def rss(d: float, c: float, plain: float) -> float:
        return 60 + 0.01 * d + 0.02 * c + 0.004 * plain

    samples = []
    for n, prev in ((500, 0), (1000, 500), (2000, 1000)):
        d = 8 * n + 15 * n
        for c, plain in ((4 * prev, 2 * prev), (4 * n, 2 * prev), (4 * n, 2 * n)):
            samples.append({"devices": d, "claims": c, "plain_pods": plain, "rss_mib": rss(d, c, plain)})
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
    # 150,000 pods of which 20,000 hold the claims: 130,000 plain ones.
    assert rss.value == pytest.approx(60 + 0.01 * devices + 0.02 * 20_000 + 0.004 * 130_000)
    assert "fit over devices and claims from 9 fresh starts" in rss.basis
    assert "from 3 pairs of starts that differ only in plain pods" in rss.basis
    assert figures["rss_mib_at_40000_devices"] == pytest.approx(60 + 400 + 400 + 520, abs=0.1)
    assert set(figures["rss_fit"]["slopes"]) == {"devices", "claims"}
    assert figures["rss_plain_pods"]["kib_per_pod"] == pytest.approx(0.004 * 1024)
    assert figures["rss_plain_pods"]["stderr_kib_per_pod"] == pytest.approx(0, abs=1e-6)
    backlog_row = next(r for r in out if r.what.startswith("backlog"))
    assert backlog_row.what.startswith("backlog of 10,000 pending claims")
    assert backlog_row.value == pytest.approx(10_000 / (5000 / 75.0)) and backlog_row.basis.startswith("projected")
    apf_rows = [r for r in out if "Priority and Fairness" in r.what]
    assert [r.value for r in apf_rows] == [0.0, 12.0]


def test_rows_without_enough_rss_samples_say_so_instead_of_guessing() -> None:
    curve = Curve(rss_samples=[{"devices": 1.0, "claims": 0.0, "plain_pods": 0.0, "rss_mib": 50.0}], devices=[(500, 1.0)])
    out, figures = rows(curve, Targets(), throughput=None, backlog=None, apf=None)
    assert len(out) == 1 and math.isnan(out[0].value) and out[0].basis.startswith("not computed")
    assert "differ only in plain pods" in out[0].basis
    assert figures["rss_fit"] is None
    # Pairs, but devices and claims always together: no fit either.
    lockstep = [{"devices": 10.0 * c, "claims": c, "plain_pods": p, "rss_mib": 50 + c + p}
                for c in (1.0, 2.0, 3.0) for p in (0.0, 5.0)]
    out, _ = rows(Curve(rss_samples=lockstep, devices=[(500, 1.0)]), Targets(), throughput=None, backlog=None, apf=None)
    assert math.isnan(out[0].value) and "independently" in out[0].basis


def test_markdown_tables_show_each_row_with_its_basis_and_each_size() -> None:
    document = {
        "targets": [{"what": "first claim after start at 5,000 nodes [extrapolated to 5,000 nodes from 500 to 2,000]",
                     "value": 4.0, "limit": 1.0, "unit": "s", "comparison": "<=", "pass": False}],
        "figures": {"sizes": [{
            "nodes": 500, "mig_nodes": 50, "devices": 11600,
            "rss_samples": [{"claims": 2000, "pods": 3000, "rss_mib": 180.4}],
            "first_claim": {"latency_s": 2.4, "cache_mib": 350.0},
            "fit_probes": [{"latency_s": 0.2}, {"latency_s": 0.3}, {"latency_s": None}],
            "explain_probes": [{"latency_s": 0.4}], "cold_probe": {"sum_s": 0.062, "evaluations": 1},
            "backlog": {"claims_per_s": 1.8}, "fill": {"pods_per_s": 8.3}, "startup": {"explained_s": 4.6}}]},
    }
    text = markdown_tables(document)
    assert ("| first claim after start at 5,000 nodes | 4.00 s | <= 1.0 s | **no** | "
            "extrapolated to 5,000 nodes from 500 to 2,000 |") in text
    assert ("| 500 (+50) | 11,600 | 2,000 | 3,000 | 180 MiB | 2.40 s, +350 MiB | 200 ms | 400 ms | 62 ms | 1.8 | 8.3 "
            "| 4.6 s |" in text)


# --------------------------------------------------------------------------- RSS: plain pods apart

FLEET = [(500, 11_600), (1000, 23_200), (2000, 46_400)]

# The run of 2026-11-28 (make bench-scale): (devices, claims, pods, VmRSS MiB) of each fresh start,
# "-nodes", "-filled", "-pods" per size, and the 5,000-node size's "-nodes" start, taken before
# that size failed.
RUN1 = [
    (11_600, 0, 0, 95.5), (11_600, 2000, 2000, 123.0), (11_600, 2000, 3000, 134.2),
    (23_200, 2000, 3000, 191.2), (23_200, 4000, 5000, 205.4), (23_200, 4000, 6000, 204.5),
    (46_400, 4000, 6000, 248.2), (46_400, 8000, 10_000, 277.2), (46_400, 8000, 12_000, 276.5),
    (116_000, 8000, 12_000, 433.0),
]


def _samples(points: Sequence[tuple[float, float, float, float]]) -> list[dict[str, float]]:
    return [{"devices": d, "claims": c, "plain_pods": p - c, "pods": p, "rss_mib": r} for d, c, p, r in points]


def test_plain_pods_are_measured_where_only_they_changed_not_fitted_beside_claims() -> None:
    # The controller keeps nothing of a plain pod; RSS = 80 + 2.5 KiB/device + 10 KiB/claim, and each
    # size's "-filled" and "-pods" starts share an offset (a fresh process's noise, the same state).
    def truth(d: float, c: float) -> float:
        return 80 + 0.0025 * d + 0.01 * c

    offset = {500: 12.0, 1000: -8.0, 2000: 10.0}
    samples = []
    for n, prev in ((500, 0), (1000, 500), (2000, 1000)):
        d = 23.2 * n
        for i, (c, plain) in enumerate(((4 * prev, 2 * prev), (4 * n, 2 * prev), (4 * n, 2 * n))):
            samples.append({"devices": d, "claims": c, "plain_pods": plain, "pods": c + plain,
                            "rss_mib": truth(d, c) + (offset[n] if i else 0.0)})
    slope = plain_pod_slope(samples)
    assert slope.mib_per_pod == pytest.approx(0, abs=1e-12) and slope.groups == 3 and slope.most_apart == 2000
    (row,), _, figures = rss_rows(Curve(devices=list(FLEET), rss_samples=samples), Targets())
    assert row.value == pytest.approx(truth(116_000, 20_000), abs=15)
    assert figures["rss_plain_pods"]["mib"] == 0
    # The fit over devices, claims and pods together reads the offsets as a pod slope: far off.
    joint = fit_linear(samples, ("devices", "claims", "pods"), "rss_mib")
    assert abs(joint.predict({"devices": 116_000, "claims": 20_000, "pods": 150_000}) - truth(116_000, 20_000)) > 100


def test_the_last_runs_samples_give_plain_pods_their_paired_slope_with_its_spread() -> None:
    samples = _samples(RUN1)
    # What the row said: 0.0047 MiB (4.8 KiB) per pod, and 1,159 MiB at 150,000 pods.
    joint = fit_linear([s for s in samples if s["devices"] < 100_000], ("devices", "claims", "pods"), "rss_mib")
    assert joint.slopes["pods"] * 1024 == pytest.approx(4.81, abs=0.01)
    assert joint.predict({"devices": 116_000, "claims": 20_000, "pods": 150_000}) == pytest.approx(1158.7, abs=0.1)
    # The pairs: +11.2 MiB over 1,000 plain pods, -0.9 over 1,000, -0.7 over 2,000.
    slope = plain_pod_slope(samples)
    assert slope.measured == pytest.approx(8900 / 6e6) and slope.groups == 3
    assert slope.stderr is not None and slope.stderr * 1024 == pytest.approx(3.15, abs=0.01)
    (row,), fit, figures = rss_rows(Curve(devices=list(FLEET), rss_samples=samples), Targets())
    assert fit is not None and fit.samples == 10  # the failed size's start is in the fit
    assert figures["rss_plain_pods"]["mib"] == pytest.approx(8900 / 6e6 * 130_000, abs=0.1)
    assert 700 < row.value < 800
    assert "1.52 ± 3.15 KiB per plain pod from 3 pairs" in row.basis
    assert "up to 116,000 devices and 8,000 claims" in row.basis


def test_a_negative_plain_pod_slope_is_noise_and_counts_as_zero() -> None:
    samples = _samples([(10_000, 0, 0, 50.0), (10_000, 1000, 1000, 60.0), (10_000, 1000, 3000, 58.0),
                        (20_000, 1000, 3000, 80.0), (20_000, 2000, 4000, 91.0), (20_000, 2000, 6000, 90.0)])
    slope = plain_pod_slope(samples)
    assert slope.measured < 0 and slope.mib_per_pod == 0
    (row,), _, figures = rss_rows(Curve(devices=[(500, 10_000), (1000, 20_000)], rss_samples=samples), Targets())
    assert "0 KiB per plain pod (measured -0.77" in row.basis and "noise" in row.basis
    assert figures["rss_plain_pods"]["measured_kib_per_pod"] < 0 and figures["rss_plain_pods"]["mib"] == 0


def test_plain_pods_are_measured_within_one_process_and_its_later_sample_stays_out_of_the_fit() -> None:
    # RSS = 80 + 2.5 KiB/device + 10 KiB/claim + 0.5 KiB per plain pod; every fresh start is off by
    # its own noise (up to 20 MiB, far more than its plain pods cost), a process's later sample by none.
    def truth(d: float, c: float, plain: float) -> float:
        return 80 + 0.0025 * d + 0.01 * c + 0.5 / 1024 * plain

    noise = iter([12.0, -8.0, 20.0, -15.0, 3.0, 18.0, -20.0, 7.0, -4.0])
    samples: list[dict[str, Any]] = []
    for n, prev in ((500, 0), (1000, 500), (2000, 1000)):
        d = 23.2 * n
        for label, c, plain in (("nodes", 4 * prev, 2 * prev), ("filled", 4 * n, 2 * prev), ("pods", 4 * n, 2 * n)):
            offset = next(noise)
            samples.append({"devices": d, "claims": c, "plain_pods": plain, "process": f"{n}-{label}",
                            "rss_mib": truth(d, c, plain) + offset})
            if label == "filled":
                samples.append({"devices": d, "claims": c, "plain_pods": 2 * n, "process": f"{n}-{label}",
                                "fresh": False, "rss_mib": truth(d, c, 2 * n) + offset})
    slope = plain_pod_slope(samples)
    assert slope.within_process and slope.groups == 3 and slope.most_apart == 2000
    assert slope.mib_per_pod * 1024 == pytest.approx(0.5)
    (row,), fit, figures = rss_rows(Curve(devices=list(FLEET), rss_samples=samples), Targets())
    assert fit is not None and fit.samples == 9
    assert "from 3 controllers sampled before and after plain pods reached them" in row.basis
    assert figures["rss_plain_pods"]["mib"] == pytest.approx(0.5 / 1024 * 130_000, abs=0.05)
    # Fresh starts paired the old way would read the noise as plain pods' cost.
    paired = plain_pod_slope([{k: v for k, v in x.items() if k != "process"} for x in samples if x.get("fresh", True)])
    assert abs(paired.measured * 1024 - 0.5) > 3


def test_rss_is_measured_only_where_a_start_held_the_whole_target() -> None:
    small = Targets(nodes=500, devices=11_600, claims=2000, pods=3000)
    (row,), _, _ = rss_rows(Curve(devices=list(FLEET), rss_samples=_samples(RUN1)), small)
    assert row.basis == "measured"
    (row,), _, _ = rss_rows(Curve(devices=list(FLEET), rss_samples=_samples(RUN1)), Targets())
    assert row.basis.startswith("extrapolated")


# --------------------------------------------------------------------------- the fill and the budget


def test_the_fill_shrinks_to_about_a_minute_at_the_rate_the_previous_size_predicts() -> None:
    assert expected_pods_per_s(None, 500) is None
    assert expected_pods_per_s((2000, 0.0), 5000) is None
    # The last run: 7.73, 4.65 and 2.44 pods/s at 500, 1,000 and 2,000 nodes.
    assert expected_pods_per_s((500, 7.73), 1000) == pytest.approx(3.865)
    at_5000 = expected_pods_per_s((2000, 2.44), 5000)
    assert at_5000 == pytest.approx(0.976)
    assert fill_pods(None, most=250, least=60, seconds=60) == 250
    assert fill_pods(3.865, most=250, least=60, seconds=60) == 232
    assert fill_pods(expected_pods_per_s((1000, 4.65), 2000), most=250, least=60, seconds=60) == 140
    assert fill_pods(at_5000, most=250, least=60, seconds=60) == 60
    assert fill_pods(20.0, most=250, least=60, seconds=60) == 250


def test_the_fill_deadline_follows_the_expected_rate_with_room_to_spare() -> None:
    assert fill_deadline_s(250, None) == pytest.approx(120 + 3 * 25)
    at_5000 = fill_deadline_s(60, 0.976)
    assert at_5000 == pytest.approx(120 + 3 * 60 / 0.976)
    # At 5,000 nodes the last run's scheduler bound 224 pods within 145 s: 60 take under 40 s.
    assert at_5000 / 5 > 60 / (224 / 145)
    # The fixed 120 + pods/10 s gave 250 pods 145 s: what failed that run.
    assert fill_deadline_s(250, 0.976) > 250 / (224 / 145)


def test_a_sizes_time_is_estimated_from_the_last_size_scaled_by_the_nodes_it_adds() -> None:
    ran = [(500, 122.3), (1000, 180.2), (2000, 357.5)]
    assert size_seconds(500, []) is None
    assert size_seconds(1000, ran[:1]) == pytest.approx(2 * 122.3)
    assert size_seconds(2000, ran[:2]) == pytest.approx(2 * 180.2)
    # 3,000 nodes added after 1,000: x3, where the nodes alone say x2.5.
    assert size_seconds(5000, ran) == pytest.approx(3 * 357.5)
    assert size_seconds(2000, [(2000, 300.0)]) == pytest.approx(300.0)


# --------------------------------------------------------------------------- the backlog row


def test_the_backlog_row_is_about_10000_claims_measured_or_said_to_be_projected() -> None:
    full = backlog_outcome(10_000, 0.0, [i / 200 for i in range(1, 10_001)], window_s=60.0, waited_s=75.0)
    row = backlog_row(full, 10_000, "(at 5,000 nodes)")
    assert row.value == pytest.approx(50.0) and row.basis == "measured (at 5,000 nodes)"
    assert row.what == "backlog of 10,000 pending claims created at once: all explained"
    # The last run's 1,000 at 2,000 nodes is no measurement of 10,000.
    small = backlog_outcome(1000, 0.0, [i * 16.031 / 1000 for i in range(1, 1001)], window_s=60.0, waited_s=16.0)
    row = backlog_row(small, 10_000)
    assert row.what.startswith("backlog of 10,000") and row.value == pytest.approx(160.31)
    assert row.basis.startswith("projected from a backlog of 1,000 at its 62.4 claims/s")


def test_where_the_backlog_ran_says_when_it_was_a_larger_cluster_or_a_projection() -> None:
    assert where_backlog_ran({"claims": 10_000}, 5000, 10_000) == "(at 5,000 nodes)"
    after = where_backlog_ran({"claims": 10_000, "after_failed_size": 5000,
                               "cluster": {"nodes": 5000, "devices": 116_000, "claims": 19_690}}, 2000, 10_000)
    assert "after the 5,000-node size failed" in after and "at least 5,000 GPU nodes, 116,000 devices" in after
    assert "larger than the 2,000-node size, the conservative reading" in after
    assert "no time was left in the budget" in where_backlog_ran({"claims": 1000}, 2000, 10_000)
    assert "failed: watching claims failed" in where_backlog_ran({"claims": 1000}, 2000, 10_000, "watching claims failed")
    out, _ = rows(Curve(), Targets(), throughput=None, apf=None, backlog_where=after,
                  backlog=backlog_outcome(10_000, 0.0, [1.0] * 10_000, window_s=60.0, waited_s=75.0))
    assert out[0].basis == f"measured {after}"


# --------------------------------------------------------------------------- pending pods: writes, explain -A, a new selector

def _requests(*rows: tuple[str, str, str, str, str, int]) -> str:
    """apiserver_request_total as the API server writes it: (group, resource, subresource, verb, code, count)."""
    return "".join(
        f'apiserver_request_total{{code="{code}",component="apiserver",dry_run="",group="{group}",resource="{res}",'
        f'scope="resource",subresource="{sub}",verb="{verb}",version="v1"}} {n}\n'
        for group, res, sub, verb, code, n in rows)


EVENTS_V1, RESOURCE_V1, LEASES_V1 = "events.k8s.io", "resource.k8s.io", "coordination.k8s.io"
WRITES_BEFORE = _requests((EVENTS_V1, "events", "", "POST", "201", 100),
                          (RESOURCE_V1, "resourceclaims", "", "PATCH", "200", 50),
                          (RESOURCE_V1, "resourceclaims", "", "LIST", "200", 7),
                          (LEASES_V1, "leases", "", "PUT", "200", 900))
WRITES_AFTER = _requests((EVENTS_V1, "events", "", "POST", "201", 20_100),
                         (EVENTS_V1, "events", "", "POST", "409", 3),
                         ("", "events", "", "POST", "201", 2),
                         (RESOURCE_V1, "resourceclaims", "", "PATCH", "200", 10_050),
                         (RESOURCE_V1, "resourceclaims", "status", "PUT", "200", 4),
                         (RESOURCE_V1, "resourceclaims", "", "LIST", "200", 9),
                         (LEASES_V1, "leases", "", "PUT", "200", 1900))


def test_the_api_servers_count_of_writes_to_claims_and_events_whatever_their_outcome() -> None:
    before, after = api_writes(WRITES_BEFORE), api_writes(WRITES_AFTER)
    assert before == {"events POST 201": 100, "resourceclaims PATCH 200": 50}
    # Both API groups' Events, refused writes too, a subresource named; reads and leases left out.
    assert writes_since(before, after) == {"events POST 201": 20_002, "events POST 409": 3,
                                           "resourceclaims PATCH 200": 10_000, "resourceclaims/status PUT 200": 4}


def _run(claims: int, explained: int, writes: dict[str, int], **more: Any) -> dict[str, Any]:
    return {"claims": claims, "explained": explained, "writes": writes, **more}


def test_pod_events_on_against_off_is_a_factor_of_the_same_claims_writes() -> None:
    on = _run(10_000, 10_000, {"events POST 201": 11_500, "resourceclaims PATCH 200": 10_000},
              told={"Pod": 10_000, "ResourceClaim": 1500})
    off = _run(10_000, 10_000, {"events POST 201": 1_400, "resourceclaims PATCH 200": 10_000}, explained_before_it=0)
    (row,) = explained_backlog_rows({"nodes": 5000, "claims": 10_000, "on": on, "off": off}, 10_000)
    assert row.what == "API writes for 10,000 pending pods, pod Events on ÷ off"
    assert row.value == pytest.approx(21_500 / 11_400) and row.limit == 2.1 and not row.higher_is_better
    assert row.basis.startswith("measured at 5,000 nodes: 21,500 writes with pod Events (2.15 per pending pod), "
                                "11,400 without (1.14 per pending pod)")
    assert row.basis.endswith("every waiting pod told")
    assert "10,000 about pods" in row.note and "resourceclaims PATCH 200: 10,000" in row.note
    # Pods left untold are the loss the row must show: not met, whatever the factor.
    (untold,) = explained_backlog_rows({"nodes": 5000, "claims": 10_000, "on": {**on, "told": {"Pod": 772}},
                                        "off": off}, 10_000)
    assert math.isnan(untold.value) and untold.basis.startswith("not met: 772 of 10,000 waiting pods were told")
    # Runs that did not explain the same claims are not compared.
    (short,) = explained_backlog_rows({"nodes": 5000, "claims": 10_000, "on": on,
                                       "off": {**off, "explained": 9000}}, 10_000)
    assert math.isnan(short.value) and "without: 9,000 of 10,000 explained" in short.basis
    (stale,) = explained_backlog_rows({"nodes": 5000, "claims": 10_000, "on": on,
                                       "off": {**off, "explained_before_it": 12}}, 10_000)
    assert math.isnan(stale.value) and "12 still explained" in stale.basis


LISTING = """\
3 pending claim(s) in all namespaces, 2 reason(s):

Unsatisfiable (2): cannot allocate: request gpu: 0 candidates, need 1
  ns/a
  ns/b

Unsatisfiable (1): cannot allocate: request gpu: 8 candidates, need 9
  ns/c
"""


def test_explain_all_is_timed_from_process_start_and_says_what_it_listed() -> None:
    listing = explain_listing(LISTING)
    assert listing == {"pending": 3, "reasons": 2, "listed": 3, "lines": 8}
    with pytest.raises(ValueError, match="not a listing"):
        explain_listing("no pending claims in all namespaces\n")
    doc = {"seconds": 2.2, "samples": [3.1, 2.2, 2.0], "cpu_s": [1.5, 1.4, 1.4], **listing}
    (row,) = explained_backlog_rows({"nodes": 2000, "claims": 3, "explain_all": doc}, 10_000)
    assert row.what == "explain -A with 10,000 pending claims: the answer" and row.value == 2.2 and row.limit == 5.0
    assert row.basis.startswith("measured at 2,000 nodes with 3 pending claims, not 10,000: "
                                "`python -m dra_driver explain -A`, process start to exit, the median of 3 runs "
                                "(3.10, 2.20, 2.00 s, of it its own CPU 1.50, 1.40, 1.40 s); it listed 3 pending claims "
                                "in 2 reason(s)")


def test_a_new_selector_costs_every_evaluation_of_its_claim() -> None:
    assert cold_selector_ms({"sum_s": 0.09, "evaluations": 2}) == pytest.approx(90.0)
    assert cold_selector_ms({}) is None and cold_selector_ms({"sum_s": 0.0, "evaluations": 0}) is None
    out, _ = rows(Curve(cold_selector_ms=[(500.0, 8.0), (1000.0, 16.0)]), Targets(), throughput=None, backlog=None,
                  apf=None)
    (row,) = out
    assert row.what == "explain one claim whose selector nothing has evaluated yet (a new literal) at 5,000 nodes"
    assert row.value == pytest.approx(80.0) and row.limit == 100.0 and "extrapolated" in row.basis
