"""What a selector that came out false read on a device, for people: ``memory is 80Gi; the selector
needs ≥ 1Ti`` or ``architecture: missing on this MIG device``.

The expression is parsed once (cached by its text) into the attributes and capacities it reads,
each with what the selector compares it to where the shape is a plain one (a comparison with a
literal, ``compareTo(quantity(...))``, ``isGreaterThan(semver(...))``, ``startsWith``, ``in``, a
boolean attribute on its own, ``has``).  Other shapes still show the values read, without a need.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from dra_driver.allocator.capacity import show
from dra_driver.allocator.cel.syntax import Binary, Call, Ident, Index, Lit, Node, Parser, Select, Unary, children, unparse
from dra_driver.allocator.inventory import Device

_SYMBOL = {"<": "<", "<=": "≤", ">": ">", ">=": "≥", "==": "==", "!=": "!="}
_FLIPPED = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}
_NEGATED = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}
_STRING_TESTS = {"startsWith": "starting with", "endsWith": "ending with", "contains": "containing",
                 "matches": "matching"}  # fmt: skip


@dataclass(frozen=True)
class Reading:
    kind: str  # attribute | capacity
    domain: str
    name: str
    need: str | None  # what the selector wants of it ("≥ 1Ti", '== "H100"', "true"), None if unknown


@lru_cache(maxsize=512)
def readings(expression: str) -> tuple[Reading, ...]:
    """The attributes and capacities ``expression`` reads, in order, each once."""
    try:
        ast = Parser(expression).parse()
    except (SyntaxError, RecursionError):
        return ()
    found: list[Reading] = []
    _visit(ast, False, found)
    merged: dict[tuple[str, str, str], Reading] = {}
    for r in found:
        key = (r.kind, r.domain, r.name)
        old = merged.get(key)
        if old is None or (old.need in (None, "set") and r.need not in (None, "set")):
            merged[key] = r if old is None else Reading(*key, r.need)
    return tuple(merged.values())


def _literal(node: Node) -> str | None:
    if isinstance(node, Lit):
        return node.text
    if isinstance(node, Call) and node.target is None and node.fn in ("quantity", "semver") and len(node.args) == 1:
        arg = node.args[0]
        if isinstance(arg, Lit) and arg.kind == "string":
            return arg.text[1:-1]
    if isinstance(node, Unary) and node.op == "-" and isinstance(node.operand, Lit):
        return "-" + node.operand.text
    return None


def _ref(node: Node) -> tuple[str, str, str] | None:
    """(kind, domain, name) of ``device.attributes["domain"].name`` (or ``["name"]``)."""
    if isinstance(node, Select) and not node.test:
        inner, name = node.operand, node.field
    elif isinstance(node, Index) and isinstance(node.index, Lit) and node.index.kind == "string":
        inner, name = node.operand, node.index.text[1:-1]
    else:
        return None
    if not (isinstance(inner, Index) and isinstance(inner.index, Lit) and inner.index.kind == "string"):
        return None
    root = inner.operand
    if (isinstance(root, Select) and root.field in ("attributes", "capacity") and isinstance(root.operand, Ident)
            and root.operand.name == "device"):  # fmt: skip
        return ("attribute" if root.field == "attributes" else "capacity", inner.index.text[1:-1], name)
    return None


def _chain_ref(node: Node) -> tuple[tuple[str, str, str], str] | None:
    """A reference under string methods (``x.lowerAscii()``): (reference, "lower-cased ")."""
    prefix = ""
    while isinstance(node, Call) and node.target is not None and node.fn in ("lowerAscii", "upperAscii") and not node.args:
        prefix = ("lower-cased " if node.fn == "lowerAscii" else "upper-cased ") + prefix
        node = node.target
    ref = _ref(node)
    return (ref, prefix) if ref else None


def _add(found: list[Reading], ref: tuple[str, str, str], need: str | None, negated: bool) -> None:
    if need is not None and negated:
        need = f"not {need}"
    found.append(Reading(*ref, need))


def _visit(node: Node, negated: bool, found: list[Reading]) -> None:
    if isinstance(node, Unary) and node.op == "!":
        _visit(node.operand, not negated, found)
        return
    if isinstance(node, Binary) and node.op in _SYMBOL:
        op = _NEGATED[node.op] if negated else node.op
        for side, other, flip in ((node.left, node.right, False), (node.right, node.left, True)):
            lit = _literal(other)
            if lit is None:
                continue
            ref = _ref(side)
            if ref is not None:
                _add(found, ref, f"{_SYMBOL[_FLIPPED[op] if flip else op]} {lit}", False)
                return
            if (isinstance(side, Call) and side.fn == "compareTo" and side.target is not None and len(side.args) == 1
                    and lit == "0"):  # fmt: skip
                ref, arg = _ref(side.target), _literal(side.args[0])
                if ref is not None and arg is not None:
                    _add(found, ref, f"{_SYMBOL[_FLIPPED[op] if flip else op]} {arg}", False)
                    return
    if isinstance(node, Binary) and node.op == "in":
        ref = _ref(node.left)
        if ref is not None:
            _add(found, ref, f"one of {unparse(node.right)}", negated)
            return
    if isinstance(node, Call) and node.target is not None and len(node.args) == 1:
        arg = _literal(node.args[0])
        if node.fn in ("isGreaterThan", "isLessThan") and arg is not None:
            ref = _ref(node.target)
            if ref is not None:
                _add(found, ref, f"{'>' if node.fn == 'isGreaterThan' else '<'} {arg}", negated)
                return
        if node.fn in _STRING_TESTS and arg is not None:
            chained = _chain_ref(node.target)
            if chained is not None:
                _add(found, chained[0], f"{chained[1]}{_STRING_TESTS[node.fn]} {arg}", negated)
                return
    if isinstance(node, Call) and node.fn == "has" and node.target is None and len(node.args) == 1:
        ref = _ref(node.args[0])
        if ref is not None:
            _add(found, ref, "set", negated)
            return
    ref = _ref(node)
    if ref is not None:
        _add(found, ref, "false" if negated else "true", False)
        return
    for child in children(node):
        _visit(child, negated if isinstance(node, Binary) and node.op in ("&&", "||") else False, found)


def value_of(dev: Device, r: Reading) -> Any:
    """What ``dev`` publishes for the reading, None when it does not (hashable, for grouping)."""
    if r.kind == "attribute":
        return dev.attributes.get(f"{r.domain}/{r.name}")
    entry = dev.capacity.get(f"{r.domain}/{r.name}")
    if entry is None and r.domain == dev.key[0]:
        entry = dev.capacity.get(r.name)
    return entry[0].value if entry is not None else None


def values_key(dev: Device, found: tuple[Reading, ...]) -> tuple[Any, ...]:
    return tuple(value_of(dev, r) for r in found)


def _shown(value: Any, r: Reading) -> str:
    if r.kind == "capacity":
        return show(value)
    kind, v = value
    if kind == "bool":
        return "true" if v else "false"
    return f'"{v}"' if kind == "string" else str(v)


def describe(dev: Device, found: tuple[Reading, ...]) -> str | None:
    """``memory is 80Gi; the selector needs ≥ 1Ti``, one part per reading; None when nothing was read."""
    if not found:
        return None
    parts = []
    for r in found:
        value = value_of(dev, r)
        if value is None:
            parts.append(f"{r.name}: missing on this {_device_kind(dev)}device")
        elif r.need is None or r.need == "set":
            parts.append(f"{r.name} is {_shown(value, r)}")
        elif len(found) == 1:
            parts.append(f"{r.name} is {_shown(value, r)}; the selector needs {r.need}")
        else:
            parts.append(f"{r.name} is {_shown(value, r)} (needs {r.need})")
    return "; ".join(parts)


def _device_kind(dev: Device) -> str:
    kind = dev.attributes.get(f"{dev.key[0]}/type")
    if kind is not None and kind[0] == "string" and isinstance(kind[1], str) and kind[1]:
        word = kind[1]
        return (word.upper() if len(word) <= 4 else word) + " "
    return ""
