"""The prepared claims as the checkpoint holds them: the entries in memory, written through to the
store; the claims recorded ahead of their preparation (see :mod:`dra_driver.node.prepare.state`);
and the snapshot that readers see between batches.
"""

from __future__ import annotations

from dra_driver import failpoints
from dra_driver.logs import Logger
from dra_driver.node.fileio import describe_os_error
from dra_driver.node.metrics import METRICS
from dra_driver.node.prepare.calls import CdiError, ClaimRef, validate_claim_uid
from dra_driver.node.prepare.checkpoint import CheckpointStore
from dra_driver.node.prepare.entries import ClaimEntry, ClaimState, now_rfc3339


class Ledger:
    """The checkpoint's entries of one plugin; the caller holds the state lock for everything but
    :meth:`published`."""

    def __init__(self, store: CheckpointStore, log: Logger) -> None:
        self.store = store
        self.entries: dict[str, ClaimEntry] = {}
        self.intended: set[str] = set()
        """UIDs whose ``PrepareStarted`` entry without devices is on disk."""
        self._published: dict[str, ClaimEntry] = {}
        self._log = log

    def load(self) -> None:
        self.entries = self.store.load()

    def sync(self) -> None:
        """Take what another plugin instance saved since this one last read or wrote the checkpoint
        (under the serialize lock). Everything derived from the entries (which devices are taken,
        which MIG instances exist, the snapshot readers see) is computed from them, so replacing
        them is enough."""
        try:
            fresh = self.store.sync()
        except OSError as exc:
            # The batch's own save reports the trouble with the file to its claims.
            self._log.error("could not re-read the checkpoint", error=describe_os_error(exc, str(self.store.path)))
            return
        if fresh is not None:
            self.entries = fresh
            # An instance starting up rolls back the entries recorded ahead that it finds: the claim's
            # preparation must then record its own before it makes anything.
            self.intended &= {uid for uid, e in fresh.items() if e.state is ClaimState.PREPARE_STARTED}
            self._log.info("re-read the checkpoint: another plugin instance changed it", claims=len(fresh))

    def save(self) -> str | None:
        """Write the entries to the checkpoint; None, or why it could not be written."""
        try:
            self.store.save(self.entries)
        except OSError as exc:
            return describe_os_error(exc, f"checkpoint {self.store.path}")
        return None

    def save_quietly(self) -> None:
        try:
            self.store.save(self.entries)
        except OSError as exc:
            self._log.error("could not write the checkpoint", error=describe_os_error(exc, str(self.store.path)))

    def publish(self) -> None:
        """End of a batch: the entries that :meth:`published` answers from now on."""
        # replaced, never changed: readers need no lock
        self._published = {uid: e for uid, e in self.entries.items() if uid not in self.intended}
        METRICS.prepared_claims.set(len(self._published))

    def published(self) -> dict[str, ClaimEntry]:
        return dict(self._published)

    def record_intents(self, claims: dict[str, ClaimRef]) -> dict[str, bool]:
        """Record claims about to be prepared, durably; never raises."""
        added = []
        for uid, claim in claims.items():
            if uid in self.entries:
                continue  # prepared already, or being prepared by another call
            try:
                validate_claim_uid(uid)
            except CdiError:
                continue  # refused by the prepare itself, with the reason
            self.entries[uid] = ClaimEntry(uid=uid, namespace=claim.namespace, name=claim.name,
                                           state=ClaimState.PREPARE_STARTED, devices=(),
                                           boot_id=self.store.boot_id, updated=now_rfc3339())
            added.append(uid)
        if not added:
            return {}
        error = self.save()
        if error is not None:
            for uid in added:
                del self.entries[uid]
            self._log.warning("could not record claims about to be prepared; their preparation records them",
                              error=error)
            return {}
        self.intended.update(added)
        failpoints.hit("prepare.after-intent")
        return dict.fromkeys(added, True)

    def drop_intent(self, uid: str) -> None:
        """Forget that ``uid`` was recorded ahead; its entry goes too if the claim got no devices."""
        if uid not in self.intended:
            return
        self.intended.discard(uid)
        entry = self.entries.get(uid)
        if entry is not None and entry.state is ClaimState.PREPARE_STARTED and not entry.devices:
            del self.entries[uid]
