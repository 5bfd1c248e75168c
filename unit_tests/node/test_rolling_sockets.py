"""Rolling updates: every plugin pod names its sockets after its pod UID, as the Go kubeletplugin
helper does, and the probe finds the same names from the same environment."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dra_driver.cli import build_parser
from dra_driver.node.settings import plugin_settings, registration_socket_from_env
from dra_driver.ondisk import MAX_SOCKET_PATH, socket_paths

DRIVER = "gpu.dra-driver.io"
POD = "1f0e4c52-8c3b-4a7e-9d3e-0123456789ab"
REPO = Path(__file__).resolve().parents[2]


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def test_one_instance_keeps_the_old_names() -> None:
    paths = socket_paths(DRIVER, Path("/reg"), Path("/plugins") / DRIVER, None)
    assert paths.registration == Path(f"/reg/{DRIVER}-reg.sock")
    assert paths.dra == Path(f"/plugins/{DRIVER}/dra.sock")


def test_rolling_update_names_sockets_after_the_pod() -> None:
    paths = socket_paths(DRIVER, Path("/var/lib/kubelet/plugins_registry"), Path("/var/lib/kubelet/plugins") / DRIVER,
                         POD)
    assert paths.registration == Path(f"/var/lib/kubelet/plugins_registry/{DRIVER}-{POD}-reg.sock")
    assert paths.dra == Path(f"/var/lib/kubelet/plugins/{DRIVER}/dra-{POD}.sock")
    other = socket_paths(DRIVER, Path("/r"), Path("/p"), POD.replace("1f", "2f"))
    assert other.registration.name != paths.registration.name and other.dra.name != paths.dra.name


def fill(directory: str, free: int) -> Path:
    """A directory whose path leaves ``free`` bytes of :data:`MAX_SOCKET_PATH` for ``/<name>``."""
    length = MAX_SOCKET_PATH - free - 1
    return Path(directory + "x" * (length - len(directory)))


def test_registration_socket_falls_back_to_hashes_when_the_path_is_too_long() -> None:
    full = f"{DRIVER}-{POD}-reg.sock"
    short = f"{DRIVER}-{b64(hashlib.sha256(POD.encode()).digest()[:8])}-reg.sock"
    pair = (DRIVER + "\0" + POD).encode()
    shortest = f"dra-{b64(hashlib.sha256(pair).digest()[:16])}-reg.sock"
    assert len(short) < len(full) and len(shortest) < len(short)
    plugins = Path("/p")
    # Exactly long enough for each candidate, then one byte short of it.
    assert socket_paths(DRIVER, fill("/r", len(full)), plugins, POD).registration.name == full
    assert socket_paths(DRIVER, fill("/r", len(full) - 1), plugins, POD).registration.name == short
    assert socket_paths(DRIVER, fill("/r", len(short)), plugins, POD).registration.name == short
    assert socket_paths(DRIVER, fill("/r", len(short) - 1), plugins, POD).registration.name == shortest
    # Nothing fits: the shortest, and binding it fails naming the path.
    assert socket_paths(DRIVER, fill("/r", len(shortest) - 1), plugins, POD).registration.name == shortest
    for free in (len(full), len(short), len(shortest)):
        path = socket_paths(DRIVER, fill("/r", free), plugins, POD).registration
        assert len(os.fsencode(path)) <= MAX_SOCKET_PATH


def test_dra_socket_falls_back_to_a_hash() -> None:
    full = f"dra-{POD}.sock"
    assert socket_paths(DRIVER, Path("/r"), fill("/p", len(full)), POD).dra.name == full
    hashed = socket_paths(DRIVER, Path("/r"), fill("/p", len(full) - 1), POD).dra.name
    assert hashed == f"dra-{b64(hashlib.sha256(POD.encode()).digest()[:8])}.sock"


def settings_of(*argv: str) -> object:
    return plugin_settings(build_parser().parse_args(["kubelet-plugin", "--node-name=n", *argv]))


def test_settings_name_the_sockets(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ROLLING_UPDATE", "POD_UID"):
        monkeypatch.delenv(name, raising=False)
    plain = settings_of("--kubelet-registry-dir=/r", "--kubelet-plugins-dir=/p", f"--pod-uid={POD}")
    assert plain.registration_socket == Path(f"/r/{DRIVER}-reg.sock")  # type: ignore[attr-defined]
    monkeypatch.setenv("ROLLING_UPDATE", "true")
    monkeypatch.setenv("POD_UID", POD)
    rolling = settings_of("--kubelet-registry-dir=/r", "--kubelet-plugins-dir=/p")
    assert rolling.registration_socket == Path(f"/r/{DRIVER}-{POD}-reg.sock")  # type: ignore[attr-defined]
    assert rolling.dra_socket == Path(f"/p/{DRIVER}/dra-{POD}.sock")  # type: ignore[attr-defined]
    env = {"ROLLING_UPDATE": "true", "POD_UID": POD, "KUBELET_REGISTRY_DIR": "/r"}
    assert registration_socket_from_env(env, DRIVER) == rolling.registration_socket  # type: ignore[attr-defined]
    assert registration_socket_from_env({"KUBELET_REGISTRY_DIR": "/r"}, DRIVER) == plain.registration_socket  # type: ignore[attr-defined]


@pytest.mark.parametrize(("uid", "problem"), [("", "needs this pod's UID"), ("my-pod", "is not a pod UID")])
def test_rolling_update_without_a_pod_uid_does_not_start(uid: str, problem: str) -> None:
    env = {"PATH": "/usr/bin:/bin", "ROLLING_UPDATE": "true", "POD_UID": uid}
    proc = subprocess.run([sys.executable, "-m", "dra_driver", "kubelet-plugin", "--node-name=n"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 1, proc.stderr
    assert problem in proc.stderr and "Traceback" not in proc.stderr
    probe = subprocess.run([sys.executable, "-m", "dra_driver", "probe"], cwd=REPO, capture_output=True, text=True,
                           timeout=60, env=env)
    assert probe.returncode == 1 and problem in probe.stderr


def test_probe_finds_the_instance_socket_from_the_environment(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "ROLLING_UPDATE": "true", "POD_UID": POD, "KUBELET_REGISTRY_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "dra_driver", "probe"], cwd=REPO, capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 1
    want = socket_paths(DRIVER, tmp_path, Path("/unused"), POD).registration
    assert f"registration socket {want} does not exist" in proc.stderr
