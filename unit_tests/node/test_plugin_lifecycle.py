"""The node plugin as a process, against a minimal API server: rolling-update sockets, the probe,
the kubelet-version warning, and SIGTERM (deregister, drain, exit 0 in a few seconds)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from dra_driver.ondisk import socket_paths

REPO = Path(__file__).resolve().parents[2]
DRIVER = "gpu.dra-driver.io"
NODE = "node-a"
POD = "0f0f0f0f-1111-4000-8000-000000000001"


class ApiServer:
    """Answers the plugin's few requests: its Node (with ``kubelet``), lists (empty), watches (empty,
    after a while), and writes (echoed and recorded)."""

    def __init__(self, kubelet: str) -> None:
        self.posted: list[tuple[str, dict[str, Any]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def reply(self, body: dict[str, Any], status: int = 200) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                if "watch=" in url.query:
                    time.sleep(0.5)
                    self.reply({})
                elif url.path == f"/api/v1/nodes/{NODE}":
                    self.reply({"kind": "Node", "metadata": {"name": NODE, "uid": "node-uid"},
                                "status": {"nodeInfo": {"kubeletVersion": kubelet}}})
                else:
                    self.reply({"kind": "List", "items": [], "metadata": {"resourceVersion": "1"}})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.posted.append((urlsplit(self.path).path, body))
                meta = body.setdefault("metadata", {})
                meta.setdefault("name", meta.get("generateName", "x") + uuid.uuid4().hex[:5])
                meta.update(uid=str(uuid.uuid4()), resourceVersion="2")
                self.reply(body, 201)

            def log_message(self, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # the plugin's watches cut short when it exits

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def kinds(self) -> list[str]:
        return [str(body.get("kind")) for _, body in self.posted]

    def reasons(self) -> list[str]:
        return [str(body.get("reason")) for _, body in self.posted if body.get("kind") == "Event"]


@pytest.fixture
def root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dra-", dir="/tmp") as d:  # short: socket paths
        yield Path(d)


def wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.timeout(120)
def test_rolling_update_plugin_serves_warns_and_drains_on_sigterm(root: Path) -> None:
    api = ApiServer(kubelet="v1.32.4")
    kubeconfig = root / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": api.url}}], "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    env = {"PATH": os.environ["PATH"], "HOME": str(root), "ROLLING_UPDATE": "true", "POD_UID": POD,
           "KUBELET_REGISTRY_DIR": str(root / "reg"), "KUBELET_PLUGINS_DIR": str(root / "plugins"),
           "NODE_NAME": NODE, "DRIVER_NAME": DRIVER}
    sockets = socket_paths(DRIVER, root / "reg", root / "plugins" / DRIVER, POD)
    assert sockets.registration.name == f"{DRIVER}-{POD}-reg.sock"
    plugin = subprocess.Popen(
        [sys.executable, "-m", "dra_driver", "kubelet-plugin", f"--kubeconfig={kubeconfig}", "--gpu-backend=simulated",
         f"--cdi-root={root / 'cdi'}", f"--dev-root={root / 'dev'}", "--log-format=console"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(sockets.registration.is_socket, 60, "the registration socket")
        probe = subprocess.run([sys.executable, "-m", "dra_driver", "probe"], cwd=REPO, env=env, capture_output=True,
                               text=True, timeout=60)
        assert probe.returncode == 0, probe.stderr
        wait_for(lambda: "ResourceSlice" in api.kinds(), 30, "a published ResourceSlice")
        wait_for(lambda: "RollingUpdateUnsupported" in api.reasons(), 30, "the kubelet version Event")
        assert (root / "plugins" / DRIVER / "publisher.lock").exists()
        signalled = time.monotonic()
        plugin.send_signal(signal.SIGTERM)
        out, _ = plugin.communicate(timeout=30)
        took = time.monotonic() - signalled
    finally:
        if plugin.poll() is None:
            plugin.kill()
            plugin.communicate()
        api.httpd.shutdown()
    assert plugin.returncode == 0, out
    assert took < 5, f"SIGTERM to exit took {took:.1f} s"
    assert not sockets.registration.exists() and not sockets.dra.exists()
    assert "rolling updates need kubelet 1.33 or newer" in out
    removed = [line for line in out.splitlines() if "removed socket" in line]
    assert len(removed) == 2 and "server=registration" in removed[0] and "server=dra" in removed[1], out
