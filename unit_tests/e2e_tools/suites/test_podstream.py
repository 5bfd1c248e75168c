"""The upgrade tests' reading of the kubelet's log (e2e/suites/podstream.py): the lines Kubernetes 1.37
writes for a failed NodePrepareResources / NodeUnprepareResources, counted per namespace."""

from __future__ import annotations

from e2e.suites.podstream import failure_lines, kubelet_failures, pod_problems, warning_events

# As the kubelet writes them (klog text format; kuberuntime_manager.go and pod_workers.go).
PREPARE = ('E1127 00:40:01.123456   4242 kuberuntime_manager.go:1727] "Failed to prepare dynamic resources" '
           'err="NodePrepareResources: rpc error: code = Unavailable desc = connection error" pod="{ns}/{pod}"')
NOT_REGISTERED = ('E1127 00:40:02.000001   4242 kuberuntime_manager.go:1727] "Failed to prepare dynamic resources" '
                  'err="DRA driver gpu.dra-driver.io is not registered" pod="{ns}/{pod}"')
UNPREPARE = ('E1127 00:40:03.000002   4242 pod_workers.go:1338] "Error syncing pod, skipping" err="unprepare dynamic '
             'resources: NodeUnprepareResources: rpc error: code = Unavailable desc = EOF" pod="{ns}/{pod}" '
             'podUID="0b5c5d8e-1111-4a4a-8b8b-000000000001"')
# The Event the failure also records, when the kubelet logs events (-v=3 and up): not a second failure.
EVENT = ('I1127 00:40:01.123500   4242 event.go:389] "Event occurred" object="{ns}/{pod}" fieldPath="" kind="Pod" '
         'apiVersion="v1" type="Warning" reason="FailedPrepareDynamicResources" '
         'message="Failed to prepare dynamic resources: NodePrepareResources: rpc error"')
OTHER = 'I1127 00:40:04.000000   4242 kubelet.go:2500] "SyncLoop ADD" source="api" pods=["{ns}/{pod}"]'


def log(*lines: str, ns: str = "e2e-abc", pod: str = "s0001") -> str:
    return "\n".join(line.format(ns=ns, pod=pod) for line in lines) + "\n"


def test_counts_each_failed_call_once_and_only_in_its_namespace() -> None:
    text = log(PREPARE, EVENT, NOT_REGISTERED, UNPREPARE, OTHER) + log(PREPARE, UNPREPARE, ns="e2e-other")
    assert kubelet_failures(text, "e2e-abc") == {"prepare": 2, "unprepare": 1}
    assert kubelet_failures(text, "e2e-other") == {"prepare": 1, "unprepare": 1}
    assert kubelet_failures(log(OTHER, EVENT), "e2e-abc") == {"prepare": 0, "unprepare": 0}
    assert len(failure_lines(text, "e2e-abc")) == 3


def test_warning_events_by_reason() -> None:
    events = [{"type": "Warning", "reason": "FailedPrepareDynamicResources", "count": 2},
              {"type": "Warning", "reason": "FailedScheduling"}, {"type": "Normal", "reason": "Started"}]
    assert warning_events(events) == {"FailedPrepareDynamicResources": 2, "FailedScheduling": 1}


def test_pod_problems() -> None:
    clean = {"stream_errors": [], "pods": 3, "planned": 3, "running": 3, "never_running": [], "not_gone": [],
             "failed_phase": [], "restarted": []}
    assert pod_problems(clean) == []
    stuck = clean | {"running": 2, "never_running": ["s0002"], "not_gone": ["s0002"]}
    assert len(pod_problems(stuck)) == 2
