"""The bed signals a pid read from a file only while it names the process the bed started
(e2e/testbed/pids.py), in the pid files of the private dockerd and of a detached fleet."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from e2e.testbed import docker, nodes, pids


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process this test started, in a session of its own (as the bed starts its daemons), reaped
    as soon as it exits so that its pid stops naming it."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    reaper = threading.Thread(target=proc.wait, daemon=True)
    reaper.start()
    yield proc
    if proc.poll() is None:
        proc.kill()
    reaper.join(timeout=10)


def exited(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return proc.poll() is not None


def still_running(proc: subprocess.Popen[bytes]) -> bool:
    time.sleep(0.3)  # a signal, had one been sent, would have ended `sleep` by now
    return proc.poll() is None


def recorded(proc: subprocess.Popen[bytes]) -> pids.Identity:
    started = pids.identify(proc.pid)
    assert started is not None
    return started


def test_the_start_time_is_the_kernels(sleeper: subprocess.Popen[bytes]) -> None:
    started = recorded(sleeper)
    stat = Path(f"/proc/{sleeper.pid}/stat").read_text()
    assert str(started.start_time) == stat.rsplit(")", 1)[1].split()[19]
    assert started.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert pids.from_json(json.loads(json.dumps(started.to_json()))) == started
    assert pids.command_line(sleeper.pid) == ["sleep", "300"]


def test_a_process_with_a_command_name_that_looks_like_fields(tmp_path: Path) -> None:
    # The command name is field 2, in parentheses, and may hold spaces and ')'.
    tricky = tmp_path / "a) b c d"
    tricky.symlink_to("/bin/sleep")
    proc = subprocess.Popen([str(tricky), "300"])
    try:
        started = recorded(proc)
        assert pids.is_running(started)
        assert pids.send(started, signal.SIGTERM)
        assert proc.wait(timeout=10) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()


def test_the_started_process_is_signalled(sleeper: subprocess.Popen[bytes]) -> None:
    started = recorded(sleeper)
    assert pids.send(started, signal.SIGTERM)
    assert exited(sleeper) and sleeper.returncode == -signal.SIGTERM
    assert not pids.is_running(started)
    assert not pids.send(started, signal.SIGTERM)  # gone: nothing to signal


@pytest.mark.parametrize("group", [False, True])
def test_another_start_time_is_never_signalled(sleeper: subprocess.Popen[bytes], group: bool) -> None:
    stale = replace(recorded(sleeper), start_time=recorded(sleeper).start_time - 1)
    assert not pids.is_running(stale)
    assert not pids.send(stale, signal.SIGKILL, group=group)
    assert still_running(sleeper)


def test_another_boot_is_never_signalled(sleeper: subprocess.Popen[bytes]) -> None:
    assert not pids.send(replace(recorded(sleeper), boot_id="0" * 32), signal.SIGKILL)
    assert still_running(sleeper)


def test_a_bare_pid_cannot_be_checked() -> None:
    assert pids.from_json(1234) is None
    assert pids.from_json({"pid": 1234}) is None
    assert pids.from_json({"pid": 1234, "start_time": "5", "boot_id": "x"}) is None


# ---- the fleet's file (make demo-down) -----------------------------------------------------------

def test_fleet_stops_what_it_started_and_nothing_else(sleeper: subprocess.Popen[bytes]) -> None:
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)
    threading.Thread(target=other.wait, daemon=True).start()
    try:
        fleet_file = {
            "plugin": recorded(sleeper).to_json(),
            "peer": {**recorded(other).to_json(), "start_time": recorded(other).start_time + 7},
            "controller": other.pid,  # written by an older bed: no start time to check
        }
        nodes.stop_detached(json.loads(json.dumps(fleet_file)))
        assert exited(sleeper) and sleeper.returncode == -signal.SIGTERM
        assert still_running(other)
    finally:
        other.kill()


def test_processes_record_what_they_started(tmp_path: Path) -> None:
    procs = nodes.Processes(tmp_path / "logs", detached=True)
    proc = procs.start("sleeper", ["sleep", "300"])
    threading.Thread(target=proc.wait, daemon=True).start()
    try:
        assert procs.identities() == {"sleeper": recorded(proc).to_json()}
        nodes.stop_detached(procs.identities())
        assert exited(proc)
        procs.stop("sleeper")
        assert procs.identities() == {}
    finally:
        proc.kill()


# ---- the private dockerd's pid file --------------------------------------------------------------

@pytest.fixture
def exec_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DRA_DOCKER_EXEC_ROOT", str(tmp_path))
    return tmp_path


def test_docker_down_stops_the_daemon_it_started(exec_root: Path, sleeper: subprocess.Popen[bytes]) -> None:
    (exec_root / "dockerd.pid").write_text(f"{sleeper.pid}\n")
    (exec_root / "dockerd.identity").write_text(json.dumps(recorded(sleeper).to_json()))
    docker.down()
    assert exited(sleeper) and sleeper.returncode == -signal.SIGTERM


def test_docker_down_leaves_a_reused_pid_alone(exec_root: Path, sleeper: subprocess.Popen[bytes],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    (exec_root / "dockerd.pid").write_text(f"{sleeper.pid}\n")
    stale = replace(recorded(sleeper), start_time=recorded(sleeper).start_time - 100)
    (exec_root / "dockerd.identity").write_text(json.dumps(stale.to_json()))
    docker.down()
    assert still_running(sleeper)
    assert f"not stopping pid {sleeper.pid}" in capsys.readouterr().err


def test_docker_down_without_a_record_checks_the_command_line(exec_root: Path,
                                                               sleeper: subprocess.Popen[bytes]) -> None:
    # A daemon started before identities were recorded is known by its command line; `sleep` is not dockerd.
    (exec_root / "dockerd.pid").write_text(f"{sleeper.pid}\n")
    docker.down()
    assert still_running(sleeper)


def test_docker_down_with_a_pid_that_names_nothing(exec_root: Path) -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    (exec_root / "dockerd.pid").write_text(f"{proc.pid}\n")
    docker.down()  # returns at once, with nothing to stop
