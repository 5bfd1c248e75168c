"""The ``dra-driver controller``: explains pending ResourceClaims and allocates opted-in ones.

What it does
============

* **Explain.** A claim is *pending* when it has no ``status.allocation`` and a pod that is not
  done references it (``spec.resourceClaims[].resourceClaimName`` or, for claims generated from a
  template, ``status.resourceClaimStatuses[].resourceClaimName``), or it opted in to controller
  allocation. Every pending claim is resolved against the ResourceSlices with all *other* claims'
  allocations taken as used. When it cannot be satisfied, the controller writes the explanation
  as annotations on the claim and a Warning Event (see :data:`EXPLANATION_ANNOTATION`), and a
  Warning Event on each pod that waits for it (:mod:`dra_driver.controller.pod_notices`). It never
  writes the status of a claim that the scheduler allocates: there it only explains, and the
  scheduler's verdict wins (its allocation clears the annotations).
* **Allocate on request.** A standalone claim (not generated for a pod) annotated
  ``gpu.dra-driver.io/allocate: controller`` is allocated by the controller; see
  :meth:`dra_driver.controller.allocating.FencedAllocator.allocate` for the safety argument against
  double allocation.
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

import gc
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

from dra_driver import logs, memory
from dra_driver.allocator.inventory import Inventory, Prebuilt
from dra_driver.allocator.resolve import Engine
from dra_driver.controller.accounting import Accounting
from dra_driver.controller.allocating import ALLOCATION_SETTLE_SECONDS, FencedAllocator
from dra_driver.controller.keys import (
    MAX_SUMMARY_CHARS,
    OUR_ANNOTATIONS,
    REPORTING_CONTROLLER,
)
from dra_driver.controller.metrics import ControllerMetrics, MetricsServer
from dra_driver.controller.reporting import Reporter
from dra_driver.controller.rules_source import RulesSource
from dra_driver.controller.settings import ControllerSettings
from dra_driver.controller.verdicts import (
    Action,
    Outcome,
    Verdict,
    VerdictMemo,
    claim_config_errors,
    classify,
    config_only_outcome,
    evaluate,
    pending_classes,
)
from dra_driver.controller.views import claim_view, holdings, needs_no_work, pod_view, slice_reading
from dra_driver.k8s.claims import (
    annotations_of,
    classes_by_name,
    is_allocated,
    is_deleting,
    pod_claim_keys,
    pod_node,
    uid_of,
)
from dra_driver.k8s.client import (
    CLAIM_TEMPLATES,
    CLAIMS,
    DEVICE_CLASSES,
    EVENTS,
    PODS,
    SLICES,
    ApiError,
    ConfigurationError,
    KubeApi,
    RestKubeApi,
)
from dra_driver.k8s.compact import without_managed_fields
from dra_driver.k8s.events import EventRecorder
from dra_driver.k8s.fields import one_line
from dra_driver.k8s.informer import Informer
from dra_driver.k8s.leader import AlwaysLeader, LeaderElector, Leadership, LeaseConfig
from dra_driver.k8s.objects import Obj, key_of, resource_version
from dra_driver.k8s.ratelimit import TokenBucket, WriteLimitedApi
from dra_driver.k8s.wire import POD_CLAIM_REFS
from dra_driver.k8s.workqueue import WorkQueue

WORKERS = 16
"""Queue workers. Evaluations run one at a time (see Controller._engine_lock); the others write
meanwhile, so a backlog is paced by the write budget, not by API round trips. With 4, a backlog on
the scale bench's 2,000-node cluster went at 104 claims/s: four PATCHes in flight at ~40 ms each
on a busy API server."""
GC_THRESHOLDS = (50_000, 20, 100)
"""The cyclic collector's thresholds (Python's default: 700, 10, 10). Decoding a list of 5,000
slices makes millions of dicts; at the default, collections ran every 700 of them and full ones
walked everything already kept, which took 3 of every 4 seconds of decoding. The objects kept are
trees without cycles (refcounting frees them), and what is listed is frozen out of the collector's
reach (see dra_driver.k8s.informer), so a collection seldom finds anything to free."""
WAITING_PODS = "status.phase=Pending"
"""The pods the controller watches: those not yet running. Only they can wait for a claim that is
not allocated (a pod runs once its claims are); the 150,000 pods of a full cluster are nearly all
running, and were most of what the controller listed at start. A pod that starts running leaves
the watch as a deletion (the API server's rule for an object that stops matching the selector)."""
PREBUILD_EVERY = 0.2
"""Seconds between looks at the slices a streaming list has received so far (see Controller._prebuild)."""
IDLE_POLL = 0.05
"""Seconds between looks at the queue while the warm-up waits for the workers to be idle."""
RESCAN = "rescan:"
"""The queue item that re-evaluates every unallocated claim (see Controller._enqueue_unallocated)."""


# --------------------------------------------------------------------------------------------
# The controller


@dataclass
class _Snapshot:
    slices_version: int = -1
    inventory: Inventory | None = None


def _kind_key(kind: str, key: str) -> str:
    return f"{kind}:{key}"


class Controller:
    """Informers + work queue + the decisions of :mod:`dra_driver.controller.verdicts`, against a
    :class:`KubeApi`: what it says goes through :attr:`reporter`, what it allocates through
    :attr:`allocator`, and both keep :attr:`accounting` of what the claims hold."""

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
        server_version: Callable[[], str] | None = None,
    ) -> None:
        """``server_version``: the API server's gitVersion, for ``--scheduler-rules auto`` (without
        it, the newest rules the engine knows)."""
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
        self.ledger_name = settings.allocation_ledger[1]
        self.queue = WorkQueue(clock=clock)
        # What each store keeps: see dra_driver.controller.views.
        self.claims = Informer(api, CLAIMS, self._on_claim, transform=claim_view)
        self.pods = Informer(api, PODS, self._on_pod, field_selector=WAITING_PODS, transform=pod_view,
                             reduced=POD_CLAIM_REFS)
        self.slices = Informer(api, SLICES, self._on_slice, reduced=slice_reading())
        self.classes = Informer(api, DEVICE_CLASSES, self._on_class, transform=without_managed_fields)
        self.templates = Informer(api, CLAIM_TEMPLATES, self._on_template, transform=without_managed_fields)
        self.informers = (self.claims, self.pods, self.slices, self.classes, self.templates)
        self._lock = threading.RLock()
        self._pod_claims: dict[str, set[str]] = {}
        self._claim_pods: dict[str, set[str]] = {}
        self._slices_version = 0
        self._classes_version = 0
        self._snapshot = _Snapshot()
        self._prebuilt: Prebuilt | None = None
        """Pools digested while the slices were being listed, for the first inventory."""
        self._inventory_lock = threading.Lock()
        self._engine_lock = threading.Lock()
        """Evaluations run one at a time: they are CPU-bound (the GIL gives nothing to a second
        one), and the engine's caches need no locking of their own. Writes run in parallel."""
        self._allocation_lock = threading.RLock()
        """Controller allocation, finalization and the ledger one claim at a time, as before
        workers ran in parallel: the fence would catch a collision, but need not."""
        self._verdicts = VerdictMemo()
        self._settled: dict[str, tuple[str, tuple[Any, ...]]] = {}
        """Explained claims: key -> (resourceVersion, inputs) of the last explanation written or
        found current. A claim whose resourceVersion and inputs are unchanged is not evaluated
        again, however often resyncs and rescans queue it."""
        self._log = logs.get("controller")
        self.rules = RulesSource(settings.scheduler_rules, server_version, clock, self._log)
        self.accounting = Accounting(self.claims.store, self.engine, clock, lambda: self.queue.add(RESCAN))
        self.reporter = Reporter(self.api, self.events, driver=self.driver, leadership=self.leadership,
                                 metrics=self.metrics, accounting=self.accounting, log=self._log,
                                 pod_events=settings.pod_events)
        self.allocator = FencedAllocator(
            self.api, driver=self.driver, ledger=settings.allocation_ledger, leadership=self.leadership,
            metrics=self.metrics, accounting=self.accounting, reporter=self.reporter,
            resolve=lambda claim, fresh: self.outcome_for(claim, claims=fresh, require_own_driver=True),
            requeue=lambda claim, delay: self.queue.add_after(_kind_key("claim", key_of(claim)), delay),
            log=self._log, settle_seconds=settle_seconds, sleep=sleep)
        self._warm = threading.Event()
        """Set once the warm-up has built what the workers need first (or given up)."""
        self._working = threading.Event()
        """Set once the workers run, with the claims of the first resync queued."""
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
            self.accounting.forget(uid)
            self.reporter.pod_notices.forget_claim(key)
            with self._lock:
                self._settled.pop(key, None)
        tracked = self.accounting.tracks(uid)
        if not (new is not None and needs_no_work(new) and (old is None or needs_no_work(old)) and not tracked):
            self.queue.add(_kind_key("claim", key))
        # A change of one claim's devices frees or takes devices the others may want.
        if holdings(old) != holdings(new):
            self.accounting.changed()

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
        self.reporter.pod_notices.forget_pod(pkey, before - keys)
        for ck in before ^ keys:
            if self._waiting_matters(ck):
                self.queue.add(_kind_key("claim", ck))

    def _waiting_matters(self, claim_key: str) -> bool:
        """Whether a pod starting or stopping to wait for the claim can change what the controller
        does with it: not for a claim that needs no work (:func:`needs_no_work`, as :meth:`_on_claim`
        sees it), which stays ignored until the claim itself changes."""
        claim = self.claims.store.get(claim_key)
        return claim is None or not needs_no_work(claim) or self.accounting.tracks(uid_of(claim))

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
        """Enqueue everything that may need attention (periodically and on becoming leader), with
        the scheduler rules re-read when due: a change of rules re-explains every pending claim
        (their inputs, :meth:`_inputs`, name the rules)."""
        self.rules.refresh()
        for c in self.claims.store.values():
            if not is_allocated(c) or any(a in annotations_of(c) for a in OUR_ANNOTATIONS) or is_deleting(c):
                self.queue.add(_kind_key("claim", key_of(c)))
        for written in self.accounting.written():
            self.queue.add(_kind_key("claim", key_of(written)))
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
            prebuilt, self._prebuilt = self._prebuilt, None
            inv = self.engine.build_inventory(self.slices.store.values(), previous=snap.inventory, prebuilt=prebuilt)
            with self._lock:
                self._snapshot = _Snapshot(version, inv)
            return version, inv

    def class_map(self) -> dict[str, Obj]:
        return classes_by_name(self.classes.store.values())

    def _class_map(self) -> tuple[int, dict[str, Obj]]:
        with self._lock:
            version = self._classes_version
        return version, self.class_map()


    def outcome_for(self, claim: Obj, *, claims: Sequence[Obj] | None = None, require_own_driver: bool) -> Outcome:
        classes_version, classes = self._class_map()
        t0 = time.perf_counter()
        try:
            try:
                slices_version, inventory = self._inventory()
                if claims is None:
                    holdings_version, allocated = self.accounting.held_by_others(claim)
                else:
                    holdings_version = None
                    allocated = self.engine.allocated_state(self.accounting.claims(claims), exclude_uid=uid_of(claim))
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
            rules = self.rules.current()
            memo = None
            if holdings_version is not None and not require_own_driver:
                memo = (self._verdicts, (slices_version, classes_version, holdings_version, rules))
            with self._engine_lock:
                return evaluate(self.engine, claim, inventory, classes, allocated, driver=self.driver, nodes=nodes,
                                require_own_driver=require_own_driver, memo=memo, rules=rules)
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
                self.reporter.validate_object(obj, DEVICE_CLASSES)
        elif kind == "template":
            obj = self.templates.store.get(key)
            if obj is not None:
                self.reporter.validate_object(obj, CLAIM_TEMPLATES)
        elif kind == "ledger":
            with self._allocation_lock:
                self.allocator.collect_ledger()
        elif item == RESCAN:
            self._enqueue_unallocated()

    def sync_claim(self, key: str) -> None:
        claim = self.claims.store.get(key)
        if claim is None:
            return
        log = self._log.bind(claim=key, uid=uid_of(claim))
        written_at = self.accounting.written_at(uid_of(claim))
        if written_at is not None and is_allocated(claim) and self.clock() - written_at >= self.allocator.settle_seconds:
            with self._allocation_lock:
                self.allocator.verify_allocation(claim, log, settled=True)
            claim = self.claims.store.get(key) or claim
        action = classify(claim, waited_for=self.waited_for(key))
        if action is not Action.EXPLAIN:
            with self._lock:
                self._settled.pop(key, None)
        if action not in (Action.EXPLAIN, Action.ALLOCATE):
            self.reporter.pod_notices.forget_claim(key)
        if action in (Action.IGNORE, Action.CLEAR):
            if not is_allocated(claim) and not is_deleting(claim):
                # Nobody waits for it (yet): still flag bad configuration before a node sees it.
                errors = claim_config_errors(claim, self.class_map(), self.driver)
                if errors:
                    self.reporter.record(claim, config_only_outcome(errors, self.driver), log)
                    return
            if action is Action.CLEAR:
                self.reporter.write_annotations(claim, None, log)
            return
        if action is Action.FINALIZE:
            with self._allocation_lock:
                self.allocator.finalize(claim, log)
            return
        if action is Action.EXPLAIN:
            seen = self._inputs(key)
            with self._lock:
                if self._settled.get(key) == (resource_version(claim), seen):
                    return  # explained as it stands, against what is there now
        outcome = self.outcome_for(claim, require_own_driver=action is Action.ALLOCATE)
        self.reporter.tell_pods(claim, outcome, self.waiting_pods(key))
        if action is Action.EXPLAIN or outcome.verdict is not Verdict.SATISFIABLE:
            result = self.reporter.record(claim, outcome, log)
            if action is Action.EXPLAIN and result is not None:
                with self._lock:
                    self._settled[key] = (resource_version(result), seen)
            return
        with self._allocation_lock:
            self.allocator.allocate(claim, log)

    def _inputs(self, key: str) -> tuple[Any, ...]:
        """What a pending claim's explanation depends on besides the claim itself: the versions of
        the slices, classes and allocations, the node its one pod is pinned to, and which pods wait
        for it (a pod that starts waiting is told the verdict)."""
        pods = self.waiting_pods(key)
        with self._lock:
            return (self._slices_version, self._classes_version, self.accounting.version,
                    tuple(sorted({n for p in pods if (n := pod_node(p))})), tuple(key_of(p) for p in pods),
                    self.rules.current())

    # -- running

    def healthy(self) -> bool:
        return all(i.synced.is_set() for i in self.informers) and self.clock() - min(self._beats) < 120

    def wait_synced(self, stop: threading.Event, timeout: float = 120.0) -> bool:
        return _synced(self.informers, stop, time.monotonic() + timeout)

    def run(self, stop: threading.Event) -> None:
        for inf in self.informers:
            inf.start(stop)
        warm = threading.Thread(target=self._warm_up, args=(stop,), name="inventory", daemon=True)
        warm.start()
        if self.wait_synced(stop):
            self._warm.wait()
        else:
            if stop.is_set():
                return
            # The warm-up waits for the informers too; it goes on beside the workers.
            self._log.warning("informers not synced yet; starting anyway")
        self.resync()
        workers = [threading.Thread(target=self._work, args=(stop, n), name=f"worker-{n}", daemon=True)
                   for n in range(1, WORKERS + 1)]
        for w in workers:
            w.start()
        self._working.set()
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

    def _warm_up(self, stop: threading.Event) -> None:
        """Build the device inventory, group its devices the way a claim for one device of a
        DeviceClass does, and add up what the claims hold, before the workers start: at 5,000
        nodes the inventory takes a couple of seconds, each grouping a few tenths and the sum of
        20,000 claims tens of milliseconds, which would otherwise be the first claims' wait. It
        starts as soon as the slices are listed, while the other lists still wait for the API
        server. Later slice changes only rebuild what they touched, when a claim next asks.

        Only the classes that pending claims ask for are grouped before the workers start; the
        others (the dynamic-MIG class is the costliest: 76,000 partitionable devices at 5,000
        nodes) once the workers have nothing to do, so that no claim waits for a class it does
        not use."""
        try:
            if not self._prebuild(stop):
                return
            t0 = time.perf_counter()
            try:
                inventory = self.inventory()
            except Exception as exc:  # the first claim's evaluation reports it, with the claim
                self._log.warning("cannot build the device inventory yet", error=f"{type(exc).__name__}: {exc}")
                return
            self._log.info("device inventory built", devices=len(inventory.devices),
                           seconds=round(time.perf_counter() - t0, 3))
            if not _synced((self.classes, self.claims), stop):
                return
            classes = self.class_map()
            wanted = sorted(pending_classes(self.claims.store.values()) & classes.keys())
            self._prime(inventory, wanted, classes)
            t0 = time.perf_counter()
            self.accounting.held()
            # The inventory and its groupings live as long as the slices stay as they are; left to
            # the cyclic collector, the first full collection after start walks all of them (half
            # a second at 5,000 nodes) in whichever claim's evaluation it falls.
            gc.freeze()
            self._log.info("devices held by claims added up", claims=len(self.claims.store),
                           seconds=round(time.perf_counter() - t0, 3))
        finally:
            self._warm.set()
        rest = sorted(classes.keys() - set(wanted))
        while not self._working.wait(IDLE_POLL):
            if stop.is_set():
                return
        for name in rest:
            while not self.queue.idle():
                if stop.wait(IDLE_POLL):
                    return
            classes = self.class_map()
            if name not in classes:
                continue
            try:
                inventory = self.inventory()  # the slices may have changed meanwhile
            except Exception:
                return  # the next claim's evaluation reports it, with the claim
            self._prime(inventory, [name], classes)
        gc.freeze()
        self._log.info("warm-up over", classes=len(classes), grouped_first=len(wanted))

    def _prime(self, inventory: Inventory, names: Sequence[str], classes: dict[str, Obj]) -> None:
        """Group the devices for each of the DeviceClasses ``names``, one at a time."""
        t0 = time.perf_counter()
        for name in names:
            try:
                with self._engine_lock:
                    self.engine.prime(inventory, name, classes)
            except Exception as exc:  # the class's claims report it, each with the claim
                self._log.warning("cannot group the devices for a DeviceClass", device_class=name,
                                  error=f"{type(exc).__name__}: {exc}")
        if names:
            self._log.info("devices grouped for DeviceClasses", classes=list(names),
                           seconds=round(time.perf_counter() - t0, 3))

    def _prebuild(self, stop: threading.Event) -> bool:
        """Digest the slices' pools as the API server streams them, until they are all listed
        (True) or ``stop`` is set: at 5,000 nodes the slices take seconds to arrive, time in which
        the inventory's per-device work is otherwise not started."""
        prebuilt, arrived, taken, t0 = Prebuilt(), self.slices.streamed, 0, time.perf_counter()
        while not self.slices.synced.wait(PREBUILD_EVERY):
            if stop.is_set():
                return False
            if self.slices.streamed is not arrived:
                if self.slices.synced.is_set():
                    break  # the list ended after this look began
                prebuilt, arrived, taken = Prebuilt(), self.slices.streamed, 0  # a list (re)started
            batch = arrived[taken:]
            if batch:
                prebuilt.add(batch)
                taken += len(batch)
        self._prebuilt = prebuilt
        self._log.info("pools digested while the slices arrived", pools=len(prebuilt.pools), slices=taken,
                       seconds=round(time.perf_counter() - t0, 3))
        return True

    def _work(self, stop: threading.Event, beat: int) -> None:
        while not stop.is_set():
            self._beats[beat] = self.clock()
            try:
                self.process_next(timeout=1.0)
            except Exception:  # belt and braces: process_next already catches
                self.metrics.error("loop")
                self._log.exception("worker loop error")


def _synced(informers: Sequence[Informer], stop: threading.Event, deadline: float | None = None) -> bool:
    """Wait until every one of ``informers`` has synced; False once ``stop`` is set or ``deadline``
    (monotonic) has passed."""
    for inf in informers:
        while not inf.synced.wait(0.2):
            if stop.is_set() or (deadline is not None and time.monotonic() > deadline):
                return False
    return True


def run(settings: ControllerSettings) -> int:
    """Entry point of ``dra-driver controller``."""
    logs.configure(settings.log_format, settings.log_level)
    log = logs.get("controller", driver=settings.driver_name, identity=settings.identity)
    gc.set_threshold(*GC_THRESHOLDS)
    memory.limit_arenas()  # before any thread starts: see dra_driver.memory
    try:
        # Idle connections kept: one per worker and per informer's next list, so a burst of writes
        # does not open (and close again) a TLS connection per request.
        api = RestKubeApi.from_kubeconfig(settings.kubeconfig, user_agent=f"dra-driver-controller/{os.getpid()}",
                                          pool_size=WORKERS + 8)
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
    controller = Controller(api, settings, leadership=leadership, metrics=metrics,
                            server_version=lambda: str(api.server_version().get("gitVersion", "")))
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
