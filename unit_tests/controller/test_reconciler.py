"""Controller decisions (pure functions) and the controller against a fake API server."""

from __future__ import annotations

import json
from typing import Any

import pytest
from ctrlfix import (
    CLASS,
    DRIVER,
    FakeClock,
    add_claim,
    add_pod,
    allocated_status,
    ann,
    claim,
    cluster,
    device_class,
    drain,
    events,
    fence_policy,
    gpu_slice,
    pod,
    settings,
    sharing_config,
    step,
    sync,
)
from kubefake import FakeKube

from dra_driver.allocator.resolve import Engine
from dra_driver.controller.allocating import ALLOCATION_SETTLE_SECONDS, allocation_conflicts
from dra_driver.controller.annotations import (
    annotation_patch,
    content_hash,
    desired_annotations,
    explanation_document,
    needs_event,
)
from dra_driver.controller.keys import (
    ALLOCATE_ANNOTATION,
    EXPLANATION_ANNOTATION,
    HASH_ANNOTATION,
    MAX_SUMMARY_CHARS,
    REPORTING_CONTROLLER,
    SUMMARY_ANNOTATION,
)
from dra_driver.controller.reconciler import Controller, Item, Kind
from dra_driver.controller.verdicts import (
    Action,
    Outcome,
    Verdict,
    claim_config_errors,
    classify,
    config_errors,
    object_config_errors,
)
from dra_driver.k8s.claims import FINALIZER, POD_CLAIM_NAME_ANNOTATION, device_ids, pod_claim_keys
from dra_driver.k8s.client import CLAIM_TEMPLATES, CLAIMS, CONFIGMAPS, DEVICE_CLASSES, PODS, SLICES, ApiError
from dra_driver.k8s.events import Occurrence
from dra_driver.k8s.fields import one_line
from dra_driver.k8s.objects import key_of

# ============================================================================ pure decisions


class TestPodClaimKeys:
    def test_direct_and_template_references(self) -> None:
        assert pod_claim_keys(pod("p", "c1")) == {"default/c1"}
        assert pod_claim_keys(pod("p", "p-gpu-abc", via_template=True)) == {"default/p-gpu-abc"}

    def test_template_claim_not_created_yet(self) -> None:
        p = pod("p", "x", via_template=True)
        p["status"].pop("resourceClaimStatuses")
        assert pod_claim_keys(p) == set()

    @pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
    def test_done_pods_wait_for_nothing(self, phase: str) -> None:
        assert pod_claim_keys(pod("p", "c1", phase=phase)) == set()

    def test_deleted_unscheduled_pod_is_done_but_scheduled_one_is_not(self) -> None:
        p = pod("p", "c1")
        p["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
        assert pod_claim_keys(p) == set()
        p["spec"]["nodeName"] = "node-a"
        assert pod_claim_keys(p) == {"default/c1"}

    def test_garbage_pod(self) -> None:
        assert pod_claim_keys({"metadata": {"name": "x"}, "spec": {"resourceClaims": [None, 3]}}) == set()


class TestClassify:
    def test_allocated(self) -> None:
        c = claim()
        c["status"] = allocated_status(["gpu-0"])
        assert classify(c, waited_for=True) is Action.IGNORE
        c["metadata"]["annotations"] = {SUMMARY_ANNOTATION: "x"}
        assert classify(c, waited_for=True) is Action.CLEAR

    def test_pending_for_pod_is_explained(self) -> None:
        assert classify(claim(), waited_for=True) is Action.EXPLAIN
        assert classify(claim(), waited_for=False) is Action.IGNORE

    def test_opt_in(self) -> None:
        assert classify(claim(opt_in=True), waited_for=False) is Action.ALLOCATE
        assert classify(claim(opt_in=True), waited_for=True) is Action.ALLOCATE
        other = claim(annotations={ALLOCATE_ANNOTATION: "scheduler"})
        assert classify(other, waited_for=False) is Action.IGNORE

    def test_opt_in_on_generated_claim_only_explains(self) -> None:
        c = claim(opt_in=True, annotations={POD_CLAIM_NAME_ANNOTATION: "gpu"})
        assert classify(c, waited_for=True) is Action.EXPLAIN
        c = claim(opt_in=True)
        c["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "1",
                                             "controller": True}]
        assert classify(c, waited_for=False) is Action.EXPLAIN

    def test_stale_explanation_is_cleared_when_nobody_waits(self) -> None:
        c = claim(annotations={HASH_ANNOTATION: "abc"})
        assert classify(c, waited_for=False) is Action.CLEAR

    def test_deletion(self) -> None:
        c = claim(opt_in=True)
        c["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
        assert classify(c, waited_for=False) is Action.IGNORE  # no finalizer
        c["metadata"]["finalizers"] = [FINALIZER]
        assert classify(c, waited_for=False) is Action.FINALIZE
        c["status"] = {**allocated_status(["gpu-0"]), "reservedFor": [{"resource": "pods", "name": "p", "uid": "1"}]}
        assert classify(c, waited_for=True) is Action.IGNORE  # in use: not ours to release
        plain = claim()
        plain["metadata"].update(deletionTimestamp="x", finalizers=[FINALIZER])
        assert classify(plain, waited_for=False) is Action.IGNORE  # the scheduler's claim


def outcome(summary: str = "cannot allocate: request gpu: 2 candidates, need 3", **kw: Any) -> Outcome:
    base: dict[str, Any] = dict(verdict=Verdict.UNSATISFIABLE, summary=summary, explanation={"k": "v"}, text=summary)
    base.update(kw)
    return Outcome(**base)


class TestAnnotations:
    def test_document_shape(self) -> None:
        doc = json.loads(explanation_document(outcome(config_errors=("a: b",))))
        assert doc == {"verdict": "Unsatisfiable", "summary": outcome().summary, "configErrors": ["a: b"],
                       "explanation": {"k": "v"}, "truncated": False}

    def test_trimmed_to_32_kib(self) -> None:
        big = {"requests": [{"closest": ["x" * 100] * 1000}]}
        text = "line\n" * 20000
        doc_text = explanation_document(outcome(explanation=big, text=text))
        assert len(doc_text.encode()) <= 32 * 1024
        doc = json.loads(doc_text)
        assert doc["truncated"] is True and doc["explanation"]["text"].startswith("line")

    def test_trimmed_even_with_huge_config_errors(self) -> None:
        errs = tuple(f"spec.devices.config[{i}].opaque.parameters: " + "é" * 2000 for i in range(40))
        doc_text = explanation_document(outcome(config_errors=errs, text="t" * 50000))
        assert len(doc_text.encode()) <= 32 * 1024
        assert json.loads(doc_text)["truncated"] is True

    def test_patch_dedup_by_hash(self) -> None:
        want = desired_annotations(outcome())
        assert want is not None and set(want) == {EXPLANATION_ANNOTATION, SUMMARY_ANNOTATION, HASH_ANNOTATION}
        assert annotation_patch({}, want) == want
        assert annotation_patch(dict(want), want) is None
        changed = desired_annotations(outcome("cannot allocate: other reason"))
        assert changed is not None
        assert annotation_patch(dict(want), changed) == changed

    def test_clear(self) -> None:
        assert annotation_patch({"other": "x"}, None) is None
        cur = {"other": "x", SUMMARY_ANNOTATION: "s", HASH_ANNOTATION: "h"}
        assert annotation_patch(cur, None) == {SUMMARY_ANNOTATION: None, HASH_ANNOTATION: None}
        assert desired_annotations(outcome(verdict=Verdict.SATISFIABLE)) is None

    def test_event_only_when_the_verdict_line_changes(self) -> None:
        o = outcome()
        assert needs_event({}, o)
        assert not needs_event({SUMMARY_ANNOTATION: o.summary}, o)
        assert needs_event({SUMMARY_ANNOTATION: "older"}, o)
        assert not needs_event({}, outcome(verdict=Verdict.SATISFIABLE))

    def test_summary_is_one_short_line(self) -> None:
        s = one_line("a\nb " + "x" * 5000, MAX_SUMMARY_CHARS)
        assert "\n" not in s and len(s.encode()) <= 1024


class TestEvents:
    def test_claim_event(self) -> None:
        kube = FakeKube()
        ctrl, _ = make(kube)
        c = claim()
        c["metadata"].update(uid="u1", resourceVersion="7")
        c.update(apiVersion="resource.k8s.io/v1", kind="ResourceClaim")
        ctrl.reporter.emit(c, Occurrence("Warning", "Unsatisfiable", "Explain", "x" * 3000), CLAIMS)
        drain(ctrl)
        [ev] = events(kube)
        assert ev["apiVersion"] == "events.k8s.io/v1"
        assert ev["reportingController"] == REPORTING_CONTROLLER == "gpu.dra-driver.io/controller"
        assert ev["type"] == "Warning" and ev["reason"] == "Unsatisfiable" and ev["action"] == "Explain"
        assert len(ev["note"].encode()) <= 1024
        assert ev["regarding"] == {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "name": "c1",
                                   "namespace": "default", "uid": "u1", "resourceVersion": "7"}
        assert ev["metadata"]["namespace"] == "default" and ev["metadata"]["name"].startswith("c1.")
        assert ev["eventTime"].endswith("Z")

    def test_cluster_scoped_object_events_go_to_default(self) -> None:
        kube = FakeKube()
        ctrl, _ = make(kube)
        ctrl.reporter.emit(device_class(), Occurrence("Warning", "InvalidConfig", "Validate", "n"), DEVICE_CLASSES)
        drain(ctrl)
        [ev] = events(kube)
        assert ev["metadata"]["namespace"] == "default"
        assert "namespace" not in ev["regarding"] and ev["regarding"]["kind"] == "DeviceClass"


class TestConfigValidation:
    def test_good_and_foreign_configs_pass(self) -> None:
        foreign = {"opaque": {"driver": "other.example.com", "parameters": {"anything": 1}}}
        assert config_errors([sharing_config(), foreign], DRIVER, "spec.devices.config") == []

    def test_bad_config_names_the_field(self) -> None:
        errs = config_errors([sharing_config(), sharing_config("Bogus")], DRIVER, "spec.devices.config")
        assert len(errs) == 1
        assert errs[0].startswith("spec.devices.config[1].opaque.parameters.sharing.strategy: ")

    def test_not_an_object(self) -> None:
        errs = config_errors([{"opaque": {"driver": DRIVER, "parameters": "nope"}}], DRIVER, "p")
        assert errs and errs[0].startswith("p[0].opaque.parameters")
        assert config_errors("nope", DRIVER, "p") == ["p: must be a list"]

    def test_per_kind_paths(self) -> None:
        bad = sharing_config("Bogus")
        cls = {"kind": "DeviceClass", **device_class(config=[bad])}
        assert object_config_errors(cls, DRIVER)[0].startswith("spec.config[0].")
        tmpl = {"kind": "ResourceClaimTemplate", "metadata": {"name": "t"},
                "spec": {"spec": {"devices": {"config": [bad]}}}}
        assert object_config_errors(tmpl, DRIVER)[0].startswith("spec.spec.devices.config[0].")

    def test_claim_inherits_class_errors(self) -> None:
        classes = {CLASS: device_class(config=[sharing_config("Bogus")])}
        errs = claim_config_errors(claim(), classes, DRIVER)
        assert errs and errs[0].startswith(f"deviceclass {CLASS}: spec.config[0]")


class TestConflicts:
    def test_exclusive_overlap_only(self) -> None:
        mine = allocated_status(["gpu-0", "gpu-1"])["allocation"]
        other = claim("o")
        other["metadata"]["uid"] = "o"
        other["status"] = allocated_status(["gpu-1"])
        admin = claim("a")
        admin["metadata"]["uid"] = "a"
        admin["status"] = allocated_status(["gpu-0"])
        admin["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
        found = allocation_conflicts(mine, "me", [other, admin])
        assert [(key_of(c), d) for c, d in found] == [("default/o", {(DRIVER, "node-a", "gpu-1")})]
        assert allocation_conflicts(mine, "o", [other]) == []  # itself


# ============================================================================ controller + fake API


FIRST_GPU = 'device.attributes["gpu.dra-driver.io"].index == 0'


def make(kube: FakeKube, *, fenced: bool = True, **kw: Any) -> tuple[Controller, FakeClock]:
    """A controller on ``kube``; ``fenced``: the cluster has the allocation-fence policy."""
    clock = FakeClock()
    if fenced:
        fence_policy(kube)
    kw.setdefault("sleep", lambda _s: None)
    c = Controller(kube, settings(), clock=clock, **kw)
    return c, clock


class SpyEngine(Engine):
    """The real engine, counting resolve calls (optionally raising)."""

    def __init__(self, raise_on_resolve: Exception | None = None) -> None:
        self.calls: list[str] = []
        self.raise_on_resolve = raise_on_resolve

    def resolve(self, claim: Any, inventory: Any, classes: Any, allocated: Any = None, nodes: Any = None,
                rules: Any = None) -> Any:
        self.calls.append(claim["metadata"]["name"])
        if self.raise_on_resolve is not None:
            raise self.raise_on_resolve
        return super().resolve(claim, inventory, classes, allocated, nodes, rules)


class TestInventoryReuse:
    SPECIAL = 'device.attributes["gpu.dra-driver.io"].type == "special"'

    def test_slice_update_rebuilds_the_changed_pool_only(self) -> None:
        kube = cluster(slices=2, gpus=2)
        add_claim(kube, claim(selectors=[{"cel": {"expression": self.SPECIAL}}]))
        add_pod(kube, pod("p", "c1"))
        builds: list[Any] = []

        class Recording(SpyEngine):
            def build_inventory(self, slices: list[Any], previous: Any = None, prebuilt: Any = None) -> Any:
                inv = super().build_inventory(slices, previous, prebuilt)
                builds.append((inv, previous))
                return inv

        ctrl, _ = make(kube, engine=Recording())
        step(ctrl)
        assert "0 candidates" in ann(kube)[SUMMARY_ANNOTATION]  # no device is "special" yet
        first = builds[-1][0]
        s = kube.obj(SLICES, "node-a-gpu.dra-driver.io")
        assert s is not None
        s["spec"]["devices"][1]["attributes"]["type"] = {"string": "special"}
        kube.set(SLICES, s)
        step(ctrl)
        second, previous = builds[-1]
        assert previous is first  # the controller hands its last inventory over
        changed, unchanged = (second.by_key[("gpu.dra-driver.io", f"node-{n}", "gpu-0")] for n in "ab")
        assert changed is not first.by_key[changed.key]  # its slice changed: digested again
        assert unchanged is first.by_key[unchanged.key]  # taken over
        assert not any(k.startswith("gpu.dra-driver.io/explanation") for k in ann(kube))  # now satisfiable


class TestExplain:
    def test_unsatisfiable_pod_claim_is_explained_once(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim(count=3))
        add_pod(kube, pod("p", "c1"))
        ctrl, _ = make(kube)
        step(ctrl)
        a = ann(kube)
        doc = json.loads(a[EXPLANATION_ANNOTATION])
        assert doc["verdict"] == "Unsatisfiable" and "need 3" in a[SUMMARY_ANNOTATION]
        assert a[HASH_ANNOTATION] == content_hash(a[EXPLANATION_ANNOTATION])
        evs = events(kube, "Unsatisfiable", "ResourceClaim")
        assert len(evs) == 1 and evs[0]["note"] == a[SUMMARY_ANNOTATION] and evs[0]["type"] == "Warning"
        [on_pod] = events(kube, "Unsatisfiable", "Pod")
        assert on_pod["note"] == f"claim gpu (c1): {a[SUMMARY_ANNOTATION]}" and on_pod["type"] == "Warning"
        assert ctrl.metrics.value("claims_explained_total") == 1
        # Nothing changed: a resync writes nothing.
        before = len(kube.writes())
        ctrl.resync()
        step(ctrl)
        assert len(kube.writes()) == before
        # The scheduler's job: the controller never touched status or finalizers.
        assert not kube.writes("replace_status") and not kube.writes("replace")

    def test_no_duplicate_event_after_restart(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim(count=2))
        add_pod(kube, pod("p", "c1"))
        step(make(kube)[0])
        step(make(kube)[0])
        assert len(events(kube, "Unsatisfiable", "ResourceClaim")) == 1
        [on_pod] = events(kube, "Unsatisfiable", "Pod")
        assert on_pod["series"]["count"] == 2, "a new process tells the pod once more, in the same Event"

    def test_becomes_satisfiable_then_annotations_go(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim(count=3))
        add_pod(kube, pod("p", "c1"))
        ctrl, _ = make(kube)
        step(ctrl)
        assert SUMMARY_ANNOTATION in ann(kube)
        kube.add(SLICES, gpu_slice("node-a", 4, name="bigger"))
        kube.delete(SLICES, "node-a-gpu.dra-driver.io")
        step(ctrl)
        assert not any(k.startswith("gpu.dra-driver.io/explanation") for k in ann(kube))
        assert not kube.writes("replace_status")

    def test_scheduler_allocation_clears_the_explanation(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim(count=2))
        add_pod(kube, pod("p", "c1"))
        ctrl, _ = make(kube)
        step(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None
        c["status"] = allocated_status(["gpu-0"])
        kube.set(CLAIMS, c)  # the scheduler wins, whatever we thought
        step(ctrl)
        assert ann(kube) == {}

    def test_verdict_change_updates_and_emits_again(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim(count=3))
        add_pod(kube, pod("p", "c1"))
        ctrl, _ = make(kube)
        step(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None
        c["spec"]["devices"]["requests"][0]["exactly"]["count"] = 5  # (spec is immutable; fine for the test)
        kube.set(CLAIMS, c)
        step(ctrl)
        assert "need 5" in ann(kube)[SUMMARY_ANNOTATION]
        assert len(events(kube, "Unsatisfiable", "ResourceClaim")) == 2
        assert len(events(kube, "Unsatisfiable", "Pod")) == 2

    def test_claim_nobody_waits_for_is_left_alone(self) -> None:
        kube = cluster()
        add_claim(kube, claim(count=9))
        ctrl, _ = make(kube)
        step(ctrl)
        assert kube.writes() == []

    def test_pod_finishing_clears_the_explanation(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim(count=2))
        p = add_pod(kube, pod("p", "c1"))
        ctrl, _ = make(kube)
        step(ctrl)
        assert ann(kube)
        p["status"]["phase"] = "Failed"
        kube.set(PODS, p)
        step(ctrl)
        assert ann(kube) == {}

    def test_template_generated_claim_found_through_pod_status(self) -> None:
        kube = cluster(gpus=1)
        c = claim("p-gpu-x1", count=2, annotations={POD_CLAIM_NAME_ANNOTATION: "gpu"})
        add_claim(kube, c)
        add_pod(kube, pod("p", "p-gpu-x1", via_template=True))
        step(make(kube)[0])
        assert "need 2" in ann(kube, "default/p-gpu-x1")[SUMMARY_ANNOTATION]

    def test_ten_events_one_resolve(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim(count=2))
        add_pod(kube, pod("p", "c1"))
        spy = SpyEngine()
        ctrl, _ = make(kube, engine=spy)
        sync(ctrl)
        for _ in range(10):
            ctrl.queue.add(Item(Kind.CLAIM, "default/c1"))
        drain(ctrl)
        assert spy.calls == ["c1"]


class TestBadInput:
    @pytest.mark.parametrize(
        "mutate",
        [
            pytest.param(lambda c: c["spec"]["devices"]["requests"][0]["exactly"].update(
                selectors=[{"cel": {"expression": "device.attributes[ 'x' ==="}}]), id="malformed-cel"),
            pytest.param(lambda c: c["spec"]["devices"]["requests"][0]["exactly"].update(
                deviceClassName="nope"), id="unknown-class"),
            pytest.param(lambda c: c["spec"]["devices"]["requests"][0]["exactly"].update(count=0), id="count-0"),
            pytest.param(lambda c: c["spec"]["devices"]["requests"][0]["exactly"].update(count=10**12),
                         id="huge-count"),
            pytest.param(lambda c: c["spec"]["devices"].update(requests="garbage"), id="garbage-requests"),
            pytest.param(lambda c: c.update(spec=None), id="no-spec"),
        ],
    )
    def test_becomes_an_annotation_and_event(self, mutate: Any) -> None:
        kube = cluster()
        c = claim()
        mutate(c)
        add_claim(kube, c)
        add_pod(kube, pod("p", "c1"))
        ctrl, _ = make(kube)
        step(ctrl)
        a = ann(kube)
        assert a[SUMMARY_ANNOTATION]
        assert json.loads(a[EXPLANATION_ANNOTATION])["verdict"] in ("Unsatisfiable", "Error")
        assert len(events(kube, kind="ResourceClaim")) == 1 and len(events(kube, kind="Pod")) == 1

    def test_garbage_slices(self) -> None:
        kube = cluster()
        kube.add(SLICES, {"metadata": {"name": "junk"}, "spec": "garbage"})
        kube.add(SLICES, {"metadata": {"name": "junk2"}, "spec": {"driver": DRIVER, "devices": [None, 5]}})
        add_claim(kube, claim(count=5))
        add_pod(kube, pod("p", "c1"))
        ctrl, _ = make(kube)
        step(ctrl)
        assert SUMMARY_ANNOTATION in ann(kube)

    def test_engine_exception_is_contained(self) -> None:
        kube = cluster()
        add_claim(kube, claim())
        add_pod(kube, pod("p", "c1"))
        ctrl, _ = make(kube, engine=SpyEngine(raise_on_resolve=RuntimeError("boom")))
        step(ctrl)
        a = ann(kube)
        assert json.loads(a[EXPLANATION_ANNOTATION])["verdict"] == "Error" and "boom" in a[SUMMARY_ANNOTATION]
        assert events(kube, "ResolveError")
        assert ctrl.metrics.value("errors_total", {"kind": "resolve"}) == 1

    def test_api_failure_is_counted_and_retried_and_others_proceed(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim("c1", count=2))
        add_claim(kube, claim("c2", count=2))
        add_pod(kube, pod("p1", "c1"))
        add_pod(kube, pod("p2", "c2"))
        ctrl, clock = make(kube)
        kube.fail["merge_patch:resourceclaims"] = ApiError(500, "InternalError", "etcd down")
        step(ctrl)
        assert ctrl.metrics.value("errors_total", {"kind": "sync"}) == 2
        del kube.fail["merge_patch:resourceclaims"]
        clock.advance(1)
        drain(ctrl)
        assert SUMMARY_ANNOTATION in ann(kube, "default/c1") and SUMMARY_ANNOTATION in ann(kube, "default/c2")

    def test_event_failure_does_not_stop_annotation(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim(count=2))
        add_pod(kube, pod("p", "c1"))
        kube.fail["create:events"] = ApiError(403, "Forbidden", "no")
        ctrl, _ = make(kube)
        step(ctrl)
        assert SUMMARY_ANNOTATION in ann(kube)
        assert ctrl.metrics.value("errors_total", {"kind": "event"}) == 2  # the claim's and the pod's


class TestInvalidConfig:
    def test_claim_config_error_in_annotation_and_event(self) -> None:
        kube = cluster()
        add_claim(kube, claim(config=[sharing_config("Bogus")]))
        add_pod(kube, pod("p", "c1"))
        step(make(kube)[0])
        doc = json.loads(ann(kube)[EXPLANATION_ANNOTATION])
        assert doc["verdict"] == "InvalidConfig"
        assert doc["configErrors"][0].startswith("spec.devices.config[0].opaque.parameters.sharing.strategy")
        evs = events(kube, "InvalidConfig", "ResourceClaim")
        assert len(evs) == 1 and "sharing.strategy" in evs[0]["note"]
        [on_pod] = events(kube, "InvalidConfig", "Pod")
        assert on_pod["note"].startswith("claim gpu (c1): invalid configuration for") and "sharing.strategy" in on_pod["note"]

    def test_flagged_before_any_pod_uses_it(self) -> None:
        kube = cluster()
        add_claim(kube, claim(config=[sharing_config("Bogus")]))
        step(make(kube)[0])
        assert json.loads(ann(kube)[EXPLANATION_ANNOTATION])["verdict"] == "InvalidConfig"
        assert len(events(kube, "InvalidConfig")) == 1

    def test_opted_in_claim_with_bad_config_is_not_allocated(self) -> None:
        kube = cluster()
        add_claim(kube, claim(opt_in=True, config=[sharing_config("Bogus")]))
        step(make(kube)[0])
        assert not kube.writes("replace_status")
        assert events(kube, "InvalidConfig")

    def test_device_class_and_template_events_once(self) -> None:
        kube = FakeKube()
        kube.add(DEVICE_CLASSES, device_class("bad", config=[sharing_config("Bogus")]))
        kube.add(CLAIM_TEMPLATES, {"metadata": {"name": "t", "namespace": "ns1"},
                                   "spec": {"spec": {"devices": {"config": [sharing_config("Nope")]}}}})
        ctrl, _ = make(kube)
        step(ctrl)
        ctrl.resync()
        step(ctrl)
        evs = events(kube, "InvalidConfig")
        assert len(evs) == 2
        by_kind = {e["regarding"]["kind"]: e for e in evs}
        assert by_kind["DeviceClass"]["metadata"]["namespace"] == "default"
        assert "spec.config[0].opaque.parameters.sharing.strategy" in by_kind["DeviceClass"]["note"]
        assert by_kind["ResourceClaimTemplate"]["metadata"]["namespace"] == "ns1"
        assert "spec.spec.devices.config[0]" in by_kind["ResourceClaimTemplate"]["note"]

    def test_a_restarted_controller_adds_to_the_same_event(self) -> None:
        kube = FakeKube()
        kube.add(DEVICE_CLASSES, device_class("bad", config=[sharing_config("Bogus")]))
        for _ in range(3):  # each new process validates the class once more
            step(make(kube)[0])
        [ev] = events(kube, "InvalidConfig")
        assert ev["series"]["count"] == 3, "one Event, counted three times (it was three Events)"


class TestAllocate:
    def test_allocates_opted_in_claim(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim(count=2, opt_in=True))
        ctrl, _ = make(kube)
        step(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None
        assert FINALIZER in c["metadata"]["finalizers"]
        assert device_ids(c["status"]["allocation"]) == {(DRIVER, "node-a", "gpu-0"), (DRIVER, "node-a", "gpu-1")}
        assert c["status"]["allocation"]["nodeSelector"]
        # finalizer first (update), then status (update of the subresource), no patches of status
        writes = [w for w in kube.writes() if w[1] == "resourceclaims"]
        assert [w[0] for w in writes] == ["replace", "dry_run_status", "replace_status"]
        assert ctrl.metrics.value("claims_allocated_total") == 1
        assert events(kube, "Allocated")[0]["type"] == "Normal"

    def test_two_opted_in_claims_never_share_a_device(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim("c1", opt_in=True))
        add_claim(kube, claim("c2", opt_in=True))
        add_claim(kube, claim("c3", opt_in=True))
        ctrl, _ = make(kube)
        step(ctrl)
        got = [kube.obj(CLAIMS, f"default/c{i}") for i in (1, 2, 3)]
        devs = [device_ids(c["status"].get("allocation")) for c in got if c and c.get("status")]
        allocated = [d for d in devs if d]
        assert len(allocated) == 2 and not (allocated[0] & allocated[1])
        left = [c for c in got if c and not (c.get("status") or {}).get("allocation")]
        assert len(left) == 1 and SUMMARY_ANNOTATION in left[0]["metadata"]["annotations"]

    def test_ledger_covers_informer_lag(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim("c1", opt_in=True))
        add_claim(kube, claim("c2", opt_in=True))
        ctrl, _ = make(kube)
        sync(ctrl)
        # Process both without letting the informers see the first write.
        drain(ctrl)
        a = kube.obj(CLAIMS, "default/c1")
        b = kube.obj(CLAIMS, "default/c2")
        assert a and b
        assert not (device_ids(a["status"]["allocation"]) & device_ids(b["status"]["allocation"]))

    def test_fresh_list_sees_what_the_cache_missed(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim("c1", opt_in=True))
        ctrl, _ = make(kube)
        sync(ctrl)
        # The scheduler allocated the only GPU to another claim; our informer has not seen it.
        other = claim("sched")
        other["status"] = allocated_status(["gpu-0"])
        add_claim(kube, other)
        drain(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None and not c.get("status", {}).get("allocation")
        assert "Unsatisfiable" in ann(kube)[EXPLANATION_ANNOTATION]

    def test_conflict_on_status_write_re_resolves(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim(opt_in=True))
        ctrl, clock = make(kube)
        sync(ctrl)

        def scheduler_writes_first(k: FakeKube, res: Any, _: Any) -> None:
            c = k.obj(CLAIMS, "default/c1")
            assert c is not None
            c["status"] = allocated_status(["gpu-1"])
            k.set(CLAIMS, c)

        kube.hooks["replace_status:resourceclaims"] = scheduler_writes_first
        drain(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None
        assert device_ids(c["status"]["allocation"]) == {(DRIVER, "node-a", "gpu-1")}  # the scheduler's
        assert ctrl.metrics.value("errors_total", {"kind": "conflict"}) == 1
        assert ctrl.metrics.value("claims_allocated_total") == 0
        clock.advance(1)
        step(ctrl)
        assert device_ids(kube.obj(CLAIMS, "default/c1")["status"]["allocation"]) == {
            (DRIVER, "node-a", "gpu-1")}

    def test_conflict_on_finalizer_write_retries(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim(opt_in=True))
        ctrl, clock = make(kube)
        sync(ctrl)

        def touch(k: FakeKube, res: Any, _: Any) -> None:
            c = k.obj(CLAIMS, "default/c1")
            assert c is not None
            c["metadata"].setdefault("labels", {})["x"] = "y"
            k.set(CLAIMS, c)

        kube.hooks["replace:resourceclaims"] = touch
        drain(ctrl)
        assert not kube.writes("replace_status")
        clock.advance(1)
        step(ctrl)
        assert kube.obj(CLAIMS, "default/c1")["status"]["allocation"]

    def _race_after_write(self, kube: FakeKube, reserved: bool) -> None:
        """After our status write, the scheduler writes another claim with the same GPU."""

        def after_our_write(k: FakeKube, res: Any, _: Any) -> None:
            def scheduler(k2: FakeKube, res2: Any, _2: Any) -> None:
                other = claim("sched")
                other["status"] = allocated_status(["gpu-0"])
                k2.add(CLAIMS, other)
                if reserved:
                    c = k2.obj(CLAIMS, "default/c1")
                    assert c is not None
                    c["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "pu"}]
                    k2.set(CLAIMS, c)

            k.hooks["list:resourceclaims"] = scheduler

        kube.hooks["replace_status:resourceclaims"] = after_our_write

    def test_post_write_conflict_rolls_back(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim(opt_in=True, selectors=[{"cel": {"expression": FIRST_GPU}}]))
        ctrl, _ = make(kube)
        sync(ctrl)
        self._race_after_write(kube, reserved=False)
        drain(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None and not c["status"].get("allocation")
        assert events(kube, "AllocationRolledBack")
        assert ctrl.metrics.value("errors_total", {"kind": "allocation_conflict"}) == 1

    def test_post_write_conflict_in_use_is_reported(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim(opt_in=True, selectors=[{"cel": {"expression": FIRST_GPU}}]))
        ctrl, _ = make(kube)
        sync(ctrl)
        self._race_after_write(kube, reserved=True)
        drain(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None and c["status"].get("allocation")  # in use: never pulled away
        assert events(kube, "DeviceConflict")
        assert ctrl.metrics.value("errors_total", {"kind": "double_allocation"}) == 1

    def test_settled_verification_ends_tracking(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim(opt_in=True))
        ctrl, clock = make(kube)
        step(ctrl)
        assert ctrl.accounting.written()
        clock.advance(ALLOCATION_SETTLE_SECONDS + 0.1)
        step(ctrl)
        assert not ctrl.accounting.written()
        lists = len([c for c in kube.calls if c[0] == "list"])
        ctrl.resync()
        drain(ctrl)
        assert len([c for c in kube.calls if c[0] == "list"]) == lists  # no more verification reads

    def test_foreign_driver_is_not_allocated(self) -> None:
        kube = FakeKube()
        kube.add(SLICES, gpu_slice("node-a", 1, driver="nic.example.com"))
        kube.add(DEVICE_CLASSES, device_class("nic", driver="nic.example.com"))
        add_claim(kube, claim(opt_in=True, cls="nic"))
        step(make(kube)[0])
        assert not kube.writes("replace_status")
        doc = json.loads(ann(kube)[EXPLANATION_ANNOTATION])
        assert doc["verdict"] == "NotAllocatable"
        assert events(kube, "NotAllocatable")

    def test_already_allocated_by_the_scheduler_is_left_alone(self) -> None:
        kube = cluster()
        c = claim(opt_in=True)
        c["status"] = allocated_status(["gpu-0"])
        add_claim(kube, c)
        step(make(kube)[0])
        assert kube.writes() == []

    def test_non_leader_writes_nothing(self) -> None:
        class Follower:
            def is_leader(self) -> bool:
                return False

        kube = cluster(gpus=1)
        add_claim(kube, claim(opt_in=True))
        add_claim(kube, claim("c2", count=3))
        add_pod(kube, pod("p", "c2"))
        ctrl, _ = make(kube, leadership=Follower())
        step(ctrl)
        assert kube.writes() == []


class TestFinalize:
    def test_deleted_opted_in_claim_is_released(self) -> None:
        kube = cluster()
        add_claim(kube, claim(opt_in=True))
        ctrl, clock = make(kube)
        step(ctrl)
        assert kube.obj(CLAIMS, "default/c1")["status"]["allocation"]
        kube.delete(CLAIMS, "default/c1")
        clock.advance(10)
        step(ctrl)
        assert kube.obj(CLAIMS, "default/c1") is None

    def test_reserved_claim_is_kept(self) -> None:
        kube = cluster()
        add_claim(kube, claim(opt_in=True))
        ctrl, clock = make(kube)
        step(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None
        c["status"]["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "1"}]
        kube.set(CLAIMS, c)
        kube.delete(CLAIMS, "default/c1")
        clock.advance(10)
        step(ctrl)
        kept = kube.obj(CLAIMS, "default/c1")
        assert kept is not None and kept["status"]["allocation"] and FINALIZER in kept["metadata"]["finalizers"]


def test_queue_item_for_missing_objects_is_harmless() -> None:
    kube = cluster()
    ctrl, _ = make(kube)
    for item in (Item(Kind.CLAIM, "default/ghost"), Item(Kind.CLASS, "ghost"), Item(Kind.TEMPLATE, "ns/ghost")):
        ctrl.queue.add(item)
    drain(ctrl)
    assert kube.writes() == []


class TestAllocationFence:
    """Opt-in allocation goes through the fence ledger (dra_driver.controller.fence): devices are recorded
    and the admission policy's denial of a sentinel proves them enforced before the write."""

    @staticmethod
    def ledger(kube: FakeKube) -> dict[str, str]:
        cm = kube.obj(CONFIGMAPS, "kube-system/dra-driver-allocations")
        return dict((cm or {}).get("data") or {})

    def test_devices_are_in_the_ledger_before_the_allocation(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim(count=2, opt_in=True))
        seen: list[dict[str, str]] = []
        kube.hooks["replace_status:resourceclaims"] = lambda k, res, _: seen.append(self.ledger(k))
        ctrl, _ = make(kube)
        step(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None and c["status"].get("allocation")
        uid = c["metadata"]["uid"]
        held = {k for k, v in seen[0].items() if v == uid}
        assert held == {f"{DRIVER}_node-a_gpu-0", f"{DRIVER}_node-a_gpu-1"}
        assert [w[0] for w in kube.calls if w[1] == "resourceclaims" and w[0] == "dry_run_status"] == ["dry_run_status"]
        # The entries stay while the claim holds the devices.
        assert {k for k, v in self.ledger(kube).items() if v == uid} == held

    def test_a_scheduler_write_of_a_held_device_is_refused(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim("c1", opt_in=True))
        add_claim(kube, claim("sched"))
        ctrl, _ = make(kube)
        step(ctrl)
        other = kube.obj(CLAIMS, "default/sched")
        assert other is not None
        other["status"] = allocated_status(["gpu-0"])
        with pytest.raises(ApiError) as err:
            kube.replace_status(CLAIMS, other)
        assert err.value.status == 403 and "allocation fence" in str(err.value)

    def test_without_the_policy_nothing_is_allocated_and_the_claim_says_why(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim("c1", opt_in=True))
        ctrl, _ = make(kube, fenced=False)
        step(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None and not (c.get("status") or {}).get("allocation")
        assert not kube.writes("replace_status")
        note = events(kube, "AllocationFenceMissing")[0]["note"]
        assert "allocation-fence.gpu.dra-driver.io" in note and "kube-system/dra-driver-allocations" in note
        assert ctrl.metrics.value("errors_total", {"kind": "fence_inactive"}) == 1
        assert not [k for k, v in self.ledger(kube).items() if v == c["metadata"]["uid"]]  # released

    def test_a_stale_ledger_in_admission_is_waited_out(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim("c1", opt_in=True))
        stale = {"left": 3}

        def older_ledger(verb: str, res: Any, new: Any, old: Any) -> None:
            if verb == "dry_run_status" and stale["left"]:
                stale["left"] -= 1
                raise ApiError(403, "Forbidden", f"allocation fence: device {DRIVER}_node-a_gpu-0 is held by "
                                                 "the dra-driver controller for claim released-long-ago")

        kube.admission.insert(0, older_ledger)
        ctrl, _ = make(kube)
        step(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None and c["status"].get("allocation")
        assert stale["left"] == 0 and len([w for w in kube.calls if w[0] == "dry_run_status"]) == 4

    def test_device_held_for_another_claim_is_not_reserved(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim("c1", opt_in=True))
        kube.add(CONFIGMAPS, {"metadata": {"name": "dra-driver-allocations", "namespace": "kube-system"},
                              "data": {f"{DRIVER}_node-a_gpu-0": "someone-else"}})  # fmt: skip
        ctrl, _ = make(kube)
        step(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None and not (c.get("status") or {}).get("allocation")
        assert self.ledger(kube) == {f"{DRIVER}_node-a_gpu-0": "someone-else"}

    def test_ledger_entries_go_with_the_claim(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim("c1", opt_in=True))
        ctrl, _ = make(kube)
        step(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None and any(v == c["metadata"]["uid"] for v in self.ledger(kube).values())
        kube.delete(CLAIMS, "c1", namespace="default")
        step(ctrl)
        assert kube.obj(CLAIMS, "default/c1") is None  # finalizer released after deallocation
        assert not any(v == c["metadata"]["uid"] for v in self.ledger(kube).values())

    def test_collection_drops_entries_of_vanished_claims_only(self) -> None:
        kube = cluster(gpus=2)
        add_claim(kube, claim("c1", opt_in=True))
        ctrl, _ = make(kube)
        step(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None
        cm = kube.obj(CONFIGMAPS, "kube-system/dra-driver-allocations")
        assert cm is not None
        cm["data"][f"{DRIVER}_node-a_gpu-1"] = "gone-uid"
        kube.set(CONFIGMAPS, cm)
        ctrl.allocator.collect_ledger()
        assert {v for k, v in self.ledger(kube).items() if not k.startswith("fence.")} == {c["metadata"]["uid"]}

    def test_device_allocated_before_the_fence_is_not_written(self) -> None:
        kube = cluster(gpus=1)
        add_claim(kube, claim("c1", opt_in=True))

        def scheduler_allocates(k: FakeKube, res: Any, _: Any) -> None:
            other = claim("sched")
            other["status"] = allocated_status(["gpu-0"])
            k.add(CLAIMS, other)

        kube.hooks["replace:resourceclaims"] = scheduler_allocates
        ctrl, _ = make(kube)
        step(ctrl)
        c = kube.obj(CLAIMS, "default/c1")
        assert c is not None and not (c.get("status") or {}).get("allocation")
        assert not kube.writes("replace_status")
