"""GPU health: mapping onto devices, taints, the health file and a fake NVML event stream."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import types
from pathlib import Path
from typing import Any

import pynvml
import pytest
from nodefix import build_devices
from sliceapi import InMemorySliceApi

from dra_driver.k8s.client import SLICES
from dra_driver.node.describe.devices import describe
from dra_driver.node.metrics import METRICS
from dra_driver.node.publish.health import (
    TAINT_KEY,
    HealthFileError,
    HealthFileSource,
    HealthMonitor,
    HealthReport,
    NvmlEventSource,
    device_health,
    parse_health_file,
    taint_value,
)
from dra_driver.node.publish.healthboard import HealthBoard
from dra_driver.node.publish.publisher import SlicePublisher

DRIVER = "gpu.dra-driver.io"
DEVICES = build_devices()
GPU2 = DEVICES["gpu-2"].gpu.uuid


class Recorder:
    def __init__(self) -> None:
        self.published: list[list[dict[str, Any]]] = []

    def __call__(self, devices: list[dict[str, Any]]) -> None:
        self.published.append(devices)

    def taints(self) -> dict[str, list[dict[str, Any]]]:
        return {d["name"]: d["taints"] for d in self.published[-1] if d.get("taints")}


def make_monitor() -> tuple[HealthMonitor, HealthBoard, Recorder]:
    devices_json, _ = describe(DEVICES, DRIVER, False)
    board = HealthBoard(sorted(DEVICES))
    rec = Recorder()
    return HealthMonitor(DEVICES, devices_json, board, rec), board, rec


def board_health(board: HealthBoard) -> dict[str, tuple[str, str]]:
    return {r.device_name: (r.health, r.message) for r in board.snapshot()[1]}


# --- mapping ----------------------------------------------------------------------------------


def test_gpu_health_is_inherited_by_its_mig_devices() -> None:
    health = device_health(DEVICES, {GPU2: HealthReport("Unhealthy", "XID 79", 79)})
    bad = sorted(n for n, h in health.items() if h.health == "Unhealthy")
    assert bad == ["gpu-2", "gpu-2-mig-0", "gpu-2-mig-1"]
    assert health["gpu-2-mig-0"].taint_value == "XID-79"


def test_device_name_of_a_gpu_covers_its_mig_devices_but_a_mig_entry_only_itself() -> None:
    by_name = device_health(DEVICES, {"gpu-3": HealthReport("Unhealthy", "ECC")})
    assert sorted(n for n, h in by_name.items() if h.health == "Unhealthy") == [
        "gpu-3", "gpu-3-1g-0", "gpu-3-1g-1", "gpu-3-2g-0"]
    mig_only = device_health(DEVICES, {"gpu-2-mig-1": HealthReport("Unhealthy", "x")})
    assert sorted(n for n, h in mig_only.items() if h.health == "Unhealthy") == ["gpu-2-mig-1"]


def test_taint_value_is_a_valid_label_value() -> None:
    assert taint_value("XID 79") == "XID-79"
    assert taint_value("GPU is lost (fell off the bus)") == "GPU-is-lost-fell-off-the-bus"
    assert taint_value("!!!") == "unhealthy"
    assert len(taint_value("x" * 500)) == 63


# --- monitor ----------------------------------------------------------------------------------


def test_unhealthy_taints_and_board_then_recovery_untaints() -> None:
    monitor, board, rec = make_monitor()
    monitor.set_reports({"gpu-0": HealthReport("Unhealthy", "XID 79", 79)})
    assert rec.taints() == {"gpu-0": [{"key": TAINT_KEY, "value": "XID-79", "effect": "NoSchedule"}]}
    assert board_health(board)["gpu-0"] == ("Unhealthy", "XID 79")
    assert board_health(board)["gpu-1"] == ("Healthy", "")
    monitor.set_reports({"gpu-0": HealthReport("Unhealthy", "XID 79", 79)})
    assert len(rec.published) == 1, "an unchanged set of taints must not re-publish"
    monitor.set_reports({})
    assert rec.taints() == {}
    assert board_health(board)["gpu-0"] == ("Healthy", "")


def test_unknown_health_reports_but_does_not_taint() -> None:
    monitor, board, rec = make_monitor()
    monitor.set_reports({"gpu-1": HealthReport("Unknown", "driver not answering")})
    assert board_health(board)["gpu-1"] == ("Unknown", "driver not answering")
    assert rec.published == []


def test_foreign_taints_are_kept() -> None:
    devices_json, _ = describe(DEVICES, DRIVER, False)
    other = {"key": "example.com/maintenance", "value": "yes", "effect": "NoExecute"}
    devices_json[0]["taints"] = [other]
    rec = Recorder()
    monitor = HealthMonitor(DEVICES, devices_json, HealthBoard(DEVICES), rec)
    monitor.set_reports({devices_json[0]["name"]: HealthReport("Unhealthy", "x")})
    assert rec.published[-1][0]["taints"][0] == other
    monitor.set_reports({})
    assert rec.published[-1][0]["taints"] == [other]


def test_monitor_through_a_real_slice_publisher() -> None:
    devices_json, counters = describe(DEVICES, DRIVER, True)
    client = InMemorySliceApi()
    publisher = SlicePublisher(client, DRIVER, "node-a", node_uid="uid")
    publisher.update(devices_json, counters)
    publisher.sync()
    monitor = HealthMonitor(DEVICES, devices_json, HealthBoard(DEVICES),
                            lambda tainted: publisher.update(tainted, counters))
    monitor.set_reports({GPU2: HealthReport("Unhealthy", "XID 48", 48)})
    publisher.sync()
    stored = {d["name"]: d for s in client.list(SLICES).items for d in s["spec"].get("devices", [])}
    assert [t["value"] for t in stored["gpu-2-mig-0"]["taints"]] == ["XID-48"]
    assert "taints" not in stored["gpu-0"]
    monitor.set_reports({})
    publisher.sync()
    stored = {d["name"]: d for s in client.list(SLICES).items for d in s["spec"].get("devices", [])}
    assert not any(d.get("taints") for d in stored.values())


# --- the health file --------------------------------------------------------------------------


def test_parse_health_file_format() -> None:
    reports = parse_health_file(json.dumps({
        "gpu-0": {"health": "Unhealthy", "reason": "XID 79", "xid": 79},
        "gpu-1": {"xid": 13},
        "gpu-2": {},
        GPU2: {"health": "Unknown"},
    }), ignored_xids=(13,))
    assert reports["gpu-0"] == HealthReport("Unhealthy", "XID 79", 79)
    assert reports["gpu-1"].health == "Healthy" and "ignored" in reports["gpu-1"].reason
    assert reports["gpu-2"].health == "Unhealthy"
    assert reports[GPU2].health == "Unknown"
    assert parse_health_file("") == {}


@pytest.mark.parametrize(("text", "where"), [
    ("[1]", "JSON object"),
    ("{", "not valid JSON"),
    ('{"gpu-0": 1}', "gpu-0: must be an object"),
    ('{"gpu-0": {"health": "Sick"}}', "gpu-0.health"),
    ('{"gpu-0": {"xid": "79"}}', "gpu-0.xid"),
    ('{"gpu-0": {"xid": true}}', "gpu-0.xid"),
    ('{"gpu-0": {"reason": 5}}', "gpu-0.reason"),
    ('{"gpu-0": {"colour": "red"}}', "gpu-0.colour: unknown field"),
])
def test_parse_health_file_errors_name_the_entry(text: str, where: str) -> None:
    with pytest.raises(HealthFileError, match=where.replace(".", r"\.")):
        parse_health_file(text)


def test_health_file_source_rereads_on_change_and_keeps_state_on_garbage(tmp_path: Path) -> None:
    monitor, board, rec = make_monitor()
    path = tmp_path / "health.json"
    source = HealthFileSource(path, monitor, ignored_xids=(13,))
    assert source.poll() is True  # missing file: all healthy
    path.write_text(json.dumps({"gpu-1": {"reason": "XID 79", "xid": 79}}))
    assert source.poll() is True
    assert board_health(board)["gpu-1"] == ("Unhealthy", "XID 79")
    assert source.poll() is False, "unchanged file is not re-applied"
    path.write_text("{ half written")
    assert source.poll() is False
    assert board_health(board)["gpu-1"][0] == "Unhealthy", "a broken file keeps the previous health"
    path.unlink()
    assert source.poll() is True
    assert board_health(board)["gpu-1"] == ("Healthy", "")
    assert rec.taints() == {}


def test_health_file_thread_and_sigusr1(tmp_path: Path) -> None:
    monitor, board, _ = make_monitor()
    path = tmp_path / "health.json"
    path.write_text("{}")
    source = HealthFileSource(path, monitor, poll_interval=30.0)  # only the signal can wake it in time
    source.install_signal()
    stop = threading.Event()
    try:
        source.start(stop)
        stamp = os.stat(path)
        path.write_text(json.dumps({"gpu-0": {"reason": "XID 94"}}))
        os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # even without an mtime change
        os.kill(os.getpid(), signal.SIGUSR1)
        deadline = time.monotonic() + 5
        while board_health(board)["gpu-0"][0] != "Unhealthy" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert board_health(board)["gpu-0"] == ("Unhealthy", "XID 94")
    finally:
        stop.set()
        source._kick.set()
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)


# --- a fake NVML event stream -----------------------------------------------------------------


class FakeEventData:
    def __init__(self, device: Any, event_type: int, data: int) -> None:
        self.device, self.eventType, self.eventData = device, event_type, data


class FakeNvmlEvents(types.ModuleType):
    NVMLError = pynvml.NVMLError
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError
    nvmlEventTypeDoubleBitEccError = pynvml.nvmlEventTypeDoubleBitEccError
    nvmlEventTypeSingleBitEccError = pynvml.nvmlEventTypeSingleBitEccError

    def __init__(self, uuids: list[str], supported: int = 0xFF) -> None:
        super().__init__("pynvml")
        self.uuids = uuids
        self.supported = supported
        self.registered: dict[str, int] = {}
        self.queue: list[Any] = []
        self.lost: set[str] = set()
        self.freed = False

    def nvmlEventSetCreate(self) -> str:
        return "set"

    def nvmlEventSetFree(self, s: str) -> None:
        self.freed = True

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> tuple[str, str]:
        if uuid in self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return ("handle", uuid)

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return self.supported

    def nvmlDeviceRegisterEvents(self, handle: Any, mask: int, s: str) -> None:
        self.registered[handle[1]] = mask

    def nvmlDeviceGetUUID(self, handle: Any) -> bytes:
        if handle[1] in self.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return handle[1].encode()

    def nvmlEventSetWait_v2(self, s: str, timeout_ms: int) -> Any:
        if not self.queue:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        item = self.queue.pop(0)
        if isinstance(item, Exception):
            raise item
        return item


GPU0, GPU1 = DEVICES["gpu-0"].gpu.uuid, DEVICES["gpu-1"].gpu.uuid


def nvml_source(**kw: Any) -> tuple[NvmlEventSource, FakeNvmlEvents, HealthMonitor, HealthBoard, Recorder]:
    monitor, board, rec = make_monitor()
    nv = FakeNvmlEvents([GPU0, GPU1, GPU2], **kw)
    source = NvmlEventSource(nv, [GPU0, GPU1, GPU2], monitor, ignored_xids=(13, 31, 43))
    source.setup()
    return source, nv, monitor, board, rec


def test_nvml_registers_critical_events_only() -> None:
    _, nv, *_ = nvml_source()
    mask = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
    assert nv.registered == {GPU0: mask, GPU1: mask, GPU2: mask}
    assert not mask & pynvml.nvmlEventTypeSingleBitEccError


def test_nvml_critical_xid_makes_gpu_and_its_mig_devices_unhealthy() -> None:
    source, nv, _, board, rec = nvml_source()
    nv.queue += [FakeEventData(("handle", GPU2), pynvml.nvmlEventTypeXidCriticalError, 79)]
    source.wait_once()
    health = board_health(board)
    assert health["gpu-2"] == ("Unhealthy", "XID 79")
    assert health["gpu-2-mig-1"] == ("Unhealthy", "XID 79")
    assert health["gpu-0"] == ("Healthy", "")
    assert set(rec.taints()) == {"gpu-2", "gpu-2-mig-0", "gpu-2-mig-1"}


def test_nvml_ignored_xid_keeps_gpu_healthy() -> None:
    source, nv, _, board, rec = nvml_source()
    nv.queue += [FakeEventData(("handle", GPU0), pynvml.nvmlEventTypeXidCriticalError, 13)]
    source.wait_once()
    assert board_health(board)["gpu-0"] == ("Healthy", "")
    assert source.ignored_seen == 1 and rec.published == []


def test_nvml_double_bit_ecc_is_unhealthy() -> None:
    source, nv, _, board, _ = nvml_source()
    nv.queue += [FakeEventData(("handle", GPU1), pynvml.nvmlEventTypeDoubleBitEccError, 0)]
    source.wait_once()
    assert board_health(board)["gpu-1"] == ("Unhealthy", "double-bit ECC error")


def test_nvml_gpu_lost_and_back() -> None:
    source, nv, _, board, rec = nvml_source()
    nv.lost.add(GPU1)
    nv.queue.append(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST))
    source.wait_once()
    assert board_health(board)["gpu-1"][0] == "Unhealthy"
    assert board_health(board)["gpu-0"][0] == "Healthy"
    assert rec.taints()["gpu-1"][0]["value"] == "GPU-is-lost-fell-off-the-bus"
    nv.lost.clear()
    source.wait_once()  # a timeout re-probes lost GPUs
    assert board_health(board)["gpu-1"] == ("Healthy", "")
    assert rec.taints() == {}


def test_nvml_gpu_lost_at_registration() -> None:
    monitor, board, _ = make_monitor()
    nv = FakeNvmlEvents([GPU0, GPU1])
    nv.lost.add(GPU0)
    NvmlEventSource(nv, [GPU0, GPU1], monitor).setup()
    assert board_health(board)["gpu-0"][0] == "Unhealthy"
    assert GPU0 not in nv.registered and GPU1 in nv.registered


def test_nvml_unsupported_events_leave_gpu_unwatched_but_healthy() -> None:
    _, nv, _, board, _ = nvml_source(supported=pynvml.nvmlEventTypeSingleBitEccError)
    assert nv.registered == {}
    assert {h for h, _ in board_health(board).values()} == {"Healthy"}


def bug(*_args: Any) -> Any:
    raise TypeError("called wrongly")


def test_a_bug_registering_events_is_no_nvml_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the module's NVMLError is NVML saying no; a bug is raised (the plugin then serves without
    health events, saying so), not logged as one GPU's failed registration."""
    monitor, *_ = make_monitor()
    nv = FakeNvmlEvents([GPU0, GPU1])
    monkeypatch.setattr(nv, "nvmlDeviceRegisterEvents", bug)
    with pytest.raises(TypeError, match="called wrongly"):
        NvmlEventSource(nv, [GPU0, GPU1], monitor).setup()


def test_a_bug_in_the_wait_is_raised_uncounted(monkeypatch: pytest.MonkeyPatch) -> None:
    source, nv, *_ = nvml_source()
    before = METRICS.value("nvml_errors_total", {"function": "bug"})
    monkeypatch.setattr(nv, "nvmlEventSetWait_v2", bug)
    with pytest.raises(TypeError, match="called wrongly"):
        source.wait_once()
    assert METRICS.value("nvml_errors_total", {"function": "bug"}) == before
    nv.queue.append(pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN))
    monkeypatch.undo()
    counted = METRICS.value("nvml_errors_total", {"function": "nvmlEventSetWait_v2"})
    with pytest.raises(pynvml.NVMLError):
        source.wait_once()
    assert METRICS.value("nvml_errors_total", {"function": "nvmlEventSetWait_v2"}) == counted + 1


def test_nvml_run_loop_survives_errors_and_frees_the_set() -> None:
    source, nv, _, board, _ = nvml_source()
    nv.queue += [pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN),
                 FakeEventData(("handle", GPU0), pynvml.nvmlEventTypeXidCriticalError, 48)]
    source.wait_ms = 1
    stop = threading.Event()
    thread = threading.Thread(target=source.run, args=(stop,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while board_health(board)["gpu-0"][0] != "Unhealthy" and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    thread.join(5)
    assert board_health(board)["gpu-0"] == ("Unhealthy", "XID 48")
    assert nv.freed
