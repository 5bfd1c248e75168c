import copy
from typing import Any

import pytest
from sliceapi import InMemorySliceApi

from dra_driver.k8s.client import SLICES
from dra_driver.node.describe.devices import describe, enumerate_devices
from dra_driver.node.discovery.simulated import SimulatedBackend
from dra_driver.node.publish.slices import (
    PoolOwner,
    SliceContent,
    decode_index,
    dropped_features,
    generate_name,
    plan,
    semantically_equal,
    split_into_slices,
    validate_pool,
)

DRIVER = "gpu.example.com"
OWNER = PoolOwner(DRIVER, "node-a", "uid-a")


def dev(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "attributes": {"type": {"string": "gpu"}}, "capacity": {"memory": {"value": "80Gi"}},
            **extra}


def apply(client: InMemorySliceApi, desired: list[SliceContent], **kw: Any) -> Any:
    existing = client.list(SLICES, field_selector=f"spec.nodeName={OWNER.node_name},spec.driver={DRIVER}").items
    p = plan(desired, existing, OWNER, **kw)
    for op in p.ops:
        if op.kind == "delete":
            client.delete(SLICES, op.name, uid=op.uid, resource_version=op.resource_version)
        elif op.kind == "update":
            assert op.body is not None
            client.replace(SLICES, op.body)
        else:
            assert op.body is not None
            client.create(SLICES, op.body)
    return p


def slices_of(client: InMemorySliceApi) -> list[dict[str, Any]]:
    return sorted(client.objects.values(), key=lambda o: o["metadata"]["name"])


# --- splitting -----------------------------------------------------------------------------------


def test_split_plain_devices_at_128() -> None:
    slices = split_into_slices([dev(f"gpu-{i}") for i in range(300)], [])
    assert [len(s.devices) for s in slices] == [128, 128, 44]


def test_split_advanced_devices_at_64_and_counters_apart() -> None:
    counters = [{"name": f"gpu-{i}-counter-set", "counters": {"c": {"value": "1"}}} for i in range(10)]
    devices = [dev(f"d-{i}", consumesCounters=[{"counterSet": "gpu-0-counter-set", "counters": {"c": {"value": "1"}}}])
               for i in range(130)]
    slices = split_into_slices(devices, counters)
    assert [len(s.shared_counters) for s in slices] == [8, 2, 0, 0, 0]
    assert [len(s.devices) for s in slices] == [0, 0, 64, 64, 2]
    validate_pool(slices)


def test_split_mixed_plain_then_tainted() -> None:
    devices = [dev(f"p-{i}") for i in range(100)] + [dev("t", taints=[{"key": "k", "effect": "NoSchedule"}])]
    slices = split_into_slices(devices, [])
    assert [len(s.devices) for s in slices] == [100, 1]


def test_empty_pool_is_one_empty_slice() -> None:
    slices = split_into_slices([], [])
    assert len(slices) == 1 and not slices[0].devices and not slices[0].shared_counters


def test_validate_pool_rejects() -> None:
    with pytest.raises(ValueError, match="duplicate device"):
        validate_pool([SliceContent(devices=[dev("a")]), SliceContent(devices=[dev("a")])])
    with pytest.raises(ValueError, match="unknown counter set"):
        validate_pool([SliceContent(devices=[dev("a", consumesCounters=[{"counterSet": "x", "counters": {}}])])])
    cs = {"name": "x", "counters": {"c": {"value": "1"}}}
    with pytest.raises(ValueError, match="unknown counters"):
        validate_pool([SliceContent(shared_counters=[cs]),
                       SliceContent(devices=[dev("a", consumesCounters=[{"counterSet": "x",
                                                                          "counters": {"d": {"value": "1"}}}])])])
    with pytest.raises(ValueError, match="duplicate counter set"):
        validate_pool([SliceContent(shared_counters=[cs, cs])])
    with pytest.raises(ValueError, match="separate"):
        validate_pool([SliceContent(devices=[dev("a")], shared_counters=[cs])])
    with pytest.raises(ValueError, match="limit 128"):
        validate_pool([SliceContent(devices=[dev(f"d{i}") for i in range(129)])])


# --- planning ------------------------------------------------------------------------------------


def test_names_and_index() -> None:
    assert generate_name(0, 1, OWNER) == "00000-gpu.example.com-node-a-"
    assert generate_name(0x1a, 0x100001, OWNER).startswith("00001a-")
    assert decode_index("0000a-gpu.example.com-node-a-xyz12", 5) == 10
    assert decode_index("0000a-x", 6) is None
    assert decode_index("gpu-example-x", 5) is None
    assert decode_index("0000g-x", 5) is None


def test_first_publish() -> None:
    client = InMemorySliceApi()
    desired = [SliceContent(devices=[dev("gpu-0"), dev("gpu-1")])]
    p = apply(client, desired)
    assert [op.kind for op in p.ops] == ["create"] and p.generation == 1
    (obj,) = client.objects.values()
    assert obj["apiVersion"] == "resource.k8s.io/v1" and obj["kind"] == "ResourceSlice"
    assert obj["metadata"]["name"].startswith("00000-gpu.example.com-node-a-")
    assert obj["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "uid-a", "controller": True}]
    spec = obj["spec"]
    assert spec["driver"] == DRIVER and spec["nodeName"] == "node-a"
    assert spec["pool"] == {"name": "node-a", "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1"]
    assert "sharedCounters" not in spec


def test_no_op() -> None:
    client = InMemorySliceApi()
    desired = [SliceContent(devices=[dev("gpu-0")])]
    apply(client, desired)
    p = apply(client, copy.deepcopy(desired))
    assert p.ops == [] and p.generation == 1


def test_no_op_despite_equivalent_quantities_and_taint_time() -> None:
    client = InMemorySliceApi()
    desired = [SliceContent(devices=[dev("gpu-0", taints=[{"key": "k", "effect": "NoSchedule"}])])]
    apply(client, desired)
    (obj,) = client.objects.values()
    assert obj["spec"]["devices"][0]["taints"][0]["timeAdded"]  # set by the "server"
    obj["spec"]["devices"][0]["capacity"]["memory"]["value"] = "85899345920"  # same as 80Gi
    assert apply(client, desired).ops == []


def test_one_in_place_update_keeps_generation() -> None:
    client = InMemorySliceApi()
    desired = [SliceContent(devices=[dev("gpu-0")]), SliceContent(devices=[dev("gpu-1")])]
    apply(client, desired)
    names_before = {o["metadata"]["name"] for o in client.objects.values()}
    desired[1] = SliceContent(devices=[dev("gpu-1", attributes={"type": {"string": "changed"}})])
    p = apply(client, desired)
    assert [op.kind for op in p.ops] == ["update"] and p.generation == 1
    assert {o["metadata"]["name"] for o in client.objects.values()} == names_before
    assert {o["spec"]["pool"]["generation"] for o in client.objects.values()} == {1}


def test_taint_time_is_carried_on_update() -> None:
    client = InMemorySliceApi()
    taint = {"key": "gpu.example.com/xid", "value": "79", "effect": "NoSchedule"}
    apply(client, [SliceContent(devices=[dev("gpu-0", taints=[dict(taint)]), dev("gpu-1")])])
    p = apply(client, [SliceContent(devices=[dev("gpu-0", taints=[dict(taint)]),
                                             dev("gpu-1", taints=[dict(taint)])])])
    assert [op.kind for op in p.ops] == ["update"]
    assert p.ops[0].body is not None
    sent = p.ops[0].body["spec"]["devices"]
    assert sent[0]["taints"][0]["timeAdded"] == "2026-01-01T00:00:00Z" and "timeAdded" not in sent[1]["taints"][0]


def test_multi_slice_change_bumps_generation_and_rewrites_all() -> None:
    client = InMemorySliceApi()
    desired = [SliceContent(devices=[dev(f"gpu-{i}")]) for i in range(3)]
    apply(client, desired)
    desired[0] = SliceContent(devices=[dev("gpu-0", attributes={})])
    desired[2] = SliceContent(devices=[dev("gpu-2", attributes={})])
    p = apply(client, desired)
    assert [op.kind for op in p.ops] == ["update", "update", "update"] and p.generation == 2
    assert {o["spec"]["pool"]["generation"] for o in client.objects.values()} == {2}


def test_new_slice_bumps_generation() -> None:
    client = InMemorySliceApi()
    apply(client, [SliceContent(devices=[dev("gpu-0")])])
    p = apply(client, [SliceContent(devices=[dev("gpu-0")]), SliceContent(devices=[dev("gpu-1")])])
    assert [op.kind for op in p.ops] == ["update", "create"] and p.generation == 2
    assert {(o["spec"]["pool"]["generation"], o["spec"]["pool"]["resourceSliceCount"])
            for o in client.objects.values()} == {(2, 2)}


def test_shrink_deletes_obsolete_first() -> None:
    client = InMemorySliceApi()
    apply(client, [SliceContent(devices=[dev(f"gpu-{i}")]) for i in range(3)])
    p = apply(client, [SliceContent(devices=[dev("gpu-0")])])
    kinds = [op.kind for op in p.ops]
    assert kinds == ["delete", "delete", "update"]
    assert p.generation == 1  # one update, no creates: generation kept
    (obj,) = client.objects.values()
    assert obj["spec"]["pool"]["resourceSliceCount"] == 1


def test_obsolete_kinds_deleted_first() -> None:
    client = InMemorySliceApi()
    apply(client, [SliceContent(devices=[dev("gpu-0")])])
    # a slice with an old generation, one with a foreign name, one of another pool on our node,
    # one of another driver (ignored), one of another node (ignored)
    base = next(iter(client.objects.values()))
    def extra(name: str, **spec: Any) -> None:
        body = copy.deepcopy(base)
        body["metadata"] = {"name": name}
        body["spec"].update(spec)
        client.create(SLICES, body)
    extra("00000-old-gen", pool={"name": "node-a", "generation": 0, "resourceSliceCount": 1})
    extra("legacy-name-abcde")
    extra("00001-other-pool", pool={"name": "other", "generation": 5, "resourceSliceCount": 1})
    extra("00000-other-driver", driver="other.example.com")
    extra("00000-other-node", nodeName="node-b")
    p = apply(client, [SliceContent(devices=[dev("gpu-0")])])
    assert [op.kind for op in p.ops] == ["delete", "delete", "delete"]
    assert {op.name for op in p.ops} == {"00000-old-gen", "legacy-name-abcde", "00001-other-pool"}
    assert len(client.objects) == 3


def test_duplicate_index_is_obsolete() -> None:
    client = InMemorySliceApi()
    apply(client, [SliceContent(devices=[dev("gpu-0")])])
    body = copy.deepcopy(next(iter(client.objects.values())))
    body["metadata"] = {"name": "00000-gpu.example.com-node-a-zzzzz"}
    client.create(SLICES, body)
    p = apply(client, [SliceContent(devices=[dev("gpu-0")])])
    assert [op.kind for op in p.ops] == ["delete"] and p.ops[0].name.endswith("zzzzz")


def test_wiped_slices_are_recreated() -> None:
    client = InMemorySliceApi()
    desired = [SliceContent(devices=[dev("gpu-0")]), SliceContent(devices=[dev("gpu-1")])]
    apply(client, desired)
    client.wipe()
    p = apply(client, desired)
    assert [op.kind for op in p.ops] == ["create", "create"]
    assert p.generation == 1  # nothing left to compare against: starts again
    # a partial wipe: the survivor is rewritten with a bumped generation
    victim = sorted(client.objects)[1]
    client.delete(SLICES, victim)
    p = apply(client, desired)
    assert sorted(op.kind for op in p.ops) == ["create", "update"] and p.generation == 2


def test_driver_generation_wins() -> None:
    client = InMemorySliceApi()
    apply(client, [SliceContent(devices=[dev("gpu-0")])])
    p = apply(client, [SliceContent(devices=[dev("gpu-0")])], min_generation=7)
    assert p.generation == 7 and [op.kind for op in p.ops] == ["update"]


def test_index_prefix_grows_with_many_slices() -> None:
    desired = [SliceContent(devices=[dev(f"gpu-{i}")]) for i in range(3)]
    p = plan(desired, [], OWNER)
    assert [op.body["metadata"]["generateName"][:6] for op in p.ops if op.body] == ["00000-", "00001-", "00002-"]


def test_simulated_node_dynamic_mig_layout() -> None:
    gpus = SimulatedBackend("h100-8x", "node-a").discover()
    devices, counters = describe(enumerate_devices(gpus, True), DRIVER, True)
    slices = split_into_slices(devices, counters)
    validate_pool(slices)
    assert len(slices[0].shared_counters) == 8 and not slices[0].devices
    assert all(len(s.devices) <= 64 for s in slices[1:])
    assert sum(len(s.devices) for s in slices) == 8 * 19
    client = InMemorySliceApi()
    p = apply(client, slices)
    assert p.count("create") == len(slices) == len(client.objects)


# --- dropped fields ------------------------------------------------------------------------------


def test_dropped_features() -> None:
    sent = {"spec": {"devices": [dev("a", taints=[{"key": "k", "effect": "NoSchedule"}],
                                     consumesCounters=[{"counterSet": "s", "counters": {}}],
                                     allowMultipleAllocations=True)],
                     "sharedCounters": [{"name": "s", "counters": {"c": {"value": "1"}}}]}}
    stored = {"spec": {"devices": [dev("a")]}}
    assert dropped_features(sent, stored) == ["DRADeviceTaints", "DRAPartitionableDevices", "DRAConsumableCapacity"]
    assert dropped_features(sent, copy.deepcopy(sent)) == []
    assert dropped_features({"spec": {"devices": [dev("a")]}}, {"spec": {"devices": [dev("b")]}}) == ["unknown"]
    assert semantically_equal({"value": "1Gi"}, {"value": "1073741824"})
    assert not semantically_equal({"value": "1Gi"}, {"value": "1G"})
