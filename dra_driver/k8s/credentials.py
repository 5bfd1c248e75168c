"""Where the API server is and how to authenticate to it: kubeconfig files and in-cluster config.

This replaces the official client's loader so that the node plugin does not import the
``kubernetes`` package (its ``__init__`` imports every generated API and model class, ~15 MiB of
resident memory for a process that makes three kinds of request). What is supported is what real
clusters use:

* kubeconfig (``--kubeconfig``, ``$KUBECONFIG`` — a ``os.pathsep`` list merged the kubectl way, the
  first definition of each name winning — or ``~/.kube/config``): the current context's cluster
  (``server``, ``certificate-authority``/``-data``, ``insecure-skip-tls-verify``,
  ``tls-server-name``, ``proxy-url``) and user (``token``, ``tokenFile``,
  ``client-certificate``/``-data`` + ``client-key``/``-data``, ``username``/``password``, ``exec``
  credential plugins). File references are relative to the kubeconfig file that defines them.
* in-cluster: ``KUBERNETES_SERVICE_HOST``/``PORT`` and the service account's token and CA.

Tokens from files are re-read every :data:`TOKEN_FILE_REFRESH` seconds, since projected service
account tokens rotate under a long-running process; exec credentials are cached until their
``expirationTimestamp``. :meth:`Credentials.invalidate` (called on a 401) forces both to be
fetched again. The legacy ``auth-provider`` plugins (removed from kubectl) are refused with a
message pointing at their exec replacements.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_FILE_REFRESH = 60.0
"""Seconds a token read from a file is used before the file is read again (client-go: 1 min)."""
EXEC_TIMEOUT = 60.0
EXEC_EXPIRY_MARGIN = 10.0
"""An exec credential is renewed this many seconds before its expirationTimestamp, so a request
does not leave with a token that expires on the way."""
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")


class ConfigurationError(Exception):
    """No usable cluster configuration (kubeconfig or in-cluster)."""


class CredentialError(Exception):
    """Credentials could not be obtained at request time (exec plugin failed, token file unreadable)."""


@dataclass(frozen=True)
class ClientCert:
    """A TLS client certificate: PEM data, or paths of PEM files."""

    cert_pem: bytes | None = None
    key_pem: bytes | None = None
    cert_file: str | None = None
    key_file: str | None = None


@dataclass
class ExecProvider:
    """A ``client.authentication.k8s.io`` exec credential plugin (kubeconfig ``user.exec``)."""

    command: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    api_version: str = EXEC_API_VERSIONS[0]
    install_hint: str = ""
    interactive_mode: str = ""
    cluster_info: dict[str, Any] | None = None
    """What ``provideClusterInfo: true`` passes in ``spec.cluster``; None when not asked for."""


@dataclass(frozen=True)
class ExecCredential:
    token: str | None
    client_cert: ClientCert | None
    expires_at: float | None
    """Wall-clock (``time.time()``) expiry; None: valid until the server says otherwise (401)."""


def run_exec_provider(provider: ExecProvider) -> ExecCredential:
    """Run the plugin the way client-go does (non-interactive) and parse its ExecCredential."""
    if provider.interactive_mode == "Always":
        raise CredentialError(f"exec plugin {provider.command} needs a terminal (interactiveMode: Always)")
    spec: dict[str, Any] = {"interactive": False}
    if provider.cluster_info is not None:
        spec["cluster"] = provider.cluster_info
    env = dict(os.environ)
    env.update(provider.env)
    env["KUBERNETES_EXEC_INFO"] = json.dumps(
        {"apiVersion": provider.api_version, "kind": "ExecCredential", "spec": spec}, separators=(",", ":"))
    try:
        proc = subprocess.run([provider.command, *provider.args], env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=EXEC_TIMEOUT, check=False)
    except FileNotFoundError:
        hint = f" ({provider.install_hint.strip()})" if provider.install_hint.strip() else ""
        raise CredentialError(f"exec plugin {provider.command} not found{hint}") from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CredentialError(f"exec plugin {provider.command}: {exc}") from None
    if proc.returncode != 0:
        stderr = proc.stderr.decode("utf-8", errors="replace").strip()[-500:]
        raise CredentialError(f"exec plugin {provider.command} exited with {proc.returncode}: {stderr}")
    try:
        out = json.loads(proc.stdout)
    except ValueError as exc:
        raise CredentialError(f"exec plugin {provider.command} printed no ExecCredential: {exc}") from None
    if not isinstance(out, dict) or out.get("kind") != "ExecCredential":
        raise CredentialError(f"exec plugin {provider.command} printed something that is not an ExecCredential")
    if out.get("apiVersion") != provider.api_version:
        raise CredentialError(f"exec plugin {provider.command} answered {out.get('apiVersion')!r}, "
                              f"asked for {provider.api_version!r}")
    status = out.get("status")
    if not isinstance(status, dict):
        raise CredentialError(f"exec plugin {provider.command}: ExecCredential without status")
    token = status.get("token") or None
    cert_data, key_data = status.get("clientCertificateData"), status.get("clientKeyData")
    if bool(cert_data) != bool(key_data):
        raise CredentialError(f"exec plugin {provider.command}: clientCertificateData and clientKeyData go together")
    cert = ClientCert(cert_pem=str(cert_data).encode(), key_pem=str(key_data).encode()) if cert_data else None
    if token is None and cert is None:
        raise CredentialError(f"exec plugin {provider.command}: ExecCredential has neither token nor client certificate")
    expires_at = None
    stamp = status.get("expirationTimestamp")
    if stamp:
        try:
            expires_at = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise CredentialError(f"exec plugin {provider.command}: bad expirationTimestamp {stamp!r}") from None
    return ExecCredential(str(token) if token is not None else None, cert, expires_at)


class Credentials:
    """The user's credentials: the static part of the config plus the cached, refreshable part.

    Thread-safe; :meth:`current` is called for every request and is cheap while nothing expires.
    """

    def __init__(self, *, token: str | None = None, token_file: str | None = None, username: str | None = None,
                 password: str | None = None, client_cert: ClientCert | None = None,
                 exec_provider: ExecProvider | None = None) -> None:
        self.token = token
        self.token_file = token_file
        self.username = username
        self.password = password
        self.client_cert = client_cert
        self.exec_provider = exec_provider
        self._lock = threading.Lock()
        self._file_token: str | None = None
        self._file_read_at = 0.0
        self._exec: ExecCredential | None = None

    @property
    def refreshable(self) -> bool:
        """Whether fetching the credentials again can change them (worth retrying a 401)."""
        return self.exec_provider is not None or self.token_file is not None

    def invalidate(self) -> None:
        with self._lock:
            self._exec = None
            self._file_read_at = 0.0

    def current(self) -> tuple[dict[str, str], ClientCert | None]:
        """(headers to add, client certificate for TLS)."""
        with self._lock:
            if self.exec_provider is not None:
                cred = self._exec
                if cred is None or (cred.expires_at is not None and time.time() >= cred.expires_at - EXEC_EXPIRY_MARGIN):
                    cred = self._exec = run_exec_provider(self.exec_provider)
                headers = {"Authorization": f"Bearer {cred.token}"} if cred.token else {}
                return headers, cred.client_cert or self.client_cert
            token = self.token or self._read_token_file()
        if token:
            return {"Authorization": f"Bearer {token}"}, self.client_cert
        if self.username is not None and self.password is not None:
            basic = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
            return {"Authorization": f"Basic {basic}"}, self.client_cert
        return {}, self.client_cert

    def _read_token_file(self) -> str | None:
        if self.token_file is None:
            return None
        now = time.monotonic()
        if self._file_token is not None and now - self._file_read_at < TOKEN_FILE_REFRESH:
            return self._file_token
        try:
            with open(self.token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            # A rotation in progress can leave the file briefly missing: keep the last token.
            if self._file_token is not None:
                return self._file_token
            raise CredentialError(f"cannot read token file {self.token_file}: {exc}") from None
        self._file_token, self._file_read_at = token, now
        return token


@dataclass
class Configuration:
    """One API server and the credentials to use with it."""

    host: str = "http://localhost"
    ca_file: str | None = None
    ca_data: bytes | None = None
    verify_ssl: bool = True
    tls_server_name: str | None = None
    proxy_url: str | None = None
    credentials: Credentials = field(default_factory=Credentials)
    connection_pool_maxsize: int = 10
    """Connections kept open to the server; more than this many concurrent requests still go out,
    on connections that are closed afterwards."""


# --------------------------------------------------------------------------------------------
# Loading


def load_configuration(kubeconfig: str | None) -> Configuration:
    """From ``kubeconfig``, ``$KUBECONFIG``, ``~/.kube/config`` or the in-cluster service account, in that order."""
    path = kubeconfig or os.environ.get("KUBECONFIG") or None
    try:
        if path:
            files = [p for p in path.split(os.pathsep) if p]
            existing = [p for p in files if os.path.exists(p)]
            if not existing:
                raise ConfigurationError(f"kubeconfig {path} does not exist")
            return load_kubeconfig(existing)
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            return load_incluster()
        default = os.path.expanduser("~/.kube/config")
        if os.path.exists(default):
            return load_kubeconfig([default])
    except ConfigurationError:
        raise
    except Exception as exc:  # YAML errors, unreadable files
        raise ConfigurationError(f"cannot load cluster configuration: {exc}") from None
    raise ConfigurationError("no kubeconfig (--kubeconfig, $KUBECONFIG, ~/.kube/config) and not running in a cluster")


def load_incluster(service_account_dir: str | None = None) -> Configuration:
    service_account_dir = service_account_dir or SERVICE_ACCOUNT_DIR
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST", ""), os.environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise ConfigurationError("in-cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set")
    token_file = os.path.join(service_account_dir, "token")
    ca_file = os.path.join(service_account_dir, "ca.crt")
    for f in (token_file, ca_file):
        if not os.path.isfile(f):
            raise ConfigurationError(f"in-cluster: {f} does not exist")
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    creds = Credentials(token_file=token_file)
    creds.current()  # fail now, not at the first request, when the token cannot be read
    return Configuration(host=f"https://{host}:{port}", ca_file=ca_file, credentials=creds)


@dataclass
class _Named:
    body: dict[str, Any]
    base_dir: str


def _read_yaml(path: str) -> dict[str, Any]:
    import yaml  # only kubeconfig users pay for it

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path, encoding="utf-8") as f:
        doc = yaml.load(f, Loader=loader)  # a safe loader (C one when available)
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigurationError(f"kubeconfig {path} is not a mapping")
    return doc


def load_kubeconfig(paths: list[str], context: str | None = None) -> Configuration:
    """The configuration of ``context`` (default: ``current-context``) in the merge of ``paths``."""
    current = context or ""
    sections: dict[str, dict[str, _Named]] = {"clusters": {}, "users": {}, "contexts": {}}
    inner = {"clusters": "cluster", "users": "user", "contexts": "context"}
    for path in paths:
        doc = _read_yaml(path)
        base_dir = os.path.dirname(os.path.abspath(path))
        if not current and doc.get("current-context"):
            current = str(doc["current-context"])
        for section, key in inner.items():
            for entry in doc.get(section) or []:
                if not isinstance(entry, dict) or not entry.get("name"):
                    continue
                sections[section].setdefault(str(entry["name"]), _Named(entry.get(key) or {}, base_dir))
    where = os.pathsep.join(paths)
    if not current:
        raise ConfigurationError(f"kubeconfig {where} has no current-context")
    ctx = sections["contexts"].get(current)
    if ctx is None:
        raise ConfigurationError(f"kubeconfig {where}: context {current!r} not found")
    cluster = sections["clusters"].get(str(ctx.body.get("cluster", "")))
    if cluster is None:
        raise ConfigurationError(f"kubeconfig {where}: cluster {ctx.body.get('cluster')!r} of context {current!r} not found")
    user_name = ctx.body.get("user")
    user = sections["users"].get(str(user_name)) if user_name else None
    if user_name and user is None:
        raise ConfigurationError(f"kubeconfig {where}: user {user_name!r} of context {current!r} not found")
    return _configuration(cluster, user or _Named({}, cluster.base_dir))


def _path(value: Any, base_dir: str) -> str:
    p = os.path.expanduser(str(value))
    return p if os.path.isabs(p) else os.path.join(base_dir, p)


def _data(body: Mapping[str, Any], key: str) -> bytes | None:
    value = body.get(key)
    if not value:
        return None
    try:
        return base64.b64decode(str(value), validate=False)
    except (binascii.Error, ValueError):
        raise ConfigurationError(f"kubeconfig: {key} is not valid base64") from None


def _file_or_data(body: Mapping[str, Any], key: str, base_dir: str) -> tuple[str | None, bytes | None]:
    data = _data(body, f"{key}-data")
    if data is not None:
        return None, data
    return (_path(body[key], base_dir), None) if body.get(key) else (None, None)


def _configuration(cluster: _Named, user: _Named) -> Configuration:
    c = cluster.body
    server = str(c.get("server") or "").rstrip("/")
    if not server:
        raise ConfigurationError("kubeconfig: the cluster has no server")
    ca_file, ca_data = _file_or_data(c, "certificate-authority", cluster.base_dir)
    insecure = bool(c.get("insecure-skip-tls-verify"))
    tls_server_name = str(c["tls-server-name"]) if c.get("tls-server-name") else None
    proxy_url = str(c["proxy-url"]) if c.get("proxy-url") else None

    u = user.body
    if u.get("auth-provider"):
        name = (u["auth-provider"] or {}).get("name", "?") if isinstance(u["auth-provider"], dict) else "?"
        raise ConfigurationError(f"kubeconfig: auth-provider {name!r} is not supported; use its exec credential "
                                 "plugin (e.g. gke-gcloud-auth-plugin, kubelogin)")
    cert_file, cert_data = _file_or_data(u, "client-certificate", user.base_dir)
    key_file, key_data = _file_or_data(u, "client-key", user.base_dir)
    client_cert = None
    if (cert_file or cert_data) and (key_file or key_data):
        client_cert = ClientCert(cert_pem=cert_data, key_pem=key_data, cert_file=cert_file, key_file=key_file)
    elif cert_file or cert_data or key_file or key_data:
        raise ConfigurationError("kubeconfig: client-certificate and client-key go together")
    exec_provider = None
    if isinstance(u.get("exec"), dict):
        exec_provider = _exec_provider(u["exec"], user.base_dir, server, ca_data if ca_data else _read(ca_file),
                                       insecure, tls_server_name, proxy_url, c)
    creds = Credentials(
        token=str(u["token"]) if u.get("token") else None,
        token_file=_path(u["tokenFile"], user.base_dir) if u.get("tokenFile") else None,
        username=str(u["username"]) if u.get("username") is not None else None,
        password=str(u["password"]) if u.get("password") is not None else None,
        client_cert=client_cert,
        exec_provider=exec_provider,
    )
    return Configuration(host=server, ca_file=ca_file, ca_data=ca_data, verify_ssl=not insecure,
                         tls_server_name=tls_server_name, proxy_url=proxy_url, credentials=creds)


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None  # the exec plugin gets no CA then; TLS set-up reports the missing file


def _exec_provider(e: Mapping[str, Any], base_dir: str, server: str, ca: bytes | None, insecure: bool,
                   tls_server_name: str | None, proxy_url: str | None, cluster: Mapping[str, Any]) -> ExecProvider:
    api_version = str(e.get("apiVersion") or "")
    if api_version not in EXEC_API_VERSIONS:
        raise ConfigurationError(f"kubeconfig: exec apiVersion {api_version!r} is not supported "
                                 f"(supported: {', '.join(EXEC_API_VERSIONS)})")
    command = str(e.get("command") or "")
    if not command:
        raise ConfigurationError("kubeconfig: exec without command")
    # Like client-go: a relative command with a directory part is relative to the kubeconfig;
    # a bare name is looked up on $PATH.
    if os.sep in command and not os.path.isabs(command):
        command = os.path.join(base_dir, command)
    env = {}
    for item in e.get("env") or []:
        if isinstance(item, dict) and item.get("name"):
            env[str(item["name"])] = str(item.get("value", ""))
    cluster_info: dict[str, Any] | None = None
    if e.get("provideClusterInfo"):
        cluster_info = {"server": server}
        if tls_server_name:
            cluster_info["tls-server-name"] = tls_server_name
        if insecure:
            cluster_info["insecure-skip-tls-verify"] = True
        if ca:
            cluster_info["certificate-authority-data"] = base64.b64encode(ca).decode()
        if proxy_url:
            cluster_info["proxy-url"] = proxy_url
        for ext in cluster.get("extensions") or []:
            if isinstance(ext, dict) and ext.get("name") == "client.authentication.k8s.io/exec":
                cluster_info["config"] = ext.get("extension")
    return ExecProvider(command=command, args=[str(a) for a in e.get("args") or []], env=env, api_version=api_version,
                        install_hint=str(e.get("installHint") or ""), interactive_mode=str(e.get("interactiveMode") or ""),
                        cluster_info=cluster_info)
