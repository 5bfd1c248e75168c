"""The protobuf claim list: decoding, its agreement with the JSON form, and RestKubeApi's use of it.

The bytes here are built with the same schema that reads them, so these tests pin the envelope,
the reduction and the fallbacks; that the schema matches the real API server's encoding is shown
on the bed (``e2e/suites/test_controller.py``), against kube-apiserver's own protobuf output.
"""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver._proto.kubewire import claims_pb2 as pb
from dra_driver.k8s.client import ApiError
from dra_driver.k8s.wire import PROTOBUF, WireError, allocation_view, decode_claim_list
from unit_tests.kubeserver import Server

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
    msg = pb.ResourceClaim(metadata=pb.ObjectMeta(name=m["name"], namespace=m["namespace"], uid=m["uid"]))
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


def _body(claims: list[dict[str, Any]], *, kind: str = "ResourceClaimList", encoding: str = "",
          extra: bytes = b"") -> bytes:
    listed = pb.ResourceClaimList(metadata=pb.ListMeta(resourceVersion="42"), items=[_message(c) for c in claims])
    envelope = pb.Unknown(typeMeta=pb.TypeMeta(apiVersion="resource.k8s.io/v1", kind=kind),
                          raw=listed.SerializeToString() + extra, contentEncoding=encoding,
                          contentType=PROTOBUF)
    return b"k8s\x00" + envelope.SerializeToString()


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
