"""The API client and the informers under API Priority and Fairness: 429 and Retry-After handled as
client-go does, against a scripted loopback server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubeserver import Server
from structlog.testing import capture_logs

from dra_driver.k8s.client import CLAIMS, EVENTS, SLICES, ApiError, ListResult, Resource
from dra_driver.k8s.informer import Informer
from dra_driver.k8s.objects import Obj
from dra_driver.k8s.transport import MAX_RETRIES, retry_delay

TOO_MANY = {"kind": "Status", "status": "Failure", "reason": "TooManyRequests", "code": 429,
            "message": "the server has received too many requests and has asked us to try again later"}


@pytest.fixture
def throttled() -> Iterator[tuple[Server, list[float]]]:
    """A scripted server whose client records its waits instead of sleeping."""
    waits: list[float] = []
    s = Server(sleep=waits.append)
    yield s, waits
    s.httpd.shutdown()
    s.api.close()


def loud(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["log_level"] in ("warning", "error", "critical")]


class TestRetryDelay:
    def test_retry_after_is_honoured_on_429_and_5xx(self) -> None:
        assert retry_delay(429, "3", 0) == 3.0
        assert retry_delay(503, "2", 0) == 2.0
        assert retry_delay(500, " 1 ", 4) == 1.0
        assert retry_delay(429, "0", 0) == 0.0

    def test_other_answers_are_not_retried(self) -> None:
        assert retry_delay(404, "1", 0) is None
        assert retry_delay(409, "1", 0) is None
        assert retry_delay(500, None, 0) is None  # a 5xx without the header is an answer, as in client-go
        assert retry_delay(503, "Wed, 21 Oct 2015 07:28:00 GMT", 0) is None  # client-go reads seconds only

    def test_429_without_a_usable_header_backs_off(self) -> None:
        assert [retry_delay(429, None, n) for n in range(7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
        assert retry_delay(429, "soon", 0) == 0.5

    def test_at_most_ten_retries_and_bounded_waits(self) -> None:
        assert MAX_RETRIES == 10
        assert retry_delay(429, "1", 9) == 1.0 and retry_delay(429, "1", 10) is None
        assert retry_delay(429, "86400", 0) == 60.0
        assert retry_delay(429, "-5", 0) == 0.0


def test_a_throttled_read_is_retried_quietly(throttled: tuple[Server, list[float]]) -> None:
    srv, waits = throttled
    srv.replies = [(429, TOO_MANY, {"Retry-After": "2", "X-Kubernetes-PF-FlowSchema-UID": "fs-1"}),
                   (200, {"metadata": {"name": "c"}})]
    with capture_logs() as logs:
        got = srv.api.get(CLAIMS, "c", namespace="ns")
    assert got == {"metadata": {"name": "c"}}
    assert waits == [2.0] and [r["method"] for r in srv.requests] == ["GET", "GET"]
    assert loud(logs) == []
    retry = [e for e in logs if e["event"] == "API server asked to retry"]
    assert len(retry) == 1 and retry[0]["log_level"] == "debug" and retry[0]["flow_schema"] == "fs-1"


def test_a_throttled_create_is_sent_again(throttled: tuple[Server, list[float]]) -> None:
    # A 429 was not processed: even a create, which is never repeated after a broken connection,
    # is safe to send again, and client-go does.
    srv, waits = throttled
    body = {"metadata": {"name": "e"}, "note": "x"}
    srv.replies = [(429, TOO_MANY, {"Retry-After": "1"}), (429, TOO_MANY, {"Retry-After": "1"}), (201, body)]
    assert srv.api.create(EVENTS, body, namespace="ns") == body
    assert waits == [1.0, 1.0]
    assert [(r["method"], r["body"]) for r in srv.requests] == [("POST", body)] * 3


def test_a_server_error_with_retry_after_is_retried_and_one_without_is_not(throttled: tuple[Server, list[float]]) -> None:
    srv, waits = throttled
    srv.replies = [(503, {"kind": "Status", "code": 503}, {"Retry-After": "1"}), (200, {"metadata": {"name": "a"}}),
                   (500, {"kind": "Status", "code": 500, "reason": "InternalError", "message": "boom"})]
    assert srv.api.merge_patch(CLAIMS, "a", {"metadata": {}}, namespace="ns") == {"metadata": {"name": "a"}}
    with pytest.raises(ApiError) as info:
        srv.api.get(CLAIMS, "b", namespace="ns")
    assert info.value.status == 500 and "boom" in str(info.value)
    assert waits == [1.0] and len(srv.requests) == 3


def test_a_429_without_retry_after_backs_off(throttled: tuple[Server, list[float]]) -> None:
    srv, waits = throttled
    srv.replies = [(429, TOO_MANY), (429, TOO_MANY), (200, {"metadata": {"name": "c"}})]
    assert srv.api.get(CLAIMS, "c", namespace="ns") == {"metadata": {"name": "c"}}
    assert waits == [0.5, 1.0]


def test_gives_up_after_ten_retries(throttled: tuple[Server, list[float]]) -> None:
    srv, waits = throttled
    srv.replies = [(429, TOO_MANY, {"Retry-After": "1"})] * (MAX_RETRIES + 1)
    with pytest.raises(ApiError) as info:
        srv.api.replace(CLAIMS, {"metadata": {"name": "c", "namespace": "ns", "resourceVersion": "3"}})
    assert info.value.throttled and info.value.reason == "TooManyRequests"
    assert len(srv.requests) == MAX_RETRIES + 1 and waits == [1.0] * MAX_RETRIES


def test_list_pages_and_watches_are_retried(throttled: tuple[Server, list[float]]) -> None:
    srv, waits = throttled
    ev = (json.dumps({"type": "ADDED", "object": {"metadata": {"name": "w"}}}) + "\n").encode()
    srv.replies = [
        (200, {"metadata": {"resourceVersion": "5", "continue": "tok"}, "items": [{"metadata": {"name": "a"}}]}),
        (429, TOO_MANY, {"Retry-After": "1"}),
        (200, {"metadata": {"resourceVersion": "5"}, "items": [{"metadata": {"name": "b"}}]}),
        (429, TOO_MANY, {"Retry-After": "2"}),
        [ev],
    ]
    listed = srv.api.list(SLICES)
    assert [i["metadata"]["name"] for i in listed.items] == ["a", "b"]
    assert srv.requests[2]["path"].endswith("continue=tok")
    assert [e["object"]["metadata"]["name"] for e in srv.api.watch(SLICES, resource_version="5", timeout_seconds=5)] == ["w"]
    assert "watch=true" in srv.requests[4]["path"] and waits == [1.0, 2.0]


class _ThrottledWatches:
    """A KubeApi whose watches the server throttles ``throttle`` times before one succeeds."""

    def __init__(self, throttle: int, stop: threading.Event) -> None:
        self.throttle = throttle
        self.stop = stop
        self.lists = 0
        self.watched_from: list[str] = []

    def list(self, res: Resource, **_: Any) -> ListResult:
        self.lists += 1
        return ListResult([{"metadata": {"name": "a", "resourceVersion": "5"}}], "5")

    def watch(self, res: Resource, *, resource_version: str, **_: Any) -> Iterator[Obj]:
        self.watched_from.append(resource_version)
        if self.throttle:
            self.throttle -= 1
            raise ApiError(429, "TooManyRequests", "slow down")
        yield {"type": "ADDED", "object": {"metadata": {"name": "b", "resourceVersion": "6"}}}
        self.stop.set()


def test_a_throttled_watch_resumes_without_a_new_list() -> None:
    stop = threading.Event()
    api = _ThrottledWatches(2, stop)
    inf = Informer(api, CLAIMS, max_backoff=0.01, streaming=False)  # type: ignore[arg-type]
    with capture_logs() as logs:
        inf.run(stop)
    assert api.lists == 1 and api.watched_from == ["5", "5", "5"]
    assert sorted(inf.store.keys()) == ["a", "b"]
    assert loud(logs) == [] and [e["event"] for e in logs if e["event"] != "listed"] == ["throttled by the API server"] * 2
