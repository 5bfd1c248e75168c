"""Why a request found no device: how many devices each stage kept, and the closest candidates."""

from __future__ import annotations

from collections import Counter
from typing import Any

from dra_driver.allocator.cel.compile import CompiledSelector
from dra_driver.allocator.cel.errors import CelError
from dra_driver.allocator.explanation import CandidateNote, CelIssue, Explanation, RequestExplanation, StageCount
from dra_driver.allocator.inventory import Device, key_str
from dra_driver.allocator.search import (
    Alt,
    Ctx,
    Verdict,
    consumption,
    lookup_attribute,
    missing_capacity,
    taint_blocking,
)

MAX_CLOSEST = 5


# =========================================================================== explanation


def funnel(ctx: Ctx, alt: Alt) -> RequestExplanation:
    info = RequestExplanation(alt.name, alt.class_name, alt.mode, alt.count if alt.mode == "ExactCount" else None)
    if alt.error:
        info.error = alt.error
        return info
    alive = list(ctx.inventory.devices)
    info.stages.append(StageCount("devices published", len(alive)))
    failures: dict[int, tuple[int, str]] = {}  # device index -> (stage number, reason)

    def stage(name: str, keep: Any) -> None:
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
    for i, (label, sel) in enumerate(alt.compiled):
        stage(label, lambda d, i=i, label=label, sel=sel: _sel_reason(info, ctx.verdict(alt, d), d, i, label, sel))
    stage("taints tolerated", lambda d: _taint_reason(d, alt))
    if alt.capacity or any(d.allow_multi for d in alive):
        stage("capacity fits", lambda d: _capacity_reason(d, alt))
    if not alt.admin:
        stage("not allocated to other claims", lambda d: "allocated to another claim" if d.key in ctx.allocated.devices else None)
    if any(d.consumes for d in alive):
        stage("shared counters available", lambda d: _counter_reason(ctx, d))
    ranked = sorted(failures.items(), key=lambda kv: (-kv[1][0], kv[0]))[:MAX_CLOSEST]
    info.closest = [CandidateNote(key_str(ctx.inventory.devices[i].key), why) for i, (_, why) in ranked]
    return info


def _sel_reason(info: RequestExplanation, verdict: Verdict, d: Device, i: int, label: str, sel: CompiledSelector) -> str | None:
    if verdict is None or verdict[0] != i:
        return None  # passed this selector (earlier failures were filtered out already)
    err = verdict[1]
    if isinstance(err, CelError):
        if len(info.cel_errors) < MAX_CLOSEST:
            info.cel_errors.append(CelIssue(label, err.expression, err.message, key_str(d.key)))
        return f"{label}: CEL runtime error: {err.message}"
    return f"{label} is false: {sel.expression}"


def _taint_reason(d: Device, alt: Alt) -> str | None:
    taint = taint_blocking(d, alt)
    return None if taint is None else f"taint {taint.get('key')}={taint.get('value', '')}:{taint.get('effect')} not tolerated"


def _capacity_reason(d: Device, alt: Alt) -> str | None:
    missing = missing_capacity(d, alt)
    if missing is not None:
        # Names must match as written (no driver domain is added), so say what the device does publish.
        published = ", ".join(f"`{n}`" for n in d.capacity) or "no capacity"
        return f"capacity `{missing}` is not published by this device; it publishes {published}"
    return None if consumption(d, alt) is not None else "capacity request does not fit"


def _counter_reason(ctx: Ctx, d: Device) -> str | None:
    avail = ctx.available_counters((d.key[0], d.key[1]))
    for cs, counters in d.consumes:
        for name, value in counters.items():
            if name in avail.get(cs, {}) and avail[cs][name] < value:
                return f"counter {cs}/{name} exhausted (needs {value}, {avail[cs][name]} left)"
    return None


def explain_constraints(ctx: Ctx, explanation: Explanation) -> None:
    for c in ctx.constraints:
        values: Counter[str] = Counter()
        for alts in ctx.requests:
            alt = alts[0]
            if alt.error or not c.applies(alt):
                continue
            for d in ctx.inventory.devices:
                if ctx.inventory.pool_of(d).usable and ctx.verdict(alt, d) is None:
                    attr = lookup_attribute(d, c.attribute)
                    values[str(attr[1]) if attr else "<unset>"] += 1
        groups = ", ".join(f"{v}: {n}" for v, n in values.most_common(6))
        word = "matchAttribute" if c.kind == "match" else "distinctAttribute"
        explanation.constraints.append(f"{word} {c.attribute} (candidates per value: {groups or 'none'})")
