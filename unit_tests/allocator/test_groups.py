"""Deciding per group of devices, caching outcomes by what a selector reads, and skipping nodes that
cannot fit: none of it may change a verdict or an explanation.

The reference is the engine with all three switched off (every device evaluated by CEL on its own,
every node searched); generated scenarios (``e2e.generators.scenarios``, the differential's corpus) with other
claims' allocations laid over them must come out the same, explanation included.
"""

from __future__ import annotations

import copy
import json
import random
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest

from dra_driver.allocator import context, groups, inventory, search
from dra_driver.allocator import resolve as resolve_module
from dra_driver.allocator.cel import compile as cel_compile
from dra_driver.allocator.cel.compile import compile_selector
from dra_driver.allocator.cel.errors import CelRuntimeError
from dra_driver.allocator.cel.reads import WHOLE, Reads, selector_reads
from dra_driver.allocator.inventory import AllocatedState, Device, Prebuilt, build_inventory
from dra_driver.allocator.resolve import resolve
from dra_driver.allocator.rules import SchedulerRules
from dra_driver.controller.views import slice_view
from dra_driver.k8s.quantity import parse_quantity
from e2e.generators.scenarios import generate_many

D = "gpu.dra-driver.io"
CLASSES = [{"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{D}"'}}]}}]


def slice_(node: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": f"{node}-slice"}, "spec": {
        "driver": D, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
        "devices": devices}}  # fmt: skip


def gpu(name: str, attributes: dict[str, Any], capacity: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"name": name, "attributes": attributes, "capacity": capacity or {"memory": {"value": "80Gi"}}, **extra}


def claim(*selectors: str, count: int = 1, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": "gpu", "count": count, **extra}
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"metadata": {"name": "c", "namespace": "ns", "uid": "uid-c"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": body}]}}}


def _direct(sel: Any, dev: Device, qualified_first: bool = False, on_read: bool = False) -> bool | CelRuntimeError:
    try:
        return bool(sel.evaluate(dev.activation_for(qualified_first, on_read)))
    except CelRuntimeError as exc:
        return exc


@contextmanager
def one_by_one() -> Iterator[None]:
    """The reference engine: no groups, no outcome cache, every node searched."""
    with mock.patch.object(context.Ctx, "partition", lambda self, alt: None), \
            mock.patch.object(context, "outcome", _direct), \
            mock.patch.object(resolve_module, "node_filter", lambda ctx, whole_list: None):
        yield


def shared(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of ``slices`` as the controller's informer holds them: equal values one object."""
    view = slice_view()
    return [view(copy.deepcopy(sl)) for sl in slices]


def both(claim_: dict[str, Any], slices: list[dict[str, Any]], classes: Any,
         allocated: AllocatedState | None = None) -> tuple[Any, Any]:  # fmt: skip
    """The engine on the informer's shared values, and the reference on the slices as given."""
    fast = resolve(claim_, build_inventory(shared(slices)), classes, allocated)
    with one_by_one():
        slow = resolve(claim_, build_inventory(slices), classes, allocated)
    return fast, slow


def same(fast: Any, slow: Any) -> None:
    assert not any("internal error" in e for e in fast.explanation.errors + slow.explanation.errors)
    assert fast.allocation == slow.allocation
    assert json.dumps(fast.explanation.to_dict(), default=str) == json.dumps(slow.explanation.to_dict(), default=str)
    assert fast.explanation.render() == slow.explanation.render()


def others(slices: list[dict[str, Any]], rng: random.Random) -> AllocatedState:
    """Other claims' allocations over the scenario's devices: some exclusive, some shares."""
    state = AllocatedState()
    for sl in slices:
        spec = sl["spec"]
        for d in spec.get("devices") or []:
            key = (spec["driver"], spec["pool"]["name"], d["name"])
            roll = rng.random()
            if d.get("allowMultipleAllocations") and roll < 0.4:
                name = next(iter(d["capacity"]))
                state.shared[key] = {name: parse_quantity(rng.choice(("8Gi", "16Gi", "40Gi"))).value}
                state.consumers[key] = ["ns/other"]
            elif roll < 0.3:
                state.devices.add(key)
    return state


# ============================================================================ the equivalence


@pytest.mark.parametrize("first", range(0, 600, 100))
def test_generated_scenarios_decide_and_explain_as_device_by_device(first: int) -> None:
    features = frozenset({"selectors", "all", "constraints", "firstAvailable", "counters", "taints", "taint-none",
                          "shares"})  # fmt: skip
    for sc in generate_many(first, 100, nodes=("node-0", "node-1", "node-2"), features=features):
        rng = random.Random(sc.seed)
        for allocated in (None, others(sc.slices, rng)):
            fast, slow = both(sc.claim, sc.slices, sc.classes, allocated)
            same(fast, slow)


# ============================================================================ what a selector reads


@pytest.mark.parametrize("expression,fields", [
    (f'device.attributes["{D}"].model == "A"', [("attributes", D, "model")]),
    (f'device.attributes["{D}"]["model"] == "A"', [("attributes", D, "model")]),
    ('device.attributes.dom.model == "A"', [("attributes", "dom", "model")]),
    (f'has(device.attributes["{D}"].mig) && device.attributes["{D}"].mig', [("attributes", D, "mig")]),
    (f'device.capacity["{D}"].memory.compareTo(quantity("1Ti")) >= 0', [("capacity", D, "memory")]),
    # A macro's own variable named "device" is not the device; what it ranges over is read.
    (f'[1, 2].all(device, device > 0) && device.attributes["{D}"].x == 1', [("attributes", D, "x")]),
    (f'cel.bind(device, 3, device > 2) && device.attributes["{D}"].x == 1', [("attributes", D, "x")]),
])
def test_reads_named_fields(expression: str, fields: list[tuple[str, str, str]]) -> None:
    assert selector_reads(expression).fields == tuple(fields)
    assert not selector_reads(expression).whole


def test_reads_driver_shares_and_whole_domains() -> None:
    assert selector_reads(f'device.driver == "{D}"') == Reads(driver=True)
    assert selector_reads("device.allowMultipleAllocations") == Reads(multi=True)
    assert selector_reads(f'"x" in device.attributes["{D}"]').domains == (("attributes", D),)
    assert selector_reads(f'device.attributes["{D}"].exists(k, k == "x")').domains == (("attributes", D),)
    # A computed key reads the whole domain map.
    assert selector_reads(f'device.attributes["{D}"][device.attributes["{D}"].k] == 1') == Reads(
        fields=(("attributes", D, "k"),), domains=(("attributes", D),))


@pytest.mark.parametrize("expression", [
    f'"{D}" in device.attributes',  # the map of domains
    "device.attributes.size() > 0",
    f'device.attributes[?"{D}"].?model.orValue("") == "A"',  # optional syntax
    'device.attributes["gpu.dra\\u002ddriver.io"].model == "A"',  # an escape: not the text between the quotes
    "[device].size() == 1",
    "device.name == 'x'",
])
def test_reads_anything_else_as_the_whole_device(expression: str) -> None:
    assert selector_reads(expression) == WHOLE


def test_compiled_selectors_know_their_reads() -> None:
    assert compile_selector(f'device.attributes["{D}"].model == "A"').reads.fields == (("attributes", D, "model"),)


# ============================================================================ the outcome cache


MODEL_A = f'device.attributes["{D}"].model == "A"'


def test_a_cached_outcome_is_never_used_for_other_values() -> None:
    inv = build_inventory([slice_("node-a", [gpu("gpu-0", {"model": {"string": "A"}}),
                                             gpu("gpu-1", {"model": {"string": "B"}})])])  # fmt: skip
    sel = compile_selector(MODEL_A)
    assert [groups.outcome(sel, d) for d in inv.devices] == [True, False]
    again = build_inventory([slice_("node-a", [gpu("gpu-0", {"model": {"string": "B"}}),
                                               gpu("gpu-1", {"model": {"string": "A"}})])])  # fmt: skip
    assert [groups.outcome(sel, d) for d in again.devices] == [False, True]


@pytest.mark.parametrize("a,b", [
    ({"v": {"int": 1}}, {"v": {"bool": True}}),  # equal in Python, not in CEL
    ({"v": {"int": 1}}, {"v": {"string": "1"}}),
    ({"v": {"version": "1.0.0"}}, {"v": {"string": "1.0.0"}}),
    ({"v": {"int": 1}}, {f"{D}/v": {"int": 2}}),
    ({"v": {"int": 1}, f"{D}/v": {"int": 2}}, {f"{D}/v": {"int": 2}, "v": {"int": 1}}),  # the later one wins
    ({"v": {"int": 1}}, {"w": {"int": 1}}),  # absent
    ({"w": {"int": 1}}, {"other.example.com/w": {"int": 1}}),  # absent, and its domain too
])
def test_values_cel_tells_apart_are_kept_apart(a: dict[str, Any], b: dict[str, Any]) -> None:
    inv = build_inventory([slice_("node-a", [gpu("gpu-0", a), gpu("gpu-1", b)])])
    for expression in (f'device.attributes["{D}"].v == 1', f'has(device.attributes["{D}"].v)',
                       f'string(device.attributes["{D}"].v) == "1"'):  # fmt: skip
        sel = compile_selector(expression)
        for d in inv.devices:
            assert groups.read_key(d, sel.reads) != groups.read_key(inv.devices[1 - d.index], sel.reads) or (
                _direct(sel, d) == _direct(sel, inv.devices[1 - d.index]))
            cached, direct = groups.outcome(sel, d), _direct(sel, d)
            assert cached == direct or (isinstance(cached, CelRuntimeError) and isinstance(direct, CelRuntimeError)
                                        and cached.message == direct.message)


def test_capacity_spellings_and_shares_are_part_of_the_key() -> None:
    devices = [gpu("gpu-0", {}, {"memory": {"value": "80Gi"}}),
               gpu("gpu-1", {}, {f"{D}/memory": {"value": "80Gi"}}),
               gpu("gpu-2", {}, {"memory": {"value": "40Gi"}, f"{D}/memory": {"value": "80Gi"}}),
               gpu("gpu-3", {}, {f"{D}/memory": {"value": "80Gi"}, "memory": {"value": "40Gi"}}),
               gpu("gpu-4", {}, {"memory": {"value": "81920Mi"}}, allowMultipleAllocations=True)]  # fmt: skip
    inv = build_inventory([slice_("node-a", devices)])
    sel = compile_selector(f'device.capacity["{D}"].memory.compareTo(quantity("60Gi")) > 0 && '
                           "!device.allowMultipleAllocations")
    assert [groups.outcome(sel, d) for d in inv.devices] == [_direct(sel, d) for d in inv.devices] == [
        True, True, True, False, False]


def test_a_device_with_a_broken_input_never_takes_a_groups_outcome() -> None:
    good = gpu("gpu-0", {"model": {"string": "A"}, "x": {"int": 1}})
    broken = gpu("gpu-1", {"model": {"string": "A"}, "x": {"int": 1, "string": "two types"}})
    inv = build_inventory([slice_("node-a", [good, broken])])
    assert not inv.devices[1].cel_clean
    # 1.37 converts every attribute first: the broken one fails the class's selector already.
    res = resolve(claim(MODEL_A, count=2), inv, CLASSES, rules=SchedulerRules(37))
    assert res.allocation is None
    assert any("exactly one of int, bool, string, version" in c.message for c in res.explanation.requests[0].cel_errors)
    # 1.38 reads attributes as selectors ask for them: the device is evaluated on its own, and
    # fails only a selector that reads the broken attribute.
    assert resolve(claim(MODEL_A, count=2), inv, CLASSES, rules=SchedulerRules(38)).allocation is not None
    res = resolve(claim(f'device.attributes["{D}"].x == 1', count=2), inv, CLASSES, rules=SchedulerRules(38))
    assert res.allocation is None
    assert res.explanation.failure == {"request": "gpu", "selector": "request gpu selector #0",
                                       "device": f"{D}/node-a/gpu-1"}
    assert any("attribute x: value is invalid" in c.message for c in res.explanation.requests[0].cel_errors)


def test_a_poisoned_selector_is_not_answered_from_the_cache() -> None:
    inv = build_inventory([slice_("node-a", [gpu("gpu-0", {"model": {"string": "A"}})])])
    sel = compile_selector(f'{MODEL_A} && true')
    assert groups.outcome(sel, inv.devices[0]) is True
    sel.poisoned = "operation cancelled: actual cost limit exceeded"
    try:
        assert isinstance(groups.outcome(sel, inv.devices[0]), CelRuntimeError)
    finally:
        sel.poisoned = None


def test_one_slow_run_is_retried_before_the_selector_is_poisoned(monkeypatch: pytest.MonkeyPatch) -> None:
    inv = build_inventory([slice_("node-a", [gpu("gpu-0", {"model": {"string": "A"}})])])
    sel = cel_compile.compile_uncached(MODEL_A)
    times = iter([0.0, 0.9, 1.0, 1.0, 2.0, 2.9, 3.0, 3.9])  # slow then fast; then slow twice
    monkeypatch.setattr(cel_compile, "time", SimpleNamespace(perf_counter=lambda: next(times)))
    assert sel.evaluate(inv.devices[0].activation) is True and sel.poisoned is None
    with pytest.raises(CelRuntimeError, match="cost limit"):
        sel.evaluate(inv.devices[0].activation)
    assert sel.poisoned is not None


def test_selectors_are_evaluated_once_per_kind_of_device(monkeypatch: pytest.MonkeyPatch) -> None:
    models = ["H100", "A100", "L4", "T4"]
    slices = [slice_(f"node-{n}", [gpu(f"gpu-{i}", {"productName": {"string": models[n % 4]}, "uuid": {
        "string": f"GPU-{n}-{i}"}, "index": {"int": i}}) for i in range(8)]) for n in range(40)]  # fmt: skip
    inv = build_inventory(slices)
    runs: list[str] = []
    real = cel_compile.CompiledSelector.evaluate

    def counting(self: Any, activation: Any) -> bool:
        runs.append(self.expression)
        return real(self, activation)

    monkeypatch.setattr(cel_compile.CompiledSelector, "evaluate", counting)
    expression = f'device.attributes["{D}"].productName == "L4" && device.attributes["{D}"].index >= 0'
    res = resolve(claim(expression), inv, CLASSES)
    assert res.allocation is not None and res.node == "node-10"  # node names sort as text
    assert 4 <= len(runs) <= 8 * 4  # one device per (product, index), never one per device: 320


def test_a_rebuilt_inventory_groups_the_changed_slice_anew(monkeypatch: pytest.MonkeyPatch) -> None:
    """The columns a partition is built from belong to one inventory: the one rebuilt after a slice
    changed groups the changed device by its new value, and reads one device per signature."""
    slices = shared([slice_(f"node-{n}", [gpu(f"gpu-{i}", {"model": {"string": "AB"[n % 2]}}) for i in range(4)])
                     for n in range(10)])  # fmt: skip
    inv = build_inventory(slices)
    assert resolve(claim(MODEL_A), inv, CLASSES).allocation is not None
    changed = copy.deepcopy(slices[3])
    changed["spec"]["pool"]["generation"] = 2
    changed["spec"]["devices"][0]["attributes"] = {"model": {"string": "A"}}  # its own map: equal ones are shared
    rebuilt = build_inventory([*slices[:3], changed, *slices[4:]], previous=inv)
    read: list[str] = []
    real = groups.key_function

    def counting(projection: groups.Projection) -> Any:
        key = real(projection)
        return lambda dev: read.append(dev.key[1]) or key(dev)

    monkeypatch.setattr(groups, "key_function", counting)
    # The outcome cache reads each group's representative: not what this counts.
    monkeypatch.setattr(groups, "read_key", lambda dev, reads: real(groups.Projection(reads))(dev))
    res = resolve(claim(MODEL_A, count=4), rebuilt, CLASSES)
    assert res.allocation is not None and res.node == "node-0"
    # The class's grouping reads node-0; the request's the first A, the first B, and node-3 twice:
    # the changed slice is a copy, its A and B entries objects of their own (equal ones, so its
    # devices join the A and B groups).
    assert read == ["node-0", "node-0", "node-1", "node-3", "node-3"]
    part = next(part for projection, part in rebuilt.partitions.built.items() if projection.within)
    assert sorted(len(g.members) for g in part.groups) == [19, 21]  # node-3's first GPU moved to model A
    before = next(part for projection, part in inv.partitions.built.items() if projection.within)
    assert sorted(len(g.members) for g in before.groups) == [20, 20]


def _summary(inv: Any) -> tuple[Any, ...]:
    return ([(d.key, d.index, d.node_name, d.problems) for d in inv.devices], inv.problems, inv.node_names,
            [(p.label, p.complete, p.invalid) for p in inv.pools])


def test_pools_digested_as_their_slices_arrive_are_taken_over_when_unchanged() -> None:
    slices = shared([slice_(f"node-{n}", [gpu(f"gpu-{i}", {"model": {"string": "AB"[n % 2]}}) for i in range(2)])
                     for n in range(8)])  # fmt: skip
    halves = [slice_("wide", [gpu(f"gpu-{h}{i}", {"model": {"string": "A"}}) for i in range(2)]) for h in "ab"]
    for h, half in zip("ab", halves, strict=True):
        half["metadata"]["name"] = f"wide-{h}"
        half["spec"]["pool"]["resourceSliceCount"] = 2
    unnamed = slice_("anonymous", [gpu("gpu-0", {"model": {"string": "A"}})])
    del unnamed["metadata"]["name"]
    broken = slice_("broken", [gpu("gpu-0", {"model": {"string": "A"}}, {"memory": {"value": "lots"}})])
    arrived = [*slices[:3], halves[0], *slices[3:6], halves[1], unnamed, broken, *slices[6:]]
    prebuilt = Prebuilt()
    with mock.patch.object(inventory, "_build_pool", wraps=inventory._build_pool) as digests:
        for start in range(0, len(arrived), 4):  # the wide pool's two slices come in different batches
            prebuilt.add(arrived[start:start + 4])
            if start == 0:
                assert (D, "wide") not in prebuilt.pools, "half a pool is not digested"
    assert prebuilt.pools[(D, "wide")].complete
    assert [c.args[1] for c in digests.call_args_list].count("wide") == 1, "digested once, when all there"
    early = dict(prebuilt.pools)
    listed = [*arrived]
    listed[1] = copy.deepcopy(arrived[1])  # equal, not the same object: digested again
    inv = build_inventory(listed, prebuilt=prebuilt)
    assert _summary(inv) == _summary(build_inventory(listed))
    assert [d.index for d in inv.devices] == list(range(len(inv.devices)))
    taken = {p.name for p in inv.pools if early.get((p.driver, p.name)) is p}
    assert taken == {f"node-{n}" for n in range(8) if n != 1} | {"wide", "broken"}
    assert any("broken" in problem for problem in inv.problems)


def test_devices_sharing_entries_read_them_once() -> None:
    slices = shared([slice_(f"node-{n}", [gpu(f"gpu-{i}", {"model": {"string": "A"}, "uuid": {"string": f"{n}-{i}"}})
                                          for i in range(4)]) for n in range(10)])  # fmt: skip
    inv = build_inventory(slices)
    groups._ATTRIBUTE_VALUES.clear()
    with mock.patch.object(groups, "attribute_value", wraps=groups.attribute_value) as reads:
        part = groups.partition(inv, groups.Projection(selector_reads(MODEL_A)))
    assert len(part.groups) == 1 and len(part.groups[0].members) == 40
    assert reads.call_count == 1


# ============================================================================ nodes that cannot fit


def _full_but_last(nodes: int) -> tuple[list[dict[str, Any]], AllocatedState]:
    slices = [slice_(f"node-{n:03d}", [gpu(f"gpu-{i}", {"model": {"string": "A"}}) for i in range(4)])
              for n in range(nodes)]  # fmt: skip
    state = AllocatedState(devices={(D, f"node-{n:03d}", f"gpu-{i}") for n in range(nodes - 1) for i in range(4)})
    return slices, state


def test_node_narrowing_still_finds_a_fit_on_the_last_node() -> None:
    slices, state = _full_but_last(50)
    fast, slow = both(claim(MODEL_A, count=4), slices, CLASSES, state)
    same(fast, slow)
    assert fast.node == "node-049"
    assert fast.explanation.nodes == {"tried": 50, "reasons": {"not enough suitable devices": 49}}


def test_node_narrowing_explains_a_claim_no_node_fits_like_the_search() -> None:
    slices, state = _full_but_last(20)
    state.devices -= {(D, "node-018", "gpu-2"), (D, "node-018", "gpu-3")}
    state.devices |= {(D, "node-019", "gpu-0"), (D, "node-019", "gpu-1")}  # 4 free, 2 per node
    fast, slow = both(claim(MODEL_A, count=4), slices, CLASSES, state)
    same(fast, slow)
    assert fast.allocation is None and fast.explanation.nodes["best"] == {"node": "node-000", "selector_matches": 4}


def test_nodes_are_skipped_without_a_search(monkeypatch: pytest.MonkeyPatch) -> None:
    slices, state = _full_but_last(30)
    searched: list[str | None] = []
    real = search.Search.run

    def counting(self: search.Search) -> bool:
        searched.append(self.node.name)
        return real(self)

    monkeypatch.setattr(search.Search, "run", counting)
    assert resolve(claim(MODEL_A), build_inventory(slices), CLASSES, state).node == "node-029"
    assert searched == ["node-029"]


def test_admin_access_and_shares_count_devices_in_use() -> None:
    slices, state = _full_but_last(3)
    fast, slow = both(claim(MODEL_A, count=4, adminAccess=True), slices, CLASSES, state)
    same(fast, slow)
    assert fast.node == "node-000"


# ============================================================================ importing CEL


def test_importing_the_engine_does_not_load_the_cel_command_line_tool() -> None:
    code = ("import sys; import dra_driver.allocator.resolve; "
            "loaded = [m for m in ('typer', 'rich', 'prompt_toolkit', 'pygments') if m in sys.modules]; "
            "assert not loaded, loaded; import cel; assert cel.cli.app is not None; assert 'typer' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# ============================================================================ shared counters


def _partitionable(node: str, consume: str, total: str = "80Gi") -> dict[str, Any]:
    return {"metadata": {"name": f"{node}-slice"}, "spec": {
        "driver": D, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
        "sharedCounters": [{"name": "gpu-0-counter-set", "counters": {"memory": {"value": total}}}],
        "devices": [gpu(f"part-{i}", {"model": {"string": "A"}}, consumesCounters=[
            {"counterSet": "gpu-0-counter-set", "counters": {"memory": {"value": consume}}}]) for i in range(2)]}}


def test_counters_in_a_pool_nothing_consumes_are_checked_once_per_device() -> None:
    slices = [_partitionable("node-a", "100Gi"), _partitionable("node-b", "40Gi")]
    fast, slow = both(claim(MODEL_A, count=2), slices, CLASSES)
    same(fast, slow)
    assert fast.node == "node-b"
    closest = fast.explanation.requests[0].closest
    assert fast.allocation is not None and not closest
    fast, slow = both(claim(MODEL_A, count=3), slices, CLASSES)
    same(fast, slow)
    assert [(c.label(), c.failed) for c in fast.explanation.requests[0].closest] == [
        (f"{D}/node-a/part-0, {D}/node-a/part-1", "counter gpu-0-counter-set/memory exhausted (needs 100Gi, 80Gi left)")]
    inv = build_inventory(slices)
    resolve(claim(MODEL_A), inv, CLASSES)
    assert [d.counters_alone for d in inv.devices] == [
        "counter gpu-0-counter-set/memory exhausted (needs 100Gi, 80Gi left)"] * 2 + ["", ""]


def test_devices_that_ask_the_same_of_pools_holding_different_counters_get_their_own_answer() -> None:
    """The answer for a device alone is shared by the devices that ask the same of a pool holding
    the same counters, and by no other."""
    slices = [_partitionable("node-a", "60Gi"), _partitionable("node-b", "60Gi", total="40Gi"),
              _partitionable("node-c", "60Gi"), _partitionable("node-d", "60Gi", total="40Gi")]
    inv = build_inventory(slices)
    resolve(claim(MODEL_A), inv, CLASSES)
    short = "counter gpu-0-counter-set/memory exhausted (needs 60Gi, 40Gi left)"
    assert [d.counters_alone for d in inv.devices] == ["", "", short, short, "", "", short, short]
    fast, slow = both(claim(MODEL_A, count=2), slices[1:2] + slices[3:], CLASSES)
    same(fast, slow)
    assert fast.allocation is None


def test_counters_in_a_pool_others_consume_are_checked_against_what_is_left() -> None:
    slices = [_partitionable("node-a", "40Gi")]
    state = AllocatedState(devices={(D, "node-a", "part-0")})
    fast, slow = both(claim(MODEL_A), slices, CLASSES, state)
    same(fast, slow)
    assert fast.allocation is not None and fast.explanation.devices == [f"{D}/node-a/part-1"]
    state.devices.add((D, "node-a", "part-1"))
    fast, slow = both(claim(MODEL_A, adminAccess=True), slices, CLASSES, state)
    same(fast, slow)
    assert [c.failed for c in fast.explanation.requests[0].closest] == [
        "counter gpu-0-counter-set/memory exhausted (needs 40Gi, 0 left)"]


# ============================================================================ within the class


TYPED = [{"metadata": {"name": "gpu"}, "spec": {"selectors": [
    {"cel": {"expression": f'device.driver == "{D}" && device.attributes["{D}"].type == "gpu"'}}]}}]
BIG = f'device.capacity["{D}"].memory.compareTo(quantity("100Gi")) >= 0'


def _typed_fleet() -> list[dict[str, Any]]:
    """Per node two GPUs and six MIG devices of different sizes, as a dynamic-MIG node publishes."""
    def mig(n: int, i: int) -> dict[str, Any]:
        return gpu(f"mig-{i}", {"type": {"string": "mig"}, "uuid": {"string": f"mig-{n}-{i}"}},
                   {"memory": {"value": f"{10 * (i + 1)}Gi"}})

    return shared([slice_(f"node-{n}", [*(gpu(f"gpu-{i}", {"type": {"string": "gpu"}, "uuid": {"string": f"{n}-{i}"}},
                                              {"memory": {"value": "80Gi" if n % 2 else "141Gi"}}) for i in range(2)),
                                         *(mig(n, i) for i in range(6))]) for n in range(6)])  # fmt: skip


def test_the_request_reads_only_the_devices_its_class_accepts(monkeypatch: pytest.MonkeyPatch) -> None:
    """At 5,000 nodes with dynamic MIG, two devices in three are MIG devices a GPU class rejects:
    a new request selector reads the others only (2 s against 0.7 at 5,000 nodes for the first
    claim that asks for memory), and decides and explains exactly as when it reads them all."""
    def outcome(inv: Any, *selectors: str, count: int = 1) -> tuple[Any, ...]:
        res = resolve(claim(*selectors, count=count), inv, TYPED)
        return res.allocation, res.explanation.to_dict(), res.explanation.render()

    read: list[str] = []
    real = groups.key_function

    def counting(projection: groups.Projection) -> Any:
        key = real(projection)
        return (lambda dev: read.append(dev.key[2]) or key(dev)) if projection.within else key

    monkeypatch.setattr(groups, "key_function", counting)
    inv = build_inventory(_typed_fleet())
    refined = [outcome(inv, BIG), outcome(inv, BIG, count=3), outcome(inv, BIG, count=2)]
    assert read and all(name.startswith("gpu-") for name in read), "MIG devices were read for the request"
    assert read == ["gpu-0", "gpu-0"]  # one GPU of each memory size
    assert refined[0][0] is not None and refined[1][0] is None
    assert "is false" in refined[1][2]

    # The same claims with the class's and the request's selectors read together, for every device.
    real_prepare = resolve_module.prepare_alt

    def unrefined(alt: Any, classes: Any) -> None:
        real_prepare(alt, classes)
        alt.class_selectors = 0

    monkeypatch.setattr(resolve_module, "prepare_alt", unrefined)
    read.clear()
    inv = build_inventory(_typed_fleet())
    assert [outcome(inv, BIG), outcome(inv, BIG, count=3), outcome(inv, BIG, count=2)] == refined
    assert not read
