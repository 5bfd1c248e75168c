"""The node plugin's /metrics: each series moves where the work happens, and the page serves them."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path

from nodefix import Env, make_claim
from sliceapi import InMemorySliceApi
from test_health import DEVICES, make_monitor

from dra_driver.k8s.client import ApiError
from dra_driver.node.describe.devices import describe
from dra_driver.node.discovery.nvml import NvmlBackend
from dra_driver.node.kubelet import httpport
from dra_driver.node.metrics import METRICS, PREFIX, PluginMetrics, xid_label
from dra_driver.node.prepare.calls import ClaimRef
from dra_driver.node.prepare.state import DeviceState
from dra_driver.node.publish.health import HealthFileSource, HealthReport
from dra_driver.node.publish.publisher import SlicePublisher

DRIVER = "gpu.dra-driver.io"


def count(name: str, **labels: str) -> float:
    return METRICS.value(name, labels)


def test_prepare_and_unprepare_are_timed_by_result_and_failures_reported(tmp_path: Path) -> None:
    env = Env(tmp_path)
    failures: list[tuple[ClaimRef, str]] = []
    env.state = DeviceState(
        node_name=env.state.node_name, driver_name=DRIVER, devices=env.devices, cdi=env.new_cdi(),
        checkpoint=env.state.checkpoint, api=env.reader, backend=env.backend, proc_root=env.proc,
        on_prepare_error=lambda ref, error: failures.append((ref, error)))
    ok0, err0 = count("prepare_duration_seconds_count", result="success"), count("prepare_duration_seconds_count", result="error")
    cdi0, ckpt0 = count("cdi_spec_writes_total", result="success"), count("checkpoint_write_duration_seconds_count")
    good = env.reader.add(make_claim("good", [("gpu", "gpu-0")]))
    bad = env.reader.add(make_claim("bad", [("gpu", "gpu-99")]))
    out = env.state.prepare([good, bad])
    assert out[good.uid].error is None and out[bad.uid].error
    assert count("prepare_duration_seconds_count", result="success") == ok0 + 1
    assert count("prepare_duration_seconds_count", result="error") == err0 + 1
    assert failures == [(bad, out[bad.uid].error)], "the Event gets the error the kubelet gets"
    assert count("prepared_claims") == 1
    assert count("cdi_spec_writes_total", result="success") == cdi0 + 1
    assert count("checkpoint_write_duration_seconds_count") >= ckpt0 + 2  # PrepareStarted, PrepareCompleted
    un0 = count("unprepare_duration_seconds_count", result="success")
    assert env.state.unprepare([good]) == {good.uid: None}
    assert count("unprepare_duration_seconds_count", result="success") == un0 + 1
    assert count("prepared_claims") == 0


def test_cdi_write_failure_is_counted(tmp_path: Path) -> None:
    env = Env(tmp_path)
    env.cdi_root.parent.mkdir(parents=True, exist_ok=True)
    env.cdi_root.write_text("a file where the CDI directory should be")
    before = count("cdi_spec_writes_total", result="error")
    assert env.prepare_one(make_claim("c", [("gpu", "gpu-1")])).error
    assert count("cdi_spec_writes_total", result="error") == before + 1


def test_slice_writes_and_errors() -> None:
    client = InMemorySliceApi()
    publisher = SlicePublisher(client, DRIVER, "node-m", node_uid="uid")
    devices_json, counters = describe(DEVICES, DRIVER, True)
    before = count("resourceslice_writes_total", operation="create")
    publisher.update(devices_json, counters)
    publisher.sync()
    assert count("resourceslice_writes_total", operation="create") > before

    def refuse(*_: object, **__: object) -> object:
        raise ApiError(0, "MaxRetryError", "connection refused")

    errors = count("resourceslice_publish_errors_total")
    client.list = refuse  # type: ignore[method-assign]
    publisher.informer.start = lambda stop: None  # type: ignore[method-assign,assignment,return-value]
    stop = threading.Event()
    thread = threading.Thread(target=publisher.run, args=(stop,), daemon=True)
    publisher.request_sync(0.0)
    thread.start()
    deadline = time.monotonic() + 10
    while count("resourceslice_publish_errors_total") == errors and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    thread.join(timeout=5)
    assert count("resourceslice_publish_errors_total") > errors


def test_devices_by_type_and_health_and_xids(tmp_path: Path) -> None:
    monitor, _, _ = make_monitor()
    path = tmp_path / "health.json"
    source = HealthFileSource(path, monitor, ignored_xids=(13,))
    path.write_text("{}")
    source.poll()
    gpus = sum(1 for d in DEVICES.values() if d.kind == "gpu")
    assert count("devices", type="gpu", health="Healthy") == gpus
    assert count("devices", type="gpu", health="Unhealthy") == 0
    x79, x13 = count("xid_events_total", xid="79"), count("xid_events_total", xid="13")
    path.write_text(json.dumps({"gpu-0": {"xid": 79}, "gpu-1": {"xid": 13}}))
    source.poll(force=True)
    assert count("xid_events_total", xid="79") == x79 + 1
    assert count("xid_events_total", xid="13") == x13 + 1, "ignored XIDs are counted too"
    assert count("devices", type="gpu", health="Unhealthy") == 1
    assert count("devices", type="gpu", health="Healthy") == gpus - 1
    source.poll(force=True)  # the same file again: no new XID
    assert count("xid_events_total", xid="79") == x79 + 1
    assert xid_label(100000) == "other"


def test_monitor_reports_changes() -> None:
    from dra_driver.node.publish.health import HealthMonitor
    from dra_driver.node.publish.healthboard import HealthBoard

    changes = []
    devices_json, _ = describe(DEVICES, DRIVER, False)
    monitor = HealthMonitor(DEVICES, devices_json, HealthBoard(sorted(DEVICES)), lambda d: None,
                            on_change=changes.append)
    monitor.set_reports({})
    assert changes == []
    monitor.report("gpu-0", HealthReport("Unhealthy", "XID 79", 79))
    [change] = changes
    assert change.devices[0] == "gpu-0" and change.xid == 79 and change.health == "Unhealthy"


class _FailingNvml:
    class NVMLError(Exception):
        value = 999

    def nvmlInit(self) -> None:
        raise self.NVMLError("driver not loaded")


def test_nvml_errors_by_function() -> None:
    before = count("nvml_errors_total", function="nvmlInit")
    try:
        NvmlBackend(nvml_module=_FailingNvml())  # type: ignore[arg-type]
        raise AssertionError("NVML init must fail")
    except RuntimeError as exc:
        assert "NVML initialisation failed" in str(exc)
    assert count("nvml_errors_total", function="nvmlInit") == before + 1


def test_metrics_page_next_to_healthz() -> None:
    metrics = PluginMetrics()
    metrics.build_info.labels(version="0.1.0", backend="simulated", driver_version="580.1").set(1)
    server = httpport.serve(0, lambda: None, host="127.0.0.1", pages={"/metrics": metrics.page})
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as resp:
            body = resp.read().decode()
            assert resp.headers["Content-Type"].startswith("text/plain")
        assert f'{PREFIX}_build_info{{backend="simulated",driver_version="580.1",version="0.1.0"}} 1.0' in body
        assert f'{PREFIX}_prepare_duration_seconds_count{{result="error"}} 0.0' in body
        names = {line.split()[2] for line in body.splitlines() if line.startswith("# TYPE")}
        assert all(n.startswith(f"{PREFIX}_") for n in names), names
        with urllib.request.urlopen(f"{base}/healthz", timeout=5) as resp:
            assert resp.status == 200
    finally:
        server.shutdown()
