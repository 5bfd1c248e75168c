"""Prometheus metrics: counters, gauges and histograms with labels, served in the text format 0.0.4.

Our own, not ``prometheus_client``: the node plugin uses three metric types and one exposition
format, and importing that library costs every process memory (it brings ``http.server``,
``wsgiref``, ``urllib.request``, ``email`` and three compression modules for features we never
use) that counts against the node plugin, measured against a Go DRA driver (docs/benchmarks.md,
"Memory (2026-11-24)"). The tests parse what :meth:`Registry.exposition`
writes with ``prometheus_client``'s own parser.

What a scrape shows is what the official client would show for the same metrics, without its
``_created`` series.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Iterable, Mapping, Sequence

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _number(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value))


def _label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{n}="{_label_value(v)}"' for n, v in sorted(labels.items())) + "}"


class Registry:
    """The metrics one ``/metrics`` page shows, in the order they were created."""

    def __init__(self) -> None:
        self._metrics: list[_Metric] = []
        self._lock = threading.Lock()

    def add(self, metric: _Metric) -> None:
        with self._lock:
            if any(m.name == metric.name for m in self._metrics):
                raise ValueError(f"metric {metric.name} is already registered")
            self._metrics.append(metric)

    def exposition(self) -> bytes:
        with self._lock:
            metrics = list(self._metrics)
        return "".join(m.text() for m in metrics).encode()

    def get_sample_value(self, name: str, labels: Mapping[str, str] | None = None) -> float | None:
        """A sample's value by its full name (``..._total``, ``..._bucket`` with ``le``, ...); None
        when there is no such sample."""
        want = dict(labels or {})
        with self._lock:
            metrics = list(self._metrics)
        for metric in metrics:
            for sample, sample_labels, value in metric.samples():
                if sample == name and sample_labels == want:
                    return value
        return None


class _Metric:
    kind = ""

    def __init__(self, name: str, documentation: str, labelnames: Iterable[str] = (), *, registry: Registry) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._lock = threading.Lock()
        self._children: dict[tuple[str, ...], list[float]] = {}
        if not self.labelnames:
            self._children[()] = self._new()
        registry.add(self)

    def _new(self) -> list[float]:
        return [0.0]

    def _child_values(self, labels: Mapping[str, str]) -> list[float]:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name} has labels {list(self.labelnames)}, got {sorted(labels)}")
        key = tuple(str(labels[n]) for n in self.labelnames)
        with self._lock:
            values = self._children.get(key)
            if values is None:
                values = self._children[key] = self._new()
            return values

    def _unlabelled(self) -> list[float]:
        if self.labelnames:
            raise ValueError(f"{self.name} has labels {list(self.labelnames)}: use .labels(...)")
        return self._children[()]

    def _snapshot(self) -> list[tuple[dict[str, str], list[float]]]:
        """Every series: its labels and a copy of its values."""
        with self._lock:
            children = [(key, list(values)) for key, values in self._children.items()]
        return [(dict(zip(self.labelnames, key, strict=True)), values) for key, values in children]

    def samples(self) -> list[tuple[str, dict[str, str], float]]:
        """One sample per series (counters and gauges; a histogram has more)."""
        return [(self.name, labels, values[0]) for labels, values in self._snapshot()]

    def text(self) -> str:
        doc = self.documentation.replace("\\", r"\\").replace("\n", r"\n")
        lines = [f"# HELP {self.name} {doc}\n# TYPE {self.name} {self.kind}\n"]
        for sample, labels, value in self.samples():
            lines.append(f"{sample}{_labels(labels)} {_number(value)}\n")
        return "".join(lines)


class _Child:
    """One labelled series: its values live in the metric, under the metric's lock."""

    def __init__(self, metric: _Metric, values: list[float]) -> None:
        self._metric = metric
        self._values = values


class _CounterChild(_Child):
    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError(f"{self._metric.name}: a counter only goes up, not by {amount}")
        with self._metric._lock:
            self._values[0] += amount


class Counter(_Metric):
    kind = "counter"

    def __init__(self, name: str, documentation: str, labelnames: Iterable[str] = (), *, registry: Registry) -> None:
        if not name.endswith("_total"):
            raise ValueError(f"counter {name} must end in _total")
        super().__init__(name, documentation, labelnames, registry=registry)

    def labels(self, **labels: str) -> _CounterChild:
        return _CounterChild(self, self._child_values(labels))

    def inc(self, amount: float = 1.0) -> None:
        _CounterChild(self, self._unlabelled()).inc(amount)


class _GaugeChild(_Child):
    def set(self, value: float) -> None:
        with self._metric._lock:
            self._values[0] = float(value)


class Gauge(_Metric):
    kind = "gauge"

    def labels(self, **labels: str) -> _GaugeChild:
        return _GaugeChild(self, self._child_values(labels))

    def set(self, value: float) -> None:
        _GaugeChild(self, self._unlabelled()).set(value)

    def replace(self, series: Iterable[tuple[Mapping[str, str], float]]) -> None:
        """Every series at once: those given, with their values, and no other (a series whose
        labels are gone, a model no longer in the cluster, stops being exported). One scrape sees
        the old set or the new one, never a mix. For a gauge only ever set this way: a child taken
        from :meth:`labels` before no longer counts after it."""
        if not self.labelnames:
            raise ValueError(f"{self.name} has no labels: use .set(...)")
        children: dict[tuple[str, ...], list[float]] = {}
        for labels, value in series:
            if set(labels) != set(self.labelnames):
                raise ValueError(f"{self.name} has labels {list(self.labelnames)}, got {sorted(labels)}")
            children[tuple(str(labels[n]) for n in self.labelnames)] = [float(value)]
        with self._lock:
            self._children = children


class _HistogramChild(_Child):
    def __init__(self, metric: Histogram, values: list[float]) -> None:
        super().__init__(metric, values)
        self._buckets = metric.buckets

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self._buckets, value)  # the first bucket whose bound is >= value
        with self._metric._lock:
            self._values[i] += 1
            self._values[-1] += value


class Histogram(_Metric):
    """Values: one count per bucket (not cumulative; +Inf last), then the sum."""

    kind = "histogram"

    def __init__(self, name: str, documentation: str, labelnames: Iterable[str] = (), *, buckets: Sequence[float],
                 registry: Registry) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(set(bounds)) or not bounds:
            raise ValueError(f"histogram {name}: buckets must be increasing, got {list(buckets)}")
        if "le" in labelnames:
            raise ValueError(f"histogram {name}: 'le' is the bucket label")
        self.buckets = tuple(bounds) if bounds[-1] == math.inf else (*bounds, math.inf)
        super().__init__(name, documentation, labelnames, registry=registry)

    def _new(self) -> list[float]:
        return [0.0] * (len(self.buckets) + 1)

    def labels(self, **labels: str) -> _HistogramChild:
        return _HistogramChild(self, self._child_values(labels))

    def observe(self, value: float) -> None:
        _HistogramChild(self, self._unlabelled()).observe(value)

    def samples(self) -> list[tuple[str, dict[str, str], float]]:
        out: list[tuple[str, dict[str, str], float]] = []
        for labels, values in self._snapshot():
            total = 0.0
            for bound, count in zip(self.buckets, values, strict=False):
                total += count
                out.append((f"{self.name}_bucket", {**labels, "le": _number(bound)}, total))
            out.append((f"{self.name}_count", labels, total))
            out.append((f"{self.name}_sum", labels, values[-1]))
        return out
