"""RestKubeApi request formation against a tiny local HTTP server (no cluster needed); credentials and
TLS are in test_credentials.py."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kubeserver import Server, kubeconfig_dict, plain_credentials

from dra_driver.k8s.client import CLAIMS, EVENTS, LEASES, PODS, SLICES, ApiError, RestKubeApi, load_credentials


def test_paths() -> None:
    assert CLAIMS.path("ns", "c", "status") == "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status"
    assert SLICES.path() == "/apis/resource.k8s.io/v1/resourceslices"
    assert PODS.path() == "/api/v1/pods" and PODS.path("ns", "p") == "/api/v1/namespaces/ns/pods/p"
    assert LEASES.path("kube-system", "x") == "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/x"
    with pytest.raises(ValueError):
        CLAIMS.path("ns", "a/b")


def test_list_pages_and_fills_kind(srv: Server) -> None:
    srv.replies = [
        (200, {"metadata": {"resourceVersion": "5", "continue": "tok"}, "items": [{"metadata": {"name": "a"}}]}),
        (200, {"metadata": {"resourceVersion": "5"}, "items": [{"metadata": {"name": "b"}}]}),
    ]
    res = srv.api.list(SLICES)
    assert [i["metadata"]["name"] for i in res.items] == ["a", "b"] and res.resource_version == "5"
    assert res.items[0]["kind"] == "ResourceSlice" and res.items[0]["apiVersion"] == "resource.k8s.io/v1"
    assert srv.requests[0]["path"] == "/apis/resource.k8s.io/v1/resourceslices?limit=500"
    assert srv.requests[1]["path"].endswith("continue=tok")


def test_cached_list_reads_the_watch_cache_in_one_request(srv: Server) -> None:
    srv.replies = [(200, {"metadata": {"resourceVersion": "7"}, "items": [{"metadata": {"name": "a"}}]})]
    res = srv.api.list(CLAIMS, cached=True)
    assert [i["metadata"]["name"] for i in res.items] == ["a"] and res.resource_version == "7"
    assert srv.requests[0]["path"] == "/apis/resource.k8s.io/v1/resourceclaims?resourceVersion=0"


def test_writes(srv: Server) -> None:
    body = {"metadata": {"name": "c", "namespace": "ns", "resourceVersion": "9"}, "status": {"allocation": {}}}
    srv.replies = [(200, body), (200, body), (201, {"metadata": {"name": "e"}}), (200, body)]
    srv.api.replace_status(CLAIMS, body)
    srv.api.replace(CLAIMS, body)
    srv.api.create(EVENTS, {"metadata": {"name": "e"}}, namespace="ns")
    srv.api.merge_patch(CLAIMS, "c", {"metadata": {"annotations": {"a": None}}}, namespace="ns")
    r = srv.requests
    assert (r[0]["method"], r[0]["path"]) == ("PUT", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status")
    assert r[0]["body"]["metadata"]["resourceVersion"] == "9"
    assert (r[1]["method"], r[1]["path"]) == ("PUT", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c")
    assert (r[2]["method"], r[2]["path"]) == ("POST", "/apis/events.k8s.io/v1/namespaces/ns/events")
    assert r[3]["method"] == "PATCH" and r[3]["ctype"] == "application/merge-patch+json"
    assert r[3]["body"] == {"metadata": {"annotations": {"a": None}}}


def test_errors(srv: Server) -> None:
    srv.replies = [(409, {"kind": "Status", "reason": "Conflict", "message": "modified", "code": 409}),
                   (404, {"kind": "Status", "reason": "NotFound", "message": "gone", "code": 404})]
    with pytest.raises(ApiError) as e:
        srv.api.replace(CLAIMS, {"metadata": {"name": "c", "namespace": "ns"}})
    assert e.value.conflict and e.value.message == "modified"
    with pytest.raises(ApiError) as e:
        srv.api.get(CLAIMS, "c", namespace="ns")
    assert e.value.not_found


def test_unreachable() -> None:
    api = RestKubeApi(plain_credentials("http://127.0.0.1:9"), request_timeout=2)
    with pytest.raises(ApiError) as e:
        api.get(CLAIMS, "c", namespace="ns")
    assert e.value.status == 0 and e.value.unreachable


PREDICATES = {"unreachable": 0, "bad_request": 400, "unauthorized": 401, "forbidden": 403, "not_found": 404,
              "conflict": 409, "gone": 410, "invalid": 422, "throttled": 429}


@pytest.mark.parametrize("status", [*PREDICATES.values(), 200, 500, 503])
def test_each_status_has_one_name(status: int) -> None:
    """The callers test ApiError by these names, never by the number: each names its status only."""
    err = ApiError(status, "Reason", "message")
    assert {name for name in PREDICATES if getattr(err, name)} == {n for n, s in PREDICATES.items() if s == status}


def test_watch_stream_and_410(srv: Server) -> None:
    ev = lambda t, o: (json.dumps({"type": t, "object": o}) + "\n").encode()  # noqa: E731
    srv.replies = [
        [ev("ADDED", {"metadata": {"name": "a", "resourceVersion": "6"}}), b"\n",
         ev("BOOKMARK", {"metadata": {"resourceVersion": "7"}})],
        [ev("ERROR", {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"})],
    ]
    got = list(srv.api.watch(CLAIMS, resource_version="5", timeout_seconds=30))
    assert [e["type"] for e in got] == ["ADDED", "BOOKMARK"]
    assert "watch=true" in srv.requests[0]["path"] and "resourceVersion=5" in srv.requests[0]["path"]
    assert "allowWatchBookmarks=true" in srv.requests[0]["path"]
    with pytest.raises(ApiError) as e:
        list(srv.api.watch(CLAIMS, resource_version="5", timeout_seconds=30))
    assert e.value.gone


def test_selectors_delete_and_node(srv: Server) -> None:
    ev = (json.dumps({"type": "ADDED", "object": {"metadata": {"name": "s"}}}) + "\n").encode()
    srv.replies = [(200, {"metadata": {"resourceVersion": "3"}, "items": []}), [ev],
                   (200, {"kind": "Status", "status": "Success"}), (200, {})]
    srv.api.list(SLICES, field_selector="spec.nodeName=n1,spec.driver=d")
    assert list(srv.api.watch(SLICES, resource_version="", timeout_seconds=5, field_selector="spec.nodeName=n1"))
    srv.api.delete(SLICES, "s-1", uid="u1", resource_version="7")
    srv.api.delete(CLAIMS, "c", namespace="ns")
    r = srv.requests
    assert r[0]["path"] == "/apis/resource.k8s.io/v1/resourceslices?limit=500&fieldSelector=spec.nodeName%3Dn1%2Cspec.driver%3Dd"
    assert "fieldSelector=spec.nodeName%3Dn1" in r[1]["path"] and "resourceVersion" not in r[1]["path"]
    assert (r[2]["method"], r[2]["path"]) == ("DELETE", "/apis/resource.k8s.io/v1/resourceslices/s-1")
    assert r[2]["body"] == {"apiVersion": "v1", "kind": "DeleteOptions",
                            "preconditions": {"uid": "u1", "resourceVersion": "7"}}
    assert r[3]["path"] == "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c"
    assert "preconditions" not in r[3]["body"]


def test_concurrent_requests_share_the_pool(srv: Server) -> None:
    srv.replies = [(200, {"metadata": {"name": f"c{i}"}}) for i in range(40)]
    api = RestKubeApi(plain_credentials(srv.host), pool_size=4)
    with ThreadPoolExecutor(16) as ex:
        got = list(ex.map(lambda i: api.get(CLAIMS, f"c{i}", namespace="ns"), range(40)))
    assert len(got) == 40 and len(srv.requests) == 40


def test_watch_abandoned_midway_does_not_poison_the_pool(srv: Server) -> None:
    ev = lambda n: (json.dumps({"type": "ADDED", "object": {"metadata": {"name": n}}}) + "\n").encode()  # noqa: E731
    srv.replies = [[ev("a"), ev("b"), ev("c")], (200, {"metadata": {"name": "after"}})]
    api = RestKubeApi(plain_credentials(srv.host), pool_size=1)
    stream = api.watch(CLAIMS, resource_version="1", timeout_seconds=5)
    assert next(stream)["object"]["metadata"]["name"] == "a"
    stream.close()
    assert api.get(CLAIMS, "x", namespace="ns") == {"metadata": {"name": "after"}}


def test_unreachable_server_gives_a_short_clear_error() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    api = RestKubeApi(plain_credentials(f"http://127.0.0.1:{port}"), request_timeout=2)
    with pytest.raises(ApiError) as info:
        api.get(CLAIMS, "c", namespace="ns")
    text = str(info.value)
    assert info.value.status == 0
    assert text.startswith("API server not reached") and "Connection refused" in text and f"127.0.0.1:{port}" in text
    assert "HTTPConnectionPool" not in text and "Max retries" not in text


def test_meanwhile_runs_once_while_the_server_has_the_request(srv: Server) -> None:
    # The first answer is a 401, so the request is sent twice (after a credential reload): the
    # caller's work (the node plugin's checkpoint record) must not be done twice.
    srv.replies = [(401, {"kind": "Status", "reason": "Unauthorized"}), (200, {"metadata": {"name": "c"}})]
    calls: list[int] = []
    got = srv.api.get(CLAIMS, "c", namespace="ns", meanwhile=lambda: calls.append(1))
    assert got == {"metadata": {"name": "c"}} and len(srv.requests) == 2
    assert calls == [1]


def test_meanwhile_is_not_called_when_the_request_is_not_sent() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    api = RestKubeApi(plain_credentials(f"http://127.0.0.1:{port}"), request_timeout=2)
    calls: list[int] = []
    with pytest.raises(ApiError):
        api.get(CLAIMS, "c", namespace="ns", meanwhile=lambda: calls.append(1))
    assert calls == []


def test_connections_are_kept_alive(srv: Server) -> None:
    srv.replies = [(200, {"metadata": {"name": f"c{i}"}}) for i in range(5)]
    for i in range(5):
        srv.api.get(CLAIMS, f"c{i}", namespace="ns")
    assert len({r["peer"] for r in srv.requests}) == 1, "one connection for sequential requests"


def test_a_connection_the_server_closed_while_idle_is_not_used_again(srv: Server) -> None:
    # A POST is not retried after a broken send, so it must not be sent on a connection that
    # the server closed while it sat idle in the pool.
    srv.replies = [(200, {"metadata": {"name": "a"}}), (201, {"metadata": {"name": "b"}})]
    srv.close_after = {1}
    srv.api.get(CLAIMS, "a", namespace="ns")
    time.sleep(0.2)  # the server's close arrives
    assert srv.api.create(CLAIMS, {"metadata": {"name": "b"}}, namespace="ns") == {"metadata": {"name": "b"}}
    assert srv.requests[0]["peer"] != srv.requests[1]["peer"]


def test_a_plain_http_server_through_a_proxy(srv: Server, tmp_path: Path) -> None:
    # The fake server plays the proxy: it receives the request with the server's whole URL.
    config = tmp_path / "config"
    config.write_text(json.dumps(kubeconfig_dict("http://api.example:8080/prefix", {"token": "t"},
                                                 {"proxy-url": srv.host})))
    api = RestKubeApi(load_credentials(str(config)))
    srv.replies = [(200, {"metadata": {"name": "c"}})]
    assert api.get(CLAIMS, "c", namespace="ns") == {"metadata": {"name": "c"}}
    assert srv.requests[0]["path"] == "http://api.example:8080/prefix/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c"
    assert srv.requests[0]["auth"] == "Bearer t"
