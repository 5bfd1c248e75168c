"""Group commit for the prepare state's batches (:class:`GroupCommit`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

_In = TypeVar("_In")
_Out = TypeVar("_Out")


@dataclass
class _Ticket(Generic[_In, _Out]):
    items: dict[str, _In]
    results: dict[str, _Out] = field(default_factory=dict)
    done: bool = False


class GroupCommit(Generic[_In, _Out]):
    """Runs ``work`` under ``lock`` for everything queued, so that calls arriving while a round is
    being done are done together in the next round: N concurrent kubelet requests then cost one
    round of durable writes instead of N, which is where the time goes (fsync).

    A call whose items a round did returns as soon as that round ends: it waits for its own round,
    not for the lock, which the next round may already hold.
    """

    def __init__(self, lock: threading.RLock, work: Callable[[dict[str, _In]], dict[str, _Out]]) -> None:
        self._lock = lock
        self._work = work
        self._queue: list[_Ticket[_In, _Out]] = []
        self._rounds = threading.Condition(threading.Lock())
        self._in_round = False

    def run(self, items: dict[str, _In]) -> dict[str, _Out]:
        ticket: _Ticket[_In, _Out] = _Ticket(items)
        with self._rounds:
            self._queue.append(ticket)
            while self._in_round and not ticket.done:
                self._rounds.wait()
            if ticket.done:
                return ticket.results
            self._in_round = True
            batch, self._queue = self._queue, []
        try:
            merged: dict[str, _In] = {}
            for queued in batch:
                for key, value in queued.items.items():
                    merged.setdefault(key, value)
            with self._lock:
                results = self._work(merged)
            for queued in batch:
                queued.results = {key: results[key] for key in queued.items if key in results}
        finally:
            with self._rounds:
                for queued in batch:
                    queued.done = True
                self._in_round = False
                self._rounds.notify_all()
        return ticket.results
