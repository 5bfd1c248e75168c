"""What the controller's informers keep (dra_driver.controller.views, dra_driver.k8s.compact), and
that it answers every question the controller asks as the whole object would (what it costs is the
informer-memory bench's: unit_tests/e2e_tools/bench/test_storemem.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubefake import FakeKube

from dra_driver.allocator.inventory import allocated_state
from dra_driver.controller.annotations import annotation_patch, desired_annotations
from dra_driver.controller.keys import ALLOCATE_ANNOTATION, EXPLANATION_ANNOTATION, HASH_ANNOTATION, SUMMARY_ANNOTATION
from dra_driver.controller.verdicts import Action, Outcome, Verdict, classify
from dra_driver.controller.views import claim_view, needs_no_work, pod_view, slice_view
from dra_driver.k8s.claims import pod_claim_keys, pod_is_done, pod_node
from dra_driver.k8s.client import CLAIMS, PODS, SLICES
from dra_driver.k8s.compact import Interner
from dra_driver.k8s.informer import Informer
from dra_driver.k8s.objects import Obj, key_of
from e2e.generators.clusterobjects import job_claim, job_pod, plugin_slice


def _pods() -> list[Obj]:
    direct = job_pod(1)
    direct["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "shared-gpu"}]
    pending = job_pod(2, claim="c2")
    pending["spec"].pop("nodeName")
    pending["status"]["phase"] = "Pending"
    done = job_pod(3, claim="c3")
    done["status"]["phase"] = "Succeeded"
    deleting_unscheduled = copy.deepcopy(pending)
    deleting_unscheduled["metadata"]["deletionTimestamp"] = "2026-11-25T10:00:00Z"
    deleting_unscheduled["metadata"]["name"] = "deleted-before-scheduling"
    deleting_running = job_pod(4, claim="c4")
    deleting_running["metadata"]["deletionTimestamp"] = "2026-11-25T10:00:00Z"
    extended = job_pod(5)
    extended["status"]["extendedResourceClaimStatus"] = {"resourceClaimName": "ext-5", "requestMappings": []}
    return [job_pod(0), job_pod(0, claim="c0"), direct, pending, done, deleting_unscheduled, deleting_running, extended]


@pytest.mark.parametrize("pod", _pods(), ids=lambda p: p["metadata"]["name"])
def test_a_pod_view_answers_as_the_pod(pod: Obj) -> None:
    view = pod_view(copy.deepcopy(pod))
    if not pod_claim_keys(pod):
        assert view is None
        return
    assert view is not None
    assert pod_claim_keys(view) == pod_claim_keys(pod) and pod_node(view) == pod_node(pod)
    assert pod_is_done(view) == pod_is_done(pod) and key_of(view) == key_of(pod)
    assert view["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]
    assert "containers" not in view["spec"] and "managedFields" not in view["metadata"] and "status" not in view


def test_a_pod_read_in_protobuf_gives_the_view_of_its_json() -> None:
    # The API server's protobuf carries a toleration's empty fields as "" where JSON leaves them out
    # (seen on 1.37.2 for the default not-ready/unreachable tolerations): one pod, one view.
    as_json = job_pod(1, claim="c1")
    as_json["spec"]["tolerations"] = [
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        {"operator": "Exists"}]
    as_protobuf = copy.deepcopy(as_json)
    as_protobuf["spec"]["tolerations"] = [
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "value": "", "effect": "NoExecute"},
        {"key": "", "operator": "Exists", "value": "", "effect": ""}]
    view = pod_view(as_json)
    assert view is not None and view == pod_view(as_protobuf)
    assert view["spec"]["tolerations"] == [
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}, {"operator": "Exists"}]


def test_pods_that_wait_for_nothing_are_not_kept() -> None:
    assert [p["metadata"]["name"] for p in _pods() if pod_view(copy.deepcopy(p)) is None] == [
        "job-000000-abcde", "job-000003-abcde", "deleted-before-scheduling"]


EXPLAINED = desired_annotations(Outcome(verdict=Verdict.UNSATISFIABLE, summary="cannot allocate",
                                        explanation={"closest": ["x" * 20_000]}), "gpu.dra-driver.io")
assert EXPLAINED is not None


def _claims() -> list[Obj]:
    explained = job_claim(1, allocated=False)
    explained["metadata"]["annotations"].update(EXPLAINED)
    allocated_explained = job_claim(2)
    allocated_explained["metadata"]["annotations"][SUMMARY_ANNOTATION] = "cannot allocate"
    deleting = job_claim(3)
    deleting["metadata"]["deletionTimestamp"] = "2026-11-25T10:00:00Z"
    deleting["metadata"]["annotations"].update(EXPLAINED)
    opted_in = job_claim(4)
    opted_in["metadata"]["annotations"][ALLOCATE_ANNOTATION] = "controller"
    shared = job_claim(5)
    shared["status"]["allocation"]["devices"]["results"].append(
        {"request": "gpu", "driver": "d", "pool": "p", "device": "x", "shareID": "s1", "consumedCapacity": {"memory": "1Gi"}})
    admin = job_claim(6)
    admin["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = True
    return [job_claim(0), job_claim(7, allocated=False), explained, allocated_explained, deleting, opted_in, shared, admin]


@pytest.mark.parametrize("claim", _claims(), ids=lambda c: c["metadata"]["uid"][:13])
def test_a_claim_view_answers_as_the_claim(claim: Obj) -> None:
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", **claim}
    view = claim_view(copy.deepcopy(claim))
    for waited in (False, True):
        assert classify(view, waited_for=waited) == classify(claim, waited_for=waited)
    assert allocated_state([view]) == allocated_state([claim])
    assert key_of(view) == key_of(claim) and view["metadata"]["uid"] == claim["metadata"]["uid"]
    assert view["metadata"]["resourceVersion"] == claim["metadata"]["resourceVersion"]
    assert "managedFields" not in view["metadata"] and view["kind"] == "ResourceClaim"
    ours = claim["metadata"]["annotations"]
    assert annotation_patch(view["metadata"].get("annotations") or {}, EXPLAINED) == annotation_patch(ours, EXPLAINED)
    assert annotation_patch(view["metadata"].get("annotations") or {}, None) == annotation_patch(ours, None)
    if needs_no_work(claim):
        assert "spec" not in view and classify(view, waited_for=True) is Action.IGNORE
        return
    whole = copy.deepcopy(claim)
    del whole["metadata"]["managedFields"]
    if EXPLANATION_ANNOTATION in ours and "deletionTimestamp" not in claim["metadata"]:
        # The document stays on the server; what the controller compares is kept.
        assert view["metadata"]["annotations"][EXPLANATION_ANNOTATION] == ""
        assert view["metadata"]["annotations"][HASH_ANNOTATION] == ours[HASH_ANNOTATION]
        whole["metadata"]["annotations"][EXPLANATION_ANNOTATION] = ""
    assert view == whole


def test_only_allocated_claims_without_our_work_are_reduced() -> None:
    assert [needs_no_work(c) for c in _claims()] == [True, False, False, False, False, True, True, True]


class TestInterner:
    def test_equal_flat_dicts_become_one_object(self) -> None:
        intern = Interner()
        a = {"model": {"string": "H100"}, "uuid": {"string": "GPU-1"}, "nested": {"x": {"y": 1}}, "n": 1}
        b = {"model": {"string": "H100"}, "uuid": {"string": "GPU-2"}, "nested": {"x": {"y": 1}}, "n": 1}
        intern.share(a)
        intern.share(b)
        assert a["model"] is b["model"] and a["uuid"] is not b["uuid"]
        assert a["nested"] is not b["nested"], "only flat values are shared"
        assert a == {"model": {"string": "H100"}, "uuid": {"string": "GPU-1"}, "nested": {"x": {"y": 1}}, "n": 1}

    def test_maps_of_shared_values_are_shared_whole(self) -> None:
        intern = Interner()
        a = intern.share({"memory": {"value": "10Gi"}, "slices": {"value": "1"}})
        b = intern.share({"memory": {"value": "10Gi"}, "slices": {"value": "1"}})
        c = intern.share({"memory": {"value": "10Gi"}, "slices": {"value": "2"}})
        d = intern.share({"slices": {"value": "1"}, "memory": {"value": "10Gi"}, "more": {"value": "1"}})
        assert a is b and a is not c and c["memory"] is a["memory"] and d is not a
        assert b == {"memory": {"value": "10Gi"}, "slices": {"value": "1"}}

    def test_json_types_are_kept_apart(self) -> None:
        intern = Interner()
        maps = [{"v": {"int": v}} for v in (1, 1.0, True)]
        for m in maps:
            intern.share(m)
        assert [type(m["v"]["int"]) for m in maps] == [int, float, bool]

    def test_the_table_is_bounded(self) -> None:
        intern = Interner(limit=10)
        maps = [{"uuid": {"string": f"uuid-{i}"}} for i in range(25)]
        for m in maps:
            intern.share(m)
        assert len(intern) <= 10 and [m["uuid"]["string"] for m in maps] == [f"uuid-{i}" for i in range(25)]


def test_a_slice_view_is_the_slice_without_managed_fields() -> None:
    view = slice_view()
    s = plugin_slice(1)
    kept = view(copy.deepcopy(s))
    del s["metadata"]["managedFields"]
    assert kept == s
    other = view(plugin_slice(2))
    attrs = [d["attributes"] for d in (kept["spec"]["devices"][0], other["spec"]["devices"][0], other["spec"]["devices"][1])]
    assert attrs[0]["productName"] is attrs[1]["productName"] is attrs[2]["productName"]
    assert attrs[1]["uuid"] != attrs[2]["uuid"]
    assert kept["spec"]["devices"][0]["capacity"]["memory"] is other["spec"]["devices"][0]["capacity"]["memory"]


def _handler(calls: list[tuple[Any, Any]]) -> Any:
    def record(old: Obj | None, new: Obj | None) -> None:
        calls.append((old and old["metadata"]["name"], new and new["metadata"]["name"]))
    return record


def test_an_object_the_transform_drops_is_absent_for_the_handler() -> None:
    kube = FakeKube()
    kube.add(PODS, job_pod(0))
    kube.add(PODS, job_pod(1, claim="c1"))
    calls: list[tuple[Any, Any]] = []
    inf = Informer(kube, PODS, _handler(calls), transform=pod_view)
    inf.relist()
    assert inf.store.keys() == ["team-1/job-000001-abcde"] and calls == [(None, "job-000001-abcde")]
    rv = inf.resource_version
    done = kube.obj(PODS, "team-1/job-000001-abcde")
    assert done is not None
    done["status"]["phase"] = "Succeeded"
    kube.set(PODS, done)
    unrelated = kube.obj(PODS, "team-0/job-000000-abcde")
    assert unrelated is not None
    unrelated["status"]["phase"] = "Failed"
    kube.set(PODS, unrelated)
    kube.delete(PODS, "team-0/job-000000-abcde")
    for event in kube.watch(PODS, resource_version=rv, timeout_seconds=1):
        inf.apply(event)
    assert len(inf.store) == 0 and calls[1:] == [("job-000001-abcde", None)]


def test_our_own_writes_are_kept_as_the_informer_keeps_them() -> None:
    kube = FakeKube()
    kube.add(CLAIMS, job_claim(0))
    inf = Informer(kube, CLAIMS, transform=claim_view)
    inf.relist()
    cached = inf.store.values()[0]
    assert "spec" not in cached
    written = kube.obj(CLAIMS, key_of(cached))
    assert written is not None
    written["metadata"]["resourceVersion"] = "999"
    assert inf.store.put_if_unchanged(written, cached["metadata"]["resourceVersion"])
    assert inf.store.values()[0] == claim_view(copy.deepcopy(written))


def test_whole_slices_through_a_transform_are_listed_in_pages() -> None:
    kube = FakeKube()
    for n in range(3):
        kube.add(SLICES, plugin_slice(n))
    inf = Informer(kube, SLICES, transform=slice_view())
    inf.relist()
    assert len(inf.store) == 3 and all("managedFields" not in s["metadata"] for s in inf.store.values())
