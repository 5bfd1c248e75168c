"""The scale bench's arithmetic, apart from the cluster: metrics text, fits, extrapolation, the
scheduler's fill and the time budget, log checks, rows.

Everything here is a pure function of measured numbers (``unit_tests/e2e_tools/bench/test_scale_rows.py``),
so a reader can check how each row of ``e2e/bench/results/scale.json`` follows from the figures beside it.

A row is *measured* when the bench ran the size the row names, and *extrapolated* otherwise: a
straight line through the sizes that ran (least squares; the costs grow linearly with the cluster,
which the curve itself shows), or for the controller's RSS a slope per plain pod measured where
only plain pods changed plus a fit of memory over devices and claims.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# --------------------------------------------------------------------------- Prometheus text

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples(text: str, name: str) -> Iterator[tuple[dict[str, str], float]]:
    """The samples of ``name``: labels and value (a value that is not a number is skipped)."""
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None or m.group(1) != name:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        yield dict(_LABEL.findall(m.group(2) or "")), value


def metric_value(text: str, name: str, labels: Mapping[str, str] | None = None) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (0.0 when there is none)."""
    want = dict(labels or {})
    return sum(v for have, v in samples(text, name) if all(have.get(k) == x for k, x in want.items()))


@dataclass(frozen=True)
class HistogramReading:
    count: float
    sum: float


def histogram(text: str, name: str) -> HistogramReading:
    return HistogramReading(metric_value(text, f"{name}_count"), metric_value(text, f"{name}_sum"))


def mean_since(before: HistogramReading, after: HistogramReading) -> float | None:
    """Mean duration of the observations between two readings (exact for one observation)."""
    n = after.count - before.count
    return (after.sum - before.sum) / n if n > 0 else None


# --------------------------------------------------------------------------- the API server's count of writes

WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE"})
EXPLAINING_RESOURCES = frozenset({"resourceclaims", "events"})
"""What explaining pending claims writes: the claims' annotations, and Events (both API groups)."""


def api_writes(text: str, resources: frozenset[str] = EXPLAINING_RESOURCES) -> dict[str, float]:
    """The API server's own count of write requests (``apiserver_request_total``) to ``resources``,
    by ``"resource[/subresource] VERB code"``, whatever their outcome: a refused write was still
    sent. Counted by the server, not by the client that sends them."""
    out: dict[str, float] = {}
    for labels, value in samples(text, "apiserver_request_total"):
        if labels.get("resource") not in resources or labels.get("verb") not in WRITE_VERBS:
            continue
        what = labels["resource"] + (f"/{labels['subresource']}" if labels.get("subresource") else "")
        key = f"{what} {labels['verb']} {labels.get('code', '')}"
        out[key] = out.get(key, 0.0) + value
    return out


def writes_since(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, int]:
    """What the counts of :func:`api_writes` grew by, the counts that did not grow left out."""
    grown = {k: round(v - before.get(k, 0.0)) for k, v in after.items()}
    return {k: v for k, v in sorted(grown.items()) if v > 0}


# --------------------------------------------------------------------------- explain -A

_LISTING_HEAD = re.compile(r"^(\d+) pending claim\(s\) in (.+), (\d+) reason\(s\):$")


def explain_listing(stdout: str) -> dict[str, int]:
    """What ``explain -n``/``-A`` printed: the pending claims and reasons its first line counts, and
    the claims it listed (lines indented by two spaces). ValueError for output of another shape."""
    lines = stdout.splitlines()
    head = _LISTING_HEAD.match(lines[0]) if lines else None
    if head is None:
        raise ValueError(f"not a listing of pending claims: {stdout[:200]!r}")
    return {"pending": int(head.group(1)), "reasons": int(head.group(3)),
            "listed": sum(1 for line in lines if line.startswith("  ")), "lines": len(lines)}


# --------------------------------------------------------------------------- fits


@dataclass(frozen=True)
class Fit:
    """``target ≈ intercept + Σ slope[v] · v``, by least squares over ``samples`` points."""

    intercept: float
    slopes: dict[str, float]
    samples: int
    max_residual: float

    def predict(self, point: Mapping[str, float]) -> float:
        return self.intercept + sum(s * float(point[v]) for v, s in self.slopes.items())

    def document(self) -> dict[str, Any]:
        return {"intercept": round(self.intercept, 4), "slopes": {k: float(f"{v:.6g}") for k, v in self.slopes.items()},
                "samples": self.samples, "max_residual": round(self.max_residual, 3)}


def fit_linear(samples: Sequence[Mapping[str, float]], variables: Sequence[str], target: str) -> Fit:
    """Least-squares fit of ``target`` over ``variables`` with an intercept.

    Raises ValueError when the samples cannot tell the variables apart (fewer samples than
    unknowns, or variables that always move together): a slope read off such data would be a guess.
    """
    import numpy as np

    unknowns = len(variables) + 1
    if len(samples) < unknowns:
        raise ValueError(f"fit of {target}: {len(samples)} samples for {unknowns} unknowns")
    a = np.array([[1.0, *(float(s[v]) for v in variables)] for s in samples])
    b = np.array([float(s[target]) for s in samples])
    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1.0
    if np.linalg.matrix_rank(a / scale) < unknowns:
        raise ValueError(f"fit of {target}: the samples do not vary {', '.join(variables)} independently")
    coef, *_ = np.linalg.lstsq(a, b, rcond=None)
    residual = float(np.abs(a @ coef - b).max())
    return Fit(float(coef[0]), {v: float(c) for v, c in zip(variables, coef[1:], strict=True)}, len(samples), residual)


@dataclass(frozen=True)
class Projection:
    value: float
    measured: bool
    basis: str
    """How the value was obtained, for the row's text: "measured at 5,000 nodes", "extrapolated ..."."""


def _n(x: float) -> str:
    return f"{x:,.0f}"


def project(points: Sequence[tuple[float, float]], x: float, what: str = "nodes") -> Projection:
    """The value at ``x``: measured when a point is there, else a line through the points.

    With one point the line goes through the origin (cost proportional to size); with more it is
    the least-squares line. The basis names which.
    """
    pts = sorted((float(px), float(py)) for px, py in points)
    if not pts:
        raise ValueError("project: no measured points")
    for px, py in pts:
        if px == x:
            return Projection(py, True, f"measured at {_n(x)} {what}")
    span = f"{_n(pts[0][0])}" + (f" to {_n(pts[-1][0])}" if len(pts) > 1 else "")
    if len(pts) == 1:
        px, py = pts[0]
        return Projection(py * x / px if px else py, False,
                          f"extrapolated to {_n(x)} {what}, proportionally from {span}")
    fit = fit_linear([{"x": px, "y": py} for px, py in pts], ("x",), "y")
    return Projection(fit.predict({"x": x}), False, f"extrapolated to {_n(x)} {what} from {span} (linear fit)")


# --------------------------------------------------------------------------- backlog and rates


@dataclass(frozen=True)
class Backlog:
    claims: int
    explained: int
    """Claims that carried an explanation by the end of the wait."""
    within_window: int
    """Claims explained within ``window_s`` of the first create."""
    window_s: float
    all_explained_s: float | None
    """First create -> last claim explained; None when some were never explained."""
    claims_per_s: float


def backlog_outcome(claims: int, first_create: float, explained_at: Iterable[float], window_s: float,
                    waited_s: float) -> Backlog:
    """What a backlog run shows: ``explained_at`` are the times (same clock as ``first_create``)
    at which each claim first carried its explanation; the wait ended ``waited_s`` after the
    first create."""
    times = sorted(t - first_create for t in explained_at)
    within = sum(1 for t in times if t <= window_s)
    done = len(times) >= claims > 0
    last = times[-1] if done else None
    span = last if last is not None else waited_s
    rate = len(times) / span if span > 0 else 0.0
    return Backlog(claims, len(times), within, window_s, last, rate)


def backlog_seconds(b: Backlog) -> tuple[float, bool]:
    """The backlog row's value: the time to explain them all, or (not all explained) that time
    projected from the rate seen; the flag says which."""
    if b.all_explained_s is not None:
        return b.all_explained_s, True
    return (b.claims / b.claims_per_s if b.claims_per_s > 0 else float("inf")), False


# --------------------------------------------------------------------------- the scheduler's fill, the budget


def expected_pods_per_s(previous: tuple[float, float] | None, nodes: float) -> float | None:
    """The kube-scheduler's pods/s expected at ``nodes``, from (nodes, pods/s) measured at the
    previous size: per pod it filters and scores the nodes, so its rate falls in proportion to them.
    On this machine that is the cautious side: 3,900, 4,700 and 4,900 pod·nodes/s at 500, 1,000 and
    2,000 nodes, over 7,000 at 5,000 (224 pods bound within 145 s). None at the first size."""
    if previous is None or previous[1] <= 0:
        return None
    prev_nodes, prev_rate = previous
    return prev_rate * prev_nodes / nodes


def fill_pods(expected: float | None, *, most: int, least: int, seconds: float) -> int:
    """How many pods a size times through the kube-scheduler: about ``seconds`` of binding at the
    expected rate, at least ``least`` (a rate needs some pods) and at most ``most`` (also the count
    at the first size, where no rate is known). At 5,000 nodes the scheduler binds about 1 pod/s on
    two cores: a fixed 250 would take most of the budget and the rest of the claims are written
    anyway (the cluster reaches the same 4 allocated claims per node)."""
    if expected is None:
        return most
    return max(least, min(most, round(expected * seconds)))


FIRST_FILL_RATE = 10.0
"""Pods/s assumed for the fill's deadline at the first size (the scheduler binds under 10 at 500 nodes)."""


def fill_deadline_s(pods: int, expected: float | None) -> float:
    """How long the fill may take before its size fails: 2 minutes plus three times the expected
    binding time. The slack is generous on purpose: a fill that runs out of time loses its whole
    size, whereas a slow one costs only the extra seconds."""
    return 120.0 + 3.0 * pods / (expected or FIRST_FILL_RATE)


def size_seconds(next_nodes: float, ran: Sequence[tuple[float, float]]) -> float | None:
    """The expected seconds of the next size from the sizes that ran, (nodes, seconds) in order:
    the last size's time scaled by the larger of the growth in nodes (fresh controllers' syncs,
    probes) and the growth in nodes added (growing nodes and slices, writing claims, plain pods).
    From 2,000 to 5,000 nodes that is x3, not the x2.5 of the nodes alone. None when none ran."""
    if not ran:
        return None
    last_nodes, last_s = ran[-1]
    before = ran[-2][0] if len(ran) > 1 else 0.0
    added = (next_nodes - last_nodes) / (last_nodes - before) if last_nodes > before else 1.0
    return last_s * max(1.0, next_nodes / last_nodes, added)


# --------------------------------------------------------------------------- logs

_THROTTLED = ("429", "TooManyRequests", "Too Many Requests", "too many requests")
_SERIOUS = ("error", "critical", "exception", "fatal")


def log_problems(lines: Iterable[str]) -> list[str]:
    """Lines of a JSON log that a person would have to act on: errors, tracebacks, and any warning
    that shows a 429 (a throttled client must wait and retry, not complain)."""
    problems = []
    for line in lines:
        text = line.strip()
        if not text:
            continue
        try:
            record = json.loads(text)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            if "Traceback" in text or "Error" in text:
                problems.append(text)
            continue
        level = str(record.get("level", "")).lower()
        if level in _SERIOUS or (level == "warning" and any(t in text for t in _THROTTLED)):
            problems.append(text)
    return problems


# --------------------------------------------------------------------------- rows


@dataclass(frozen=True)
class Row:
    what: str
    value: float
    limit: float
    unit: str
    basis: str
    higher_is_better: bool = False
    note: str = ""


@dataclass
class Targets:
    """The cluster the issue's rows are stated for."""

    nodes: int = 5000
    devices: int = 40_000
    claims: int = 20_000
    pods: int = 150_000
    backlog: int = 10_000
    fleet_claims: int = 30_000
    """Claims allocated for the fleet views' rows (issue 54)."""

    @property
    def plain_pods(self) -> int:
        """The pods that hold no claim: each claim is held by one pod, the rest need no device."""
        return self.pods - self.claims


@dataclass
class Curve:
    """Per-size measurements, as the bench collects them (each list holds (nodes, value))."""

    first_claim_s: list[tuple[float, float]] = field(default_factory=list)
    first_claim_cache_mib: list[tuple[float, float]] = field(default_factory=list)
    fit_p50_ms: list[tuple[float, float]] = field(default_factory=list)
    explain_p50_ms: list[tuple[float, float]] = field(default_factory=list)
    explain_extra_mib: list[tuple[float, float]] = field(default_factory=list)
    cold_selector_ms: list[tuple[float, float]] = field(default_factory=list)
    """The controller's time for a claim whose selector it had never evaluated (a new literal)."""
    startup_s: list[tuple[float, float]] = field(default_factory=list)
    devices: list[tuple[float, float]] = field(default_factory=list)
    rss_samples: list[dict[str, float]] = field(default_factory=list)
    """Controller VmRSS (``rss_mib``) with all informers synced, at (``devices``, ``claims``,
    ``plain_pods``): the pods that hold a claim are counted by ``claims``."""


RSS_VARIABLES = ("devices", "claims")


@dataclass(frozen=True)
class PodSlope:
    """RSS per plain pod, from samples that differ only in plain pods."""

    mib_per_pod: float
    """The slope used: ``measured``, or 0 where that came out negative."""
    measured: float
    stderr: float | None
    """Standard error of ``measured`` from the scatter of the pairs (None with too few)."""
    groups: int
    most_apart: float
    """The largest difference in plain pods within one group of samples."""
    within_process: bool = False
    """Whether the groups are samples of one process (else: fresh starts of the same state)."""

    def document(self) -> dict[str, Any]:
        return {"kib_per_pod": round(self.mib_per_pod * 1024, 3), "measured_kib_per_pod": round(self.measured * 1024, 3),
                "stderr_kib_per_pod": round(self.stderr * 1024, 3) if self.stderr is not None else None,
                "groups": self.groups, "most_plain_pods_apart": round(self.most_apart),
                "within_process": self.within_process}


def plain_pod_slope(samples: Sequence[Mapping[str, Any]]) -> PodSlope:
    """RSS per plain pod, measured where nothing else moved: the samples of one controller process
    (``process``) before and after plain pods reached it, or, in results written before samples
    named their process, each size's "-filled" and "-pods" fresh starts (same devices and claims);
    grouped, and the least-squares slope of RSS over plain pods within the groups, pooled. A fit over
    devices, claims and pods together cannot tell claims' pods from plain ones (they grow together
    from size to size) and gave plain pods 4.7 KiB each from noise; the controller keeps nothing of
    a plain pod (``dra_driver.controller.views.pod_view`` returns None), so a negative slope is noise
    too and counts as 0. Raises ValueError when no two samples differ only in plain pods."""
    groups: dict[Any, list[tuple[float, float]]] = {}
    for s in samples:
        group = s["process"] if "process" in s else (float(s["devices"]), float(s["claims"]))
        groups.setdefault(group, []).append((float(s["plain_pods"]), float(s["rss_mib"])))
    # Each group's points about its own means: the pooled slope is fitted on those.
    centred: list[list[tuple[float, float]]] = []
    apart = 0.0
    for points in groups.values():
        pods = [p for p, _ in points]
        if len(set(pods)) < 2:
            continue
        mp, mr = sum(pods) / len(points), sum(r for _, r in points) / len(points)
        centred.append([(p - mp, r - mr) for p, r in points])
        apart = max(apart, max(pods) - min(pods))
    if not centred:
        raise ValueError("no two RSS samples differ only in plain pods")
    pairs = [pair for points in centred for pair in points]
    sxx = sum(p * p for p, _ in pairs)
    slope = sum(p * r for p, r in pairs) / sxx
    free = len(pairs) - len(centred) - 1
    stderr = (sum((r - slope * p) ** 2 for p, r in pairs) / free / sxx) ** 0.5 if free > 0 else None
    within = any("process" in s for s in samples)
    return PodSlope(max(slope, 0.0), slope, stderr, len(centred), apart, within)


def rss_rows(curve: Curve, targets: Targets) -> tuple[list[Row], Fit | None, dict[str, Any]]:
    """The controller-RSS row: RSS per plain pod measured from the samples that differ only in
    them (:func:`plain_pod_slope`), and a fit of the rest over devices and claims (a claim's pod
    moves with its claim, so its cost is in the claim's slope).

    It is evaluated at the bench's own fleet at ``targets.nodes`` (its dynamic-MIG nodes included,
    so more devices than ``targets.devices``: the conservative reading) with ``targets.claims``
    claims and ``targets.plain_pods`` plain pods. Also returned: the value at exactly ``targets.devices``.
    """
    try:
        pods = plain_pod_slope(curve.rss_samples)
        fresh = [s for s in curve.rss_samples if s.get("fresh", True)]
        fit = fit_linear([{**s, "rss_less_plain": s["rss_mib"] - pods.mib_per_pod * s["plain_pods"]}
                          for s in fresh], RSS_VARIABLES, "rss_less_plain")
    except ValueError as exc:
        return [Row("controller RSS, informers synced", float("nan"), 512, "MiB", f"not computed: {exc}")], None, {}
    fleet_devices = project(curve.devices, targets.nodes).value
    of_plain = pods.mib_per_pod * targets.plain_pods
    at_fleet = fit.predict({"devices": fleet_devices, "claims": targets.claims}) + of_plain
    at_row = fit.predict({"devices": targets.devices, "claims": targets.claims}) + of_plain
    most = {k: max(s[k] for s in curve.rss_samples) for k in ("devices", "claims", "plain_pods")}
    measured = any(s["devices"] >= fleet_devices and s["claims"] >= targets.claims
                   and s["plain_pods"] >= targets.plain_pods for s in fresh)
    spread = f" ± {pods.stderr * 1024:.2f}" if pods.stderr is not None else ""
    pairs = ("controllers sampled before and after plain pods reached them" if pods.within_process else
             "pairs of starts that differ only in plain pods")
    per_pod = (f"{pods.measured * 1024:.2f}{spread} KiB per plain pod" if pods.measured >= 0 else
               f"0 KiB per plain pod (measured {pods.measured * 1024:.2f}{spread}: noise)")
    basis = ("measured" if measured else
             f"extrapolated: a fit over devices and claims from {fit.samples} fresh starts up to "
             f"{_n(most['devices'])} devices and {_n(most['claims'])} claims, plus {per_pod} from "
             f"{pods.groups} {pairs} (up to {_n(pods.most_apart)} apart)")
    what = (f"controller RSS, informers synced, at {_n(targets.nodes)} nodes ({_n(fleet_devices)} devices with the "
            f"dynamic-MIG nodes), {_n(targets.claims)} claims, {_n(targets.pods)} pods")
    figures = {"at_fleet_devices": round(fleet_devices), "rss_mib_at_fleet": round(at_fleet, 1),
               f"rss_mib_at_{targets.devices}_devices": round(at_row, 1),
               "rss_plain_pods": {**pods.document(), "plain_pods": targets.plain_pods, "mib": round(of_plain, 1)}}
    return [Row(what, at_fleet, 512, "MiB", basis)], fit, figures


def backlog_row(b: Backlog, target: int, where: str = "") -> Row:
    """The backlog row, always about ``target`` claims created at once: measured when the backlog
    run was that large (projected from its rate when not all were explained in the wait), else
    projected at the smaller backlog's rate (which a larger backlog need not keep up)."""
    if b.claims >= target:
        seconds, complete = backlog_seconds(b)
        basis = ("measured" if complete else
                 f"projected: {b.explained} of {b.claims} explained, {b.within_window} within "
                 f"{b.window_s:.0f} s, at {b.claims_per_s:.1f} claims/s")
    else:
        seconds = target / b.claims_per_s if b.claims_per_s > 0 else float("inf")
        basis = f"projected from a backlog of {_n(b.claims)} at its {b.claims_per_s:.1f} claims/s"
    return Row(f"backlog of {_n(target)} pending claims created at once: all explained", seconds, 60.0, "s",
               f"{basis} {where}" if where else basis)


POD_EVENTS_LIMIT = 2.1
"""Pod Events on ÷ off: one write per pending pod on top of the claims' explanations, which under a
backlog are one patch per claim: 2 against 1. The claims' own Events are best effort (dropped
when the budget has no token), and how many find one varies from run to run: 0.1 is left for
that (the runs, and the limits before this one, in docs/scale.md)."""


def pod_events_row(on: Mapping[str, Any], off: Mapping[str, Any], target: int, where: str) -> Row:
    """Pod Events on against off: the API writes of two runs of the same ``claims`` pending claims,
    each with its pod (documents with ``claims`` and ``writes``, :func:`writes_since`), and the
    Events each controller wrote about pods and claims (``told``, when counted). The row is the
    factor, on ÷ off, and counts only when every pending pod was told: a factor bought by pods never
    told would be the loss the row must show, not economy."""
    label = f"API writes for {_n(target)} pending pods, pod Events on ÷ off"
    w_on, w_off = sum(on["writes"].values()), sum(off["writes"].values())
    factor = w_on / w_off if w_off else float("inf")
    claims = int(on["claims"])
    told = on.get("told") or {}
    unequal = [f"{name}: {run['explained']:,} of {int(run['claims']):,} explained" for name, run in
               (("with pod Events", on), ("without", off)) if int(run["explained"]) < int(run["claims"])]
    if off.get("explained_before_it"):
        unequal.append(f"{off['explained_before_it']:,} still explained when the run without pod Events began")
    if unequal:
        return Row(label, float("nan"), POD_EVENTS_LIMIT, "x",
                   f"not computed, the two runs did not explain the same claims: {'; '.join(unequal)}")

    def per(writes: float, n: Any) -> str:
        return f"{writes / int(n):.2f} per pending pod" if int(n) else "no pending pod"

    basis = (f"{where}: {w_on:,.0f} writes with pod Events ({per(w_on, claims)}), {w_off:,.0f} without "
             f"({per(w_off, off['claims'])}), counted by the API server (apiserver_request_total: events, resourceclaims)")
    note = (f"with pod Events: {_writes_text(on['writes'])}; without: {_writes_text(off['writes'])}"
            + (f"; Events written with pod Events on: {told.get('Pod', 0):,} about pods, "
               f"{told.get('ResourceClaim', 0):,} about claims" if told else ""))
    if told.get("Pod", 0) < claims:
        return Row(label, float("nan"), POD_EVENTS_LIMIT, "x",
                   f"not met: {told.get('Pod', 0):,} of {claims:,} waiting pods were told ({factor:.2f}x); {basis}",
                   note=note)
    return Row(label, factor, POD_EVENTS_LIMIT, "x", f"{basis}; every waiting pod told", note=note)


def _writes_text(writes: Mapping[str, int]) -> str:
    return ", ".join(f"{k}: {v:,}" for k, v in writes.items()) or "none"


def explain_all_row(doc: Mapping[str, Any], target: int, where: str) -> Row:
    """``explain -A`` over the explained backlog: the median of its runs, each from process start
    to exit."""
    runs = ", ".join(f"{s:.2f}" for s in doc["samples"])
    cpu = f", of it its own CPU {', '.join(f'{s:.2f}' for s in doc['cpu_s'])} s" if doc.get("cpu_s") else ""
    basis = (f"{where}: `python -m dra_driver explain -A`, process start to exit, the median of "
             f"{len(doc['samples'])} runs ({runs} s{cpu}); it listed {doc['listed']:,} pending claims in "
             f"{doc['reasons']} reason(s), read from the annotations, nothing resolved")
    return Row(f"explain -A with {_n(target)} pending claims: the answer", float(doc["seconds"]), 5.0, "s", basis)


def where_backlog_ran(at_once: Mapping[str, Any], largest: int, target: int, failed: str | None = None) -> str:
    """Where the backlog row's run was, for its basis: ``at_once`` is the run's document (with
    ``after_failed_size`` and ``cluster`` when it ran after a size failed), ``largest`` the largest
    size completed; ``failed``: why a backlog of ``target`` that was started did not finish."""
    if int(at_once.get("claims", 0)) < target:
        why = (f"the backlog of {_n(target)} failed: {failed[:200]}" if failed else
               f"no time was left in the budget for a backlog of {_n(target)}")
        return f"(at {_n(largest)} nodes; {why})"
    failed = at_once.get("after_failed_size")
    if failed:
        cluster = at_once.get("cluster") or {}
        return (f"(run after the {_n(failed)}-node size failed, on the cluster it left: at least "
                f"{_n(cluster.get('nodes', largest))} GPU nodes, {_n(cluster.get('devices', 0))} devices, "
                f"{_n(cluster.get('claims', 0))} claims allocated; larger than the {_n(largest)}-node size, "
                "the conservative reading)")
    return f"(at {_n(largest)} nodes)"


def cold_selector_ms(probe: Mapping[str, Any]) -> float | None:
    """The new-selector probe's time: every evaluation of its claim, summed (one, unless the pod's
    event came late), None when it did not run."""
    total = probe.get("sum_s")
    return float(total) * 1000 if total is not None and probe.get("evaluations") else None


def explained_backlog_rows(doc: Mapping[str, Any], target: int) -> list[Row]:
    """The rows read off the backlog of ``target`` claims once explained (``doc``: ``nodes``,
    ``claims``, and what ran: ``explain_all``, and ``on`` and ``off``, the writes with pod Events
    and without): ``explain -A`` over it, and the pod Events' writes."""
    where = f"measured at {_n(doc['nodes'])} nodes"
    if int(doc["claims"]) < target:
        where += f" with {_n(doc['claims'])} pending claims, not {_n(target)}"
    out = []
    if doc.get("explain_all"):
        out.append(explain_all_row(doc["explain_all"], target, where))
    if doc.get("on") and doc.get("off"):
        out.append(pod_events_row(doc["on"], doc["off"], target, where))
    return out


def fleet_view_rows(doc: Mapping[str, Any], targets: Targets) -> list[Row]:
    """The fleet views' rows (``doc``: the cluster they ran on, and per view its runs, each from
    process start to exit, with its own CPU and peak RSS)."""
    where = (f"measured at {_n(doc['nodes'])} GPU nodes (+{_n(doc.get('mig_nodes', 0))} dynamic-MIG), "
             f"{_n(doc['devices'])} devices, {_n(doc['claims_allocated'])} claims allocated, {_n(doc['pods'])} pods")
    out = []
    for name, view in (doc.get("views") or {}).items():
        runs = ", ".join(f"{t:.2f}" for t in view["samples"])
        cpu = ", ".join(f"{t:.2f}" for t in view["cpu_s"])
        basis = (f"{where}: `python -m dra_driver {name}` (what `kubectl dra` runs), process start to exit, the "
                 f"median of {len(view['samples'])} runs ({runs} s, of it its own CPU {cpu} s); peak RSS "
                 f"{view['peak_rss_mib']:.0f} MiB; it printed {_n(view['lines'])} lines")
        out.append(Row(f"kubectl dra {name} on {_n(targets.nodes)} nodes, {_n(targets.devices)} GPUs, "
                       f"{_n(targets.fleet_claims)} claims allocated", float(view["seconds"]), 3.0, "s", basis,
                       note=f"peak RSS {view['peak_rss_mib']:.0f} MiB"))
    return out


def rows(curve: Curve, targets: Targets, *, throughput: tuple[float, float, int] | None,
         backlog: Backlog | None, apf: Mapping[str, Any] | None, backlog_where: str = "",
         explained_backlog: Mapping[str, Any] | None = None,
         fleet_views: Mapping[str, Any] | None = None) -> tuple[list[Row], dict[str, Any]]:
    """Every row of the issue, with its basis; and the fit figures behind them.

    ``throughput``: (our claims/s, the scheduler's pods/s, nodes) at the largest size run.
    ``backlog_where``: where the backlog ran, for its row's basis (:func:`where_backlog_ran`).
    ``apf``: ``claims``, ``explained``, ``problems`` (log lines), ``rejected`` (429s the API server
    answered the controller's flow). ``explained_backlog``: see :func:`explained_backlog_rows`;
    ``fleet_views``: :func:`fleet_view_rows`.
    """
    out: list[Row] = []
    figures: dict[str, Any] = {}
    n = targets.nodes
    if throughput is not None:
        ours, theirs, at = throughput
        ratio = ours / theirs if theirs > 0 else float("nan")
        out.append(Row("resolution throughput, our claims/s ÷ kube-scheduler pods/s", ratio, 1.0, "x",
                       f"measured at {_n(at)} nodes, same cluster, same run", higher_is_better=True,
                       note=f"ours {ours:.1f} claims explained/s, scheduler {theirs:.1f} pods bound/s"))
    for series, what, limit, unit in (
        (curve.first_claim_s, "first claim after start", 1.0, "s"),
        (curve.first_claim_cache_mib, "first claim after start: the caches it builds (RSS growth)", 100.0, "MiB"),
        (curve.fit_p50_ms, f"resolve one fitting claim, {_n(targets.claims)} claims allocated, p50", 5.0, "ms"),
        (curve.explain_p50_ms, "explain one unsatisfiable claim, p50", 100.0, "ms"),
        (curve.explain_extra_mib, "explain one unsatisfiable claim: extra memory (first-claim peak RSS growth, "
                                  "unsatisfiable less fitting)", 10.0, "MiB"),
        (curve.cold_selector_ms, "explain one claim whose selector nothing has evaluated yet (a new literal)",
         100.0, "ms"),
        (curve.startup_s, "startup: process start -> informers synced and first pending claim explained", 10.0, "s"),
    ):
        if not series:
            continue
        p = project(series, n)
        out.append(Row(f"{what} at {_n(n)} nodes", p.value, limit, unit, p.basis))
    if curve.rss_samples:
        rss, fit, rss_figures = rss_rows(curve, targets)
        out += rss
        figures["rss_fit"] = fit.document() if fit is not None else None
        figures.update(rss_figures)
    if backlog is not None:
        out.append(backlog_row(backlog, targets.backlog, backlog_where))
    if explained_backlog is not None:
        out += explained_backlog_rows(explained_backlog, targets.backlog)
    if fleet_views is not None:
        out += fleet_view_rows(fleet_views, targets)
    if apf is not None:
        missing = int(apf["claims"]) - int(apf["explained"])
        out.append(Row("low API Priority and Fairness limit: claims left unexplained + error lines logged",
                       float(missing + len(apf["problems"])), 0.0, "", "measured",
                       note=f"{apf['explained']} of {apf['claims']} explained, {len(apf['problems'])} problem lines"))
        out.append(Row("low API Priority and Fairness limit: 429s the API server answered the controller",
                       float(apf["rejected"]), 1.0, "", "measured (the limit must bite for the row above to mean "
                       "anything)", higher_is_better=True))
    return out, figures


# --------------------------------------------------------------------------- the docs' tables


def _cell(value: Any, digits: int = 1) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def markdown_tables(document: Mapping[str, Any]) -> str:
    """The rows and the per-size curve of a ``scale.json`` document, as the docs show them."""
    lines = ["| Row | Result | Target | Met | How |", "|---|---|---|---|---|"]
    for t in document.get("targets") or []:
        what, _, basis = str(t["what"]).partition(" [")
        lines.append(f"| {what} | {_cell(float(t['value']), 2)} {t['unit']} | {t['comparison']} {_cell(t['limit'], 1)} "
                     f"{t['unit']} | {'yes' if t['pass'] else '**no**'} | {basis.rstrip(']')} |")
    lines += ["", "| GPU nodes (+MIG) | devices | claims allocated | pods | controller RSS synced | first claim | "
              "fitting p50 | unsatisfiable p50 | new selector | backlog claims/s | scheduler pods/s | startup |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in (document.get("figures") or {}).get("sizes") or []:
        last = (r.get("rss_samples") or [{}])[-1]
        fc = r.get("first_claim") or {}

        def p50(probes: Sequence[Mapping[str, Any]]) -> float | None:
            vals = sorted(p["latency_s"] * 1000 for p in probes if p.get("latency_s") is not None)
            return vals[(len(vals) - 1) // 2] if vals else None

        first = f"{_cell(fc.get('latency_s'), 2)} s, +{_cell(fc.get('cache_mib'), 0)} MiB" if fc else "—"
        lines.append(
            f"| {r['nodes']:,} (+{r.get('mig_nodes', 0):,}) | {_cell(r.get('devices'))} | {_cell(last.get('claims'), 0)} | "
            f"{_cell(last.get('pods'), 0)} | {_cell(last.get('rss_mib'), 0)} MiB | {first} | "
            f"{_cell(p50(r.get('fit_probes') or []), 0)} ms | {_cell(p50(r.get('explain_probes') or []), 0)} ms | "
            f"{_cell(cold_selector_ms(r.get('cold_probe') or {}), 0)} ms | "
            f"{_cell((r.get('backlog') or {}).get('claims_per_s'), 1)} | {_cell((r.get('fill') or {}).get('pods_per_s'), 1)} | "
            f"{_cell((r.get('startup') or {}).get('explained_s'), 1)} s |")
    return "\n".join(lines) + "\n"
