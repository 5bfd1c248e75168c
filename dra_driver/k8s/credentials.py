"""Where the API server is and who we are to it, read by the official ``kubernetes`` client's loaders.

The official loaders do the reading: kubeconfig files (a ``$KUBECONFIG`` list merged the kubectl
way, file references relative to the kubeconfig, ``exec`` credential plugins, client
certificates, tokens and token files) and the in-cluster service account, whose projected token
the loader reads again every minute. This module turns the ``kubernetes.client.Configuration``
they fill into the few values our urllib3 client needs (:class:`Connection`), and runs the loader
again on demand (:meth:`Credentials.reload`, which the client does once on a 401: an expired exec
credential, a rotated token file or client certificate).

Only the loaders and ``Configuration`` are used. Since ``kubernetes`` 37 the generated model
classes load lazily, so this import costs the node plugin ~15 MiB and none of the ~40 MiB of model
and API classes; ``unit_tests/test_imports.py`` fails if a model module is ever loaded.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from kubernetes.client import Configuration
from kubernetes.client.rest import should_bypass_proxies
from kubernetes.config import ConfigException, load_kube_config
from kubernetes.config.incluster_config import SERVICE_CERT_FILENAME, SERVICE_TOKEN_FILENAME, InClusterConfigLoader

SERVICE_ACCOUNT_DIR = os.path.dirname(SERVICE_TOKEN_FILENAME)

Loader = Callable[[Configuration], None]
"""Fills a fresh ``kubernetes.client.Configuration`` (an official ``load_*`` call)."""


class ConfigurationError(Exception):
    """No usable cluster configuration (kubeconfig or in-cluster)."""


class CredentialError(Exception):
    """Credentials could not be obtained at request time (exec plugin failed, token file unreadable)."""


@dataclass(frozen=True)
class Connection:
    """What one request needs: the server, how to check it, and who we are."""

    host: str
    ca_file: str | None
    verify_ssl: bool
    tls_server_name: str | None
    proxy_url: str | None
    cert_file: str | None
    key_file: str | None
    authorization: str | None
    """The ``Authorization`` header's value (``Bearer …``, ``Basic …``), None for none."""
    generation: int
    """Counts reloads: files at the same paths may hold a new certificate after one."""

    @property
    def tls(self) -> tuple[object, ...]:
        """What a connection pool is built from; a new value needs new TLS connections."""
        return (self.host, self.ca_file, self.verify_ssl, self.tls_server_name, self.proxy_url, self.cert_file,
                self.key_file, self.generation)


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


def _authorization(cfg: Configuration) -> str | None:
    # Runs the loader's refresh hook: the in-cluster token file is read again after a minute, an
    # exec credential whose expirationTimestamp is near is fetched again.
    value = cfg.get_api_key_with_prefix("BearerToken", alias="authorization")
    return value.strip() if value else None


def _proxy(cfg: Configuration) -> str | None:
    proxy = cfg.proxy
    if proxy and should_bypass_proxies(cfg.host, cfg.no_proxy or ""):
        return None
    return proxy or None


class Credentials:
    """One loaded configuration and the loader that made it. Thread-safe."""

    def __init__(self, load: Loader, source: str) -> None:
        self._load = load
        self.source = source
        """Where the configuration came from, for messages."""
        self._lock = threading.Lock()
        self._generation = 0
        self._cfg = self._fresh(ConfigurationError)
        # Once per load, not per request: deciding it reads the whole environment (no_proxy).
        self._proxy_url = _proxy(self._cfg)

    def _fresh(self, error: type[Exception]) -> Configuration:
        cfg = Configuration()
        with _loader_errors() as logged:
            try:
                self._load(cfg)
            except ConfigException as exc:
                raise error(self._cannot(str(exc))) from None
            except Exception as exc:  # unreadable or malformed files (OSError, YAML errors, bad base64)
                raise error(self._cannot(f"{type(exc).__name__}: {exc}")) from None
        if logged.messages and not _authorization(cfg) and not cfg.cert_file:
            raise error(self._cannot(f"no credentials: {'; '.join(logged.messages)}"))
        return cfg

    def _cannot(self, detail: str) -> str:
        # One line: YAML errors span several, and callers print this as one line.
        return f"cannot load cluster configuration from {self.source}: {' '.join(detail.split())}"

    @property
    def host(self) -> str:
        with self._lock:
            return str(self._cfg.host).rstrip("/")

    def connection(self) -> Connection:
        with self._lock:
            cfg = self._cfg
            try:
                authorization = _authorization(cfg)
            except Exception as exc:  # a failed exec plugin run, an unreadable token file
                raise CredentialError(f"{self.source}: {exc}") from None
            return Connection(
                host=str(cfg.host).rstrip("/"), ca_file=cfg.ssl_ca_cert, verify_ssl=bool(cfg.verify_ssl),
                tls_server_name=cfg.tls_server_name, proxy_url=self._proxy_url, cert_file=cfg.cert_file,
                key_file=cfg.key_file, authorization=authorization, generation=self._generation,
            )

    def reload(self) -> None:
        """Run the loader again: re-reads the files, re-runs an exec plugin."""
        cfg = self._fresh(CredentialError)
        proxy_url = _proxy(cfg)
        with self._lock:
            self._cfg = cfg
            self._proxy_url = proxy_url
            self._generation += 1


def kubeconfig_loader(path: str, context: str | None = None) -> Loader:
    # persist_config=False: the loader must never write back into the user's kubeconfig.
    return lambda cfg: load_kube_config(config_file=path, context=context, client_configuration=cfg,
                                        persist_config=False)


def incluster_loader(service_account_dir: str | None = None) -> Loader:
    token = os.path.join(service_account_dir, "token") if service_account_dir else SERVICE_TOKEN_FILENAME
    ca = os.path.join(service_account_dir, "ca.crt") if service_account_dir else SERVICE_CERT_FILENAME
    return lambda cfg: InClusterConfigLoader(token_filename=token, cert_filename=ca).load_and_set(cfg)


def load_credentials(kubeconfig: str | None) -> Credentials:
    """From ``kubeconfig``, ``$KUBECONFIG``, the in-cluster service account or ``~/.kube/config``, in that order."""
    path = kubeconfig or os.environ.get("KUBECONFIG") or None
    if path:
        if not any(os.path.exists(os.path.expanduser(p)) for p in path.split(os.pathsep) if p):
            raise ConfigurationError(f"kubeconfig {path} does not exist")
        return Credentials(kubeconfig_loader(path), f"kubeconfig {path}")
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return Credentials(incluster_loader(), "in-cluster configuration")
    default = os.path.expanduser("~/.kube/config")
    if os.path.exists(default):
        return Credentials(kubeconfig_loader(default), f"kubeconfig {default}")
    raise ConfigurationError("no kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config) and not running in a cluster")
