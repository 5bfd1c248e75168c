"""Objects that do not decode fail nothing else: lists and watches read around them (the payloads
the API server stores in a claim's raw parameters: a lone surrogate, a raw 0xff, deep nesting)."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from kubeserver import Server

from dra_driver.k8s.client import CLAIMS, ApiError
from dra_driver.k8s.informer import Informer
from dra_driver.k8s.quarantine import UNDECODABLE, Undecodable, split_event, split_page, value_end

PLACEHOLDER = b'"@PARAMS@"'
PAYLOADS = {
    "surrogate": b'"\\ud800"',
    "raw-ff": b'"\xff"',
    "deep": b'{"a":' * 1100 + b"1" + b"}" * 1100,
}
RESULT = {"request": "gpu", "driver": "gpu.example.com", "pool": "node-a", "device": "gpu-0"}


def claim(name: str, rv: str = "5", allocated: bool = False) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": rv},
        "spec": {"devices": {"requests": [{"name": "gpu"}],
                             "config": [{"opaque": {"driver": "gpu.example.com", "parameters": {"x": "@PARAMS@"}}}]}},
    }
    if allocated:
        obj["status"] = {"allocation": {"devices": {"results": [RESULT],
                                                    "config": [{"opaque": {"parameters": {"x": "@PARAMS@"}}}]}}}
    return obj


def encoded(obj: Any, payload: bytes | None = None) -> bytes:
    data = json.dumps(obj).encode()
    return data.replace(PLACEHOLDER, payload if payload is not None else b'"fine"')


def page(items: list[bytes], rv: str = "9", cont: str = "") -> bytes:
    md = {"resourceVersion": rv, **({"continue": cont} if cont else {})}
    return b'{"kind":"ResourceClaimList","metadata":' + json.dumps(md).encode() + b',"items":[' + b",".join(items) + b"]}"


@pytest.mark.parametrize("payload", PAYLOADS)
def test_each_payload_fails_a_whole_page_decode(payload: str) -> None:
    # What made the fix necessary: orjson refuses the page whole.
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(page([encoded(claim("bad"), PAYLOADS[payload])]))


@pytest.mark.parametrize("payload", PAYLOADS)
def test_a_page_splits_into_good_items_and_the_bad_one(payload: str) -> None:
    data = page([encoded(claim("a")), encoded(claim("bad", allocated=True), PAYLOADS[payload]), encoded(claim("b"))])
    md, items = split_page(data)
    assert md == {"resourceVersion": "9"}
    good = [i for i in items if isinstance(i, dict)]
    bad = [i for i in items if isinstance(i, Undecodable)]
    assert [g["metadata"]["name"] for g in good] == ["a", "b"]
    assert len(bad) == 1 and bad[0].ref == "ns/bad" and bad[0].uid == "uid-bad" and bad[0].reason
    # What it holds is still known, for the accounting of other claims.
    assert bad[0].view["status"]["allocation"]["devices"]["results"] == [RESULT]
    assert bad[0].view["metadata"]["resourceVersion"] == "5"


def test_scanning_is_iterative_and_refuses_what_is_not_json() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    assert value_end(deep, 0) == len(deep)
    assert value_end(b'"a\\"b" rest', 0) == 6
    with pytest.raises(ValueError):
        split_page(b'{"items":[{"metadata":')
    with pytest.raises(ValueError):
        split_page(b"<html>bad gateway</html>")


def test_an_event_splits_into_type_and_salvaged_object() -> None:
    line = b'{"type":"MODIFIED","object":' + encoded(claim("bad", "8"), PAYLOADS["raw-ff"]) + b"}"
    event = split_event(line)
    assert event["type"] == UNDECODABLE and event["object"]["metadata"]["name"] == "bad"
    assert event["undecodable"].event_type == "MODIFIED"
    with pytest.raises(ValueError):
        split_event(b'{"object":{}}')


def test_a_list_lists_every_other_claim_and_names_the_bad_one(srv: Server) -> None:
    srv.replies = [
        (200, "application/json", page([encoded(claim("a")), encoded(claim("bad"), PAYLOADS["surrogate"])],
                                       cont="tok")),
        (200, "application/json", page([encoded(claim("b")), encoded(claim("deep"), PAYLOADS["deep"])])),
    ]
    res = srv.api.list(CLAIMS)
    assert [i["metadata"]["name"] for i in res.items] == ["a", "b"] and res.resource_version == "9"
    assert res.items[0]["kind"] == "ResourceClaim"
    assert [u.ref for u in res.undecodable] == ["ns/bad", "ns/deep"]


def test_claim_allocations_in_json_keep_what_a_bad_claim_holds(srv: Server) -> None:
    srv.replies = [(200, "application/json",
                    page([encoded(claim("a")), encoded(claim("bad", allocated=True), PAYLOADS["raw-ff"])]))]
    res = srv.api.list_claim_allocations()
    assert [i["metadata"]["name"] for i in res.items] == ["a", "bad"]
    assert res.items[1]["status"]["allocation"]["devices"]["results"] == [RESULT]
    assert [u.ref for u in res.undecodable] == ["ns/bad"]


def test_a_page_that_is_not_json_is_still_a_bad_response(srv: Server) -> None:
    srv.replies = [(200, "application/json", b'{"items":[{"meta')]
    with pytest.raises(ApiError) as e:
        srv.api.list(CLAIMS)
    assert e.value.status == 0 and e.value.reason == "BadResponse"


def _event(etype: str, body: bytes) -> bytes:
    return b'{"type":"' + etype.encode() + b'","object":' + body + b"}\n"


def test_a_watch_names_an_undecodable_event_and_refuses_garbage(srv: Server) -> None:
    srv.replies = [
        [_event("MODIFIED", encoded(claim("bad", "7"), PAYLOADS["surrogate"])), _event("ADDED", encoded(claim("c", "8")))],
        [b"not json at all\n"],
    ]
    got = list(srv.api.watch(CLAIMS, resource_version="5", timeout_seconds=30))
    assert [e["type"] for e in got] == [UNDECODABLE, "ADDED"]
    assert got[0]["undecodable"].ref == "ns/bad"
    with pytest.raises(ApiError) as e:
        list(srv.api.watch(CLAIMS, resource_version="5", timeout_seconds=30))
    assert e.value.reason == "BadResponse"


class Seen:
    def __init__(self) -> None:
        self.changes: list[tuple[str, str]] = []
        self.bad: list[Undecodable] = []

    def __call__(self, old: Any, new: Any) -> None:
        kind = "add" if old is None else "delete" if new is None else "update"
        self.changes.append((kind, (new or old)["metadata"]["name"]))


def test_the_informer_quarantines_and_keeps_the_rest_whole(srv: Server) -> None:
    seen = Seen()
    inf = Informer(srv.api, CLAIMS, seen, on_undecodable=seen.bad.append, streaming=False)
    srv.replies = [(200, "application/json", page([encoded(claim("a")), encoded(claim("b", "4"))], rv="5"))]
    inf.relist()
    assert sorted(inf.store.keys()) == ["ns/a", "ns/b"]
    # b becomes undecodable: its last decoded version stays, nothing is deleted; told once.
    srv.replies = [
        [_event("MODIFIED", encoded(claim("b", "6"), PAYLOADS["raw-ff"])), _event("ADDED", encoded(claim("c", "7")))],
        (200, "application/json", page([encoded(claim("a")), encoded(claim("b", "6"), PAYLOADS["raw-ff"]),
                                        encoded(claim("c", "7")), encoded(claim("new-bad", "8"), PAYLOADS["deep"])],
                                       rv="8")),
    ]
    inf.watch_once()
    assert inf.store.get("ns/b")["metadata"]["resourceVersion"] == "4"
    assert inf.resource_version == "7" and inf.store.get("ns/c") is not None
    inf.relist()
    assert sorted(inf.store.keys()) == ["ns/a", "ns/b", "ns/c"]
    assert ("delete", "b") not in seen.changes
    assert [u.ref for u in seen.bad] == ["ns/b", "ns/new-bad"]  # the re-list found b again: not told twice
    assert sorted(inf.undecodable) == ["ns/b", "ns/new-bad"]
    # A version that decodes ends the quarantine; a deletion that does not decode still deletes.
    srv.replies = [[_event("MODIFIED", encoded(claim("b", "9"))),
                    _event("DELETED", encoded(claim("c", "10"), PAYLOADS["surrogate"]))]]
    inf.watch_once()
    assert inf.store.get("ns/b")["metadata"]["resourceVersion"] == "9"
    assert inf.store.get("ns/c") is None and seen.changes[-1] == ("delete", "c")
    assert sorted(inf.undecodable) == ["ns/new-bad"]


def test_a_streamed_list_quarantines_too(srv: Server) -> None:
    seen = Seen()
    inf = Informer(srv.api, CLAIMS, seen, on_undecodable=seen.bad.append)
    end = b'{"metadata":{"resourceVersion":"9","annotations":{"k8s.io/initial-events-end":"true"}}}'
    srv.replies = [[_event("ADDED", encoded(claim("a"))), _event("ADDED", encoded(claim("bad"), PAYLOADS["deep"])),
                    _event("BOOKMARK", end)]]
    inf.stream()
    assert inf.store.keys() == ["ns/a"] and inf.synced.is_set() and inf.resource_version == "9"
    assert [u.ref for u in seen.bad] == ["ns/bad"] and list(inf.undecodable) == ["ns/bad"]


def test_a_single_object_that_cannot_be_decoded_says_so(srv: Server) -> None:
    srv.replies = [(200, "application/json", encoded(claim("bad"), PAYLOADS["raw-ff"]))]
    with pytest.raises(ApiError) as e:
        srv.api.get(CLAIMS, "bad", namespace="ns")
    assert str(e.value).startswith("the API server's answer cannot be read: GET ") and "UTF-8" in str(e.value)
