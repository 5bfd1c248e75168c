"""Grouping by signature (``allocator.columns``) must group exactly as reading every device's key.

The reference groups the devices of usable pools with a clean CEL input, in inventory order, by
``groups.key_function`` read device by device (a device the class rejects by its class group):
the grouping before signatures. Generated fleets (shared and unshared entries, names spelled both
ways, in different orders, foreign domains, broken devices, incomplete pools, shares and counters,
dynamic-MIG-like pools of several layouts) and generated projections must come out the same.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from typing import Any

import pytest

from dra_driver.allocator import columns, groups
from dra_driver.allocator.cel.reads import Reads
from dra_driver.allocator.groups import OUTSIDE, Coarse, Partition, Projection, partition
from dra_driver.allocator.inventory import Inventory, build_inventory
from dra_driver.controller.views import slice_view

D = "gpu.dra-driver.io"
OTHER = "other.example.com"
NAMES = ("model", "uuid", "index", "mem", "kind")


def _entry(rng: random.Random, name: str, n: int, j: int) -> dict[str, Any]:
    if name == "uuid":
        return {"string": f"{n}-{j}"}
    if name == "index":
        return {"int": j % 3}
    if name == "mem":
        return {"version": rng.choice(("1.0.0", "2.0.0"))}
    return {"string": rng.choice("AB")}


def _device(rng: random.Random, n: int, j: int, layout: list[str]) -> dict[str, Any]:
    attributes: dict[str, Any] = {}
    for name in layout:
        spelled = rng.choice((name, name, f"{D}/{name}", f"{OTHER}/{name}"))
        attributes[spelled] = _entry(rng, name, n, j)
        if rng.random() < 0.1:  # the other spelling too, before or after
            attributes[f"{D}/{name}" if "/" not in spelled else name] = _entry(rng, name, n, j)
    if rng.random() < 0.05:
        attributes["broken"] = {"int": 1, "string": "two types"}
    capacity: dict[str, Any] = {"memory": {"value": rng.choice(("80Gi", "40Gi"))}}
    if rng.random() < 0.2:
        capacity[f"{D}/memory"] = {"value": "80Gi"}
    if rng.random() < 0.2:
        capacity["memory"]["requestPolicy"] = {"default": "10Gi"}
    device: dict[str, Any] = {"name": f"dev-{j}", "attributes": attributes, "capacity": capacity}
    if rng.random() < 0.15:
        device["allowMultipleAllocations"] = True
    if rng.random() < 0.15:
        device["consumesCounters"] = [{"counterSet": "cs", "counters": {"mem": {"value": "1Gi"}}}]
    return device


def _fleet(seed: int) -> list[dict[str, Any]]:
    """Slices of a few nodes: most devices of a node alike (the same layout, the same values but
    a few), some nodes of two layouts, some devices and pools the engine does not group."""
    rng = random.Random(seed)
    out = []
    for n in range(rng.randint(1, 6)):
        layouts = [rng.sample(NAMES, rng.randint(0, len(NAMES))) for _ in range(rng.choice((1, 1, 2)))]
        alike = {"string": rng.choice("AB")}
        devices = []
        for j in range(rng.randint(1, 6)):
            device = _device(rng, n, j, rng.choice(layouts))
            for name in list(device["attributes"]):
                if name.endswith("model") and rng.random() < 0.5:
                    device["attributes"][name] = alike  # one object for the node's devices
            devices.append(device)
        spec: dict[str, Any] = {"driver": rng.choice((D, D, OTHER)), "nodeName": f"node-{n}",
                                "pool": {"name": f"node-{n}", "generation": 1,
                                         "resourceSliceCount": 2 if rng.random() < 0.1 else 1},
                                "sharedCounters": [{"name": "cs", "counters": {"mem": {"value": "8Gi"}}}],
                                "devices": devices}
        out.append({"metadata": {"name": f"node-{n}-slice"}, "spec": spec})
    return out


def _inventory(seed: int) -> Inventory:
    """The fleet as the controller's informer holds it (equal entries one object), or as decoded."""
    slices = _fleet(seed)
    if seed % 2:
        view = slice_view()
        slices = [view(copy.deepcopy(sl)) for sl in slices]
    return build_inventory(slices)


def _projection(rng: random.Random) -> Projection:
    fields = tuple(sorted({(rng.choice(("attributes", "attributes", "capacity")),
                            rng.choice((D, D, OTHER, "a/b")), rng.choice((*NAMES, "memory", "broken")))
                           for _ in range(rng.randint(0, 3))}))
    domains = tuple(sorted({(rng.choice(("attributes", "capacity")), rng.choice((D, OTHER)))
                            for _ in range(rng.choice((0, 0, 0, 1)))}))
    reads = Reads(driver=rng.random() < 0.5, multi=rng.random() < 0.3, fields=fields, domains=domains)
    return Projection(reads, capacity=rng.random() < 0.3, flags=rng.random() < 0.3)


def _reference(inv: Inventory, projection: Projection, coarse: Coarse | None) -> tuple[Any, ...]:
    key_of = groups.key_function(projection)
    group_of = [-1] * len(inv.devices)
    numbers: dict[Any, int] = {}
    found: list[tuple[Any, int, list[int]]] = []
    for pool in inv.pools:
        if not pool.usable:
            continue
        for d in pool.devices:
            if not d.cel_clean:
                continue
            if coarse is not None and coarse.partition.group_of[d.index] not in coarse.accepted:
                key: Any = (OUTSIDE, coarse.partition.group_of[d.index])
            else:
                key = key_of(d)
            g = numbers.setdefault(key, len(found))
            if g == len(found):
                found.append((key, d.index, []))
            found[g][2].append(d.index)
            group_of[d.index] = g
    return found, group_of


def _summary(part: Partition) -> tuple[Any, ...]:
    return [(g.key, g.rep.index, list(g.members)) for g in part.groups], list(part.group_of)


def _coarse(inv: Inventory, rng: random.Random) -> Coarse:
    part = partition(inv, Projection(Reads(driver=True, fields=(("attributes", D, "model"),))))
    return Coarse(part, frozenset(g for g in range(len(part.groups)) if rng.random() < 0.5))


def _given(coarse: Coarse) -> Callable[[], Coarse]:
    return lambda: coarse


@pytest.mark.parametrize("first", range(0, 400, 100))
def test_generated_fleets_group_as_device_by_device(first: int) -> None:
    for seed in range(first, first + 100):
        rng = random.Random(seed)
        inv = _inventory(seed)
        for _ in range(4):
            projection = _projection(rng)
            assert _summary(partition(inv, projection)) == _reference(inv, projection, None), (seed, projection)
            coarse = _coarse(inv, rng)
            # A grouping within a class is kept by the class's selectors: one per set of groups accepted.
            label = f"a class accepting {sorted(coarse.accepted)}"
            within = Projection(projection.reads, projection.capacity, projection.flags, within=(label,))
            assert _summary(partition(inv, within, _given(coarse))) == _reference(inv, within, coarse), (seed, within)


def _nodes(models: str, view: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """A node of four GPUs per letter of ``models``, as the informer holds them (equal entries one
    object) unless ``view`` says otherwise."""
    view = view or slice_view()
    return [view({"metadata": {"name": f"node-{n}"}, "spec": {
        "driver": D, "nodeName": f"node-{n}", "pool": {"name": f"node-{n}", "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": f"gpu-{j}", "attributes": {"model": {"string": model}, "uuid": {"string": f"{n}-{j}"}},
                     "capacity": {"memory": {"value": "80Gi"}}} for j in range(4)]}})
        for n, model in enumerate(models)]


def test_a_node_of_one_model_is_one_set_alike_with_one_profile() -> None:
    inv = build_inventory(_nodes("AAB"))
    found = [columns.pool_columns(p) for p in inv.pools]
    assert all(c.whole for c in found)
    profiles = [c.alike[0].profile for c in found]
    assert profiles[0] is profiles[1] and profiles[2] is not profiles[0]
    assert profiles[0].varying == frozenset({("attributes", "uuid")})


def test_equal_entries_that_are_not_one_object_do_not_tell_devices_apart() -> None:
    inv = build_inventory(_nodes("AB", view=lambda sl: sl))  # as decoded: every entry its own object
    found = [columns.pool_columns(p) for p in inv.pools]
    assert all(c.whole and c.alike[0].profile.varying == {("attributes", "uuid")} for c in found)
    projection = Projection(Reads(fields=(("attributes", D, "model"), ("capacity", D, "memory"))))
    part = partition(inv, projection)
    assert _summary(part) == _reference(inv, projection, None)
    assert [len(g.members) for g in part.groups] == [4, 4]


def test_a_new_selector_over_nodes_alike_reads_one_device_per_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    inv = build_inventory(_nodes("ABAB"))
    for pool in inv.pools:
        columns.pool_columns(pool)
    device_by_device: list[Any] = []
    real = columns.Alike.signatures
    def noted(self: columns.Alike, *args: Any) -> list[tuple[Any, ...]]:
        device_by_device.append(self)
        return real(self, *args)

    monkeypatch.setattr(columns.Alike, "signatures", noted)
    read: list[str] = []
    key_function = groups.key_function

    def counting(projection: Projection) -> Any:
        key = key_function(projection)

        def noted(dev: Any) -> Any:
            read.append(dev.key[1])
            return key(dev)

        return noted

    monkeypatch.setattr(groups, "key_function", counting)
    projection = Projection(Reads(fields=(("attributes", D, "model"), ("capacity", D, "memory"))))
    part = partition(inv, projection)
    assert not device_by_device
    assert read == ["node-0", "node-1"]  # a key per profile, read from its first device
    assert _summary(part) == _reference(inv, projection, None)
    # A name that differs between a node's devices is read device by device.
    projection = Projection(Reads(fields=(("attributes", D, "uuid"),)))
    assert _summary(partition(inv, projection)) == _reference(inv, projection, None)
    assert len(device_by_device) == 4


def test_a_slice_change_regroups_with_the_changed_pool_read_anew() -> None:
    slices = _nodes("AAB")
    inv = build_inventory(slices)
    projection = Projection(Reads(fields=(("attributes", D, "model"),)))
    before = _summary(partition(inv, projection))
    kept = {p.name: p.columns for p in inv.pools}
    changed = copy.deepcopy(slices[1])
    changed["spec"]["pool"]["generation"] = 2
    changed["spec"]["devices"][2]["attributes"]["model"] = {"string": "B"}
    rebuilt = build_inventory([slices[0], slice_view()(changed), slices[2]], previous=inv)
    after = partition(rebuilt, projection)
    assert _summary(after) == _reference(rebuilt, projection, None)
    assert [len(g.members) for g in after.groups] == [7, 5]  # node-1's third GPU moved to model B
    assert _summary(partition(inv, projection)) == before  # the old inventory keeps its grouping
    assert [pool.columns is kept[pool.name] for pool in rebuilt.pools] == [True, False, True]
    assert len(columns.pool_columns(rebuilt.pools[1]).alike) == 1  # one layout, the model now varies
