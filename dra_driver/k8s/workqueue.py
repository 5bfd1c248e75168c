"""A de-duplicating work queue with client-go's semantics (:class:`WorkQueue`).

A key waiting in the queue is there once however often it is added; a key added while a worker
holds it is queued again when the worker calls :meth:`WorkQueue.done`, so one key is never
processed by two workers at once; delayed adds and per-key exponential retry back-off.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
"""A key: any hashable value (a UID, a typed item)."""


class WorkQueue(Generic[K]):
    """De-duplicating work queue with delayed adds and per-key retry back-off."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        base_delay: float = 0.5,
        max_delay: float = 60.0,
    ) -> None:
        self._clock = clock
        self._cond = threading.Condition()
        self._queue: deque[K] = deque()
        self._queued: set[K] = set()
        self._processing: set[K] = set()
        self._dirty: set[K] = set()
        self._timers: list[tuple[float, int, K]] = []
        self._delayed: dict[K, int] = {}  # key -> timers pending for it
        self._seq = 0
        self._failures: dict[K, int] = {}
        self._base = base_delay
        self._max = max_delay
        self._shutdown = False

    def add(self, key: K) -> None:
        with self._cond:
            self._add_locked(key)

    def _add_locked(self, key: K) -> None:
        if self._shutdown:
            return
        if key in self._processing:
            self._dirty.add(key)
            return
        if key in self._queued:
            return
        self._queued.add(key)
        self._queue.append(key)
        self._cond.notify()

    def add_after(self, key: K, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        with self._cond:
            self._seq += 1
            heapq.heappush(self._timers, (self._clock() + delay, self._seq, key))
            self._delayed[key] = self._delayed.get(key, 0) + 1
            self._cond.notify()

    def add_rate_limited(self, key: K) -> float:
        """Re-add ``key`` after a back-off that doubles with every consecutive failure."""
        with self._cond:
            n = self._failures.get(key, 0)
            self._failures[key] = n + 1
        delay = float(min(self._base * (2**n), self._max))
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        with self._cond:
            self._failures.pop(key, None)

    def failures(self, key: K) -> int:
        with self._cond:
            return self._failures.get(key, 0)

    def deferred(self, key: K) -> bool:
        """``key`` waits for a delayed add or a retry back-off: adding it now would cut the wait short."""
        with self._cond:
            return key in self._delayed or key in self._failures

    def _promote_due_locked(self) -> float | None:
        now = self._clock()
        while self._timers and self._timers[0][0] <= now:
            _, _, key = heapq.heappop(self._timers)
            left = self._delayed.pop(key) - 1
            if left:
                self._delayed[key] = left
            self._add_locked(key)
        return self._timers[0][0] - now if self._timers else None

    def get(self, timeout: float | None = None) -> K | None:
        """The next key (now held by the caller until :meth:`done`), or None on timeout/shutdown."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._cond:
            while True:
                wait = self._promote_due_locked()
                if self._queue:
                    key = self._queue.popleft()
                    self._queued.discard(key)
                    self._processing.add(key)
                    return key
                if self._shutdown:
                    return None
                if deadline is not None:
                    left = deadline - self._clock()
                    if left <= 0:
                        return None
                    wait = left if wait is None else min(wait, left)
                self._cond.wait(wait)

    def done(self, key: K) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._dirty.discard(key)
                self._add_locked(key)

    def shutdown(self) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._queue)

    def idle(self) -> bool:
        """Nothing queued and nothing being processed (delayed adds aside)."""
        with self._cond:
            return not self._queue and not self._processing

    def pending(self) -> list[K]:
        with self._cond:
            return [*self._queue]

    def stats(self) -> dict[str, Any]:
        with self._cond:
            return {"queued": len(self._queue), "processing": len(self._processing), "delayed": len(self._timers)}
