"""The controller's allocation of opted-in claims behind the allocation fence.

:meth:`FencedAllocator.allocate` is the protocol (fresh reads, finalizer, ledger entries, proof
that the fence is in force, a last check, the write under a precondition); the pure parts of the
fence (keys, ledger edits, the recognition of the denial) are :mod:`dra_driver.controller.fence`.
It also verifies its allocations after the write, finalizes deleted opted-in claims and collects
stale ledger entries.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from dra_driver import logs
from dra_driver.controller import fence
from dra_driver.controller.accounting import Accounting
from dra_driver.controller.keys import OUR_ANNOTATIONS, wants_controller_allocation
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.controller.reporting import Reporter
from dra_driver.controller.verdicts import Outcome, Verdict
from dra_driver.k8s.claims import (
    annotations_of,
    device_ids,
    has_finalizer,
    is_allocated,
    is_deleting,
    reserved_for,
    status_of,
    uid_of,
    with_allocation,
    with_finalizer,
    without_finalizer,
)
from dra_driver.k8s.client import CLAIMS, CONFIGMAPS, ApiError, KubeApi
from dra_driver.k8s.events import Occurrence
from dra_driver.k8s.leader import Leadership
from dra_driver.k8s.objects import Obj, describe_node_selector, key_of, meta

ALLOCATION_SETTLE_SECONDS = 5.0
"""Delay of the second post-write check of a controller allocation (see FencedAllocator.allocate)."""
FENCE_PROBES = 15
"""Dry-run probes (5 ms doubling to 200 ms apart, about 2 s in all) before the allocation fence
counts as not installed."""
FENCE_RETRY_SECONDS = 30.0


def allocation_conflicts(
    mine: Mapping[str, Any], my_uid: str, claims: Iterable[Mapping[str, Any]]
) -> list[tuple[Mapping[str, Any], set[tuple[str, str, str]]]]:
    """Other claims holding any device of ``mine`` exclusively, with the shared devices."""
    wanted = device_ids(mine, exclusive_only=True)
    out: list[tuple[Mapping[str, Any], set[tuple[str, str, str]]]] = []
    if not wanted:
        return out
    for c in claims:
        if uid_of(c) == my_uid:
            continue
        other = device_ids(status_of(c).get("allocation"), exclusive_only=True)
        both = wanted & other
        if both:
            out.append((c, both))
    return out


def describe_devices(allocation: Mapping[str, Any] | None) -> str:
    ids = device_ids(allocation)
    return ", ".join(f"{d}/{p}/{n}" for d, p, n in sorted(ids)) or "no devices"


class FencedAllocator:
    """Allocates, verifies and finalizes opted-in claims through ``api``. ``resolve`` gives a claim's
    outcome against a fresh list of all claims; ``requeue`` looks at a claim again after a delay."""

    def __init__(
        self,
        api: KubeApi,
        *,
        driver: str,
        ledger: tuple[str, str],
        leadership: Leadership,
        metrics: ControllerMetrics,
        accounting: Accounting,
        reporter: Reporter,
        resolve: Callable[[Obj, Sequence[Obj]], Outcome],
        requeue: Callable[[Obj, float], None],
        log: logs.Logger,
        settle_seconds: float,
        sleep: Callable[[float], None],
    ) -> None:
        self.api = api
        self.driver = driver
        self.ledger_namespace, self.ledger_name = ledger
        self.leadership = leadership
        self.metrics = metrics
        self.accounting = accounting
        self.reporter = reporter
        self.resolve = resolve
        self.requeue = requeue
        self.log = log
        self.settle_seconds = settle_seconds
        self.sleep = sleep
        self._lock = threading.Lock()
        self._reserving: set[str] = set()  # claim UIDs between their ledger entry and their allocation

    def allocate(self, claim: Obj, log: logs.Logger) -> bool:
        """Allocate an opted-in claim, never racing the scheduler into a double allocation.

        1. Fresh reads: GET the claim and a consistent LIST of all claims (the informer cache may
           lag). The claim must still be unallocated and opted in. The engine resolves against
           the fresh list plus this controller's own recent writes.
        2. Finalizer ``resource.kubernetes.io/delete-protection`` is added with an ``update``
           (resourceVersion precondition) before the allocation exists.
        3. The devices go into the fence ledger and the fence is proven up (:meth:`reserve`,
           :mod:`dra_driver.controller.fence`): from then on the API server refuses any other new
           allocation of them, the kube-scheduler's included.
        4. A last consistent LIST: an allocation of one of the devices written before the fence
           came up wins; ours is dropped (ledger entries released) and the claim re-resolved.
        5. ``status.allocation`` is written under the resourceVersion precondition: if anyone
           changed the claim since step 1, the write fails with 409 and the claim is re-resolved.

        Nothing is rolled back after the write, because nothing can collide with it: the
        post-write checks (:meth:`verify_allocation`) only report the impossible. Without the
        fence (policy or binding not installed) the controller does not allocate at all and says
        so in an Event.
        """
        if not self.leadership.is_leader():
            return False
        m = meta(claim)
        ns, name = m.get("namespace"), str(m.get("name"))
        try:
            fresh_claim = self.api.get(CLAIMS, name, namespace=ns)
        except ApiError as exc:
            if exc.not_found:
                return False
            raise
        if (
            uid_of(fresh_claim) != uid_of(claim)
            or is_allocated(fresh_claim)
            or is_deleting(fresh_claim)
            or not wants_controller_allocation(fresh_claim)
        ):
            # The cache is behind; what the server said stands in until the watch catches up.
            self.accounting.keep(fresh_claim, claim)
            self.requeue(claim, 0)
            return False
        fresh = self._claims_now()
        outcome = self.resolve(fresh_claim, fresh)
        if outcome.verdict is not Verdict.SATISFIABLE or outcome.allocation is None:
            self.reporter.record(fresh_claim, outcome, log)
            return False
        allocation = outcome.allocation

        target = fresh_claim
        if not has_finalizer(target):
            try:
                target = self.api.replace(CLAIMS, with_finalizer(target))
            except ApiError as exc:
                if exc.conflict or exc.not_found:
                    log.info("claim changed while adding the finalizer; re-resolving", error=str(exc))
                    self.requeue(claim, 0.2)
                    return False
                raise
        uid = uid_of(target)
        with self._lock:
            self._reserving.add(uid)
        try:
            if not self.reserve(target, allocation, log):
                return False
            taken = allocation_conflicts(allocation, uid, self._claims_now())
            if taken:
                log.info("devices were allocated before the fence was up; re-resolving", other=key_of(taken[0][0]))
                self.release(uid)
                self.requeue(claim, 0.2)
                return False
            try:
                written = self.api.replace_status(CLAIMS, with_allocation(target, allocation))
            except ApiError as exc:
                self.release(uid)
                if exc.conflict or exc.not_found:
                    self.metrics.error("conflict")
                    log.info("claim changed before the allocation was written; re-resolving", error=str(exc))
                    self.requeue(claim, 0.2)
                    return False
                raise
            self.accounting.track(written)
            self.accounting.keep(written, fresh_claim)
        finally:
            with self._lock:
                self._reserving.discard(uid)
        self.metrics.claims_allocated.inc()
        where = describe_node_selector(allocation)
        log.info("claim allocated", devices=describe_devices(allocation), where=where)
        self.reporter.emit(written, Occurrence("Normal", "Allocated", "Allocate",
                                      f"allocated {describe_devices(allocation)} on {where}"), CLAIMS)
        if any(a in annotations_of(written) for a in OUR_ANNOTATIONS):
            try:
                self.reporter.write_annotations(written, None, log)
            except ApiError as exc:
                log.warning("cannot clear explanation after allocation", error=str(exc))
        # Immediate check, then one after the settle delay.
        self.verify_allocation(written, log, settled=False)
        self.requeue(written, self.settle_seconds)
        return True

    def _edit_ledger(self, edit: Callable[[dict[str, str]], dict[str, str] | None]) -> None:
        """Read-modify-write of the ledger ConfigMap (created when missing); ``edit`` returns the
        new data, or None to leave it. Conflicting writers are retried."""
        for _ in range(10):
            try:
                cm = self.api.get(CONFIGMAPS, self.ledger_name, namespace=self.ledger_namespace)
            except ApiError as exc:
                if not exc.not_found:
                    raise
                cm = None
            data = dict((cm or {}).get("data") or {})
            new = edit(data)
            if new is None or new == data:
                return
            try:
                if cm is None:
                    self.api.create(CONFIGMAPS, {
                        "apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": self.ledger_name, "namespace": self.ledger_namespace,
                                     "labels": {"app.kubernetes.io/managed-by": "dra-driver-controller"}},
                        "data": new}, namespace=self.ledger_namespace)  # fmt: skip
                else:
                    self.api.replace(CONFIGMAPS, {**cm, "data": new})
                return
            except ApiError as exc:
                if not (exc.conflict or exc.not_found):
                    raise
        raise ApiError(409, "Conflict", f"ConfigMap {self.ledger_namespace}/{self.ledger_name} kept changing")

    def reserve(self, claim: Obj, allocation: Mapping[str, Any], log: logs.Logger) -> bool:
        """Steps 3 of :meth:`allocate`: ledger entries for the devices, then proof that the API
        server enforces them. False (entries released, claim requeued) when it does not."""
        uid = uid_of(claim)
        devices = sorted(device_ids(allocation, exclusive_only=True))
        token = fence.new_token()
        held: list[str] = []
        full: list[int] = []  # the entries and bytes of the ledger that had no room

        def edit(data: dict[str, str]) -> dict[str, str] | None:
            held[:] = fence.conflicting_entries(data, devices, uid)
            if held:
                return None
            new = fence.with_reservation(data, devices, uid, token, self.driver)
            full[:] = [len(data), fence.ledger_bytes(data)] if fence.ledger_bytes(new) > fence.MAX_LEDGER_BYTES else []
            return None if full else new

        self._edit_ledger(edit)
        if held:
            log.info("devices are held in the fence ledger for another claim; re-resolving", keys=held)
            self.requeue(claim, 0.5)
            return False
        if full:
            self.ledger_full(claim, len(devices), full[0], full[1], log)
            return False
        sentinel = fence.sentinel_key(token, self.driver)
        probe = with_allocation(claim, fence.probe_allocation(allocation, token, self.driver))
        delay = 0.005
        for _ in range(FENCE_PROBES):
            try:
                self.api.replace_status(CLAIMS, probe, dry_run=True)
            except ApiError as exc:
                if fence.denial_names(str(exc), sentinel):
                    return True
                if not fence.is_denial(str(exc)):
                    self.release(uid)
                    if exc.conflict or exc.not_found:
                        self.requeue(claim, 0.2)
                        return False
                    raise
                # Refused for another device: admission still reads an older ledger; wait for ours.
            self.sleep(delay)
            delay = min(delay * 2, 0.2)
        self.release(uid)
        self.metrics.error("fence_inactive")
        note = ("not allocating: the allocation fence is not in force (or the API server's admission still "
                "reads an older ledger), so an allocation could collide with the kube-scheduler's. Install the "
                "allocation-fence ValidatingAdmissionPolicy (the Helm chart's <release>-allocation-fence, from "
                f"{fence.POLICY_FILE}) and a binding whose paramRef names the ConfigMap "
                f"{self.ledger_namespace}/{self.ledger_name} (the Helm chart does both)")
        log.error("allocation fence not in force",
                  ledger=f"{self.ledger_namespace}/{self.ledger_name}")
        self.reporter.emit(claim, Occurrence("Warning", "AllocationFenceMissing", "Allocate", note), CLAIMS)
        self.requeue(claim, FENCE_RETRY_SECONDS)
        return False

    def ledger_full(self, claim: Obj, devices: int, entries: int, size: int, log: logs.Logger) -> None:
        """The ledger has no room for a claim's devices: not allocated by the controller (the
        kube-scheduler still may), said in a log line, a metric and a Warning Event, and retried
        after a while, when entries of released claims may have gone."""
        ledger = f"{self.ledger_namespace}/{self.ledger_name}"
        self.metrics.error("ledger_full")
        log.error("allocation fence ledger full", ledger=ledger, entries=entries, bytes=size,
                  limit=fence.MAX_LEDGER_BYTES, devices=devices)
        note = (f"not allocating: the allocation fence ledger ConfigMap {ledger} holds {entries} entries "
                f"({size} bytes) and has no room for this claim's {devices} device(s) within "
                f"{fence.MAX_LEDGER_BYTES} bytes; the kube-scheduler may still allocate the claim for a pod, "
                "and the controller tries again as controller allocations are released")
        self.reporter.emit(claim, Occurrence("Warning", "AllocationLedgerFull", "Allocate", note), CLAIMS)
        self.requeue(claim, FENCE_RETRY_SECONDS)

    def release(self, uid: str) -> None:
        """Drop the ledger entries of claim ``uid``."""
        self._edit_ledger(lambda data: fence.without_keys(data, fence.keys_of(data, uid)))

    def collect_ledger(self) -> None:
        """Drop ledger entries whose claim no longer holds the device (deallocated, deleted)."""
        held: dict[str, set[str]] = {}
        for c in self.accounting.claims():
            if is_allocated(c):
                held[uid_of(c)] = {fence.ledger_key(*d) for d in
                                   device_ids(status_of(c).get("allocation"), exclusive_only=True)}  # fmt: skip
        with self._lock:
            busy = set(self._reserving)
        stale: list[str] = []

        def edit(data: dict[str, str]) -> dict[str, str] | None:
            stale[:] = fence.stale_keys(data, held, busy, self.driver)
            return fence.without_keys(data, stale) if stale else None

        self._edit_ledger(edit)
        if stale:
            self.log.info("released fence ledger entries", count=len(stale))

    def _claims_now(self) -> list[Obj]:
        """Every claim, a consistent read; one that cannot be decoded counts with what it holds
        (:mod:`dra_driver.k8s.quarantine`), so that its devices are never handed out twice."""
        listed = self.api.list(CLAIMS)
        # Plain dicts, whatever their shape: the allocation writes one back.
        return cast(list[Obj], [*listed.items, *(bad.view for bad in listed.undecodable)])

    def verify_allocation(self, claim: Obj, log: logs.Logger, *, settled: bool) -> bool:
        """Post-write check of a controller allocation; True when it stands.

        ``settled``: the settle delay has passed; a clean check then ends the verification.
        """
        uid = uid_of(claim)
        if not self.accounting.tracks(uid):
            return True
        fresh = self._claims_now()
        mine = next((c for c in fresh if uid_of(c) == uid), None)
        if mine is None or not is_allocated(mine):
            self.accounting.forget(uid)
            return False
        conflicts = allocation_conflicts(status_of(mine)["allocation"], uid, fresh)
        if not conflicts:
            if settled:
                self.accounting.forget(uid)
            return True
        other, devices = conflicts[0]
        shared = ", ".join("/".join(d) for d in sorted(devices))
        other_key = key_of(other)
        if reserved_for(mine):
            self.metrics.error("double_allocation")
            log.error("device allocated twice; our claim is already in use", other=other_key, devices=shared)
            note = f"device(s) {shared} are also allocated to claim {other_key}; this claim is in use, not rolled back"
            self.reporter.emit(mine, Occurrence("Warning", "DeviceConflict", "Allocate", note), CLAIMS)
            self.accounting.forget(uid)
            return False
        self.metrics.error("allocation_conflict")
        log.warning("rolling back allocation that conflicts with another claim", other=other_key, devices=shared)
        try:
            rolled = self.api.replace_status(CLAIMS, with_allocation(mine, None))
            self.accounting.keep(rolled, mine)
        except ApiError as exc:
            if not (exc.conflict or exc.not_found):
                raise
            # Changed meanwhile (maybe reserved): look again soon.
            self.requeue(claim, 0.2)
            return False
        self.accounting.forget(uid)
        self.release(uid)
        self.reporter.emit(mine, Occurrence("Warning", "AllocationRolledBack", "Allocate",
                                   f"device(s) {shared} were allocated to claim {other_key} concurrently; "
                                   "allocation withdrawn, re-resolving"), CLAIMS)
        self.requeue(claim, 0.5)
        return False

    def finalize(self, claim: Obj, log: logs.Logger) -> bool:
        """Deallocate an unreserved opted-in claim being deleted and drop the finalizer."""
        if not self.leadership.is_leader():
            return False
        target = claim
        try:
            if is_allocated(target):
                target = self.api.replace_status(CLAIMS, with_allocation(target, None))
            self.api.replace(CLAIMS, without_finalizer(target))
        except ApiError as exc:
            if exc.not_found:
                return False
            if exc.conflict:
                self.requeue(claim, 0.2)
                return False
            raise
        self.accounting.forget(uid_of(claim))
        self.release(uid_of(claim))
        log.info("deleted claim deallocated and released")
        return True
