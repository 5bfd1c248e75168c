"""What is fixed for one claim's resolution, shared by the search on each node and by the funnel
that explains a claim the search could not allocate: the claim's requests and constraints, the
inventory and what other claims hold, the selectors' outcomes (each group of alike devices
evaluated once), and :class:`Abort`, the error that ends a node's search or the whole attempt."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from functools import lru_cache
from typing import Any

from dra_driver.allocator.capacity import requested_twice
from dra_driver.allocator.cel.compile import CompiledSelector
from dra_driver.allocator.cel.errors import CelError
from dra_driver.allocator.cel.reads import NOTHING, Reads, selector_reads
from dra_driver.allocator.groups import Coarse, Partition, Projection, outcome, partition
from dra_driver.allocator.inventory import AllocatedState, Device, DeviceKey, Inventory, Pool, key_str
from dra_driver.allocator.requests import Alt, Constraint, UnsupportedAttribute, lookup_attribute
from dra_driver.allocator.rules import SchedulerRules

# Marks explanation errors that the scheduler reports as SchedulerError (not Unschedulable).
SCHEDULER_ABORTS = "the kube-scheduler stops the whole scheduling attempt"


class Abort(Exception):
    """Stops the search on one node.

    ``fatal`` mirrors the allocator's error kinds: a fatal error (CEL runtime error, a
    constraint that rejects a device an ``All`` request must take, an ``All`` request over an
    incomplete pool, a broken request) makes the scheduler's Filter return an error, which ends
    the whole scheduling attempt, whatever other nodes would have offered.  Only running out of
    search budget (the scheduler's filter timeout) fails just the one node.
    """

    def __init__(self, message: str, fatal: bool = True, *, request: str | None = None, device: DeviceKey | None = None,
                 selector: str | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.fatal = fatal
        # What the scheduler's error names: the request (a subrequest as "req/sub"), the device,
        # the selector ("class <name> selector #i" or "request <name> selector #i").
        self.request, self.device, self.selector = request, device, selector


@dataclass
class Ctx:
    """Everything fixed for one resolve() call (shared by the per-node searches)."""

    claim: Mapping[str, Any]
    inventory: Inventory
    allocated: AllocatedState
    requests: list[list[Alt]]
    constraints: list[Constraint]
    rules: SchedulerRules = field(default_factory=SchedulerRules)
    # Selector outcomes of devices looked at one by one, by (alternative number, device index).
    verdicts: dict[tuple[int, int], Verdict] = field(default_factory=dict)
    # ... and of groups, by (alternative number, group number).
    group_verdicts: dict[tuple[int, int], Verdict] = field(default_factory=dict)
    # id(alt) -> (what each stage removed, the survivors): the funnel's record, kept for explaining
    # a claim that is not allocated (allocator.funnel).
    funnels: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    alt_ids: dict[int, int] = field(default_factory=dict)
    partitions: dict[int, Partition | None] = field(default_factory=dict)
    available: dict[tuple[str, str], dict[str, dict[str, Fraction]]] = field(default_factory=dict)
    _consumed_in: dict[int, bool] = field(default_factory=dict)

    def alt_id(self, alt: Alt) -> int:
        return self.alt_ids.setdefault(id(alt), len(self.alt_ids))

    def partition(self, alt: Alt) -> Partition | None:
        """The inventory's devices grouped by what ``alt``'s selectors and the funnel read; None
        when a selector reads the whole device (its devices are then looked at one by one)."""
        aid = self.alt_id(alt)
        if aid not in self.partitions:
            expressions = tuple(sel.expression for _, sel in alt.compiled)
            reads = reads_of(expressions)
            inv = self.inventory
            flags = bool(inv.multi or inv.consumers)
            projection = Projection(reads, capacity=bool(alt.capacity or inv.multi), flags=flags)
            within = expressions[:alt.class_selectors]
            class_reads = reads_of(within)
            if reads.whole:
                self.partitions[aid] = None
            elif within and not class_reads.whole and class_reads != reads:  # the request reads more
                # The class's grouping is there from the first claim of the class on (the
                # controller builds it at start): the request's selectors then read only the
                # devices the class accepts, not every device of the fleet.
                class_projection = Projection(class_reads, capacity=bool(inv.multi), flags=flags)
                compiled = alt.compiled[:alt.class_selectors]
                rules = self.rules

                def coarse() -> Coarse:
                    part = partition(inv, class_projection)
                    return Coarse(part, frozenset(g for g, group in enumerate(part.groups)
                                                  if _evaluate_selectors(compiled, group.rep, rules) is None))

                self.partitions[aid] = partition(inv, replace(projection, within=within), coarse)
            else:
                self.partitions[aid] = partition(inv, projection)
        return self.partitions[aid]

    def group_verdict(self, alt: Alt, part: Partition, g: int) -> Verdict:
        key = (self.alt_id(alt), g)
        if key not in self.group_verdicts:
            self.group_verdicts[key] = _evaluate(alt, part.groups[g].rep, self.rules)
        return self.group_verdicts[key]

    def verdict(self, alt: Alt, dev: Device) -> Verdict:
        """Selector outcome, cached: evaluation is pure, so each group (or device looked at alone)
        is evaluated once."""
        part = self.partition(alt)
        if part is not None:
            g = part.group_of[dev.index]
            if g >= 0:
                return self.group_verdict(alt, part, g)
        key = (self.alt_id(alt), dev.index)
        if key not in self.verdicts:
            self.verdicts[key] = _evaluate(alt, dev, self.rules)
        return self.verdicts[key]

    def cel_error_seen(self) -> bool:
        """Whether a selector failed with a CEL runtime error on a device the funnel looked at."""
        return any(v is not None and isinstance(v[1], CelError)
                   for v in (*self.verdicts.values(), *self.group_verdicts.values()))

    def selectable(self, alt: Alt, dev: Device) -> bool:
        v = self.verdict(alt, dev)
        if v is None:
            return True
        if isinstance(v[1], CelError):
            label, err = alt.compiled[v[0]][0], v[1]
            raise Abort(f"{label} on device {key_str(dev.key)}: CEL runtime error: {err.message}", request=alt.name,
                        device=dev.key, selector=label)  # fmt: skip
        return False

    def raises(self, alt: Alt, dev: Device) -> bool:
        """Whether looking at ``dev`` for ``alt`` may end the attempt: a CEL runtime error, or (1.38)
        a capacity the request names twice, or an attribute a constraint on the request cannot
        compare (the scheduler tries the device even where too few are left to fill the request)."""
        v = self.verdict(alt, dev)
        if v is not None:
            return isinstance(v[1], CelError)
        if alt.capacity and requested_twice(dev, alt.capacity, self.rules.qualified_names) is not None:
            return True
        return self.rules.constraint_type_errors and any(
            c.applies(alt) and _uncomparable(dev, c.attribute, self.rules) for c in self.constraints)

    def capacity_named(self, alt: Alt, dev: Device) -> bool:
        """True, or (1.38) the error of a request that names one of the device's capacities both
        ways, raised for the first device the search looks at after its selectors."""
        if alt.capacity and self.rules.qualified_names:
            twice = requested_twice(dev, alt.capacity, True)
            if twice is not None:
                raise Abort(f"request {alt.name}: checking capacity for device {key_str(dev.key)}: {twice}",
                            request=alt.name, device=dev.key)
        return True

    def taken(self, dev: Device) -> bool:
        """Whether another claim holds ``dev``, a device that does not allow multiple allocations,
        for anyone but admin access: allocated to it, or (1.38, #140798) shared by other claims
        while the device still allowed it."""
        key = dev.key
        return key in self.allocated.devices or (self.rules.shares_block_exclusive and key in self.allocated.shared)

    def taken_keys(self) -> set[DeviceKey] | frozenset[DeviceKey]:
        """The keys of the devices :meth:`taken` is true for (when they do not allow multiple allocations)."""
        if not self.rules.shares_block_exclusive or not self.allocated.shared:
            return self.allocated.devices
        by_key = self.inventory.by_key
        return self.allocated.devices | {k for k in self.allocated.shared
                                         if (d := by_key.get(k)) is not None and not d.allow_multi}

    def consumed_in(self, pool: Pool) -> bool:
        """Whether other claims' devices of ``pool`` may consume its counters."""
        found = self._consumed_in.get(id(pool))  # the pool outlives this context
        if found is None:
            keys = pool.consumer_keys()
            found = self._consumed_in[id(pool)] = not (
                keys.isdisjoint(self.allocated.devices) and keys.isdisjoint(self.allocated.shared))
        return found

    def available_counters(self, pool_id: tuple[str, str]) -> dict[str, dict[str, Fraction]]:
        if pool_id not in self.available:
            pool = self.inventory.pool_map[pool_id]
            avail = {cs: dict(c) for cs, c in pool.counter_sets.items()}
            exclusive, shared = self.allocated.devices, self.allocated.shared
            for dev in pool.devices:
                if dev.has_consumes and (dev.key in exclusive or dev.key in shared):
                    for cs, counters in dev.consumes:
                        for name, value in counters.items():
                            if name in avail.get(cs, {}):
                                avail[cs][name] -= value
            self.available[pool_id] = avail
        return self.available[pool_id]


@lru_cache(maxsize=1024)
def reads_of(expressions: tuple[str, ...]) -> Reads:
    """What a list of selectors reads together."""
    reads = NOTHING
    for expression in expressions:
        reads = reads.union(selector_reads(expression))
    return reads


# None: all selectors true; else (index of the first selector that failed, False or the error).
Verdict = tuple[int, "bool | CelError"] | None


def _evaluate(alt: Alt, dev: Device, rules: SchedulerRules) -> Verdict:
    return _evaluate_selectors(alt.compiled, dev, rules)


def _evaluate_selectors(compiled: Sequence[tuple[str, CompiledSelector]], dev: Device, rules: SchedulerRules) -> Verdict:
    """The device read as ``rules``' scheduler reads it (``qualified_names``, ``cel_converts_on_read``:
    see :func:`device_activation`)."""
    for i, (_, sel) in enumerate(compiled):
        if sel.driver_equals is not None and dev.cel_clean and sel.poisoned is None:
            # What sel.evaluate would answer (the activation's driver is key[0] and it has no
            # error), without building the activation.
            if dev.key[0] != sel.driver_equals:
                return (i, False)
            continue
        result = outcome(sel, dev, rules.qualified_names, rules.cel_converts_on_read)
        if result is not True:
            return (i, result)
    return None


def _uncomparable(dev: Device, attribute: str, rules: SchedulerRules) -> bool:
    try:
        lookup_attribute(dev, attribute, rules)
    except UnsupportedAttribute:
        return True
    return False
