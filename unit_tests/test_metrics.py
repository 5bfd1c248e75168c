"""Our Prometheus metrics against the official client: same samples, same text format."""

from __future__ import annotations

import math
import threading

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dra_driver import metrics

BUCKETS = (0.001, 0.01, 0.1, 1.0)


def both() -> tuple[metrics.Registry, prometheus_client.CollectorRegistry]:
    ours, theirs = metrics.Registry(), prometheus_client.CollectorRegistry()
    for lib, reg in ((metrics, ours), (prometheus_client, theirs)):
        c = lib.Counter("x_events_total", 'Events, "quoted" and a \\ backslash\nand a second line', ["kind"],
                        registry=reg)
        c.labels(kind="a").inc()
        c.labels(kind='we"ird\\\n').inc(2.5)
        lib.Counter("x_plain_total", "No labels", registry=reg).inc()
        g = lib.Gauge("x_level", "A gauge", ["type", "health"], registry=reg)
        g.labels(type="gpu", health="Healthy").set(3)
        g.labels(type="mig", health="Unknown").set(0)
        lib.Gauge("x_up", "Unlabelled gauge", registry=reg).set(-1.5)
        h = lib.Histogram("x_seconds", "A histogram", ["result"], buckets=BUCKETS, registry=reg)
        for v in (0.0005, 0.001, 0.05, 0.5, 3.0, 100.0):
            h.labels(result="success").observe(v)
        h.labels(result="error")
        lib.Histogram("x_plain_seconds", "Unlabelled", buckets=BUCKETS, registry=reg).observe(0.02)
    return ours, theirs


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if not s.name.endswith("_created"):
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_the_official_parser_reads_the_same_samples_as_the_official_client_writes() -> None:
    ours, theirs = both()
    mine = samples(ours.exposition().decode())
    official = samples(prometheus_client.generate_latest(theirs).decode())
    assert mine == official
    assert len(mine) == 2 + 1 + 2 + 1 + 2 * (len(BUCKETS) + 3) + (len(BUCKETS) + 3)


def test_the_text_is_the_official_clients_without_created_series() -> None:
    ours, theirs = both()

    def without_created(text: str) -> list[str]:
        def name(line: str) -> str:  # "# HELP name ..." or "name{labels} value"
            return line.split(" ")[2] if line.startswith("#") else line.split("{")[0].split(" ")[0]
        return [line for line in text.splitlines() if not name(line).endswith("_created")]

    assert ours.exposition().decode().splitlines() == without_created(prometheus_client.generate_latest(theirs).decode())


def test_get_sample_value() -> None:
    ours, theirs = both()
    for name, labels in (("x_events_total", {"kind": "a"}), ("x_seconds_bucket", {"result": "success", "le": "0.001"}),
                         ("x_seconds_count", {"result": "success"}), ("x_seconds_sum", {"result": "error"}),
                         ("x_up", {}), ("x_level", {"type": "gpu", "health": "Healthy"})):
        assert ours.get_sample_value(name, labels) == theirs.get_sample_value(name, labels), name
    assert ours.get_sample_value("x_events_total", {"kind": "nope"}) is None


def test_misuse_is_a_clear_error() -> None:
    reg = metrics.Registry()
    c = metrics.Counter("y_total", "c", ["kind"], registry=reg)
    with pytest.raises(ValueError, match="labels"):
        c.labels(other="x")
    with pytest.raises(ValueError, match=r"use \.labels"):
        c.inc()
    with pytest.raises(ValueError, match="only goes up"):
        c.labels(kind="a").inc(-1)
    with pytest.raises(ValueError, match="already registered"):
        metrics.Counter("y_total", "again", registry=reg)
    with pytest.raises(ValueError, match="_total"):
        metrics.Counter("y", "c", registry=reg)
    with pytest.raises(ValueError, match="increasing"):
        metrics.Histogram("h", "h", buckets=(1.0, 0.5), registry=reg)
    with pytest.raises(ValueError, match="bucket label"):
        metrics.Histogram("h2", "h", ["le"], buckets=(1.0,), registry=reg)


def test_concurrent_updates_are_not_lost() -> None:
    reg = metrics.Registry()
    c = metrics.Counter("z_total", "c", ["kind"], registry=reg)
    h = metrics.Histogram("z_seconds", "h", buckets=(1.0,), registry=reg)

    def work() -> None:
        for _ in range(2000):
            c.labels(kind="a").inc()
            h.observe(0.5)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert reg.get_sample_value("z_total", {"kind": "a"}) == 16000
    assert reg.get_sample_value("z_seconds_count") == 16000
    assert reg.get_sample_value("z_seconds_bucket", {"le": "+Inf"}) == 16000
    assert math.isclose(reg.get_sample_value("z_seconds_sum") or 0, 8000)


def test_a_gauge_replaced_exports_exactly_the_series_given() -> None:
    reg = metrics.Registry()
    g = metrics.Gauge("d_devices", "d", ["model", "state"], registry=reg)
    g.replace([({"model": "A", "state": "free"}, 3), ({"model": "B", "state": "free"}, 1)])
    g.replace([({"model": "A", "state": "free"}, 2), ({"model": "A", "state": "allocated"}, 1)])
    assert reg.get_sample_value("d_devices", {"model": "A", "state": "free"}) == 2
    assert reg.get_sample_value("d_devices", {"model": "A", "state": "allocated"}) == 1
    assert reg.get_sample_value("d_devices", {"model": "B", "state": "free"}) is None, "a model gone stays gone"
    parsed = {s.labels["model"] for f in text_string_to_metric_families(reg.exposition().decode()) for s in f.samples}
    assert parsed == {"A"}
    with pytest.raises(ValueError, match="labels"):
        g.replace([({"model": "A"}, 1)])
    with pytest.raises(ValueError, match="no labels"):
        metrics.Gauge("d_up", "u", registry=reg).replace([({}, 1)])
