"""The Kubernetes boundary of the controller and of ``dra-driver explain``: plain-dict REST calls.

Everything above this module sees API objects as plain dicts in their JSON form (camelCase), the
form the resolution engine reads. :class:`KubeApi` is the protocol the rest of the code depends
on; :class:`RestKubeApi` implements it over the official client's ``ApiClient`` (which brings
kubeconfig/in-cluster loading, TLS, token refresh and proxies) without the generated model
classes: those are typed for one client release, may lag the server's ``resource.k8s.io/v1``
fields and would drop what they do not know. Unit tests use an in-memory fake of the same
protocol.

Errors from the server become :class:`ApiError` (status code + reason + message); transport
failures become ``ApiError(status=0)``.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

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


class ApiError(Exception):
    """A failed API call. ``status`` is the HTTP code, 0 when the server was not reached."""

    def __init__(self, status: int, reason: str = "", message: str = "", details: Mapping[str, Any] | None = None):
        super().__init__(status, reason, message)
        self.status = status
        self.reason = reason
        self.message = message
        self.details: Mapping[str, Any] = details or {}

    def __str__(self) -> str:
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


@dataclass(frozen=True)
class ListResult:
    items: list[Obj]
    resource_version: str


class KubeApi(Protocol):
    """The calls the controller makes; all objects in and out are JSON dicts."""

    def list(self, res: Resource, *, namespace: str | None = None) -> ListResult:
        """A consistent (quorum) read of every object; ``resource_version`` is the list's."""
        ...

    def watch(self, res: Resource, *, resource_version: str, timeout_seconds: int) -> Iterator[Obj]:
        """Watch events ``{"type": ..., "object": {...}}`` after ``resource_version``.

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

    def replace_status(self, res: Resource, body: Obj) -> Obj:
        """PUT to the ``status`` subresource, with the same precondition."""
        ...

    def merge_patch(self, res: Resource, name: str, patch: Obj, *, namespace: str | None = None) -> Obj:
        """JSON merge patch (RFC 7386) of the main resource."""
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


class ConfigurationError(Exception):
    """No usable cluster configuration (kubeconfig or in-cluster)."""


def load_configuration(kubeconfig: str | None) -> Any:
    """A ``kubernetes.client.Configuration`` from ``kubeconfig``, ``$KUBECONFIG``, ``~/.kube/config``
    or the in-cluster service account, in that order."""
    from kubernetes import config as kconfig
    from kubernetes.client import Configuration

    cfg = Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG") or None
    try:
        if path:
            if not os.path.exists(path.split(os.pathsep)[0]):
                raise ConfigurationError(f"kubeconfig {path} does not exist")
            kconfig.load_kube_config(config_file=path, client_configuration=cfg, persist_config=False)
            return cfg
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            kconfig.load_incluster_config(client_configuration=cfg)
            return cfg
        default = os.path.expanduser("~/.kube/config")
        if os.path.exists(default):
            kconfig.load_kube_config(config_file=default, client_configuration=cfg, persist_config=False)
            return cfg
    except ConfigurationError:
        raise
    except Exception as exc:  # ConfigException, YAML errors, missing files, bad certificates
        raise ConfigurationError(f"cannot load cluster configuration: {exc}") from None
    raise ConfigurationError("no kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config) and not running in a cluster")


class RestKubeApi:
    """:class:`KubeApi` over ``kubernetes.client.ApiClient``'s raw request path."""

    def __init__(self, configuration: Any, *, request_timeout: float = 30.0, user_agent: str | None = None) -> None:
        from kubernetes.client import ApiClient

        self._client = ApiClient(configuration)
        if user_agent:
            self._client.user_agent = user_agent
        self._timeout = request_timeout

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None, **kwargs: Any) -> RestKubeApi:
        return cls(load_configuration(kubeconfig), **kwargs)

    def close(self) -> None:
        self._client.close()

    # -- plumbing

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: Any = None,
    ) -> Any:
        """Send one request; returns the raw urllib3 response for 2xx, raises ApiError otherwise."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            m, url, hdrs, payload, _ = self._client.param_serialize(
                method=method,
                resource_path=path,
                query_params=query or None,
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            resp = self._client.call_api(m, url, header_params=hdrs, body=payload, _request_timeout=timeout)
        except ApiError:
            raise
        except Exception as exc:
            status = getattr(exc, "status", 0)
            raise ApiError(status if isinstance(status, int) else 0, type(exc).__name__, str(exc)) from None
        if not 200 <= resp.status <= 299:
            data = resp.read()
            raise _error_from_body(resp.status, resp.reason or "", data)
        return resp

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        kwargs.setdefault("timeout", self._timeout)
        resp = self._send(method, path, **kwargs)
        try:
            data = resp.read()
            return json.loads(data) if data else {}
        except (ValueError, OSError) as exc:
            raise ApiError(0, "BadResponse", f"{method} {path}: {exc}") from None

    # -- KubeApi

    def list(self, res: Resource, *, namespace: str | None = None) -> ListResult:
        items: list[Obj] = []
        cont = ""
        rv = ""
        while True:
            query = [("limit", "500")]
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

    def watch(self, res: Resource, *, resource_version: str, timeout_seconds: int) -> Iterator[Obj]:
        query = [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(int(timeout_seconds))),
        ]
        # Connect timeout 10 s; read timeout a bit beyond the server-side timeout so a silent,
        # half-open connection cannot hang the informer forever.
        resp = self._send("GET", res.path(), query=query, timeout=(10.0, float(timeout_seconds) + 30.0))
        raw = resp.response
        try:
            for line in _lines(raw):
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(event, dict):
                    continue
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    code = status.get("code") if isinstance(status, dict) else None
                    raise ApiError(
                        code if isinstance(code, int) else 500,
                        str(status.get("reason", "")) if isinstance(status, dict) else "",
                        str(status.get("message", "")) if isinstance(status, dict) else "",
                    )
                yield event
        except ApiError:
            raise
        except Exception as exc:  # connection reset, read timeout, ...
            raise ApiError(0, type(exc).__name__, str(exc)) from None
        finally:
            with contextlib.suppress(Exception):
                raw.release_conn()

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

    def replace_status(self, res: Resource, body: Obj) -> Obj:
        m = meta(body)
        obj: Obj = self._json("PUT", res.path(m.get("namespace"), str(m.get("name", "")), "status"), body=body)
        return obj

    def merge_patch(self, res: Resource, name: str, patch: Obj, *, namespace: str | None = None) -> Obj:
        obj: Obj = self._json(
            "PATCH", res.path(namespace, name), body=patch, content_type="application/merge-patch+json"
        )
        return obj


def _lines(raw: Any) -> Iterator[str]:
    buf = b""
    for chunk in raw.stream(amt=None, decode_content=True):
        if isinstance(chunk, str):
            chunk = chunk.encode()
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
