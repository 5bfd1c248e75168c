"""A keyed work queue with delayed adds; a key is never processed by two workers at once."""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager


class WorkQueue:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: deque[str] = deque()
        self._dirty: set[str] = set()
        self._processing: set[str] = set()
        self._delayed: list[tuple[float, int, str]] = []
        self._seq = 0
        self._shutdown = False

    def add(self, key: str) -> None:
        with self._cond:
            self._add_locked(key)

    def _add_locked(self, key: str) -> None:
        if self._shutdown or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.append(key)
            self._cond.notify()

    def add_after(self, key: str, delay: float) -> None:
        with self._cond:
            self._seq += 1
            heapq.heappush(self._delayed, (time.monotonic() + delay, self._seq, key))
            self._cond.notify()

    def get(self, timeout: float | None = None) -> str | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                now = time.monotonic()
                while self._delayed and self._delayed[0][0] <= now:
                    self._add_locked(heapq.heappop(self._delayed)[2])
                if self._shutdown:
                    return None
                if self._queue:
                    key = self._queue.popleft()
                    self._dirty.discard(key)
                    self._processing.add(key)
                    return key
                waits = [t - now for t in ([self._delayed[0][0]] if self._delayed else [])]
                if deadline is not None:
                    if now >= deadline:
                        return None
                    waits.append(deadline - now)
                self._cond.wait(min(waits) if waits else None)

    def done(self, key: str) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._queue.append(key)
                self._cond.notify()

    def shutdown(self) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()


class KeyedLocks:
    """Per-key mutexes, always taken in sorted order so that overlapping key sets cannot deadlock."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    @contextmanager
    def hold(self, keys: list[str]) -> Iterator[None]:
        with self._guard:
            locks = [self._locks.setdefault(k, threading.Lock()) for k in sorted(set(keys))]
        taken: list[threading.Lock] = []
        try:
            for lock in locks:
                lock.acquire()
                taken.append(lock)
            yield
        finally:
            for lock in reversed(taken):
                lock.release()
