"""What the controller's engine decides a claim with, and the warm-up that builds it first.

:class:`EngineInputs` keeps the device inventory (rebuilt from the slices informer's store only
when the slices changed, one build at a time, lending unchanged devices' CEL state to the next),
the DeviceClasses by name, the versions that name what a verdict was computed against, and runs
the engine one evaluation at a time (:meth:`EngineInputs.outcome_for`). Its warm-up
(:meth:`EngineInputs.warm_up`) digests the slices while they are listed and groups the devices
for the classes pending claims ask for before the controller's workers start, the other classes
once the workers are idle. What to do with a claim is decided in
:mod:`dra_driver.controller.verdicts`; :mod:`dra_driver.controller.reconciler` feeds these
inputs from its informer handlers.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, cast

from dra_driver import logs
from dra_driver.allocator.inventory import Inventory, Prebuilt
from dra_driver.allocator.resolve import Engine
from dra_driver.allocator.taintrules import taint_rules, with_taint_rules
from dra_driver.controller.accounting import Accounting
from dra_driver.controller.keys import MAX_SUMMARY_BYTES
from dra_driver.controller.metrics import ControllerMetrics
from dra_driver.controller.placement import allowed_nodes, placement_key, restricting, unconstrained
from dra_driver.controller.rules_source import RulesSource
from dra_driver.controller.verdicts import (
    Outcome,
    Verdict,
    VerdictMemo,
    claim_config_errors,
    evaluate,
    pending_classes,
)
from dra_driver.k8s.bodies import DeviceClasses, RawDeviceClass, RawSlice
from dra_driver.k8s.claims import classes_by_name, pod_node, uid_of
from dra_driver.k8s.fields import one_line
from dra_driver.k8s.informer import Informer
from dra_driver.k8s.objects import Obj, key_of, meta

PREBUILD_EVERY = 0.2
"""Seconds between looks at the slices a streaming list has received so far (see EngineInputs.prebuild)."""
IDLE_POLL = 0.05
"""Seconds between looks at the queue while the warm-up waits for the workers to be idle."""


class EngineInputs:
    """The inventory, the classes and the versions behind a verdict, and the engine that gives it.

    ``waiting_pods`` names the pods that wait for a claim (by key): a claim whose one pod is
    pinned to a node is resolved on that node only, one whose pods are not on the nodes the
    scheduler could place them on (:mod:`dra_driver.controller.placement`, from ``nodes``). The
    devices carry the taints of the DeviceTaintRules in ``taint_rules``, as the scheduler's do.
    The informers are the controller's; this class only reads their stores."""

    def __init__(
        self,
        engine: Engine,
        *,
        driver: str,
        slices: Informer,
        classes: Informer,
        claims: Informer,
        accounting: Accounting,
        rules: RulesSource,
        metrics: ControllerMetrics,
        waiting_pods: Callable[[str], list[Obj]],
        log: logs.Logger,
        taint_rules: Informer | None = None,
        nodes: Informer | None = None,
    ) -> None:
        self.engine = engine
        self.driver = driver
        self.slices = slices
        self.classes = classes
        self.claims = claims
        self.accounting = accounting
        self.rules = rules
        self.metrics = metrics
        self.waiting_pods = waiting_pods
        self.taint_rules = taint_rules
        self.nodes = nodes
        self._log = log
        self._lock = threading.Lock()
        self._slices_version = 0
        self._classes_version = 0
        self._nodes_version = 0
        self._placements: tuple[Any, dict[Any, list[str] | None]] = (None, {})
        """The nodes pods may use, by what they ask of nodes, while the nodes and the inventory stay
        as they are: (state, answers)."""
        self._built: tuple[int, Inventory | None] = (-1, None)
        """The last inventory and the slices version it was built at."""
        self.prebuilt: Prebuilt | None = None
        """Pools digested while the slices were being listed, for the first inventory."""
        self._inventory_lock = threading.Lock()
        self._engine_lock = threading.Lock()
        """Evaluations run one at a time: they are CPU-bound (the GIL gives nothing to a second
        one), and the engine's caches need no locking of their own. Writes run in parallel."""
        self._verdicts = VerdictMemo()
        self.warm = threading.Event()
        """Set once the warm-up has built what the workers need first (or given up)."""

    # -- what changed

    def slices_changed(self) -> None:
        with self._lock:
            self._slices_version += 1

    def classes_changed(self) -> None:
        with self._lock:
            self._classes_version += 1

    def nodes_changed(self) -> None:
        with self._lock:
            self._nodes_version += 1

    def seen(self, pods: Sequence[Obj]) -> tuple[Any, ...]:
        """What a pending claim's explanation depends on besides the claim itself, given the pods
        that wait for it: the versions of the slices, classes and allocations, the node its one
        pod is pinned to, and which pods wait for it (a pod that starts waiting is told the
        verdict), and the scheduler rules."""
        with self._lock:
            return (self._slices_version, self._classes_version, self._nodes_version, self.accounting.version,
                    tuple(sorted({n for p in pods if (n := pod_node(p))})), tuple(key_of(p) for p in pods),
                    self.rules.current())

    # -- the inputs

    def inventory(self) -> Inventory:
        return self._inventory()[1]

    def _inventory(self) -> tuple[int, Inventory]:
        """The inventory and the slices version it is at least as new as."""
        with self._inventory_lock:  # one build at a time; the others take its result
            with self._lock:
                version = self._slices_version
                built_at, last = self._built
            if built_at == version and last is not None:
                return version, last
            # The last inventory lends its devices' CEL state to unchanged devices: a slice update
            # then costs CEL conversions only for the devices it changed.
            prebuilt, self.prebuilt = self.prebuilt, None
            slices = cast(Sequence[RawSlice], self.slices.store.values())
            if self.taint_rules is not None:
                slices = with_taint_rules(slices, taint_rules(self.taint_rules.store.values()))
            inv = self.engine.build_inventory(slices, previous=last, prebuilt=prebuilt)
            with self._lock:
                self._built = (version, inv)
            return version, inv

    def class_map(self) -> dict[str, RawDeviceClass]:
        return classes_by_name(cast(Iterable[RawDeviceClass], self.classes.store.values()))

    def _class_map(self) -> tuple[int, dict[str, RawDeviceClass]]:
        with self._lock:
            version = self._classes_version
        return version, self.class_map()

    def outcome_for(self, claim: Obj, *, claims: Sequence[Obj] | None = None, require_own_driver: bool) -> Outcome:
        """The engine's verdict on ``claim``: against what the other claims hold by the
        controller's accounting, or, given ``claims``, by those (the fresh list an allocation is
        checked against). Explanations of copies share one evaluation (:class:`VerdictMemo`)."""
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
            except Exception as exc:  # last resort: an inventory that cannot be built is the claim's error verdict
                self.metrics.error("inventory")
                msg = f"cannot build the device inventory: {type(exc).__name__}: {exc}"
                return Outcome(verdict=Verdict.ERROR, summary=one_line(msg, MAX_SUMMARY_BYTES), text=msg,
                               config_errors=tuple(claim_config_errors(claim, classes, self.driver)))
            nodes = None
            confined = False
            pods = self.waiting_pods(key_of(claim))
            pinned = {n for p in pods if (n := pod_node(p))}
            if len(pinned) == 1 and len(pods) == 1:
                nodes = sorted(pinned)
            elif not pinned:
                nodes = self.schedulable_nodes(pods, inventory)
                confined = nodes is not None
            rules = self.rules.current()
            memo = None
            if holdings_version is not None and not require_own_driver:
                memo = (self._verdicts, (slices_version, classes_version, holdings_version, rules))
            with self._engine_lock:
                outcome = evaluate(self.engine, claim, inventory, classes, allocated, driver=self.driver, nodes=nodes,
                                   require_own_driver=require_own_driver, memo=memo, rules=rules)
            if confined and nodes is not None and outcome.verdict is Verdict.UNSATISFIABLE:
                outcome = confined_outcome(outcome, len(nodes), len(inventory.node_names))
            return outcome
        finally:
            self.metrics.resolve_seconds.observe(time.perf_counter() - t0)

    def schedulable_nodes(self, pods: Sequence[Obj], inventory: Inventory) -> list[str] | None:
        """The inventory's nodes that every one of ``pods`` could be scheduled to, None when that is
        all of them. Pods made from one template ask the same of nodes and share the answer; pods
        that name no nodes look only at tainted and cordoned ones."""
        if not pods or self.nodes is None:
            return None
        with self._lock:
            state = (self._nodes_version, id(inventory))
            if self._placements[0] != state:
                self._placements = (state, {})
            answers = self._placements[1]
        key = tuple(sorted({placement_key(p) for p in pods}))
        if key in answers:
            return answers[key]
        views = self.nodes.store.values()
        known = {str(meta(n).get("name")): n for n in views}
        candidates = None
        if all(unconstrained(p) for p in pods):
            candidates = sorted(restricting(views) & set(inventory.node_names))
        answer = allowed_nodes(pods, inventory.node_names, known, candidates)
        with self._lock:
            if self._placements[0] == state:
                answers[key] = answer
        return answer

    # -- the warm-up

    def warm_up(self, stop: threading.Event, working: threading.Event, idle: Callable[[], bool]) -> None:
        """Build the device inventory, group its devices the way a claim for one device of a
        DeviceClass does, and add up what the claims hold, before the workers start (``working``
        is set once they run): at 5,000 nodes the inventory takes a couple of seconds, each
        grouping a few tenths and the sum of 20,000 claims tens of milliseconds, which would
        otherwise be the first claims' wait. It starts as soon as the slices are listed, while
        the other lists still wait for the API server. Later slice changes only rebuild what they
        touched, when a claim next asks.

        Only the classes that pending claims ask for are grouped before the workers start; the
        others (the dynamic-MIG class is the costliest: 76,000 partitionable devices at 5,000
        nodes) once the workers have nothing to do (``idle``), so that no claim waits for a class
        it does not use."""
        try:
            if not self.prebuild(stop):
                return
            t0 = time.perf_counter()
            try:
                inventory = self.inventory()
            except Exception as exc:  # the first claim's evaluation reports it, with the claim
                self._log.warning("cannot build the device inventory yet", error=f"{type(exc).__name__}: {exc}")
                return
            self._log.info("device inventory built", devices=len(inventory.devices),
                           seconds=round(time.perf_counter() - t0, 3))
            if not synced((self.classes, self.claims), stop):
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
            self.warm.set()
        rest = sorted(classes.keys() - set(wanted))
        while not working.wait(IDLE_POLL):
            if stop.is_set():
                return
        for name in rest:
            while not idle():
                if stop.wait(IDLE_POLL):
                    return
            classes = self.class_map()
            if name not in classes:
                continue
            try:
                inventory = self.inventory()  # the slices may have changed meanwhile
            except Exception:  # last resort: the next claim's evaluation reports it, with the claim
                return
            self._prime(inventory, [name], classes)
        gc.freeze()
        self._log.info("warm-up over", classes=len(classes), grouped_first=len(wanted))

    def _prime(self, inventory: Inventory, names: Sequence[str], classes: DeviceClasses) -> None:
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

    def prebuild(self, stop: threading.Event) -> bool:
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
        self.prebuilt = prebuilt
        self._log.info("pools digested while the slices arrived", pools=len(prebuilt.pools), slices=taken,
                       seconds=round(time.perf_counter() - t0, 3))
        return True


def confined_outcome(outcome: Outcome, allowed: int, total: int) -> Outcome:
    """An unsatisfiable verdict on the nodes its pods could be scheduled to, saying so."""
    note = (f"on the {allowed} of {total} nodes with devices that its pods can be scheduled to (node selector, "
            "node affinity, node taints, cordons): ")
    return replace(outcome, summary=one_line(note + outcome.summary, MAX_SUMMARY_BYTES), text=note + outcome.text)


def synced(informers: Sequence[Informer], stop: threading.Event, deadline: float | None = None) -> bool:
    """Wait until every one of ``informers`` has synced; False once ``stop`` is set or ``deadline``
    (monotonic) has passed."""
    for inf in informers:
        while not inf.synced.wait(0.2):
            if stop.is_set() or (deadline is not None and time.monotonic() > deadline):
                return False
    return True
