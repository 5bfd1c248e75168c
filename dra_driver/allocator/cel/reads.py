"""What a selector reads of a device: the fields its outcome can depend on.

A selector's outcome (true, false or the runtime error, message included) is a function of the
parts of the ``device`` variable the expression can reach. :func:`selector_reads` finds them in the
parsed expression: ``device.driver``, ``device.allowMultipleAllocations``, single attributes and
capacities named by literals (``device.attributes["d"].name``, ``["d"]["name"]``,
``device.attributes.d.name``, inside ``has()`` too), and whole domain maps
(``device.attributes["d"]`` used any other way). Any other use of ``device`` (the variable on its
own, ``device.attributes`` as a map, a computed key, the optional syntax, a literal with escapes)
reads all of it: :attr:`Reads.whole`.

Devices that agree on everything a selector reads get the same outcome, so the allocator evaluates
one device per distinct combination (``dra_driver.allocator.groups``). Shadowing is followed the
way the rewriter follows it: inside a macro or ``cel.bind`` that binds the name ``device``, the name
is the local variable.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from dra_driver.allocator.cel.functions import MACROS
from dra_driver.allocator.cel.syntax import Call, Ident, Index, Lit, Node, Parser, Select, children

Field = tuple[str, str, str]
"""(``attributes`` or ``capacity``, domain, name)."""
Domain = tuple[str, str]
"""(``attributes`` or ``capacity``, domain)."""


@dataclass(frozen=True)
class Reads:
    driver: bool = False
    multi: bool = False
    """``device.allowMultipleAllocations``."""
    fields: tuple[Field, ...] = ()
    domains: tuple[Domain, ...] = ()
    whole: bool = False

    def union(self, other: Reads) -> Reads:
        if self.whole or other.whole:
            return WHOLE
        return Reads(self.driver or other.driver, self.multi or other.multi,
                     tuple(sorted(set(self.fields) | set(other.fields))),
                     tuple(sorted(set(self.domains) | set(other.domains))))


WHOLE = Reads(whole=True)
NOTHING = Reads()


class _Whole(Exception):
    """The expression uses ``device`` in a way that is not narrowed to named fields."""


@lru_cache(maxsize=2048)
def selector_reads(expression: str) -> Reads:
    """The parts of ``device`` that ``expression`` reads; :data:`WHOLE` when that cannot be narrowed."""
    try:
        ast = Parser(expression).parse()
    except (SyntaxError, RecursionError):
        return WHOLE
    found = _Found()
    try:
        _visit(ast, (), found)
    except (_Whole, RecursionError):
        return WHOLE
    return Reads(found.driver, found.multi, tuple(sorted(found.fields)), tuple(sorted(found.domains)))


class _Found:
    def __init__(self) -> None:
        self.driver = False
        self.multi = False
        self.fields: set[Field] = set()
        self.domains: set[Domain] = set()


def _plain_string(node: Node) -> str | None:
    """The value of a plain quoted string literal; None for any other node (escapes, raw, bytes,
    triple quotes: their value is not the text between the quotes)."""
    if not isinstance(node, Lit) or node.kind != "string":
        return None
    text = node.text
    if len(text) < 2 or text[0] not in "\"'" or text[-1] != text[0] or "\\" in text or text.startswith(text[0] * 3):
        return None
    return text[1:-1]


def _is_device(node: Node, scope: tuple[str, ...]) -> bool:
    return isinstance(node, Ident) and node.name == "device" and "device" not in scope


def _map_kind(node: Node, scope: tuple[str, ...]) -> str | None:
    """``attributes`` or ``capacity`` for ``device.attributes`` / ``device.capacity``."""
    if (isinstance(node, Select) and not node.optional and not node.test and node.field in ("attributes", "capacity")
            and _is_device(node.operand, scope)):  # fmt: skip
        return node.field
    return None


def _domain(node: Node, scope: tuple[str, ...]) -> Domain | None:
    """(map, domain) for ``device.attributes["d"]`` or ``device.attributes.d``."""
    if isinstance(node, Index) and not node.optional:
        kind, name = _map_kind(node.operand, scope), _plain_string(node.index)
    elif isinstance(node, Select) and not node.optional and not node.test:
        kind, name = _map_kind(node.operand, scope), node.field
    else:
        return None
    return (kind, name) if kind is not None and name is not None else None


def _field(node: Node, scope: tuple[str, ...]) -> Field | None:
    """(map, domain, name) for ``<domain>.name`` or ``<domain>["name"]`` (a ``has()`` test too)."""
    name: str | None
    if isinstance(node, Select) and not node.optional:
        domain, name = _domain(node.operand, scope), node.field
    elif isinstance(node, Index) and not node.optional:
        domain, name = _domain(node.operand, scope), _plain_string(node.index)
    else:
        return None
    return (*domain, name) if domain is not None and name is not None else None


def _visit(node: Node, scope: tuple[str, ...], found: _Found) -> None:
    field = _field(node, scope)
    if field is not None:
        found.fields.add(field)
        return
    domain = _domain(node, scope)
    if domain is not None:
        found.domains.add(domain)
        return
    if isinstance(node, Select) and not node.optional and not node.test and _is_device(node.operand, scope):
        if node.field == "driver":
            found.driver = True
            return
        if node.field == "allowMultipleAllocations":
            found.multi = True
            return
        raise _Whole()
    if _is_device(node, scope):
        raise _Whole()
    if isinstance(node, Call):
        _visit_call(node, scope, found)
        return
    for child in children(node):
        _visit(child, scope, found)


def _visit_call(node: Call, scope: tuple[str, ...], found: _Found) -> None:
    target, args = node.target, node.args
    if target is None and node.fn == "has" and len(args) == 1:
        field = _field(args[0], scope)
        if field is not None:
            found.fields.add(field)
            return
    if target is not None and node.fn in MACROS and len(args) == 2 and isinstance(args[0], Ident):
        _visit(target, scope, found)
        _visit(args[1], (*scope, args[0].name), found)
        return
    if isinstance(target, Ident) and target.name == "cel" and node.fn == "bind" and len(args) == 3 \
            and isinstance(args[0], Ident):
        _visit(args[1], scope, found)
        _visit(args[2], (*scope, args[0].name), found)
        return
    if target is not None:
        _visit(target, scope, found)
    for arg in args:
        _visit(arg, scope, found)


