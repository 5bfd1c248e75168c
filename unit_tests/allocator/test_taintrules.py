"""DeviceTaintRules merged into the devices they select, as the scheduler's slice tracker does
(issue 50): the taint acts as a published one, an explanation names the rule."""

from __future__ import annotations

from typing import Any

from dra_driver.allocator.inventory import build_inventory
from dra_driver.allocator.resolve import resolve
from dra_driver.allocator.taintrules import RULE_KEY, taint_rules, with_taint_rules

D = "gpu.dra-driver.io"
CLASSES = [{"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{D}"'}}]}}]


def node(name: str, n: int = 2, driver: str = D) -> dict[str, Any]:
    return {"metadata": {"name": f"{name}-{driver}"}, "spec": {
        "driver": driver, "nodeName": name, "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
        "devices": [{"name": f"gpu-{i}", "attributes": {"index": {"int": i}}} for i in range(n)]}}


def rule(name: str, effect: str = "NoSchedule", **selector: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"deviceSelector": selector,
                                                  "taint": {"key": "maintenance", "value": "planned", "effect": effect}}}


def claim(count: int = 1, tolerations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "gpu", "count": count}
    if tolerations:
        exactly["tolerations"] = tolerations
    return {"metadata": {"name": "c", "namespace": "ns", "uid": "u"},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": exactly}]}}}


def taints(slices: list[Any]) -> dict[tuple[str, str], list[str]]:
    return {(s["spec"]["pool"]["name"], d["name"]): [t[RULE_KEY] for t in d.get("taints", [])]
            for s in slices for d in s["spec"]["devices"]}


def test_selector_fields_each_match_when_unset() -> None:
    slices = [node("n1"), node("n2"), node("n1", driver="other.example.com")]
    rules = taint_rules([rule("one-device", driver=D, pool="n1", device="gpu-1"), rule("pool", pool="n2"),
                         rule("driver", driver="other.example.com"), rule("every-gpu-0", device="gpu-0"),
                         {"metadata": {"name": "no-selector"}, "spec": {"taint": {"key": "k", "effect": "NoSchedule"}}}])
    assert [r.name for r in rules] == ["driver", "every-gpu-0", "one-device", "pool"]  # no selector: selects nothing
    out = with_taint_rules(slices, rules)
    assert taints(out[:2]) == {("n1", "gpu-0"): ["every-gpu-0"], ("n1", "gpu-1"): ["one-device"],
                               ("n2", "gpu-0"): ["every-gpu-0", "pool"], ("n2", "gpu-1"): ["pool"]}
    assert taints(out[2:]) == {("n1", "gpu-0"): ["driver", "every-gpu-0"], ("n1", "gpu-1"): ["driver"]}
    assert "taints" not in slices[0]["spec"]["devices"][0], "the informer's slices are never changed"


def test_untouched_slices_are_the_same_objects_and_published_taints_come_first() -> None:
    plain, tainted = node("n1"), node("n2")
    tainted["spec"]["devices"][0]["taints"] = [{"key": "xid", "value": "79", "effect": "NoSchedule"}]
    out = with_taint_rules([plain, tainted], taint_rules([rule("r", pool="n2", device="gpu-0")]))
    assert out[0] is plain
    assert [t["key"] for t in out[1]["spec"]["devices"][0]["taints"]] == ["xid", "maintenance"]
    assert out[1]["spec"]["devices"][1] is tainted["spec"]["devices"][1]


def test_a_rules_taint_keeps_the_device_from_claims_that_do_not_tolerate_it_and_is_named() -> None:
    slices = with_taint_rules([node("n1", 1)], taint_rules([rule("gpu-0-maintenance", device="gpu-0")]))
    refused = resolve(claim(), build_inventory(slices), CLASSES)
    assert refused.allocation is None
    text = refused.explanation.render()
    assert "taint maintenance=planned:NoSchedule from DeviceTaintRule gpu-0-maintenance not tolerated" in text
    tolerated = resolve(claim(tolerations=[{"key": "maintenance", "operator": "Exists"}]), build_inventory(slices), CLASSES)
    assert tolerated.allocation is not None
    # Without the rule the same claim is allocated: the refusal is the rule's.
    assert resolve(claim(), build_inventory([node("n1", 1)]), CLASSES).allocation is not None


def test_effects_as_the_scheduler_reads_them() -> None:
    for effect, blocks in (("NoSchedule", True), ("NoExecute", True), ("None", False), ("Sometimes", False)):
        slices = with_taint_rules([node("n1", 1)], taint_rules([rule("r", effect=effect)]))
        assert (resolve(claim(), build_inventory(slices), CLASSES).allocation is None) is blocks, effect
    # A toleration for one effect does not tolerate the other.
    slices = with_taint_rules([node("n1", 1)], taint_rules([rule("r", effect="NoExecute")]))
    only_no_schedule = [{"key": "maintenance", "operator": "Exists", "effect": "NoSchedule"}]
    assert resolve(claim(tolerations=only_no_schedule), build_inventory(slices), CLASSES).allocation is None
