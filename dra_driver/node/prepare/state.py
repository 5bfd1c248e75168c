"""The node plugin's driver state: NodePrepareResources / NodeUnprepareResources semantics.

Flow of :meth:`DeviceState.prepare` for one request (a batch of claims):

1. GET every ResourceClaim through the injected :class:`KubeApi`, concurrently and outside
   the lock (the API round-trip dominates; 100 claims must not take 100 round-trips).
2. Under the lock, per claim: verify the UID (else "claim was replaced"), ``status.allocation``,
   that the allocation's node selector admits this node, and for every result of this driver:
   the pool is this node, the device is known, the opaque config is valid (this driver's API or
   NVIDIA's; precedence: class before claim, later wins). Check exclusivity against every other
   live claim.
3. Checkpoint all new claims as ``PrepareStarted`` (one write) -> create dynamic MIG instances
   (checkpointed again when any were created) -> write one CDI spec per claim -> checkpoint
   ``PrepareCompleted`` (one write) -> respond.

A request for one claim (what the kubelet sends for a pod with one claim) records the claim as
``PrepareStarted`` without devices while its GET is in flight (:meth:`KubeApi.get`'s
``meanwhile``): the flush overlaps the API server's work instead of following it, and step 3 then
needs no ``PrepareStarted`` write of its own unless it creates MIG instances (whose rollback needs
the devices on disk first). Rolling back such an entry removes the claim's files by UID. If the
claim turns out not to need preparing (an error, no devices of this driver) the entry is dropped in
memory; the next save records that, and until then a crash leaves an entry whose rollback finds
nothing to remove.

A claim already ``PrepareCompleted`` answers with the stored devices; a missing CDI spec (for
example after a reboot emptied ``/var/run/cdi``) is re-written first, and dynamic MIG instances of
an earlier boot are re-created.

Recovery decision for ``PrepareStarted`` entries found at start-up: **roll back** — destroy any
dynamic MIG instance, delete the CDI spec, drop the entry. Such a claim never got a successful
answer, so no container can be using it, and the kubelet retries Prepare until it succeeds, which
then prepares it from scratch. ``PrepareCompleted`` entries are kept and their CDI specs re-written
when missing (the kubelet does not call Prepare again for claims it already has prepared).

Durability: the checkpoint is the one durable state. It is saved at ``PrepareStarted`` and at
``PrepareCompleted``, each save a journal record flushed with one ``fdatasync`` before it returns
(:mod:`dra_driver.node.prepare.checkpoint`), so the order started → CDI → completed holds on disk as well as
for other processes; an unprepare is one more record. The CDI specs and device metadata files a
claim gets in between are replaced atomically but not fsynced (``DERIVED_FILES_DURABLE``): they are
derived from the checkpoint entry, and only a power loss (or kernel crash) can lose what a killed
process wrote. A power loss always ends in a new boot ID, and on a new boot every
``PrepareCompleted`` entry is re-materialized (its specs and metadata files re-written, whatever is
at their paths, before the plugin serves), so an empty or missing file left by a power loss is
replaced before any container can use it; a ``PrepareStarted`` entry is rolled back, which deletes
them. A prepare with device metadata made ten fsyncs when every file was synced and the checkpoint
rewritten whole; it makes two.

Every failure is a per-claim error string; nothing raises out of ``prepare``/``unprepare``.

The steps live beside this module: checking a claim and applying its config
(:mod:`~dra_driver.node.prepare.plan`), exclusivity (:mod:`~dra_driver.node.prepare.exclusive`),
the claim's MIG instances and files (:mod:`~dra_driver.node.prepare.materialize`), the checkpoint's
entries (:mod:`~dra_driver.node.prepare.ledger`), reading claims (:mod:`~dra_driver.node.prepare.reading`),
the batching of concurrent calls (:mod:`~dra_driver.node.prepare.groupcommit`) and the lock that two
plugin instances of a node share, under which every batch starts from the checkpoint on disk
(:mod:`~dra_driver.node.prepare.sharedstate`). This module orders them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path

from dra_driver import failpoints, logs
from dra_driver.gpuconfig import Strategy, base_request
from dra_driver.k8s.client import ApiError, KubeApi
from dra_driver.logs import Logger
from dra_driver.node.describe.devices import AllocatableDevice
from dra_driver.node.describe.shares import DISABLED, ConsumableShares
from dra_driver.node.discovery.backend import Backend
from dra_driver.node.discovery.nvml import NvmlError
from dra_driver.node.fileio import describe_os_error
from dra_driver.node.metrics import METRICS
from dra_driver.node.prepare.calls import ClaimFailure, ClaimRef, PrepareOutcome, ResponseDevice
from dra_driver.node.prepare.cdi import CdiSpecs
from dra_driver.node.prepare.checkpoint import CheckpointStore
from dra_driver.node.prepare.entries import ClaimEntry, ClaimState, PreparedDevice, now_rfc3339
from dra_driver.node.prepare.exclusive import Hold, check_exclusive, hold_of_planned
from dra_driver.node.prepare.gpupolicy import GpuControl, NoGpuControl, TimeSlicer, gpus_of
from dra_driver.node.prepare.groupcommit import GroupCommit
from dra_driver.node.prepare.ledger import Ledger
from dra_driver.node.prepare.materialize import Materializer, creates_mig
from dra_driver.node.prepare.metadata import MetadataFiles
from dra_driver.node.prepare.mps import MpsSupervisor
from dra_driver.node.prepare.mps import gpus_of as mps_gpus_of
from dra_driver.node.prepare.plan import ClaimPlanner, Plan, verify_claim
from dra_driver.node.prepare.reading import CLAIM_READ_CONCURRENCY, ClaimReader, Fetched, read_error
from dra_driver.node.prepare.sharedstate import SharedState

_log = logs.get("prepare")

NOT_PROCESSED = "internal error: claim was not processed"


def _response_device(dev: PreparedDevice) -> ResponseDevice:
    return ResponseDevice(
        request_names=tuple(dict.fromkeys(base_request(r) for r in dev.requests)),
        pool_name=dev.pool,
        device_name=dev.device,
        cdi_device_ids=dev.cdi_device_ids,
        share_id=dev.share_id,
    )


class DeviceState:
    """Prepared claims of one node plugin; thread-safe."""

    def __init__(
        self,
        *,
        node_name: str,
        driver_name: str,
        devices: Mapping[str, AllocatableDevice],
        cdi: CdiSpecs,
        checkpoint: CheckpointStore,
        api: KubeApi,
        backend: Backend | None = None,
        proc_root: Path | None = Path("/proc"),
        max_parallel_gets: int = CLAIM_READ_CONCURRENCY,
        sharing_strategies: Iterable[str] = tuple(Strategy),
        consumable_shares: ConsumableShares = DISABLED,
        on_prepare_error: Callable[[ClaimRef, str], None] | None = None,
        metadata: MetadataFiles | None = None,
        gpu_control: GpuControl | None = None,
        mps: MpsSupervisor | None = None,
    ) -> None:
        self.node_name = node_name
        self.driver_name = driver_name
        self._devices: dict[str, AllocatableDevice] = dict(devices)
        self._on_prepare_error = on_prepare_error
        self._log = _log.bind(node=node_name)
        self._planner = ClaimPlanner(node_name, driver_name, cdi, frozenset(sharing_strategies), consumable_shares,
                                     proc_root, metadata)
        self._node = Materializer(cdi, metadata, backend, proc_root, self._log)
        self._slicer = TimeSlicer(gpu_control or NoGpuControl())
        self._mps = mps
        self._lock = threading.RLock()
        self._reader = ClaimReader(api, max_parallel_gets)
        self._ledger = Ledger(checkpoint, self._log)
        self._shared = SharedState(checkpoint.state_dir, self._ledger)
        # The prepare and unprepare rounds take the serialize lock inside their last resort, which thus
        # answers their claims whatever fails; recording ahead never raises.
        self._prepares: GroupCommit[tuple[ClaimRef, Fetched], PrepareOutcome] = GroupCommit(self._lock, self._prepare_batch)
        self._unprepares: GroupCommit[ClaimRef, str | None] = GroupCommit(self._lock, self._unprepare_batch)
        self._intents: GroupCommit[ClaimRef, bool] = GroupCommit(self._lock, self._shared.serialized(self._ledger.record_intents))
        self._recover()

    def close(self) -> None:
        self._reader.close()
        # Under the lock: a save in progress must not write to a descriptor number reused after
        # closing. A round stuck longer than this is left alone; the process is ending anyway.
        if self._lock.acquire(timeout=5):
            try:
                self._ledger.store.close()
                self._shared.close()
            finally:
                self._lock.release()

    # -- queries / updates

    @property
    def checkpoint(self) -> CheckpointStore:
        """The store; after start-up it says whether recovery had to quarantine the file."""
        return self._ledger.store

    def prepared_claims(self) -> dict[str, ClaimEntry]:
        """A snapshot of the checkpointed claims (both states), by UID, as of the last finished batch;
        not the claims other calls have recorded ahead while reading them (see the module docstring).

        Without the lock: a call answered by one batch must not wait for the next batch (which holds
        the lock for its durable writes) to read what its own batch did.
        """
        return self._ledger.published()

    def refresh(self) -> None:
        """Make :meth:`prepared_claims` include what other plugin instances saved meanwhile."""
        with self._lock, self._shared.current():
            self._ledger.publish()

    def _claim_log(self, uid: str, ref: str) -> Logger:
        return self._log.bind(claim_uid=uid, claim=ref)

    # -- recovery

    def _recover(self) -> None:
        with self._lock, self._shared.lock.held():
            self._ledger.load()
            boot = self._ledger.store.boot_id
            changed = False
            rolled_back: list[ClaimEntry] = []
            for uid, entry in list(self._ledger.entries.items()):
                log = self._claim_log(uid, entry.ref)
                if entry.state is ClaimState.PREPARE_STARTED:
                    try:
                        self._node.rollback(entry, self._devices)
                        log.warning("rolled back a claim whose preparation was interrupted")
                    except Exception as exc:  # last resort: one claim must not stop the plugin's start
                        log.error("rolling back an interrupted preparation failed", error=str(exc))
                    rolled_back.append(self._ledger.entries.pop(uid))
                    changed = True
                    continue
                try:
                    self._ledger.entries[uid], done = self._node.renew(entry, boot, self._devices)
                    changed = changed or self._ledger.entries[uid] is not entry
                    if done:
                        log.info(done)
                except Exception as exc:  # last resort: one claim must not stop the plugin's start
                    log.error("could not re-create the CDI spec of a prepared claim", error=str(exc))
            if changed:
                self._ledger.save_quietly()
            self._recover_time_slices(rolled_back)
            self._recover_mps()
            leftovers = self._ledger.store.remove_stale_temp_files() + self._node.remove_temp_files()
            if leftovers:
                self._log.info("removed temporary files of writes interrupted by a crash", files=leftovers)
            orphans = self._node.orphans(self._ledger.entries)
            if orphans:
                # Kept: a container of such a claim may still be (re)created from it. The kubelet's
                # Unprepare of an unknown claim removes the spec.
                self._log.warning("CDI specs without a checkpoint entry", claim_uids=orphans)
            self._log.info("recovered prepared claims", claims=len(self._ledger.entries),
                           rebooted=self._ledger.store.rebooted)
            self._ledger.publish()

    def _recover_time_slices(self, rolled_back: list[ClaimEntry]) -> None:
        """The GPUs' intervals as the checkpoint says: reset where only a rolled-back claim (or an
        unprepare cut short after it removed its entry) left one, set again for prepared claims."""
        live = list(self._ledger.entries.values())
        try:
            for change in self._slicer.reset(rolled_back, live):
                self._log.info("reset the time-slice of a GPU no prepared claim time-slices", gpu=change.gpu_uuid)
            for change in self._slicer.reapply(live):
                self._log.debug("time-slice of a prepared claim's GPU set again", gpu=change.gpu_uuid,
                                interval=change.interval.value)
        except ClaimFailure as exc:  # the plugin serves anyway; each claim's prepare reports its own
            self._log.error("could not restore the GPUs' time-slices at start-up", error=str(exc))

    def _recover_mps(self) -> None:
        """Adopt the daemons prepared claims use, start the dead ones again, stop the others."""
        if self._mps is None:
            return
        done = self._mps.reconcile(self._ledger.entries.values())
        for gpu, what in done.done.items():
            self._log.info(f"MPS control daemon {what} at start-up", gpu=gpu)
        for gpu in done.stopped:
            self._log.info("stopped an MPS control daemon no prepared claim uses", gpu=gpu)
        for gpu, error in done.errors.items():
            self._log.error("could not start the MPS control daemon of a prepared claim's GPU", gpu=gpu, error=error)

    @property
    def runs_mps(self) -> bool:
        return self._mps is not None

    def dead_mps(self) -> list[str]:
        """The GPUs whose MPS control daemon a prepared claim uses and that does not answer."""
        if self._mps is None:
            return []
        with self._lock, self._shared.current():
            return self._mps.dead(self._ledger.entries.values())

    def restart_mps(self) -> dict[str, str]:
        """Start again the daemons of prepared claims that died; GPU -> the error of one that could
        not be started."""
        if self._mps is None:
            return {}
        with self._lock, self._shared.current():
            done = self._mps.reconcile(self._ledger.entries.values())
        for gpu, what in done.done.items():
            if what == "started":
                self._log.warning("started again the MPS control daemon of a GPU that prepared claims use", gpu=gpu)
        for gpu, error in done.errors.items():
            self._log.error("cannot start the MPS control daemon of a GPU that prepared claims use", gpu=gpu,
                            error=error)
        return done.errors

    # -- prepare

    def prepare(self, claims: Iterable[ClaimRef]) -> dict[str, PrepareOutcome]:
        """Prepare a batch of claims, each UID once (the gRPC service drops the kubelet's repeats); an
        outcome for every claim, never an exception."""
        unique = {claim.uid: claim for claim in claims}
        if not unique:
            return {}
        started = time.perf_counter()
        fetched = self._reader.read(list(unique.values()), lambda one: self._intents.run({one.uid: one}))
        outcomes = self._prepares.run({uid: (ref, fetched[uid]) for uid, ref in unique.items()})
        for uid in unique:
            outcomes.setdefault(uid, PrepareOutcome(error=NOT_PROCESSED))
        METRICS.observe_claims(METRICS.prepare_seconds, time.perf_counter() - started,
                               [outcomes[uid].error for uid in unique])
        if self._on_prepare_error is not None:
            for uid, ref in unique.items():
                error = outcomes[uid].error
                if error is not None:
                    self._on_prepare_error(ref, error)
        return outcomes

    def _prepare_batch(self, items: dict[str, tuple[ClaimRef, Fetched]]) -> dict[str, PrepareOutcome]:
        outcomes: dict[str, PrepareOutcome] = {}
        try:
            with self._shared.current():
                self._prepare_locked({uid: ref for uid, (ref, _) in items.items()},
                                     {uid: obj for uid, (_, obj) in items.items()}, outcomes)
        except Exception as exc:  # last resort: a round answers every call it serves, and ends published
            self._log.exception("unexpected error while preparing claims")
            for uid in items:
                outcomes.setdefault(uid, PrepareOutcome(error=f"internal error preparing the claim: {exc}"))
        self._ledger.publish()
        return outcomes

    def _prepare_locked(
        self,
        claims: Mapping[str, ClaimRef],
        fetched: Mapping[str, Fetched],
        outcomes: dict[str, PrepareOutcome],
    ) -> None:
        plans: list[Plan] = []
        rematerialized = False
        batch_holds: list[Hold] = []
        for uid, claim in claims.items():
            log = self._claim_log(uid, claim.ref)
            try:
                obj = fetched[uid]
                if isinstance(obj, ApiError) and obj.not_found:
                    raise ClaimFailure(f"ResourceClaim {claim.ref} not found")
                existing = self._ledger.entries.get(uid)
                if existing is not None and existing.state is ClaimState.PREPARE_COMPLETED:
                    outcomes[uid], again = self._answer_prepared(claim, existing, obj, log)
                    rematerialized = rematerialized or again
                    continue
                if isinstance(obj, BaseException):
                    raise ClaimFailure(f"could not get ResourceClaim {claim.ref}: {read_error(obj)}")
                verify_claim(claim, obj, self.node_name)
                plan = self._planner.plan(claim, obj, self._devices)
                holds = [hold_of_planned(uid, claim.ref, d) for d in plan.devices]
                check_exclusive(holds, batch_holds, self._ledger.entries.values(), self._devices)
                batch_holds.extend(holds)
                if not plan.devices:
                    outcomes[uid] = PrepareOutcome()
                    log.info("claim has no devices of this driver")
                    continue
                plans.append(plan)
            except ClaimFailure as exc:
                outcomes[uid] = PrepareOutcome(error=str(exc))
                log.warning("cannot prepare claim", error=str(exc))
            except Exception as exc:  # last resort: a bug in one claim's checks must not fail its batch-mates
                outcomes[uid] = PrepareOutcome(error=f"internal error preparing the claim: {exc}")
                log.exception("unexpected error while preparing claim")
        if rematerialized and not plans:
            self._ledger.save_quietly()
        if plans:
            self._execute(plans, outcomes)
        for uid in claims:
            self._ledger.drop_intent(uid)

    def _answer_prepared(self, claim: ClaimRef, entry: ClaimEntry, obj: Fetched,
                         log: Logger) -> tuple[PrepareOutcome, bool]:
        """A claim prepared before gets the stored devices, its files re-made when they are missing;
        also whether they were."""
        if isinstance(obj, BaseException):
            # API server unreachable, but this UID was prepared and checked earlier: the kubelet
            # (restarted during an outage) gets the same answer as before instead of a pod that
            # cannot start until the API server is back.
            log.warning("could not get the ResourceClaim; answering from the checkpoint", error=read_error(obj))
        else:
            verify_claim(claim, obj, self.node_name)
        renewed, done = self._node.renew(entry, self._ledger.store.boot_id, self._devices)
        again = renewed is not entry
        if again:
            self._ledger.entries[claim.uid] = entry = renewed
        if done:
            log.info(done, already_prepared=True)
        log.debug("claim already prepared")
        return PrepareOutcome(devices=tuple(_response_device(d) for d in entry.devices)), again

    def _execute(self, plans: list[Plan], outcomes: dict[str, PrepareOutcome]) -> None:
        boot = self._ledger.store.boot_id
        for plan in plans:
            c = plan.claim
            self._ledger.entries[c.uid] = ClaimEntry(
                uid=c.uid, namespace=c.namespace, name=c.name, state=ClaimState.PREPARE_STARTED,
                devices=tuple(d.prepared for d in plan.devices), boot_id=boot, updated=now_rfc3339(),
                pod_claim_name=plan.pod_claim_name, prepared_by=self._ledger.store.instance,
            )
        # Recorded ahead without devices: a rollback removes their files by UID, so only MIG instances,
        # whose rollback needs the devices, need this entry on disk before they are created.
        # So do time-sliced GPUs: the entry says which interval was set, read again after a crash.
        if any(p.claim.uid not in self._ledger.intended or any(creates_mig(d.device, d.prepared) for d in p.devices)
               or gpus_of(self._ledger.entries[p.claim.uid]) or mps_gpus_of(self._ledger.entries[p.claim.uid])
               for p in plans):
            error = self._ledger.save()
            if error is not None:
                for plan in plans:
                    del self._ledger.entries[plan.claim.uid]
                    outcomes[plan.claim.uid] = PrepareOutcome(error=error)
                    self._claim_log(plan.claim.uid, plan.claim.ref).error("cannot prepare claim", error=error)
                return
        failpoints.hit("prepare.after-started")
        live = self._create_migs(plans, outcomes)
        if live is None:
            return
        written: list[Plan] = []
        for plan in live:
            c = plan.claim
            try:
                entry = self._ledger.entries[c.uid]
                self._set_time_slices(entry)
                self._start_mps(entry)
                self._node.write(entry, self._devices)
                failpoints.hit("prepare.after-cdi-write")
                self._ledger.entries[c.uid] = replace(entry, state=ClaimState.PREPARE_COMPLETED, updated=now_rfc3339())
                written.append(plan)
            except Exception as exc:  # what writing raises (ClaimFailure, OSError) or a bug: _fail tells them apart
                self._fail(plan, exc, outcomes)
        error = self._ledger.save()
        if error is not None:
            for plan in written:
                self._fail(plan, ClaimFailure(error), outcomes)
            self._ledger.save_quietly()
            return
        failpoints.hit("prepare.after-completed")
        for plan in written:
            entry = self._ledger.entries[plan.claim.uid]
            outcomes[plan.claim.uid] = PrepareOutcome(devices=tuple(_response_device(d) for d in entry.devices))
            self._claim_log(plan.claim.uid, plan.claim.ref).info(
                "prepared claim", devices=[d.device for d in entry.devices],
                cdi_device_ids=[i for d in entry.devices for i in d.cdi_device_ids],
            )

    def _create_migs(self, plans: list[Plan], outcomes: dict[str, PrepareOutcome]) -> list[Plan] | None:
        """The plans whose dynamic MIG instances now exist (the others have failed), recorded when any
        were created; None when that record could not be written (all have failed)."""
        live: list[Plan] = []
        created = False
        for plan in plans:
            uid = plan.claim.uid
            try:
                entry = self._ledger.entries[uid]
                devices = list(entry.devices)
                for i, dev in enumerate(devices):
                    known = self._devices.get(dev.device)
                    if known is not None and creates_mig(known, dev):
                        devices[i] = self._node.with_new_mig(dev, known)
                        created = True
                        self._ledger.entries[uid] = replace(entry, devices=tuple(devices))
                live.append(plan)
            except Exception as exc:  # what writing raises (ClaimFailure, OSError) or a bug: _fail tells them apart
                self._fail(plan, exc, outcomes)
        error = self._ledger.save() if created else None
        if error is not None:
            for plan in live:
                self._fail(plan, ClaimFailure(error), outcomes)
            return None
        return live

    def _set_time_slices(self, entry: ClaimEntry) -> None:
        # Against the claims whose interval is set: those prepared, this batch's earlier ones included
        # (a later one in the batch is PrepareStarted, like this one, and sets nothing yet).
        changes = self._slicer.set_for(entry, [e for e in self._ledger.entries.values()
                                               if e.state is ClaimState.PREPARE_COMPLETED])
        if changes:
            self._claim_log(entry.uid, entry.ref).info(
                "set the time-slice of the claim's GPUs", gpus=[c.gpu_uuid for c in changes],
                interval=changes[0].interval.value)
            failpoints.hit("prepare.after-time-slice")

    def _start_mps(self, entry: ClaimEntry) -> None:
        if self._mps is None or not mps_gpus_of(entry):
            return
        done = self._mps.start_for(entry, self._ledger.entries.values())
        self._claim_log(entry.uid, entry.ref).info("MPS control daemons of the claim's GPUs ready", daemons=done)
        failpoints.hit("prepare.after-mps-start")

    def _stop_mps(self, entry: ClaimEntry, log: Logger) -> None:
        if self._mps is None:
            return
        stopped = self._mps.stop_for([entry], self._ledger.entries.values())
        if stopped:
            log.info("stopped the MPS control daemons no other claim uses", gpus=stopped)
            failpoints.hit("unprepare.after-mps-stop")

    def _reset_time_slices(self, entry: ClaimEntry, log: Logger) -> None:
        changes = self._slicer.reset([entry], self._ledger.entries.values())
        if changes:
            log.info("reset the time-slice of GPUs no other claim time-slices", gpus=[c.gpu_uuid for c in changes])
            failpoints.hit("unprepare.after-time-slice")

    def _fail(self, plan: Plan, exc: BaseException, outcomes: dict[str, PrepareOutcome]) -> None:
        c = plan.claim
        log = self._claim_log(c.uid, c.ref)
        if isinstance(exc, ClaimFailure | NvmlError):  # NVML's say which call failed and why
            msg = str(exc)
            log.error("cannot prepare claim", error=msg)
        elif isinstance(exc, OSError):
            msg = describe_os_error(exc, "prepared state")
            log.error("cannot prepare claim", error=msg)
        else:
            msg = f"internal error preparing the claim: {exc}"
            log.exception("unexpected error while preparing claim")
        entry = self._ledger.entries.pop(c.uid, None)
        if entry is not None:
            try:
                self._node.rollback(entry, self._devices)
                self._reset_time_slices(entry, log)
                self._stop_mps(entry, log)
            except Exception as rb:  # last resort: the claim's answer is its failure, not the rollback's
                log.error("rollback after a failed preparation was incomplete", error=str(rb))
        outcomes[c.uid] = PrepareOutcome(error=msg)

    # -- unprepare

    def unprepare(self, claims: Iterable[ClaimRef]) -> dict[str, str | None]:
        """Unprepare a batch, each UID once; ``None`` = success (also for a claim that was never
        prepared). An answer for every claim, never an exception."""
        unique = {claim.uid: claim for claim in claims}
        if not unique:
            return {}
        started = time.perf_counter()
        out = self._unprepares.run(unique)
        for uid in unique:
            out.setdefault(uid, NOT_PROCESSED)
        METRICS.observe_claims(METRICS.unprepare_seconds, time.perf_counter() - started, [out[uid] for uid in unique])
        return out

    def _unprepare_batch(self, claims: dict[str, ClaimRef]) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        try:
            with self._shared.current():
                self._unprepare_locked(claims, out)
        except Exception as exc:  # last resort: a round answers every call it serves, and ends published
            self._log.exception("unexpected error while unpreparing claims")
            for uid in claims:
                out.setdefault(uid, f"internal error unpreparing the claim: {exc}")
        self._ledger.publish()
        return out

    def _unprepare_locked(self, claims: Mapping[str, ClaimRef], out: dict[str, str | None]) -> None:
        removed: dict[str, ClaimEntry] = {}
        for uid, claim in claims.items():
            log = self._claim_log(uid, claim.ref)
            entry = self._ledger.entries.get(uid)
            try:
                if entry is None:
                    for what in self._node.remove_unknown(uid):
                        log.info(what)
                    out[uid] = None
                    log.debug("claim not prepared; nothing to do")
                    continue
                self._node.rollback(entry, self._devices)
                failpoints.hit("unprepare.after-spec-delete")
                removed[uid] = self._ledger.entries.pop(uid)
                try:
                    self._reset_time_slices(entry, log)
                    self._stop_mps(entry, log)
                except ClaimFailure:
                    # Kept, like a failed save: the kubelet's retry resets the GPU; a restart meanwhile
                    # sets the interval again for the claim still recorded.
                    self._ledger.entries[uid] = removed.pop(uid)
                    raise
                self._ledger.intended.discard(uid)  # a prepare still running for it must write its own record
                out[uid] = None
            except ClaimFailure as exc:  # rollback gathers every failure (NVML's included) into one
                out[uid] = f"unpreparing claim {claim.ref}: {exc}"
                log.error("cannot unprepare claim", error=str(exc))
            except Exception as exc:  # last resort: a bug in one claim must not fail its batch-mates
                out[uid] = f"internal error unpreparing claim {claim.ref}: {exc}"
                log.exception("unexpected error while unpreparing claim")
        error = self._ledger.save() if removed else None
        if error is not None:
            for uid, entry in removed.items():
                # Keep the entry so that the kubelet's retry repeats the (idempotent) cleanup.
                self._ledger.entries[uid] = entry
                out[uid] = error
                self._claim_log(uid, entry.ref).error("cannot unprepare claim", error=error)
            return
        failpoints.hit("unprepare.after-checkpoint")
        for uid, entry in removed.items():
            self._claim_log(uid, entry.ref).info("unprepared claim", devices=[d.device for d in entry.devices])
