"""What ``explain`` says about shares, policies, constraints and failing selectors (issues 13, 19, 20)."""

from __future__ import annotations

import io
import json
from typing import Any

from kubefake import FakeKube

from dra_driver.allocator.inventory import allocated_state, build_inventory
from dra_driver.allocator.resolve import resolve
from dra_driver.allocator.rules import SchedulerRules
from dra_driver.k8s.client import CLAIMS, DEVICE_CLASSES, SLICES
from dra_driver.tools.explain import command as explain

D = "gpu.dra-driver.io"
CLASSES = [{"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{D}"'}}]}}]
STEP_8GI = {"default": "8Gi", "validRange": {"min": "8Gi", "max": "80Gi", "step": "8Gi"}}


def gpu(i: int, memory: str = "80Gi", policy: dict[str, Any] | None = None, shared: bool = False,
        **attrs: Any) -> dict[str, Any]:  # fmt: skip
    capacity: dict[str, Any] = {"value": memory}
    if policy:
        capacity["requestPolicy"] = policy
    d: dict[str, Any] = {"name": f"gpu-{i}", "capacity": {"memory": capacity},
                         "attributes": {"index": {"int": i}, **{k: v for k, v in attrs.items()}}}  # fmt: skip
    if shared:
        d["allowMultipleAllocations"] = True
    return d


def node(name: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"driver": D, "nodeName": name, "devices": devices,
                                                 "pool": {"name": name, "generation": 1, "resourceSliceCount": 1}}}


def req(name: str, count: int = 1, memory: str | None = None, selector: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": "gpu", "count": count}
    if memory:
        body["capacity"] = {"requests": {"memory": memory}}
    if selector:
        body["selectors"] = [{"cel": {"expression": selector}}]
    return {"name": name, "exactly": body}


def claim(*requests: dict[str, Any], constraints: list[Any] | None = None, name: str = "c") -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"}, "spec": {"devices": devices}}


def share_of(owner: str, device: str, amount: str) -> dict[str, Any]:
    ns, name = owner.split("/")
    return {"metadata": {"namespace": ns, "name": name, "uid": owner}, "status": {"allocation": {"devices": {"results": [
        {"request": "r", "driver": D, "pool": "node-1", "device": device, "shareID": f"id-{owner}",
         "consumedCapacity": {"memory": amount}}]}}}}  # fmt: skip


def test_consumption_across_the_claims_requests_is_shown() -> None:
    # Issue 20 item 1: each request alone fits the device, together they do not.
    inv = build_inventory([node("node-1", [gpu(0, policy=STEP_8GI, shared=True)])])
    res = resolve(claim(req("r0", memory="40Gi"), req("r1", memory="41Gi")), inv, CLASSES)
    assert res.allocation is None
    assert res.explanation.consumption == [f"{D}/node-1/gpu-0 memory: r0 takes 40Gi, r1 would take 48Gi of 80Gi"]
    assert "r1 would take 48Gi of 80Gi" in res.explanation.summary
    # Where they fit together, nothing is said.
    res = resolve(claim(req("r0", memory="40Gi"), req("r1", memory="40Gi")), inv, CLASSES)
    assert res.allocation is not None and res.explanation.consumption == []


def test_policy_is_told_apart_from_fit() -> None:
    # Issue 20 item 2: 41Gi where the valid values stop at 40Gi, on a free 80Gi device.
    values = {"default": "10Gi", "validValues": ["10Gi", "20Gi", "40Gi"]}
    inv = build_inventory([node("node-1", [gpu(0, policy=values, shared=True), gpu(1, "24Gi", shared=True)])])
    res = resolve(claim(req("r0", memory="41Gi")), inv, CLASSES)
    notes = {n.device: n.failed for n in res.explanation.requests[0].closest}
    assert notes[f"{D}/node-1/gpu-0"] == ("memory: asked 41Gi, which the device's requestPolicy does not allow "
                                           "(valid values 10Gi, 20Gi, 40Gi)")  # fmt: skip
    assert notes[f"{D}/node-1/gpu-1"] == "memory: asked 41Gi, more than the device's 24Gi"
    inv = build_inventory([node("node-1", [gpu(0, policy=STEP_8GI, shared=True)])])
    res = resolve(claim(req("r0", memory="90Gi")), inv, CLASSES)
    assert "(valid range 8Gi to 80Gi in steps of 8Gi)" in res.explanation.requests[0].closest[0].failed


def test_rounding_is_shown_and_quantities_are_canonical() -> None:
    # Issue 20 item 3, and item 4: devices and shares are counted apart.
    inv = build_inventory([node("node-1", [gpu(0, policy=STEP_8GI, shared=True), gpu(1, policy=STEP_8GI, shared=True)])])
    res = resolve(claim(req("r0", count=2, memory="7Gi"), req("r1", memory="9Gi")), inv, CLASSES)
    assert res.allocation is not None
    assert [r["consumedCapacity"] for r in res.allocation["devices"]["results"]] == [
        {"memory": "8Gi"}, {"memory": "8Gi"}, {"memory": "16Gi"}]
    notes = [(n.request, n.device.rsplit("/", 1)[1], n.consumption) for n in res.explanation.results]
    assert notes == [("r0", "gpu-0", ["memory: asked 7Gi → consumes 8Gi (minimum 8Gi)"]),
                     ("r0", "gpu-1", ["memory: asked 7Gi → consumes 8Gi (minimum 8Gi)"]),
                     ("r1", "gpu-0", ["memory: asked 9Gi → consumes 16Gi (step 8Gi)"])]  # fmt: skip
    summary = res.explanation.summary
    assert summary.startswith("allocated 2 device(s) (3 share(s) on 2 of them) on node node-1: ")
    assert f"{D}/node-1/gpu-0 (2 shares), {D}/node-1/gpu-1" in summary


def test_explain_json_has_consumed_capacity_and_the_rounding() -> None:
    kube = FakeKube()
    kube.add(SLICES, node("node-1", [gpu(0, policy={"validRange": {"min": "1Gi", "step": "1Gi"}}, shared=True)]))
    kube.add(DEVICE_CLASSES, CLASSES[0])
    c = claim(req("r0", memory="6.5Gi"))
    kube.add(CLAIMS, c)
    out, err = io.StringIO(), io.StringIO()
    assert explain.main("claim/c", namespace="ns", output="json", api=kube, out=out, err=err) == 0, err.getvalue()  # type: ignore[arg-type]
    [row] = json.loads(out.getvalue())["results"]
    assert row["consumedCapacity"] == {"memory": "7Gi"} and row["shareID"]
    assert row["consumption"] == ["memory: asked 6656Mi → consumes 7Gi (step 1Gi)"]
    # Allocated by someone else: the same, read from the claim's status and the slice.
    c["status"] = {"allocation": {"devices": {"results": [{**{k: row[k] for k in ("request", "driver", "pool", "device")},
                                                            "shareID": "x", "consumedCapacity": {"memory": "7516192768"}}]}}}
    kube.objects.clear()
    kube.add(SLICES, node("node-1", [gpu(0, policy={"validRange": {"min": "1Gi", "step": "1Gi"}}, shared=True)]))
    kube.add(CLAIMS, c)
    out = io.StringIO()
    assert explain.main("claim/c", namespace="ns", output="text", api=kube, out=out, err=err) == 0  # type: ignore[arg-type]
    assert "1 device(s), 1 share(s) on 1 of them" in out.getvalue()
    assert "(share; memory: asked 6656Mi → consumes 7Gi (step 1Gi))" in out.getvalue()


def test_other_claims_consumption_is_named() -> None:
    # Issue 13: "gpu-0: 60Gi of 80Gi consumed by a/x, b/y; need 30Gi".
    inv = build_inventory([node("node-1", [gpu(0, shared=True)])])
    used = allocated_state([share_of("ns/x", "gpu-0", "40Gi"), share_of("ns/y", "gpu-0", "20Gi")])
    res = resolve(claim(req("r0", memory="30Gi")), inv, CLASSES, used)
    assert res.allocation is None
    [note] = res.explanation.requests[0].closest
    assert note.failed == "memory: 60Gi of 80Gi consumed by ns/x, ns/y; need 30Gi"
    assert any(s.stage == "capacity left by other claims" and s.kept == 0 for s in res.explanation.requests[0].stages)
    assert resolve(claim(req("r0", memory="20Gi")), inv, CLASSES, used).allocation is not None


def test_other_namespaces_claims_are_only_counted() -> None:
    # Issue 50: a tenant is told that a GPU is taken, not which other tenant's claim holds it.
    inv = build_inventory([node("node-1", [gpu(0, shared=True)])])
    used = allocated_state([share_of("ns/x", "gpu-0", "30Gi"), share_of("a/y", "gpu-0", "20Gi"),
                            share_of("b/z", "gpu-0", "10Gi")])
    res = resolve(claim(req("r0", memory="30Gi")), inv, CLASSES, used)
    [note] = res.explanation.requests[0].closest
    assert note.failed == "memory: 60Gi of 80Gi consumed by ns/x, 2 claims in other namespaces; need 30Gi"
    text = res.explanation.render() + json.dumps(res.explanation.to_dict())
    assert "a/y" not in text and "b/z" not in text
    alone = allocated_state([share_of("a/y", "gpu-0", "60Gi")])
    [note] = resolve(claim(req("r0", memory="30Gi")), inv, CLASSES, alone).explanation.requests[0].closest
    assert note.failed == "memory: 60Gi of 80Gi consumed by 1 claim in another namespace; need 30Gi"


def test_distinct_attribute_counts_per_node() -> None:
    # Issue 20 item 5: not a sum over nodes, but per node what it has against what is needed.
    inv = build_inventory([node("node-1", [gpu(i, numa={"int": i % 2}) for i in range(4)]),
                           node("node-2", [gpu(i, numa={"int": 0}) for i in range(2)])])  # fmt: skip
    res = resolve(claim(req("r0", count=3), constraints=[{"distinctAttribute": f"{D}/numa"}]), inv, CLASSES)
    assert res.allocation is None
    assert res.explanation.constraints == [
        f"distinctAttribute {D}/numa over r0: needs 3 distinct values; distinct values per node: node-1 2 (0, 1); node-2 1 (0)"]
    res = resolve(claim(req("r0", count=3), constraints=[{"matchAttribute": f"{D}/numa"}]), inv, CLASSES)
    assert res.explanation.constraints == [
        f"matchAttribute {D}/numa over r0: needs 3 devices with one value; "
        "devices with one value per node: node-1 at most 2 (value 0); node-2 at most 2 (value 0)"]


def test_failing_selectors_show_the_values_they_read_grouped_by_device() -> None:
    # Issue 20 item 6 and issue 19: one line per way of failing, not per device.
    mig = {"name": "gpu-9-mig", "attributes": {"type": {"string": "mig"}}, "capacity": {"memory": {"value": "10Gi"}}}
    inv = build_inventory([node("gpu-node-1", [gpu(i, architecture={"string": "Hopper"}) for i in range(5)] + [mig])])
    res = resolve(claim(req("gpu", selector=f'device.capacity["{D}"].memory.compareTo(quantity("1Ti")) >= 0')), inv, CLASSES)
    lines = [f"{n.label()}: {n.failed}" for n in res.explanation.requests[0].closest]
    assert lines == [
        f"{D}/gpu-node-1/gpu-0 … gpu-4 (5 devices): request gpu selector #0 is false: memory is 80Gi; the selector needs ≥ 1Ti",
        f"{D}/gpu-node-1/gpu-9-mig: request gpu selector #0 is false: memory is 10Gi; the selector needs ≥ 1Ti"]
    text = res.explanation.render()
    assert "closest gpu.dra-driver.io/gpu-node-1/gpu-0 … gpu-4 (5 devices)" in text
    assert 'request gpu selector #0: device.capacity["gpu.dra-driver.io"].memory.compareTo(quantity("1Ti")) >= 0' in text
    sel = f'has(device.attributes["{D}"].architecture) && device.attributes["{D}"].architecture == "Blackwell"'
    res = resolve(claim(req("gpu", selector=sel)), inv, CLASSES)
    failed = {n.failed for n in res.explanation.requests[0].closest}
    assert failed == {'request gpu selector #0 is false: architecture is "Hopper"; the selector needs == "Blackwell"',
                      "request gpu selector #0 is false: architecture: missing on this MIG device"}


def three_numa_nodes() -> tuple[Any, dict[str, Any]]:
    devices = [gpu(i, numa={"int": n}) for i, n in enumerate((0, 1, 0))]
    return build_inventory([node("node-1", devices)]), claim(req("r0", count=3),
                                                              constraints=[{"distinctAttribute": f"{D}/numa"}])


def test_the_136_distinct_attribute_rule_is_replayed() -> None:
    inv, c = three_numa_nodes()
    assert resolve(c, inv, CLASSES).allocation is None  # the API (and 1.37): three distinct values needed
    old = resolve(c, inv, CLASSES, rules=SchedulerRules.for_version("v1.36.3"))
    assert old.allocation is not None  # 1.36 compares gpu-2 (0) only with gpu-1 (1): 0, 1, 0
    assert [r["device"] for r in old.allocation["devices"]["results"]] == ["gpu-0", "gpu-1", "gpu-2"]


def test_explain_decides_with_the_clusters_scheduler_rules() -> None:
    # Issue 20, then 42: the rules come from the API server's version unless named.
    inv_slices = [node("node-1", [gpu(i, numa={"int": n}) for i, n in enumerate((0, 1, 0))])]
    _, c = three_numa_nodes()
    asked: list[str] = []

    def run(version: str, obj: dict[str, Any], choice: str = "auto", output: str = "json") -> Any:
        kube = FakeKube()
        for s in inv_slices:
            kube.add(SLICES, s)
        kube.add(DEVICE_CLASSES, CLASSES[0])
        kube.add(CLAIMS, obj)
        out = io.StringIO()

        def server_version() -> str:
            asked.append(version)
            return version

        assert explain.main("claim/c", namespace="ns", output=output, api=kube, out=out, server_version=server_version,  # type: ignore[arg-type]
                            scheduler_rules=choice) == 0
        return json.loads(out.getvalue()) if output == "json" else out.getvalue()

    doc = run("v1.36.3", c)
    assert doc["state"] == "satisfiable"  # 1.36 compares gpu-2 (0) only with gpu-1 (1)
    assert doc["rules"] == "kube-scheduler 1.36 (incubating allocator)" and "rulesWarning" not in doc
    doc = run("v1.37.2", c)
    assert doc["state"] == "unsatisfiable" and doc["rules"] == "kube-scheduler 1.37 (incubating allocator)"
    assert "rules: kube-scheduler 1.38 (stable allocator)" in run("v1.38.0", c, output="text")
    asked.clear()
    doc = run("v1.36.3", c, choice="1.37")
    assert doc["state"] == "unsatisfiable" and asked == []  # named: the version is not read
    doc = run("v1.41.0", c)
    assert doc["rules"] == "kube-scheduler 1.38 (stable allocator)"
    assert doc["rulesWarning"] == ("Kubernetes v1.41.0 is newer than the engine knows: deciding as "
                                   "kube-scheduler 1.38 (stable allocator)")
