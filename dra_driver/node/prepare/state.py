"""The node plugin's driver state: NodePrepareResources / NodeUnprepareResources semantics.

Flow of :meth:`DeviceState.prepare` for one request (a batch of claims):

1. GET every ResourceClaim through the injected :class:`KubeApi`, concurrently and outside
   the lock (the API round-trip dominates; 100 claims must not take 100 round-trips).
2. Under the lock, per claim: verify the UID (else "claim was replaced"), ``status.allocation``,
   that the allocation's node selector admits this node, and for every result of this driver:
   the pool is this node, the device is known, the opaque config is valid (precedence:
   class before claim, later wins). Check exclusivity against every other live claim.
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

Durability: the checkpoint is the one durable record. It is saved at ``PrepareStarted`` and at
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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, TypeVar

from dra_driver import failpoints, logs
from dra_driver.gpuconfig import (
    EXCLUSIVE,
    ConfigError,
    SharingConfig,
    Strategy,
    base_request,
    decode_sharing,
    resolve_sharing,
)
from dra_driver.k8s.client import CLAIMS, ApiError, KubeApi
from dra_driver.k8s.objects import Node, as_mapping, selector_matches
from dra_driver.k8s.quantity import format_canonical
from dra_driver.node.describe.devices import AllocatableDevice, device_totals
from dra_driver.node.describe.shares import (
    DISABLED,
    ConsumableShares,
    ShareAmounts,
    ShareError,
    coexistence_problem,
    mps_for_share,
    share_amounts,
)
from dra_driver.node.discovery.backend import Backend
from dra_driver.node.discovery.model import MigDevice
from dra_driver.node.discovery.nvml import NvmlError
from dra_driver.node.discovery.sysfs import read_mig_cap_minors
from dra_driver.node.fileio import describe_os_error
from dra_driver.node.metrics import METRICS
from dra_driver.node.prepare.cdi import CdiError, CdiSpecs, ClaimDevice, validate_claim_uid, validate_share_id
from dra_driver.node.prepare.checkpoint import (
    CheckpointStore,
    ClaimEntry,
    ClaimState,
    PreparedDevice,
    now_rfc3339,
)
from dra_driver.node.prepare.metadata import MetadataClaim, MetadataFiles, pod_claim_name
from dra_driver.node.prepare.records import ClaimRef, PrepareOutcome, ResponseDevice
from dra_driver.node.prepare.toolkit import DriverEditsError

_log = logs.get("prepare")


# --- reading claims ---------------------------------------------------------------------------


CLAIM_READ_CONCURRENCY = 32
NOT_PROCESSED = "internal error: claim was not processed"
"""Claims of one NodePrepareResources batch read in parallel; the API client's pool matches it."""


def _by_uid(claims: Iterable[ClaimRef]) -> dict[str, ClaimRef]:
    """A batch with each UID once; the kubelet may repeat a claim, and the first mention wins."""
    unique: dict[str, ClaimRef] = {}
    for claim in claims:
        unique.setdefault(claim.uid, claim)
    return unique


def _read_error(exc: BaseException) -> str:
    """How a failed claim read is reported to the kubelet: the server's answer marked as such, or the
    transport failure as it is."""
    return f"API server: {exc}" if isinstance(exc, ApiError) and exc.status else str(exc)


# --- results ----------------------------------------------------------------------------------


class ClaimFailure(Exception):
    """A per-claim failure whose message goes to the kubelet as is."""


# --- exclusivity ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Hold:
    """A claim's use of a piece of hardware."""

    uid: str
    ref: str
    device: str
    gpu_uuid: str
    kind: str
    placement: tuple[int, int] | None
    sharing: SharingConfig
    admin: bool
    share_id: str | None
    memory_bytes: int | None = None
    """A share's consumed memory."""

    def overlaps(self, other: _Hold) -> bool:
        if self.gpu_uuid != other.gpu_uuid:
            return False
        if self.device == other.device or self.kind == "gpu" or other.kind == "gpu":
            return True
        if self.placement is None or other.placement is None:
            return False
        a0, an = self.placement
        b0, bn = other.placement
        return a0 < b0 + bn and b0 < a0 + an

    def conflict(self, other: _Hold) -> str | None:
        """Why the two cannot hold overlapping hardware at once; None when they can."""
        if self.admin or other.admin:
            return None  # admin access never takes exclusive ownership
        if self.share_id and other.share_id and self.device != other.device:
            # Shares are handed out per device; one GPU's device and a device inside it (a MIG
            # slice) are never both shared, so this pair is a stale allocation.
            return "shares of different devices on one GPU cannot be used at once"
        return coexistence_problem(self.sharing, bool(self.share_id), other.sharing, bool(other.share_id))

    def describe(self) -> str:
        if not self.share_id:
            return f"with sharing {self.sharing.describe()}"
        config = "" if self.sharing.strategy is Strategy.EXCLUSIVE else f" with sharing {self.sharing.describe()}"
        return f"as share {self.share_id}{config}"


def _hold_of_prepared(entry: ClaimEntry, dev: PreparedDevice) -> _Hold:
    try:
        sharing = decode_sharing(dev.sharing)
    except ConfigError:
        sharing = EXCLUSIVE
    return _Hold(entry.uid, entry.ref, dev.device, dev.gpu_uuid, dev.kind, dev.placement, sharing,
                 dev.admin_access, dev.share_id, dev.memory_share_bytes)


def _placement_of(device: AllocatableDevice) -> tuple[int, int] | None:
    if device.mig is not None:
        return (device.mig.placement.start, device.mig.placement.size)
    if device.placement is not None:
        return (device.placement.start, device.placement.size)
    return None


# --- plans ------------------------------------------------------------------------------------


@dataclass
class _PlannedDevice:
    result_request: str
    device: AllocatableDevice
    sharing: SharingConfig
    admin: bool
    share_id: str | None
    prepared: PreparedDevice


@dataclass
class _Plan:
    claim: ClaimRef
    devices: list[_PlannedDevice]
    pod_claim_name: str | None = None


def _nested(obj: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _mig_to_create(device: AllocatableDevice, prepared: PreparedDevice) -> bool:
    """Whether preparing ``prepared`` creates a dynamic MIG instance (whose record must be on disk first)."""
    return device.mig_profile is not None and prepared.mig_instance is None


def _response_device(dev: PreparedDevice) -> ResponseDevice:
    return ResponseDevice(
        request_names=tuple(dict.fromkeys(base_request(r) for r in dev.requests)),
        pool_name=dev.pool,
        device_name=dev.device,
        cdi_device_ids=dev.cdi_device_ids,
        share_id=dev.share_id,
    )


# --- group commit ---

_In = TypeVar("_In")
_Out = TypeVar("_Out")


@dataclass
class _Ticket(Generic[_In, _Out]):
    items: dict[str, _In]
    results: dict[str, _Out] = field(default_factory=dict)
    done: bool = False


class _GroupCommit(Generic[_In, _Out]):
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


# --- the state --------------------------------------------------------------------------------


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
    ) -> None:
        self.node_name = node_name
        self.driver_name = driver_name
        self._devices: dict[str, AllocatableDevice] = dict(devices)
        self._cdi = cdi
        self._checkpoint = checkpoint
        self._api = api
        self._backend = backend
        self._proc_root = proc_root
        self._strategies = frozenset(sharing_strategies)
        self._shares = consumable_shares
        self._on_prepare_error = on_prepare_error
        self._metadata = metadata
        self._lock = threading.RLock()
        self._pool = ThreadPoolExecutor(max_workers=max(1, max_parallel_gets), thread_name_prefix="claim-get")
        self._prepares: _GroupCommit[tuple[ClaimRef, dict[str, Any] | BaseException], PrepareOutcome] = (
            _GroupCommit(self._lock, self._prepare_batch))
        self._unprepares: _GroupCommit[ClaimRef, str | None] = _GroupCommit(self._lock, self._unprepare_batch)
        self._intents: _GroupCommit[ClaimRef, bool] = _GroupCommit(self._lock, self._intent_batch)
        self._intended: set[str] = set()
        """UIDs whose ``PrepareStarted`` entry without devices is on disk (see the module docstring)."""
        self._log = _log.bind(node=node_name)
        self._entries: dict[str, ClaimEntry] = {}
        self._published: dict[str, ClaimEntry] = {}
        self._recover()

    @classmethod
    def from_settings(
        cls,
        settings: Any,
        devices: Mapping[str, AllocatableDevice],
        api: KubeApi,
        backend: Backend | None = None,
        driver_edits: Callable[[], dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> DeviceState:
        """Build from :class:`dra_driver.node.settings.PluginSettings`."""
        return cls(
            node_name=settings.node_name,
            driver_name=settings.driver_name,
            devices=devices,
            cdi=CdiSpecs(settings.cdi_root, settings.driver_name, settings.dev_root, node_name=settings.node_name,
                         driver_edits=driver_edits),
            checkpoint=CheckpointStore(settings.state_dir, settings.node_name, settings.driver_name,
                                       boot_id_path=settings.boot_id_path),
            api=api,
            backend=backend,
            sharing_strategies=settings.sharing_strategies,
            consumable_shares=settings.consumable_shares,
            metadata=MetadataFiles(settings.state_dir, settings.cdi_root, settings.driver_name,
                                   enabled=settings.device_metadata),
            **kwargs,
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        # Under the lock: a save in progress must not write to a descriptor number reused after
        # closing. A round stuck longer than this is left alone; the process is ending anyway.
        if self._lock.acquire(timeout=5):
            try:
                self._checkpoint.close()
            finally:
                self._lock.release()

    # -- queries / updates

    def set_devices(self, devices: Mapping[str, AllocatableDevice]) -> None:
        """Replace the node's allocatable devices (prepared claims are not touched)."""
        with self._lock:
            self._devices = dict(devices)

    @property
    def checkpoint(self) -> CheckpointStore:
        """The store; after start-up it says whether recovery had to quarantine the file."""
        return self._checkpoint

    def prepared_claims(self) -> dict[str, ClaimEntry]:
        """A snapshot of the checkpointed claims (both states), by UID, as of the last finished batch;
        not the claims other calls have recorded ahead while reading them (see the module docstring).

        Without the lock: a call answered by one batch must not wait for the next batch (which holds
        the lock for its durable writes) to read what its own batch did.
        """
        return dict(self._published)

    def _publish(self) -> None:
        """End of a batch (the lock is held): the state that :meth:`prepared_claims` reads from now on."""
        # replaced, never changed: readers need no lock
        self._published = {uid: e for uid, e in self._entries.items() if uid not in self._intended}
        METRICS.prepared_claims.set(len(self._published))

    def _claim_log(self, uid: str, ref: str) -> Any:
        return self._log.bind(claim_uid=uid, claim=ref)

    # -- recovery

    def _recover(self) -> None:
        with self._lock:
            self._entries = self._checkpoint.load()
            changed = False
            for uid, entry in list(self._entries.items()):
                log = self._claim_log(uid, entry.ref)
                if entry.state is ClaimState.PREPARE_STARTED:
                    try:
                        self._rollback(entry)
                        log.warning("rolled back a claim whose preparation was interrupted")
                    except Exception as exc:
                        log.error("rolling back an interrupted preparation failed", error=str(exc))
                    del self._entries[uid]
                    changed = True
                    continue
                if self._needs_rematerialize(entry):
                    try:
                        self._entries[uid] = self._rematerialize(entry)
                        changed = True
                        log.info("re-created the CDI spec of a prepared claim")
                    except Exception as exc:
                        log.error("could not re-create the CDI spec of a prepared claim", error=str(exc))
            if changed:
                self._save_quietly()
            leftovers = self._checkpoint.remove_stale_temp_files() + self._cdi.remove_stale_temp_files()
            if self._metadata is not None:
                leftovers += self._metadata.remove_stale_temp_files()
            if leftovers:
                self._log.info("removed temporary files of writes interrupted by a crash", files=leftovers)
            try:
                orphans = sorted(set(self._cdi.list_claim_specs()).union(
                    self._metadata.claims() if self._metadata is not None else ()) - set(self._entries))
            except OSError:
                orphans = []
            if orphans:
                # Kept: a container of such a claim may still be (re)created from it. The kubelet's
                # Unprepare of an unknown claim removes the spec.
                self._log.warning("CDI specs without a checkpoint entry", claim_uids=orphans)
            self._log.info("recovered prepared claims", claims=len(self._entries),
                           rebooted=self._checkpoint.rebooted)
            self._publish()

    def _save_quietly(self) -> None:
        try:
            self._checkpoint.save(self._entries)
        except OSError as exc:
            self._log.error("could not write the checkpoint", error=describe_os_error(exc, str(self._checkpoint.path)))

    # -- dynamic MIG

    def _destroy_mig(self, inst: MigDevice) -> None:
        if self._backend is None:
            raise ClaimFailure(f"cannot destroy MIG instance {inst.uuid}: no GPU backend")
        self._backend.destroy_mig_instance(inst)

    def _create_mig(self, device: AllocatableDevice) -> MigDevice:
        if self._backend is None:
            raise ClaimFailure(f"device {device.name} needs a MIG instance but there is no GPU backend")
        if device.mig_profile is None or device.placement is None:
            raise ClaimFailure(f"device {device.name} has no MIG profile/placement")
        return self._backend.create_mig_instance(device.gpu, device.mig_profile, device.placement)

    def _with_mig(self, dev: PreparedDevice, inst: MigDevice) -> PreparedDevice:
        caps = read_mig_cap_minors(dev.gpu_minor, inst.gpu_instance_id, inst.compute_instance_id, self._proc_root)
        return replace(dev, mig_instance=inst, uuid=inst.uuid, mig_caps=caps)

    def _rollback(self, entry: ClaimEntry) -> None:
        """Undo whatever a (partial) preparation did: MIG instances, CDI spec."""
        errors: list[str] = []
        for dev in entry.devices:
            inst = dev.mig_instance
            if inst is None and dev.kind == "mig" and self._backend is not None:
                # Interrupted between creating the instance and recording it: creation is
                # idempotent, so this finds the instance (or makes one) to destroy.
                known = self._devices.get(dev.device)
                if known is not None and known.mig_profile is not None:
                    try:
                        inst = self._create_mig(known)
                    except Exception as exc:
                        errors.append(f"{dev.device}: {exc}")
            if inst is not None:
                try:
                    self._destroy_mig(inst)
                except Exception as exc:
                    errors.append(f"destroying MIG instance {inst.uuid} of {dev.device}: {exc}")
        try:
            self._cdi.delete_claim_spec(entry.uid)
        except (OSError, CdiError) as exc:
            errors.append(f"deleting CDI spec: {exc}")
        if self._metadata is not None:
            try:
                if entry.devices:
                    self._metadata.remove_handed_out(entry.uid, entry.devices)
                else:  # recorded before its devices were known (see the module docstring)
                    self._metadata.remove(entry.uid)
            except (OSError, CdiError) as exc:
                errors.append(f"deleting device metadata: {exc}")
        if errors:
            raise ClaimFailure("; ".join(errors))

    # -- re-materializing a completed claim

    def _needs_rematerialize(self, entry: ClaimEntry) -> bool:
        if not entry.devices:
            return False
        rebooted = bool(entry.boot_id and self._checkpoint.boot_id and entry.boot_id != self._checkpoint.boot_id)
        try:
            return (rebooted or not self._cdi.spec_exists(entry.uid)
                    or (self._metadata is not None and not self._metadata.complete(entry.uid, entry.devices)))
        except CdiError:
            return False

    def _rematerialize(self, entry: ClaimEntry) -> ClaimEntry:
        """Re-create what a reboot wiped: dynamic MIG instances (new boot) and the CDI spec."""
        rebooted = bool(entry.boot_id and self._checkpoint.boot_id and entry.boot_id != self._checkpoint.boot_id)
        devices = list(entry.devices)
        if rebooted:
            for i, dev in enumerate(devices):
                if dev.mig_instance is not None:
                    known = self._devices.get(dev.device)
                    if known is None:
                        raise ClaimFailure(f"dynamic MIG device {dev.device} is no longer published on this node")
                    devices[i] = self._with_mig(dev, self._create_mig(known))
        self._write_spec(entry.uid, entry.namespace, entry.name, devices, entry.pod_claim_name)
        return replace(entry, devices=tuple(devices), boot_id=self._checkpoint.boot_id, updated=now_rfc3339())

    def _write_spec(self, uid: str, namespace: str, name: str, devices: Sequence[PreparedDevice],
                    pod_claim: str | None = None) -> None:
        try:
            self._cdi.require_driver()
        except DriverEditsError as exc:
            raise ClaimFailure(str(exc)) from None
        if self._metadata is not None:
            self._write_metadata(MetadataClaim(uid, namespace, name, pod_claim), devices)
        claim_devices = []
        for dev in devices:
            try:
                sharing = decode_sharing(dev.sharing)
            except ConfigError:
                sharing = EXCLUSIVE
            claim_devices.append(ClaimDevice(
                device_name=dev.device, request=dev.requests[0] if dev.requests else "", uuid=dev.uuid,
                gpu_minor=dev.gpu_minor, mig_caps=dev.mig_caps, sharing=sharing, admin_access=dev.admin_access,
                share_id=dev.share_id, memory_share_bytes=dev.memory_share_bytes,
                compute_share_percent=dev.compute_share_percent,
            ))
        try:
            self._cdi.write_claim_spec(uid, namespace, name, claim_devices)
        except DriverEditsError as exc:
            raise ClaimFailure(str(exc)) from None
        except OSError as exc:
            raise ClaimFailure(describe_os_error(exc, f"CDI spec {self._cdi.spec_path(uid)}")) from None

    def _write_metadata(self, claim: MetadataClaim, devices: Sequence[PreparedDevice]) -> None:
        """The claim's device metadata files and their CDI specs, before its own spec (same durability step)."""
        assert self._metadata is not None
        try:
            unpublished = self._metadata.write(claim, devices, self._devices)
        except OSError as exc:
            raise ClaimFailure(describe_os_error(exc, f"device metadata {exc.filename or self._metadata.dir}")) from None
        if unpublished:
            self._claim_log(claim.uid, f"{claim.namespace}/{claim.name}").warning(
                "device metadata lists devices no longer published without their attributes", devices=unpublished)

    # -- prepare

    def prepare(self, claims: Iterable[ClaimRef]) -> dict[str, PrepareOutcome]:
        """Prepare a batch of claims; one outcome per distinct UID, never raises."""
        unique = _by_uid(claims)
        if not unique:
            return {}
        started = time.perf_counter()
        fetched = self._fetch_all(list(unique.values()))
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

    def _prepare_batch(self, items: dict[str, tuple[ClaimRef, dict[str, Any] | BaseException]]) -> dict[str, PrepareOutcome]:
        outcomes: dict[str, PrepareOutcome] = {}
        try:
            self._prepare_locked({uid: ref for uid, (ref, _) in items.items()},
                                 {uid: obj for uid, (_, obj) in items.items()}, outcomes)
        except Exception as exc:  # a bug: never let it escape to gRPC
            self._log.exception("unexpected error while preparing claims")
            for uid in items:
                outcomes.setdefault(uid, PrepareOutcome(error=f"internal error preparing the claim: {exc}"))
        self._publish()
        return outcomes

    def _fetch_all(self, claims: Sequence[ClaimRef]) -> dict[str, dict[str, Any] | BaseException]:
        def get(claim: ClaimRef, meanwhile: Callable[[], object] | None = None) -> dict[str, Any] | BaseException:
            try:
                obj = self._api.get(CLAIMS, claim.name, namespace=claim.namespace, meanwhile=meanwhile)
            except Exception as exc:
                return exc
            if not isinstance(obj, dict):
                return RuntimeError(f"API server returned {type(obj).__name__} for ResourceClaim {claim.ref}")
            return obj

        if len(claims) == 1:
            one = claims[0]
            return {one.uid: get(one, lambda: self._intents.run({one.uid: one}))}
        return {c.uid: r for c, r in zip(claims, self._pool.map(get, claims), strict=True)}

    def _prepare_locked(
        self,
        claims: Mapping[str, ClaimRef],
        fetched: Mapping[str, dict[str, Any] | BaseException],
        outcomes: dict[str, PrepareOutcome],
    ) -> None:
        plans: list[_Plan] = []
        rematerialized: list[ClaimEntry] = []
        batch_holds: list[_Hold] = []
        for uid, claim in claims.items():
            log = self._claim_log(uid, claim.ref)
            try:
                obj = fetched[uid]
                existing = self._entries.get(uid)
                completed = existing is not None and existing.state is ClaimState.PREPARE_COMPLETED
                if isinstance(obj, BaseException):
                    if isinstance(obj, ApiError) and obj.not_found:
                        raise ClaimFailure(f"ResourceClaim {claim.ref} not found")
                    if not completed:
                        raise ClaimFailure(f"could not get ResourceClaim {claim.ref}: {_read_error(obj)}")
                    # API server unreachable, but this UID was prepared and checked earlier: the
                    # kubelet (restarted during an outage) gets the same answer as before instead
                    # of a pod that cannot start until the API server is back.
                    log.warning("could not get the ResourceClaim; answering from the checkpoint", error=_read_error(obj))
                else:
                    self._verify_claim(claim, obj)
                if existing is not None and completed:
                    if self._needs_rematerialize(existing):
                        existing = self._rematerialize(existing)
                        self._entries[uid] = existing
                        rematerialized.append(existing)
                        log.info("re-created the CDI spec of an already prepared claim")
                    outcomes[uid] = PrepareOutcome(devices=tuple(_response_device(d) for d in existing.devices))
                    log.debug("claim already prepared")
                    continue
                if isinstance(obj, BaseException):  # not reached: only completed claims get past the error above
                    raise ClaimFailure(f"could not get ResourceClaim {claim.ref}: {_read_error(obj)}")
                plan = self._plan(claim, obj)
                holds = [self._hold_of_plan(uid, claim.ref, d) for d in plan.devices]
                self._check_exclusive(holds, batch_holds)
                batch_holds.extend(holds)
                if not plan.devices:
                    outcomes[uid] = PrepareOutcome()
                    log.info("claim has no devices of this driver")
                    continue
                plans.append(plan)
            except ClaimFailure as exc:
                outcomes[uid] = PrepareOutcome(error=str(exc))
                log.warning("cannot prepare claim", error=str(exc))
            except CdiError as exc:
                outcomes[uid] = PrepareOutcome(error=str(exc))
                log.warning("cannot prepare claim", error=str(exc))
            except Exception as exc:
                outcomes[uid] = PrepareOutcome(error=f"internal error preparing the claim: {exc}")
                log.exception("unexpected error while preparing claim")
        if rematerialized and not plans:
            self._save_quietly()
        if plans:
            self._execute(plans, outcomes)
        for uid in claims:
            self._drop_intent(uid)

    def _intent_batch(self, claims: dict[str, ClaimRef]) -> dict[str, bool]:
        """Record claims about to be prepared, durably (see the module docstring); never raises."""
        added = []
        for uid, claim in claims.items():
            if uid in self._entries:
                continue  # prepared already, or being prepared by another call
            try:
                validate_claim_uid(uid)
            except CdiError:
                continue  # refused by the prepare itself, with the reason
            self._entries[uid] = ClaimEntry(uid=uid, namespace=claim.namespace, name=claim.name,
                                            state=ClaimState.PREPARE_STARTED, devices=(),
                                            boot_id=self._checkpoint.boot_id, updated=now_rfc3339())
            added.append(uid)
        if not added:
            return {}
        try:
            self._checkpoint.save(self._entries)
        except OSError as exc:
            for uid in added:
                del self._entries[uid]
            self._log.warning("could not record claims about to be prepared; their preparation records them",
                              error=describe_os_error(exc, f"checkpoint {self._checkpoint.path}"))
            return {}
        self._intended.update(added)
        failpoints.hit("prepare.after-intent")
        return dict.fromkeys(added, True)

    def _drop_intent(self, uid: str) -> None:
        """Forget that ``uid`` was recorded ahead; its entry goes too if the claim got no devices."""
        if uid not in self._intended:
            return
        self._intended.discard(uid)
        entry = self._entries.get(uid)
        if entry is not None and entry.state is ClaimState.PREPARE_STARTED and not entry.devices:
            del self._entries[uid]

    def _creates_mig(self, plan: _Plan) -> bool:
        return any(_mig_to_create(d.device, d.prepared) for d in plan.devices)

    def _verify_claim(self, claim: ClaimRef, obj: Mapping[str, Any]) -> None:
        try:
            validate_claim_uid(claim.uid)
        except CdiError as exc:
            raise ClaimFailure(str(exc)) from None
        actual_uid = _nested(obj, "metadata", "uid")
        if actual_uid != claim.uid:
            raise ClaimFailure(
                f"claim was replaced: ResourceClaim {claim.ref} has UID {actual_uid}, the kubelet asked for {claim.uid}"
            )
        allocation = _nested(obj, "status", "allocation")
        if not isinstance(allocation, Mapping):
            raise ClaimFailure(f"ResourceClaim {claim.ref} is not allocated (no status.allocation)")
        selector = allocation.get("nodeSelector")
        if selector and not selector_matches(as_mapping(selector), Node(self.node_name, labels=None)):
            raise ClaimFailure(
                f"ResourceClaim {claim.ref} is allocated to another node, not {self.node_name} "
                f"(nodeSelector {allocation.get('nodeSelector')})"
            )

    def _plan(self, claim: ClaimRef, obj: Mapping[str, Any]) -> _Plan:
        allocation = _nested(obj, "status", "allocation") or {}
        results = _nested(allocation, "devices", "results") or []
        configs = _nested(allocation, "devices", "config") or []
        if not isinstance(results, list) or not isinstance(configs, list):
            raise ClaimFailure("status.allocation.devices is malformed")
        planned: list[_PlannedDevice] = []
        for i, result in enumerate(results):
            if not isinstance(result, Mapping) or result.get("driver") != self.driver_name:
                continue
            request = str(result.get("request") or "")
            pool = str(result.get("pool") or "")
            name = str(result.get("device") or "")
            where = f"status.allocation.devices.results[{i}]"
            if pool != self.node_name:
                raise ClaimFailure(f"{where}: device {name!r} is in pool {pool!r}, this node's pool is {self.node_name!r}")
            device = self._devices.get(name)
            if device is None:
                raise ClaimFailure(f"{where}: device {name!r} is not a device of this driver on node {self.node_name}")
            try:
                sharing = resolve_sharing(configs, request, self.driver_name)
            except ConfigError as exc:
                raise ClaimFailure(f"invalid {self.driver_name} config for request {request!r}: {exc}") from None
            if sharing.strategy.value not in self._strategies:
                raise ClaimFailure(
                    f"config for request {request!r} asks for sharing strategy {sharing.strategy.value}, which node "
                    f"{self.node_name} does not allow (allowed: {', '.join(sorted(self._strategies))})")
            share_id = self._share_id(result.get("shareID"), where)
            memory, multiprocessors = device_totals(device)
            try:
                amounts = share_amounts(result.get("consumedCapacity"), self.driver_name, memory, multiprocessors,
                                        self._shares)
            except ShareError as exc:
                raise ClaimFailure(f"{where} (device {name}): {exc}") from None
            if share_id:
                try:
                    sharing = mps_for_share(sharing, amounts)
                except ShareError as exc:
                    raise ClaimFailure(f"config for request {request!r} does not fit its share {share_id} of device "
                                       f"{name}: {exc}") from None
            admin = result.get("adminAccess") is True
            planned.append(_PlannedDevice(
                result_request=request, device=device, sharing=sharing, admin=admin, share_id=share_id,
                prepared=self._prepared_device(claim.uid, request, device, sharing, admin, share_id, amounts),
            ))
        if self._metadata is None or not self._metadata.enabled or not planned:
            return _Plan(claim, planned)
        try:
            pod_claim = pod_claim_name(obj)
            with_ids = self._metadata.with_cdi_ids(claim.uid, [d.prepared for d in planned])
        except CdiError as exc:
            raise ClaimFailure(f"device metadata for ResourceClaim {claim.ref}: {exc}") from None
        for d, prepared in zip(planned, with_ids, strict=True):
            d.prepared = prepared
        return _Plan(claim, planned, pod_claim)

    @staticmethod
    def _share_id(value: Any, where: str) -> str | None:
        if value is None or value == "":
            return None
        try:
            return validate_share_id(value)
        except CdiError as exc:
            raise ClaimFailure(f"{where}: {exc}") from None

    def _prepared_device(self, uid: str, request: str, device: AllocatableDevice, sharing: SharingConfig,
                         admin: bool, share_id: str | None, amounts: ShareAmounts) -> PreparedDevice:
        caps: tuple[int, ...] = ()
        uuid = device.gpu.uuid
        if device.mig is not None:
            uuid = device.mig.uuid
            caps = read_mig_cap_minors(device.gpu.minor, device.mig.gpu_instance_id, device.mig.compute_instance_id,
                                  self._proc_root)
        return PreparedDevice(
            pool=self.node_name, device=device.name, requests=(request,),
            cdi_device_ids=(self._cdi.cdi_device_id(uid, device.name, share_id),), sharing=sharing.to_dict(),
            share_id=share_id, admin_access=admin,
            uuid=uuid, gpu_uuid=device.gpu.uuid, gpu_minor=device.gpu.minor, mig_caps=caps,
            kind=device.kind, placement=_placement_of(device),
            consumed_capacity=amounts.consumed, memory_share_bytes=amounts.memory_bytes,
            compute_share_percent=amounts.compute_percent,
        )

    def _hold_of_plan(self, uid: str, ref: str, d: _PlannedDevice) -> _Hold:
        return _Hold(uid, ref, d.device.name, d.device.gpu.uuid, d.device.kind, _placement_of(d.device), d.sharing,
                     d.admin, d.share_id, d.prepared.memory_share_bytes)

    def _check_exclusive(self, holds: Sequence[_Hold], batch_holds: Sequence[_Hold]) -> None:
        if not holds:
            return
        uid = holds[0].uid
        others: list[_Hold] = [h for h in batch_holds if h.uid != uid]
        for entry in self._entries.values():
            if entry.uid != uid:
                others.extend(_hold_of_prepared(entry, d) for d in entry.devices)
        for mine in holds:
            for theirs in others:
                problem = mine.conflict(theirs) if mine.overlaps(theirs) else None
                if problem:
                    what = (f"device {mine.device}" if mine.device == theirs.device
                            else f"device {mine.device} (GPU {mine.gpu_uuid}, also used by {theirs.device})")
                    raise ClaimFailure(
                        f"{what} is already prepared for claim {theirs.ref} ({theirs.uid}) {theirs.describe()}, "
                        f"this claim asks for it {mine.describe()}; {problem}"
                    )
        self._check_share_memory(holds, others)

    def _check_share_memory(self, holds: Sequence[_Hold], others: Sequence[_Hold]) -> None:
        """The shares prepared on a device never add up to more memory than it has (the scheduler's
        accounting, checked again where the memory is)."""
        for name in sorted({h.device for h in holds if h.share_id and h.memory_bytes}):
            device = self._devices.get(name)
            if device is None:
                continue
            total = device_totals(device)[0]
            mine = sum(h.memory_bytes or 0 for h in holds if h.device == name and h.share_id)
            theirs = [h for h in others if h.device == name and h.share_id and h.memory_bytes]
            used = sum(h.memory_bytes or 0 for h in theirs)
            if mine + used > total:
                holders = ", ".join(f"{h.ref} ({format_canonical(h.memory_bytes or 0)})" for h in theirs)
                raise ClaimFailure(
                    f"device {name} has {format_canonical(total)} of memory; shares already prepared for {holders} "
                    f"and this claim's {format_canonical(mine)} would exceed it")

    def _execute(self, plans: list[_Plan], outcomes: dict[str, PrepareOutcome]) -> None:
        boot = self._checkpoint.boot_id
        for plan in plans:
            c = plan.claim
            self._entries[c.uid] = ClaimEntry(
                uid=c.uid, namespace=c.namespace, name=c.name, state=ClaimState.PREPARE_STARTED,
                devices=tuple(d.prepared for d in plan.devices), boot_id=boot, updated=now_rfc3339(),
                pod_claim_name=plan.pod_claim_name,
            )
        # Recorded ahead without devices: a rollback removes their files by UID, so only MIG instances,
        # whose rollback needs the devices, need this record on disk before they are created.
        if any(p.claim.uid not in self._intended or self._creates_mig(p) for p in plans):
            try:
                self._checkpoint.save(self._entries)
            except OSError as exc:
                msg = describe_os_error(exc, f"checkpoint {self._checkpoint.path}")
                for plan in plans:
                    del self._entries[plan.claim.uid]
                    outcomes[plan.claim.uid] = PrepareOutcome(error=msg)
                    self._claim_log(plan.claim.uid, plan.claim.ref).error("cannot prepare claim", error=msg)
                return
        failpoints.hit("prepare.after-started")

        live: list[_Plan] = []
        created_mig = False
        for plan in plans:
            uid = plan.claim.uid
            try:
                entry = self._entries[uid]
                devices = list(entry.devices)
                for i, dev in enumerate(devices):
                    known = self._devices.get(dev.device)
                    if known is not None and _mig_to_create(known, dev):
                        devices[i] = self._with_mig(dev, self._create_mig(known))
                        created_mig = True
                        self._entries[uid] = replace(entry, devices=tuple(devices))
                live.append(plan)
            except Exception as exc:
                self._fail(plan, exc, outcomes)
        if created_mig:
            try:
                self._checkpoint.save(self._entries)
            except OSError as exc:
                msg = describe_os_error(exc, f"checkpoint {self._checkpoint.path}")
                for plan in live:
                    self._fail(plan, ClaimFailure(msg), outcomes)
                return

        written: list[_Plan] = []
        for plan in live:
            c = plan.claim
            try:
                entry = self._entries[c.uid]
                self._write_spec(c.uid, c.namespace, c.name, entry.devices, entry.pod_claim_name)
                failpoints.hit("prepare.after-cdi-write")
                self._entries[c.uid] = replace(entry, state=ClaimState.PREPARE_COMPLETED, updated=now_rfc3339())
                written.append(plan)
            except Exception as exc:
                self._fail(plan, exc, outcomes)
        try:
            self._checkpoint.save(self._entries)
        except OSError as exc:
            msg = describe_os_error(exc, f"checkpoint {self._checkpoint.path}")
            for plan in written:
                self._fail(plan, ClaimFailure(msg), outcomes)
            self._save_quietly()
            return
        failpoints.hit("prepare.after-completed")
        for plan in written:
            entry = self._entries[plan.claim.uid]
            outcomes[plan.claim.uid] = PrepareOutcome(devices=tuple(_response_device(d) for d in entry.devices))
            self._claim_log(plan.claim.uid, plan.claim.ref).info(
                "prepared claim", devices=[d.device for d in entry.devices],
                cdi_device_ids=[i for d in entry.devices for i in d.cdi_device_ids],
            )

    def _fail(self, plan: _Plan, exc: BaseException, outcomes: dict[str, PrepareOutcome]) -> None:
        c = plan.claim
        log = self._claim_log(c.uid, c.ref)
        if isinstance(exc, ClaimFailure | CdiError | NvmlError):  # NVML's say which call failed and why
            msg = str(exc)
            log.error("cannot prepare claim", error=msg)
        elif isinstance(exc, OSError):
            msg = describe_os_error(exc, "prepared state")
            log.error("cannot prepare claim", error=msg)
        else:
            msg = f"internal error preparing the claim: {exc}"
            log.exception("unexpected error while preparing claim")
        entry = self._entries.pop(c.uid, None)
        if entry is not None:
            try:
                self._rollback(entry)
            except Exception as rb:
                log.error("rollback after a failed preparation was incomplete", error=str(rb))
        outcomes[c.uid] = PrepareOutcome(error=msg)

    # -- unprepare

    def unprepare(self, claims: Iterable[ClaimRef]) -> dict[str, str | None]:
        """Unprepare a batch; ``None`` = success (also for a claim that was never prepared)."""
        unique = _by_uid(claims)
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
            self._unprepare_locked(claims, out)
        except Exception as exc:
            self._log.exception("unexpected error while unpreparing claims")
            for uid in claims:
                out.setdefault(uid, f"internal error unpreparing the claim: {exc}")
        self._publish()
        return out

    def _unprepare_locked(self, claims: Mapping[str, ClaimRef], out: dict[str, str | None]) -> None:
        removed: dict[str, ClaimEntry] = {}
        for uid, claim in claims.items():
            log = self._claim_log(uid, claim.ref)
            entry = self._entries.get(uid)
            try:
                if entry is None:
                    try:
                        if self._cdi.delete_claim_spec(uid):
                            log.info("removed a leftover CDI spec of an unknown claim")
                        if self._metadata is not None and self._metadata.remove(uid):
                            log.info("removed leftover device metadata of an unknown claim")
                    except CdiError:
                        pass  # not a UUID: we never wrote anything for it
                    out[uid] = None
                    log.debug("claim not prepared; nothing to do")
                    continue
                self._rollback(entry)
                failpoints.hit("unprepare.after-spec-delete")
                removed[uid] = self._entries.pop(uid)
                self._intended.discard(uid)  # a prepare still running for it must write its own record
                out[uid] = None
            except (ClaimFailure, NvmlError) as exc:
                out[uid] = f"unpreparing claim {claim.ref}: {exc}"
                log.error("cannot unprepare claim", error=str(exc))
            except Exception as exc:
                out[uid] = f"internal error unpreparing claim {claim.ref}: {exc}"
                log.exception("unexpected error while unpreparing claim")
        if not removed:
            return
        try:
            self._checkpoint.save(self._entries)
        except OSError as exc:
            msg = describe_os_error(exc, f"checkpoint {self._checkpoint.path}")
            for uid, entry in removed.items():
                # Keep the entry so that the kubelet's retry repeats the (idempotent) cleanup.
                self._entries[uid] = entry
                out[uid] = msg
                self._claim_log(uid, entry.ref).error("cannot unprepare claim", error=msg)
            return
        failpoints.hit("unprepare.after-checkpoint")
        for uid, entry in removed.items():
            self._claim_log(uid, entry.ref).info("unprepared claim", devices=[d.device for d in entry.devices])

