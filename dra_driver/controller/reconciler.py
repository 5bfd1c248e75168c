"""The ``dra-driver controller``: explains pending ResourceClaims and allocates opted-in ones.

What it does
============

* **Explain.** A claim is *pending* when it has no ``status.allocation`` and a pod that is not
  done references it (``spec.resourceClaims[].resourceClaimName`` or, for claims generated from a
  template, ``status.resourceClaimStatuses[].resourceClaimName``), or it opted in to controller
  allocation. Every pending claim is resolved against the ResourceSlices with all *other* claims'
  allocations taken as used. When it cannot be satisfied, the controller writes the explanation
  as annotations on the claim and a Warning Event (see :data:`EXPLANATION_ANNOTATION`). It never
  writes the status of a claim that the scheduler allocates: there it only explains, and the
  scheduler's verdict wins (its allocation clears the annotations).
* **Allocate on request.** A standalone claim (not generated for a pod) annotated
  ``gpu.dra-driver.io/allocate: controller`` is allocated by the controller; see
  :meth:`Controller.allocate` for the safety argument against double allocation.
* **Validate opaque config** of this driver in claims, DeviceClasses and ResourceClaimTemplates
  (Warning Event ``InvalidConfig`` naming the field; for claims also in the explanation).
* **Finalize.** When an opted-in claim that carries ``resource.kubernetes.io/delete-protection``
  is deleted and nothing reserved it, the controller clears its allocation and the finalizer.

Only the leader (Lease ``settings.leader_election_id``) processes claims and writes. Decisions
are pure functions of the claim and its surroundings (:func:`classify`, :func:`plan_explanation`,
:func:`annotation_patch`, ...); :class:`Controller` wires them to informers, a work queue and the
API (:class:`dra_driver.k8s.client.KubeApi`).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import FrameType
from typing import Any

from dra_driver import logs
from dra_driver.allocator.inventory import AllocatedState, Inventory
from dra_driver.allocator.resolve import Engine
from dra_driver.controller import fence
from dra_driver.controller.annotations import annotation_patch, content_hash, desired_annotations, needs_event
from dra_driver.controller.keys import (
    MAX_EVENT_NOTE,
    MAX_SUMMARY_CHARS,
    OUR_ANNOTATIONS,
    REPORTING_CONTROLLER,
    wants_controller_allocation,
)
from dra_driver.controller.metrics import ControllerMetrics, MetricsServer
from dra_driver.controller.settings import ControllerSettings
from dra_driver.controller.verdicts import (
    EVENT_REASON,
    Action,
    Outcome,
    Verdict,
    VerdictMemo,
    claim_config_errors,
    classify,
    config_only_outcome,
    evaluate,
    object_config_errors,
)
from dra_driver.controller.views import claim_view, holdings, needs_no_work, pod_view, slice_view
from dra_driver.k8s.claims import (
    annotations_of,
    classes_by_name,
    device_ids,
    has_finalizer,
    is_allocated,
    is_deleting,
    pod_claim_keys,
    pod_node,
    reserved_for,
    status_of,
    uid_of,
    with_allocation,
    with_finalizer,
    without_finalizer,
)
from dra_driver.k8s.client import (
    CLAIM_TEMPLATES,
    CLAIMS,
    CONFIGMAPS,
    DEVICE_CLASSES,
    EVENTS,
    PODS,
    SLICES,
    ApiError,
    ConfigurationError,
    KubeApi,
    Resource,
    RestKubeApi,
)
from dra_driver.k8s.compact import without_managed_fields
from dra_driver.k8s.events import EventRecorder, Occurrence, object_ref
from dra_driver.k8s.fields import one_line
from dra_driver.k8s.informer import Informer, WorkQueue
from dra_driver.k8s.leader import AlwaysLeader, LeaderElector, Leadership, LeaseConfig
from dra_driver.k8s.objects import Obj, describe_node_selector, key_of, meta
from dra_driver.k8s.ratelimit import TokenBucket, WriteLimitedApi

ALLOCATION_SETTLE_SECONDS = 5.0
"""Delay of the second post-write check of a controller allocation (see Controller.allocate)."""
FENCE_PROBES = 15
"""Dry-run probes (5 ms doubling to 200 ms apart, about 2 s in all) before the allocation fence
counts as not installed."""
FENCE_RETRY_SECONDS = 30.0
LEDGER_TTL_SECONDS = 120.0
WORKERS = 4
"""Queue workers. Evaluations run one at a time (see Controller._engine_lock); the others write
meanwhile, so a backlog is not paced by API round trips: one at a time, 10,000 explanations and
their Events at ~3 ms each would take a minute on their own."""
RESCAN = "rescan:"
"""The queue item that re-evaluates every unallocated claim (see Controller._enqueue_unallocated)."""


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


# --------------------------------------------------------------------------------------------
# The controller


@dataclass
class _Written:
    claim: Obj
    at: float
    verified_settled: bool = False


@dataclass
class _Snapshot:
    slices_version: int = -1
    inventory: Inventory | None = None


def _rv(obj: Mapping[str, Any]) -> str:
    return str(meta(obj).get("resourceVersion", ""))


def _kind_key(kind: str, key: str) -> str:
    return f"{kind}:{key}"


class Controller:
    """Informers + work queue + the decisions above, against a :class:`KubeApi`."""

    def __init__(
        self,
        api: KubeApi,
        settings: ControllerSettings,
        *,
        engine: Engine | None = None,
        leadership: Leadership | None = None,
        metrics: ControllerMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        settle_seconds: float = ALLOCATION_SETTLE_SECONDS,
        sleep: Callable[[float], None] = time.sleep,
        events: EventRecorder | None = None,
    ) -> None:
        self.settings = settings
        self.driver = settings.driver_name
        self.engine = engine or Engine()
        self.leadership: Leadership = leadership or AlwaysLeader()
        self.metrics = metrics or ControllerMetrics()
        rate = settings.max_writes_per_second
        self.api: KubeApi = WriteLimitedApi(api, TokenBucket(rate, max(1, round(rate))), best_effort=frozenset({EVENTS.plural}),
                                            on_wait=self.metrics.write_wait_seconds.inc)
        self.events = events or EventRecorder(self.api, REPORTING_CONTROLLER, settings.identity,
                                              on_drop=lambda: self.metrics.error("event"),
                                              on_throttled=lambda: self.metrics.error("event_throttled"))
        self.clock = clock
        self.settle_seconds = settle_seconds
        self.sleep = sleep
        self.ledger_namespace, self.ledger_name = settings.allocation_ledger
        self.queue = WorkQueue(clock=clock)
        # What each store keeps: see dra_driver.controller.views.
        self.claims = Informer(api, CLAIMS, self._on_claim, transform=claim_view)
        self.pods = Informer(api, PODS, self._on_pod, transform=pod_view)
        self.slices = Informer(api, SLICES, self._on_slice, transform=slice_view())
        self.classes = Informer(api, DEVICE_CLASSES, self._on_class, transform=without_managed_fields)
        self.templates = Informer(api, CLAIM_TEMPLATES, self._on_template, transform=without_managed_fields)
        self.informers = (self.claims, self.pods, self.slices, self.classes, self.templates)
        self._lock = threading.RLock()
        self._pod_claims: dict[str, set[str]] = {}
        self._claim_pods: dict[str, set[str]] = {}
        self._slices_version = 0
        self._classes_version = 0
        self._holdings_version = 0
        """Bumped whenever a device another claim may want is taken or freed (see _on_claim)."""
        self._snapshot = _Snapshot()
        self._inventory_lock = threading.Lock()
        self._engine_lock = threading.Lock()
        """Evaluations run one at a time: they are CPU-bound (the GIL gives nothing to a second
        one), and the engine's caches need no locking of their own. Writes run in parallel."""
        self._allocation_lock = threading.RLock()
        """Controller allocation, finalization and the ledger one claim at a time, as before
        workers ran in parallel: the fence would catch a collision, but need not."""
        self._holdings: tuple[int, AllocatedState] | None = None
        self._verdicts = VerdictMemo()
        self._settled: dict[str, tuple[str, tuple[Any, ...]]] = {}
        """Explained claims: key -> (resourceVersion, inputs) of the last explanation written or
        found current. A claim whose resourceVersion and inputs are unchanged is not evaluated
        again, however often resyncs and rescans queue it."""
        self._written: dict[str, _Written] = {}
        self._reserving: set[str] = set()  # claim UIDs between their ledger entry and their allocation
        self._validated: dict[str, str] = {}
        self._log = logs.get("controller")
        self._beats = [clock()] * (WORKERS + 1)
        """When the main loop (0) and each worker last came round."""

    # -- informer handlers (cheap: they only enqueue keys and keep the pod index)

    def _on_claim(self, old: Obj | None, new: Obj | None) -> None:
        obj = new or old
        if obj is None:
            return
        key = key_of(obj)
        uid = uid_of(obj)
        if new is None:
            self._forget_written(uid)
        with self._lock:
            if new is None:
                self._settled.pop(key, None)
            tracked = uid in self._written
        if not (new is not None and needs_no_work(new) and (old is None or needs_no_work(old)) and not tracked):
            self.queue.add(_kind_key("claim", key))
        # A change of one claim's devices frees or takes devices the others may want.
        if holdings(old) != holdings(new):
            self._holdings_changed()

    def _on_pod(self, old: Obj | None, new: Obj | None) -> None:
        obj = new or old
        if obj is None:
            return
        pkey = key_of(obj)
        keys = pod_claim_keys(new) if new is not None else set()
        with self._lock:
            before = self._pod_claims.pop(pkey, set())
            if keys:
                self._pod_claims[pkey] = keys
            for ck in before - keys:
                s = self._claim_pods.get(ck)
                if s is not None:
                    s.discard(pkey)
                    if not s:
                        del self._claim_pods[ck]
            for ck in keys:
                self._claim_pods.setdefault(ck, set()).add(pkey)
        for ck in before ^ keys:
            self.queue.add(_kind_key("claim", ck))

    def _on_slice(self, old: Obj | None, new: Obj | None) -> None:
        with self._lock:
            self._slices_version += 1
        self.queue.add(RESCAN)

    def _on_class(self, old: Obj | None, new: Obj | None) -> None:
        if new is not None:
            self.queue.add(_kind_key("class", key_of(new)))
        with self._lock:
            self._classes_version += 1
        self.queue.add(RESCAN)

    def _on_template(self, old: Obj | None, new: Obj | None) -> None:
        if new is not None:
            self.queue.add(_kind_key("template", key_of(new)))

    def _enqueue_unallocated(self) -> None:
        """Every claim a change of devices, classes or allocations may give a new verdict. Handlers
        only queue :data:`RESCAN`, once however many changes arrive while it waits: a health flap
        on 500 nodes is one re-evaluation, not 500 of every pending claim. A claim waiting out a
        delay or a retry back-off keeps waiting: its turn sees the change."""
        for c in self.claims.store.values():
            item = _kind_key("claim", key_of(c))
            if not is_allocated(c) and not self.queue.deferred(item):
                self.queue.add(item)

    def waited_for(self, claim_key: str) -> bool:
        with self._lock:
            return bool(self._claim_pods.get(claim_key))

    def waiting_pods(self, claim_key: str) -> list[Obj]:
        with self._lock:
            keys = sorted(self._claim_pods.get(claim_key, ()))
        return [p for k in keys if (p := self.pods.store.get(k)) is not None]

    def resync(self) -> None:
        """Enqueue everything that may need attention (periodically and on becoming leader)."""
        for c in self.claims.store.values():
            if not is_allocated(c) or any(a in annotations_of(c) for a in OUR_ANNOTATIONS) or is_deleting(c):
                self.queue.add(_kind_key("claim", key_of(c)))
        with self._lock:
            for w in self._written.values():
                self.queue.add(_kind_key("claim", key_of(w.claim)))
        for cls in self.classes.store.values():
            self.queue.add(_kind_key("class", key_of(cls)))
        for t in self.templates.store.values():
            self.queue.add(_kind_key("template", key_of(t)))
        self.queue.add(_kind_key("ledger", self.ledger_name))

    # -- the engine's inputs

    def inventory(self) -> Inventory:
        return self._inventory()[1]

    def _inventory(self) -> tuple[int, Inventory]:
        """The inventory and the slices version it is at least as new as."""
        with self._inventory_lock:  # one build at a time; the others take its result
            with self._lock:
                version = self._slices_version
                snap = self._snapshot
            if snap.slices_version == version and snap.inventory is not None:
                return version, snap.inventory
            # The last inventory lends its devices' CEL state to unchanged devices: a slice update
            # then costs CEL conversions only for the devices it changed.
            inv = self.engine.build_inventory(self.slices.store.values(), previous=snap.inventory)
            with self._lock:
                self._snapshot = _Snapshot(version, inv)
            return version, inv

    def class_map(self) -> dict[str, Obj]:
        return classes_by_name(self.classes.store.values())

    def _class_map(self) -> tuple[int, dict[str, Obj]]:
        with self._lock:
            version = self._classes_version
        return version, self.class_map()

    def _holdings_changed(self) -> None:
        """Devices were taken or freed: every pending claim may see them differently now."""
        with self._lock:
            self._holdings_version += 1
        self.queue.add(RESCAN)

    def _forget_written(self, uid: str) -> None:
        with self._lock:
            gone = self._written.pop(uid, None)
        if gone is not None:
            self._holdings_changed()

    def _expire_written(self) -> None:
        now = self.clock()
        with self._lock:
            expired = [uid for uid, w in self._written.items() if now - w.at > LEDGER_TTL_SECONDS]
        for uid in expired:
            self._forget_written(uid)

    def _keep(self, written: Obj, base: Obj) -> None:
        """The result of our write against ``base`` into the claims store, unless the watch brought
        something newer (:meth:`Store.put_if_unchanged`); what it changes in the devices held counts
        at once, since no informer event will say so."""
        if self.claims.store.put_if_unchanged(written, _rv(base)) and holdings(written) != holdings(base):
            self._holdings_changed()

    def held_by_others(self, claim: Obj) -> tuple[int | None, AllocatedState]:
        """What the other claims hold, and the holdings version when that is what every claim
        without devices of its own sees (None otherwise): computed once per version, not once per
        pending claim (20,000 claims take ~60 ms to add up)."""
        self._expire_written()
        uid = uid_of(claim)
        with self._lock:
            version = self._holdings_version
            own = is_allocated(claim) or uid in self._written
            cached = self._holdings
        if own:
            return None, self.engine.allocated_state(self.claims_for_accounting(), exclude_uid=uid)
        if cached is not None and cached[0] == version:
            return version, cached[1]
        state = self.engine.allocated_state(self.claims_for_accounting())
        with self._lock:
            self._holdings = (version, state)
        return version, state

    def claims_for_accounting(self, fresh: Sequence[Obj] | None = None) -> list[Obj]:
        """All claims with the controller's own recent writes laid over them.

        The informer may not have delivered an allocation this controller just wrote; until it
        does (or the entry expires), the written object stands in for the cached one.
        """
        base = list(fresh) if fresh is not None else self.claims.store.values()
        self._expire_written()
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

    def outcome_for(self, claim: Obj, *, claims: Sequence[Obj] | None = None, require_own_driver: bool) -> Outcome:
        classes_version, classes = self._class_map()
        t0 = time.perf_counter()
        try:
            try:
                slices_version, inventory = self._inventory()
                if claims is None:
                    holdings_version, allocated = self.held_by_others(claim)
                else:
                    holdings_version = None
                    allocated = self.engine.allocated_state(self.claims_for_accounting(claims),
                                                            exclude_uid=uid_of(claim))
            except Exception as exc:
                self.metrics.error("inventory")
                msg = f"cannot build the device inventory: {type(exc).__name__}: {exc}"
                return Outcome(Verdict.ERROR, one_line(msg, MAX_SUMMARY_CHARS), None, None, msg,
                               tuple(claim_config_errors(claim, classes, self.driver)))
            nodes = None
            pods = self.waiting_pods(key_of(claim))
            pinned = {n for p in pods if (n := pod_node(p))}
            if len(pinned) == 1 and len(pods) == 1:
                nodes = sorted(pinned)
            memo = None
            if holdings_version is not None and not require_own_driver:
                memo = (self._verdicts, (slices_version, classes_version, holdings_version))
            with self._engine_lock:
                return evaluate(self.engine, claim, inventory, classes, allocated, driver=self.driver, nodes=nodes,
                                require_own_driver=require_own_driver, memo=memo)
        finally:
            self.metrics.resolve_seconds.observe(time.perf_counter() - t0)

    # -- processing

    def process_next(self, timeout: float | None = 1.0) -> bool:
        """Process one queued key; False when the queue had nothing within ``timeout``."""
        item = self.queue.get(timeout)
        if item is None:
            return False
        try:
            self.process(item)
            self.queue.forget(item)
        except Exception as exc:
            api_error = exc if isinstance(exc, ApiError) else None
            kind = "sync"
            if api_error is not None and (api_error.conflict or api_error.throttled):
                kind = "conflict" if api_error.conflict else "throttled"
            self.metrics.error(kind)
            delay = self.queue.add_rate_limited(item)
            if kind == "throttled":
                # The client already retried as the server asked; a busy API server is no fault of ours.
                self._log.info("throttled by the API server, retrying", item=item, retry_in=delay)
            else:
                self._log.warning("processing failed, retrying", item=item, error=str(exc), retry_in=delay,
                                  exc_info=api_error is None)
        finally:
            self.queue.done(item)
            self.metrics.queue_depth.set(len(self.queue))
        return True

    def process(self, item: str) -> None:
        kind, _, key = item.partition(":")
        if not self.leadership.is_leader():
            return
        if kind == "claim":
            self.sync_claim(key)
        elif kind == "class":
            obj = self.classes.store.get(key)
            if obj is not None:
                self.validate_object(obj, DEVICE_CLASSES)
        elif kind == "template":
            obj = self.templates.store.get(key)
            if obj is not None:
                self.validate_object(obj, CLAIM_TEMPLATES)
        elif kind == "ledger":
            with self._allocation_lock:
                self.collect_ledger()
        elif item == RESCAN:
            self._enqueue_unallocated()

    def validate_object(self, obj: Obj, resource: Resource) -> list[str]:
        """Warning Event ``InvalidConfig`` once per (object, generation, set of errors)."""
        errors = object_config_errors({**obj, "kind": obj.get("kind") or resource.kind}, self.driver)
        uid = uid_of(obj)
        if not errors:
            with self._lock:
                self._validated.pop(uid, None)
            return errors
        digest = content_hash(f"{meta(obj).get('generation')}|" + "\n".join(errors))
        with self._lock:
            if self._validated.get(uid) == digest:
                return errors
        note = f"invalid configuration for {self.driver}: " + "; ".join(errors)
        self.emit(obj, Occurrence("Warning", "InvalidConfig", "Validate", note), resource)
        with self._lock:
            self._validated[uid] = digest
        self._log.warning("invalid opaque configuration", kind=resource.kind, object=key_of(obj), uid=uid,
                          errors=errors)
        return errors

    def sync_claim(self, key: str) -> None:
        claim = self.claims.store.get(key)
        if claim is None:
            return
        log = self._log.bind(claim=key, uid=uid_of(claim))
        with self._lock:
            entry = self._written.get(uid_of(claim))
        if entry is not None and is_allocated(claim) and self.clock() - entry.at >= self.settle_seconds:
            with self._allocation_lock:
                self.verify_allocation(claim, log, settled=True)
            claim = self.claims.store.get(key) or claim
        action = classify(claim, waited_for=self.waited_for(key))
        if action is not Action.EXPLAIN:
            with self._lock:
                self._settled.pop(key, None)
        if action in (Action.IGNORE, Action.CLEAR):
            if not is_allocated(claim) and not is_deleting(claim):
                # Nobody waits for it (yet): still flag bad configuration before a node sees it.
                errors = claim_config_errors(claim, self.class_map(), self.driver)
                if errors:
                    self.record(claim, config_only_outcome(errors, self.driver), log)
                    return
            if action is Action.CLEAR:
                self.write_annotations(claim, None, log)
            return
        if action is Action.FINALIZE:
            with self._allocation_lock:
                self.finalize(claim, log)
            return
        if action is Action.EXPLAIN:
            seen = self._inputs(key)
            with self._lock:
                if self._settled.get(key) == (_rv(claim), seen):
                    return  # explained as it stands, against what is there now
        outcome = self.outcome_for(claim, require_own_driver=action is Action.ALLOCATE)
        if action is Action.EXPLAIN or outcome.verdict is not Verdict.SATISFIABLE:
            result = self.record(claim, outcome, log)
            if action is Action.EXPLAIN and result is not None:
                with self._lock:
                    self._settled[key] = (_rv(result), seen)
            return
        with self._allocation_lock:
            self.allocate(claim, log)

    def _inputs(self, key: str) -> tuple[Any, ...]:
        """What a pending claim's explanation depends on besides the claim itself: the versions of
        the slices, classes and allocations, and the node its one pod is pinned to."""
        pods = self.waiting_pods(key)
        with self._lock:
            return (self._slices_version, self._classes_version, self._holdings_version,
                    tuple(sorted({n for p in pods if (n := pod_node(p))})), len(pods))

    # -- writes

    def emit(self, regarding: Obj, what: Occurrence, resource: Resource) -> None:
        """Best effort (the annotation carries the same information): written in the background, a
        repeat folded into the Event already there, one given up on counted as error kind ``event``.
        The note is cut here, ending in ``...`` as the controller's notes always have, so the
        recorder's own cut (``…``) never changes it."""
        if not self.leadership.is_leader():
            return
        self.events.record(object_ref(regarding, resource), replace(what, note=one_line(what.note, MAX_EVENT_NOTE)))

    def write_annotations(self, claim: Obj, outcome: Outcome | None, log: Any) -> Obj | None:
        """Bring our annotations in line with ``outcome``. Returns the claim as it now stands on the
        server: the written one, ``claim`` when there was nothing to write, None when it could not
        be written (gone, or not the leader)."""
        current = annotations_of(claim)
        patch = annotation_patch(current, desired_annotations(outcome))
        event = outcome is not None and needs_event(current, outcome)
        if patch is None and not event:
            return claim
        if not self.leadership.is_leader():
            return None
        m = meta(claim)
        updated = claim
        if patch is not None:
            try:
                updated = self.api.merge_patch(
                    CLAIMS, str(m.get("name")), {"metadata": {"annotations": patch}}, namespace=m.get("namespace")
                )
            except ApiError as exc:
                if exc.not_found:
                    return None
                raise
            self._keep(updated, claim)
        if outcome is not None:
            if event:
                self.emit(claim, Occurrence("Warning", EVENT_REASON.get(outcome.verdict, "Unsatisfiable"),
                                            "Allocate" if wants_controller_allocation(claim) else "Explain",
                                            outcome.summary), CLAIMS)
            self.metrics.claims_explained.inc()
            log.info("claim explained", verdict=outcome.verdict.value, summary=outcome.summary)
        else:
            log.info("explanation cleared")
        return updated

    def record(self, claim: Obj, outcome: Outcome, log: Any) -> Obj | None:
        if outcome.verdict is Verdict.ERROR:
            self.metrics.error("resolve")
            log.warning("claim evaluation failed", error=outcome.text)
        return self.write_annotations(claim, outcome, log)

    def allocate(self, claim: Obj, log: Any) -> bool:
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
            self._keep(fresh_claim, claim)
            self.queue.add(_kind_key("claim", key_of(claim)))
            return False
        fresh = self.api.list(CLAIMS).items
        outcome = self.outcome_for(fresh_claim, claims=fresh, require_own_driver=True)
        if outcome.verdict is not Verdict.SATISFIABLE or outcome.allocation is None:
            self.record(fresh_claim, outcome, log)
            return False
        allocation = outcome.allocation

        target = fresh_claim
        if not has_finalizer(target):
            try:
                target = self.api.replace(CLAIMS, with_finalizer(target))
            except ApiError as exc:
                if exc.conflict or exc.not_found:
                    log.info("claim changed while adding the finalizer; re-resolving", error=str(exc))
                    self.queue.add_after(_kind_key("claim", key_of(claim)), 0.2)
                    return False
                raise
        uid = uid_of(target)
        with self._lock:
            self._reserving.add(uid)
        try:
            if not self.reserve(target, allocation, log):
                return False
            taken = allocation_conflicts(allocation, uid, self.api.list(CLAIMS).items)
            if taken:
                log.info("devices were allocated before the fence was up; re-resolving", other=key_of(taken[0][0]))
                self.release(uid)
                self.queue.add_after(_kind_key("claim", key_of(claim)), 0.2)
                return False
            try:
                written = self.api.replace_status(CLAIMS, with_allocation(target, allocation))
            except ApiError as exc:
                self.release(uid)
                if exc.conflict or exc.not_found:
                    self.metrics.error("conflict")
                    log.info("claim changed before the allocation was written; re-resolving", error=str(exc))
                    self.queue.add_after(_kind_key("claim", key_of(claim)), 0.2)
                    return False
                raise
            with self._lock:
                self._written[uid_of(written)] = _Written(written, self.clock())
            self._holdings_changed()
            self._keep(written, fresh_claim)
        finally:
            with self._lock:
                self._reserving.discard(uid)
        self.metrics.claims_allocated.inc()
        where = describe_node_selector(allocation)
        log.info("claim allocated", devices=describe_devices(allocation), where=where)
        self.emit(written, Occurrence("Normal", "Allocated", "Allocate",
                                      f"allocated {describe_devices(allocation)} on {where}"), CLAIMS)
        if any(a in annotations_of(written) for a in OUR_ANNOTATIONS):
            try:
                self.write_annotations(written, None, log)
            except ApiError as exc:
                log.warning("cannot clear explanation after allocation", error=str(exc))
        # Immediate check, then one after the settle delay.
        self.verify_allocation(written, log, settled=False)
        self.queue.add_after(_kind_key("claim", key_of(written)), self.settle_seconds)
        return True

    # -- the allocation fence (dra_driver.controller.fence)

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

    def reserve(self, claim: Obj, allocation: Mapping[str, Any], log: Any) -> bool:
        """Steps 3 of :meth:`allocate`: ledger entries for the devices, then proof that the API
        server enforces them. False (entries released, claim requeued) when it does not."""
        uid = uid_of(claim)
        devices = sorted(device_ids(allocation, exclusive_only=True))
        token = fence.new_token()
        held: list[str] = []

        def edit(data: dict[str, str]) -> dict[str, str] | None:
            held[:] = fence.conflicting_entries(data, devices, uid)
            return None if held else fence.with_reservation(data, devices, uid, token, self.driver)

        self._edit_ledger(edit)
        if held:
            log.info("devices are held in the fence ledger for another claim; re-resolving", keys=held)
            self.queue.add_after(_kind_key("claim", key_of(claim)), 0.5)
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
                        self.queue.add_after(_kind_key("claim", key_of(claim)), 0.2)
                        return False
                    raise
                # Refused for another device: admission still reads an older ledger; wait for ours.
            self.sleep(delay)
            delay = min(delay * 2, 0.2)
        self.release(uid)
        self.metrics.error("fence_inactive")
        note = ("not allocating: the allocation fence is not in force (or the API server's admission still "
                "reads an older ledger), so an allocation could collide with the kube-scheduler's. Install the "
                f"ValidatingAdmissionPolicy {fence.POLICY_NAME} and a binding whose paramRef names the ConfigMap "
                f"{self.ledger_namespace}/{self.ledger_name} (the Helm chart does both)")
        log.error("allocation fence not in force", policy=fence.POLICY_NAME,
                  ledger=f"{self.ledger_namespace}/{self.ledger_name}")
        self.emit(claim, Occurrence("Warning", "AllocationFenceMissing", "Allocate", note), CLAIMS)
        self.queue.add_after(_kind_key("claim", key_of(claim)), FENCE_RETRY_SECONDS)
        return False

    def release(self, uid: str) -> None:
        """Drop the ledger entries of claim ``uid``."""
        self._edit_ledger(lambda data: fence.without_keys(data, fence.keys_of(data, uid)))

    def collect_ledger(self) -> None:
        """Drop ledger entries whose claim no longer holds the device (deallocated, deleted)."""
        held: dict[str, set[str]] = {}
        for c in self.claims_for_accounting():
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
            self._log.info("released fence ledger entries", count=len(stale))

    def verify_allocation(self, claim: Obj, log: Any, *, settled: bool) -> bool:
        """Post-write check of a controller allocation; True when it stands.

        ``settled``: the settle delay has passed; a clean check then ends the verification.
        """
        uid = uid_of(claim)
        with self._lock:
            if uid not in self._written:
                return True
        fresh = self.api.list(CLAIMS).items
        mine = next((c for c in fresh if uid_of(c) == uid), None)
        if mine is None or not is_allocated(mine):
            self._forget_written(uid)
            return False
        conflicts = allocation_conflicts(status_of(mine)["allocation"], uid, fresh)
        if not conflicts:
            if settled:
                self._forget_written(uid)
            return True
        other, devices = conflicts[0]
        shared = ", ".join("/".join(d) for d in sorted(devices))
        other_key = key_of(other)
        if reserved_for(mine):
            self.metrics.error("double_allocation")
            log.error("device allocated twice; our claim is already in use", other=other_key, devices=shared)
            note = f"device(s) {shared} are also allocated to claim {other_key}; this claim is in use, not rolled back"
            self.emit(mine, Occurrence("Warning", "DeviceConflict", "Allocate", note), CLAIMS)
            self._forget_written(uid)
            return False
        self.metrics.error("allocation_conflict")
        log.warning("rolling back allocation that conflicts with another claim", other=other_key, devices=shared)
        try:
            rolled = self.api.replace_status(CLAIMS, with_allocation(mine, None))
            self._keep(rolled, mine)
        except ApiError as exc:
            if not (exc.conflict or exc.not_found):
                raise
            # Changed meanwhile (maybe reserved): look again soon.
            self.queue.add_after(_kind_key("claim", key_of(claim)), 0.2)
            return False
        self._forget_written(uid)
        self.release(uid)
        self.emit(mine, Occurrence("Warning", "AllocationRolledBack", "Allocate",
                                   f"device(s) {shared} were allocated to claim {other_key} concurrently; "
                                   "allocation withdrawn, re-resolving"), CLAIMS)
        self.queue.add_after(_kind_key("claim", key_of(claim)), 0.5)
        return False

    def finalize(self, claim: Obj, log: Any) -> bool:
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
                self.queue.add_after(_kind_key("claim", key_of(claim)), 0.2)
                return False
            raise
        self._forget_written(uid_of(claim))
        self.release(uid_of(claim))
        log.info("deleted claim deallocated and released")
        return True

    # -- running

    def healthy(self) -> bool:
        return all(i.synced.is_set() for i in self.informers) and self.clock() - min(self._beats) < 120

    def wait_synced(self, stop: threading.Event, timeout: float = 120.0) -> bool:
        deadline = time.monotonic() + timeout
        for inf in self.informers:
            while not inf.synced.wait(0.2):
                if stop.is_set() or time.monotonic() > deadline:
                    return False
        return True

    def run(self, stop: threading.Event) -> None:
        for inf in self.informers:
            inf.start(stop)
        if not self.wait_synced(stop):
            if stop.is_set():
                return
            self._log.warning("informers not synced yet; starting anyway")
        self.resync()
        workers = [threading.Thread(target=self._work, args=(stop, n), name=f"worker-{n}", daemon=True)
                   for n in range(1, WORKERS + 1)]
        for w in workers:
            w.start()
        next_resync = self.clock() + self.settings.resync_seconds
        was_leader = self.leadership.is_leader()
        while not stop.wait(1.0):
            self._beats[0] = self.clock()
            leader = self.leadership.is_leader()
            self.metrics.is_leader.set(1 if leader else 0)
            if leader and not was_leader:
                self.resync()
            was_leader = leader
            if self.clock() >= next_resync:
                self.resync()
                next_resync = self.clock() + self.settings.resync_seconds
        self.queue.shutdown()
        for w in workers:
            w.join(timeout=5)

    def _work(self, stop: threading.Event, beat: int) -> None:
        while not stop.is_set():
            self._beats[beat] = self.clock()
            try:
                self.process_next(timeout=1.0)
            except Exception:  # belt and braces: process_next already catches
                self.metrics.error("loop")
                self._log.exception("worker loop error")


def run(settings: ControllerSettings) -> int:
    """Entry point of ``dra-driver controller``."""
    logs.configure(settings.log_format, settings.log_level)
    log = logs.get("controller", driver=settings.driver_name, identity=settings.identity)
    try:
        api = RestKubeApi.from_kubeconfig(settings.kubeconfig, user_agent=f"dra-driver-controller/{os.getpid()}")
    except ConfigurationError as exc:
        raise ValueError(str(exc)) from None
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        log.info("stopping", signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)

    metrics = ControllerMetrics()
    elector: LeaderElector | None = None
    leadership: Leadership = AlwaysLeader()
    threads: list[threading.Thread] = []
    if settings.leader_elect:
        elector = LeaderElector(
            api,
            LeaseConfig(settings.leader_election_namespace, settings.leader_election_id, settings.identity),
            on_change=lambda leader: metrics.is_leader.set(1 if leader else 0),
        )
        leadership = elector
        threads.append(elector.start(stop))
    controller = Controller(api, settings, leadership=leadership, metrics=metrics)
    threads.append(controller.events.start(stop))
    server: MetricsServer | None = None
    if settings.metrics_port:
        server = MetricsServer(metrics, settings.metrics_port, controller.healthy)
        server.start()
    log.info("controller started", leader_elect=settings.leader_elect, metrics_port=settings.metrics_port)
    try:
        controller.run(stop)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=5)  # the elector releases the Lease on its way out
        controller.events.flush(timeout=2.0)
        if server is not None:
            server.stop()
        api.close()
    log.info("controller stopped")
    return 0
