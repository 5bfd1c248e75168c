"""Cluster configuration without the official client: kubeconfig, exec plugins, in-cluster."""

from __future__ import annotations

import base64
import json
import os
import stat
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_driver.k8s import credentials as kc
from dra_driver.k8s.credentials import ClientCert, ConfigurationError, CredentialError, load_configuration


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def write_config(path: Path, *, clusters: list[Any], users: list[Any], contexts: list[Any],
                 current: str | None = "ctx") -> Path:
    doc: dict[str, Any] = {"apiVersion": "v1", "kind": "Config", "clusters": clusters, "users": users,
                           "contexts": contexts}
    if current is not None:
        doc["current-context"] = current
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


def simple(path: Path, cluster: dict[str, Any], user: dict[str, Any]) -> Path:
    return write_config(path, clusters=[{"name": "c", "cluster": cluster}], users=[{"name": "u", "user": user}],
                        contexts=[{"name": "ctx", "context": {"cluster": "c", "user": "u"}}])


@pytest.fixture(autouse=True)
def _no_ambient_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def test_cluster_and_static_token(tmp_path: Path) -> None:
    ca = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    path = simple(tmp_path / "kc", {"server": "https://api.example:6443/", "certificate-authority-data": b64(ca),
                                    "tls-server-name": "kubernetes", "proxy-url": "http://proxy:3128"},
                  {"token": "t0k"})
    cfg = load_configuration(str(path))
    assert cfg.host == "https://api.example:6443" and cfg.ca_data == ca and cfg.ca_file is None
    assert cfg.verify_ssl and cfg.tls_server_name == "kubernetes" and cfg.proxy_url == "http://proxy:3128"
    assert cfg.credentials.current() == ({"Authorization": "Bearer t0k"}, None)
    assert not cfg.credentials.refreshable


def test_relative_paths_client_cert_and_insecure(tmp_path: Path) -> None:
    path = simple(tmp_path / "conf" / "kc",
                  {"server": "https://1.2.3.4", "certificate-authority": "pki/ca.crt", "insecure-skip-tls-verify": True},
                  {"client-certificate": "pki/me.crt", "client-key": "/abs/me.key"})
    cfg = load_configuration(str(path))
    conf = str(tmp_path / "conf")
    assert cfg.ca_file == f"{conf}/pki/ca.crt" and not cfg.verify_ssl
    assert cfg.credentials.current() == ({}, ClientCert(cert_file=f"{conf}/pki/me.crt", key_file="/abs/me.key"))


def test_client_cert_data_and_basic_auth(tmp_path: Path) -> None:
    path = simple(tmp_path / "kc", {"server": "https://h"},
                  {"client-certificate-data": b64(b"CERT"), "client-key-data": b64(b"KEY"),
                   "username": "admin", "password": "s3cret"})
    headers, cert = load_configuration(str(path)).credentials.current()
    assert cert == ClientCert(cert_pem=b"CERT", key_pem=b"KEY")
    assert headers == {"Authorization": "Basic " + b64(b"admin:s3cret")}


def test_token_file_is_reread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tok").write_text("one\n")
    path = simple(tmp_path / "kc", {"server": "https://h"}, {"tokenFile": "tok"})
    creds = load_configuration(str(path)).credentials
    assert creds.refreshable and creds.current()[0] == {"Authorization": "Bearer one"}
    (tmp_path / "tok").write_text("two\n")
    assert creds.current()[0] == {"Authorization": "Bearer one"}  # cached for TOKEN_FILE_REFRESH
    creds.invalidate()
    assert creds.current()[0] == {"Authorization": "Bearer two"}
    monkeypatch.setattr(kc, "TOKEN_FILE_REFRESH", 0.0)
    (tmp_path / "tok").write_text("three\n")
    assert creds.current()[0] == {"Authorization": "Bearer three"}
    (tmp_path / "tok").unlink()  # mid-rotation: the last token is kept
    assert creds.current()[0] == {"Authorization": "Bearer three"}


def test_kubeconfig_list_merges_first_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = write_config(tmp_path / "a" / "kc", clusters=[{"name": "c", "cluster": {"server": "https://a"}}],
                     users=[], contexts=[{"name": "ctx", "context": {"cluster": "c", "user": "u"}}])
    b = write_config(tmp_path / "b" / "kc", current="other",
                     clusters=[{"name": "c", "cluster": {"server": "https://b"}}],
                     users=[{"name": "u", "user": {"tokenFile": "tok"}}],
                     contexts=[{"name": "ctx", "context": {"cluster": "c", "user": "nobody"}}])
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(tmp_path / "missing"), str(a), str(b)]))
    cfg = load_configuration(None)
    assert cfg.host == "https://a"  # a's cluster and context, a's current-context
    assert cfg.credentials.token_file == str(tmp_path / "b" / "tok")  # relative to the file that defines it


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="does not exist"):
        load_configuration(str(tmp_path / "nope"))
    with pytest.raises(ConfigurationError, match="no kubeconfig"):
        load_configuration(None)
    no_ctx = write_config(tmp_path / "kc1", clusters=[], users=[], contexts=[], current=None)
    with pytest.raises(ConfigurationError, match="no current-context"):
        load_configuration(str(no_ctx))
    provider = simple(tmp_path / "kc2", {"server": "https://h"}, {"auth-provider": {"name": "gcp"}})
    with pytest.raises(ConfigurationError, match="auth-provider 'gcp'"):
        load_configuration(str(provider))
    half = simple(tmp_path / "kc3", {"server": "https://h"}, {"client-certificate-data": b64(b"C")})
    with pytest.raises(ConfigurationError, match="go together"):
        load_configuration(str(half))
    old_exec = simple(tmp_path / "kc4", {"server": "https://h"},
                      {"exec": {"apiVersion": "client.authentication.k8s.io/v1alpha1", "command": "x"}})
    with pytest.raises(ConfigurationError, match="v1alpha1"):
        load_configuration(str(old_exec))
    (tmp_path / "kc5").write_text("{not: [yaml")
    with pytest.raises(ConfigurationError, match="cannot load"):
        load_configuration(str(tmp_path / "kc5"))


def test_default_kubeconfig(tmp_path: Path) -> None:
    simple(tmp_path / "home" / ".kube" / "config", {"server": "https://home"}, {})
    assert load_configuration(None).host == "https://home"


def test_in_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("projected-1")
    (sa / "ca.crt").write_text("CA")
    monkeypatch.setattr(kc, "SERVICE_ACCOUNT_DIR", str(sa))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(ConfigurationError, match="does not exist"):
        kc.load_incluster(str(tmp_path / "elsewhere"))
    cfg = kc.load_incluster(str(sa))
    assert cfg.host == "https://[fd00::1]:443" and cfg.ca_file == str(sa / "ca.crt")
    assert cfg.credentials.current()[0] == {"Authorization": "Bearer projected-1"}
    (sa / "token").write_text("projected-2")  # the kubelet rotates projected tokens
    monkeypatch.setattr(kc, "TOKEN_FILE_REFRESH", 0.0)
    assert cfg.credentials.current()[0] == {"Authorization": "Bearer projected-2"}
    # Without --kubeconfig or $KUBECONFIG, the service account (even when ~/.kube/config exists).
    simple(tmp_path / "home" / ".kube" / "config", {"server": "https://home"}, {})
    assert load_configuration(None).host == "https://[fd00::1]:443"
    explicit = simple(tmp_path / "kc", {"server": "https://explicit"}, {})
    assert load_configuration(str(explicit)).host == "https://explicit"


# --- exec credential plugins ----------------------------------------------------------------------


PLUGIN = textwrap.dedent("""\
    #!{python}
    import json, os, sys
    info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
    count_file = os.environ["COUNT_FILE"]
    n = int(open(count_file).read() or 0) + 1 if os.path.exists(count_file) else 1
    open(count_file, "w").write(str(n))
    open(count_file + ".info", "w").write(json.dumps({{"info": info, "args": sys.argv[1:]}}))
    status = json.loads(os.environ["STATUS"])
    if "token" in status:
        status["token"] = status["token"] + "-" + str(n)
    print(json.dumps({{"apiVersion": os.environ.get("ANSWER_VERSION", info["apiVersion"]),
                      "kind": "ExecCredential", "status": status}}))
    sys.exit(int(os.environ.get("EXIT", "0")))
""")


def exec_config(tmp_path: Path, status: dict[str, Any], *, api_version: str = "client.authentication.k8s.io/v1",
                env: dict[str, str] | None = None, cluster_extra: dict[str, Any] | None = None) -> tuple[Path, Path]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    plugin = bindir / "cred-plugin"
    plugin.write_text(PLUGIN.format(python=sys.executable))
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    count = tmp_path / "count"
    all_env = {"COUNT_FILE": str(count), "STATUS": json.dumps(status), **(env or {})}
    cluster = {"server": "https://eks.example", "certificate-authority-data": b64(b"CA-PEM"),
               "extensions": [{"name": "client.authentication.k8s.io/exec", "extension": {"region": "r1"}}],
               **(cluster_extra or {})}
    path = simple(tmp_path / "kc", cluster, {"exec": {
        "apiVersion": api_version, "command": "./bin/cred-plugin", "args": ["token", "-c", "x"],
        "env": [{"name": k, "value": v} for k, v in all_env.items()], "provideClusterInfo": True,
        "interactiveMode": "Never"}})
    return path, count


def test_exec_plugin_token_cached_until_expiry(tmp_path: Path) -> None:
    future = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
    path, count = exec_config(tmp_path, {"token": "tok", "expirationTimestamp": future},
                              api_version="client.authentication.k8s.io/v1beta1")
    creds = load_configuration(str(path)).credentials
    assert creds.refreshable
    assert creds.current() == ({"Authorization": "Bearer tok-1"}, None)
    assert creds.current() == ({"Authorization": "Bearer tok-1"}, None)
    assert count.read_text() == "1"  # ran once: the credential is still valid
    seen = json.loads(Path(f"{count}.info").read_text())
    assert seen["args"] == ["token", "-c", "x"]
    assert seen["info"] == {"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",
                            "spec": {"interactive": False, "cluster": {
                                "server": "https://eks.example", "certificate-authority-data": b64(b"CA-PEM"),
                                "config": {"region": "r1"}}}}
    creds.invalidate()  # what a 401 does
    assert creds.current()[0] == {"Authorization": "Bearer tok-2"}


def test_exec_plugin_expired_credential_is_renewed(tmp_path: Path) -> None:
    soon = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 5))  # inside the renewal margin
    path, count = exec_config(tmp_path, {"token": "tok", "expirationTimestamp": soon})
    creds = load_configuration(str(path)).credentials
    assert creds.current()[0] == {"Authorization": "Bearer tok-1"}
    assert creds.current()[0] == {"Authorization": "Bearer tok-2"}
    assert count.read_text() == "2"


def test_exec_plugin_client_certificate(tmp_path: Path) -> None:
    path, _ = exec_config(tmp_path, {"clientCertificateData": "CERT", "clientKeyData": "KEY"})
    assert load_configuration(str(path)).credentials.current() == ({}, ClientCert(cert_pem=b"CERT", key_pem=b"KEY"))


@pytest.mark.parametrize(("status", "env", "match"), [
    ({"token": "t"}, {"EXIT": "3"}, "exited with 3"),
    ({"token": "t"}, {"ANSWER_VERSION": "client.authentication.k8s.io/v1beta1"}, "asked for"),
    ({}, {}, "neither token nor client certificate"),
    ({"token": "t", "expirationTimestamp": "tomorrow"}, {}, "bad expirationTimestamp"),
])
def test_exec_plugin_failures(tmp_path: Path, status: dict[str, Any], env: dict[str, str], match: str) -> None:
    path, _ = exec_config(tmp_path, status, env=env)
    with pytest.raises(CredentialError, match=match):
        load_configuration(str(path)).credentials.current()


def test_exec_plugin_not_installed(tmp_path: Path) -> None:
    path = simple(tmp_path / "kc", {"server": "https://h"}, {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1", "command": "no-such-plugin-xyz",
        "installHint": "install it from example.com"}})
    with pytest.raises(CredentialError, match=r"not found.*example\.com"):
        load_configuration(str(path)).credentials.current()
