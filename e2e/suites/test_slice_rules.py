"""The slice checker (``dra_driver/node/publish/checker.py``) against the API server's own verdicts:
each case is one device in a ResourceSlice sent as a server-side dry run (``create --dry-run=server``),
and the API server must answer what the checker answers.

The bed runs Kubernetes 1.37 (not part of the 1.36 smoke run: the cases are written against 1.37 and
1.38, not checked against 1.36). Where 1.38 is stricter (:data:`STRICTER_SINCE_1_38`: one ``/`` in a
name, one term in a per-device node selector, 18 digits in a version, fractional request policies
checked in milli units) the checker follows 1.38, so
those cases are asserted as "1.37 accepts, the checker refuses as 1.38 will"; the cases marked
``ONLY_1_38`` below are those. ``own-driver-domain`` is the Go helper's rule, which no API server
enforces: "the API server accepts, the checker refuses". When a 1.38 API server can run on the bed,
the same cases must agree outright (test_slice_rules_agree_with_a_1_38_api_server).

List-valued attributes (``strings``, ``ints``…; the alpha gate DRAListTypeAttributes, off on the
bed) are left out: the API server drops those fields before validating. They are covered by the unit
tests.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
import yaml

from dra_driver.apiprofile import NVIDIA_DRIVER_NAME, NVIDIA_PROFILE
from dra_driver.node.describe.shares import parse_consumable_shares
from dra_driver.node.discovery.profiles import load_profile
from dra_driver.node.publish.checker import NOT_AN_API_SERVER_RULE, STRICTER_SINCE_1_38, check_device
from e2e.generators.fleet import published_slices
from e2e.testbed.clusterview import Bed

DRIVER = "gpu.example.com"
TERM = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a"]}]}


def dev(**fields: Any) -> dict[str, Any]:
    device: dict[str, Any] = {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}},
                              "capacity": {"memory": {"value": "80Gi"}}}
    device.update(fields)
    return device


def attr(name: str, value: dict[str, Any]) -> dict[str, Any]:
    return dev(attributes={name: value})


def shared(policy: dict[str, Any]) -> dict[str, Any]:
    return dev(allowMultipleAllocations=True, capacity={"memory": {"value": "8", "requestPolicy": policy}})


def consumes(*entries: dict[str, Any]) -> dict[str, Any]:
    return dev(consumesCounters=list(entries))


# (case, device, per-device node selection). Every rule of the checker has refused and accepted
# neighbours here.
CASES: list[tuple[str, dict[str, Any], bool]] = [
    ("valid", dev(), False),
    ("name 63", dev(name="g" * 63), False),
    ("name 64", dev(name="g" * 64), False),
    ("name upper case", dev(name="Gpu-0"), False),
    ("id 32", attr("a" * 32, {"int": 1}), False),
    ("id 33", attr("a" * 33, {"int": 1}), False),
    ("id starts with a digit", attr("1a", {"int": 1}), False),
    ("id with a dash", attr("a-b", {"int": 1}), False),
    ("domain", attr("example.com/a", {"int": 1}), False),
    ("domain 64", attr("d" * 64 + "/a", {"int": 1}), False),
    ("domain upper case", attr("Example.COM/a", {"int": 1}), False),
    ("domain underscore", attr("ex_ample.com/a", {"int": 1}), False),
    ("empty domain", attr("/a", {"int": 1}), False),
    ("empty id", attr("example.com/", {"int": 1}), False),
    ("two slashes", attr("example.com/a/b", {"int": 1}), False),  # ONLY_1_38
    ("two slashes in a capacity", dev(capacity={"example.com/x/memory": {"value": "1"}}), False),  # ONLY_1_38
    ("capacity id 33", dev(capacity={"m" * 33: {"value": "1"}}), False),
    ("own driver's domain", attr(f"{DRIVER}/a", {"int": 1}), False),  # the helper's rule
    ("32 attributes and capacities", dev(attributes={f"a{i}": {"int": i} for i in range(31)}), False),
    ("33 attributes and capacities", dev(attributes={f"a{i}": {"int": i} for i in range(32)}), False),
    ("no value", attr("a", {}), False),
    ("two values", attr("a", {"int": 1, "bool": True}), False),
    ("string 64 bytes", attr("a", {"string": "x" * 64}), False),
    ("string 65 bytes", attr("a", {"string": "x" * 65}), False),
    ("string 32 two-byte characters", attr("a", {"string": "é" * 32}), False),
    ("string 33 two-byte characters", attr("a", {"string": "é" * 33}), False),
    ("version", attr("v", {"version": "1.2.3-rc.1+build.5"}), False),
    ("version two parts", attr("v", {"version": "1.2"}), False),
    ("version four parts", attr("v", {"version": "6.19.14.31400000"}), False),
    ("version leading zero", attr("v", {"version": "580.95.05"}), False),
    ("version 18 digits", attr("v", {"version": "1.2." + "9" * 18}), False),
    ("version 19 digits", attr("v", {"version": "1.2." + "9" * 19}), False),  # ONLY_1_38
    ("pre-release 19 digits", attr("v", {"version": "1.2.3-" + "1" * 19}), False),  # ONLY_1_38
    ("pre-release 19 digits and a letter", attr("v", {"version": "1.2.3-a" + "1" * 19}), False),
    ("build 19 digits", attr("v", {"version": "1.2.3+" + "1" * 19}), False),
    ("version 65 bytes", attr("v", {"version": "1.2.3+" + "b" * 59}), False),
    ("capacity milli", dev(capacity={"memory": {"value": "500m"}}), False),
    ("policy on an exclusive device", dev(capacity={"memory": {"value": "8", "requestPolicy": {"default": "1"}}}),
     False),
    ("policy default", shared({"default": "1"}), False),
    ("valid values", shared({"default": "2", "validValues": ["1", "2", "4"]}), False),
    ("valid values unsorted", shared({"default": "2", "validValues": ["2", "1"]}), False),
    ("valid value over capacity", shared({"default": "2", "validValues": ["2", "9"]}), False),
    ("default not a valid value", shared({"default": "3", "validValues": ["2", "4"]}), False),
    ("duplicate valid values", shared({"default": "2", "validValues": ["2", "2"]}), False),
    ("valid values without default", shared({"validValues": ["1", "2"]}), False),
    ("range", shared({"default": "2", "validRange": {"min": "1", "max": "8", "step": "1"}}), False),
    ("range without min", shared({"default": "2", "validRange": {"max": "8"}}), False),
    ("range max over capacity", shared({"default": "2", "validRange": {"min": "1", "max": "9"}}), False),
    ("range default under min", shared({"default": "1", "validRange": {"min": "2"}}), False),
    ("range off step", shared({"default": "2", "validRange": {"min": "1", "step": "2"}}), False),
    ("range one step past capacity", shared({"default": "1", "validRange": {"min": "1", "step": "8"}}), False),
    ("fractional range", shared({"default": "1500m", "validRange": {"min": "500m", "step": "500m"}}), False),
    ("fractional off step", shared({"default": "1200m", "validRange": {"min": "500m", "step": "500m"}}),
     False),  # ONLY_1_38
    ("integer off step", shared({"default": "3", "validRange": {"min": "2", "step": "2"}}), False),
    ("consumption", consumes({"counterSet": "gpu-0-counter-set", "counters": {"memory": {"value": "1"}}}), False),
    ("three consumptions", consumes(*[{"counterSet": f"s{i}", "counters": {"c": {"value": "1"}}} for i in range(3)]),
     False),
    ("duplicate counter set", consumes(*[{"counterSet": "s", "counters": {"c": {"value": "1"}}}] * 2), False),
    ("counter set not a label", consumes({"counterSet": "s_1", "counters": {"c": {"value": "1"}}}), False),
    ("counter name not a label", consumes({"counterSet": "s", "counters": {"Mem": {"value": "1"}}}), False),
    ("32 counters", consumes({"counterSet": "s", "counters": {f"c{i}": {"value": "1"} for i in range(32)}}), False),
    ("33 counters", consumes({"counterSet": "s", "counters": {f"c{i}": {"value": "1"} for i in range(33)}}), False),
    ("taint", dev(taints=[{"key": "example.com/unhealthy", "value": "xid-79", "effect": "NoSchedule"}]), False),
    ("taint effect None", dev(taints=[{"key": "k", "effect": "None"}]), False),
    ("taint bad effect", dev(taints=[{"key": "k", "effect": "PreferNoSchedule"}]), False),
    ("taint bad key", dev(taints=[{"key": "a/b/c", "effect": "NoSchedule"}]), False),
    ("taint bad value", dev(taints=[{"key": "k", "value": "a b", "effect": "NoSchedule"}]), False),
    ("17 taints", dev(taints=[{"key": f"k{i}", "effect": "NoSchedule"} for i in range(17)]), False),
    ("binding conditions", dev(bindingConditions=["ready"], bindingFailureConditions=["failed"]), False),
    ("binding without failure", dev(bindingConditions=["ready"]), False),
    ("binding overlap", dev(bindingConditions=["ready"], bindingFailureConditions=["ready"]), False),
    ("five binding conditions", dev(bindingConditions=list("abcde"), bindingFailureConditions=["f"]), False),
    ("device nodeName in a nodeName slice", dev(nodeName="node-a"), False),
    ("per-device nodeName", dev(nodeName="node-a"), True),
    ("per-device allNodes", dev(allNodes=True), True),
    ("per-device nothing", dev(), True),
    ("per-device two", dev(nodeName="node-a", allNodes=True), True),
    ("per-device one term", dev(nodeSelector={"nodeSelectorTerms": [TERM]}), True),
    ("per-device two terms", dev(nodeSelector={"nodeSelectorTerms": [TERM, TERM]}), True),  # ONLY_1_38
    ("per-device no terms", dev(nodeSelector={"nodeSelectorTerms": []}), True),
    ("per-device bad operator", dev(nodeSelector={"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "k", "operator": "Is", "values": ["v"]}]}]}), True),
    ("per-device Exists with values", dev(nodeSelector={"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "k", "operator": "Exists", "values": ["v"]}]}]}), True),
    ("per-device bad field", dev(nodeSelector={"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.uid", "operator": "In", "values": ["x"]}]}]}), True),
]

ONLY_1_38 = {"two slashes", "two slashes in a capacity", "version 19 digits", "pre-release 19 digits",
             "per-device two terms", "fractional off step"}
"""Cases the 1.37 API server accepts and 1.38 refuses (rules in STRICTER_SINCE_1_38)."""


def slice_of(i: int, device: dict[str, Any], per_device: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {"driver": DRIVER, "pool": {"name": "rules-check", "generation": 1, "resourceSliceCount": 1},
                            "devices": [device]}
    if per_device:
        spec["perDeviceNodeSelection"] = True
    else:
        spec["nodeName"] = "rules-check-node"
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": f"rules-check-{i}"},
            "spec": spec}


def accepted_by_the_api_server(bed: Bed) -> set[int]:
    docs = [slice_of(i, device, per_device) for i, (_, device, per_device) in enumerate(CASES)]
    proc = subprocess.run(
        [bed.kubectl_bin, "--kubeconfig", str(bed.kubeconfig), "create", "--dry-run=server", "-o", "name", "-f", "-"],
        input=yaml.safe_dump_all(docs, allow_unicode=True), capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0 or "invalid" in proc.stderr.lower(), proc.stderr[-2000:]
    names = {line.strip() for line in proc.stdout.splitlines()}
    return {i for i in range(len(CASES)) if f"resourceslice.resource.k8s.io/rules-check-{i}" in names}


def checker_rules(device: dict[str, Any], per_device: bool) -> set[str]:
    return {v.rule for v in check_device(device, DRIVER, per_device_node_selection=per_device)}


def helper_only(rules: set[str]) -> bool:
    """Refused by rules no API server enforces, and by nothing else."""
    return bool(rules) and rules <= NOT_AN_API_SERVER_RULE


def test_slice_rules_agree_with_the_api_server(bed: Bed) -> None:
    accepted = accepted_by_the_api_server(bed)
    disagreements = []
    for i, (case, device, per_device) in enumerate(CASES):
        rules = checker_rules(device, per_device)
        server = i in accepted
        if case in ONLY_1_38:
            # 1.37 accepts; the checker refuses as 1.38 will, by a rule 1.37 lacks, and by that alone.
            if not (server and rules and rules <= STRICTER_SINCE_1_38):
                disagreements.append(f"{case} (1.38-only): API server accepts {server}, checker {sorted(rules)}")
        elif helper_only(rules):
            if not server:
                disagreements.append(f"{case} (helper rule): the API server refuses it too")
        elif (not rules) != server:
            disagreements.append(f"{case}: API server {'accepts' if server else 'refuses'}, checker {sorted(rules)}")
    assert not disagreements, "\n".join(disagreements)
    # Both verdicts occur, so the comparison cannot pass by everything being refused or accepted.
    assert 10 < len(accepted) < len(CASES) - 10
    stricter = {rule for case, device, per_device in CASES if case in ONLY_1_38
                for rule in checker_rules(device, per_device)}
    assert stricter == STRICTER_SINCE_1_38


def server_minor(bed: Bed) -> int:
    proc = subprocess.run([bed.kubectl_bin, "--kubeconfig", str(bed.kubeconfig), "version", "-o", "json"],
                          capture_output=True, text=True, check=True, timeout=60)
    return int(json.loads(proc.stdout)["serverVersion"]["minor"].rstrip("+"))


@pytest.mark.next
def test_slice_rules_agree_with_a_1_38_api_server(bed: Bed) -> None:
    """On 1.38 the 1.38-only cases are refused by the API server too: every case agrees outright
    (the helper's own-driver rule aside). Runs once the bed's API server is 1.38 or newer."""
    if server_minor(bed) < 38:
        pytest.skip("the bed's API server is older than 1.38 (the registry does not build the 1.38 apiserver yet)")
    accepted = accepted_by_the_api_server(bed)
    disagreements = [case for i, (case, device, per_device) in enumerate(CASES)
                     if not helper_only(checker_rules(device, per_device))
                     and (not checker_rules(device, per_device)) != (i in accepted)]
    assert not disagreements, disagreements


def nvidia_profile_slices() -> list[dict[str, Any]]:
    """What the plugin publishes under ``--api-profile nvidia`` (the plugin's own discovery and
    description of simulated nodes): static MIG with 4 shares each, dynamic MIG (the counter sets),
    and a device with each of NVIDIA's health taints."""
    bodies = []
    for node, profile, dynamic, shares in (("nv-static", "a100-mig", False, "4"), ("nv-dynamic", "h100-8x", True, "disabled"),
                                           ("nv-memory", "mixed-l4-t4", False, "memory")):
        bodies += published_slices(load_profile(profile), node, driver=NVIDIA_DRIVER_NAME, dynamic_mig=dynamic,
                                   api_profile=NVIDIA_PROFILE, shares=parse_consumable_shares(shares))
    devices = next(b for b in bodies if b["spec"]["nodeName"] == "nv-memory")["spec"]["devices"]
    keys = NVIDIA_PROFILE.taints
    for device, taint in zip(devices, ({"key": keys.xid, "value": "79", "effect": "NoSchedule"},
                                       {"key": keys.gpu_lost, "effect": "NoSchedule"},
                                       {"key": keys.unmonitored, "effect": "None"}), strict=False):
        device["taints"] = [taint]
    return bodies


def test_the_nvidia_profiles_slices_are_accepted_by_the_api_server(bed: Bed) -> None:
    """NVIDIA's names, attributes, capacities, counter sets, shares and taints, as the plugin writes
    them, pass the API server's own validation (a server-side dry run of every slice)."""
    bodies = nvidia_profile_slices()
    for body in bodies:
        for device in body["spec"].get("devices", []):
            assert check_device(device, NVIDIA_DRIVER_NAME) == [], device["name"]
    proc = subprocess.run(
        [bed.kubectl_bin, "--kubeconfig", str(bed.kubeconfig), "create", "--dry-run=server", "-o", "name", "-f", "-"],
        input=yaml.safe_dump_all(bodies), capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(proc.stdout.splitlines()) == len(bodies) > 3
    assert any(b["spec"].get("sharedCounters") for b in bodies)


def test_every_checker_rule_is_sent_to_the_api_server() -> None:
    refused = {rule for _, device, per_device in CASES for rule in checker_rules(device, per_device)}
    assert refused >= {"device-name", "attribute-count", "qualified-name", "one-slash", "own-driver-domain",
                       "attribute-value", "string-length", "version", "version-18-digits", "request-policy",
                       "fractional-request-policy",
                       "counter-consumption", "taint", "binding-conditions", "node-selection", "one-term"}
