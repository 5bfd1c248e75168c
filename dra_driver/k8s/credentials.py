"""Where the API server is and who we are to it: the official ``kubernetes`` client's loaders, and a
native reading of the two shapes nearly every deployment has.

The official loaders read everything: kubeconfig files (a ``$KUBECONFIG`` list merged the kubectl
way, file references relative to the kubeconfig, ``exec`` credential plugins, auth providers, client
certificates, tokens and token files, basic auth) and the in-cluster service account, whose
projected token the loader reads again every minute. Importing them is the node plugin's largest
dependency by memory (``kubernetes.client``, pydantic, requests, oauthlib;
docs/benchmarks.md#the-codes-figures), so two shapes are read here without them, with the official
loaders' results:

* the in-cluster service account (``KUBERNETES_SERVICE_HOST``/``PORT``, token and CA files, the
  token read again after a minute): how the node plugin runs in a cluster;
* one kubeconfig file whose context's cluster has only ``server``, ``certificate-authority[-data]``,
  ``insecure-skip-tls-verify`` and ``tls-server-name``, and whose user has only ``token``,
  ``tokenFile`` and ``client-certificate[-data]``/``client-key[-data]``: what kubeadm, kind and
  the test bed write.

Both decide a proxy from the environment the way the official loader does (``<scheme>_proxy``, else
``all_proxy``; none for a server that ``no_proxy`` exempts, by name, domain, ``host:port``, IP address
or CIDR range), and the client reaches the server through it itself (CONNECT for https), so a proxy
variable costs no import. Anything else (exec plugins, auth providers, basic auth, a list of files, a
``proxy-url``, a missing or unreadable file, whose error the official loader words) goes to the
official loaders, imported then. ``unit_tests/k8s/test_credentials.py`` checks that both ways give the
same connection.

:meth:`Credentials.reload` runs the loader again (the client does once on a 401: an expired exec
credential, a rotated token file or client certificate).
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ipaddress
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import IO, Any
from urllib.parse import urlsplit

import yaml

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_REFRESH_SECONDS = 60.0
"""How long an in-cluster token is used before its file is read again (the official loader's minute)."""
CLUSTER_KEYS = frozenset({"server", "certificate-authority", "certificate-authority-data", "insecure-skip-tls-verify",
                          "tls-server-name"})
USER_KEYS = frozenset({"token", "tokenFile", "client-certificate", "client-certificate-data", "client-key",
                       "client-key-data"})
CONTEXT_KEYS = frozenset({"cluster", "user", "namespace"})
_FAST_LOADER: Any = getattr(yaml, "CSafeLoader", None)


def _read_yaml(f: IO[str]) -> Any:
    """The YAML document in ``f``, as ``yaml.safe_load`` reads it. A command reads its kubeconfig
    up to three times (its context, then the client's), and the pure-Python parser cost more than
    the rest of the client's set-up: libyaml's parser reads it where PyYAML was built with it. A
    document that parser rejects is read again by the pure-Python one, so an error says what it
    always said."""
    text = f.read()
    if _FAST_LOADER is not None:
        try:
            return yaml.load(text, Loader=_FAST_LOADER)
        except yaml.YAMLError:
            pass
    return yaml.safe_load(text)


class KubeconfigError(Exception):
    """No usable cluster configuration: no kubeconfig and no in-cluster account, a kubeconfig or
    context that is not there, or one that does not load. Where the API server is, and as whom: not
    to be confused with :class:`dra_driver.gpuconfig.ConfigError`, a claim's opaque ``GpuConfig``.
    The commands print it as their one line (:mod:`dra_driver.cli`)."""


class CredentialError(Exception):
    """Credentials could not be obtained at request time (exec plugin failed, token file unreadable)."""


class LoadError(Exception):
    """A loader could not read the configuration; the message says why."""


@dataclass(frozen=True)
class Connection:
    """What a loader read and every request needs: the server, how to check it, and who we are."""

    host: str
    ca_file: str | None
    verify_ssl: bool
    tls_server_name: str | None
    proxy_url: str | None
    cert_file: str | None
    key_file: str | None
    authorization: Callable[[], str | None]
    """The ``Authorization`` header's value now (``Bearer …``, ``Basic …``, None for none): it may read a
    token file again or run an exec plugin."""
    generation: int = 0
    """Counts reloads: files at the same paths may hold a new certificate after one."""

    @property
    def tls(self) -> tuple[object, ...]:
        """What a connection pool is built from; a new value needs new TLS connections."""
        return (self.host, self.ca_file, self.verify_ssl, self.tls_server_name, self.proxy_url, self.cert_file,
                self.key_file, self.generation)


Loader = Callable[[], Connection]


# --- proxies from the environment ------------------------------------------------------------------------


def env_proxies(environ: Mapping[str, str]) -> dict[str, str]:
    """``{scheme: proxy URL}`` from the ``<scheme>_proxy`` variables (``no`` for ``no_proxy``), read as
    Python's ``urllib.request.getproxies`` reads them on Linux, which the official loader uses: the
    variable's name in any case, one spelled ``…_proxy`` winning (an empty one removing the scheme),
    and ``HTTP_PROXY`` not trusted in a CGI request. ``urllib.request`` itself costs the node plugin
    ``tempfile``, ``bz2`` and ``lzma``."""
    found: dict[str, str] = {}
    for name, value in environ.items():
        if name[-6:].lower() == "_proxy" and value:
            found[name[:-6].lower()] = value
    if "REQUEST_METHOD" in environ:
        found.pop("http", None)
    for name, value in environ.items():
        if name.endswith("_proxy"):
            if value:
                found[name[:-6].lower()] = value
            else:
                found.pop(name[:-6].lower(), None)
    return found


def bypassed(url: str, no_proxy: str) -> bool:
    """Whether ``no_proxy`` exempts ``url``'s host. Entries are comma-separated: ``*``; a host name, also
    matching its subdomains (a leading dot is the same); ``host:port``; an IP address or CIDR range."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if not host:
        return True
    netloc = parts.netloc.lower()
    try:
        ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if entry == "*":
            return True
        if not entry:
            continue
        if ip is not None and _in_range(ip, entry):
            return True
        name = entry.lstrip(".")
        if any(x == name or x.endswith("." + name) for x in (host, netloc)):
            return True
    return False


def _in_range(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, entry: str) -> bool:
    try:
        return ip in ipaddress.ip_network(entry, strict=False)
    except ValueError:
        return False


def proxy_for(url: str, proxy: str | None, no_proxy: str | None) -> str | None:
    """``proxy``, unless there is none or ``no_proxy`` exempts ``url``."""
    return proxy if proxy and not bypassed(url, no_proxy or "") else None


def env_proxy(url: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """The proxy the environment gives requests to ``url``: its scheme's, else ``all_proxy``'s."""
    proxies = env_proxies(environ)
    return proxy_for(url, proxies.get(urlsplit(url).scheme) or proxies.get("all"), proxies.get("no"))


# --- the official loaders ------------------------------------------------------------------------------


class _LoaderErrors(logging.Handler):
    """The official kubeconfig loader logs (rather than raises) a failed exec plugin and then goes on
    without credentials; this keeps those messages so the failure can be reported as what it is."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def _loader_errors() -> Iterator[_LoaderErrors]:
    handler = _LoaderErrors()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)


def _authorization(cfg: Any) -> str | None:
    # Runs the loader's refresh hook: the in-cluster token file is read again after a minute, an
    # exec credential whose expirationTimestamp is near is fetched again.
    value = cfg.get_api_key_with_prefix("BearerToken", alias="authorization")
    return value.strip() if value else None


def official_loader(fill: Callable[[Any], None]) -> Loader:
    """``fill``, an official ``load_*`` call, on a fresh ``kubernetes.client.Configuration``.

    Only the loaders and ``Configuration`` are used; ``kubernetes`` ≥ 37 loads its model classes
    lazily, and ``unit_tests/test_imports.py`` fails if a model module is ever loaded.
    """
    def load() -> Connection:
        from kubernetes.client import Configuration
        from kubernetes.config import ConfigException

        cfg = Configuration()
        with _loader_errors() as logged:
            try:
                fill(cfg)
            except ConfigException as exc:
                raise LoadError(str(exc)) from None
            except Exception as exc:  # unreadable or malformed files (OSError, YAML errors, bad base64)
                raise LoadError(f"{type(exc).__name__}: {exc}") from None
        if logged.messages and not _authorization(cfg) and not cfg.cert_file:
            raise LoadError(f"no credentials: {'; '.join(logged.messages)}")
        return Connection(host=str(cfg.host).rstrip("/"), ca_file=cfg.ssl_ca_cert, verify_ssl=bool(cfg.verify_ssl),
                          tls_server_name=cfg.tls_server_name, proxy_url=proxy_for(cfg.host, cfg.proxy, cfg.no_proxy),
                          cert_file=cfg.cert_file, key_file=cfg.key_file, authorization=lambda: _authorization(cfg))
    return load


# --- the common shapes, natively -------------------------------------------------------------------------


_data_files: dict[bytes, str] = {}
_data_files_lock = threading.Lock()


@atexit.register
def _remove_data_files() -> None:
    for path in _data_files.values():
        with contextlib.suppress(OSError):
            os.unlink(path)


def _data_file(b64: str) -> str:
    """A private file holding the decoded ``*-data`` value, one per distinct content, removed at exit
    (as the official loader does: TLS libraries take file names)."""
    content = base64.standard_b64decode(b64.encode())
    with _data_files_lock:
        path = _data_files.get(content)
        if path is None or not os.path.isfile(path):
            import tempfile  # here: only inline *-data needs it, and it brings shutil, bz2 and lzma

            fd, path = tempfile.mkstemp()
            with os.fdopen(fd, "wb") as f:
                f.write(content)
            _data_files[content] = path
        return path


def _named(items: Any, name: Any, kind: str) -> Mapping[str, Any] | None:
    if not isinstance(items, list) or not isinstance(name, str) or not name:
        return None
    for item in items:
        if isinstance(item, Mapping) and item.get("name") == name:
            value = item.get(kind)
            return value if isinstance(value, Mapping) else None
    return None


def _file_or_data(obj: Mapping[str, Any], key: str, base: str) -> str | None:
    """``key``'s file (relative to the kubeconfig) or ``key-data`` in a file; raises LoadError when the
    entry is not a plain, existing one (the official loader then reads it and words the error)."""
    data, name = obj.get(f"{key}-data"), obj.get(key)
    if data is not None:
        if not isinstance(data, str) or not data:
            raise LoadError(f"{key}-data")
        return _data_file(data)
    if name is None:
        return None
    if not isinstance(name, str) or not name:
        raise LoadError(key)
    path = os.path.normpath(os.path.join(base, name))
    if not os.path.isfile(path):
        raise LoadError(key)
    return path


def _static(value: str | None) -> Callable[[], str | None]:
    return lambda: value


def simple_kubeconfig(path: str, context: str | None = None) -> Connection | None:
    """The kubeconfig at ``path`` read without the official loader, or None when it is not one of the
    shapes this module reads itself (see the module docstring)."""
    if os.pathsep in path:
        return None
    path = os.path.abspath(os.path.expanduser(path))
    try:
        with open(path) as f:
            doc = _read_yaml(f)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if not isinstance(doc, Mapping):
        return None
    ctx = _named(doc.get("contexts"), context or doc.get("current-context"), "context")
    if ctx is None or not set(ctx) <= CONTEXT_KEYS:
        return None
    cluster = _named(doc.get("clusters"), ctx.get("cluster"), "cluster")
    user = _named(doc.get("users"), ctx.get("user"), "user")
    if cluster is None or user is None or not set(cluster) <= CLUSTER_KEYS or not set(user) <= USER_KEYS:
        return None
    server, insecure, sni = cluster.get("server"), cluster.get("insecure-skip-tls-verify"), cluster.get("tls-server-name")
    if (not isinstance(server, str) or not server or not isinstance(insecure, bool | None)
            or not isinstance(sni, str | None)):
        return None
    base = os.path.dirname(path)
    ca = cert = key = None
    try:
        token = _token(user, base)
        if server.startswith("https"):  # the official loader reads these for https only
            ca = _file_or_data(cluster, "certificate-authority", base)
            cert = _file_or_data(user, "client-certificate", base)
            key = _file_or_data(user, "client-key", base)
    except (LoadError, OSError, UnicodeDecodeError, ValueError):
        return None
    return Connection(host=server.rstrip("/"), ca_file=ca, verify_ssl=not insecure, tls_server_name=sni,
                      proxy_url=env_proxy(server), cert_file=cert, key_file=key,
                      authorization=_static(f"Bearer {token}".strip() if token else None))


def _token(user: Mapping[str, Any], base: str) -> str | None:
    """``token``, else the content of ``tokenFile``: the official loader's precedence."""
    if "token" in user:
        token = user["token"]
        if not isinstance(token, str):
            raise LoadError("token")
        return token
    name = user.get("tokenFile")
    if name is None:
        return None
    if not isinstance(name, str) or not name:
        raise LoadError("tokenFile")
    with open(os.path.normpath(os.path.join(base, name))) as f:
        return f.read()


class _InClusterToken:
    """The service account's token, read again once it is a minute old (a projected token rotates)."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._value = self._read()
        self._read_at = time.monotonic()

    def _read(self) -> str:
        with open(self._path) as f:
            content = f.read()
        if not content:
            raise LoadError("Token file exists but empty.")
        return ("bearer " + content).strip()

    def __call__(self) -> str | None:
        with self._lock:
            if time.monotonic() - self._read_at >= TOKEN_REFRESH_SECONDS:
                self._value, self._read_at = self._read(), time.monotonic()
            return self._value


def simple_incluster(token_path: str, ca_path: str) -> Connection | None:
    """The service account read without the official loader; None when anything is missing (the official
    loader then says what)."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port or not os.path.isfile(token_path) or not os.path.isfile(ca_path):
        return None
    try:
        with open(ca_path) as f:
            if not f.read():
                return None
        token = _InClusterToken(token_path)
    except (LoadError, OSError, UnicodeDecodeError):
        return None
    joined = f"[{host}]:{port}" if ":" in host or "%" in host else f"{host}:{port}"  # Go's net.JoinHostPort
    server = f"https://{joined}"
    return Connection(host=server, ca_file=ca_path, verify_ssl=True, tls_server_name=None, proxy_url=env_proxy(server),
                      cert_file=None, key_file=None, authorization=token)


def kubeconfig_loader(path: str, context: str | None = None) -> Loader:
    def official(cfg: Any) -> None:
        from kubernetes.config import load_kube_config

        # persist_config=False: the loader must never write back into the user's kubeconfig.
        load_kube_config(config_file=path, context=context, client_configuration=cfg, persist_config=False)

    fallback = official_loader(official)
    return lambda: simple_kubeconfig(path, context) or fallback()


def incluster_loader(service_account_dir: str | None = None) -> Loader:
    directory = service_account_dir or SERVICE_ACCOUNT_DIR
    token, ca = os.path.join(directory, "token"), os.path.join(directory, "ca.crt")

    def official(cfg: Any) -> None:
        from kubernetes.config.incluster_config import InClusterConfigLoader

        InClusterConfigLoader(token_filename=token, cert_filename=ca).load_and_set(cfg)

    fallback = official_loader(official)
    return lambda: simple_incluster(token, ca) or fallback()


class Credentials:
    """One loaded configuration and the loader that made it. Thread-safe."""

    def __init__(self, load: Loader, source: str) -> None:
        self._load = load
        self.source = source
        """Where the configuration came from, for messages."""
        self._lock = threading.Lock()
        self._loaded = self._fresh(KubeconfigError)

    def _fresh(self, error: type[Exception]) -> Connection:
        try:
            return self._load()
        except LoadError as exc:
            raise error(self._cannot(str(exc))) from None

    def _cannot(self, detail: str) -> str:
        # One line: YAML errors span several, and callers print this as one line.
        return f"cannot load cluster configuration from {self.source}: {' '.join(detail.split())}"

    @property
    def host(self) -> str:
        with self._lock:
            return self._loaded.host

    def connection(self) -> tuple[Connection, str | None]:
        """The connection, and its ``Authorization`` header's value now."""
        with self._lock:
            conn = self._loaded
            try:
                return conn, conn.authorization()
            except Exception as exc:  # a failed exec plugin run, an unreadable token file
                raise CredentialError(f"{self.source}: {exc}") from None

    def reload(self) -> None:
        """Run the loader again: re-reads the files, re-runs an exec plugin."""
        loaded = self._fresh(CredentialError)
        with self._lock:
            self._loaded = replace(loaded, generation=self._loaded.generation + 1)


def in_cluster_possible(environ: Mapping[str, str], service_account_dir: str | None = None) -> bool:
    """client-go's test (``inClusterClientConfig.Possible``): the service's host and port are set and
    the service account's token is a file."""
    token = os.path.join(service_account_dir or SERVICE_ACCOUNT_DIR, "token")
    return bool(environ.get("KUBERNETES_SERVICE_HOST")) and bool(environ.get("KUBERNETES_SERVICE_PORT")) \
        and os.path.isfile(token)


def kubeconfig_path(kubeconfig: str | None, environ: Mapping[str, str] | None = None,
                    service_account_dir: str | None = None) -> str | None:
    """The kubeconfig that :func:`load_credentials` reads, None for the in-cluster service account;
    in client-go's order (clientcmd's default loading rules, then the in-cluster fallback of its
    deferred loader): ``kubeconfig`` (``--kubeconfig``; it must exist); else ``$KUBECONFIG``, a list
    of files merged (missing ones skipped; returned as given); else ``~/.kube/config``; and only when
    none of those files exists, the service account of the pod we run in."""
    environ = os.environ if environ is None else environ
    if kubeconfig:
        if not os.path.exists(os.path.expanduser(kubeconfig)):
            raise KubeconfigError(f"kubeconfig {kubeconfig} does not exist")
        return kubeconfig
    listed = environ.get("KUBECONFIG") or ""
    files = [p for p in listed.split(os.pathsep) if p] if listed else [os.path.expanduser("~/.kube/config")]
    if any(os.path.exists(os.path.expanduser(p)) for p in files):
        return listed or files[0]
    if in_cluster_possible(environ, service_account_dir):
        return None
    if listed:
        raise KubeconfigError(f"kubeconfig {listed} ($KUBECONFIG) does not exist, and not running in a cluster")
    raise KubeconfigError("no kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config) and not running in a cluster")


def load_credentials(kubeconfig: str | None, context: str | None = None) -> Credentials:
    """From ``kubeconfig``, ``$KUBECONFIG``, ``~/.kube/config`` or the in-cluster service account, in
    that order (:func:`kubeconfig_path`); ``context``: a kubeconfig's context other than its current
    one (checked to exist)."""
    path = kubeconfig_path(kubeconfig)
    if path is None:
        if context:
            raise KubeconfigError(f"context {context!r} asked for, but there is no kubeconfig (in-cluster configuration)")
        return Credentials(incluster_loader(), "in-cluster configuration")
    if context:
        kubeconfig_context(path, context)
    return Credentials(kubeconfig_loader(path, context), f"kubeconfig {path}" + (f" (context {context})" if context else ""))


def kubeconfig_context(path: str, context: str | None = None) -> tuple[str, str | None]:
    """The context kubectl would use from the kubeconfig ``path`` (a ``$KUBECONFIG`` list read the
    kubectl way: the first file that sets a value wins) and its namespace: ``context`` or the
    current one. A context that is not there is a KubeconfigError naming it."""
    docs: list[Mapping[str, Any]] = []
    for p in path.split(os.pathsep):
        full = os.path.expanduser(p)
        if not p or not os.path.exists(full):
            continue
        try:
            with open(full) as f:
                doc = _read_yaml(f)
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            detail = " ".join(str(exc).split())
            raise KubeconfigError(f"cannot load cluster configuration from kubeconfig {p}: {detail}") from None
        if isinstance(doc, Mapping):
            docs.append(doc)
    name = context or next((str(d["current-context"]) for d in docs if d.get("current-context")), "")
    if not name:
        raise KubeconfigError(f"kubeconfig {path} sets no current context; name one with --context")
    for doc in docs:
        ctx = _named(doc.get("contexts"), name, "context")
        if ctx is not None:
            namespace = ctx.get("namespace")
            return name, str(namespace) if isinstance(namespace, str) and namespace else None
    raise KubeconfigError(f"context {name!r} not found in kubeconfig {path}")
