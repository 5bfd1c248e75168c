"""Which plugin instance of a node writes the node-wide objects: its ResourceSlices, the health
taints in them, and the Events about device health.

During a rolling update two instances run on a node for a while. Both would publish the same pool,
each bumping the generation over the other's slices, so only the holder of an exclusive ``flock``
on ``<state dir>/publisher.lock`` publishes. The other keeps its desired slices up to date (its
devices, its health view) without writing them, and tries the lock every ``retry_interval``
seconds without blocking. The holder keeps the lock until it exits; the kernel releases it then,
on SIGKILL too, and the other instance takes over within about a second and publishes its own
content once, through the publisher's diff: no write when it equals what is there, one
generation otherwise.

Health monitoring runs in both instances: each streams its own view to the kubelet
(``NodeWatchResources``), which asks the instance it talks to.
"""

from __future__ import annotations

import threading
from pathlib import Path

from dra_driver import logs
from dra_driver.node.fileio import FileLock

_log = logs.get("ownership")


class PublisherLock:
    """The lock that makes this instance the node's publisher; ``held`` is set once it is."""

    def __init__(self, path: Path, node_name: str, retry_interval: float = 1.0) -> None:
        self._lock = FileLock(path)
        self.retry_interval = retry_interval
        self.held = threading.Event()
        self._log = _log.bind(node=node_name, path=str(path))

    def try_take(self) -> bool:
        """Take the lock if it is free (or already ours); whether this instance holds it."""
        if self.held.is_set() or self._lock.acquire(blocking=False):
            self.held.set()
        return self.held.is_set()

    def wait(self, stop: threading.Event) -> bool:
        """Block until this instance holds the lock (True) or ``stop`` is set (False)."""
        waited = False
        while not self.try_take():
            if not waited:
                self._log.info("another plugin instance publishes this node's ResourceSlices; taking over when "
                               "it stops")
                waited = True
            if stop.wait(self.retry_interval):
                return False
        self._log.info("this instance publishes the node's ResourceSlices", took_over=waited)
        return True

    def release(self) -> None:
        """Let the other instance take over (this one is stopping)."""
        self.held.clear()
        self._lock.close()
