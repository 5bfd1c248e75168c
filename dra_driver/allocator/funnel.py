"""Why a request found no device: how many devices each stage kept, the closest candidates grouped
by how they failed, what shareable devices have left, and what the claim's constraints met per node."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dra_driver.allocator.capacity import capacity_problem, consumption, show
from dra_driver.allocator.cel.errors import CelError
from dra_driver.allocator.explanation import CandidateNote, CelIssue, Explanation, RequestExplanation, StageCount
from dra_driver.allocator.inventory import Device, key_str
from dra_driver.allocator.readings import describe, readings, values_key
from dra_driver.allocator.search import Alt, Ctx, lookup_attribute, taint_blocking

MAX_CLOSEST = 5  # groups of devices shown per request
MAX_NAMED = 8  # device names kept per group (the first ones and the last)
MAX_NODES = 5  # nodes named per constraint


@dataclass(frozen=True)
class _SelectorFalse:
    index: int  # which of the alternative's compiled selectors


# Why a device left the funnel: text, or a false selector (described from the values it read).
Reason = str | _SelectorFalse


def funnel(ctx: Ctx, alt: Alt) -> RequestExplanation:
    """The stage counts for ``alt``; the devices each stage removed, and the survivors, go to
    ``ctx`` for :func:`explain_failure` (only a claim that is not allocated needs them)."""
    info = RequestExplanation(alt.name, alt.class_name, alt.mode, alt.count if alt.mode == "ExactCount" else None)
    if alt.error:
        info.error = alt.error
        return info
    alive = list(ctx.inventory.devices)
    info.stages.append(StageCount("devices published", len(alive)))
    failures: dict[int, tuple[int, Reason]] = {}  # device index -> (stage number, reason)

    def stage(name: str, keep: Callable[[Device], Reason | None]) -> None:
        nonlocal alive
        survivors = []
        for d in alive:
            reason = keep(d)
            if reason is None:
                survivors.append(d)
            else:
                failures[d.index] = (len(info.stages), reason)
        alive = survivors
        info.stages.append(StageCount(name, len(alive)))

    def pool_ok(d: Device) -> str | None:
        p = ctx.inventory.pool_of(d)
        return None if p.usable else ("pool incomplete" if not p.complete else f"pool invalid: {p.invalid}")

    stage("in complete, valid pools", pool_ok)
    for i, (label, _) in enumerate(alt.compiled):
        stage(label, _selector_stage(info, ctx, alt, i, label))
    stage("taints tolerated", lambda d: _taint_reason(d, alt))
    if alt.capacity or any(d.allow_multi for d in alive):
        stage("capacity fits", lambda d: capacity_problem(d, alt.capacity))
    if any(d.allow_multi and d.key in ctx.allocated.shared for d in alive):
        stage("capacity left by other claims", lambda d: _shared_reason(ctx, d, alt) if d.allow_multi else None)
    if not alt.admin:
        stage("not allocated to other claims", lambda d: "allocated to another claim" if d.key in ctx.allocated.devices else None)
    if any(d.consumes for d in alive):
        stage("shared counters available", lambda d: _counter_reason(ctx, d))
    ctx.funnels[id(alt)] = (failures, alive)
    return info


def _selector_stage(info: RequestExplanation, ctx: Ctx, alt: Alt, i: int, label: str) -> Callable[[Device], Reason | None]:
    return lambda d: _sel_reason(info, ctx, alt, d, i, label)


def _sel_reason(info: RequestExplanation, ctx: Ctx, alt: Alt, d: Device, i: int, label: str) -> Reason | None:
    verdict = ctx.verdict(alt, d)
    if verdict is None or verdict[0] != i:
        return None  # passed this selector (earlier failures were filtered out already)
    err = verdict[1]
    if isinstance(err, CelError):
        if len(info.cel_errors) < MAX_CLOSEST:
            info.cel_errors.append(CelIssue(label, err.expression, err.message, key_str(d.key)))
        return f"{label}: CEL runtime error: {err.message}"
    return _SelectorFalse(i)


def _taint_reason(d: Device, alt: Alt) -> str | None:
    taint = taint_blocking(d, alt)
    return None if taint is None else f"taint {taint.get('key')}={taint.get('value', '')}:{taint.get('effect')} not tolerated"


def _shared_reason(ctx: Ctx, d: Device, alt: Alt) -> str | None:
    """What other claims' shares leave of a shareable device, when this request no longer fits:
    ``memory: 60Gi of 80Gi consumed by a/x, b/y; need 30Gi``."""
    used = ctx.allocated.shared.get(d.key)
    need = consumption(d, alt.capacity)
    if not used or need is None:
        return None
    for name, amount in need.items():
        total = d.capacity[name][0].value
        taken = used.get(name, Fraction(0))
        if taken + amount.value > total:
            owners = ", ".join(ctx.allocated.consumers.get(d.key, [])) or "other claims"
            asked = alt.capacity.get(name)
            rounded = f" (asked {show(asked.value)})" if asked is not None and asked.value != amount.value else ""
            return f"{name}: {show(taken)} of {show(total)} consumed by {owners}; need {show(amount.value)}{rounded}"
    return None


def _counter_reason(ctx: Ctx, d: Device) -> str | None:
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


def _closest(ctx: Ctx, alt: Alt, info: RequestExplanation) -> list[CandidateNote]:
    """The devices that got furthest, grouped by stage and by what they failed on (for a false
    selector: the values it read), the deepest stage first."""
    failures, _ = ctx.funnels[id(alt)]
    groups: dict[tuple[Any, ...], CandidateNote] = {}
    names: dict[tuple[Any, ...], list[str]] = {}
    devices = ctx.inventory.devices
    for index, (stage_no, reason) in sorted(failures.items(), key=lambda kv: (-kv[1][0], kv[0])):
        dev = devices[index]
        if isinstance(reason, _SelectorFalse):
            label, sel = alt.compiled[reason.index]
            found = readings(sel.expression)
            key: tuple[Any, ...] = (stage_no, reason.index, values_key(dev, found))
        else:
            key = (stage_no, reason)
        note = groups.get(key)
        if note is None:
            if len(groups) >= MAX_CLOSEST:
                continue
            if isinstance(reason, _SelectorFalse):
                text = describe(dev, found) or sel.expression
                info.selectors[label] = sel.expression
                reason_text = f"{label} is false: {text}"
            else:
                reason_text = reason
            note = groups[key] = CandidateNote(key_str(dev.key), reason_text, 0)
            names[key] = []
        note.count += 1
        kept = names[key]
        if len(kept) < MAX_NAMED:
            kept.append(key_str(dev.key))
        else:
            kept[-1] = key_str(dev.key)  # the last one stays named, for "first … last"
    for key, note in groups.items():
        note.devices = names[key]
    return list(groups.values())


def _competing_requests(ctx: Ctx) -> list[str]:
    """Shareable devices that several of the claim's requests could use, where together they ask
    for more than is left: ``…/gpu-0 memory: r0 takes 40Gi, r1 would take 48Gi of 80Gi``."""
    users: dict[int, list[tuple[Alt, dict[str, Fraction]]]] = {}
    for alts in ctx.requests:
        taken: set[int] = set()
        for alt in alts:
            funnel_state = ctx.funnels.get(id(alt))
            if funnel_state is None:
                continue
            for d in funnel_state[1]:
                if d.allow_multi and d.index not in taken:
                    need = consumption(d, alt.capacity)
                    if need is not None:
                        taken.add(d.index)
                        users.setdefault(d.index, []).append((alt, {k: v.value for k, v in need.items()}))
    lines = []
    for index, wanted in users.items():
        if len(wanted) < 2:
            continue
        dev = ctx.inventory.devices[index]
        used = ctx.allocated.shared.get(dev.key, {})
        for name, (total, _) in dev.capacity.items():
            asked = [(alt, need.get(name, Fraction(0))) for alt, need in wanted]
            before = used.get(name, Fraction(0))
            if before + sum(a for _, a in asked) <= total.value:
                continue
            first, *rest = asked
            parts = [f"{first[0].name} takes {show(first[1])}"] + [f"{alt.name} would take {show(a)}" for alt, a in rest]
            line = f"{key_str(dev.key)} {name}: {', '.join(parts)} of {show(total.value)}"
            if before:
                owners = ", ".join(ctx.allocated.consumers.get(dev.key, [])) or "other claims"
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
            for d in ctx.funnels.get(id(alt), ({}, []))[1]:
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
