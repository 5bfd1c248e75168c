"""/metrics and /healthz."""

from __future__ import annotations

import urllib.error
import urllib.request

from dra_driver.controller.metrics import ControllerMetrics, MetricsServer


def test_metrics_and_health() -> None:
    m = ControllerMetrics()
    m.claims_explained.inc()
    m.error("conflict")
    m.resolve_seconds.observe(0.02)
    healthy = [True]
    srv = MetricsServer(m, 0, lambda: healthy[0], host="127.0.0.1")
    srv.start()
    try:
        base = f"http://127.0.0.1:{srv.port}"
        body = urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()
        assert "dra_driver_controller_claims_explained_total 1.0" in body
        assert 'dra_driver_controller_errors_total{kind="conflict"} 1.0' in body
        assert "dra_driver_controller_resolve_duration_seconds_bucket" in body
        assert "dra_driver_controller_claims_allocated_total 0.0" in body
        assert 'dra_driver_controller_build_info{version="' in body
        names = {line.split()[2] for line in body.splitlines() if line.startswith("# TYPE")}
        assert all(n.startswith("dra_driver_controller_") for n in names), names
        assert urllib.request.urlopen(f"{base}/healthz", timeout=5).status == 200
        healthy[0] = False
        try:
            urllib.request.urlopen(f"{base}/healthz", timeout=5)
            raise AssertionError("expected 503")
        except urllib.error.HTTPError as exc:
            assert exc.code == 503
    finally:
        srv.stop()
