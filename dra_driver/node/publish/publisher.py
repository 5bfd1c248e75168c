"""Keep the node's ResourceSlices equal to the devices the plugin describes (:class:`SlicePublisher`).

It lists the node's slices, plans the writes (:func:`~dra_driver.node.publish.slices.plan`) and
makes them through :class:`dra_driver.k8s.client.KubeApi`, counting every API request; it follows
others' changes (the kubelet wiping the node's slices) with a
:class:`dra_driver.k8s.informer.Informer`, resyncs periodically and backs off after errors. A
device the API server would refuse is left out, never the node
(:mod:`~dra_driver.node.publish.withholding`): the checker's verdicts before any write, and after
a 422 Invalid the devices to blame, found through the refusal's causes or by server-side dry runs;
:meth:`SlicePublisher.degraded` says so (the plugin's ``/readyz``). With an ownership lock
(:mod:`~dra_driver.node.publish.ownership`) it writes nothing until it holds it.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import cast

from dra_driver import logs
from dra_driver.k8s.bodies import CounterSet, RawDevice
from dra_driver.k8s.client import NODES, SLICES, ApiError, KubeApi
from dra_driver.k8s.informer import Informer
from dra_driver.k8s.objects import Obj, meta
from dra_driver.node.metrics import METRICS
from dra_driver.node.publish.checker import Violation
from dra_driver.node.publish.ownership import PublisherLock
from dra_driver.node.publish.slices import (
    API_VERSION,
    KIND,
    Op,
    Plan,
    PoolOwner,
    SliceContent,
    dropped_features,
    plan,
    spec_of,
    split_into_slices,
    validate_pool,
)
from dra_driver.node.publish.withholding import Withholding, blame, withheld_summary

_log = logs.get("slices")


class SlicePublisher:
    """Keeps the node's ResourceSlices equal to the latest :meth:`update`.

    ``run(stop_event)`` watches the node's slices (field selectors ``spec.nodeName`` and
    ``spec.driver``) and re-syncs ``sync_delay`` seconds after a change made by someone else (e.g.
    the kubelet wiping slices), every ``resync_interval`` seconds regardless, and with back-off
    after errors. ``requests`` counts API requests by verb. With an ``ownership`` lock it writes
    nothing until it holds the lock (:mod:`~dra_driver.node.publish.ownership`); :meth:`update`
    keeps the desired state meanwhile.

    ``on_withheld(name, model, violations)`` hears of each device left out, once per device and set of
    rules, from the instance that writes (so two instances do not tell it twice).
    """

    def __init__(self, api: KubeApi, driver_name: str, node_name: str, *, node_uid: str | None = None,
                 resync_interval: float = 300.0, sync_delay: float = 1.0, watch_timeout: int = 300,
                 max_backoff: float = 30.0, ownership: PublisherLock | None = None,
                 on_withheld: Callable[[str, str, list[Violation]], None] | None = None) -> None:
        self.api = api
        self.ownership = ownership
        self.driver_name = driver_name
        self.node_name = node_name
        self.node_uid = node_uid
        self.resync_interval = resync_interval
        self.sync_delay = sync_delay
        self.watch_timeout = watch_timeout
        self.max_backoff = max_backoff
        self.requests: Counter[str] = Counter()
        self.field_selector = f"spec.nodeName={node_name},spec.driver={driver_name}"
        self.last_plan: Plan | None = None
        self.dropped: list[str] = []
        self._lock = threading.RLock()
        self._desired: list[SliceContent] | None = None
        self._accepted: dict[int, SliceContent] = {}
        self._devices: list[Obj] = []
        self._counters: list[Obj] = []
        self._min_generation = 0
        self._wake = threading.Event()
        self._due: float | None = None
        self._own_versions: set[str] = set()
        self._log = _log.bind(node=node_name, driver=driver_name)
        self._withholding = Withholding(driver_name, self._log, on_withheld)
        self.informer = Informer(api, SLICES, self._on_change, field_selector=self.field_selector,
                                 watch_timeout=watch_timeout, max_backoff=max_backoff,
                                 on_undecodable=lambda _bad: METRICS.undecodable_objects.labels(
                                     resource=SLICES.plural).inc())

    # -- desired state ----------------------------------------------------------------------------

    def update(self, devices_json: Sequence[RawDevice], shared_counters_json: Sequence[CounterSet] = ()) -> None:
        """Replace the desired devices and counter sets; a sync follows promptly (``run``). A
        device the API server would refuse is left out (:attr:`withheld`)."""
        # Copies the publisher owns: the slices it lays out are built of them.
        devices = cast(list[Obj], copy.deepcopy(list(devices_json)))
        counters = cast(list[Obj], copy.deepcopy(list(shared_counters_json)))
        with self._lock:
            self._set_desired(devices, counters)
        self.request_sync(0.0)

    def _set_desired(self, devices: list[Obj], counters: list[Obj]) -> None:
        decision = self._withholding.decide(devices)
        slices = split_into_slices(decision.publish, counters)
        validate_pool(slices)
        self._devices, self._counters = devices, counters
        self._desired = slices
        self._accepted = {}
        self._withholding.adopt(decision)

    @property
    def withheld(self) -> dict[str, list[Violation]]:
        """The devices left out of the slices now, by name, with what they break."""
        with self._lock:
            return self._withholding.withheld

    def degraded(self) -> str | None:
        """Why publishing is degraded (devices withheld), or None."""
        with self._lock:
            return withheld_summary(self._withholding.withheld)

    @property
    def devices(self) -> list[Obj]:
        """A copy of the desired devices, withheld ones included (edit and pass back to :meth:`update`)."""
        with self._lock:
            return copy.deepcopy(self._devices)

    @property
    def shared_counters(self) -> list[Obj]:
        with self._lock:
            return copy.deepcopy(self._counters)

    def request_sync(self, delay: float) -> None:
        with self._lock:
            due = time.monotonic() + delay
            self._due = due if self._due is None else min(self._due, due)
        self._wake.set()

    # -- one reconcile ----------------------------------------------------------------------------

    def sync(self) -> Plan | None:
        """List, plan and apply once. None when no desired state has been given yet."""
        with self._lock:
            if self._desired is None:
                return None
            desired = [self._accepted.get(i, s) for i, s in enumerate(self._desired)]
        if not self.node_uid:
            self.requests["get"] += 1
            self.node_uid = str(meta(self.api.get(NODES, self.node_name)).get("uid", ""))
        owner = PoolOwner(self.driver_name, self.node_name, self.node_uid)
        self.requests["list"] += 1
        existing = self.api.list(SLICES, field_selector=self.field_selector).items
        self._tell_withheld()
        result = plan(desired, existing, owner, min_generation=self._min_generation)
        for op in result.ops:
            try:
                self._apply(op)
            except ApiError as exc:
                if exc.invalid and self._blame(op, exc):
                    self._tell_withheld()
                raise
        self._min_generation = max(self._min_generation, result.generation)
        self.last_plan = result
        if result.ops:
            self._log.info("published ResourceSlices", generation=result.generation, slices=result.slice_count,
                           creates=result.count("create"), updates=result.count("update"),
                           deletes=result.count("delete"))
        return result

    def _apply(self, op: Op) -> None:
        if op.kind == "delete":
            self.requests["delete"] += 1
            try:
                self.api.delete(SLICES, op.name, uid=op.uid or None, resource_version=op.resource_version or None)
            except ApiError as exc:
                if not exc.not_found:
                    raise
            METRICS.slice_writes.labels(operation="delete").inc()
            return
        assert op.body is not None and op.index is not None
        if op.kind == "update":
            self.requests["update"] += 1
            stored = self.api.replace(SLICES, dict(op.body, metadata=dict(meta(op.body), name=op.name)))
        else:
            self.requests["create"] += 1
            stored = self.api.create(SLICES, op.body)
        METRICS.slice_writes.labels(operation=op.kind).inc()
        rv = str(meta(stored).get("resourceVersion", ""))
        if rv:
            if len(self._own_versions) > 1000:
                self._own_versions.clear()
            self._own_versions.add(rv)
        self._check_dropped(op.index, op.body, stored)

    def _blame(self, op: Op, exc: ApiError) -> bool:
        """Leave out the devices a refused write is to blame on; whether any was found."""
        devices = list(spec_of(op.body or {}).get("devices") or [])
        blamed = blame(devices, exc.details, exc.message, lambda subset: self._dry_run_refusal(op, subset))
        if not blamed:
            return False
        with self._lock:
            self._withholding.refuse(self._devices, blamed)
            self._set_desired(self._devices, self._counters)
        return True

    def _dry_run_refusal(self, op: Op, devices: list[Obj]) -> str | None:
        """What the API server says of ``op``'s slice holding just ``devices``, in a server-side dry
        run (nothing is stored); None when it accepts it."""
        assert op.body is not None
        spec = dict(spec_of(op.body), devices=devices)
        body = {"apiVersion": API_VERSION, "kind": KIND, "spec": spec,
                "metadata": {"generateName": f"{self.driver_name}-{self.node_name}-check-"}}
        self.requests["create"] += 1
        try:
            self.api.create(SLICES, body, dry_run=True)
        except ApiError as exc:
            if exc.invalid:
                return exc.message or "refused"
            raise
        return None

    def _tell_withheld(self) -> None:
        with self._lock:
            withheld = {name: list(problems) for name, problems in self._withholding.withheld.items()}
            models = dict(self._withholding.models)
        self._withholding.tell(withheld, models)

    def _check_dropped(self, index: int, sent: Obj, stored: Obj) -> None:
        gates = dropped_features(sent, stored)
        if not gates:
            return
        spec = spec_of(stored)
        with self._lock:
            self._accepted[index] = SliceContent(devices=list(spec.get("devices") or []),
                                                 shared_counters=list(spec.get("sharedCounters") or []))
        self.dropped = sorted(set(self.dropped) | set(gates))
        self._log.warning(
            "the apiserver dropped fields of a ResourceSlice; the feature gates are probably disabled",
            slice=meta(stored).get("name"), index=index, feature_gates=gates,
        )

    # -- background loop --------------------------------------------------------------------------

    def run(self, stop_event: threading.Event) -> None:
        """Reconcile until ``stop_event`` is set (blocking; run it in a thread)."""
        if self.ownership is not None and not self.ownership.wait(stop_event):
            return
        self.informer.start(stop_event)
        backoff = min(1.0, self.max_backoff)
        next_resync = time.monotonic()
        while not stop_event.is_set():
            now = time.monotonic()
            with self._lock:
                due = self._due
            wake_at = min(next_resync, due) if due is not None else next_resync
            if now < wake_at:
                self._wake.wait(timeout=min(wake_at - now, 1.0))
                self._wake.clear()
                continue
            with self._lock:
                self._due = None
            try:
                self.sync()
                backoff = min(1.0, self.max_backoff)
                next_resync = time.monotonic() + self.resync_interval
            except Exception as exc:  # last resort: the publisher retries whatever failed
                METRICS.slice_errors.inc()
                self._log.error("publishing ResourceSlices failed; retrying", error=str(exc), retry_in=backoff)
                # A failed periodic resync is still due: without moving it, the loop would retry at
                # once, without end, for as long as the API server stays unreachable.
                next_resync = max(next_resync, time.monotonic() + backoff)
                self.request_sync(backoff)
                backoff = min(backoff * 2, self.max_backoff)
        self._wake.set()

    def start(self, stop_event: threading.Event) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop_event,), name="slice-publisher", daemon=True)
        thread.start()
        return thread

    def _on_change(self, old: Obj | None, new: Obj | None) -> None:
        # Our own writes come back as watch events; only someone else's change (the kubelet wiping
        # the node's slices) needs a sync.
        if new is not None and str(meta(new).get("resourceVersion", "")) in self._own_versions:
            return
        self._log.debug("ResourceSlice changed", slice=meta(new or old or {}).get("name"), deleted=new is None)
        self.request_sync(self.sync_delay)
