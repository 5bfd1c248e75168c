"""The node plugin as a process, against a minimal API server: rolling-update sockets, the probe,
the kubelet-version warning, SIGTERM (deregister, drain, exit 0 in a few seconds), and a node
whose devices are not published (no NVML; NVIDIA's device plugin there), where it stays up."""

from __future__ import annotations

import json
import os
import signal
import stat
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

from dra_driver.node.discovery.nvml import nvml_available
from dra_driver.ondisk import socket_paths

REPO = Path(__file__).resolve().parents[2]
DRIVER = "gpu.dra-driver.io"
NODE = "node-a"
POD = "0f0f0f0f-1111-4000-8000-000000000001"


class ApiServer:
    """Answers the plugin's few requests: its Node (with ``kubelet``), lists (empty), watches (empty,
    after a while), and writes (echoed and recorded)."""

    def __init__(self, kubelet: str, capacity: dict[str, str] | None = None) -> None:
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
                                "status": {"nodeInfo": {"kubeletVersion": kubelet},
                                           "capacity": capacity or {}, "allocatable": capacity or {}}})
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

    def notes(self, reason: str) -> list[str]:
        return [str(body.get("note")) for _, body in self.posted if body.get("reason") == reason]

    def published_devices(self) -> list[Any]:
        return [d for _, body in self.posted if body.get("kind") == "ResourceSlice"
                for d in body.get("spec", {}).get("devices", [])]


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
    sockets = socket_paths(DRIVER, root / "reg", root / "plugins" / DRIVER, POD)
    assert sockets.registration.name == f"{DRIVER}-{POD}-reg.sock"
    plugin, env, _ = start_plugin(root, api, "--gpu-backend=simulated", env={"ROLLING_UPDATE": "true", "POD_UID": POD})
    try:
        wait_for(sockets.registration.is_socket, 60, "the registration socket")
        probe = subprocess.run([sys.executable, "-m", "dra_driver", "probe"], cwd=REPO, env=env, capture_output=True,
                               text=True, timeout=60)
        assert probe.returncode == 0, probe.stderr
        wait_for(lambda: "ResourceSlice" in api.kinds(), 30, "a published ResourceSlice")
        wait_for(lambda: "RollingUpdateUnsupported" in api.reasons(), 30, "the kubelet version Event")
        assert (root / "plugins" / DRIVER / "publisher.lock").exists()
    finally:
        signalled = time.monotonic()
        out = stop_plugin(plugin, api)
        took = time.monotonic() - signalled
    assert took < 5, f"SIGTERM to exit took {took:.1f} s"
    assert not sockets.registration.exists() and not sockets.dra.exists()
    assert "rolling updates need kubelet 1.33 or newer" in out
    removed = [line for line in out.splitlines() if "removed socket" in line]
    assert len(removed) == 2 and "server=registration" in removed[0] and "server=dra" in removed[1], out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(port: int, path: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def start_plugin(root: Path, api: ApiServer, *args: str,
                 env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], dict[str, str], int]:
    kubeconfig = root / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": api.url}}], "users": [{"name": "u", "user": {}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    port = free_port()
    env = {"PATH": os.environ["PATH"], "HOME": str(root), "KUBELET_REGISTRY_DIR": str(root / "reg"),
           "KUBELET_PLUGINS_DIR": str(root / "plugins"), "NODE_NAME": NODE, "DRIVER_NAME": DRIVER, **(env or {})}
    plugin = subprocess.Popen(
        [sys.executable, "-m", "dra_driver", "kubelet-plugin", f"--kubeconfig={kubeconfig}", f"--cdi-root={root / 'cdi'}",
         f"--dev-root={root / 'dev'}", "--log-format=console", f"--health-port={port}", *args],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return plugin, env, port


def stop_plugin(plugin: subprocess.Popen[str], api: ApiServer) -> str:
    try:
        plugin.send_signal(signal.SIGTERM)
        out, _ = plugin.communicate(timeout=30)
    finally:
        if plugin.poll() is None:
            plugin.kill()
            plugin.communicate()
        api.httpd.shutdown()
    assert plugin.returncode == 0, out
    return out


def assert_up_and_publishing_nothing(plugin: subprocess.Popen[str], env: dict[str, str], port: int,
                                     reason: str, label: str) -> str:
    """Up (probe and /healthz pass), ready with the reason, the metric set, and no device published."""
    wait_for(lambda: get(port, "/healthz")[0] == 200 or plugin.poll() is not None, 60, "/healthz")
    assert plugin.poll() is None, "the plugin exited"
    probe = subprocess.run([sys.executable, "-m", "dra_driver", "probe"], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    status, body = get(port, "/readyz")
    assert status == 200 and body.startswith("ok: ") and "publishing nothing" in body, (status, body)
    metrics = get(port, "/metrics")[1]
    assert f'dra_driver_plugin_not_publishing{{reason="{label}"}} 1' in metrics, metrics
    return body


@pytest.mark.timeout(120)
@pytest.mark.skipif(nvml_available()[0], reason="this machine has NVML: the nvml backend would find its GPUs")
def test_without_nvml_the_plugin_stays_up_and_publishes_nothing(root: Path) -> None:
    """The chart's default backend on a node without the NVIDIA driver: no exit 1 (a crash loop on
    every CPU node), no simulated GPUs; it serves the kubelet, says why four ways, publishes nothing."""
    api = ApiServer(kubelet="v1.37.0")
    # The chart's hostPath mount has the kubelet make the plugin's directory, 0755; the plugin tightens it.
    own_dir = root / "plugins" / DRIVER
    own_dir.mkdir(parents=True)
    own_dir.chmod(0o757)
    plugin, env, port = start_plugin(root, api)  # --gpu-backend defaults to nvml
    try:
        wait_for(lambda: "GpuBackendUnavailable" in api.reasons() or plugin.poll() is not None, 60, "the Event")
        body = assert_up_and_publishing_nothing(plugin, env, port, "GpuBackendUnavailable", "backend_unavailable")
        assert stat.S_IMODE(own_dir.stat().st_mode) == 0o750
        assert "NVML is not available" in body
        (note,) = api.notes("GpuBackendUnavailable")
        assert "publishing nothing" in note and "simulated" not in note, note
        time.sleep(1.5)
        assert api.published_devices() == []
    finally:
        out = stop_plugin(plugin, api)
    assert "publishing no devices" in out and "reason=backend_unavailable" in out, out
    assert "Traceback" not in out and "simulated" not in out.lower(), out


@pytest.mark.timeout(120)
def test_a_node_served_by_the_device_plugin_publishes_nothing_unless_told(root: Path) -> None:
    """nvidia.com/gpu in the Node's capacity: the same GPUs would go out twice; with
    --ignore-device-plugin (a node being migrated) they are published."""
    api = ApiServer(kubelet="v1.37.0", capacity={"cpu": "8", "nvidia.com/gpu": "8", "nvidia.com/mig-1g.10gb": "0"})
    plugin, env, port = start_plugin(root, api, "--gpu-backend=simulated")
    try:
        wait_for(lambda: "DevicePluginPresent" in api.reasons() or plugin.poll() is not None, 60, "the Event")
        body = assert_up_and_publishing_nothing(plugin, env, port, "DevicePluginPresent", "device_plugin")
        (note,) = api.notes("DevicePluginPresent")
        assert note == body.removeprefix("ok: ").strip()
        # Only the non-zero resource is named: a plugin that went away leaves its resource at 0.
        assert "advertises nvidia.com/gpu (" in note and "mig-1g" not in note and "--ignore-device-plugin" in note
        time.sleep(1.5)
        assert api.published_devices() == []
    finally:
        out = stop_plugin(plugin, api)
    assert "reason=device_plugin" in out and "Traceback" not in out, out

    api = ApiServer(kubelet="v1.37.0", capacity={"nvidia.com/gpu": "8"})
    plugin, env, port = start_plugin(root, api, "--gpu-backend=simulated", "--ignore-device-plugin")
    try:
        wait_for(lambda: api.published_devices() or plugin.poll() is not None, 60, "published devices")
        assert len(api.published_devices()) == 8  # the default h100-8x profile
        assert get(port, "/readyz") == (200, "ok\n")
        assert "DevicePluginPresent" not in api.reasons()
    finally:
        stop_plugin(plugin, api)
