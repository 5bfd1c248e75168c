"""Two plugin instances of one node (a rolling update: the new pod starts before the old one stops)
share the state directory: the checkpoint, the CDI specs, the device metadata files.

The kubelet sends each call to one instance, normally the newest, but a call in flight at the old
one, the old one's stale-claim sweep, or a kubelet that still talks to the old instance can run at
the same time as the new instance's calls. So:

* every batch of prepares, of unprepares, of claims recorded ahead (and the start-up recovery)
  runs under an exclusive ``flock`` on ``<state dir>/serialize.lock`` (0600), taken once per batch
  after the in-process group commit (:mod:`~dra_driver.node.prepare.groupcommit`) has gathered it.
  Also with one instance: it costs one uncontended system call, and it protects a node where two
  instances run by mistake. The kernel drops it when its holder dies, SIGKILL included.
* under the lock, the batch starts from the checkpoint as it is on disk: if another instance
  saved since this one last read or wrote it (device, inode, size), the records it appended are
  read, or the whole file when it was replaced (:meth:`CheckpointStore.sync`). Which devices are
  taken, which dynamic MIG instances exist and what :meth:`DeviceState.prepared_claims` answers are
  derived from the entries, so a claim prepared by one instance is answered with the same devices
  by the other, never given out twice, and unprepared by either (its files removed by name).

The files a prepare writes (CDI specs, metadata) are only written under the lock, so an instance
starting up may remove temporary files of interrupted writes: no other instance is writing one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from dra_driver.node.fileio import FileLock
from dra_driver.node.prepare.ledger import Ledger
from dra_driver.ondisk import SERIALIZE_LOCK_FILE

_In = TypeVar("_In")
_Out = TypeVar("_Out")


class SharedState:
    """The serialize lock of a state directory, and the ledger brought up to date under it."""

    def __init__(self, state_dir: Path, ledger: Ledger) -> None:
        self.lock = FileLock(state_dir / SERIALIZE_LOCK_FILE)
        self._ledger = ledger

    @contextmanager
    def current(self) -> Iterator[None]:
        """Hold the lock, with the ledger's entries as the checkpoint has them."""
        with self.lock.held():
            self._ledger.sync()
            yield

    def serialized(self, work: Callable[[dict[str, _In]], dict[str, _Out]]) -> Callable[[dict[str, _In]], dict[str, _Out]]:
        """``work`` run under :meth:`current`: a group commit's round."""
        def run(items: dict[str, _In]) -> dict[str, _Out]:
            with self.current():
                return work(items)
        return run

    def close(self) -> None:
        self.lock.close()
