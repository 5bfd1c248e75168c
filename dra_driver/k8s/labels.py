"""Label selectors in kubectl's text form (``team in (a,b),tier!=batch,!legacy``), parsed and matched
as the API server's ``labels.Parse`` does: the requirements of a selector all hold, an empty
selector selects everything."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from dra_driver.k8s.names import is_label_name, is_label_value

_SET = re.compile(r"^\s*(\S+?)\s+(in|notin)\s+\(([^()]*)\)\s*$")
_COMPARE = re.compile(r"^\s*([^\s!=<>]+)\s*(==|!=|=)\s*(\S*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)\s*([^\s!=<>(),]+)\s*$")


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str
    """``in``, ``notin``, ``exists`` or ``!``."""
    values: frozenset[str] = frozenset()

    def holds(self, labels: Mapping[str, str]) -> bool:
        have = labels.get(self.key)
        if self.operator == "in":
            return have is not None and have in self.values
        if self.operator == "notin":
            return have is None or have not in self.values
        if self.operator == "exists":
            return have is not None
        return have is None


@dataclass(frozen=True)
class LabelSelector:
    text: str
    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.holds(labels) for r in self.requirements)


def _split(text: str) -> list[str]:
    """The selector's requirements: commas inside ``( )`` belong to a set."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _checked(key: str, values: list[str], part: str) -> None:
    if not is_label_name(key):
        raise ValueError(f"label selector: {key!r} in {part.strip()!r} is not a valid label key")
    for v in values:
        if not is_label_value(v):
            raise ValueError(f"label selector: value {v!r} in {part.strip()!r} is not a valid label value")


def parse_selector(text: str) -> LabelSelector:
    """Raises ValueError naming the requirement that is not a label selector's."""
    requirements: list[Requirement] = []
    if text.strip():
        for part in _split(text):
            if m := _SET.match(part):
                values = [v.strip() for v in m.group(3).split(",")]
                _checked(m.group(1), values, part)
                requirements.append(Requirement(m.group(1), m.group(2), frozenset(values)))
            elif m := _COMPARE.match(part):
                _checked(m.group(1), [m.group(3)], part)
                op = "notin" if m.group(2) == "!=" else "in"
                requirements.append(Requirement(m.group(1), op, frozenset({m.group(3)})))
            elif m := _EXISTS.match(part):
                _checked(m.group(2), [], part)
                requirements.append(Requirement(m.group(2), "!" if m.group(1) else "exists"))
            else:
                raise ValueError(f"label selector: {part.strip()!r} is not a requirement "
                                 "(key, !key, key=value, key!=value, key in (a,b), key notin (a,b))")
    return LabelSelector(text.strip(), tuple(requirements))
