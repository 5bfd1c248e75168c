"""Fuzzing simulated profile files: any YAML-ish document gives a profile or a ValueError with a field path."""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

import yaml
from fuzzing import examples, json_values, mutate
from hypothesis import given, settings
from hypothesis import strategies as st

from dra_driver.node.discovery.profiles import NodeProfile, builtin_profiles, parse_profile
from dra_driver.node.discovery.profiles import load_profile as load
from dra_driver.node.discovery.simulated import SimulatedBackend

BUILTIN = {name: yaml.safe_load(resources.files("dra_driver").joinpath("profiles", f"{name}.yaml").read_text())
           for name in builtin_profiles()}
# "<root>: ...", "gpus[3].mig.instances[0].profile: ...", "models.h100.memoryMiB: ...", "models.'': ...";
# odd keys are quoted (Python repr) and may then hold any character.
_QUOTED = r"'(?:[^'\\]|\\.)*'" + "|" + r'"(?:[^"\\]|\\.)*"'
_SEGMENT = rf"(?:{_QUOTED}|[^\s:.'\"\[][^:.\[]*)(?:\[\d+\])*"
FIELD_PATH = re.compile(rf"^(<root>|{_SEGMENT}(?:\.{_SEGMENT})*): ")


def check(document: Any) -> None:
    try:
        profile = parse_profile(document)
    except ValueError as exc:
        message = str(exc)
        assert FIELD_PATH.match(message), f"no field path in {message!r}"
        assert "Traceback" not in message
        return
    assert isinstance(profile, NodeProfile)
    # What parses must also run: discovery of the simulated node works for any accepted profile.
    gpus = SimulatedBackend(profile, "fuzz-node").discover()
    assert len(gpus) == len(profile.gpus)


@given(json_values())
def test_arbitrary_documents(document: Any) -> None:
    check(document)


@settings(max_examples=examples(2.0))
@given(st.data())
def test_mutated_builtin_profiles(data: st.DataObject) -> None:
    base = BUILTIN[data.draw(st.sampled_from(sorted(BUILTIN)))]
    document = base
    for _ in range(data.draw(st.integers(1, 3))):
        document = mutate(document, data)
    check(document)


def test_builtin_profiles_still_parse() -> None:
    for name in BUILTIN:
        assert load(name).gpus


def test_field_path_pattern() -> None:
    for good in ("<root>: x", "gpus[3].mig.instances[0].profile: x", "'': x", "models.':'.productName: x",
                 "models.\"'\".brand: x", "1: x"):
        assert FIELD_PATH.match(good), good
    for bad in (": x", "unknown field (allowed: a): x"[:0] + " : x"):
        assert not FIELD_PATH.match(bad), bad


def test_regression_empty_unknown_key_is_named() -> None:
    # Found by test_arbitrary_documents: {"": null} said ": unknown field (...)", naming nothing.
    document = {**BUILTIN["h100-8x"], "": None}
    try:
        parse_profile(document)
    except ValueError as exc:
        assert str(exc).startswith("'': unknown field"), str(exc)
    else:
        raise AssertionError("accepted an empty key")
    # Found by the long profile: keys ":" and ".." read as path syntax ("..: unknown field").
    for key in (":", "..", "a.b"):
        try:
            parse_profile({**BUILTIN["h100-8x"], key: None})
        except ValueError as exc:
            assert str(exc).startswith(f"{key!r}: unknown field"), str(exc)
    models = dict(BUILTIN["h100-8x"]["models"])
    models[""] = {}
    try:
        parse_profile({**BUILTIN["h100-8x"], "models": models})
    except ValueError as exc:
        assert str(exc).startswith("models.''."), str(exc)
    else:
        raise AssertionError("accepted an empty model")
