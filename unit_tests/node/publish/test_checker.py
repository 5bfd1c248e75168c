"""The slice checker, rule by rule: every rule has cases it refuses and neighbours it accepts, so
removing or loosening a rule fails a test here. e2e/suites/test_slice_rules.py holds the same
kind of cases against the real API server."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.node.publish.checker import (
    NOT_AN_API_SERVER_RULE,
    RULES,
    STRICTER_SINCE_1_38,
    Violation,
    check_device,
    partition,
)

DRIVER = "gpu.example.com"


def device(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}},
                            "capacity": {"memory": {"value": "80Gi"}}}
    base.update(fields)
    return base


def attrs(**values: Any) -> dict[str, Any]:
    return device(attributes=values)


def rules(dev: dict[str, Any], per_device: bool = False) -> list[str]:
    return sorted({v.rule for v in check_device(dev, DRIVER, per_device_node_selection=per_device)})


def shared(capacity: dict[str, Any]) -> dict[str, Any]:
    return device(allowMultipleAllocations=True, capacity={"memory": capacity})


def selector(*terms: dict[str, Any]) -> dict[str, Any]:
    return device(nodeSelector={"nodeSelectorTerms": list(terms)})


TERM = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a"]}]}

CASES: list[tuple[str, dict[str, Any], str | None]] = [
    ("valid", device(), None),
    # device name
    ("name 63", device(name="g" * 63), None),
    ("name 64", device(name="g" * 64), "device-name"),
    ("name upper", device(name="GPU-0"), "device-name"),
    ("name dot", device(name="gpu.0"), "device-name"),
    # qualified names
    ("id 32", attrs(**{"a" * 32: {"int": 1}}), None),
    ("id 33", attrs(**{"a" * 33: {"int": 1}}), "qualified-name"),
    ("id digit first", attrs(**{"1a": {"int": 1}}), "qualified-name"),
    ("id dash", attrs(**{"a-b": {"int": 1}}), "qualified-name"),
    ("id underscore", attrs(**{"_a_1": {"int": 1}}), None),
    ("domain ok", attrs(**{"example.com/a": {"int": 1}}), None),
    ("domain 63", attrs(**{"d" * 63 + "/a": {"int": 1}}), None),
    ("domain 64", attrs(**{"d" * 64 + "/a": {"int": 1}}), "qualified-name"),
    ("domain upper", attrs(**{"Example.COM/a": {"int": 1}}), None),
    ("domain underscore", attrs(**{"ex_ample.com/a": {"int": 1}}), "qualified-name"),
    ("empty domain", attrs(**{"/a": {"int": 1}}), "qualified-name"),
    ("empty id", attrs(**{"example.com/": {"int": 1}}), "qualified-name"),
    ("two slashes", attrs(**{"a/b/c": {"int": 1}}), "one-slash"),
    ("two slashes capacity", device(capacity={"example.com/x/memory": {"value": "1"}}), "one-slash"),
    ("capacity id 33", device(capacity={"m" * 33: {"value": "1"}}), "qualified-name"),
    ("own driver attribute", attrs(**{f"{DRIVER}/a": {"int": 1}}), "own-driver-domain"),
    ("own driver capacity", device(capacity={f"{DRIVER}/memory": {"value": "1"}}), "own-driver-domain"),
    ("standard domain", attrs(**{"resource.kubernetes.io/pciBusID": {"string": "0000:01:00.0"}}), None),
    # counts
    ("32 attributes and capacities", device(attributes={f"a{i}": {"int": i} for i in range(31)}), None),
    ("33 attributes and capacities", device(attributes={f"a{i}": {"int": i} for i in range(32)}), "attribute-count"),
    ("48 values", attrs(a={"ints": list(range(40))}, b={"ints": list(range(8))}), None),
    ("49 values", attrs(a={"ints": list(range(40))}, b={"ints": list(range(9))}), "attribute-value-count"),
    # attribute values
    ("no value", attrs(a={}), "attribute-value"),
    ("two values", attrs(a={"int": 1, "bool": True}), "attribute-value"),
    ("unknown type", attrs(a={"float": 1.5}), "attribute-value"),
    ("int is bool", attrs(a={"int": True}), "attribute-value"),
    ("int too big", attrs(a={"int": 2**63}), "attribute-value"),
    ("int64 min", attrs(a={"int": -(2**63)}), None),
    ("bool is string", attrs(a={"bool": "true"}), "attribute-value"),
    ("empty list", attrs(a={"strings": []}), "attribute-value"),
    ("string list", attrs(a={"strings": ["a", "b"]}), None),
    ("string 64 bytes", attrs(a={"string": "x" * 64}), None),
    ("string 65 bytes", attrs(a={"string": "x" * 65}), "string-length"),
    ("string 33 two-byte characters", attrs(a={"string": "é" * 33}), "string-length"),
    ("string 32 two-byte characters", attrs(a={"string": "é" * 32}), None),
    ("string list item 65", attrs(a={"strings": ["x" * 65]}), "string-length"),
    ("empty string", attrs(a={"string": ""}), None),
    # versions
    ("version", attrs(v={"version": "1.2.3"}), None),
    ("version pre and build", attrs(v={"version": "1.2.3-rc.1+build.5"}), None),
    ("version two parts", attrs(v={"version": "1.2"}), "version"),
    ("version four parts", attrs(v={"version": "6.19.14.31400000"}), "version"),
    ("version leading zero", attrs(v={"version": "580.95.05"}), "version"),
    ("version v prefix", attrs(v={"version": "v1.2.3"}), "version"),
    ("version 18 digits", attrs(v={"version": "1.2." + "9" * 18}), None),
    ("version 19 digits", attrs(v={"version": "1.2." + "9" * 19}), "version-18-digits"),
    ("version 19 digits major", attrs(v={"version": "1" + "0" * 18 + ".0.0"}), "version-18-digits"),
    ("pre-release 19 digits", attrs(v={"version": "1.2.3-" + "1" * 19}), "version-18-digits"),
    ("pre-release 19 digits with a letter", attrs(v={"version": "1.2.3-a" + "1" * 19}), None),
    ("build 19 digits", attrs(v={"version": "1.2.3+" + "1" * 19}), None),
    ("version 65 bytes", attrs(v={"version": "1.2.3+" + "b" * 59}), "string-length"),
    ("version list", attrs(v={"versions": ["1.2.3", "1.2"]}), "version"),
    # capacity
    ("capacity not a quantity", device(capacity={"memory": {"value": "lots"}}), "capacity-value"),
    ("capacity milli", device(capacity={"memory": {"value": "500m"}}), None),
    ("policy on an exclusive device", device(capacity={"memory": {"value": "8", "requestPolicy": {"default": "1"}}}),
     "request-policy"),
    ("policy default only", shared({"value": "8", "requestPolicy": {"default": "1"}}), None),
    ("valid values", shared({"value": "8", "requestPolicy": {"default": "2", "validValues": ["1", "2", "4"]}}), None),
    ("valid values no default", shared({"value": "8", "requestPolicy": {"validValues": ["1", "2"]}}), "request-policy"),
    ("valid values unsorted", shared({"value": "8", "requestPolicy": {"default": "2", "validValues": ["2", "1"]}}),
     "request-policy"),
    ("valid value over capacity", shared({"value": "8", "requestPolicy": {"default": "2", "validValues": ["2", "9"]}}),
     "request-policy"),
    ("default not a valid value", shared({"value": "8", "requestPolicy": {"default": "3", "validValues": ["2", "4"]}}),
     "request-policy"),
    ("duplicate valid values", shared({"value": "8", "requestPolicy": {"default": "2", "validValues": ["2", "2"]}}),
     "request-policy"),
    ("eleven valid values",
     shared({"value": "80", "requestPolicy": {"default": "1", "validValues": [str(i) for i in range(1, 12)]}}),
     "request-policy"),
    ("values and range", shared({"value": "8", "requestPolicy": {"default": "2", "validValues": ["2"],
                                                                 "validRange": {"min": "1"}}}), "request-policy"),
    ("range", shared({"value": "8", "requestPolicy": {"default": "2", "validRange": {"min": "1", "max": "8", "step": "1"}}}),
     None),
    ("range no min", shared({"value": "8", "requestPolicy": {"default": "2", "validRange": {"max": "8"}}}),
     "request-policy"),
    ("range no default", shared({"value": "8", "requestPolicy": {"validRange": {"min": "1"}}}), "request-policy"),
    ("range min over capacity", shared({"value": "8", "requestPolicy": {"default": "9", "validRange": {"min": "9"}}}),
     "request-policy"),
    ("range default under min", shared({"value": "8", "requestPolicy": {"default": "1", "validRange": {"min": "2"}}}),
     "request-policy"),
    ("range max over capacity", shared({"value": "8", "requestPolicy": {"default": "2",
                                                                          "validRange": {"min": "1", "max": "9"}}}),
     "request-policy"),
    ("range step zero", shared({"value": "8", "requestPolicy": {"default": "2", "validRange": {"min": "1", "step": "0"}}}),
     "request-policy"),
    ("range off step", shared({"value": "8", "requestPolicy": {"default": "2", "validRange": {"min": "1", "step": "2"}}}),
     "request-policy"),
    ("range one step past capacity", shared({"value": "8", "requestPolicy": {"default": "1",
                                                                               "validRange": {"min": "1", "step": "8"}}}),
     "request-policy"),
    ("fractional range", shared({"value": "8", "requestPolicy": {"default": "1500m",
                                                                  "validRange": {"min": "500m", "step": "500m"}}}), None),
    ("fractional off step", shared({"value": "8", "requestPolicy": {"default": "1200m",
                                                                     "validRange": {"min": "500m", "step": "500m"}}}),
     "fractional-request-policy"),
    ("below milli", shared({"value": "8", "requestPolicy": {"default": "1",
                                                             "validRange": {"min": "0.0005", "step": "1"}}}),
     "fractional-request-policy"),
    # counters
    ("consumption", device(consumesCounters=[{"counterSet": "gpu-0-counter-set", "counters": {"memory": {"value": "1"}}}]),
     None),
    ("three consumptions", device(consumesCounters=[
        {"counterSet": f"s{i}", "counters": {"c": {"value": "1"}}} for i in range(3)]), "counter-consumption"),
    ("duplicate counter set", device(consumesCounters=[
        {"counterSet": "s", "counters": {"c": {"value": "1"}}}] * 2), "counter-consumption"),
    ("counter set not a label", device(consumesCounters=[{"counterSet": "S_1", "counters": {"c": {"value": "1"}}}]),
     "counter-consumption"),
    ("no counters", device(consumesCounters=[{"counterSet": "s", "counters": {}}]), "counter-consumption"),
    ("33 counters", device(consumesCounters=[{"counterSet": "s", "counters": {f"c{i}": {"value": "1"}
                                                                            for i in range(33)}}]),
     "counter-consumption"),
    ("32 counters", device(consumesCounters=[{"counterSet": "s", "counters": {f"c{i}": {"value": "1"}
                                                                            for i in range(32)}}]), None),
    ("counter name not a label", device(consumesCounters=[{"counterSet": "s", "counters": {"Mem": {"value": "1"}}}]),
     "counter-consumption"),
    ("counter not a quantity", device(consumesCounters=[{"counterSet": "s", "counters": {"c": {"value": "x"}}}]),
     "counter-consumption"),
    # taints
    ("taint", device(taints=[{"key": "gpu.example.com/unhealthy", "value": "xid-79", "effect": "NoSchedule"}]), None),
    ("taint effect None", device(taints=[{"key": "k", "effect": "None"}]), None),
    ("taint bad effect", device(taints=[{"key": "k", "effect": "PreferNoSchedule"}]), "taint"),
    ("taint bad key", device(taints=[{"key": "a/b/c", "effect": "NoSchedule"}]), "taint"),
    ("taint bad value", device(taints=[{"key": "k", "value": "a b", "effect": "NoSchedule"}]), "taint"),
    ("17 taints", device(taints=[{"key": f"k{i}", "effect": "NoSchedule"} for i in range(17)]), "taint"),
    # binding conditions
    ("binding conditions", device(bindingConditions=["ready"], bindingFailureConditions=["failed"]), None),
    ("binding without failure", device(bindingConditions=["ready"]), "binding-conditions"),
    ("binding overlap", device(bindingConditions=["ready"], bindingFailureConditions=["ready"]), "binding-conditions"),
    ("binding duplicate", device(bindingConditions=["a", "a"], bindingFailureConditions=["f"]), "binding-conditions"),
    ("five binding conditions", device(bindingConditions=list("abcde"), bindingFailureConditions=["f"]),
     "binding-conditions"),
    ("binding bad name", device(bindingConditions=["a b"], bindingFailureConditions=["f"]), "binding-conditions"),
    # node selection in a slice with nodeName
    ("device nodeName without per-device selection", device(nodeName="node-a"), "node-selection"),
]

PER_DEVICE_CASES: list[tuple[str, dict[str, Any], str | None]] = [
    ("nodeName", device(nodeName="node-a"), None),
    ("allNodes", device(allNodes=True), None),
    ("allNodes false", device(allNodes=False), "node-selection"),
    ("none", device(), "node-selection"),
    ("two", device(nodeName="node-a", allNodes=True), "node-selection"),
    ("bad nodeName", device(nodeName="Node_A"), "node-selection"),
    ("one term", selector(TERM), None),
    ("two terms", selector(TERM, TERM), "one-term"),
    ("no terms", selector(), "node-selection"),
    ("bad operator", selector({"matchExpressions": [{"key": "k", "operator": "Is", "values": ["v"]}]}), "node-selection"),
    ("In without values", selector({"matchExpressions": [{"key": "k", "operator": "In"}]}), "node-selection"),
    ("Exists with values", selector({"matchExpressions": [{"key": "k", "operator": "Exists", "values": ["v"]}]}),
     "node-selection"),
    ("Gt two values", selector({"matchExpressions": [{"key": "k", "operator": "Gt", "values": ["1", "2"]}]}),
     "node-selection"),
    ("bad key", selector({"matchExpressions": [{"key": "a b", "operator": "Exists"}]}), "node-selection"),
    ("bad value", selector({"matchExpressions": [{"key": "k", "operator": "In", "values": ["a b"]}]}), "node-selection"),
    ("field", selector({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}), None),
    ("bad field", selector({"matchFields": [{"key": "metadata.uid", "operator": "In", "values": ["x"]}]}),
     "node-selection"),
]


@pytest.mark.parametrize(("case", "dev", "rule"), CASES, ids=[c[0] for c in CASES])
def test_rule(case: str, dev: dict[str, Any], rule: str | None) -> None:
    assert rules(dev) == ([rule] if rule else [])


@pytest.mark.parametrize(("case", "dev", "rule"), PER_DEVICE_CASES, ids=[c[0] for c in PER_DEVICE_CASES])
def test_per_device_node_selection(case: str, dev: dict[str, Any], rule: str | None) -> None:
    assert rules(dev, per_device=True) == ([rule] if rule else [])


def test_every_rule_has_a_refused_case() -> None:
    covered = {rule for _, _, rule in CASES + PER_DEVICE_CASES if rule}
    assert covered == set(RULES) - {"malformed", "api-server-refused"}
    assert covered >= STRICTER_SINCE_1_38 | NOT_AN_API_SERVER_RULE


def test_malformed_devices_are_refused_not_raised() -> None:
    assert rules(device(attributes=["x"])) == ["malformed"]
    assert rules(attrs(a="x")) == ["malformed"]
    assert rules(device(capacity={"memory": "80Gi"})) == ["malformed"]
    assert [v.rule for v in check_device("gpu-0", DRIVER)] == ["malformed"]


def test_a_violation_names_the_device_the_field_and_the_rule() -> None:
    [v] = check_device(attrs(v={"version": "1.2.3.4"}), DRIVER)
    assert v == Violation("gpu-0", "version", "attributes[v].version", "'1.2.3.4' is not a semver.org 2.0.0 version")
    assert v.describe() == ("device gpu-0: attributes[v].version: '1.2.3.4' is not a semver.org 2.0.0 version "
                            "(rule version)")


def test_partition_keeps_order_and_withholds_the_bad_and_the_refused() -> None:
    good = [device(name=f"gpu-{i}") for i in range(4)]
    bad = device(name="gpu-9", attributes={"a/b/c": {"int": 1}})
    refused = {"gpu-2": [Violation("gpu-2", "api-server-refused", "", "no")]}
    split = partition([good[0], bad, good[1], good[2], good[3]], DRIVER, refused)
    assert [d["name"] for d in split.publish] == ["gpu-0", "gpu-1", "gpu-3"]
    assert list(split.withheld) == ["gpu-9", "gpu-2"]
    assert [v.rule for v in split.withheld["gpu-9"]] == ["one-slash"]
    assert split.withheld["gpu-2"] == refused["gpu-2"]
