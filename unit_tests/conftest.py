"""Hypothesis profiles for the fuzz tests (``unit_tests/test_fuzz_*.py``), the ``srv``, ``crashing`` and
``flushes`` fixtures, and the session's check of every CDI spec the driver wrote with the reference CDI
library (``unit_tests/cdispecs.py``): a spec it refuses fails the run. The tests marked ``helm`` run
last: on a cold machine make test's background worker is still building helm when the suite starts,
and the rest of the suite runs meanwhile instead of waiting on it.

* ``ci`` (default, what ``make test`` runs): few examples, derandomized so a CI run is
  reproducible, a deadline per example; the whole fuzz set stays well under a minute.
* ``long`` (``HYPOTHESIS_PROFILE=long``): many random examples, no deadline: for hunting bugs.

A test that is costlier per example scales its count with :func:`examples`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import cdispecs
import pytest
from crashes import Crash
from hypothesis import HealthCheck, settings
from kubeserver import Server

from dra_driver import failpoints

settings.register_profile(
    "ci", max_examples=60, deadline=2000, derandomize=True, database=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "long", max_examples=3000, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

CDI_OUTCOME = pytest.StashKey[cdispecs.Outcome]()


def pytest_configure(config: pytest.Config) -> None:
    cdispecs.install()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("helm") is not None)  # stable: the rest keep their order


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    outcome = cdispecs.SESSION.check()
    if outcome is None:
        return
    session.config.stash[CDI_OUTCOME] = outcome
    if outcome.problems and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    outcome = terminalreporter.config.stash.get(CDI_OUTCOME, None)
    if outcome is None:
        return
    if not outcome.problems:
        terminalreporter.write_line(outcome.summary())
        return
    terminalreporter.write_sep("=", "CDI specs the driver wrote, by the reference CDI library", red=True)
    for problem in outcome.problems:
        terminalreporter.write_line(problem)
    if outcome.kept:
        terminalreporter.write_line(f"The refused specs are kept in {outcome.kept}; check them again with: "
                                    f"{cdispecs.cdicheck.binary()} {outcome.kept}/*")
    terminalreporter.write_sep("=", outcome.summary(), red=True)


@pytest.fixture
def srv() -> Iterator[Server]:
    """A scripted local API server and a RestKubeApi pointed at it (unit_tests/kubeserver.py)."""
    s = Server()
    yield s
    s.httpd.shutdown()
    s.api.close()


@pytest.fixture
def crashing(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Failpoints raise Crash instead of killing the test process; all disarmed afterwards."""
    def die(name: str) -> None:
        raise Crash(name)

    monkeypatch.setattr(failpoints, "_die", die)
    yield
    failpoints.configure({})


@pytest.fixture
def flushes(monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[str]]:
    """Call it to start recording ``os.fsync`` and ``os.fdatasync`` calls by name; they still flush."""
    def start() -> list[str]:
        calls: list[str] = []
        for name in ("fsync", "fdatasync"):
            real = getattr(os, name)

            def flush(fd: int, name: str = name, real: Callable[[int], None] = real) -> None:
                calls.append(name)
                real(fd)

            monkeypatch.setattr(os, name, flush)
        return calls
    return start
