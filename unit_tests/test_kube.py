"""RestKubeApi request formation against a tiny local HTTP server (no cluster needed)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes.client import Configuration

from dra_driver.kube import CLAIMS, EVENTS, LEASES, PODS, SLICES, ApiError, RestKubeApi

Reply = tuple[int, Any]


class Server:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.replies: list[Reply | list[bytes]] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                outer.requests.append({"method": self.command, "path": self.path,
                                       "ctype": self.headers.get("Content-Type"),
                                       "body": json.loads(body) if body else None})
                reply = outer.replies.pop(0)
                if isinstance(reply, list):  # a watch stream
                    data = b"".join(reply)
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                code, obj = reply
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_PATCH = _handle

            def log_message(self, *a: Any) -> None:
                return

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        cfg = Configuration(host=f"http://127.0.0.1:{self.httpd.server_address[1]}")
        self.api = RestKubeApi(cfg)


@pytest.fixture
def srv() -> Iterator[Server]:
    s = Server()
    yield s
    s.httpd.shutdown()
    s.api.close()


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
    api = RestKubeApi(Configuration(host="http://127.0.0.1:9"), request_timeout=2)
    with pytest.raises(ApiError) as e:
        api.get(CLAIMS, "c", namespace="ns")
    assert e.value.status == 0


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
