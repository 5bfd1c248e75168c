"""The Grafana dashboard queries only metrics the driver defines, and the chart's monitors render."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.node.metrics import PluginMetrics
from e2e.suites.dashboard import DASHBOARD, exported_families, family, queried_metrics

# Renders the chart with helm, which make test's background worker builds on a cold machine: run last.
pytestmark = pytest.mark.helm


def test_every_dashboard_query_names_a_defined_metric() -> None:
    page = PluginMetrics().registry.exposition().decode() + ControllerMetrics().registry.exposition().decode()
    families = exported_families(page)
    queried = queried_metrics()
    assert len(queried) >= 15, f"the dashboard should graph the plugin and the controller: {sorted(queried)}"
    missing = sorted(q for q in queried if family(q, families) is None)
    assert not missing, f"{DASHBOARD.name} queries metrics nobody exports: {missing}"
    for needed in ("dra_driver_plugin_prepare_duration_seconds_bucket", "dra_driver_plugin_devices",
                   "dra_driver_controller_claims_explained_total", "dra_driver_controller_claims_allocated_total"):
        assert needed in queried, needed


def test_family_matching() -> None:
    fams = {"dra_driver_plugin_prepare_duration_seconds", "dra_driver_plugin_xid_events"}
    assert family("dra_driver_plugin_prepare_duration_seconds_bucket", fams) == "dra_driver_plugin_prepare_duration_seconds"
    assert family("dra_driver_plugin_xid_events_total", fams) == "dra_driver_plugin_xid_events"
    assert family("dra_driver_plugin_nope_total", fams) is None


def test_chart_monitors() -> None:
    from test_deploy_static import DEPLOY, _helm_or_skip, _load_module

    _helm_or_skip()
    render = _load_module(DEPLOY / "checks" / "render.py")

    def objects(*values: str) -> dict[tuple[str, str], dict[str, Any]]:
        args = [a for v in values for a in ("--set", v)]
        return {(d["kind"], d["metadata"]["name"]): d for d in render.chart_documents("dra-driver", args)}

    assert not any(kind in ("PodMonitor", "ServiceMonitor") for kind, _ in objects()), "off by default"
    on = objects("monitoring.enabled=true", "monitoring.labels.release=prom")
    pm = on[("PodMonitor", "dra-driver-kubelet-plugin")]
    assert pm["spec"]["podMetricsEndpoints"] == [{"port": "health", "path": "/metrics", "interval": "30s"}]
    assert pm["metadata"]["labels"]["release"] == "prom"
    ds = on[("DaemonSet", "dra-driver-kubelet-plugin")]
    assert pm["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    ports = ds["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert {"name": "health", "containerPort": 8081, "protocol": "TCP"} in ports
    sm = on[("ServiceMonitor", "dra-driver-controller")]
    svc = on[("Service", "dra-driver-controller-metrics")]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"] == "metrics"
    no_svc = objects("monitoring.enabled=true", "controller.metrics.service.enabled=false")
    assert ("ServiceMonitor", "dra-driver-controller") not in no_svc
