"""Events with repeats folded into one series (dra_driver.k8s.events) and the node plugin's Events."""

from __future__ import annotations

from pathlib import Path

from kubefake import FakeKube
from structlog.testing import capture_logs

from dra_driver.k8s.client import EVENTS, ApiError
from dra_driver.k8s.events import (
    ATTEMPTS,
    MAX_NOTE_BYTES,
    MAX_SERIES,
    SHED_LOG_SECONDS,
    EventRecorder,
    ObjectRef,
    Occurrence,
    event_name,
    fit_note,
    node_ref,
)
from dra_driver.node import events as notices
from dra_driver.node.prepare.calls import ClaimRef
from dra_driver.node.publish import gate
from dra_driver.node.publish.health import DeviceHealth, health_changes

CONTROLLER = "gpu.dra-driver.io/kubelet-plugin"
NODE = node_ref("gpu-node-1")
BROKEN = Occurrence("Warning", "CheckpointQuarantined", "Recover", "checkpoint /x is unusable (truncated)")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def recorder(api: FakeKube, clock: Clock | None = None, **kw: object) -> EventRecorder:
    return EventRecorder(api, CONTROLLER, "gpu-node-1", clock=clock or Clock(), **kw)  # type: ignore[arg-type]


def stored(api: FakeKube) -> list[dict[str, object]]:
    return list(api.objects.get("events", {}).values())


def test_first_occurrence_is_an_event_about_the_node() -> None:
    api = FakeKube()
    rec = recorder(api)
    rec.record(NODE, BROKEN)
    assert rec.write_due() is None
    [event] = stored(api)
    assert event["metadata"]["namespace"] == "default"  # type: ignore[index]
    assert event["regarding"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-1", "uid": "gpu-node-1"}
    assert event["reportingController"] == CONTROLLER and event["reportingInstance"] == "gpu-node-1"
    assert (event["type"], event["reason"], event["action"]) == ("Warning", "CheckpointQuarantined", "Recover")
    assert "series" not in event and str(event["eventTime"]).endswith("Z")


def test_repeats_fold_into_one_series_written_at_most_every_interval() -> None:
    api, clock = FakeKube(), Clock()
    rec = recorder(api, clock, min_interval=10.0)
    rec.record(NODE, BROKEN)
    rec.write_due()
    for _ in range(5):
        rec.record(NODE, BROKEN)
    wait = rec.write_due()
    assert wait is not None and 0 < wait <= 10.0, "a repeat within the interval waits"
    assert len(api.writes("create")) == 1 and not api.writes("merge_patch")
    clock.now += 10.0
    assert rec.write_due() is None
    [event] = stored(api)
    assert event["series"]["count"] == 6  # type: ignore[index]
    assert len(api.writes("merge_patch")) == 1, "five repeats, one write"


def test_a_new_process_adds_to_the_existing_series() -> None:
    """A crash loop: each process finds the Event of the one before and raises its count."""
    api = FakeKube()
    for _ in range(3):
        rec = recorder(api)
        rec.record(NODE, BROKEN)
        assert rec.flush(timeout=2.0)
    [event] = stored(api)
    assert event["series"]["count"] == 3  # type: ignore[index]
    assert len(api.writes("create")) == 3  # each tried; two found it there (409)


def test_different_notes_are_different_events_and_names_are_stable() -> None:
    other = Occurrence("Warning", "CheckpointQuarantined", "Recover", "checkpoint /x is unusable (empty)")
    assert event_name(NODE, BROKEN, CONTROLLER, "n") == event_name(NODE, BROKEN, CONTROLLER, "n")
    assert event_name(NODE, BROKEN, CONTROLLER, "n") != event_name(NODE, other, CONTROLLER, "n")
    api = FakeKube()
    rec = recorder(api)
    rec.record(NODE, BROKEN)
    rec.record(NODE, other)
    rec.write_due()
    assert len(stored(api)) == 2


def test_expired_event_starts_a_new_series() -> None:
    api, clock = FakeKube(), Clock()
    rec = recorder(api, clock, min_interval=0.0)
    rec.record(NODE, BROKEN)
    rec.write_due()
    [event] = stored(api)
    api.delete(EVENTS, f"default/{event['metadata']['name']}")  # type: ignore[index]
    rec.record(NODE, BROKEN)
    assert rec.flush(timeout=2.0)
    [event] = stored(api)
    assert "series" not in event, "the new Event counts only what the expired one did not show"


def test_failures_retry_then_drop_and_count() -> None:
    api, clock = FakeKube(), Clock()
    api.fail["create:events"] = ApiError(403, "Forbidden", "events is forbidden")
    drops: list[int] = []
    rec = recorder(api, clock, on_drop=lambda: drops.append(1))
    rec.record(NODE, BROKEN)
    for _ in range(ATTEMPTS):
        rec.write_due()
        clock.now += 60
    assert drops == [1] and not stored(api)
    assert len(api.writes("create")) == ATTEMPTS


def test_claim_event_lives_in_the_claims_namespace() -> None:
    api = FakeKube()
    rec = recorder(api)
    claim = ClaimRef("0b1c2d3e-0000-4000-8000-000000000001", "team-a", "train")
    rec.record(notices.claim_ref(claim), notices.prepare_failed("device gpu-9 is not a device of this driver"))
    rec.write_due()
    [event] = stored(api)
    assert event["metadata"]["namespace"] == "team-a"  # type: ignore[index]
    assert event["regarding"] == {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "name": "train",
                                  "uid": claim.uid, "namespace": "team-a"}
    assert event["reason"] == "PrepareFailed" and "gpu-9" in str(event["note"])


def test_note_fits_the_api_limit() -> None:
    note = fit_note("x" * 5000 + "\n" + "é" * 10)
    assert len(note.encode()) <= MAX_NOTE_BYTES and note.endswith("…")
    assert fit_note("two\nlines") == "two lines"
    ref = ObjectRef("v1", "Node", "n" * 300)
    assert len(event_name(ref, BROKEN, CONTROLLER, "i")) <= 253


def test_plugin_notes_say_what_and_where() -> None:
    q = notices.checkpoint_quarantined(Path("/s/checkpoint.json"), "checksum mismatch", Path("/s/checkpoint.json.corrupt-1"))
    assert q.reason == "CheckpointQuarantined" and "checksum mismatch" in q.note and "corrupt-1" in q.note
    b = notices.not_publishing(gate.backend_closed("libnvidia-ml.so.1 was not found"))
    assert (b.type, b.reason) == ("Warning", "GpuBackendUnavailable") and "libnvidia-ml" in b.note
    assert "publishing nothing" in b.note and "simulated" not in b.note
    assert notices.not_publishing(gate.no_gpus_closed("nvml")).reason == "NoGpusFound"
    closed = gate.device_plugin_closed({"status": {"capacity": {"nvidia.com/gpu": "8"}}}, "n1")
    assert closed is not None
    dp = notices.not_publishing(closed)
    assert dp.reason == "DevicePluginPresent" and "nvidia.com/gpu" in dp.note and "--ignore-device-plugin" in dp.note
    resumed = notices.publishing_resumed(closed)
    assert resumed.type == "Normal" and resumed.reason == "PublishingResumed" and "DevicePluginPresent" in resumed.note
    stale = notices.stale_claim_unprepared(ClaimRef("u", "ns", "c"), None)
    assert stale.type == "Normal" and "ns/c" in stale.note


def test_health_changes_group_a_gpu_and_name_the_xid() -> None:
    xid = DeviceHealth("Unhealthy", "XID 79", "XID-79", 79)
    ok = DeviceHealth("Healthy", "", None)
    old = {"gpu-2": ok, "gpu-2-mig-1-0": ok, "gpu-3": ok}
    new = {"gpu-2": xid, "gpu-2-mig-1-0": xid, "gpu-3": ok}
    [change] = health_changes(old, new)
    assert change.devices == ("gpu-2", "gpu-2-mig-1-0") and change.xid == 79
    event = notices.health_changed(change)
    assert (event.type, event.reason) == ("Warning", "DeviceUnhealthy")
    assert "XID 79" in event.note and "2 devices" in event.note and "XID-79:NoSchedule" in event.note
    [back] = health_changes(new, old)
    recovered = notices.health_changed(back)
    assert (recovered.type, recovered.reason) == ("Normal", "DeviceRecovered") and "after XID 79" in recovered.note
    assert health_changes({}, old) == [], "devices first seen healthy are no change"


def test_a_burst_beyond_the_pending_limit_is_shed_quietly() -> None:
    """More occurrences pending than the recorder remembers: the oldest are shed as load (counted
    like Events the write budget has no token for), in one warning a minute, never as errors."""
    api, clock = FakeKube(), Clock()
    shed: list[int] = []
    drops: list[int] = []
    rec = recorder(api, clock, on_throttled=lambda: shed.append(1), on_drop=lambda: drops.append(1))
    with capture_logs() as logs:
        for i in range(MAX_SERIES + 5):
            rec.record(notices.claim_ref(ClaimRef(f"uid-{i}", "ns", f"claim-{i}")), BROKEN)
        clock.now += SHED_LOG_SECONDS
        rec.record(notices.claim_ref(ClaimRef("uid-last", "ns", "claim-last")), BROKEN)
    assert len(shed) == 6 and drops == []
    assert [e for e in logs if e["log_level"] == "error"] == []
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert [(w["event"], w["dropped"]) for w in warnings] == [("Events shed under load", 1), ("Events shed under load", 5)]


def test_the_quietest_written_series_is_forgotten_first() -> None:
    """Past the limit a new series replaces the one that occurred longest ago among those already
    written; one that occurred again stays remembered."""
    api, clock = FakeKube(), Clock()
    rec = recorder(api, clock)
    refs = [notices.claim_ref(ClaimRef(f"uid-{i}", "ns", f"claim-{i}")) for i in range(MAX_SERIES)]
    for ref in refs:
        rec.record(ref, BROKEN)
    assert rec.write_due() is None and len(stored(api)) == MAX_SERIES
    clock.now += 60
    rec.record(refs[0], BROKEN)  # the first one again: now the most recent
    rec.record(notices.claim_ref(ClaimRef("uid-new", "ns", "claim-new")), BROKEN)
    remembered = {s.regarding.name for s in rec._series.values()}
    assert "claim-0" in remembered and "claim-new" in remembered
    assert "claim-1" not in remembered and "claim-2" in remembered


def pod_ref(i: int) -> ObjectRef:
    return ObjectRef("v1", "Pod", f"pod-{i}", uid=f"pod-uid-{i}", namespace="ns")


WHY = Occurrence("Warning", "Unsatisfiable", "Explain", "claim gpu (pod-gpu-x): no device matches")


def test_events_that_must_go_out_are_never_shed() -> None:
    """A pod's Event (recorded with ``wanted``) is what a person reads: a burst beyond the pending
    limit sheds the others, never these, and they do not count against the limit."""
    api, clock = FakeKube(), Clock()
    shed: list[int] = []
    rec = recorder(api, clock, on_throttled=lambda: shed.append(1))
    for i in range(MAX_SERIES + 10):
        rec.record(pod_ref(i), WHY, wanted=lambda: True)
    for i in range(MAX_SERIES + 3):
        rec.record(notices.claim_ref(ClaimRef(f"uid-{i}", "ns", f"claim-{i}")), BROKEN)
    assert len(shed) == 3
    assert rec.write_due() is None
    kinds = [e["regarding"]["kind"] for e in stored(api)]  # type: ignore[index]
    assert kinds.count("Pod") == MAX_SERIES + 10 and kinds.count("ResourceClaim") == MAX_SERIES


def test_an_event_that_must_go_out_waits_for_the_write_budget() -> None:
    """The write budget has no token (a client-side 429): the claims' Events are dropped as before,
    the pod's waits, tried again a moment later, and goes out once a token is there."""
    api, clock = FakeKube(), Clock()
    throttled: list[int] = []
    spent = ApiError(429, "ClientRateLimited", "events: dropped, the controller's write budget (250/s) is spent")
    api.fail["create:events"] = spent
    rec = recorder(api, clock, on_throttled=lambda: throttled.append(1))
    rec.record(pod_ref(1), WHY, wanted=lambda: True)
    rec.record(pod_ref(2), WHY, wanted=lambda: True)
    rec.record(NODE, BROKEN)
    wait = rec.write_due()
    assert throttled == [1], "the Event without wanted is dropped; the pods' wait"
    assert len(api.writes("create")) == 2, "one pod's Event tried, the other not while the budget is spent"
    assert wait is not None and wait > 0
    clock.now += 0.5
    assert rec.write_due() is not None and len(api.writes("create")) == 2, "not before the budget may be back"
    del api.fail["create:events"]
    clock.now += 1
    assert rec.write_due() is None
    assert sorted(e["regarding"]["name"] for e in stored(api)) == ["pod-1", "pod-2"]  # type: ignore[index]


def test_an_event_no_longer_wanted_is_not_written() -> None:
    """By the time the budget is back the pod no longer waits (or was since told another verdict):
    nothing is written for it, and a later occurrence is still written as new."""
    api, clock = FakeKube(), Clock()
    wanted = [False]
    rec = recorder(api, clock)
    rec.record(pod_ref(1), WHY, wanted=lambda: wanted[0])
    assert rec.write_due() is None and not stored(api)
    wanted[0] = True
    rec.record(pod_ref(1), WHY, wanted=lambda: wanted[0])
    assert rec.write_due() is None
    [event] = stored(api)
    assert "series" not in event, "the occurrence not written is not counted"
