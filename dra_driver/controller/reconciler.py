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
  ``gpu.dra-driver.io/allocate: controller`` is allocated by the controller, in the namespaces the
  admin allows it in (``--allocation-namespace-selector``; none by default: elsewhere the claim
  is told "not allowed here"), on the devices the scheduler would allow: DeviceTaintRules' taints
  count, and a pod that waits for the claim confines it to the nodes the pod can be scheduled to
  (:mod:`dra_driver.controller.placement`). See
  :meth:`dra_driver.controller.allocating.FencedAllocator.allocate` for the safety argument against
  double allocation.
* **Validate opaque config** of this driver in claims, DeviceClasses and ResourceClaimTemplates
  (Warning Event ``InvalidConfig`` naming the field; for claims also in the explanation).
* **Finalize.** When an opted-in claim that carries ``resource.kubernetes.io/delete-protection``
  is deleted and nothing reserved it, the controller clears its allocation and the finalizer.

Only the leader (Lease ``settings.leader_election_id``) processes claims and writes. Decisions
are pure functions of the claim and its surroundings (:mod:`dra_driver.controller.verdicts`);
:class:`Controller` wires them to informers, a work queue of typed :class:`Item` s and the API
(:class:`dra_driver.k8s.client.KubeApi`); what the engine decides with, and the warm-up that
builds it before the workers start, is :mod:`dra_driver.controller.engine_inputs`.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from enum import StrEnum
from types import FrameType
from typing import Any, NamedTuple

from dra_driver import logs, memory
from dra_driver.allocator.devicestates import (
    WITHHELD_REASON,
    Withheld,
    device_census,
    still_withheld,
    withheld_from,
)
from dra_driver.allocator.inventory import DeviceKey, Inventory
from dra_driver.allocator.resolve import Engine
from dra_driver.controller.accounting import Accounting
from dra_driver.controller.allocating import ALLOCATION_SETTLE_SECONDS, FencedAllocator
from dra_driver.controller.annotations import explained_by
from dra_driver.controller.engine_inputs import EngineInputs, synced
from dra_driver.controller.keys import OUR_ANNOTATIONS, REPORTING_CONTROLLER
from dra_driver.controller.metrics import ControllerMetrics, MetricsServer
from dra_driver.controller.ownership import foreign_drivers
from dra_driver.controller.placement import node_view, placement_key, same_placement
from dra_driver.controller.reporting import Reporter
from dra_driver.controller.rules_source import RulesSource
from dra_driver.controller.settings import ControllerSettings
from dra_driver.controller.verdicts import (
    Action,
    Verdict,
    allocation_refusal,
    claim_config_errors,
    classify,
    config_only_outcome,
    not_allowed_outcome,
)
from dra_driver.controller.views import claim_view, holdings, needs_no_work, pod_view, slice_reading
from dra_driver.k8s.claims import annotations_of, is_allocated, is_deleting, pod_claim_keys, uid_of
from dra_driver.k8s.client import (
    CLAIM_TEMPLATES,
    CLAIMS,
    DEVICE_CLASSES,
    DEVICE_TAINT_RULES,
    EVENTS,
    NAMESPACES,
    NODES,
    PODS,
    SLICES,
    ApiError,
    KubeApi,
    Resource,
    RestKubeApi,
)
from dra_driver.k8s.compact import without_managed_fields
from dra_driver.k8s.events import EventRecorder, node_events
from dra_driver.k8s.informer import Informer
from dra_driver.k8s.leader import AlwaysLeader, LeaderElector, Leadership, LeaseConfig
from dra_driver.k8s.objects import Obj, as_mapping, key_of, meta, resource_version
from dra_driver.k8s.quarantine import Undecodable
from dra_driver.k8s.ratelimit import TokenBucket, WriteLimitedApi
from dra_driver.k8s.wire import POD_CLAIM_REFS
from dra_driver.k8s.workqueue import WorkQueue

WORKERS = 16
"""Queue workers. Evaluations run one at a time (see EngineInputs._engine_lock); the others write
meanwhile, so a backlog is paced by the write budget, not by API round trips. With 4, a backlog on
the scale bench was paced by four PATCHes in flight on a busy API server
(docs/scale.md#the-codes-figures)."""
GC_THRESHOLDS = (50_000, 20, 100)
"""The cyclic collector's thresholds (Python's default: 700, 10, 10). Decoding a list of 5,000
slices makes millions of dicts; at the default, collections ran every 700 of them and full ones
walked everything already kept, which took most of the decoding's time. The objects kept are
trees without cycles (refcounting frees them), and what is listed is frozen out of the collector's
reach (see dra_driver.k8s.informer), so a collection seldom finds anything to free."""
WAITING_PODS = "status.phase=Pending"
"""The pods the controller watches: those not yet running. Only they can wait for a claim that is
not allocated (a pod runs once its claims are); the 150,000 pods of a full cluster are nearly all
running, and were most of what the controller listed at start. A pod that starts running leaves
the watch as a deletion (the API server's rule for an object that stops matching the selector)."""


class Kind(StrEnum):
    """What a queue item asks the controller to look at."""

    CLAIM = "claim"
    CLASS = "class"
    TEMPLATE = "template"
    LEDGER = "ledger"
    RESCAN = "rescan"


class Item(NamedTuple):
    """A work-queue item: what to look at and its object's key (namespace/name, or name)."""

    kind: Kind
    key: str = ""

    def __str__(self) -> str:  # as the logs name it
        return f"{self.kind}:{self.key}"


def namespace_view(namespace: Obj) -> Obj:
    """What the controller keeps of a Namespace: its name and labels."""
    m = meta(namespace)
    return {"metadata": {"name": m.get("name"), "resourceVersion": m.get("resourceVersion"),
                         "labels": dict(as_mapping(m.get("labels")))}}


RESCAN = Item(Kind.RESCAN)
"""The queue item that re-evaluates every unallocated claim (see Controller._enqueue_unallocated)."""


# --------------------------------------------------------------------------------------------
# The controller


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
        self.queue: WorkQueue[Item] = WorkQueue(clock=clock)
        # What each store keeps: see dra_driver.controller.views.
        self.claims = Informer(api, CLAIMS, self._on_claim, transform=claim_view,
                               on_undecodable=self._undecodable(CLAIMS))
        self.pods = Informer(api, PODS, self._on_pod, field_selector=WAITING_PODS, transform=pod_view,
                             reduced=POD_CLAIM_REFS, on_undecodable=self._undecodable(PODS))
        self.slices = Informer(api, SLICES, self._on_slice, reduced=slice_reading(),
                               on_undecodable=self._undecodable(SLICES))
        self.classes = Informer(api, DEVICE_CLASSES, self._on_class, transform=without_managed_fields,
                                on_undecodable=self._undecodable(DEVICE_CLASSES))
        self.templates = Informer(api, CLAIM_TEMPLATES, self._on_template, transform=without_managed_fields,
                                  on_undecodable=self._undecodable(CLAIM_TEMPLATES))
        self.taint_rules = Informer(api, DEVICE_TAINT_RULES, self._on_taint_rule, transform=without_managed_fields,
                                    optional=True, on_undecodable=self._undecodable(DEVICE_TAINT_RULES))
        self.nodes = Informer(api, NODES, self._on_node, transform=node_view, on_undecodable=self._undecodable(NODES))
        self.informers: tuple[Informer, ...] = (self.claims, self.pods, self.slices, self.classes, self.templates,
                                                self.taint_rules, self.nodes)
        self.namespaces: Informer | None = None
        """The namespaces' labels, read only where controller allocation is on (to match them)."""
        if settings.allocation_namespaces is not None:
            self.namespaces = Informer(api, NAMESPACES, self._on_namespace, transform=namespace_view,
                                       on_undecodable=self._undecodable(NAMESPACES))
            self.informers += (self.namespaces,)
        self._lock = threading.RLock()
        self._pod_claims: dict[str, set[str]] = {}
        self._claim_pods: dict[str, set[str]] = {}
        self._allocation_lock = threading.RLock()
        """Controller allocation, finalization and the ledger one claim at a time, as before
        workers ran in parallel: the fence would catch a collision, but need not."""
        self._settled: dict[str, tuple[str, tuple[Any, ...]]] = {}
        """Explained claims: key -> (resourceVersion, inputs) of the last explanation written or
        found current. A claim whose resourceVersion and inputs are unchanged is not evaluated
        again, however often resyncs and rescans queue it."""
        self._log = logs.get("controller")
        self.rules = RulesSource(settings.scheduler_rules, server_version, clock, self._log)
        self.accounting = Accounting(self.claims.store, self.engine, clock, lambda: self.queue.add(RESCAN))
        self.inputs = EngineInputs(self.engine, driver=self.driver, slices=self.slices, classes=self.classes,
                                   claims=self.claims, accounting=self.accounting, rules=self.rules,
                                   metrics=self.metrics, waiting_pods=self.waiting_pods, log=self._log,
                                   taint_rules=self.taint_rules, nodes=self.nodes)
        self.reporter = Reporter(self.api, self.events, driver=self.driver, leadership=self.leadership,
                                 metrics=self.metrics, accounting=self.accounting, log=self._log,
                                 pod_events=settings.pod_events)
        self.allocator = FencedAllocator(
            self.api, driver=self.driver, ledger=settings.allocation_ledger, leadership=self.leadership,
            metrics=self.metrics, accounting=self.accounting, reporter=self.reporter,
            resolve=lambda claim, fresh: self.inputs.outcome_for(claim, claims=fresh, require_own_driver=True),
            requeue=lambda claim, delay: self.queue.add_after(Item(Kind.CLAIM, key_of(claim)), delay),
            log=self._log, settle_seconds=settle_seconds, sleep=sleep)
        self._working = threading.Event()
        """Set once the workers run, with the claims of the first resync queued."""
        self._beats = [clock()] * (WORKERS + 1)
        """When the main loop (0) and each worker last came round."""
        self._counted: tuple[Inventory, int, dict[DeviceKey, str], Counter[str]] | None = None
        """The inventory and holdings version the device metric was last counted at, the models
        of that inventory's devices, and the withheld devices by model."""
        self._withheld_unread = False
        """Whether the last list of the DeviceWithheld Events failed (said once, until one succeeds)."""
        self._told: list[Withheld] = []
        """The devices the DeviceWithheld Events named when last read (any driver: still_withheld picks)."""

    # -- informer handlers (cheap: they only enqueue keys and keep the pod index)

    def _undecodable(self, resource: Resource) -> Callable[[Undecodable], None]:
        """Told by an informer of an object it could not decode: the Warning Event and metric."""
        return lambda bad: self.reporter.undecodable(bad, resource)

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
            self.queue.add(Item(Kind.CLAIM, key))
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
        # A pod that asks other things of nodes (a toleration added, a scheduling gate's selector)
        # changes where its claims may go.
        moved = keys if old is not None and new is not None and placement_key(old) != placement_key(new) else set()
        for ck in (before ^ keys) | moved:
            if self._waiting_matters(ck):
                self.queue.add(Item(Kind.CLAIM, ck))

    def _waiting_matters(self, claim_key: str) -> bool:
        """Whether a pod starting or stopping to wait for the claim can change what the controller
        does with it: not for a claim that needs no work (:func:`needs_no_work`, as :meth:`_on_claim`
        sees it), which stays ignored until the claim itself changes."""
        claim = self.claims.store.get(claim_key)
        return claim is None or not needs_no_work(claim) or self.accounting.tracks(uid_of(claim))

    def _on_slice(self, old: Obj | None, new: Obj | None) -> None:
        self.inputs.slices_changed()
        self.queue.add(RESCAN)

    def _on_class(self, old: Obj | None, new: Obj | None) -> None:
        if new is not None:
            self.queue.add(Item(Kind.CLASS, key_of(new)))
        self.inputs.classes_changed()
        self.queue.add(RESCAN)

    def _on_taint_rule(self, old: Obj | None, new: Obj | None) -> None:
        # A rule's taint is part of the devices it selects: the inventory is built again.
        self.inputs.slices_changed()
        self.queue.add(RESCAN)

    def _on_node(self, old: Obj | None, new: Obj | None) -> None:
        if not same_placement(old, new):
            self.inputs.nodes_changed()
            self.queue.add(RESCAN)

    def _on_namespace(self, old: Obj | None, new: Obj | None) -> None:
        if old is None or new is None or meta(old).get("labels") != meta(new).get("labels"):
            self.queue.add(RESCAN)

    def allocation_refused(self, claim: Obj) -> str | None:
        """Why the controller may not allocate ``claim`` in its namespace; None when it may."""
        namespace = str(meta(claim).get("namespace") or "default")
        found = self.namespaces.store.get(namespace) if self.namespaces is not None else None
        labels = None if found is None else {str(k): str(v) for k, v in as_mapping(meta(found).get("labels")).items()}
        return allocation_refusal(namespace, labels, self.settings.allocation_namespaces)

    def _on_template(self, old: Obj | None, new: Obj | None) -> None:
        if new is not None:
            self.queue.add(Item(Kind.TEMPLATE, key_of(new)))

    def _enqueue_unallocated(self) -> None:
        """Every claim a change of devices, classes or allocations may give a new verdict. Handlers
        only queue :data:`RESCAN`, once however many changes arrive while it waits: a health flap
        on 500 nodes is one re-evaluation, not 500 of every pending claim. A claim waiting out a
        delay or a retry back-off keeps waiting: its turn sees the change."""
        for c in self.claims.store.values():
            item = Item(Kind.CLAIM, key_of(c))
            if not is_allocated(c) and not self.queue.deferred(item):
                self.queue.add(item)

    def waited_for(self, claim_key: str) -> bool:
        with self._lock:
            return bool(self._claim_pods.get(claim_key))

    def waiting_pods(self, claim_key: str) -> list[Obj]:
        with self._lock:
            keys = sorted(self._claim_pods.get(claim_key, ()))
        return [p for k in keys if (p := self.pods.store.get(k)) is not None]

    def became_leader(self) -> None:
        """What this replica knew from an earlier term may be stale: other leaders wrote meanwhile,
        and pods it had told while leading were not written once it stopped (their Events go out
        only while it leads). Forget it all and look at everything again; a pod told before is told
        once more, folded into the Event already there."""
        with self._lock:
            self._settled.clear()
        self.reporter.pod_notices.clear()
        self.resync()

    def resync(self) -> None:
        """Enqueue everything that may need attention (periodically and on becoming leader), with
        the scheduler rules re-read when due: a change of rules re-explains every pending claim
        (what their explanations were computed against,
        :meth:`EngineInputs.seen`, names the rules)."""
        self.rules.refresh()
        for c in self.claims.store.values():
            if not is_allocated(c) or any(a in annotations_of(c) for a in OUR_ANNOTATIONS) or is_deleting(c):
                self.queue.add(Item(Kind.CLAIM, key_of(c)))
        for written in self.accounting.written():
            self.queue.add(Item(Kind.CLAIM, key_of(written)))
        for cls in self.classes.store.values():
            self.queue.add(Item(Kind.CLASS, key_of(cls)))
        for t in self.templates.store.values():
            self.queue.add(Item(Kind.TEMPLATE, key_of(t)))
        self.queue.add(Item(Kind.LEDGER, self.ledger_name))

    def count_devices(self) -> None:
        """The device metric (devices by model and state, the claims holding shares), counted from
        the inventory and the holdings the engine decides with (the accounting's, summed once per
        version for the evaluations too), and the devices the node plugins withhold (their
        ``DeviceWithheld`` Events), on the main loop at each resync: skipped while none of them
        changed. Every replica counts, leader or not: its informers see the cluster as the leader's do."""
        told = self._withheld_told()
        try:
            inventory = self.inputs.inventory()
            version, held = self.accounting.held()
            withheld = Counter(w.model for w in still_withheld(told, inventory, self.driver))
            if self._counted is not None and self._counted[0] is inventory:
                if self._counted[1] == version and self._counted[3] == withheld:
                    return
                models = self._counted[2]
            else:
                models = {}
            self.metrics.count_devices(device_census(inventory, held, self.driver, models, withheld=withheld))
            self._counted = (inventory, version, models, withheld)
        except Exception as exc:  # last resort: the metric stays as it was; the main loop must go on
            self.metrics.error("device_count")
            self._log.warning("cannot count the devices for the metric", error=f"{type(exc).__name__}: {exc}")

    def _withheld_told(self) -> list[Withheld]:
        """The devices the plugins' ``DeviceWithheld`` Node Events name; the last ones read
        while the Events cannot be read (said once, and again when they can)."""
        try:
            events = node_events(self.api, WITHHELD_REASON)
        except ApiError as exc:
            self.metrics.error("withheld_events")
            if not self._withheld_unread:
                self._log.warning("cannot read the DeviceWithheld Events: the device metric counts the withheld "
                                  "devices last read until it can", error=str(exc))
            self._withheld_unread = True
            return self._told
        if self._withheld_unread:
            self._log.info("the DeviceWithheld Events can be read again")
            self._withheld_unread = False
        self._told = withheld_from(events)
        return self._told

    # -- processing

    def process_next(self, timeout: float | None = 1.0) -> bool:
        """Process one queued key; False when the queue had nothing within ``timeout``."""
        item = self.queue.get(timeout)
        if item is None:
            return False
        try:
            self.process(item)
            self.queue.forget(item)
        except Exception as exc:  # last resort: an ApiError or a bug is counted and retried with back-off
            api_error = exc if isinstance(exc, ApiError) else None
            kind = "sync"
            if api_error is not None and (api_error.conflict or api_error.throttled):
                kind = "conflict" if api_error.conflict else "throttled"
            self.metrics.error(kind)
            delay = self.queue.add_rate_limited(item)
            if kind == "throttled":
                # The client already retried as the server asked; a busy API server is no fault of ours.
                self._log.info("throttled by the API server, retrying", item=str(item), retry_in=delay)
            else:
                self._log.warning("processing failed, retrying", item=str(item), error=str(exc), retry_in=delay,
                                  exc_info=api_error is None)
        finally:
            self.queue.done(item)
            self.metrics.queue_depth.set(len(self.queue))
        return True

    def process(self, item: Item) -> None:
        kind, key = item
        if not self.leadership.is_leader():
            return
        if kind is Kind.CLAIM:
            self.sync_claim(key)
        elif kind is Kind.CLASS:
            obj = self.classes.store.get(key)
            if obj is not None:
                self.reporter.validate_object(obj, DEVICE_CLASSES)
        elif kind is Kind.TEMPLATE:
            obj = self.templates.store.get(key)
            if obj is not None:
                self.reporter.validate_object(obj, CLAIM_TEMPLATES)
        elif kind is Kind.LEDGER:
            with self._allocation_lock:
                self.allocator.collect_ledger()
        elif kind is Kind.RESCAN:
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
        foreign = foreign_drivers(claim, self.inputs.class_map(), self.driver)
        theirs = foreign is not None and explained_by(annotations_of(claim)) in foreign
        action = classify(claim, waited_for=self.waited_for(key), ours=not theirs)
        if theirs and action is Action.IGNORE and not is_allocated(claim) and not is_deleting(claim):
            log.debug("claim left to its driver's controller", drivers=foreign)
        if action is not Action.EXPLAIN:
            with self._lock:
                self._settled.pop(key, None)
        if action not in (Action.EXPLAIN, Action.ALLOCATE):
            self.reporter.pod_notices.forget_claim(key)
        if action in (Action.IGNORE, Action.CLEAR):
            if not theirs and not is_allocated(claim) and not is_deleting(claim):
                # Nobody waits for it (yet): still flag bad configuration before a node sees it.
                errors = claim_config_errors(claim, self.inputs.class_map(), self.driver)
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
            seen = self.inputs.seen(self.waiting_pods(key))
            with self._lock:
                if self._settled.get(key) == (resource_version(claim), seen):
                    return  # explained as it stands, against what is there now
        if action is Action.ALLOCATE and (refused := self.allocation_refused(claim)) is not None:
            outcome = not_allowed_outcome(refused)
            self.reporter.tell_pods(claim, outcome, self.waiting_pods(key))
            self.reporter.record(claim, outcome, log)
            return
        outcome = self.inputs.outcome_for(claim, require_own_driver=action is Action.ALLOCATE)
        self.reporter.tell_pods(claim, outcome, self.waiting_pods(key))
        if action is Action.EXPLAIN or outcome.verdict is not Verdict.SATISFIABLE:
            result = self.reporter.record(claim, outcome, log)
            if action is Action.EXPLAIN and result is not None:
                with self._lock:
                    self._settled[key] = (resource_version(result), seen)
            return
        with self._allocation_lock:
            self.allocator.allocate(claim, log)

    # -- running

    def healthy(self) -> bool:
        return all(i.synced.is_set() for i in self.informers) and self.clock() - min(self._beats) < 120

    def wait_synced(self, stop: threading.Event, timeout: float = 120.0) -> bool:
        return synced(self.informers, stop, time.monotonic() + timeout)

    def run(self, stop: threading.Event) -> None:
        for inf in self.informers:
            inf.start(stop)
        warm = threading.Thread(target=self.inputs.warm_up, args=(stop, self._working, self.queue.idle),
                                name="inventory", daemon=True)
        warm.start()
        if self.wait_synced(stop):
            self.inputs.warm.wait()
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
        self.count_devices()
        next_resync = self.clock() + self.settings.resync_seconds
        was_leader = self.leadership.is_leader()
        while not stop.wait(1.0):
            self._beats[0] = self.clock()
            leader = self.leadership.is_leader()
            self.metrics.is_leader.set(1 if leader else 0)
            if leader and not was_leader:
                self.became_leader()
            was_leader = leader
            if self.clock() >= next_resync:
                self.resync()
                self.count_devices()
                next_resync = self.clock() + self.settings.resync_seconds
        self.queue.shutdown()
        for w in workers:
            w.join(timeout=5)

    def _work(self, stop: threading.Event, beat: int) -> None:
        while not stop.is_set():
            self._beats[beat] = self.clock()
            try:
                self.process_next(timeout=1.0)
            except Exception:  # last resort: process_next already catches; a worker must not die
                self.metrics.error("loop")
                self._log.exception("worker loop error")


def run(settings: ControllerSettings) -> int:
    """Entry point of ``dra-driver controller``."""
    logs.configure(settings.log_format, settings.log_level)
    log = logs.get("controller", driver=settings.driver_name, identity=settings.identity)
    gc.set_threshold(*GC_THRESHOLDS)
    memory.limit_arenas()  # before any thread starts: see dra_driver.memory
    # Idle connections kept: one per worker and per informer's next list, so a burst of writes
    # does not open (and close again) a TLS connection per request. A KubeconfigError is the
    # command's one-line error (dra_driver.cli).
    api = RestKubeApi.from_kubeconfig(settings.kubeconfig, user_agent=f"dra-driver-controller/{os.getpid()}",
                                      pool_size=WORKERS + 8)
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
