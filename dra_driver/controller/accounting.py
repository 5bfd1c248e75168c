"""What the claims hold: the informer's claims with the controller's own recent writes laid over them.

The informer may not have delivered an allocation this controller just wrote; until it does (or
the entry expires), the written object stands in for the cached one, so no second claim is given
the same devices meanwhile. A version counts every change of what is held, for the evaluations
that depend on it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dra_driver.allocator.inventory import AllocatedState
from dra_driver.allocator.resolve import Engine
from dra_driver.controller.views import holdings
from dra_driver.k8s.claims import is_allocated, uid_of
from dra_driver.k8s.informer import Store
from dra_driver.k8s.objects import Obj, resource_version

LEDGER_TTL_SECONDS = 120.0


@dataclass
class _Written:
    claim: Obj
    at: float


class Accounting:
    """The claims of ``store`` plus this controller's writes; ``on_change`` runs whenever a device
    another claim may want is taken or freed."""

    def __init__(self, store: Store, engine: Engine, clock: Callable[[], float], on_change: Callable[[], None]) -> None:
        self.store = store
        self.engine = engine
        self.clock = clock
        self.on_change = on_change
        self._lock = threading.Lock()
        self._written: dict[str, _Written] = {}
        self._version = 0
        self._held: tuple[int, AllocatedState] | None = None
        self._summing = threading.Lock()

    @property
    def version(self) -> int:
        with self._lock:
            return self._version

    def changed(self) -> None:
        """Devices were taken or freed: every pending claim may see them differently now."""
        with self._lock:
            self._version += 1
        self.on_change()

    def track(self, written: Obj) -> None:
        """An allocation this controller wrote, laid over the store until the watch brings it."""
        with self._lock:
            self._written[uid_of(written)] = _Written(written, self.clock())
        self.changed()

    def tracks(self, uid: str) -> bool:
        with self._lock:
            return uid in self._written

    def written_at(self, uid: str) -> float | None:
        with self._lock:
            w = self._written.get(uid)
        return None if w is None else w.at

    def written(self) -> list[Obj]:
        with self._lock:
            return [w.claim for w in self._written.values()]

    def forget(self, uid: str) -> None:
        with self._lock:
            gone = self._written.pop(uid, None)
        if gone is not None:
            self.changed()

    def _expire(self) -> None:
        now = self.clock()
        with self._lock:
            expired = [uid for uid, w in self._written.items() if now - w.at > LEDGER_TTL_SECONDS]
        for uid in expired:
            self.forget(uid)

    def keep(self, written: Obj, base: Obj) -> None:
        """The result of our write against ``base`` into the claims store, unless the watch brought
        something newer (:meth:`Store.put_if_unchanged`); what it changes in the devices held counts
        at once, since no informer event will say so."""
        if self.store.put_if_unchanged(written, resource_version(base)) and holdings(written) != holdings(base):
            self.changed()

    def held_by_others(self, claim: Obj) -> tuple[int | None, AllocatedState]:
        """What the other claims hold, and the holdings version when that is what every claim
        without devices of its own sees (None otherwise): computed once per version, not once per
        pending claim (a large cluster's claims take too long to add up for each one:
        docs/scale.md#the-codes-figures)."""
        self._expire()
        uid = uid_of(claim)
        with self._lock:
            own = is_allocated(claim) or uid in self._written
        if own:
            return None, self.engine.allocated_state(self.claims(), exclude_uid=uid)
        return self.held()

    def held(self) -> tuple[int, AllocatedState]:
        """What all claims hold, at the holdings version it is for: what every claim without
        devices of its own is evaluated against."""
        with self._lock:
            version = self._version
            cached = self._held
        if cached is not None and cached[0] == version:
            return version, cached[1]
        # One worker adds them up; the others, asking for the same version, wait and take its
        # sum (the workers otherwise each add them up at once, whenever a device is taken).
        with self._summing:
            with self._lock:
                version = self._version
                cached = self._held
            if cached is not None and cached[0] == version:
                return version, cached[1]
            state = self.engine.allocated_state(self.claims())
            with self._lock:
                self._held = (version, state)
        return version, state

    def claims(self, fresh: Sequence[Obj] | None = None) -> list[Obj]:
        """All claims (``fresh``, or the store's) with the controller's own recent writes laid over them."""
        base = list(fresh) if fresh is not None else self.store.values()
        self._expire()
        with self._lock:
            overlay = {uid: w.claim for uid, w in self._written.items()}
        out: list[Obj] = []
        seen: set[str] = set()
        for c in base:
            u = uid_of(c)
            seen.add(u)
            mine = overlay.get(u)
            if mine is not None and not is_allocated(c):
                out.append(mine)
            else:
                out.append(c)
        out += [c for u, c in overlay.items() if u not in seen]
        return out
