"""Our use of the official client's loaders: kubeconfig and in-cluster credentials, exec plugins, client
certificates and rotated files, through RestKubeApi against real local HTTP(S) servers.

Everything is real: kubeconfig files, token and certificate files (made with openssl), exec plugins
as executable scripts, TLS with client-certificate checks. Nothing of the ``kubernetes`` package is
mocked.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import socket
import socketserver
import ssl
import subprocess
import sys
import textwrap
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubeserver import Server, kubeconfig_dict

from dra_driver.k8s.client import PODS, ApiError, RestKubeApi
from dra_driver.k8s.credentials import (
    Connection,
    Credentials,
    KubeconfigError,
    bypassed,
    env_proxies,
    incluster_loader,
    kubeconfig_path,
    load_credentials,
    official_loader,
    simple_incluster,
    simple_kubeconfig,
)


@pytest.fixture(autouse=True)
def _no_ambient_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT", "REQUEST_METHOD"):
        monkeypatch.delenv(var, raising=False)
    for var in [v for v in os.environ if v.lower().endswith("_proxy")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def write_kubeconfig(path: Path, server: str, user: dict[str, Any], cluster: dict[str, Any] | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(kubeconfig_dict(server, user, cluster)))
    return path


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def service_account(d: Path, pki: Path, token: str = "sa-token") -> Path:
    """``d/sa`` as the kubelet mounts a service account: ``token`` and the cluster's ``ca.crt``."""
    sa = d / "sa"
    sa.mkdir(exist_ok=True)
    (sa / "token").write_text(token)
    shutil.copy(pki / "ca.crt", sa / "ca.crt")
    return sa


# --- PKI and a TLS server ---------------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA; server certificates for the name ``kubernetes`` only and for 127.0.0.1; client certificates
    ``old-cn`` and ``new-cn``."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed for the TLS tests (README: prerequisites)")
    d = tmp_path_factory.mktemp("pki")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "3650", "-subj", "/CN=test-ca", cwd=d)
    for name, ext in (("server", "subjectAltName=DNS:kubernetes"), ("server-ip", "subjectAltName=IP:127.0.0.1"),
                      ("old", "extendedKeyUsage=clientAuth"),
                      ("new", "extendedKeyUsage=clientAuth")):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}-cn", cwd=d)
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "3650", "-extfile", f"{name}.ext", cwd=d)
    return d


@dataclass
class TlsServer:
    url: str
    seen: list[dict[str, Any]] = field(default_factory=list)
    revoked: set[str] = field(default_factory=set)
    """Client certificate CNs and Authorization headers answered with 401."""


@pytest.fixture
def tls(pki: Path) -> Iterator[TlsServer]:
    """An HTTPS server whose certificate names ``kubernetes`` only."""
    yield from _serve(pki, "server")


@pytest.fixture
def tls_ip(pki: Path) -> Iterator[TlsServer]:
    """An HTTPS server whose certificate names 127.0.0.1 (where in-cluster configuration connects)."""
    yield from _serve(pki, "server-ip")


def _serve(pki: Path, cert: str) -> Iterator[TlsServer]:
    """An HTTPS server that accepts an optional client certificate and answers with what it saw."""
    server = TlsServer("")

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            peer = self.connection.getpeercert()  # type: ignore[attr-defined]
            cn = dict(x[0] for x in peer["subject"])["commonName"] if peer else None
            auth = self.headers.get("Authorization")
            server.seen.append({"client": cn, "auth": auth})
            code = 401 if cn in server.revoked or auth in server.revoked else 200
            data = json.dumps({"client": cn, "auth": auth} if code == 200 else
                              {"kind": "Status", "reason": "Unauthorized", "code": 401}).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a: Any) -> None:
            return

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki / f"{cert}.crt", pki / f"{cert}.key")
    ctx.load_verify_locations(pki / "ca.crt")
    ctx.verify_mode = ssl.CERT_OPTIONAL
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    server.url = f"https://127.0.0.1:{httpd.server_address[1]}"
    yield server
    httpd.shutdown()


def get(api: RestKubeApi) -> Any:
    return api.get(PODS, "p", namespace="ns")


# --- exec plugins: real scripts -----------------------------------------------------------------------


def exec_plugin(tmp_path: Path, body: str) -> Path:
    """An executable exec credential plugin; ``body`` is Python that sets ``status`` (a dict) and may
    read ``count``, how many times the plugin has run (1 on the first run)."""
    script = tmp_path / "plugin.py"
    script.write_text(f"#!{sys.executable}\n" + textwrap.dedent('''
        import json, os, pathlib, sys
        here = pathlib.Path(__file__).parent
        counter = here / "runs"
        count = int(counter.read_text()) + 1 if counter.exists() else 1
        counter.write_text(str(count))
        (here / "exec-info.json").write_text(os.environ["KUBERNETES_EXEC_INFO"])
    ''') + textwrap.dedent(body) + textwrap.dedent('''
        print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", "status": status}))
    '''))
    script.chmod(0o755)
    return script


def exec_user(script: Path) -> dict[str, Any]:
    return {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(script),
                     "interactiveMode": "Never"}}


# --- loading ------------------------------------------------------------------------------------------


def test_cluster_fields_static_token_and_relative_ca(tmp_path: Path, pki: Path) -> None:
    (tmp_path / "kc").mkdir()
    shutil.copy(pki / "ca.crt", tmp_path / "kc" / "ca.crt")
    path = write_kubeconfig(tmp_path / "kc" / "config", "https://api.example:6443/", {"token": "t0k"},
                            {"certificate-authority": "ca.crt", "tls-server-name": "kubernetes",
                             "proxy-url": "http://proxy.example:3128"})
    conn, authorization = load_credentials(str(path)).connection()
    assert conn.host == "https://api.example:6443"
    assert conn.ca_file == str(tmp_path / "kc" / "ca.crt")  # relative to the kubeconfig
    assert conn.verify_ssl and conn.tls_server_name == "kubernetes" and conn.proxy_url == "http://proxy.example:3128"
    assert authorization == "Bearer t0k" and conn.cert_file is None


def test_basic_auth_and_insecure(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "config", "https://api.example", {"username": "u", "password": "p"},
                            {"insecure-skip-tls-verify": True})
    conn, authorization = load_credentials(str(path)).connection()
    assert authorization == "Basic " + b64(b"u:p") and not conn.verify_ssl


def test_where_the_configuration_comes_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pki: Path) -> None:
    home = write_kubeconfig(tmp_path / "home" / ".kube" / "config", "https://home", {})
    assert load_credentials(None).host == "https://home"
    assert load_credentials(None).source == f"kubeconfig {home}"
    # $KUBECONFIG, a list merged the kubectl way: the first definition of a name wins.
    first = write_kubeconfig(tmp_path / "a", "https://first", {"token": "one"})
    second = write_kubeconfig(tmp_path / "b", "https://second", {"token": "two"})
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}{os.pathsep}{first}{os.pathsep}{second}")
    conn, authorization = load_credentials(None).connection()
    assert (conn.host, authorization) == ("https://first", "Bearer one")
    assert load_credentials(str(second)).host == "https://second"  # --kubeconfig beats $KUBECONFIG
    # The in-cluster service account itself (kubeconfig_path picks it only when no file is found).
    monkeypatch.delenv("KUBECONFIG")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    sa = service_account(tmp_path, pki)
    creds = Credentials(incluster_loader(str(sa)), "in-cluster")
    assert creds.host == "https://[fd00::1]:443"
    conn, authorization = creds.connection()
    assert authorization == "bearer sa-token" and conn.ca_file == str(sa / "ca.crt")


def test_the_lookup_order_is_client_gos(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """clientcmd's default loading rules, then its deferred loader's in-cluster fallback: --kubeconfig,
    else $KUBECONFIG's files, else ~/.kube/config; the service account only when no file is there."""
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("t")
    pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    home = write_kubeconfig(tmp_path / "home" / ".kube" / "config", "https://home", {})
    flag = write_kubeconfig(tmp_path / "flag", "https://flag", {})
    listed = f"{tmp_path / 'gone'}{os.pathsep}{flag}"
    assert kubeconfig_path(str(flag), {"KUBECONFIG": str(home), **pod}, str(sa)) == str(flag)
    assert kubeconfig_path(None, {"KUBECONFIG": listed, **pod}, str(sa)) == listed
    assert kubeconfig_path(None, pod, str(sa)) == str(home)  # ~/.kube/config before the service account
    home.unlink()
    assert kubeconfig_path(None, pod, str(sa)) is None
    assert kubeconfig_path(None, {"KUBECONFIG": str(tmp_path / "gone"), **pod}, str(sa)) is None
    with pytest.raises(KubeconfigError, match=r"kubeconfig .*gone \(\$KUBECONFIG\) does not exist, and not running"):
        kubeconfig_path(None, {"KUBECONFIG": str(tmp_path / "gone")}, str(sa))
    # client-go's in-cluster test: host, port and the token file.
    assert kubeconfig_path(None, pod, str(sa)) is None
    for partial_pod in ({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, {"KUBERNETES_SERVICE_PORT": "443"}):
        with pytest.raises(KubeconfigError, match="no kubeconfig"):
            kubeconfig_path(None, partial_pod, str(sa))
    with pytest.raises(KubeconfigError, match="no kubeconfig"):
        kubeconfig_path(None, pod, str(tmp_path / "no-sa"))
    with pytest.raises(KubeconfigError, match=r"kubeconfig .*gone does not exist"):
        kubeconfig_path(str(tmp_path / "gone"), pod, str(sa))  # --kubeconfig must exist, as in client-go


def test_errors_name_the_problem_and_the_file(tmp_path: Path) -> None:
    with pytest.raises(KubeconfigError, match=r"kubeconfig .*nope does not exist"):
        load_credentials(str(tmp_path / "nope"))
    with pytest.raises(KubeconfigError, match="no kubeconfig"):
        load_credentials(None)
    bad = tmp_path / "bad"
    bad.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "clusters": [], "users": [], "contexts": []}))
    with pytest.raises(KubeconfigError, match=rf"from kubeconfig {bad}: .*current-context"):
        load_credentials(str(bad))
    missing_cert = write_kubeconfig(tmp_path / "mc", "https://x", {"client-certificate": "gone.crt",
                                                                   "client-key": "gone.key"})
    with pytest.raises(KubeconfigError, match=r"gone\.crt"):
        load_credentials(str(missing_cert))
    sa = tmp_path / "sa"
    sa.mkdir()
    with pytest.raises(KubeconfigError, match=r"in-cluster: .*host/port"):
        Credentials(incluster_loader(str(sa)), "in-cluster")


def test_failing_exec_plugin_is_a_clear_error(tmp_path: Path) -> None:
    script = exec_plugin(tmp_path, 'sys.stderr.write("token service says no\\n"); sys.exit(3)\n')
    path = write_kubeconfig(tmp_path / "config", "https://x", exec_user(script))
    with pytest.raises(KubeconfigError, match=rf"from kubeconfig {path}: no credentials: .*returned 3.*token service says no"):
        load_credentials(str(path))


# --- rotation and the 401 reload ------------------------------------------------------------------------


def test_token_file_rotation_is_picked_up_on_401(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("old")
    s = Server({"tokenFile": str(token)}, user_agent="ua/1")
    try:
        unauthorized = (401, {"kind": "Status", "reason": "Unauthorized", "code": 401})
        s.replies = [(200, {}), unauthorized, (200, {"ok": 1}), unauthorized, unauthorized]
        get(s.api)
        token.write_text("new")  # rotated; the loaded token is still the old one
        assert get(s.api) == {"ok": 1}
        assert [(q["auth"], q["agent"]) for q in s.requests] == [
            ("Bearer old", "ua/1"), ("Bearer old", "ua/1"), ("Bearer new", "ua/1")]
        with pytest.raises(ApiError) as e:  # still 401 after one reload: reported
            get(s.api)
        assert e.value.status == 401 and len(s.requests) == 5
    finally:
        s.httpd.shutdown()
        s.api.close()


def test_in_cluster_token_rotation(tmp_path: Path, pki: Path, tls_ip: TlsServer, monkeypatch: pytest.MonkeyPatch) -> None:
    tls = tls_ip
    host, port = tls.url.removeprefix("https://").split(":")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    sa = service_account(tmp_path, pki, "old")
    api = RestKubeApi(Credentials(incluster_loader(str(sa)), "in-cluster"))
    assert get(api)["auth"] == "bearer old"
    tls.revoked.add("bearer old")
    (sa / "token").write_text("new")  # the kubelet rotated the projected token
    assert get(api)["auth"] == "bearer new"
    assert [s["auth"] for s in tls.seen] == ["bearer old", "bearer old", "bearer new"]


def test_exec_plugin_runs_again_on_401(tmp_path: Path) -> None:
    script = exec_plugin(tmp_path, 'status = {"token": f"tok-{count}", "expirationTimestamp": "2999-01-01T00:00:00Z"}\n')
    path = write_kubeconfig(tmp_path / "config", "http://127.0.0.1:1", exec_user(script))
    s = Server()
    try:
        s.api = RestKubeApi(_retarget(path, s.host))
        s.replies = [(200, {}), (200, {}), (401, {"kind": "Status", "code": 401}), (200, {"ok": 1})]
        get(s.api)
        get(s.api)  # cached until it expires: the plugin ran once
        assert get(s.api) == {"ok": 1}  # the 401 ran it again
        assert [q["auth"] for q in s.requests] == ["Bearer tok-1", "Bearer tok-1", "Bearer tok-1", "Bearer tok-2"]
        info = json.loads((tmp_path / "exec-info.json").read_text())
        assert info["apiVersion"] == "client.authentication.k8s.io/v1" and info["kind"] == "ExecCredential"
    finally:
        s.httpd.shutdown()


def _retarget(path: Path, server: str) -> Credentials:
    doc = yaml.safe_load(path.read_text())
    doc["clusters"][0]["cluster"]["server"] = server
    path.write_text(yaml.safe_dump(doc))
    return load_credentials(str(path))


def test_exec_plugin_expired_credential_is_renewed_before_the_request(tmp_path: Path) -> None:
    script = exec_plugin(tmp_path, 'status = {"token": f"tok-{count}", "expirationTimestamp": "2000-01-01T00:00:00Z"}\n')
    s = Server()
    try:
        s.api = RestKubeApi(_retarget(write_kubeconfig(tmp_path / "config", "", exec_user(script)), s.host))
        s.replies = [(200, {}), (200, {})]
        get(s.api)
        get(s.api)
        # Loading ran it once (tok-1); it had expired, so each request ran it again.
        assert [q["auth"] for q in s.requests] == ["Bearer tok-2", "Bearer tok-3"]
    finally:
        s.httpd.shutdown()


def test_exec_plugin_client_certificate_rotation(tmp_path: Path, pki: Path, tls: TlsServer) -> None:
    current = tmp_path / "current"
    current.write_text("old")
    script = exec_plugin(tmp_path, f'''
        name = pathlib.Path({str(current)!r}).read_text()
        pki = pathlib.Path({str(pki)!r})
        status = {{"clientCertificateData": (pki / f"{{name}}.crt").read_text(),
                   "clientKeyData": (pki / f"{{name}}.key").read_text()}}
    ''')
    path = write_kubeconfig(tmp_path / "config", tls.url, exec_user(script),
                            {"certificate-authority-data": b64((pki / "ca.crt").read_bytes()),
                             "tls-server-name": "kubernetes"})
    api = RestKubeApi(load_credentials(str(path)))
    assert get(api)["client"] == "old-cn"
    tls.revoked.add("old-cn")
    current.write_text("new")
    assert get(api)["client"] == "new-cn"  # 401, the plugin ran again, new TLS connections
    assert [s["client"] for s in tls.seen] == ["old-cn", "old-cn", "new-cn"]


def test_client_certificate_files_rotated_in_place(tmp_path: Path, pki: Path, tls: TlsServer) -> None:
    # Like the kubelet's kubelet-client-current.pem: the same paths, new content.
    shutil.copy(pki / "old.crt", tmp_path / "client.crt")
    shutil.copy(pki / "old.key", tmp_path / "client.key")
    path = write_kubeconfig(tmp_path / "config", tls.url, {"client-certificate": "client.crt", "client-key": "client.key"},
                            {"certificate-authority": str(pki / "ca.crt"), "tls-server-name": "kubernetes"})
    api = RestKubeApi(load_credentials(str(path)))
    assert get(api)["client"] == "old-cn"
    tls.revoked.add("old-cn")
    shutil.copy(pki / "new.crt", tmp_path / "client.crt")
    shutil.copy(pki / "new.key", tmp_path / "client.key")
    assert get(api)["client"] == "new-cn"
    with pytest.raises(ApiError) as e:  # revoked and not rotated: one reload, then the 401 is reported
        tls.revoked.add("new-cn")
        get(api)
    assert e.value.status == 401


def test_tls_verification_is_on(tmp_path: Path, pki: Path, tls: TlsServer) -> None:
    client = {"client-certificate": str(pki / "new.crt"), "client-key": str(pki / "new.key")}

    def api(cluster: dict[str, Any]) -> RestKubeApi:
        return RestKubeApi(load_credentials(str(write_kubeconfig(tmp_path / "config", tls.url, client, cluster))))

    assert get(api({"certificate-authority": str(pki / "ca.crt"), "tls-server-name": "kubernetes"}))["client"] == "new-cn"
    # The certificate names "kubernetes", not 127.0.0.1: without tls-server-name it is refused.
    with pytest.raises(ApiError) as e:
        get(api({"certificate-authority": str(pki / "ca.crt")}))
    assert e.value.status == 0
    # Unknown CA: refused.
    with pytest.raises(ApiError) as e:
        get(api({"certificate-authority": str(pki / "new.crt"), "tls-server-name": "kubernetes"}))
    assert e.value.status == 0
    # insecure-skip-tls-verify: accepted, and the client certificate is still presented.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert get(api({"insecure-skip-tls-verify": True}))["client"] == "new-cn"


def test_credentials_that_fail_at_request_time_are_an_api_error(tmp_path: Path) -> None:
    script = exec_plugin(tmp_path, '''
        if count > 1:
            sys.stderr.write("refresh token expired\\n"); sys.exit(1)
        status = {"token": "first"}
    ''')
    s = Server()
    try:
        s.api = RestKubeApi(_retarget(write_kubeconfig(tmp_path / "config", "", exec_user(script)), s.host))
        s.replies = [(401, {"kind": "Status", "code": 401})]
        with pytest.raises(ApiError) as e:
            get(s.api)
        assert e.value.status == 0 and e.value.reason == "CredentialError"
        assert "refresh token expired" in e.value.message and len(s.requests) == 1
    finally:
        s.httpd.shutdown()


# --- the native reading of the common shapes: the official loaders' results, without them ------------------


def _official_kubeconfig(path: Path, context: str | None = None) -> Connection:
    from kubernetes.config import load_kube_config

    return official_loader(lambda cfg: load_kube_config(config_file=str(path), context=context,
                                                        client_configuration=cfg, persist_config=False))()


def _same(native: Connection | None, official: Connection) -> None:
    assert native is not None, "this shape is read natively"

    def content(path: str | None) -> bytes | None:  # *-data files have different temporary names
        return Path(path).read_bytes() if path else None

    assert (native.host, native.verify_ssl, native.tls_server_name, native.proxy_url, native.authorization()) == (
        official.host, official.verify_ssl, official.tls_server_name, official.proxy_url, official.authorization())
    for field_ in ("ca_file", "cert_file", "key_file"):
        assert content(getattr(native, field_)) == content(getattr(official, field_)), field_


def _shapes(pki: Path, d: Path) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Name -> (cluster fields beside the server, user); the server is https unless the name says http."""
    (d / "tok").write_text("file-token\n")
    for f in ("ca.crt", "old.crt", "old.key"):
        shutil.copy(pki / f, d / f)
    data = {f: b64((pki / f).read_bytes()) for f in ("ca.crt", "old.crt", "old.key")}
    return {
        "token and a relative CA file (kind, the test bed)": ({"certificate-authority": "ca.crt"}, {"token": "t0k"}),
        "CA and client certificate as data (kubeadm)": (
            {"certificate-authority-data": data["ca.crt"]},
            {"client-certificate-data": data["old.crt"], "client-key-data": data["old.key"]}),
        "client certificate files and a token file": (
            {"certificate-authority": str(d / "ca.crt")},
            {"client-certificate": "old.crt", "client-key": "old.key", "tokenFile": "tok"}),
        "token beats token file; insecure; server name": (
            {"insecure-skip-tls-verify": True, "tls-server-name": "kubernetes"}, {"token": "t", "tokenFile": "tok"}),
        "empty token": ({"certificate-authority": "ca.crt"}, {"token": ""}),
        "no user credentials": ({"certificate-authority": "ca.crt"}, {}),
        "http: no TLS files read": ({"certificate-authority": "gone.crt"}, {"token": "t"}),
    }


def test_common_kubeconfigs_read_natively_as_the_official_loader_reads_them(tmp_path: Path, pki: Path) -> None:
    for i, (name, (cluster, user)) in enumerate(_shapes(pki, tmp_path).items()):
        server = "http://api.example:8080" if name.startswith("http:") else "https://api.example:6443/"
        path = write_kubeconfig(tmp_path / f"config-{i}", server, user, cluster)
        _same(simple_kubeconfig(str(path)), _official_kubeconfig(path))


def test_a_named_context(tmp_path: Path) -> None:
    doc = kubeconfig_dict("https://one", {"token": "one"}, {"insecure-skip-tls-verify": True})
    doc["clusters"].append({"name": "c2", "cluster": {"server": "https://two", "insecure-skip-tls-verify": True}})
    doc["users"].append({"name": "u2", "user": {"token": "two"}})
    doc["contexts"].append({"name": "other", "context": {"cluster": "c2", "user": "u2", "namespace": "x"}})
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(doc))
    _same(simple_kubeconfig(str(path), "other"), _official_kubeconfig(path, "other"))
    assert simple_kubeconfig(str(path), "other").authorization() == "Bearer two"  # type: ignore[union-attr]


@pytest.mark.parametrize("shape", ["exec", "basic auth", "proxy-url", "list of files", "missing CA", "unknown user field",
                                   "unknown context"])
def test_everything_else_goes_to_the_official_loader(shape: str, tmp_path: Path) -> None:
    user: dict[str, Any] = {"token": "t"}
    cluster: dict[str, Any] = {"insecure-skip-tls-verify": True}
    path = str(tmp_path / "config")
    if shape == "exec":
        user = exec_user(tmp_path / "plugin")
    elif shape == "basic auth":
        user = {"username": "u", "password": "p"}
    elif shape == "proxy-url":
        cluster["proxy-url"] = "http://proxy.example:3128"
    elif shape == "list of files":
        path = f"{path}{os.pathsep}{tmp_path / 'other'}"
    elif shape == "missing CA":
        cluster = {"certificate-authority": "gone.crt"}
    elif shape == "unknown user field":
        user["as"] = "someone-else"
    write_kubeconfig(tmp_path / "config", "https://api.example", user, cluster)
    assert simple_kubeconfig(path, "nope" if shape == "unknown context" else None) is None


def _same_in_cluster(sa: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The native and the official reading of ``sa`` agree, for an IPv4 and an IPv6 service address."""
    from kubernetes.config.incluster_config import InClusterConfigLoader

    token, ca = str(sa / "token"), str(sa / "ca.crt")
    for host in ("10.96.0.1", "fd00::1"):
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
        official = official_loader(lambda cfg: InClusterConfigLoader(token_filename=token, cert_filename=ca)
                                   .load_and_set(cfg))()
        _same(simple_incluster(token, ca), official)


def test_in_cluster_read_natively_as_the_official_loader_reads_it(tmp_path: Path, pki: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    sa = service_account(tmp_path, pki, "sa-token\n")
    _same_in_cluster(sa, monkeypatch)
    (sa / "token").write_text("")
    assert simple_incluster(str(sa / "token"), str(sa / "ca.crt")) is None  # the official loader says what is wrong


def test_the_plugin_with_a_common_kubeconfig_never_imports_kubernetes(tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "config", "https://api.example", {"token": "t"}, {"insecure-skip-tls-verify": True})
    code = (f"import sys\nfrom dra_driver.node.plugin import api_client\napi = api_client({str(path)!r})\n"
            "api._credentials.connection()\nprint(sorted(m for m in sys.modules if m.split('.')[0] == 'kubernetes'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"


# --- proxies from the environment, decided without the official loader --------------------------------------


@pytest.mark.parametrize("env", [
    {"HTTPS_PROXY": "http://upper:1"},
    {"HTTPS_PROXY": "http://upper:1", "https_proxy": "http://lower:2"},
    {"HTTPS_PROXY": "http://upper:1", "https_proxy": ""},
    {"Https_Proxy": "http://mixed:3", "NO_PROXY": "10.0.0.0/8", "no_proxy": ".svc"},
    {"HTTP_PROXY": "http://h:4", "http_proxy": "", "ALL_PROXY": "socks5://a:5"},
    {"HTTP_PROXY": "http://h:4", "REQUEST_METHOD": "GET"},
    {"http_proxy": "http://h:4", "REQUEST_METHOD": "GET"},
    {"_proxy": "x", "PROXY": "y", "NO_PROXY": ""},
])
def test_proxy_variables_are_read_as_urllib_reads_them(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from urllib.request import getproxies_environment  # what the official loader's Configuration calls

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert env_proxies(os.environ) == getproxies_environment()


def test_no_proxy_rules_are_the_official_clients() -> None:
    from kubernetes.client.rest import should_bypass_proxies

    urls = ["https://10.96.0.1:443", "https://[fd00::1]:443", "https://api.example.com:6443", "http://localhost:8080",
            "https://kubernetes.default.svc"]
    rules = ["", "*", " , ", "10.0.0.0/8", "10.96.0.1", "10.96.0.1/33", "fd00::/8", "example.com", ".example.com",
             "EXAMPLE.COM", "xample.com", "api.example.com:6443", "api.example.com:443", "localhost", "svc",
             "other.org, 10.96.0.0/12", "[fd00::1]:443", "kubernetes.default.svc.cluster.local"]
    for url in urls:
        for rule in rules:
            assert bypassed(url, rule) == should_bypass_proxies(url, rule), (url, rule)
    assert bypassed("https://10.96.0.1:443", "10.0.0.0/8") and bypassed("https://[fd00::1]:443", "fd00::/8")
    assert bypassed("https://api.example.com:6443", ".example.com") and not bypassed("https://api.example.com", "xample.com")
    assert not bypassed("https://api.example.com:6443", "api.example.com:443")


PROXY_ENVS = [
    {"NO_PROXY": "10.0.0.0/8"},
    {"HTTPS_PROXY": "http://proxy.example:3128"},
    {"HTTPS_PROXY": "http://proxy.example:3128", "NO_PROXY": "10.96.0.0/12,.example"},
    {"https_proxy": "http://lower.example:1", "HTTPS_PROXY": "http://upper.example:2", "no_proxy": "fd00::1"},
    {"ALL_PROXY": "http://all.example:3"},
    {"HTTP_PROXY": "http://plain.example:4"},
    {"HTTPS_PROXY": "http://proxy.example:3128", "no_proxy": "*"},
]


@pytest.mark.parametrize("env", PROXY_ENVS)
def test_proxy_variables_decided_natively_as_the_official_loader_decides(
        env: dict[str, str], tmp_path: Path, pki: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    _same_in_cluster(service_account(tmp_path, pki), monkeypatch)
    for server in ("https://api.example:6443", "http://api.example:8080"):
        path = write_kubeconfig(tmp_path / "config", server, {"token": "t"}, {"insecure-skip-tls-verify": True})
        _same(simple_kubeconfig(str(path)), _official_kubeconfig(path))


def _plugin_process(tmp_path: Path, pki: Path, how: str, env: dict[str, str]) -> list[str]:
    """In a fresh interpreter, the plugin's credentials (in-cluster or a kubeconfig) loaded and used for a
    connection: the proxy it decided, then every ``kubernetes`` module loaded."""
    sa = service_account(tmp_path, pki)
    kubeconfig = write_kubeconfig(tmp_path / "config", "https://10.96.0.1", {"token": "t"},
                                  {"insecure-skip-tls-verify": True})
    load = (f"Credentials(incluster_loader({str(sa)!r}), 'in-cluster')" if how == "in-cluster" else
            f"load_credentials({str(kubeconfig)!r})")
    code = ("import sys\nfrom dra_driver.k8s.credentials import Credentials, incluster_loader, load_credentials\n"
            f"conn, _ = {load}.connection()\nprint(conn.proxy_url)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'kubernetes'))")
    env = {**os.environ, "KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443", **env}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                         cwd=Path(__file__).resolve().parents[2], env=env)
    return out.stdout.split("\n")[:2]


@pytest.mark.parametrize("how", ["in-cluster", "kubeconfig"])
def test_a_proxy_variable_does_not_load_the_official_loader(how: str, tmp_path: Path, pki: Path) -> None:
    # It did: any *_proxy variable, NO_PROXY alone included, cost the plugin ~18 MiB of the official client.
    assert _plugin_process(tmp_path, pki, how, {"NO_PROXY": "10.0.0.0/8"}) == ["None", "[]"]
    assert _plugin_process(tmp_path, pki, how, {"HTTPS_PROXY": "http://proxy.example:3128"}) == [
        "http://proxy.example:3128", "[]"]
    assert _plugin_process(tmp_path, pki, how, {"HTTPS_PROXY": "http://proxy.example:3128",
                                                "no_proxy": "10.96.0.0/12"}) == ["None", "[]"]


class ConnectProxy:
    """A loopback HTTP proxy that tunnels (CONNECT) and does nothing else; ``targets`` is what it was asked."""

    def __init__(self) -> None:
        self.targets: list[str] = []
        outer = self

        class Tunnel(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                head = b""
                while b"\r\n\r\n" not in head:
                    chunk = self.request.recv(4096)
                    if not chunk:
                        return
                    head += chunk
                method, target = head.split(b"\r\n", 1)[0].decode().split(" ")[:2]
                outer.targets.append(f"{method} {target}")
                if method != "CONNECT":
                    self.request.sendall(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
                    return
                host, port = target.rsplit(":", 1)
                with socket.create_connection((host.strip("[]"), int(port)), timeout=10) as upstream:
                    self.request.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    _pipe(self.request, upstream)

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Tunnel)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _pipe(a: socket.socket, b: socket.socket) -> None:
    while True:
        ready, _, _ = select.select([a, b], [], [], 10)
        if not ready:
            return
        for sock in ready:
            data = sock.recv(65536)
            if not data:
                return
            (b if sock is a else a).sendall(data)


@pytest.fixture
def proxy() -> Iterator[ConnectProxy]:
    p = ConnectProxy()
    yield p
    p.close()


def test_in_cluster_through_a_proxy_and_past_it(tmp_path: Path, pki: Path, tls_ip: TlsServer, proxy: ConnectProxy,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    sa = service_account(tmp_path, pki)
    port = tls_ip.url.rsplit(":", 1)[1]
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    monkeypatch.setenv("NO_PROXY", "10.0.0.0/8,.cluster.local")  # not this server
    api = RestKubeApi(Credentials(incluster_loader(str(sa)), "in-cluster"))
    assert get(api) == {"client": None, "auth": "bearer sa-token"}, "TLS to the server, through the tunnel"
    assert proxy.targets == [f"CONNECT 127.0.0.1:{port}"]
    api.close()
    monkeypatch.setenv("NO_PROXY", "10.0.0.0/8,127.0.0.0/8")
    api = RestKubeApi(Credentials(incluster_loader(str(sa)), "in-cluster"))
    assert get(api) == {"client": None, "auth": "bearer sa-token"}
    assert proxy.targets == [f"CONNECT 127.0.0.1:{port}"], "NO_PROXY names the server: straight there"
    assert len(tls_ip.seen) == 2
    api.close()
