"""Why a request found no device: how many devices each stage kept, the closest candidates grouped
by how they failed, what shareable devices have left, and what the claim's constraints met per node.

The funnel works on groups of devices that agree on everything its stages read
(:mod:`dra_driver.allocator.groups`): a selector is decided once per group, and what a stage removes
is kept as a :class:`Loss` (the stage, the reason, the devices), not per device. Devices that cannot
be grouped (a broken CEL input, a selector that reads the whole device) go through one by one.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache, partial
from itertools import islice
from typing import Any

from dra_driver.allocator.capacity import (
    capacities,
    capacity_problem,
    consumption,
    requested_twice,
    show,
    status_name,
)
from dra_driver.allocator.cel.errors import CelError
from dra_driver.allocator.context import Ctx, Verdict
from dra_driver.allocator.explanation import (
    TAINT_STAGE,
    CandidateNote,
    CelIssue,
    Explanation,
    RequestExplanation,
    StageCount,
)
from dra_driver.allocator.groups import Partition, remembered
from dra_driver.allocator.inventory import Device, DeviceKey, Pool, key_str
from dra_driver.allocator.readings import Reading, describe, readings, values_key
from dra_driver.allocator.requests import Alt, lookup_attribute, taint_blocking
from dra_driver.allocator.taintrules import RULE_KEY
from dra_driver.k8s.objects import as_list, as_mapping, as_str

MAX_CLOSEST = 5  # groups of devices shown per request
MAX_NAMED = 8  # device names kept per group (the first ones and the last)
MAX_NODES = 5  # nodes named per constraint


@dataclass(frozen=True)
class _SelectorFalse:
    index: int  # which of the alternative's compiled selectors


# Why a device left the funnel: text, or a false selector (described from the values it read).
Reason = str | _SelectorFalse


@dataclass
class Loss:
    """Devices one stage removed for one reason. ``members`` are device indices in inventory order,
    or (for devices allocated to other claims) their keys, ordered when the explanation needs them."""

    stage: int
    reason: Reason
    members: Sequence[int] | frozenset[DeviceKey] | set[DeviceKey]
    rep: Device | None = None  # for a false selector: a device whose values stand for all members

    def indices(self, ctx: Ctx) -> Sequence[int]:
        if isinstance(self.members, (set, frozenset)):
            by_key = ctx.inventory.by_key
            self.members = sorted(by_key[k].index for k in self.members)
        return self.members


class Survivors:
    """The candidates a funnel left: whole groups less the members later stages removed, and the
    devices looked at one by one."""

    def __init__(self, ctx: Ctx, part: Partition | None, groups: Iterable[int], single: Iterable[Device]) -> None:
        self.ctx = ctx
        self.part = part
        self.groups = dict.fromkeys(groups)  # group numbers, in order (a dict: a selector on UUIDs makes thousands)
        self.single = {d.index: d for d in single}  # in inventory order
        self.removed: set[int] = set()  # indices of group members removed
        # Keys of group members allocated to other claims, by group number.
        self.taken: dict[int, set[DeviceKey] | frozenset[DeviceKey]] = {}
        self.lost: Counter[int] = Counter()  # group number -> members removed or taken

    def group_of(self, dev: Device) -> int:
        return self.part.group_of[dev.index] if self.part is not None else -1

    def contains(self, dev: Device) -> bool:
        g = self.group_of(dev)
        if g < 0:
            return dev.index in self.single
        return g in self.groups and dev.index not in self.removed and dev.key not in self.taken.get(g, ())

    def remove(self, dev: Device) -> None:
        g = self.group_of(dev)
        if g < 0:
            del self.single[dev.index]
        else:
            self.removed.add(dev.index)
            self.lost[g] += 1

    def alive_in(self, g: int) -> int:
        assert self.part is not None
        return len(self.part.groups[g].members) - self.lost[g]

    def count(self) -> int:
        return sum(self.alive_in(g) for g in self.groups) + len(self.single)

    def any(self, test: Callable[[Device], bool]) -> bool:
        """Whether ``test`` holds for a survivor; ``test`` must read only what the groups agree on
        (Projection.flags: shareable, consumes counters)."""
        if any(test(d) for d in self.single.values()):
            return True
        part = self.part
        return part is not None and any(self.alive_in(g) > 0 and test(part.groups[g].rep) for g in self.groups)

    def members(self, g: int) -> Sequence[int]:
        assert self.part is not None
        members = self.part.groups[g].members
        if not self.lost[g]:
            return members
        devices = self.ctx.inventory.devices
        taken, removed = self.taken.get(g, ()), self.removed
        return [i for i in members if i not in removed and devices[i].key not in taken]

    def devices(self) -> Iterator[Device]:
        """Every survivor, in inventory order."""
        devices = self.ctx.inventory.devices
        streams: list[Sequence[int]] = [self.members(g) for g in self.groups]
        streams.append(list(self.single))
        for i in heapq.merge(*streams):
            yield devices[i]


def funnel(ctx: Ctx, alt: Alt) -> RequestExplanation:
    """The stage counts for ``alt``; what each stage removed, and the survivors, go to ``ctx`` for
    :func:`explain_failure` (only a claim that is not allocated needs them)."""
    info = RequestExplanation(alt.name, alt.class_name, alt.mode, alt.count if alt.mode == "ExactCount" else None)
    if alt.error:
        info.error = alt.error
        return info
    inventory = ctx.inventory
    losses: list[Loss] = []
    info.stages.append(StageCount("devices published", len(inventory.devices)))

    kept = len(inventory.devices)
    for pool in inventory.unusable:
        if pool.devices:
            reason = "pool incomplete" if not pool.complete else f"pool invalid: {pool.invalid}"
            losses.append(Loss(len(info.stages), reason, [d.index for d in pool.devices]))
            kept -= len(pool.devices)
    info.stages.append(StageCount("in complete, valid pools", kept))

    part = ctx.partition(alt)
    if part is not None:
        alive = Survivors(ctx, part, range(len(part.groups)), inventory.unclean)
    else:
        alive = Survivors(ctx, None, [], [d for p in inventory.pools if p.usable for d in p.devices])
    _selector_stages(info, ctx, alt, alive, losses)

    def stage(name: str, check: Callable[[Device], Reason | None], candidates: Sequence[Device]) -> None:
        """A stage that looks at ``candidates`` (the only survivors it can remove) one by one."""
        number = len(info.stages)
        for d in candidates:
            if alive.contains(d):
                reason = check(d)
                if reason is not None:
                    alive.remove(d)
                    losses.append(Loss(number, reason, [d.index]))
        info.stages.append(StageCount(name, alive.count()))

    stage(TAINT_STAGE, lambda d: _taint_reason(d, alt), inventory.tainted)
    if alt.capacity or alive.any(lambda d: d.allow_multi):
        _capacity_stage(info, alt, alive, losses, ctx.rules.qualified_names)
    shared = [d for k in ctx.allocated.shared if (d := inventory.by_key.get(k)) is not None]
    if any(alive.contains(d) for d in shared):
        stage("capacity left by other claims", lambda d: _shared_reason(ctx, d, alt), sorted(shared, key=lambda d: d.index))
    if not alt.admin:
        _allocated_stage(info, ctx, alive, losses)
    if alive.any(lambda d: d.has_consumes):
        _counter_stage(info, ctx, alive, losses)
    ctx.funnels[id(alt)] = (losses, alive)
    return info


def evaluate_selectors(ctx: Ctx, alt: Alt) -> None:
    """The selector verdicts :func:`funnel` evaluates for ``alt`` (every group and every device
    looked at alone), into ``ctx``, without counting anything: what an allocation without an
    explanation needs of the funnel (whether a CEL runtime error was seen decides how far the
    search must go)."""
    if alt.error:
        return
    part = ctx.partition(alt)
    if part is not None:
        for g in range(len(part.groups)):
            ctx.group_verdict(alt, part, g)
        single: Iterable[Device] = ctx.inventory.unclean
    else:
        single = [d for p in ctx.inventory.pools if p.usable for d in p.devices]
    for d in single:
        ctx.verdict(alt, d)


def _selector_stages(info: RequestExplanation, ctx: Ctx, alt: Alt, alive: Survivors, losses: list[Loss]) -> None:
    part = alive.part
    group_verdicts = {g: ctx.group_verdict(alt, part, g) for g in alive.groups} if part is not None else {}
    single_verdicts = {i: ctx.verdict(alt, d) for i, d in alive.single.items()}
    for i, (label, _) in enumerate(alt.compiled):
        number = len(info.stages)
        errors: list[tuple[Sequence[int], CelError]] = []
        for g in [g for g in alive.groups if _fails_at(group_verdicts[g], i)]:
            assert part is not None
            group = part.groups[g]
            losses.append(_selector_loss(number, i, label, group_verdicts[g], group.members, group.rep, errors))
            del alive.groups[g]
        for d in [d for d in alive.single.values() if _fails_at(single_verdicts[d.index], i)]:
            losses.append(_selector_loss(number, i, label, single_verdicts[d.index], [d.index], d, errors))
            del alive.single[d.index]
        _note_cel_errors(info, ctx, label, errors)
        info.stages.append(StageCount(label, alive.count()))


def _fails_at(verdict: Verdict, i: int) -> bool:
    return verdict is not None and verdict[0] == i


def _selector_loss(number: int, i: int, label: str, verdict: Verdict, members: Sequence[int], rep: Device,
                   errors: list[tuple[Sequence[int], CelError]]) -> Loss:
    assert verdict is not None
    err = verdict[1]
    if isinstance(err, CelError):
        errors.append((members, err))
        return Loss(number, f"{label}: CEL runtime error: {err.message}", members)
    return Loss(number, _SelectorFalse(i), members, rep)


def _note_cel_errors(info: RequestExplanation, ctx: Ctx, label: str, errors: list[tuple[Sequence[int], CelError]]) -> None:
    """The first devices (in inventory order) whose selector failed with a CEL runtime error."""
    room = MAX_CLOSEST - len(info.cel_errors)
    if not errors or room <= 0:
        return
    streams = [((i, err) for i in members) for members, err in errors]
    for i, err in islice(heapq.merge(*streams, key=lambda e: e[0]), room):
        info.cel_errors.append(CelIssue(label, err.expression, err.message, key_str(ctx.inventory.devices[i].key)))


def _capacity_stage(info: RequestExplanation, alt: Alt, alive: Survivors, losses: list[Loss], qualified: bool) -> None:
    # The groups agree on capacities and policies (Projection.capacity), so one check is all a group needs.
    # A device the request names a capacity of twice stays: the search stops at it with an error (1.38).
    number = len(info.stages)
    part = alive.part
    for g in list(alive.groups):
        assert part is not None
        rep = part.groups[g].rep
        problem = capacity_problem(rep, alt.capacity, qualified)
        if problem is not None and requested_twice(rep, alt.capacity, qualified) is None:
            losses.append(Loss(number, problem, alive.members(g)))
            del alive.groups[g]
    for d in list(alive.single.values()):
        problem = capacity_problem(d, alt.capacity, qualified)
        if problem is not None and requested_twice(d, alt.capacity, qualified) is None:
            losses.append(Loss(number, problem, [d.index]))
            del alive.single[d.index]
    info.stages.append(StageCount("capacity fits", alive.count()))


def _allocated_stage(info: RequestExplanation, ctx: Ctx, alive: Survivors, losses: list[Loss]) -> None:
    number = len(info.stages)
    allocated = ctx.taken_keys()
    devices = ctx.inventory.devices
    part = alive.part
    for g in alive.groups:
        assert part is not None
        hits: set[DeviceKey] | frozenset[DeviceKey] = part.groups[g].keys(devices) & allocated  # in C, not per member
        if alive.removed:
            hits = {k for k in hits if ctx.inventory.by_key[k].index not in alive.removed}
        if hits:
            alive.lost[g] += len(hits)
            alive.taken[g] = hits
            losses.append(Loss(number, "allocated to another claim", hits))
    for d in [d for d in alive.single.values() if d.key in allocated]:
        del alive.single[d.index]
        losses.append(Loss(number, "allocated to another claim", [d.index]))
    info.stages.append(StageCount("not allocated to other claims", alive.count()))


def _counter_stage(info: RequestExplanation, ctx: Ctx, alive: Survivors, losses: list[Loss]) -> None:
    """Devices whose counters are used up. In a pool where no device consumes anything, a device
    fits unless it alone asks for more than the pool has, which is known per device once (and per
    group and pool, the members that do not fit: a claim looks at the pools, not at every member)."""
    number = len(info.stages)
    inventory = ctx.inventory
    part = alive.part

    def check(d: Device, reason: str | None) -> None:
        if reason is not None and alive.contains(d):
            alive.remove(d)
            losses.append(Loss(number, reason, [d.index]))

    for g in list(alive.groups):
        group = part.groups[g] if part is not None else None
        if group is None or not group.rep.has_consumes:
            continue
        for pool_id, members in group.by_pool(inventory.devices).items():
            pool = inventory.pool_map[pool_id]
            if ctx.consumed_in(pool):
                for d in members:
                    if alive.contains(d):
                        check(d, _counter_reason(ctx, d))
            else:
                reason = partial(_counter_reason_alone, pool=pool, answers=_pool_answers(pool))
                for d in group.alone_unfit(pool_id, reason):
                    check(d, d.counters_alone)
    for d in [d for d in alive.single.values() if d.has_consumes]:
        pool = inventory.pool_of(d)
        alone = not ctx.consumed_in(pool)
        check(d, _counter_reason_alone(d, pool, _pool_answers(pool)) if alone else _counter_reason(ctx, d))
    info.stages.append(StageCount("shared counters available", alive.count()))


def _counter_reason_alone(d: Device, pool: Pool, answers: dict[Any, str]) -> str | None:
    """``answers``: :func:`_pool_answers` of ``pool``."""
    if d.counters_alone is None:
        asked = _asked(d.raw.get("consumesCounters"))
        if asked is None:
            d.counters_alone = _counter_reason(None, d, pool.counter_sets) or ""
        else:
            found = answers.get(asked)
            if found is None:
                found = answers[asked] = _counter_reason(None, d, pool.counter_sets) or ""
            d.counters_alone = found
    return d.counters_alone or None


def _asked(raw: Any) -> tuple[tuple[str, tuple[tuple[str, str | int], ...] | None], ...] | None:
    """What a device asks of its pool's counters, as published, hashable; None when a value is
    neither text nor a number (then it is worked out for the device alone)."""
    out = []
    for entry in as_list(raw):
        entry = as_mapping(entry)
        counters = remembered(_ASKED, entry.get("counters"), _asked_of_set)
        if counters is None:
            return None
        out.append((as_str(entry.get("counterSet")) or "", counters))
    return tuple(out)


_ASKED: dict[int, tuple[Any, Any]] = {}
""":func:`_asked_of_set` by the counters map: the informers share equal maps between devices, so
76,000 dynamic-MIG devices ask through a few dozen of them."""


def _asked_of_set(counters: Any) -> tuple[tuple[str, str | int], ...] | None:
    out = []
    for name, c in as_mapping(counters).items():
        value = as_mapping(c).get("value")
        if type(value) is not str and type(value) is not int:
            return None
        out.append((name, value))
    return tuple(out)


def _pool_answers(pool: Pool) -> dict[Any, str]:
    """:func:`_alone_answers` for the counters ``pool`` holds, found once per pool."""
    if pool.alone_answers is None:
        pool.alone_answers = _alone_answers(pool.counters_key())
    return pool.alone_answers


@lru_cache(maxsize=256)
def _alone_answers(totals: tuple[tuple[str, tuple[tuple[str, Fraction | int], ...]], ...]) -> dict[Any, str]:
    """The answers of :func:`_counter_reason` for a device alone in a pool holding ``totals``, by
    what the device asks (:func:`_asked`), filled in as they are worked out: shared by every pool
    holding the same counters. Dynamic-MIG nodes ask tens of thousands of devices a few hundred
    distinct questions; parsing each device's counters was a visible part of the controller's start
    (the figures: docs/scale.md#the-codes-figures)."""
    return {}


def _taint_reason(d: Device, alt: Alt) -> str | None:
    taint = taint_blocking(d, alt)
    if taint is None:
        return None
    rule = taint.get(RULE_KEY)
    origin = f" from DeviceTaintRule {rule}" if rule else ""
    return f"taint {taint.get('key')}={taint.get('value', '')}:{taint.get('effect')}{origin} not tolerated"


def holders(ctx: Ctx, d: Device) -> str:
    """Who holds shares of ``d``, as the claim's author may be told: the claims of its own namespace
    by name, those of other namespaces only counted (a tenant learns that a GPU is taken, not who
    took it): ``ns/x, 2 claims in other namespaces``."""
    namespace = as_str(as_mapping(ctx.claim.get("metadata")).get("namespace")) or "default"
    owners = ctx.allocated.consumers.get(d.key, [])
    own = [o for o in owners if o.partition("/")[0] == namespace]
    others = len(owners) - len(own)
    if others:
        own.append("1 claim in another namespace" if others == 1 else f"{others} claims in other namespaces")
    return ", ".join(own) or "other claims"


def _shared_reason(ctx: Ctx, d: Device, alt: Alt) -> str | None:
    """What other claims' shares leave of a device, when this request no longer fits:
    ``memory: 60Gi of 80Gi consumed by a/x, b/y; need 30Gi`` (a device that stopped allowing
    multiple allocations keeps its shares, and every scheduler version counts them)."""
    qualified = ctx.rules.qualified_names
    used = ctx.allocated.shared_by(qualified).get(d.key)
    need = consumption(d, alt.capacity, qualified)
    if not used or need is None:
        return None
    totals = capacities(d, qualified)
    for name, amount in need.items():
        total = totals[name][0].value
        taken = used.get(name, Fraction(0))
        if taken + amount.value > total:
            owners = holders(ctx, d)
            shown = status_name(d, name, qualified)
            asked = next((q for n, q in alt.capacity.items()
                          if (f"{d.key[0]}/{n}" if qualified and "/" not in n else n) == name), None)
            rounded = f" (asked {show(asked.value)})" if asked is not None and asked.value != amount.value else ""
            needs = f"need {show(amount.value)}{rounded}"
            if not d.allow_multi:
                # Shares from when its slice still allowed them: the scheduler counts them on top
                # of an exclusive allocation, which consumes what it does not ask for in full.
                whole = " (all of it, not requested)" if asked is None else ""
                return (f"{shown}: {show(taken)} of {show(total)} still consumed by shares of {owners}, from before the "
                        f"device stopped allowing multiple allocations; {needs}{whole}")
            return f"{shown}: {show(taken)} of {show(total)} consumed by {owners}; {needs}"
    return None


def _counter_reason(ctx: Ctx | None, d: Device, avail: dict[str, dict[str, Fraction]] | None = None) -> str | None:
    """``avail``: what the pool has left (by default: after other claims' devices)."""
    if avail is None:
        assert ctx is not None
        avail = ctx.available_counters((d.key[0], d.key[1]))
    for cs, counters in d.consumes:
        for name, value in counters.items():
            if name in avail.get(cs, {}) and avail[cs][name] < value:
                return f"counter {cs}/{name} exhausted (needs {show(value)}, {show(avail[cs][name])} left)"
    return None


# =========================================================================== a claim that is not allocated


def explain_failure(ctx: Ctx, explanation: Explanation) -> None:
    """Add what only a claim that stays pending needs: the closest devices per request, the
    shareable devices the claim's own requests compete for, and its constraints per node."""
    by_name = {r.request: r for r in explanation.requests}
    for alts in ctx.requests:
        for alt in alts:
            info = by_name.get(alt.name)
            if info is not None and id(alt) in ctx.funnels:
                info.closest = _closest(ctx, alt, info)
    explanation.consumption = _competing_requests(ctx)
    explanation.constraints = [_constraint_line(ctx, c) for c in ctx.constraints]


@dataclass
class _Note:
    stage: int
    first: int
    reason: Reason
    count: int = 0
    streams: list[Sequence[int]] = field(default_factory=list)


def _closest(ctx: Ctx, alt: Alt, info: RequestExplanation) -> list[CandidateNote]:
    """The devices that got furthest, grouped by stage and by what they failed on (for a false
    selector: the values it read), the deepest stage first, each group where its first device is."""
    losses, _ = ctx.funnels[id(alt)]
    devices = ctx.inventory.devices
    notes: dict[tuple[Any, ...], _Note] = {}
    for loss in losses:
        for key, members in _keyed(ctx, alt, loss):
            if not members:
                continue
            note = notes.get(key)
            if note is None:
                note = notes[key] = _Note(loss.stage, members[0], loss.reason)
            note.first = min(note.first, members[0])
            note.count += len(members)
            note.streams.append(members)
    out = []
    for note in sorted(notes.values(), key=lambda n: (-n.stage, n.first))[:MAX_CLOSEST]:
        dev = devices[note.first]
        if isinstance(note.reason, _SelectorFalse):
            label, sel = alt.compiled[note.reason.index]
            text = describe(dev, readings(sel.expression)) or sel.expression
            info.selectors[label] = sel.expression
            reason_text = f"{label} is false: {text}"
        else:
            reason_text = note.reason
        merged = heapq.merge(*note.streams)
        named = [key_str(devices[i].key) for i in islice(merged, MAX_NAMED - 1)]
        if note.count >= MAX_NAMED:
            named.append(key_str(devices[max(s[-1] for s in note.streams)].key))
        out.append(CandidateNote(key_str(dev.key), reason_text, note.count, named))
    return out


def _keyed(ctx: Ctx, alt: Alt, loss: Loss) -> list[tuple[tuple[Any, ...], Sequence[int]]]:
    """The loss's devices under the key of the group they are shown in."""
    members = loss.indices(ctx)
    if not isinstance(loss.reason, _SelectorFalse):
        return [((loss.stage, loss.reason), members)]
    found = readings(alt.compiled[loss.reason.index][1].expression)
    part = ctx.partition(alt)
    if loss.rep is not None and part is not None and _covered(found, part):
        return [((loss.stage, loss.reason.index, values_key(loss.rep, found)), members)]
    split: dict[tuple[Any, ...], list[int]] = {}
    devices = ctx.inventory.devices
    for i in members:
        split.setdefault((loss.stage, loss.reason.index, values_key(devices[i], found)), []).append(i)
    return list(split.items())


def _covered(found: tuple[Reading, ...], part: Partition) -> bool:
    """Whether a group's devices agree on every value the explanation reads (else it reads them one by one)."""
    reads = part.projection.reads
    fields = set(reads.fields)
    return all((r.kind + "s" if r.kind == "attribute" else r.kind, r.domain, r.name) in fields for r in found)


def _competing_requests(ctx: Ctx) -> list[str]:
    """Shareable devices that several of the claim's requests could use, where together they ask
    for more than is left: ``…/gpu-0 memory: r0 takes 40Gi, r1 would take 48Gi of 80Gi``."""
    if not ctx.inventory.multi:
        return []
    users: dict[int, list[tuple[Alt, dict[str, Fraction]]]] = {}
    for alts in ctx.requests:
        taken: set[int] = set()
        for alt in alts:
            funnel_state = ctx.funnels.get(id(alt))
            if funnel_state is None:
                continue
            for d in funnel_state[1].devices():
                if d.allow_multi and d.index not in taken:
                    need = consumption(d, alt.capacity, ctx.rules.qualified_names)
                    if need is not None:
                        taken.add(d.index)
                        users.setdefault(d.index, []).append((alt, {k: v.value for k, v in need.items()}))
    lines = []
    for index, wanted in users.items():
        if len(wanted) < 2:
            continue
        dev = ctx.inventory.devices[index]
        qualified = ctx.rules.qualified_names
        used = ctx.allocated.shared_by(qualified).get(dev.key, {})
        for name, (total, _) in capacities(dev, qualified).items():
            asked = [(alt, need.get(name, Fraction(0))) for alt, need in wanted]
            before = used.get(name, Fraction(0))
            if before + sum(a for _, a in asked) <= total.value:
                continue
            first, *rest = asked
            parts = [f"{first[0].name} takes {show(first[1])}"] + [f"{alt.name} would take {show(a)}" for alt, a in rest]
            line = f"{key_str(dev.key)} {status_name(dev, name, qualified)}: {', '.join(parts)} of {show(total.value)}"
            if before:
                owners = holders(ctx, dev)
                line += f", with {show(before)} already consumed by {owners}"
            lines.append(line)
            break
        if len(lines) >= MAX_CLOSEST:
            break
    return lines


def _constraint_line(ctx: Ctx, c: Any) -> str:
    """Per node, what a constraint's requests' candidates offer against what the claim needs."""
    word = "matchAttribute" if c.kind == "match" else "distinctAttribute"
    applying = [[a for a in alts if not a.error and c.applies(a)] for alts in ctx.requests]
    applying = [alts for alts in applying if alts]
    scope = ", ".join(alts[0].base for alts in applying) or "no request"
    if any(a.mode == "All" for alts in applying for a in alts):
        need: int | None = None
    else:
        need = sum(min(a.count for a in alts) for alts in applying)
    per_node: dict[str, dict[int, Any]] = {}
    for alts in applying:
        for alt in alts:
            funnel_state = ctx.funnels.get(id(alt))
            if funnel_state is None:
                continue
            for d in funnel_state[1].devices():
                node = d.node_name or "(devices not local to a node)"
                per_node.setdefault(node, {})[d.index] = lookup_attribute(d, c.attribute)
    rows = []
    for node, values in per_node.items():
        counts = Counter(v for v in values.values() if v is not None)
        if c.kind == "match":
            value, n = counts.most_common(1)[0] if counts else (None, 0)
            rows.append((n, f"{node} at most {n}" + (f" (value {_value_text(value)})" if value is not None else "")))
        else:
            shown = ", ".join(_value_text(v) for v in sorted(counts, key=str)[:6])
            rows.append((len(counts), f"{node} {len(counts)}" + (f" ({shown})" if counts else "")))
    rows.sort(key=lambda r: -r[0])
    want = "all matching devices" if need is None else (
        f"{need} devices with one value" if c.kind == "match" else f"{need} distinct values")
    have = "devices with one value" if c.kind == "match" else "distinct values"
    listed = "; ".join(text for _, text in rows[:MAX_NODES]) or "no candidate devices"
    more = f"; {len(rows) - MAX_NODES} more node(s) with fewer" if len(rows) > MAX_NODES else ""
    return f"{word} {c.attribute} over {scope}: needs {want}; {have} per node: {listed}{more}"


def _value_text(value: tuple[str, Any]) -> str:
    kind, v = value
    if kind == "bool":
        return "true" if v else "false"
    return f'"{v}"' if kind == "string" else str(v)
