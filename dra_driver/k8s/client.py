"""The Kubernetes boundary of the whole project: plain-dict REST calls.

Everything above this module sees API objects as plain dicts in their JSON form (camelCase), the
form the resolution engine reads. :class:`KubeApi` is the protocol the rest of the code depends
on; :class:`RestKubeApi` implements it directly on ``urllib3``, with the server and credentials
that the official ``kubernetes`` client's loaders read (:mod:`dra_driver.k8s.credentials`). The
official client's API and model classes are not used: they are typed for one client release, may
lag the server's ``resource.k8s.io/v1`` fields and would drop what they do not know, and loading
them costs the node plugin ~40 MiB of memory. Unit tests use an in-memory fake of the same protocol.

Errors from the server become :class:`ApiError` (status code + reason + message); transport
failures (and credentials that cannot be obtained) become ``ApiError(status=0)``.
"""

from __future__ import annotations

import contextlib
import json
import ssl
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlencode

import orjson
import urllib3

from dra_driver.k8s import wire
from dra_driver.k8s.credentials import ConfigurationError, Connection, CredentialError, Credentials, load_credentials

__all__ = ["ConfigurationError", "Credentials", "load_credentials"]  # re-exported: this client is the one boundary

Obj = dict[str, Any]
"""A Kubernetes object as a JSON dict."""


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
PODS = Resource("", "v1", "pods", "Pod", namespaced=True)
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True)
EVENTS = Resource("events.k8s.io", "v1", "events", "Event", namespaced=True)
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap", namespaced=True)


class ApiError(Exception):
    """A failed API call. ``status`` is the HTTP code, 0 when the server was not reached."""

    def __init__(self, status: int, reason: str = "", message: str = "", details: Mapping[str, Any] | None = None):
        super().__init__(status, reason, message)
        self.status = status
        self.reason = reason
        self.message = message
        self.details: Mapping[str, Any] = details or {}

    def __str__(self) -> str:
        if self.status == 0:
            detail = f": {self.message}" if self.message else ""
            return f"API server not reached ({self.reason}){detail}"
        text = f"{self.status} {self.reason}".strip()
        return f"{text}: {self.message}" if self.message else text


    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def gone(self) -> bool:
        return self.status == 410


def unreachable(exc: BaseException, host: str) -> ApiError:
    """An ApiError for a request that never got an HTTP answer, with urllib3's retry wrapper peeled
    off: what a person needs is "connection refused at <host>", not the pool's repr."""
    cause: BaseException = exc
    while isinstance(cause, urllib3.exceptions.MaxRetryError) and cause.reason is not None:
        cause = cause.reason
    text = str(cause)
    if isinstance(cause, urllib3.exceptions.NewConnectionError) or "Failed to establish a new connection" in text:
        text = text.rsplit(":", 1)[-1].strip() or text  # "[Errno 111] Connection refused"
    return ApiError(0, type(cause).__name__, f"{text} ({host})")

@dataclass(frozen=True)
class ListResult:
    items: list[Obj]
    resource_version: str


class KubeApi(Protocol):
    """The calls the controller makes; all objects in and out are JSON dicts."""

    def list(self, res: Resource, *, namespace: str | None = None, field_selector: str | None = None,
             cached: bool = False) -> ListResult:
        """Every object; ``resource_version`` is the list's. A consistent (quorum) read, or with
        ``cached`` one from the API server's watch cache (``resourceVersion=0``): unpaginated and
        cheaper, possibly a few milliseconds stale, for read-only reports."""
        ...

    def list_claim_allocations(self) -> ListResult:
        """Every ResourceClaim reduced to its name, namespace, UID and allocated devices
        (:func:`dra_driver.k8s.wire.allocation_view`), from the watch cache like ``list(cached=True)``.
        For reports that need only what other claims hold; cheaper than ``list`` on big clusters."""
        ...

    def watch(self, res: Resource, *, resource_version: str, timeout_seconds: int,
              field_selector: str | None = None) -> Iterator[Obj]:
        """Watch events ``{"type": ..., "object": {...}}`` after ``resource_version`` ("": from now,
        after synthetic ADDED events for what exists).

        The iterator ends when the server closes the watch (after about ``timeout_seconds``).
        An expired resourceVersion raises ``ApiError(410)`` (also when it arrives as an
        ``ERROR`` event).
        """
        ...

    def get(self, res: Resource, name: str, *, namespace: str | None = None) -> Obj: ...

    def create(self, res: Resource, body: Obj, *, namespace: str | None = None) -> Obj: ...

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


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    m = obj.get("metadata")
    return m if isinstance(m, Mapping) else {}


def key_of(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` for namespaced objects, ``name`` for cluster-scoped ones."""
    m = meta(obj)
    ns = m.get("namespace")
    name = str(m.get("name", ""))
    return f"{ns}/{name}" if ns else name


def split_key(key: str) -> tuple[str | None, str]:
    if "/" in key:
        ns, name = key.split("/", 1)
        return ns, name
    return None, key




# --------------------------------------------------------------------------------------------
# The real client

WATCH_CONNECT_TIMEOUT = 10.0
WATCH_READ_SLACK = 30.0
"""A watch's read timeout is the server-side timeout plus this, so a silent, half-open connection
cannot hang an informer forever while a healthy one always ends server-side first."""


class RestKubeApi:
    """:class:`KubeApi` over a ``urllib3`` connection pool.

    Thread-safe. ``pool_size`` is how many connections stay open; bursts beyond it (the plugin
    reads up to 32 claims at once) open extra connections instead of waiting. Connection failures
    are retried twice, and an idempotent request (GET, PUT with its resourceVersion precondition,
    DELETE) once more when a kept-alive connection turns out to be dead. A 401 reloads the
    credentials (re-reading files, re-running an exec plugin) and retries once.
    """

    def __init__(self, credentials: Credentials, *, request_timeout: float = 30.0, user_agent: str | None = None,
                 pool_size: int = 10) -> None:
        self._credentials = credentials
        self._timeout = request_timeout
        self._user_agent = user_agent or "dra-driver"
        self._pool_size = pool_size
        self._lock = threading.Lock()
        self._pool: urllib3.PoolManager | None = None
        self._pool_tls: tuple[object, ...] | None = None
        self._retries = urllib3.Retry(total=3, connect=2, read=1, status=0, other=0, redirect=False,
                                      allowed_methods=frozenset({"GET", "PUT", "DELETE", "HEAD"}),
                                      raise_on_status=False)

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None, **kwargs: Any) -> RestKubeApi:
        return cls(load_credentials(kubeconfig), **kwargs)

    @property
    def host(self) -> str:
        return self._credentials.host

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.clear()
                self._pool = None

    # -- plumbing

    def _manager(self, conn: Connection) -> urllib3.PoolManager:
        """The pool for the current TLS settings; a reload or an exec plugin may rotate the client
        certificate, which needs new TLS connections."""
        with self._lock:
            if self._pool is None or conn.tls != self._pool_tls:
                old = self._pool
                self._pool = self._new_manager(conn)
                self._pool_tls = conn.tls
                if old is not None:
                    old.clear()
            return self._pool

    def _new_manager(self, conn: Connection) -> urllib3.PoolManager:
        kwargs: dict[str, Any] = {"num_pools": 4, "maxsize": self._pool_size, "block": False}
        if conn.host.startswith("https:"):
            kwargs["ssl_context"] = _ssl_context(conn)
            kwargs["cert_reqs"] = "CERT_REQUIRED" if conn.verify_ssl else "CERT_NONE"
            if not conn.verify_ssl:
                kwargs["assert_hostname"] = False
            elif conn.tls_server_name:
                # SNI and certificate name check against tls-server-name instead of the URL's host.
                kwargs["server_hostname"] = conn.tls_server_name
        if conn.proxy_url:
            return urllib3.ProxyManager(conn.proxy_url, **kwargs)
        return urllib3.PoolManager(**kwargs)

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: urllib3.Timeout | float | None = None,
        stream: bool = False,
        accept: str = "application/json",
    ) -> urllib3.BaseHTTPResponse:
        """Send one request; returns the response for 2xx, raises ApiError otherwise.

        With ``stream`` the body is left unread (the caller releases the connection).
        """
        suffix = path + (f"?{urlencode(query)}" if query else "")
        payload = json.dumps(body, separators=(",", ":")).encode() if body is not None else None
        for attempt in (1, 2):
            headers = {"Accept": accept, "User-Agent": self._user_agent}
            if payload is not None:
                headers["Content-Type"] = content_type
            try:
                if attempt == 2:
                    self._credentials.reload()
                conn = self._credentials.connection()
            except CredentialError as exc:
                raise ApiError(0, "CredentialError", str(exc)) from None
            if conn.authorization:
                headers["Authorization"] = conn.authorization
            try:
                resp = self._manager(conn).request(
                    method, conn.host + suffix, body=payload, headers=headers,
                    timeout=timeout if timeout is not None else self._timeout,
                    retries=self._retries, preload_content=not stream, redirect=False)
            except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
                raise unreachable(exc, conn.host) from None
            if 200 <= resp.status <= 299:
                return resp
            try:
                data = resp.data if not stream else resp.read()
            except (urllib3.exceptions.HTTPError, OSError):
                data = b""
            finally:
                resp.release_conn()
            if resp.status == 401 and attempt == 1:
                continue  # an expired exec credential, a rotated token file or client certificate
            raise _error_from_body(resp.status, resp.reason or "", data)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        resp = self._send(method, path, **kwargs)
        try:
            data = resp.data
            # orjson: decoding a list of ~800 claims (1 MB) is 10 ms with json, 3 ms with orjson.
            return orjson.loads(data) if data else {}
        except (ValueError, urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiError(0, "BadResponse", f"{method} {path}: {exc}") from None

    def server_version(self) -> Obj:
        """``GET /version``: the API server's build (``gitVersion``, ``platform``, ...)."""
        obj: Obj = self._json("GET", "/version")
        return obj

    # -- KubeApi

    def list(self, res: Resource, *, namespace: str | None = None, field_selector: str | None = None,
             cached: bool = False) -> ListResult:
        items: list[Obj] = []
        cont = ""
        rv = ""
        while True:
            query = [("resourceVersion", "0")] if cached else [("limit", "500")]
            if field_selector:
                query.append(("fieldSelector", field_selector))
            if cont:
                query.append(("continue", cont))
            page = self._json("GET", res.path(namespace), query=query)
            for item in page.get("items") or []:
                if isinstance(item, dict):
                    # List items carry no kind/apiVersion; restore them for consistency.
                    item.setdefault("apiVersion", res.api_version)
                    item.setdefault("kind", res.kind)
                    items.append(item)
            md = page.get("metadata") or {}
            rv = str(md.get("resourceVersion") or rv)
            cont = str(md.get("continue") or "")
            if not cont:
                return ListResult(items, rv)

    def list_claim_allocations(self) -> ListResult:
        # JSON stays acceptable: a proxy or an aggregated server may not speak protobuf.
        path = CLAIMS.path()
        resp = self._send("GET", path, query=[("resourceVersion", "0")],
                          accept=f"{wire.PROTOBUF}, application/json")
        try:
            data = resp.data
            if str(resp.headers.get("Content-Type", "")).startswith(wire.PROTOBUF):
                items, rv = wire.decode_claim_list(data)
                return ListResult(items, rv)
            page = orjson.loads(data) if data else {}
        except (ValueError, urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiError(0, "BadResponse", f"GET {path}: {exc}") from None
        items = [wire.allocation_view(i) for i in page.get("items") or [] if isinstance(i, Mapping)]
        return ListResult(items, str((page.get("metadata") or {}).get("resourceVersion") or ""))

    def watch(self, res: Resource, *, resource_version: str, timeout_seconds: int,
              field_selector: str | None = None) -> Iterator[Obj]:
        query = [("watch", "true")]
        if resource_version:
            query.append(("resourceVersion", resource_version))
        query += [("allowWatchBookmarks", "true"), ("timeoutSeconds", str(int(timeout_seconds)))]
        if field_selector:
            query.append(("fieldSelector", field_selector))
        timeout = urllib3.Timeout(connect=WATCH_CONNECT_TIMEOUT, read=float(timeout_seconds) + WATCH_READ_SLACK)
        resp = self._send("GET", res.path(), query=query, timeout=timeout, stream=True)
        ended = False
        try:
            for line in _lines(resp):
                try:
                    event = orjson.loads(line)
                except ValueError:
                    continue
                if not isinstance(event, dict):
                    continue
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
        except Exception as exc:  # connection reset, read timeout, ...
            raise unreachable(exc, self.host) from None
        finally:
            with contextlib.suppress(Exception):
                if not ended:
                    resp.close()  # unread data: the connection cannot serve another request
                resp.release_conn()

    def get(self, res: Resource, name: str, *, namespace: str | None = None) -> Obj:
        obj: Obj = self._json("GET", res.path(namespace, name))
        return obj

    def create(self, res: Resource, body: Obj, *, namespace: str | None = None) -> Obj:
        obj: Obj = self._json("POST", res.path(namespace), body=body)
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


def _ssl_context(conn: Connection) -> ssl.SSLContext:
    ctx = urllib3.util.ssl_.create_urllib3_context(cert_reqs=ssl.CERT_REQUIRED if conn.verify_ssl else ssl.CERT_NONE)
    if conn.verify_ssl:
        if conn.ca_file:
            ctx.load_verify_locations(cafile=conn.ca_file)
        else:
            ctx.load_default_certs()
    if conn.cert_file and conn.key_file:
        ctx.load_cert_chain(conn.cert_file, conn.key_file)
    return ctx


def _lines(resp: urllib3.BaseHTTPResponse) -> Iterator[str]:
    """Newline-delimited JSON of a watch; chunks are yielded by urllib3 as they arrive."""
    buf = b""
    for chunk in resp.stream(amt=None, decode_content=True):
        buf += chunk
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                break
            line, buf = buf[:nl], buf[nl + 1 :]
            if line.strip():
                yield line.decode("utf-8", errors="replace")
    if buf.strip():
        yield buf.decode("utf-8", errors="replace")


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
