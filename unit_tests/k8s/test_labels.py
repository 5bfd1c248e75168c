"""Label selectors in kubectl's text form (the controller's --allocation-namespace-selector)."""

from __future__ import annotations

import pytest

from dra_driver.k8s.labels import parse_selector


@pytest.mark.parametrize(("text", "labels", "matches"), [
    ("gpu.dra-driver.io/controller-allocation=enabled", {"gpu.dra-driver.io/controller-allocation": "enabled"}, True),
    ("gpu.dra-driver.io/controller-allocation=enabled", {"gpu.dra-driver.io/controller-allocation": "no"}, False),
    ("gpu.dra-driver.io/controller-allocation==enabled", {}, False),
    ("team!=web", {}, True),
    ("team!=web", {"team": "web"}, False),
    ("team in (ml, vision),tier", {"team": "vision", "tier": "x"}, True),
    ("team in (ml, vision),tier", {"team": "vision"}, False),
    ("team notin (web)", {"team": "ml"}, True),
    ("team notin (web)", {"team": "web"}, False),
    ("!legacy", {"legacy": ""}, False),
    ("!legacy", {}, True),
    ("kubernetes.io/metadata.name", {"kubernetes.io/metadata.name": "ns"}, True),
    ("", {"anything": "x"}, True),
])
def test_requirements_all_hold(text: str, labels: dict[str, str], matches: bool) -> None:
    assert parse_selector(text).matches(labels) is matches


@pytest.mark.parametrize(("text", "named"), [
    ("team in ml", "'team in ml'"),
    ("team=a b", "'team=a b'"),
    ("-bad=x", "'-bad'"),
    ("team=" + "v" * 64, "is not a valid label value"),
    ("a=b,,c", "''"),
])
def test_a_bad_selector_names_the_requirement(text: str, named: str) -> None:
    with pytest.raises(ValueError, match="label selector") as err:
        parse_selector(text)
    assert named in str(err.value)
