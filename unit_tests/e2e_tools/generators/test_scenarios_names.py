"""The differential's family aimed at the 1.38 scheduler's rules (e2e/generators/scenarios_names.py): every
scenario valid, the same for a seed, and each rule present in enough scenarios, read from the objects."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from e2e.generators.scenarios import DRIVER, Scenario, both_spellings, cel_reads_both_spellings, validate_scenario
from e2e.generators.scenarios_names import FAMILY_SIZE, FIRST_SEED, HUGE_VERSION, RULES, generate, generate_many, rule_of

FAMILY = generate_many(FIRST_SEED, FAMILY_SIZE, nodes=("n0", "n1"), namespace="ns")


def _devices(s: Scenario) -> list[dict[str, Any]]:
    return [d for sl in s.slices for d in sl["spec"].get("devices", [])]


def _bodies(s: Scenario) -> list[dict[str, Any]]:
    return [r["exactly"] for r in s.claim["spec"]["devices"]["requests"]]


def _constraints(s: Scenario) -> list[dict[str, Any]]:
    return list(s.claim["spec"]["devices"].get("constraints", []))


def _is_dual(s: Scenario) -> bool:
    """A device with both spellings of one attribute, holding different values."""
    return any(f"{DRIVER}/{k}" in d["attributes"] and d["attributes"][f"{DRIVER}/{k}"] != v
               for d in _devices(s) for k, v in d["attributes"].items() if "/" not in k)  # fmt: skip


def _capacity_names(s: Scenario) -> set[str]:
    return {k for d in _devices(s) for k in d.get("capacity", {})}


def _asks_both_ways(s: Scenario) -> bool:
    return any({"memory", f"{DRIVER}/memory"} <= set(b.get("capacity", {}).get("requests", {})) for b in _bodies(s))


def _builds_only_differ(s: Scenario) -> bool:
    versions = {d["attributes"]["driverVersion"]["version"] for d in _devices(s)}
    return len({v.partition("+")[0] for v in versions}) < len(versions)


def _incomplete_and_complete(s: Scenario) -> bool:
    counts = Counter(sl["spec"]["pool"]["name"] for sl in s.slices)
    declared = {sl["spec"]["pool"]["name"]: sl["spec"]["pool"]["resourceSliceCount"] for sl in s.slices}
    return any(declared[p] > n for p, n in counts.items()) and any(declared[p] == n for p, n in counts.items())


def _share_on_exclusive(s: Scenario) -> bool:
    exclusive = {(sl["spec"]["pool"]["name"], d["name"]) for sl in s.slices for d in sl["spec"].get("devices", [])
                 if not d.get("allowMultipleAllocations")}  # fmt: skip
    return any(r.get("shareID") and (r["pool"], r["device"]) in exclusive
               for c in s.allocated for r in c["status"]["allocation"]["devices"]["results"])  # fmt: skip


# What each rule of the issue needs, judged from the scenario's objects alone.
RULE_CHECKS = {
    "dual-attribute, read by a class or claim selector": lambda s: _is_dual(s) and bool(cel_reads_both_spellings(s)),
    "dual-attribute, under matchAttribute or distinctAttribute": lambda s: _is_dual(s) and any(
        c.get("matchAttribute", c.get("distinctAttribute")) in {f"{DRIVER}/model", f"{DRIVER}/numaNode"}
        for c in _constraints(s)),
    "capacity published unqualified": lambda s: "memory" in _capacity_names(s) and any(
        b.get("capacity") for b in _bodies(s)),
    "capacity published qualified": lambda s: f"{DRIVER}/memory" in _capacity_names(s) and any(
        b.get("capacity") for b in _bodies(s)),
    "capacity requested one way": lambda s: any(len(b.get("capacity", {}).get("requests", {})) == 1 for b in _bodies(s)),
    "capacity requested both ways at once": _asks_both_ways,
    "build metadata only, under matchAttribute or distinctAttribute": lambda s: _builds_only_differ(s) and any(
        c.get("matchAttribute", c.get("distinctAttribute")) == f"{DRIVER}/driverVersion" for c in _constraints(s)),
    "uncomparable version under matchAttribute": lambda s: any(
        d["attributes"].get("firmwareVersion") == {"version": HUGE_VERSION} for d in _devices(s))
    and any(c.get("matchAttribute") == f"{DRIVER}/firmwareVersion" for c in _constraints(s)),
    "All beside an incomplete pool, another node complete": lambda s: _incomplete_and_complete(s) and any(
        b["allocationMode"] == "All" for b in _bodies(s)),
    "a share left on a device that became exclusive": _share_on_exclusive,
}  # fmt: skip


def test_the_family_is_deterministic_valid_and_large_enough() -> None:
    assert len(FAMILY) >= 200
    again = generate_many(FIRST_SEED, FAMILY_SIZE, nodes=("n0", "n1"), namespace="ns")
    assert [json.dumps(s.__dict__, sort_keys=True) for s in FAMILY] == [json.dumps(s.__dict__, sort_keys=True) for s in again]
    assert {seed: p for s in FAMILY for seed, p in [(s.seed, validate_scenario(s))] if p} == {}


@pytest.mark.parametrize("rule", sorted(RULE_CHECKS))
def test_every_rule_appears_in_at_least_20_scenarios(rule: str) -> None:
    have = [s.seed for s in FAMILY if RULE_CHECKS[rule](s)]
    assert len(have) >= 20, f"{rule}: {len(have)} scenarios"


def test_each_scenario_carries_its_rule_and_the_checks_can_fail() -> None:
    assert Counter(rule_of(s.seed) for s in FAMILY) == dict.fromkeys(RULES, FAMILY_SIZE // len(RULES))
    assert all(f"names:{rule_of(s.seed)}" in s.features for s in FAMILY)
    # The checks read the objects: an ordinary corpus scenario meets none of them.
    from e2e.generators.scenarios import generate as ordinary

    plain = [ordinary(seed) for seed in range(40)]
    assert {rule: sum(check(s) for s in plain) for rule, check in RULE_CHECKS.items()
            if "capacity" not in rule} == dict.fromkeys([r for r in RULE_CHECKS if "capacity" not in r], 0)  # fmt: skip


def test_only_selectors_reading_a_name_published_both_ways_are_chance_on_137() -> None:
    chance = [s for s in FAMILY if cel_reads_both_spellings(s)]
    assert chance and all(any(f.endswith("-cel") for f in s.features) for s in chance)
    constrained = [s for s in FAMILY if any(f.endswith(("/match", "/distinct")) for f in s.features)]
    assert constrained and all(both_spellings(s) and not cel_reads_both_spellings(s) for s in constrained)


def test_both_spellings_are_found_as_attribute_and_as_capacity() -> None:
    s = generate(FIRST_SEED + 1, nodes=("n0",))  # capacity-names: one spelling a device
    assert both_spellings(s) == set()
    dev = s.slices[0]["spec"]["devices"][0]
    dev["capacity"] = {"memory": {"value": "1Gi"}, f"{DRIVER}/memory": {"value": "2Gi"}}
    dev["attributes"][f"{DRIVER}/index"] = {"int": 7}
    assert both_spellings(s) == {"memory", "index"}
    s.classes[0]["spec"]["selectors"].append({"cel": {"expression": f'device.attributes["{DRIVER}"].index > 0'}})
    assert cel_reads_both_spellings(s) == ["index"]
