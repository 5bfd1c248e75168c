"""The Kubernetes boundary of the whole project: plain-dict REST calls.

Everything above this module sees API objects as plain dicts in their JSON form (camelCase), the
form the resolution engine reads. :class:`KubeApi` is the protocol the rest of the code depends
on; :class:`RestKubeApi` implements it directly on the standard library's ``http.client``
(connections and retries in :mod:`dra_driver.k8s.transport`), with the server and credentials
that the official ``kubernetes`` client's loaders read (:mod:`dra_driver.k8s.credentials`). The
official client's API and model classes are not used: they are typed for one client release, may
lag the server's ``resource.k8s.io/v1`` fields and would drop what they do not know, and loading
them costs the node plugin memory it is measured on (docs/benchmarks.md#the-codes-figures).
Unit tests use an in-memory fake of the same protocol.

Errors from the server become :class:`ApiError` (status code + reason + message); transport
failures (and credentials that cannot be obtained) become ``ApiError(status=0)``.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast
from urllib.parse import urlencode, urlsplit

import orjson

from dra_driver import logs
from dra_driver.k8s import wire
from dra_driver.k8s.bodies import RawBody
from dra_driver.k8s.credentials import (
    Connection,
    CredentialError,
    Credentials,
    KubeconfigError,
    kubeconfig_context,
    kubeconfig_path,
    load_credentials,
)
from dra_driver.k8s.objects import Obj, meta
from dra_driver.k8s.quarantine import Undecodable, split_event, split_page
from dra_driver.k8s.transport import Transport, exchange, retry_delay

# Re-exported: this client is the one boundary.
__all__ = ["Credentials", "KubeconfigError", "kubeconfig_context", "kubeconfig_path", "load_credentials"]


@dataclass(frozen=True)
class Resource:
    """One REST resource: where it lives and whether it is namespaced."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{_segment(namespace)}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{_segment(name)}"
            if sub:
                base += f"/{sub}"
        return base


def _segment(text: str) -> str:
    if not text or "/" in text or text in (".", ".."):
        raise ValueError(f"invalid path segment {text!r}")
    return text


RESOURCE_GROUP = "resource.k8s.io"
RESOURCE_VERSION = "v1"

CLAIMS = Resource(RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaims", "ResourceClaim", namespaced=True)
CLAIM_TEMPLATES = Resource(
    RESOURCE_GROUP, RESOURCE_VERSION, "resourceclaimtemplates", "ResourceClaimTemplate", namespaced=True
)
DEVICE_CLASSES = Resource(RESOURCE_GROUP, RESOURCE_VERSION, "deviceclasses", "DeviceClass", namespaced=False)
SLICES = Resource(RESOURCE_GROUP, RESOURCE_VERSION, "resourceslices", "ResourceSlice", namespaced=False)
DEVICE_TAINT_RULES = Resource(RESOURCE_GROUP, RESOURCE_VERSION, "devicetaintrules", "DeviceTaintRule", namespaced=False)
"""resource.k8s.io/v1 from Kubernetes 1.37 (1.36 serves them as v1beta2 behind an off-by-default gate)."""
PODS = Resource("", "v1", "pods", "Pod", namespaced=True)
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True)
EVENTS = Resource("events.k8s.io", "v1", "events", "Event", namespaced=True)
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap", namespaced=True)


BAD_RESPONSE = "BadResponse"
"""The reason of an ApiError(0) for an answer that came but cannot be read (not JSON, a broken frame)."""


class ApiError(Exception):
    """A failed API call. ``status`` is the HTTP code, 0 when the server was not reached."""

    def __init__(self, status: int, reason: str = "", message: str = "", details: Mapping[str, Any] | None = None):
        super().__init__(status, reason, message)
        self.status = status
        self.reason = reason
        self.message = message
        self.details: Mapping[str, Any] = details or {}

    def __str__(self) -> str:
        if self.unreachable:
            detail = f": {self.message}" if self.message else ""
            if self.reason == BAD_RESPONSE:  # it was reached: what it sent broke off or does not decode
                return f"the API server's answer cannot be read{detail}"
            return f"API server not reached ({self.reason}){detail}"
        text = f"{self.status} {self.reason}".strip()
        return f"{text}: {self.message}" if self.message else text


    @property
    def unreachable(self) -> bool:
        """No HTTP answer (status 0): the API server was not reached, or what it sent broke off or does
        not decode (reason ``BAD_RESPONSE``)."""
        return self.status == 0

    @property
    def bad_request(self) -> bool:
        return self.status == 400

    @property
    def unauthorized(self) -> bool:
        """401: the server does not know who is asking (no credentials, or expired ones)."""
        return self.status == 401

    @property
    def forbidden(self) -> bool:
        """403: the server knows who is asking, and RBAC refuses it."""
        return self.status == 403

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def gone(self) -> bool:
        return self.status == 410

    @property
    def invalid(self) -> bool:
        """422: the object was refused as written (validation, an admission policy, a field that is
        immutable), not for the moment."""
        return self.status == 422

    @property
    def throttled(self) -> bool:
        """429: the server's priority and fairness (or a proxy) refused the request unprocessed."""
        return self.status == 429


def unreachable(exc: BaseException, host: str) -> ApiError:
    """An ApiError for a request that never got an HTTP answer: what a person needs is "connection
    refused at <host>"."""
    return ApiError(0, type(exc).__name__, f"{str(exc) or type(exc).__name__} ({host})")


@dataclass(frozen=True)
class ListResult:
    items: list[RawBody]
    resource_version: str
    undecodable: list[Undecodable] = field(default_factory=list)
    """Objects listed that could not be decoded, left out of ``items``
    (:mod:`dra_driver.k8s.quarantine`)."""


class KubeApi(Protocol):
    """The calls the controller makes; all objects in and out are JSON dicts."""

    def list(self, res: Resource, *, namespace: str | None = None, field_selector: str | None = None,
             cached: bool = False, transform: Callable[[Obj], Obj | None] | None = None,
             reduced: wire.Reduced[Any] | None = None) -> ListResult:
        """Every object; ``resource_version`` is the list's. A consistent (quorum) read, or with
        ``cached`` one from the API server's watch cache (``resourceVersion=0``): unpaginated and
        cheaper, possibly a few milliseconds stale, for read-only reports. ``transform``, when
        given, is applied to each item as it is decoded (kind and apiVersion filled in); what it
        returns is listed in its place, and None leaves the item out. An item that cannot be
        decoded fails nothing else: it is left out and listed in ``undecodable``. ``reduced``: the items may
        come as that schema reads them (:mod:`dra_driver.k8s.wire`) rather than whole; a reader
        that passes it reads no other field."""
        ...

    def list_claim_allocations(self) -> ListResult:
        """Every ResourceClaim reduced to its name, namespace, UID and allocated devices
        (:func:`dra_driver.k8s.wire.allocation_view`), from the watch cache like ``list(cached=True)``.
        For reports that need only what other claims hold; cheaper than ``list`` on big clusters."""
        ...

    def watch(self, res: Resource, *, resource_version: str, timeout_seconds: int,
              field_selector: str | None = None, reduced: wire.Reduced[Any] | None = None,
              send_initial_events: bool = False) -> Iterator[Obj]:
        """Watch events ``{"type": ..., "object": {...}}`` after ``resource_version`` ("": from now,
        after synthetic ADDED events for what exists).

        ``send_initial_events``: a streaming list (Kubernetes' WatchList, on by default since 1.34):
        an ADDED event for every object of a state at least as new as ``resource_version`` ("": a
        consistent read), then a BOOKMARK annotated ``k8s.io/initial-events-end``, then the changes.
        A server that cannot answers 4xx (400/422: unknown parameter, feature off).

        The iterator ends when the server closes the watch (after about ``timeout_seconds``).
        An expired resourceVersion raises ``ApiError(410)`` (also when it arrives as an
        ``ERROR`` event). ``reduced`` as for :meth:`list`. An event whose object cannot be decoded
        arrives as an :data:`~dra_driver.k8s.quarantine.UNDECODABLE` event.
        """
        ...

    def get(self, res: Resource, name: str, *, namespace: str | None = None,
            meanwhile: Callable[[], object] | None = None) -> Obj:
        """``meanwhile``, when given, is called once while the server works on the request (after it
        was sent, before the answer is read): the caller's own I/O overlaps the round trip. It must
        not raise. It is not called when the request could not be sent."""
        ...

    def create(self, res: Resource, body: Obj, *, namespace: str | None = None, dry_run: bool = False) -> Obj:
        """POST. ``dry_run``: validated and admitted but not stored (the node plugin asks which
        device of a refused ResourceSlice the API server refuses)."""
        ...

    def replace(self, res: Resource, body: Obj) -> Obj:
        """PUT; ``metadata.resourceVersion`` in ``body`` is the optimistic-concurrency precondition."""
        ...

    def replace_status(self, res: Resource, body: Obj, *, dry_run: bool = False) -> Obj:
        """PUT to the ``status`` subresource, with the same precondition. ``dry_run``: validated
        and admitted (admission policies run) but not stored."""
        ...

    def merge_patch(self, res: Resource, name: str, patch: Obj, *, namespace: str | None = None) -> Obj:
        """JSON merge patch (RFC 7386) of the main resource."""
        ...

    def apply_status(self, res: Resource, name: str, body: Obj, *, namespace: str | None = None,
                     field_manager: str) -> Obj:
        """Server-side apply of the ``status`` subresource as ``field_manager``, forced: ``body`` is
        everything this manager has to say there; what it wrote before and leaves out is removed,
        what other managers wrote stays."""
        ...

    def delete(self, res: Resource, name: str, *, namespace: str | None = None, uid: str | None = None,
               resource_version: str | None = None) -> None:
        """DELETE, with optional UID / resourceVersion preconditions (409 when they do not hold)."""
        ...


# --------------------------------------------------------------------------------------------
# The real client

WATCH_CONNECT_TIMEOUT = 10.0
WATCH_READ_SLACK = 30.0
"""A watch's read timeout is the server-side timeout plus this, so a silent, half-open connection
cannot hang an informer forever while a healthy one always ends server-side first."""


_log = logs.get("k8s.client")


@dataclass(frozen=True)
class _Response:
    status: int
    headers: http.client.HTTPMessage
    data: bytes


@dataclass(frozen=True)
class _Stream:
    """A 2xx response still to be read; the reader hands ``conn`` back (or closes it)."""

    resp: http.client.HTTPResponse
    conn: http.client.HTTPConnection
    transport: Transport


def _reduced_event(from_json: Callable[[Obj], Obj]) -> Callable[[Obj], Obj]:
    """A JSON watch event's object reduced as the protobuf schema would have read it."""
    def reduce(event: Obj) -> Obj:
        obj = event.get("object")
        if event.get("type") in ("ADDED", "MODIFIED", "DELETED") and isinstance(obj, dict):
            return {**event, "object": from_json(obj)}
        return event
    return reduce


def _json_events(resp: http.client.HTTPResponse) -> Iterator[Obj]:
    """The events of a JSON watch stream: newline-delimited, each as soon as its chunk arrives. An
    event whose object does not decode is an UNDECODABLE event; a line that is not an event at all
    means the stream is out of step (BadResponse: the informer lists again)."""
    for line in iter(resp.readline, b""):
        if not line.strip():
            continue
        try:
            event = orjson.loads(line)
        except ValueError as exc:
            try:
                event = split_event(line)
            except ValueError:
                raise ApiError(0, BAD_RESPONSE, f"a watch event that is not JSON: {exc}") from None
        if isinstance(event, dict):
            yield event


class RestKubeApi:
    """:class:`KubeApi` over kept-alive ``http.client`` connections.

    Thread-safe. ``pool_size`` is how many idle connections stay open; bursts beyond it (the plugin
    reads up to 32 claims at once) open extra connections instead of waiting. Connection failures
    are retried twice, and an idempotent request (GET, PUT with its resourceVersion precondition,
    DELETE) once more when a connection breaks after the request was sent; a kept-alive connection
    the server closed while it was idle is not used again. A 401 reloads the credentials
    (re-reading files, re-running an exec plugin) and retries once. A 429 or 5xx that asks for it
    is retried after a wait (:func:`dra_driver.k8s.transport.retry_delay`), up to
    :data:`dra_driver.k8s.transport.MAX_RETRIES` times, logged at debug
    only: a throttled request that then succeeds is not an error.
    """

    def __init__(self, credentials: Credentials, *, request_timeout: float = 30.0, user_agent: str | None = None,
                 pool_size: int = 10, sleep: Callable[[float], None] = time.sleep) -> None:
        self._credentials = credentials
        self._timeout = request_timeout
        self._user_agent = user_agent or "dra-driver"
        self._pool_size = pool_size
        self._sleep = sleep
        self._lock = threading.Lock()
        self._current: Transport | None = None
        self._current_key: tuple[object, ...] | None = None

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None, context: str | None = None, **kwargs: Any) -> RestKubeApi:
        return cls(load_credentials(kubeconfig, context), **kwargs)

    @property
    def host(self) -> str:
        return self._credentials.host

    def close(self) -> None:
        with self._lock:
            if self._current is not None:
                self._current.clear()
                self._current = None

    # -- plumbing

    def _transport(self, conn: Connection) -> Transport:
        """The connections for the current server and TLS settings; a reload or an exec plugin may
        rotate the client certificate, which needs new TLS connections."""
        key = (conn.host, conn.proxy_url, conn.tls)
        with self._lock:
            if self._current is None or key != self._current_key:
                if conn.proxy_url and urlsplit(conn.proxy_url).scheme != "http":
                    raise ApiError(0, "ConfigurationError",
                                   f"proxy {conn.proxy_url}: only http:// proxies are supported (an https:// API "
                                   "server is reached through it with CONNECT)")
                old = self._current
                self._current = Transport(conn, self._pool_size)
                self._current_key = key
                if old is not None:
                    old.clear()
            return self._current

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
        read_timeout: float | None = None,
        accept: str = "application/json",
        meanwhile: Callable[[], object] | None = None,
    ) -> _Stream:
        """Send one request and return a 2xx response unread; anything else raises ApiError.

        ``timeout`` bounds the connect and every read; ``read_timeout``, when given, the reads after
        the request was sent (a watch waits for the server's own timeout).
        """
        suffix = path + (f"?{urlencode(query)}" if query else "")
        payload = json.dumps(body, separators=(",", ":")).encode() if body is not None else None
        reloaded = False
        retries = 0
        while True:
            headers = {"Accept": accept, "User-Agent": self._user_agent}
            if payload is not None:
                headers["Content-Type"] = content_type
            try:
                conn, authorization = self._credentials.connection()
            except CredentialError as exc:
                raise ApiError(0, "CredentialError", str(exc)) from None
            if authorization:
                headers["Authorization"] = authorization
            transport = self._transport(conn)
            try:
                resp, http_conn = exchange(transport, method, suffix, payload, headers,
                                           timeout if timeout is not None else self._timeout, read_timeout, meanwhile)
            except (OSError, http.client.HTTPException) as exc:
                raise unreachable(exc, conn.host) from None
            if 200 <= resp.status <= 299:
                return _Stream(resp, http_conn, transport)
            try:
                data = resp.read()
            except (OSError, http.client.HTTPException):
                data = b""
            transport.give(http_conn, resp)
            if resp.status == 401 and not reloaded:
                # An expired exec credential, a rotated token file or client certificate.
                reloaded = True
                try:
                    self._credentials.reload()
                except CredentialError as exc:
                    raise ApiError(0, "CredentialError", str(exc)) from None
                continue
            delay = retry_delay(resp.status, resp.headers.get("Retry-After"), retries)
            if delay is None:
                raise _error_from_body(resp.status, resp.reason or "", data)
            retries += 1
            _log.debug("API server asked to retry", method=method, path=path, status=resp.status,
                       retry_after=resp.headers.get("Retry-After"), wait=delay, retry=retries,
                       flow_schema=resp.headers.get("X-Kubernetes-PF-FlowSchema-UID"))
            self._sleep(delay)

    def _read(self, method: str, path: str, **kwargs: Any) -> _Response:
        sent = self._send(method, path, **kwargs)
        try:
            data = sent.resp.read()
        except (OSError, http.client.HTTPException) as exc:
            sent.conn.close()
            raise ApiError(0, BAD_RESPONSE, f"{method} {path}: {exc}") from None
        sent.transport.give(sent.conn, sent.resp)
        return _Response(sent.resp.status, sent.resp.headers, data)

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        resp = self._read(method, path, **kwargs)
        try:
            # orjson: lists of claims decode in a fraction of json's time (docs/benchmarks.md).
            return orjson.loads(resp.data) if resp.data else {}
        except ValueError as exc:
            raise ApiError(0, BAD_RESPONSE, f"{method} {path}: {exc}") from None

    def server_version(self) -> Obj:
        """``GET /version``: the API server's build (``gitVersion``, ``platform``, ...)."""
        obj: Obj = self._json("GET", "/version")
        return obj

    # -- KubeApi

    def list(self, res: Resource, *, namespace: str | None = None, field_selector: str | None = None,
             cached: bool = False, transform: Callable[[Obj], Obj | None] | None = None,
             reduced: wire.Reduced[Any] | None = None) -> ListResult:
        items: list[Obj] = []
        undecodable: list[Undecodable] = []
        cont = ""
        rv = ""
        path = res.path(namespace)
        while True:
            query = [("resourceVersion", "0")] if cached else [("limit", "500")]
            if field_selector:
                query.append(("fieldSelector", field_selector))
            if cont:
                query.append(("continue", cont))
            page_items, page_rv, cont = self._list_page(path, query, reduced)
            for item in page_items:
                if isinstance(item, Undecodable):
                    undecodable.append(item)
                elif isinstance(item, dict):
                    # List items carry no kind/apiVersion; restore them for consistency.
                    item.setdefault("apiVersion", res.api_version)
                    item.setdefault("kind", res.kind)
                    kept = item if transform is None else transform(item)
                    if kept is not None:
                        items.append(kept)
            rv = page_rv or rv
            if not cont:
                return ListResult(cast(list[RawBody], items), rv, undecodable)

    def _list_page(self, path: str, query: Sequence[tuple[str, str]],
                   reduced: wire.Reduced[Any] | None) -> tuple[Sequence[Any], str, str]:
        """One page of a list: its items, resourceVersion and continue token. With ``reduced``,
        protobuf is asked for and JSON accepted (a proxy or an aggregated server may not speak
        protobuf); JSON items are then reduced the same way. A JSON page that does not decode
        whole is decoded item by item; the items that still fail are :class:`Undecodable`."""
        resp = self._read("GET", path, query=query, accept=wire.ACCEPT if reduced is not None else "application/json")
        try:
            if reduced is not None and str(resp.headers.get("Content-Type", "")).startswith(wire.PROTOBUF):
                return reduced.decode_list(resp.data)
        except ValueError as exc:
            raise ApiError(0, BAD_RESPONSE, f"GET {path}: {exc}") from None
        md, items = _json_page(resp.data, path)
        if reduced is not None:
            items = [reduced.from_json(i) if isinstance(i, dict) else i for i in items]
        return items, str(md.get("resourceVersion") or ""), str(md.get("continue") or "")

    def list_claim_allocations(self) -> ListResult:
        items, rv, _ = self._list_page(CLAIMS.path(), [("resourceVersion", "0")], wire.CLAIM_ALLOCATIONS)
        undecodable = [i for i in items if isinstance(i, Undecodable)]
        # What an undecodable claim holds still counts: its view is the same reduced form.
        return ListResult(cast(list[RawBody], [i.view if isinstance(i, Undecodable) else i for i in items]), rv, undecodable)

    def watch(self, res: Resource, *, resource_version: str, timeout_seconds: int,
              field_selector: str | None = None, reduced: wire.Reduced[Any] | None = None,
              send_initial_events: bool = False) -> Iterator[Obj]:
        decode = reduced.decode_event if reduced is not None else None
        query = [("watch", "true")]
        if resource_version:
            query.append(("resourceVersion", resource_version))
        if send_initial_events:
            query += [("sendInitialEvents", "true"), ("resourceVersionMatch", "NotOlderThan")]
        query += [("allowWatchBookmarks", "true"), ("timeoutSeconds", str(int(timeout_seconds)))]
        if field_selector:
            query.append(("fieldSelector", field_selector))
        sent = self._send("GET", res.path(), query=query, timeout=WATCH_CONNECT_TIMEOUT,
                          read_timeout=float(timeout_seconds) + WATCH_READ_SLACK,
                          accept=wire.ACCEPT if decode is not None else "application/json")
        ended = False
        try:
            if decode is not None and str(sent.resp.headers.get("Content-Type", "")).startswith(wire.PROTOBUF):
                events: Iterator[Obj] = map(decode, wire.read_frames(sent.resp))
            elif reduced is not None:
                events = map(_reduced_event(reduced.from_json), _json_events(sent.resp))
            else:
                events = _json_events(sent.resp)
            for event in events:
                if event.get("type") == "ERROR":
                    status = event.get("object")
                    status = status if isinstance(status, dict) else {}
                    code = status.get("code")
                    raise ApiError(code if isinstance(code, int) else 500, str(status.get("reason", "")),
                                   str(status.get("message", "")))
                yield event
            ended = True
        except ApiError:
            raise
        except wire.WireError as exc:
            raise ApiError(0, BAD_RESPONSE, f"watch {res.plural}: {exc}") from None
        except Exception as exc:  # what it catches: the stream's transport failures (reset, read timeout, ...)
            raise unreachable(exc, self.host) from None
        finally:
            if ended:
                sent.transport.give(sent.conn, sent.resp)
            else:
                sent.conn.close()  # unread data: the connection cannot serve another request

    def get(self, res: Resource, name: str, *, namespace: str | None = None,
            meanwhile: Callable[[], object] | None = None) -> Obj:
        obj: Obj = self._json("GET", res.path(namespace, name), meanwhile=_once(meanwhile) if meanwhile else None)
        return obj

    def create(self, res: Resource, body: Obj, *, namespace: str | None = None, dry_run: bool = False) -> Obj:
        obj: Obj = self._json("POST", res.path(namespace), body=body, query=[("dryRun", "All")] if dry_run else None)
        return obj

    def replace(self, res: Resource, body: Obj) -> Obj:
        m = meta(body)
        obj: Obj = self._json("PUT", res.path(m.get("namespace"), str(m.get("name", ""))), body=body)
        return obj

    def replace_status(self, res: Resource, body: Obj, *, dry_run: bool = False) -> Obj:
        m = meta(body)
        obj: Obj = self._json("PUT", res.path(m.get("namespace"), str(m.get("name", "")), "status"), body=body,
                              query=[("dryRun", "All")] if dry_run else None)
        return obj

    def merge_patch(self, res: Resource, name: str, patch: Obj, *, namespace: str | None = None) -> Obj:
        obj: Obj = self._json(
            "PATCH", res.path(namespace, name), body=patch, content_type="application/merge-patch+json"
        )
        return obj

    def apply_status(self, res: Resource, name: str, body: Obj, *, namespace: str | None = None,
                     field_manager: str) -> Obj:
        obj: Obj = self._json("PATCH", res.path(namespace, name, "status"), body=body,
                              content_type="application/apply-patch+yaml",
                              query=[("fieldManager", field_manager), ("force", "true")])
        return obj

    def delete(self, res: Resource, name: str, *, namespace: str | None = None, uid: str | None = None,
               resource_version: str | None = None) -> None:
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        body: Obj = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if preconditions:
            body["preconditions"] = preconditions
        self._json("DELETE", res.path(namespace, name), body=body)


def _json_page(data: bytes, path: str) -> tuple[Mapping[str, Any], list[Obj | Undecodable]]:
    """A JSON list page's metadata and items: decoded whole (orjson: lists of claims decode in a
    fraction of json's time, docs/benchmarks.md), else item by item."""
    try:
        page = orjson.loads(data) if data else {}
    except ValueError as exc:
        try:
            return split_page(data)
        except ValueError:
            raise ApiError(0, BAD_RESPONSE, f"GET {path}: {exc}") from None
    if not isinstance(page, dict):
        raise ApiError(0, BAD_RESPONSE, f"GET {path}: not a JSON object")
    md = page.get("metadata")
    items = page.get("items")
    return md if isinstance(md, dict) else {}, [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []


def _once(fn: Callable[[], object]) -> Callable[[], None]:
    """``fn`` on the first call only: a retried request must not repeat the caller's work."""
    pending = [fn]

    def call() -> None:
        if pending:
            pending.pop()()
    return call


def _error_from_body(status: int, reason: str, data: bytes | None) -> ApiError:
    message = ""
    details: Mapping[str, Any] = {}
    try:
        body = json.loads(data or b"")
        if isinstance(body, dict):
            message = str(body.get("message", ""))
            reason = str(body.get("reason", reason)) or reason
            d = body.get("details")
            details = d if isinstance(d, dict) else {}
    except ValueError:
        message = (data or b"")[:200].decode("utf-8", errors="replace")
    return ApiError(status, reason, message, details)
