"""The differential's corpus (e2e/generators/scenarios.py) with DeviceTaintRules (issue 50): only when
the bed serves them, each selecting the scenario's own pools, valid objects, and the rest of each
scenario the same as without the feature."""

from __future__ import annotations

from e2e.generators.scenarios import DEFAULT_FEATURES, DRIVER, generate, validate_scenario

WITH_RULES = DEFAULT_FEATURES | {"taint-rules", "taint-none"}


def test_taint_rules_only_when_asked_and_the_rest_unchanged() -> None:
    seeds = range(120)
    plain = [generate(s, features=DEFAULT_FEATURES | {"taint-none"}) for s in seeds]
    ruled = [generate(s, features=WITH_RULES) for s in seeds]
    assert not any(p.taint_rules for p in plain)
    with_rules = [r for r in ruled if r.taint_rules]
    assert 25 <= len(with_rules) <= 60, len(with_rules)
    for p, r in zip(plain, ruled, strict=True):
        assert (p.slices, p.classes, p.claim) == (r.slices, r.classes, r.claim)
        assert ("taint-rules" in r.features) == bool(r.taint_rules)


def test_rules_select_the_scenarios_own_pools_and_are_valid() -> None:
    effects, whole_pools = set(), 0
    for seed in range(120):
        s = generate(seed, features=WITH_RULES)
        pools = {sl["spec"]["pool"]["name"] for sl in s.slices}
        devices = {(sl["spec"]["pool"]["name"], d["name"]) for sl in s.slices for d in sl["spec"].get("devices", [])}
        assert not validate_scenario(s)
        for rule in s.taint_rules:
            sel = rule["spec"]["deviceSelector"]
            assert sel["driver"] == DRIVER and sel["pool"] in pools
            assert "device" not in sel or (sel["pool"], sel["device"]) in devices
            whole_pools += "device" not in sel
            effects.add(rule["spec"]["taint"]["effect"])
            assert rule["metadata"]["name"].startswith(f"s{seed}-")
    assert effects == {"NoSchedule", "NoExecute", "None"} and whole_pools
