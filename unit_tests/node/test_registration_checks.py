"""The 1.38 kubelet's registration checks (k/k #140837), applied at start: a driver name or socket
path it would refuse stops the plugin with a message naming the flag, exit code 2, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dra_driver.cli import build_parser, main
from dra_driver.flags import SettingsError
from dra_driver.node.settings import UNIX_PATH_MAX, plugin_settings, registration_problems, socket_problem
from dra_driver.ondisk import SocketPaths

GOOD = SocketPaths(Path("/var/lib/kubelet/plugins_registry/gpu.dra-driver.io-reg.sock"),
                   Path("/var/lib/kubelet/plugins/gpu.dra-driver.io/dra.sock"))
UID = "0b3e4a52-6f0e-4b8e-9d8a-1c2d3e4f5a6b"


@pytest.mark.parametrize(("path", "problem"), [
    ("/var/lib/kubelet/plugins/x/dra.sock", None),
    ("/a b/dra.sock", None),  # a space reads back unchanged
    ("/" + "p" * (UNIX_PATH_MAX - 2), None),  # 107 bytes
    ("/" + "p" * (UNIX_PATH_MAX - 1), "shorter than 108 bytes, is 108"),
    ("/" + "é" * 54, "shorter than 108 bytes, is 109"),  # bytes, not characters
    ("plugins/dra.sock", "absolute"),
    ("/plugins/%2e%2e/dra.sock", "no %"),
    ("/plugins/dra.sock?x", "no ?"),
    ("/plugins/dra#1.sock", "no #"),
    ("/plugins/dra\n.sock", "control character"),
    ("//host/dra.sock", "host"),
])
def test_socket_paths(path: str, problem: str | None) -> None:
    found = socket_problem(Path(path))
    assert (found is None) if problem is None else (found is not None and problem in found), found


@pytest.mark.parametrize(("driver", "ok"), [
    ("gpu.dra-driver.io", True), ("GPU.Example.COM", True), ("a" * 63, True), ("a" * 64, False),
    ("gpu_driver.io", False), ("-gpu.io", False), ("gpu..io", False), ("", False),
])
def test_driver_names(driver: str, ok: bool) -> None:
    problems = registration_problems(driver, GOOD, False)
    assert problems == [] if ok else (len(problems) == 1 and problems[0].startswith("--driver-name"))


def test_each_problem_names_its_flags() -> None:
    sockets = SocketPaths(Path("reg.sock"), Path("/p%/dra.sock"))
    dra, reg = registration_problems("gpu.dra-driver.io", sockets, True)
    assert "DRA socket" in dra and "--kubelet-plugins-dir" in dra and "--pod-uid" in dra and "no %" in dra
    assert "registration socket" in reg and "--kubelet-registry-dir" in reg and "absolute" in reg


def args(*argv: str) -> list[str]:
    return ["kubelet-plugin", "--node-name=n", *argv]


def test_settings_refuse_what_the_kubelet_refuses(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"--driver-name 'gpu_x\.io'"):
        plugin_settings(build_parser().parse_args(args("--driver-name=gpu_x.io")))
    with pytest.raises(SettingsError, match="registration socket 'registry/"):
        plugin_settings(build_parser().parse_args(args("--kubelet-registry-dir=registry")))
    deep = tmp_path / ("d" * (UNIX_PATH_MAX - len(str(tmp_path))))
    with pytest.raises(SettingsError, match=r"DRA socket .* shorter than 108 bytes"):
        plugin_settings(build_parser().parse_args(args(f"--kubelet-plugins-dir={deep}")))
    # The per-pod sockets of a rolling update are checked as computed (hashed names when long).
    ok = plugin_settings(build_parser().parse_args(args("--rolling-update", f"--pod-uid={UID}")))
    assert ok.dra_socket.name == f"dra-{UID}.sock"
    with pytest.raises(SettingsError, match="--pod-uid"):
        plugin_settings(build_parser().parse_args(args("--rolling-update", f"--pod-uid={UID}",
                                                       f"--kubelet-plugins-dir={deep}")))


def test_the_plugin_stops_with_a_message_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args("--driver-name=Bad_Name")) == 1
    err = capsys.readouterr().err
    assert err.startswith("dra-driver kubelet-plugin: --driver-name 'Bad_Name' must be") and "Traceback" not in err


def test_the_command_exits_non_zero() -> None:
    proc = subprocess.run([sys.executable, "-m", "dra_driver", *args("--kubelet-plugins-dir=/p?x")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 1 and "no ?" in proc.stderr and "Traceback" not in proc.stderr
