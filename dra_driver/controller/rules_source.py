"""Which kube-scheduler's rules the controller decides with: ``--scheduler-rules`` names a version,
or ``auto`` follows the API server's, read at start and again every few minutes, since a
control-plane upgrade happens under a running controller (the rules change when its scheduler's
do, the API server first)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from dra_driver import logs
from dra_driver.allocator.rules import AUTO, SchedulerRules, choose_rules

REFRESH_SECONDS = 300.0
"""How often ``auto`` reads the API server's version again."""


class RulesSource:
    """The rules in force: :meth:`current` is cheap (the engine's callers ask per claim);
    :meth:`refresh` reads the version when it is due and logs a change, or a guess, once."""

    def __init__(self, choice: str, server_version: Callable[[], str] | None, clock: Callable[[], float],
                 log: logs.Logger, refresh_seconds: float = REFRESH_SECONDS) -> None:  # fmt: skip
        self.choice = choice
        self.server_version = server_version
        self.clock = clock
        self.log = log
        self.refresh_seconds = refresh_seconds
        self._lock = threading.Lock()
        self._rules, _ = choose_rules(choice, None)
        self._read_at: float | None = None
        self._warned: set[str] = set()
        self._announced = False

    def current(self) -> SchedulerRules:
        with self._lock:
            return self._rules

    def refresh(self, force: bool = False) -> SchedulerRules:
        """Read the API server's version when ``auto`` and it is due (or ``force``); a version that
        cannot be read keeps the rules in force."""
        if self.choice != AUTO or self.server_version is None:
            return self.current()
        now = self.clock()
        with self._lock:
            if not force and self._read_at is not None and now - self._read_at < self.refresh_seconds:
                return self._rules
            self._read_at = now
        try:
            version: str | None = self.server_version()
        except Exception as exc:  # the next refresh tries again
            self._warn_once(f"cannot read the API server's version: {type(exc).__name__}: {exc}; keeping "
                            f"{self.current().label}")
            return self.current()
        rules, warning = choose_rules(self.choice, version)
        if warning:
            self._warn_once(warning)
        with self._lock:
            before, self._rules = self._rules, rules
            # The first read says which rules it chose, later ones only a change.
            announce, self._announced = before != rules or not self._announced, True
        if announce:
            self.log.info("scheduler rules", rules=rules.label, minor=rules.minor, previous=before.label,
                          kubernetes=version, choice=self.choice)
        return rules

    def _warn_once(self, text: str) -> None:
        with self._lock:
            if text in self._warned:
                return
            self._warned.add(text)
        self.log.warning("scheduler rules guessed", reason=text)
