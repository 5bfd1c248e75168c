"""The background worker that builds make test's later Go tool sets ahead (e2e/tooling/prefetch.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from e2e.testbed import cdicheck, kindnode
from e2e.tooling import binaries, gotools, prefetch, runtime


def test_every_set_is_a_known_tool_set_once() -> None:
    sets = prefetch.tool_sets()
    assert len(sets) == len(set(sets))
    for names in sets:
        assert all(n in gotools.TOOLS for n in names), names


def test_the_sets_are_the_stages_own_calls_in_stage_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(binaries.MINOR_ENV, raising=False)
    sets = prefetch.tool_sets()
    # The folder a set lands in depends on its names and their order: each must be the stage's own.
    bed = binaries.tools()
    monkeypatch.setenv(binaries.MINOR_ENV, "1.36")
    oldest = binaries.tools()
    # make test's stage order: unit-no-helm, e2e (its helm test last), unit-helm, e2e-next, e2e-kind, e2e-oldest.
    expected_in_order = [(cdicheck.TOOL,), bed, runtime.RUNTIME_TOOLS, ("helm",), (binaries.SCHEDULER_ONLY_MINORS["1.38"],),
                         kindnode.NODE_TOOLS, (kindnode.LOCAL_PATH_TOOL,), oldest]
    positions = [sets.index(tuple(s)) for s in expected_in_order]
    assert positions == sorted(positions), sets
    assert bed == kindnode.K8S_TOOLS


def test_make_test_runs_its_stages_in_the_order_the_worker_builds_for() -> None:
    makefile = (Path(__file__).parents[3] / "Makefile").read_text()
    prereqs = next(line for line in makefile.splitlines() if line.startswith("test:")).split()
    stages = [s for s in prereqs if s.startswith(("e2e", "unit"))]
    assert stages == ["unit-no-helm", "e2e", "unit-helm", "e2e-next", "e2e-kind", "e2e-oldest"], prereqs


def test_a_set_that_fails_is_left_to_its_stage_and_the_rest_still_build(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    built: list[tuple[str, ...]] = []

    def ensure(names: tuple[str, ...], log: bool = True) -> Path:
        if names == ("helm",):
            raise gotools.ToolError("gotools: building helm failed")
        built.append(names)
        return Path("/nonexistent")

    monkeypatch.setattr(gotools, "ensure", ensure)
    monkeypatch.setattr(prefetch.os, "nice", lambda _n: 0)
    monkeypatch.setattr(prefetch.signal, "signal", lambda *_a: None)
    assert prefetch.run(os.getpid()) == 0
    assert built == [names for names in prefetch.tool_sets() if names != ("helm",)]
    assert "helm not built here (gotools: building helm failed); its stage will build it" in capsys.readouterr().out


def test_nothing_is_built_once_the_watched_process_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    built: list[tuple[str, ...]] = []
    monkeypatch.setattr(gotools, "ensure", lambda names, log=True: built.append(names))
    monkeypatch.setattr(prefetch.os, "nice", lambda _n: 0)
    monkeypatch.setattr(prefetch.signal, "signal", lambda *_a: None)
    monkeypatch.setattr(prefetch, "_watch", lambda _pid: None)
    assert prefetch.run(gone.pid) == 0
    assert built == []


def test_the_worker_stops_with_the_process_it_watches(tmp_path: Path) -> None:
    """A real worker process: its watcher ends it once the watched process exits, build or not."""
    watched = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    script = ("import sys, time; from e2e.tooling import prefetch, gotools;"
              "prefetch.WATCH_EVERY_S = 0.1;"
              "gotools.ensure = lambda names, log=True: time.sleep(60);"
              f"sys.exit(prefetch.run({watched.pid}))")
    worker = subprocess.Popen([sys.executable, "-c", script], start_new_session=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = worker.communicate(timeout=30)
    watched.wait()
    assert worker.returncode == 128 + 15, out
    assert f"process {watched.pid} has exited; stopping" in out


def test_start_refuses_a_process_that_is_not_there(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert prefetch.start(gone.pid, tmp_path / "log") == 2
    assert f"no process {gone.pid} to watch" in capsys.readouterr().err
