"""The HTTP underneath :class:`dra_driver.k8s.client.RestKubeApi`: kept-alive connections to one API
server, the exchange of one request over them, and when an answer asks to be sent again.

Failures stay the standard library's (``OSError``, ``http.client.HTTPException``); the client turns
them into :class:`dra_driver.k8s.client.ApiError`.
"""

from __future__ import annotations

import http.client
import select
import ssl
import threading
from collections.abc import Callable
from urllib.parse import urlsplit

from dra_driver.k8s.credentials import Connection

IDEMPOTENT = frozenset({"GET", "PUT", "DELETE", "HEAD"})
"""Methods retried once when a connection breaks after the request was sent (a PUT carries its
resourceVersion precondition, so a repeat cannot overwrite a newer object)."""
CONNECT_RETRIES = 2

MAX_RETRIES = 10
"""Answers that ask to be retried (see :func:`retry_delay`) are retried this often, client-go's
default, before the last answer's error is raised."""
MAX_RETRY_WAIT = 60.0
"""The longest single wait, whatever ``Retry-After`` says: a proxy's nonsense value must not park
a worker for hours."""
THROTTLE_BACKOFF = (0.5, 8.0)
"""First and longest wait (doubling) after a 429 that names no ``Retry-After``."""


def retry_after_seconds(value: str | None) -> int | None:
    """``Retry-After`` as client-go reads it: whole seconds, or None (absent, an HTTP date, junk)."""
    if value is None:
        return None
    try:
        return max(int(value.strip()), 0)
    except ValueError:
        return None


def retry_delay(status: int, retry_after: str | None, retries: int) -> float | None:
    """Seconds to wait before sending a request again after answer ``status``, or None: do not.

    As client-go's ``rest`` client: a 429, or any 5xx, that carries ``Retry-After`` is retried after
    that many seconds, whatever the method, since the server asks for it (a 429 from priority and
    fairness was not processed, so even a create is safe to repeat). Beyond client-go, a 429 without
    a usable header backs off exponentially instead of failing at once: it too was not processed,
    and only proxies leave the header out. ``retries`` is how many retries were already made.
    """
    if retries >= MAX_RETRIES or not (status == 429 or status >= 500):
        return None
    seconds = retry_after_seconds(retry_after)
    if seconds is not None:
        return min(float(seconds), MAX_RETRY_WAIT)
    if status != 429:
        return None
    first, longest = THROTTLE_BACKOFF
    return float(min(first * 2**retries, longest))


class _HTTPSConnection(http.client.HTTPSConnection):
    """HTTPS that checks the certificate for ``server_name`` (and sends it as SNI): the API server's
    host, or ``tls-server-name``; also through a proxy, where ``host`` is the proxy's."""

    def __init__(self, host: str, port: int, *, context: ssl.SSLContext, server_name: str,
                 timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._server_name = server_name
        self._tls = context

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)  # TCP, and the proxy's CONNECT tunnel when set
        self.sock = self._tls.wrap_socket(self.sock, server_hostname=self._server_name)


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """An idle kept-alive connection the server has closed (or sent something on) since."""
    if conn.sock is None:
        return True
    poller = select.poll()
    poller.register(conn.sock, select.POLLIN)
    return bool(poller.poll(0))


class Transport:
    """Kept-alive connections to one API server with one set of TLS settings. Thread-safe: a
    connection serves one request at a time, and returns to the idle list after its response."""

    def __init__(self, conn: Connection, size: int) -> None:
        url = urlsplit(conn.host)
        self.https = url.scheme == "https"
        self.host = url.hostname or ""
        self.port = url.port or (443 if self.https else 80)
        self.netloc = url.netloc
        self.prefix = url.path.rstrip("/")
        self.context = _ssl_context(conn) if self.https else None
        self.server_name = conn.tls_server_name if self.https and conn.verify_ssl and conn.tls_server_name else None
        self.proxy = urlsplit(conn.proxy_url) if conn.proxy_url else None
        self._size = size
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def target(self, suffix: str) -> str:
        """The request target: a path, or for a plain-HTTP server behind a proxy the whole URL."""
        path = self.prefix + suffix
        return f"http://{self.netloc}{path}" if self.proxy is not None and not self.https else path

    def _new(self, timeout: float) -> http.client.HTTPConnection:
        host, port = self.host, self.port
        if self.proxy is not None:
            host, port = self.proxy.hostname or "", self.proxy.port or 80
        if self.context is None:
            return http.client.HTTPConnection(host, port, timeout=timeout)
        conn = _HTTPSConnection(host, port, context=self.context, server_name=self.server_name or self.host,
                                timeout=timeout)
        if self.proxy is not None:
            conn.set_tunnel(self.host, self.port)
        return conn

    def take(self, timeout: float) -> http.client.HTTPConnection:
        """An idle connection the server has not closed, or a new (unconnected) one."""
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if not _dropped(conn):
                    conn.timeout = timeout
                    if conn.sock is not None:
                        conn.sock.settimeout(timeout)
                    return conn
                conn.close()
        return self._new(timeout)

    def give(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        """Back to the idle list, if the response was read to its end and the server keeps it open."""
        if resp.will_close or not resp.isclosed() or conn.sock is None:
            conn.close()
            return
        with self._lock:
            if len(self._idle) < self._size:
                self._idle.append(conn)
                return
        conn.close()

    def clear(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def exchange(transport: Transport, method: str, suffix: str, payload: bytes | None, headers: dict[str, str],
              timeout: float, read_timeout: float | None, meanwhile: Callable[[], object] | None = None,
              ) -> tuple[http.client.HTTPResponse, http.client.HTTPConnection]:
    """Send a request and read the response's head, retrying what can be (see
    :class:`dra_driver.k8s.client.RestKubeApi`); ``meanwhile`` runs between the two. The last
    failure is raised as it came."""
    connect_left, read_left = CONNECT_RETRIES, 1 if method in IDEMPOTENT else 0
    while True:
        conn = transport.take(timeout)
        if conn.sock is None:
            try:
                conn.connect()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                if connect_left and not isinstance(exc, ssl.SSLCertVerificationError):
                    connect_left -= 1
                    continue
                raise
        try:
            conn.request(method, transport.target(suffix), body=payload, headers=headers)
            if meanwhile is not None:
                meanwhile()
            if read_timeout is not None and conn.sock is not None:
                conn.sock.settimeout(read_timeout)
            return conn.getresponse(), conn
        except (OSError, http.client.HTTPException):
            conn.close()
            if read_left:
                read_left -= 1
                continue
            raise


def _ssl_context(conn: Connection) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if conn.verify_ssl:
        if conn.ca_file:
            ctx.load_verify_locations(cafile=conn.ca_file)
        else:
            ctx.load_default_certs()
    else:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if conn.cert_file and conn.key_file:
        ctx.load_cert_chain(conn.cert_file, conn.key_file)
    return ctx
