"""The protobuf claim list: decoding, its agreement with the JSON form, and RestKubeApi's use of it.

The bytes here are built with the same schema that reads them, so these tests pin the envelope,
the reduction and the fallbacks; that the schema matches the real API server's encoding is shown
on the bed (``e2e/suites/test_controller.py``), against kube-apiserver's own protobuf output.
"""

from __future__ import annotations

import copy
import io
import json
import struct
from typing import Any

import pytest
from kubefake import claim_message, pod_message, slice_message
from kubeserver import Server

from dra_driver._proto.kubewire import claimnotes_pb2, pods_pb2, slices_pb2
from dra_driver._proto.kubewire import claims_pb2 as pb
from dra_driver._proto.kubewire import meta_pb2 as meta
from dra_driver.controller.verdicts import claim_class_names
from dra_driver.controller.views import pod_view, slice_reading, slice_view
from dra_driver.k8s import wire
from dra_driver.k8s.claims import device_ids, is_allocated, is_deleting, pod_claim_keys, pod_is_done, pod_node
from dra_driver.k8s.client import CLAIMS, PODS, SLICES, ApiError
from dra_driver.k8s.wire import (
    POD_CLAIM_REFS,
    PROTOBUF,
    WireError,
    allocation_view,
    decode_claim_list,
    decode_pod_event,
    decode_pod_list,
    read_frames,
)

JSON_CLAIMS: list[dict[str, Any]] = [
    {"metadata": {"name": "a", "namespace": "ns", "uid": "u-a", "managedFields": [{"manager": "x"}]},
     "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
     "status": {"allocation": {"devices": {"results": [
         {"request": "gpu", "driver": "gpu.dra-driver.io", "pool": "n1", "device": "gpu-0"},
         {"request": "gpu", "driver": "gpu.dra-driver.io", "pool": "n1", "device": "gpu-1", "adminAccess": True},
         {"request": "mem", "driver": "gpu.dra-driver.io", "pool": "n1", "device": "gpu-2",
          "shareID": "6f1c1d3e-0000-4000-8000-000000000001", "consumedCapacity": {"memory": "10Gi"}},
     ]}, "nodeSelector": {"nodeSelectorTerms": []}}, "reservedFor": [{"resource": "pods", "name": "p", "uid": "1"}]}},
    {"metadata": {"name": "b", "namespace": "ns", "uid": "u-b"}, "spec": {}},
    {"metadata": {"name": "c", "namespace": "other", "uid": "u-c"}, "status": {"allocation": {"devices": {"results": [
        {"request": "r", "driver": "other.example.com", "pool": "p", "device": "d", "adminAccess": False}]}}}},
]


def _message(claim: dict[str, Any]) -> pb.ResourceClaim:
    m = claim["metadata"]
    msg = pb.ResourceClaim(metadata=meta.ObjectMeta(name=m["name"], namespace=m["namespace"], uid=m["uid"]))
    allocation = (claim.get("status") or {}).get("allocation")
    if allocation is not None:
        msg.status.allocation.SetInParent()
        for r in allocation["devices"]["results"]:
            res = msg.status.allocation.devices.results.add(
                request=r["request"], driver=r["driver"], pool=r["pool"], device=r["device"])
            if "adminAccess" in r:
                res.adminAccess = r["adminAccess"]
            if "shareID" in r:
                res.shareID = r["shareID"]
            for name, q in (r.get("consumedCapacity") or {}).items():
                res.consumedCapacity[name].string = q
    return msg


def _wrapped(kind: str, raw: bytes, *, api_version: str = "v1", encoding: str = "") -> bytes:
    """A whole protobuf response body: the magic, then ``runtime.Unknown`` around ``raw``."""
    envelope = meta.Unknown(typeMeta=meta.TypeMeta(apiVersion=api_version, kind=kind), raw=raw,
                            contentEncoding=encoding, contentType=PROTOBUF)
    return b"k8s\x00" + envelope.SerializeToString()


def _body(claims: list[dict[str, Any]], *, kind: str = "ResourceClaimList", encoding: str = "",
          extra: bytes = b"") -> bytes:
    listed = pb.ResourceClaimList(metadata=meta.ListMeta(resourceVersion="42"), items=[_message(c) for c in claims])
    return _wrapped(kind, listed.SerializeToString() + extra, api_version="resource.k8s.io/v1", encoding=encoding)


def test_protobuf_and_json_reduce_to_the_same_claims() -> None:
    items, rv = decode_claim_list(_body(JSON_CLAIMS))
    assert rv == "42"
    assert items == [allocation_view(c) for c in JSON_CLAIMS]
    first = items[0]["status"]["allocation"]["devices"]["results"]
    assert first[1]["adminAccess"] is True and "adminAccess" not in first[0]
    assert first[2]["shareID"].startswith("6f1c") and first[2]["consumedCapacity"] == {"memory": "10Gi"}
    assert items[1]["status"] == {}  # not allocated: no allocation key at all
    assert "managedFields" not in items[0]["metadata"] and "spec" not in items[0]


def test_fields_the_schema_does_not_declare_are_skipped() -> None:
    # A field number the schema lacks (9, length-delimited) on the list, as a newer server could send.
    unknown = bytes([9 << 3 | 2, 3]) + b"abc"
    items, _ = decode_claim_list(_body(JSON_CLAIMS[:1], extra=unknown))
    assert items == [allocation_view(JSON_CLAIMS[0])]


@pytest.mark.parametrize(("body", "problem"), [
    (b'{"kind": "ResourceClaimList"}', "magic"),
    (_body(JSON_CLAIMS, kind="PodList"), "expected a ResourceClaimList, got PodList"),
    (_body(JSON_CLAIMS, encoding="gzip"), "content encoding 'gzip'"),
    (b"k8s\x00\x12\xff\xff", "malformed"),
])
def test_bad_bodies_are_named(body: bytes, problem: str) -> None:
    with pytest.raises(WireError, match=problem):
        decode_claim_list(body)


def test_rest_client_asks_for_protobuf_from_the_watch_cache(srv: Server) -> None:
    srv.replies.append((200, PROTOBUF, _body(JSON_CLAIMS)))
    listed = srv.api.list_claim_allocations()
    assert listed.items == [allocation_view(c) for c in JSON_CLAIMS] and listed.resource_version == "42"
    req = srv.requests[0]
    assert req["path"] == "/apis/resource.k8s.io/v1/resourceclaims?resourceVersion=0"
    assert req["accept"].startswith(PROTOBUF) and "application/json" in req["accept"]


def test_rest_client_accepts_a_json_answer(srv: Server) -> None:
    srv.replies.append((200, {"metadata": {"resourceVersion": "7"}, "items": JSON_CLAIMS}))
    listed = srv.api.list_claim_allocations()
    assert listed.items == [allocation_view(c) for c in JSON_CLAIMS] and listed.resource_version == "7"


def test_rest_client_reports_a_broken_protobuf_answer(srv: Server) -> None:
    srv.replies.append((200, PROTOBUF, b"k8s\x00garbage"))
    with pytest.raises(ApiError) as err:
        srv.api.list_claim_allocations()
    assert err.value.status == 0 and "resourceclaims" in str(err.value) and "malformed" in str(err.value)


def test_rest_client_passes_on_api_errors(srv: Server) -> None:
    srv.replies.append((403, {"kind": "Status", "reason": "Forbidden", "message": "no list"}))
    with pytest.raises(ApiError) as err:
        srv.api.list_claim_allocations()
    assert err.value.status == 403


# --------------------------------------------------------------------------- claims as explain's lists read them

NOTE, SUMMARY = "gpu.dra-driver.io/explanation", "gpu.dra-driver.io/explanation-summary"
NOTED = wire.noted_claims((NOTE, SUMMARY))
NOTED_JSON: list[dict[str, Any]] = [
    *JSON_CLAIMS,
    {"metadata": {"name": "pending", "namespace": "ns", "uid": "u-p", "resourceVersion": "9",
                  "annotations": {NOTE: '{"summary":"x","verdict":"Unsatisfiable"}' + " " * 32_000, SUMMARY: "x",
                                  "resource.kubernetes.io/pod-claim-name": "gpu"},
                  "managedFields": [{"manager": "dra-driver", "fieldsV1": {"f:metadata": {}}}]},
     "spec": {"devices": {"requests": [
         {"name": "one", "exactly": {"deviceClassName": "gpu", "count": 1, "selectors": [{"cel": {"expression": "true"}}]}},
         {"name": "any", "firstAvailable": [{"name": "big", "deviceClassName": "gpu-big"},
                                            {"name": "mig", "deviceClassName": "mig"}]},
     ]}}},
    {"metadata": {"name": "going", "namespace": "ns", "uid": "u-g", "deletionTimestamp": "2026-11-28T10:00:00Z",
                  "finalizers": ["x"]}, "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {}}]}}},
]


def _noted_body(claims: list[dict[str, Any]], cont: str = "") -> bytes:
    listed = claimnotes_pb2.NotedClaimList(items=[claim_message(c) for c in claims])
    listed.metadata.resourceVersion = "42"
    setattr(listed.metadata, "continue", cont)
    return _wrapped("ResourceClaimList", listed.SerializeToString(), api_version="resource.k8s.io/v1")


def test_noted_claims_read_the_same_from_protobuf_and_json() -> None:
    items, rv, cont = NOTED.decode_list(_noted_body(NOTED_JSON, cont="more"))
    assert (rv, cont) == ("42", "more")
    assert items == [NOTED.from_json(c) for c in NOTED_JSON]
    pending, going = items[-2:]
    assert pending["metadata"]["annotations"] == {k: NOTED_JSON[-2]["metadata"]["annotations"][k] for k in (NOTE, SUMMARY)}
    assert pending["spec"]["devices"]["requests"] == [
        {"name": "one", "exactly": {"deviceClassName": "gpu"}},
        {"name": "any", "firstAvailable": [{"name": "big", "deviceClassName": "gpu-big"},
                                           {"name": "mig", "deviceClassName": "mig"}]}]
    assert claim_class_names(pending) == ["gpu", "gpu-big", "mig"]
    assert "managedFields" not in pending["metadata"] and not is_allocated(pending)
    assert is_deleting(going) and going["metadata"]["deletionTimestamp"] == "2026-11-28T10:00:00Z"
    assert "annotations" not in going["metadata"]
    assert [device_ids(c["status"].get("allocation")) for c in items[:3]] == [
        device_ids(c["status"]["allocation"]) if "allocation" in c.get("status", {}) else set() for c in JSON_CLAIMS]


def test_noted_claims_of_a_body_that_is_not_a_claim_list_are_named() -> None:
    with pytest.raises(WireError, match="expected a ResourceClaimList, got PodList"):
        NOTED.decode_list(_pod_list(JSON_PODS))


def test_rest_client_lists_noted_claims_in_protobuf_and_takes_json(srv: Server) -> None:
    srv.replies.append((200, PROTOBUF, _noted_body(NOTED_JSON)))
    listed = srv.api.list(CLAIMS, namespace="ns", cached=True, reduced=NOTED)
    want = [{**NOTED.from_json(c), "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim"} for c in NOTED_JSON]
    assert listed.items == want
    req = srv.requests[0]
    assert req["path"] == "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims?resourceVersion=0"
    assert req["accept"].startswith(PROTOBUF) and "application/json" in req["accept"]
    srv.replies.append((200, {"metadata": {"resourceVersion": "7"}, "items": NOTED_JSON}))
    assert srv.api.list(CLAIMS, namespace="ns", cached=True, reduced=NOTED).items == want


# --------------------------------------------------------------------------- pods

JSON_PODS: list[dict[str, Any]] = [
    {"metadata": {"name": "spec-claim", "namespace": "ns", "uid": "u1", "resourceVersion": "5",
                  "labels": {"app": "x"}, "managedFields": [{"manager": "kubectl"}]},
     "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "i"}],
              "resourceClaims": [{"name": "gpu", "resourceClaimName": "c1"}, {"name": "t", "resourceClaimTemplateName": "tmpl"}]},
     "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                "resourceClaimStatuses": [{"name": "t", "resourceClaimName": "spec-claim-t-abcde"}, {"name": "none"}],
                "extendedResourceClaimStatus": {"resourceClaimName": "ext", "requestMappings": [
                    {"containerName": "c", "resourceName": "example.com/gpu", "requestName": "r"}]}}},
    {"metadata": {"name": "plain", "namespace": "ns", "uid": "u2", "resourceVersion": "6"},
     "spec": {"containers": [{"name": "c", "image": "i"}]}, "status": {"phase": "Pending"}},
    {"metadata": {"name": "done", "namespace": "other", "uid": "u3", "resourceVersion": "7"},
     "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "c2"}]}, "status": {"phase": "Succeeded"}},
    {"metadata": {"name": "deleting", "namespace": "other", "uid": "u4", "resourceVersion": "8",
                  "deletionTimestamp": "2026-11-27T04:00:00Z"},
     "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "c3"}]}, "status": {"phase": "Pending"}},
    # What the scheduler's node filters read (issue 50): the same from protobuf as from JSON.
    {"metadata": {"name": "placed", "namespace": "ns", "uid": "u5", "resourceVersion": "9"},
     "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "c4"}], "nodeSelector": {"team": "ml"},
              "affinity": {"nodeAffinity": {
                  "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                      {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}]},
                  "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {}}]},
                  "podAntiAffinity": {}},
              "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5},
                              {"operator": "Exists"}]},
     "status": {"phase": "Pending"}},
]


def _pod_list(pods: list[dict[str, Any]], cont: str = "") -> bytes:
    listed = pods_pb2.PodList(items=[pod_message(p) for p in pods])
    listed.metadata.resourceVersion = "42"
    setattr(listed.metadata, "continue", cont)
    return _wrapped("PodList", listed.SerializeToString())


def _frame(etype: str, kind: str, raw: bytes) -> bytes:
    event = meta.WatchEvent(type=etype, object=meta.RawExtension(raw=_wrapped(kind, raw))).SerializeToString()
    return struct.pack(">I", len(event)) + event


def test_a_bookmark_carries_its_version_and_the_end_of_a_streamed_list() -> None:
    end = meta.Bookmark(metadata=meta.BookmarkMeta(resourceVersion="77",
                                                   annotations={"k8s.io/initial-events-end": "true"}))
    event = decode_pod_event(_frame("BOOKMARK", "Pod", end.SerializeToString())[4:])
    assert event == {"type": "BOOKMARK", "object": {"metadata": {
        "resourceVersion": "77", "annotations": {"k8s.io/initial-events-end": "true"}}}}
    plain = decode_pod_event(_frame("BOOKMARK", "Pod", meta.Bookmark(metadata=meta.BookmarkMeta(
        resourceVersion="78")).SerializeToString())[4:])
    assert plain == {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "78"}}}


def test_protobuf_pods_read_as_their_json_form_for_every_reader() -> None:
    items, rv, cont = decode_pod_list(_pod_list(JSON_PODS, cont="next"))
    assert (rv, cont) == ("42", "next")
    for got, pod in zip(items, JSON_PODS, strict=True):
        assert pod_view(got) == pod_view(pod) and pod_claim_keys(got) == pod_claim_keys(pod)
        assert pod_node(got) == pod_node(pod) and pod_is_done(got) == pod_is_done(pod)
    assert pod_claim_keys(items[0]) == {"ns/c1", "ns/spec-claim-t-abcde", "ns/ext"}
    assert items[0]["status"]["resourceClaimStatuses"][1] == {"name": "none"}, "unset stays absent, not empty"
    assert "labels" not in items[0]["metadata"] and "containers" not in items[0]["spec"]
    assert items[3]["metadata"]["deletionTimestamp"] == "2026-11-27T04:00:00Z"
    placed = pod_view(items[4])
    assert placed is not None and placed["spec"]["nodeSelector"] == {"team": "ml"}
    assert placed["spec"]["tolerations"] == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
                                             {"operator": "Exists"}]
    assert placed["spec"]["affinity"] == {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}]}}}


def test_protobuf_watch_frames_are_events() -> None:
    raw = pod_message(JSON_PODS[0]).SerializeToString()
    gone = meta.Status(code=410, reason="Expired", message="too old").SerializeToString()
    stream = io.BytesIO(_frame("MODIFIED", "Pod", raw) + _frame("ERROR", "Status", gone))
    events = [decode_pod_event(f) for f in read_frames(stream)]
    assert events[0]["type"] == "MODIFIED" and pod_view(events[0]["object"]) == pod_view(JSON_PODS[0])
    assert events[1] == {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                                     "message": "too old"}}


@pytest.mark.parametrize(("data", "problem"), [
    (b"\x00\x00", "inside a frame header"),
    (b"\x00\x00\x00\x09abc", "inside a frame"),
    (b"\xff\xff\xff\xff", "out of step"),
])
def test_a_cut_or_garbled_watch_stream_is_named(data: bytes, problem: str) -> None:
    with pytest.raises(WireError, match=problem):
        list(read_frames(io.BytesIO(data)))


def test_rest_client_lists_and_watches_pods_in_protobuf(srv: Server) -> None:
    srv.replies.append((200, PROTOBUF, _pod_list(JSON_PODS[:2], cont="c2")))
    srv.replies.append((200, PROTOBUF, _pod_list(JSON_PODS[2:])))
    listed = srv.api.list(PODS, transform=pod_view, reduced=POD_CLAIM_REFS)
    assert listed.items == [v for p in JSON_PODS if (v := pod_view(p)) is not None]
    assert [r["path"].split("?")[1] for r in srv.requests] == ["limit=500", "limit=500&continue=c2"]
    assert all(r["accept"].startswith(PROTOBUF) and "application/json" in r["accept"] for r in srv.requests)
    frames = _frame("ADDED", "Pod", pod_message(JSON_PODS[0]).SerializeToString())
    srv.replies.append((200, f"{PROTOBUF};stream=watch", frames + _frame("ERROR", "Status", meta.Status(
        code=410, reason="Expired").SerializeToString())))
    got = []
    with pytest.raises(ApiError) as err:
        for event in srv.api.watch(PODS, resource_version="42", timeout_seconds=5, reduced=POD_CLAIM_REFS):
            got.append(event)
    assert err.value.gone and [pod_view(e["object"]) for e in got] == [pod_view(JSON_PODS[0])]


def test_rest_client_takes_json_pods_from_a_server_without_protobuf(srv: Server) -> None:
    srv.replies.append((200, {"metadata": {"resourceVersion": "9"}, "items": JSON_PODS}))
    listed = srv.api.list(PODS, transform=pod_view, reduced=POD_CLAIM_REFS)
    assert listed.items == [v for p in JSON_PODS if (v := pod_view(p)) is not None]
    srv.replies.append([json.dumps({"type": "ADDED", "object": JSON_PODS[0]}).encode() + b"\n"])
    events = list(srv.api.watch(PODS, resource_version="9", timeout_seconds=5, reduced=POD_CLAIM_REFS))
    assert [pod_view(e["object"]) for e in events] == [pod_view(JSON_PODS[0])]


def test_a_broken_protobuf_watch_is_a_bad_response(srv: Server) -> None:
    srv.replies.append((200, f"{PROTOBUF};stream=watch", b"\x00\x00\x00\x05k8s"))
    with pytest.raises(ApiError) as err:
        list(srv.api.watch(PODS, resource_version="1", timeout_seconds=5, reduced=POD_CLAIM_REFS))
    assert err.value.status == 0 and "pods" in str(err.value)


# --------------------------------------------------------------------------- slices

TIME = "2026-11-27T10:00:00Z"
SELECTOR = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]},
                                                         {"key": "gpu", "operator": "Exists"}],
                                   "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}
ATTRIBUTES = {"model": {"string": "H100"}, "index": {"int": 0}, "healthy": {"bool": False},
              "driverVersion": {"version": "580.95.5"}, "zones": {"strings": ["a", "b"]}, "ids": {"ints": [1, 2]}}
JSON_SLICES: list[dict[str, Any]] = [
    {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
     "metadata": {"name": "rich", "uid": "u1", "resourceVersion": "5", "generation": 2, "managedFields": [{"m": 1}]},
     "spec": {"driver": "gpu.dra-driver.io", "pool": {"name": "n1", "generation": 3, "resourceSliceCount": 1},
              "nodeName": "n1", "partitionTypeAttribute": "gpu.dra-driver.io/profile", "skipNodeOperations": ["x"],
              "devices": [
                  {"name": "d0", "attributes": ATTRIBUTES, "allowMultipleAllocations": False, "bindsToNode": True,
                   "bindingConditions": ["ready"], "bindingFailureConditions": ["failed"],
                   "capacity": {"memory": {"value": "80Gi", "requestPolicy": {
                                    "default": "1Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}},
                                "cores": {"value": "8", "requestPolicy": {"default": None, "validValues": ["1", "8"]}},
                                "plain": {"value": "1"}},
                   "taints": [{"key": "k", "value": "v", "effect": "NoSchedule", "timeAdded": TIME},
                              {"key": "k2", "effect": "NoExecute"}]},
                  {"name": "d1", "attributes": {"model": {"string": "H100"}, "index": {"int": 1}},
                   "capacity": {"memory": {"value": "80Gi"}},
                   "consumesCounters": [{"counterSet": "cs", "counters": {"memory": {"value": "10Gi"}},
                                         "compatibilityGroups": ["g"]}]},
                  {"name": "d2", "attributes": {"model": {"string": "H100"}, "index": {"int": 1}},
                   "capacity": {"memory": {"value": "80Gi"}}}]}},
    {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
     "metadata": {"name": "counters", "uid": "u2", "resourceVersion": "6", "deletionTimestamp": TIME},
     "spec": {"driver": "gpu.dra-driver.io", "pool": {"name": "n1", "generation": 0, "resourceSliceCount": 2},
              "nodeSelector": SELECTOR, "sharedCounters": [{"name": "cs", "counters": {"memory": {"value": "80Gi"}}},
                                                           {"name": "empty"}]}},
    {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "per-device", "uid": "u3",
                                                                               "resourceVersion": "7"},
     "spec": {"driver": "gpu.dra-driver.io", "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
              "perDeviceNodeSelection": True, "devices": [
                  {"name": "a", "nodeName": "n1"}, {"name": "b", "nodeSelector": SELECTOR}, {"name": "c", "allNodes": False},
                  {"name": "odd", "attributes": {"nothing": {}}}]}},
]


def _slice_list(slices: list[dict[str, Any]], cont: str = "") -> bytes:
    listed = slices_pb2.ResourceSliceList(items=[slice_message(s) for s in slices])
    listed.metadata.resourceVersion = "42"
    setattr(listed.metadata, "continue", cont)
    return _wrapped("ResourceSliceList", listed.SerializeToString(), api_version="resource.k8s.io/v1")


def _as_read(sl: dict[str, Any]) -> dict[str, Any]:
    """What the JSON path keeps of a slice, with the metadata the protobuf schema declares."""
    kept = slice_view()(copy.deepcopy(sl))
    kept["metadata"] = {k: v for k, v in kept["metadata"].items()
                        if k in ("name", "uid", "resourceVersion", "generation", "deletionTimestamp")}
    return kept


def test_protobuf_slices_read_as_their_json_form() -> None:
    items, rv, cont = slice_reading().decode_list(_slice_list(JSON_SLICES, cont="more"))
    assert (rv, cont) == ("42", "more")
    assert items == [_as_read(s) for s in JSON_SLICES]
    d0 = items[0]["spec"]["devices"][0]
    assert d0["attributes"]["healthy"] == {"bool": False} and d0["attributes"]["index"] == {"int": 0}, "falsy values stay"
    assert d0["allowMultipleAllocations"] is False and "allNodes" not in d0
    assert d0["capacity"]["cores"]["requestPolicy"]["default"] is None, "the API writes a missing default as null"
    assert items[2]["spec"]["devices"][3]["attributes"]["nothing"] == {}


def test_protobuf_slices_share_equal_values_and_maps() -> None:
    reading = slice_reading()
    first, = reading.decode_list(_slice_list(JSON_SLICES[:1]))[0]
    again, = reading.decode_list(_slice_list(JSON_SLICES[:1]))[0]
    d0, d1, d2 = first["spec"]["devices"]
    assert d0["attributes"]["model"] is d1["attributes"]["model"] is again["spec"]["devices"][0]["attributes"]["model"]
    assert d1["attributes"] is d2["attributes"] and d1["capacity"] is d2["capacity"]
    assert d0["attributes"]["index"] is not d1["attributes"]["index"]


def test_devices_asking_the_same_of_their_counters_share_what_they_ask() -> None:
    def placement(name: str, memory: str, groups: list[str]) -> dict[str, Any]:
        return {"name": name, "consumesCounters": [
            {"counterSet": "gpu-0", "counters": {"memory": {"value": memory}, "slice-0": {"value": "1"}}},
            {"counterSet": "gpu-0-extra", **({"compatibilityGroups": groups} if groups else {})}]}
    sl = copy.deepcopy(JSON_SLICES[2])
    sl["spec"]["devices"] = [placement("a", "10Gi", ["g"]), placement("b", "10Gi", ["g"]), placement("c", "20Gi", ["g"]),
                             placement("d", "10Gi", [])]
    reading = slice_reading()
    first, = reading.decode_list(_slice_list([sl]))[0]
    again, = reading.decode_list(_slice_list([sl]))[0]
    assert first == _as_read(sl)
    a, b, c, d = (dev["consumesCounters"] for dev in first["spec"]["devices"])
    assert a is b is again["spec"]["devices"][0]["consumesCounters"], "equal consumptions are read once"
    assert c is not a and d is not a and c[1] == a[1] and d[1] != a[1]
    assert d[0]["counters"] is a[0]["counters"], "their counter maps are shared as before"


def test_slice_decoder_tables_start_afresh_when_full(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "SHARED_LIMIT", 2)
    reading = slice_reading()
    for _ in range(3):
        assert reading.decode_list(_slice_list(JSON_SLICES))[0] == [_as_read(s) for s in JSON_SLICES]


def test_protobuf_slice_watch_frames_are_events() -> None:
    reading = slice_reading()
    assert reading.decode_event is not None
    raw = slice_message(JSON_SLICES[2]).SerializeToString()
    end = meta.Bookmark(metadata=meta.BookmarkMeta(resourceVersion="9", annotations={"k8s.io/initial-events-end": "true"}))
    events = [reading.decode_event(f) for f in read_frames(io.BytesIO(
        _frame("ADDED", "ResourceSlice", raw) + _frame("BOOKMARK", "ResourceSlice", end.SerializeToString())))]
    assert events == [{"type": "ADDED", "object": _as_read(JSON_SLICES[2])},
                      {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9",
                                                                   "annotations": {"k8s.io/initial-events-end": "true"}}}}]
    with pytest.raises(WireError, match="expected a ResourceSlice"):
        reading.decode_event(_frame("ADDED", "Pod", raw)[4:])


def test_rest_client_reads_json_slices_as_the_protobuf_schema_would(srv: Server) -> None:
    """A server or proxy that answers JSON: lists and watch events alike go through the JSON view."""
    srv.replies.append((200, {"metadata": {"resourceVersion": "9"}, "items": copy.deepcopy(JSON_SLICES)}))
    listed = srv.api.list(SLICES, reduced=slice_reading())
    assert [s["spec"] for s in listed.items] == [_as_read(s)["spec"] for s in JSON_SLICES]
    assert all("managedFields" not in s["metadata"] for s in listed.items)
    srv.replies.append([json.dumps({"type": "MODIFIED", "object": JSON_SLICES[0]}).encode() + b"\n"])
    events = list(srv.api.watch(SLICES, resource_version="9", timeout_seconds=5, reduced=slice_reading()))
    assert [e["object"]["spec"] for e in events] == [_as_read(JSON_SLICES[0])["spec"]]
    assert "managedFields" not in events[0]["object"]["metadata"]
