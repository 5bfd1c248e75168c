"""Leader election through a ``coordination.k8s.io/v1`` Lease.

The algorithm is the usual one (the same rules client-go follows):

* A candidate reads the Lease. It may take it when the Lease does not exist, has no holder, or
  has not changed for ``lease_duration`` seconds *as measured by the candidate's own clock since
  it last saw it change* (so clock skew between replicas does not matter). Taking and renewing
  are ``update``\\ s with the Lease's resourceVersion as precondition: of two candidates racing
  for an expired Lease, one gets ``409 Conflict``.
* The holder renews every ``retry_period`` (2 s). It considers itself leader only while its last
  successful renewal is younger than ``renew_deadline`` (10 s), which is shorter than
  ``lease_duration`` (15 s): it stops acting before anyone else may take over.
* On shutdown (SIGTERM) the holder releases the Lease (empty holder, 1 s duration) so a
  successor takes over at once instead of after 15 s.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from dra_driver import logs
from dra_driver.k8s.client import LEASES, ApiError, KubeApi
from dra_driver.k8s.fields import micro_time
from dra_driver.k8s.objects import Obj


class Leadership(Protocol):
    def is_leader(self) -> bool: ...


class AlwaysLeader:
    """Leader election disabled: this replica always acts."""

    def is_leader(self) -> bool:
        return True


@dataclass(frozen=True)
class LeaseConfig:
    namespace: str
    name: str
    identity: str
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


class LeaderElector:
    def __init__(
        self,
        api: KubeApi,
        config: LeaseConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        if not config.renew_deadline < config.lease_duration:
            raise ValueError("renew_deadline must be shorter than lease_duration")
        self.api = api
        self.config = config
        self._clock = clock
        self._wall = wall
        self._on_change = on_change
        self._lock = threading.Lock()
        self._renewed_at: float | None = None
        self._observed: tuple[str | None, str | None, Any] | None = None
        self._observed_at = 0.0
        self._lease: Obj | None = None
        self._was_leader = False
        self._log = logs.get("leader", lease=f"{config.namespace}/{config.name}", identity=config.identity)

    # -- state

    def is_leader(self) -> bool:
        with self._lock:
            return self._renewed_at is not None and self._clock() - self._renewed_at < self.config.renew_deadline

    def holder(self) -> str | None:
        with self._lock:
            if self._lease is None:
                return None
            h = (self._lease.get("spec") or {}).get("holderIdentity")
            return str(h) if h else None

    # -- one attempt

    def try_acquire_or_renew(self) -> bool:
        """One read-modify-write of the Lease; True when this replica holds it afterwards."""
        cfg = self.config
        now_wall = micro_time(self._wall())
        try:
            lease = self.api.get(LEASES, cfg.name, namespace=cfg.namespace)
        except ApiError as exc:
            if not exc.not_found:
                self._log.warning("cannot read lease", error=str(exc))
                return False
            body: Obj = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": cfg.name, "namespace": cfg.namespace},
                "spec": {
                    "holderIdentity": cfg.identity,
                    "leaseDurationSeconds": int(cfg.lease_duration),
                    "acquireTime": now_wall,
                    "renewTime": now_wall,
                    "leaseTransitions": 0,
                },
            }
            try:
                created = self.api.create(LEASES, body, namespace=cfg.namespace)
            except ApiError as exc2:
                self._log.info("lease creation lost", error=str(exc2))
                return False
            self._succeeded(created)
            return True

        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or None
        # Any write to the Lease (a renewal included) changes its resourceVersion.
        record = (holder, (lease.get("metadata") or {}).get("resourceVersion"), spec.get("renewTime"))
        now = self._clock()
        with self._lock:
            self._lease = lease
            if record != self._observed:
                self._observed = record
                self._observed_at = now
            observed_at = self._observed_at
        duration = spec.get("leaseDurationSeconds")
        duration_s = float(duration) if isinstance(duration, int | float) and duration > 0 else cfg.lease_duration
        if holder and holder != cfg.identity and now - observed_at < duration_s:
            self._failed()
            return False

        new = copy.deepcopy(lease)
        nspec = new.setdefault("spec", {})
        if holder != cfg.identity:
            nspec["acquireTime"] = now_wall
            nspec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if holder else 0)
        nspec["holderIdentity"] = cfg.identity
        nspec["leaseDurationSeconds"] = int(cfg.lease_duration)
        nspec["renewTime"] = now_wall
        try:
            updated = self.api.replace(LEASES, new)
        except ApiError as exc:
            self._log.info("lease update failed", error=str(exc))
            self._failed()
            return False
        self._succeeded(updated)
        return True

    def _succeeded(self, lease: Obj) -> None:
        spec = lease.get("spec") or {}
        with self._lock:
            self._lease = lease
            self._renewed_at = self._clock()
            self._observed = (
                spec.get("holderIdentity"),
                (lease.get("metadata") or {}).get("resourceVersion"),
                spec.get("renewTime"),
            )
            self._observed_at = self._renewed_at
        self._transition()

    def _failed(self) -> None:
        self._transition()

    def _transition(self) -> None:
        leader = self.is_leader()
        if leader != self._was_leader:
            self._was_leader = leader
            self._log.info("became leader" if leader else "lost leadership")
            if self._on_change is not None:
                try:
                    self._on_change(leader)
                except Exception:  # last resort: a callback bug must not stop the election loop
                    self._log.exception("leadership callback failed")

    def release(self) -> bool:
        """Give the Lease up if this replica holds it (on shutdown)."""
        cfg = self.config
        with self._lock:
            self._renewed_at = None
        self._transition()
        try:
            lease = self.api.get(LEASES, cfg.name, namespace=cfg.namespace)
        except ApiError:
            return False
        spec = lease.get("spec") or {}
        if spec.get("holderIdentity") != cfg.identity:
            return False
        new = copy.deepcopy(lease)
        now_wall = micro_time(self._wall())
        new["spec"] = {
            "holderIdentity": None,
            "leaseDurationSeconds": 1,
            "acquireTime": now_wall,
            "renewTime": now_wall,
            "leaseTransitions": int(spec.get("leaseTransitions") or 0),
        }
        try:
            self.api.replace(LEASES, new)
        except ApiError as exc:
            self._log.warning("lease release failed", error=str(exc))
            return False
        self._log.info("released lease")
        return True

    # -- the loop

    def run(self, stop: threading.Event) -> None:
        """Acquire, then renew every ``retry_period``, until ``stop``; then release."""
        try:
            while not stop.is_set():
                try:
                    self.try_acquire_or_renew()
                except Exception:  # last resort: ApiError, transport failures or a bug; the next period tries again
                    self._log.exception("leader election attempt failed")
                    self._transition()
                stop.wait(self.config.retry_period)
        finally:
            if self._was_leader or self.holder() == self.config.identity:
                self.release()

    def start(self, stop: threading.Event) -> threading.Thread:
        t = threading.Thread(target=self.run, args=(stop,), name="leader-election", daemon=True)
        t.start()
        return t
