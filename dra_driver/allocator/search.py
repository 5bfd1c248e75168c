"""The scheduler's search: requests, constraints, consumption and backtracking over one node's devices."""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dra_driver.allocator.capacity import capacities, consumption
from dra_driver.allocator.context import Abort, Ctx
from dra_driver.allocator.inventory import Device, DeviceKey, key_str, on_node
from dra_driver.allocator.requests import Alt, Constraint, UnsupportedAttribute, lookup_attribute, taint_blocking
from dra_driver.allocator.rules import SchedulerRules
from dra_driver.k8s.objects import Node
from dra_driver.k8s.quantity import Quantity

MAX_RESULTS = 32  # AllocationResultsMaxSize
MAX_SEARCH_STEPS = 50_000  # allocateOne calls per claim before giving up as "too complex"
SHARE_NS = uuid.UUID("6f1d1c2e-5b7a-4c0e-9d51-2f0a4c7b9e11")


@dataclass
class _Result:
    alt: Alt
    dev: Device
    consumed: dict[str, Quantity] | None


class Search:
    """Backtracking first-fit search for one claim on one node."""

    def __init__(self, ctx: Ctx, node: Node, devices: list[Device]) -> None:
        self.ctx = ctx
        self.node = node
        self.devices = devices
        self.allocating: Counter[DeviceKey] = Counter()
        self.capacity: dict[DeviceKey, dict[str, Fraction]] = {}
        self.counters: dict[tuple[str, str], dict[str, dict[str, Fraction]]] = {}
        self.results: list[_Result] = []
        self.chosen: dict[int, int] = {}
        self.steps = 0
        self.all_devices: dict[int, list[Device]] = {}
        for c in ctx.constraints:
            c.value, c.members, c.seen, c.latest = None, 0, Counter(), {}

    def run(self) -> bool:
        self.validate()
        return self.request(0)

    def validate(self) -> None:
        """What the scheduler checks per node before searching, for every request and subrequest.

        ``All`` requests are sized up front: an incomplete pool or a CEL runtime error among
        the node's devices is an error even when an earlier request would have failed anyway.
        Then the claim's fewest possible results (per request, its smallest alternative, an
        ``All`` one at its size on this node) must stay within the limit, else it is an error.
        """
        rules = self.ctx.rules
        minimum = 0
        for alts in self.ctx.requests:
            sizes = []
            for alt in alts:
                if alt.error:
                    raise Abort(f"request {alt.name}: {alt.error}", request=alt.name)
                if alt.mode != "All":
                    sizes.append(alt.count)
                    continue
                for pool in self.ctx.inventory.pools:
                    if not pool.usable and any(on_node(d, self.node) for d in pool.devices):
                        state = "being updated (incomplete)" if not pool.complete else f"invalid ({pool.invalid})"
                        # 1.38 fails this node only (#141898), 1.36 and 1.37 the whole attempt.
                        raise Abort(f"request {alt.name}: asks for all devices, but resource pool {pool.label} is {state}",
                                    fatal=not rules.all_fails_node_only, request=alt.name)  # fmt: skip
                # Sized before anything is allocated: against the devices' totals (1.37), or with
                # other claims' shares taken off (1.36).
                static = rules.all_sized_by_static_capacity
                q = rules.qualified_names
                self.all_devices[id(alt)] = [
                    d for d in self.devices if self.ctx.selectable(alt, d) and self.ctx.capacity_named(alt, d)
                    and (consumption(d, alt.capacity, q) if static else self.capacity_fits(d, alt)) is not None]  # fmt: skip
                sizes.append(len(self.all_devices[id(alt)]))
            if rules.claim_limit_per_request and min(sizes) > MAX_RESULTS - minimum:
                raise Abort(f"request {alts[0].base}: adding {min(sizes)} devices exceeds the claim limit of {MAX_RESULTS}, "
                            f"with {minimum} already accounted for", request=alts[0].base)  # fmt: skip
            minimum += min(sizes)
        if minimum > MAX_RESULTS:
            raise Abort(f"number of requested devices {minimum} exceeds the claim limit of {MAX_RESULTS}")

    def request(self, ri: int) -> bool:
        if ri >= len(self.ctx.requests):
            return True
        alts = self.ctx.requests[ri]
        for ai, alt in enumerate(alts):
            if self.alt(ri, alt):
                self.chosen[ri] = ai
                return True
        return False

    def alt(self, ri: int, alt: Alt) -> bool:
        if alt.mode == "All":
            return self.alt_all(ri, alt)
        if len(self.results) + alt.count > MAX_RESULTS:
            return False
        return self.pick(ri, alt, alt.count, 0)

    def tick(self) -> None:
        self.steps += 1
        if self.steps > MAX_SEARCH_STEPS:
            raise Abort(f"search too complex (more than {MAX_SEARCH_STEPS} steps)", fatal=False)

    def pick(self, ri: int, alt: Alt, remaining: int, start: int) -> bool:
        self.tick()
        if remaining == 0:
            return self.request(ri + 1)
        for pos in range(start, len(self.devices)):
            if len(self.devices) - pos < remaining and not any(
                    self.ctx.raises(alt, d) for d in self.devices[pos:] if not self.in_use(alt, d)):
                # Not enough devices left for the rest of this request.  The scheduler still tries
                # each of them, so stopping early is only right when none of them would stop it
                # with a CEL runtime error (as in eligible(), a device in use is not evaluated).
                return False
            dev = self.devices[pos]
            if not self.eligible(alt, dev):
                continue
            undo = self.allocate(alt, dev, must=False)
            if undo is None:
                continue
            if self.pick(ri, alt, remaining - 1, pos + 1):
                return True
            undo()
        return False

    def alt_all(self, ri: int, alt: Alt) -> bool:
        wanted = self.all_devices[id(alt)]
        if not wanted:
            return False
        if len(self.results) + len(wanted) > MAX_RESULTS:
            return False
        undos = []
        for dev in wanted:
            self.tick()
            undo = self.allocate(alt, dev, must=True)
            if undo is None:
                break
            undos.append(undo)
        else:
            if self.request(ri + 1):
                return True
        for undo in reversed(undos):
            undo()
        return False

    def in_use(self, alt: Alt, dev: Device) -> bool:
        if dev.allow_multi:
            return False
        if alt.admin:
            return self.allocating[dev.key] > 0
        return self.ctx.taken(dev) or self.allocating[dev.key] > 0

    def eligible(self, alt: Alt, dev: Device) -> bool:
        # Same order as the scheduler: "in use" is cheap and checked before selectors,
        # so a CEL error on a device that is in use never surfaces; then the capacity names.
        if self.in_use(alt, dev):
            return False
        return self.ctx.selectable(alt, dev) and self.ctx.capacity_named(alt, dev)

    def allocate(self, alt: Alt, dev: Device, must: bool) -> Any:
        """Tentatively allocate; returns an undo callable or None."""
        if self.in_use(alt, dev):
            return None
        shared_in_use = dev.key in self.ctx.allocated.shared or dev.key in self.capacity
        use_counters = bool(dev.consumes) and not (dev.allow_multi and shared_in_use)
        if use_counters and not self.take_counters(dev):
            return None
        if taint_blocking(dev, alt) is not None:
            if use_counters:
                self.release_counters(dev)
            return None
        # Constraints before capacity, in the scheduler's allocateDevice order: for an ``All``
        # request (``must``) a constraint that rejects the device is an error even where its
        # capacity would not have fitted either.
        added: list[Constraint] = []
        rules = self.ctx.rules
        for c in self.ctx.constraints:
            if not c.applies(alt):
                continue
            try:
                fits = _constraint_add(c, alt, dev, rules)
            except UnsupportedAttribute as exc:
                raise Abort(f"request {alt.name}: {exc}", request=alt.name, device=dev.key) from None
            if not fits:
                for a in added:
                    _constraint_remove(a, alt, dev, rules)
                if use_counters:
                    self.release_counters(dev)
                if must:
                    raise Abort(f"request {alt.name}: cannot add device {key_str(dev.key)} because a claim "
                                "constraint would not be satisfied", request=alt.name, device=dev.key)  # fmt: skip
                return None
            added.append(c)
        consumed = self.capacity_fits(dev, alt)
        if consumed is None:
            for a in added:
                _constraint_remove(a, alt, dev, rules)
            if use_counters:
                self.release_counters(dev)
            return None
        if not dev.allow_multi:
            self.allocating[dev.key] += 1
        if dev.allow_multi:
            cur = self.capacity.setdefault(dev.key, {})
            for k, v in consumed.items():
                cur[k] = cur.get(k, Fraction(0)) + v.value
        self.results.append(_Result(alt, dev, consumed if dev.allow_multi else None))

        def undo() -> None:
            self.results.pop()
            for a in added:
                _constraint_remove(a, alt, dev, rules)
            if dev.allow_multi:
                cur = self.capacity[dev.key]
                for k, v in consumed.items():
                    cur[k] -= v.value
                if all(v == 0 for v in cur.values()):
                    del self.capacity[dev.key]
            else:
                self.allocating[dev.key] -= 1
            if use_counters:
                self.release_counters(dev)

        return undo

    def capacity_fits(self, dev: Device, alt: Alt) -> dict[str, Quantity] | None:
        """What ``alt`` consumes on ``dev`` with what others hold of it, keyed like
        :func:`capacities` under the context's rules; None when it does not fit.

        Every device, as in every scheduler version (CmpRequestOverCapacity runs for each device
        while consumable capacity is on): a device that no longer allows multiple allocations but
        still carries another claim's share with a ``consumedCapacity`` has that much less left,
        and exclusive use, which consumes all of it, does not fit."""
        qualified = self.ctx.rules.qualified_names
        consumed = consumption(dev, alt.capacity, qualified)
        if consumed is None:
            return None
        before = self.ctx.allocated.shared_by(qualified).get(dev.key, {})
        now = self.capacity.get(dev.key, {})
        totals = capacities(dev, qualified)
        for name, value in consumed.items():
            if before.get(name, 0) + now.get(name, 0) + value.value > totals[name][0].value:
                return None
        return consumed

    def take_counters(self, dev: Device) -> bool:
        pool_id = (dev.key[0], dev.key[1])
        used = self.counters.setdefault(pool_id, {})
        for cs, counters in dev.consumes:
            target = used.setdefault(cs, {})
            for name, value in counters.items():
                target[name] = target.get(name, Fraction(0)) + value
        available = self.ctx.available_counters(pool_id)
        for cs, counters in available.items():
            for name, value in counters.items():
                if used.get(cs, {}).get(name, 0) > value:
                    self.release_counters(dev)
                    return False
        return True

    def release_counters(self, dev: Device) -> None:
        used = self.counters[(dev.key[0], dev.key[1])]
        for cs, counters in dev.consumes:
            for name, value in counters.items():
                used[cs][name] -= value


def _constraint_add(c: Constraint, alt: Alt, dev: Device, rules: SchedulerRules) -> bool:
    """Raises :class:`UnsupportedAttribute` (1.38) for a value the constraint cannot compare."""
    attr = lookup_attribute(dev, c.attribute, rules)
    if attr is None:
        return False
    if c.kind == "match":
        if c.members > 0 and attr != c.value:
            return False
        if c.members == 0:
            c.value = attr
        c.members += 1
        return True
    if c.latest_only:
        if c.members > 0 and attr in c.latest.values():
            return False
        c.latest[alt.base] = attr
        c.members += 1
        return True
    if c.seen[attr] > 0:
        return False
    c.seen[attr] += 1
    return True


def _constraint_remove(c: Constraint, alt: Alt, dev: Device, rules: SchedulerRules) -> None:
    attr = lookup_attribute(dev, c.attribute, rules)
    if c.kind == "match":
        c.members -= 1
    elif c.latest_only:
        # As in 1.36: the request's entry goes, even when earlier devices of the request remain.
        c.latest.pop(alt.base, None)
        c.members -= 1
    elif attr is not None:
        c.seen[attr] -= 1
