"""Strategies and helpers shared by the fuzz tests."""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st


def examples(fraction: float) -> int:
    """A share of the active profile's example count (at least 5), for costly tests."""
    return max(5, int(settings.default.max_examples * fraction))


# Text that likes the characters parsers and path builders trip over.
NASTY = st.sampled_from(["", "/", "..", "../..", "\x00", "a/../b", "gpu-0", "..\x00/", " ", "\n", "é", "💥",
                         "${HOME}", "%s", "\\", "-", "0", "-1", "1e309", "null", "true"])
TEXT = st.one_of(NASTY, st.text(max_size=40))

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=-(2**80), max_value=2**80),
                    st.floats(allow_nan=True, allow_infinity=True), TEXT)


def json_values(max_leaves: int = 30) -> st.SearchStrategy[Any]:
    """Arbitrary JSON-like values (what a YAML or JSON decoder can hand us)."""
    return st.recursive(
        SCALARS,
        lambda children: st.one_of(st.lists(children, max_size=5),
                                   st.dictionaries(TEXT, children, max_size=5)),
        max_leaves=max_leaves,
    )


def mutate(base: Any, data: st.DataObject, depth: int = 0) -> Any:
    """A copy of ``base`` with one random change somewhere: a replaced, removed or added member."""
    if isinstance(base, dict) and base and depth < 8:
        keys = sorted(base, key=str)
        key = data.draw(st.sampled_from(keys))
        action = data.draw(st.sampled_from(["descend", "replace", "delete", "add"]))
        out = dict(base)
        if action == "descend":
            out[key] = mutate(base[key], data, depth + 1)
        elif action == "replace":
            out[key] = data.draw(json_values(10))
        elif action == "delete":
            del out[key]
        else:
            out[data.draw(TEXT)] = data.draw(json_values(5))
        return out
    if isinstance(base, list) and base and depth < 8:
        i = data.draw(st.integers(0, len(base) - 1))
        action = data.draw(st.sampled_from(["descend", "replace", "delete", "duplicate"]))
        out_list = list(base)
        if action == "descend":
            out_list[i] = mutate(base[i], data, depth + 1)
        elif action == "replace":
            out_list[i] = data.draw(json_values(10))
        elif action == "delete":
            del out_list[i]
        else:
            out_list.append(base[i])
        return out_list
    return data.draw(json_values(10))
