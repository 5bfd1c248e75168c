"""RestKubeApi request formation, auth and TLS against tiny local HTTP(S) servers (no cluster needed)."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from dra_driver.k8s import credentials as kubeconfig
from dra_driver.k8s.client import CLAIMS, EVENTS, LEASES, PODS, SLICES, ApiError, Configuration, RestKubeApi
from dra_driver.k8s.credentials import ClientCert, Credentials, ExecCredential, ExecProvider
from unit_tests.kubeserver import Server


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


def test_cached_list_reads_the_watch_cache_in_one_request(srv: Server) -> None:
    srv.replies = [(200, {"metadata": {"resourceVersion": "7"}, "items": [{"metadata": {"name": "a"}}]})]
    res = srv.api.list(CLAIMS, cached=True)
    assert [i["metadata"]["name"] for i in res.items] == ["a"] and res.resource_version == "7"
    assert srv.requests[0]["path"] == "/apis/resource.k8s.io/v1/resourceclaims?resourceVersion=0"


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


def test_selectors_delete_and_node(srv: Server) -> None:
    ev = (json.dumps({"type": "ADDED", "object": {"metadata": {"name": "s"}}}) + "\n").encode()
    srv.replies = [(200, {"metadata": {"resourceVersion": "3"}, "items": []}), [ev],
                   (200, {"kind": "Status", "status": "Success"}), (200, {})]
    srv.api.list(SLICES, field_selector="spec.nodeName=n1,spec.driver=d")
    assert list(srv.api.watch(SLICES, resource_version="", timeout_seconds=5, field_selector="spec.nodeName=n1"))
    srv.api.delete(SLICES, "s-1", uid="u1", resource_version="7")
    srv.api.delete(CLAIMS, "c", namespace="ns")
    r = srv.requests
    assert r[0]["path"] == "/apis/resource.k8s.io/v1/resourceslices?limit=500&fieldSelector=spec.nodeName%3Dn1%2Cspec.driver%3Dd"
    assert "fieldSelector=spec.nodeName%3Dn1" in r[1]["path"] and "resourceVersion" not in r[1]["path"]
    assert (r[2]["method"], r[2]["path"]) == ("DELETE", "/apis/resource.k8s.io/v1/resourceslices/s-1")
    assert r[2]["body"] == {"apiVersion": "v1", "kind": "DeleteOptions",
                            "preconditions": {"uid": "u1", "resourceVersion": "7"}}
    assert r[3]["path"] == "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c"
    assert "preconditions" not in r[3]["body"]


def test_headers_and_401_refresh(tmp_path: Any) -> None:
    tok = tmp_path / "token"
    tok.write_text("old")
    s = Server(Configuration(credentials=Credentials(token_file=str(tok))), user_agent="ua/1")
    try:
        s.replies = [(200, {}), (401, {"kind": "Status", "reason": "Unauthorized", "code": 401}), (200, {"ok": 1}),
                     (401, {"kind": "Status", "reason": "Unauthorized", "code": 401}),
                     (401, {"kind": "Status", "reason": "Unauthorized", "code": 401})]
        s.api.get(PODS, "p", namespace="ns")
        tok.write_text("new")  # rotated; the cached token is still the old one
        assert s.api.get(PODS, "p", namespace="ns") == {"ok": 1}
        assert [(q["auth"], q["agent"]) for q in s.requests] == [
            ("Bearer old", "ua/1"), ("Bearer old", "ua/1"), ("Bearer new", "ua/1")]
        with pytest.raises(ApiError) as e:  # still 401 after one refresh: reported
            s.api.get(PODS, "p", namespace="ns")
        assert e.value.status == 401 and len(s.requests) == 5
    finally:
        s.httpd.shutdown()
        s.api.close()


def test_static_token_401_is_not_retried(srv: Server) -> None:
    srv.api = RestKubeApi(Configuration(host=srv.api._base, credentials=Credentials(token="t")))
    srv.replies = [(401, {"kind": "Status", "reason": "Unauthorized", "code": 401})]
    with pytest.raises(ApiError) as e:
        srv.api.get(PODS, "p", namespace="ns")
    assert e.value.status == 401 and len(srv.requests) == 1 and srv.requests[0]["auth"] == "Bearer t"


def test_credential_failure_is_an_api_error(srv: Server) -> None:
    srv.api = RestKubeApi(Configuration(host=srv.api._base, credentials=Credentials(
        exec_provider=ExecProvider(command="/nonexistent/plugin"))))
    with pytest.raises(ApiError) as e:
        srv.api.get(PODS, "p", namespace="ns")
    assert e.value.status == 0 and e.value.reason == "CredentialError" and not srv.requests


def test_concurrent_requests_share_the_pool(srv: Server) -> None:
    srv.replies = [(200, {"metadata": {"name": f"c{i}"}}) for i in range(40)]
    api = RestKubeApi(Configuration(host=srv.api._base), pool_size=4)
    with ThreadPoolExecutor(16) as ex:
        got = list(ex.map(lambda i: api.get(CLAIMS, f"c{i}", namespace="ns"), range(40)))
    assert len(got) == 40 and len(srv.requests) == 40


def test_watch_abandoned_midway_does_not_poison_the_pool(srv: Server) -> None:
    ev = lambda n: (json.dumps({"type": "ADDED", "object": {"metadata": {"name": n}}}) + "\n").encode()  # noqa: E731
    srv.replies = [[ev("a"), ev("b"), ev("c")], (200, {"metadata": {"name": "after"}})]
    api = RestKubeApi(Configuration(host=srv.api._base), pool_size=1)
    stream = api.watch(CLAIMS, resource_version="1", timeout_seconds=5)
    assert next(stream)["object"]["metadata"]["name"] == "a"
    stream.close()
    assert api.get(CLAIMS, "x", namespace="ns") == {"metadata": {"name": "after"}}


# --- TLS ------------------------------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for the name ``kubernetes`` only, and a client certificate."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    d = tmp_path_factory.mktemp("pki")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "3650", "-subj", "/CN=test-ca", cwd=d)
    for name, ext in (("server", "subjectAltName=DNS:kubernetes"), ("client", "extendedKeyUsage=clientAuth")):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}-cn", cwd=d)
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.crt", "-days", "3650", "-extfile", f"{name}.ext", cwd=d)
    return d


@pytest.fixture
def tls_server(pki: Path) -> Iterator[str]:
    """An HTTPS server that requires a client certificate and answers with its common name."""

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            peer = self.connection.getpeercert()  # type: ignore[attr-defined]
            cn = dict(x[0] for x in peer["subject"])["commonName"]
            data = json.dumps({"client": cn}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a: Any) -> None:
            return

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki / "server.crt", pki / "server.key")
    ctx.load_verify_locations(pki / "ca.crt")
    ctx.verify_mode = ssl.CERT_REQUIRED
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_tls_ca_data_server_name_and_client_cert_data(pki: Path, tls_server: str) -> None:
    cert = ClientCert(cert_pem=(pki / "client.crt").read_bytes(), key_pem=(pki / "client.key").read_bytes())
    cfg = Configuration(host=tls_server, ca_data=(pki / "ca.crt").read_bytes(), tls_server_name="kubernetes",
                        credentials=Credentials(client_cert=cert))
    assert RestKubeApi(cfg).get(PODS, "p", namespace="ns") == {"client": "client-cn"}
    # Files work too.
    cfg = Configuration(host=tls_server, ca_file=str(pki / "ca.crt"), tls_server_name="kubernetes",
                        credentials=Credentials(client_cert=ClientCert(cert_file=str(pki / "client.crt"),
                                                                       key_file=str(pki / "client.key"))))
    assert RestKubeApi(cfg).get(PODS, "p", namespace="ns") == {"client": "client-cn"}


def test_tls_verification_is_on(pki: Path, tls_server: str) -> None:
    cert = ClientCert(cert_file=str(pki / "client.crt"), key_file=str(pki / "client.key"))
    # The certificate names "kubernetes", not 127.0.0.1: without tls-server-name it must be refused.
    cfg = Configuration(host=tls_server, ca_file=str(pki / "ca.crt"), credentials=Credentials(client_cert=cert))
    with pytest.raises(ApiError) as e:
        RestKubeApi(cfg).get(PODS, "p", namespace="ns")
    assert e.value.status == 0
    # Unknown CA: refused.
    cfg = Configuration(host=tls_server, ca_file=str(pki / "client.crt"), tls_server_name="kubernetes",
                        credentials=Credentials(client_cert=cert))
    with pytest.raises(ApiError):
        RestKubeApi(cfg).get(PODS, "p", namespace="ns")
    # insecure-skip-tls-verify: accepted (the client certificate is still presented).
    cfg = Configuration(host=tls_server, verify_ssl=False, credentials=Credentials(client_cert=cert))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert RestKubeApi(cfg).get(PODS, "p", namespace="ns") == {"client": "client-cn"}


def test_exec_plugin_rotating_client_certificate(pki: Path, tls_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    issued: list[int] = []

    def fake_exec(provider: ExecProvider) -> ExecCredential:
        issued.append(1)
        cert = ClientCert(cert_pem=(pki / "client.crt").read_bytes() + b"\n" * len(issued),
                          key_pem=(pki / "client.key").read_bytes())
        return ExecCredential(token=None, client_cert=cert, expires_at=time.time() - 1)  # always expired

    monkeypatch.setattr(kubeconfig, "run_exec_provider", fake_exec)
    cfg = Configuration(host=tls_server, ca_file=str(pki / "ca.crt"), tls_server_name="kubernetes",
                        credentials=Credentials(exec_provider=ExecProvider(command="plugin")))
    api = RestKubeApi(cfg)
    for _ in range(2):  # a new certificate each time: a new pool, still accepted
        assert api.get(PODS, "p", namespace="ns") == {"client": "client-cn"}
    assert len(issued) == 2


def test_unreachable_server_gives_a_short_clear_error() -> None:
    import socket

    from dra_driver.k8s.client import Configuration

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    api = RestKubeApi(Configuration(host=f"http://127.0.0.1:{port}"), request_timeout=2)
    with pytest.raises(ApiError) as info:
        api.get(CLAIMS, "c", namespace="ns")
    text = str(info.value)
    assert info.value.status == 0
    assert text.startswith("API server not reached") and "Connection refused" in text and f"127.0.0.1:{port}" in text
    assert "HTTPConnectionPool" not in text and "Max retries" not in text
