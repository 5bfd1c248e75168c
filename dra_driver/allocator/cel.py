"""The Kubernetes DRA CEL environment on top of the ``cel`` (cel-rust) package.

What the scheduler offers (``k8s.io/dynamic-resource-allocation/cel``) and how
it is provided here:

* ``device.driver``, ``device.attributes``, ``device.capacity``,
  ``device.allowMultipleAllocations`` -- a plain nested dict built once per
  device (:func:`device_activation`) and reused for every expression.
* Unknown *domain* -> empty map, unknown *key* -> error.  cel-rust maps error
  on every unknown key and custom map types cannot be passed in, so the
  expression is rewritten: ``device.attributes[X]`` becomes
  ``(X in device.attributes ? device.attributes[X] : {})``.  ``X in
  device.attributes`` and ``has()`` keep their Kubernetes meaning (false for an
  unknown domain).
* Quantity and Semver objects: cel-rust cannot carry Python objects, so they
  are represented as one-key maps (``{"kubernetes.Quantity": "<exact value>"}``)
  whose value is canonical, which makes ``==`` value equality.  Methods such
  as ``q.compareTo(r)`` work because cel-rust turns ``x.f(a)`` into ``f(x, a)``
  for registered functions; the Python implementations dispatch on the marker.
* Optional syntax ``a.?b`` / ``m[?k]`` (unsupported by the cel-rust parser) and
  ``cel.bind()`` are rewritten into native constructs
  (``has(a.b) ? optional.of(a.b) : optional.none()``, ``[init].map(v, e)[0]``).
* Undeclared variables/functions and obviously non-bool results are rejected
  at compile time like the Kubernetes type checker would; other type errors
  surface at runtime (cel-rust has no checker).
* Cost: cel-rust has no cost tracking.  Every expression gets a static
  worst-case estimate (comprehension nesting x bounded list sizes); above
  :data:`MAX_COST` it is a compile error.  As a backstop each evaluation is
  timed and an expression that ever exceeds :data:`RUNTIME_LIMIT_S` is
  poisoned: that and all later evaluations fail with a cost error.

Not supported (compile error): two-variable comprehensions, message/struct
literals, ``format``, IP/CIDR/URL libraries, DRA ``includes()`` (1.36 gate).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import Any

import cel
from cel.stdlib import EXTENSIONS

from dra_driver.k8s.quantity import Quantity, QuantityError, is_quantity, parse_quantity

__all__ = [
    "MAX_COST",
    "MAX_EXPRESSION_LENGTH",
    "RUNTIME_LIMIT_S",
    "CelCompileError",
    "CelCostError",
    "CelError",
    "CelRuntimeError",
    "CompiledSelector",
    "DeviceActivation",
    "Semver",
    "SemverError",
    "compile_selector",
    "device_activation",
    "parse_semver",
    "split_qualified_name",
]

MAX_COST = 1_000_000
MAX_EXPRESSION_LENGTH = 10 * 1024
RUNTIME_LIMIT_S = 0.5
MAX_NESTING = 100
QUANTITY_KEY = "kubernetes.Quantity"
SEMVER_KEY = "kubernetes.Semver"


# --------------------------------------------------------------------------- errors


class CelError(Exception):
    """A selector expression could not be used; carries the expression text."""

    def __init__(self, expression: str, message: str) -> None:
        super().__init__(message)
        self.expression = expression
        self.message = message

    def __str__(self) -> str:
        return self.message


class CelCompileError(CelError):
    """The expression does not compile in the DRA environment."""


class CelCostError(CelCompileError):
    """The expression's (estimated or observed) cost exceeds the limit."""


class CelRuntimeError(CelError):
    """Evaluation failed or returned a non-bool; never treated as ``false``."""


# --------------------------------------------------------------------------- semver


class SemverError(ValueError):
    pass


_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?"
)


@dataclass(frozen=True)
class Semver:
    major: int
    minor: int
    patch: int
    pre: tuple[str, ...] = ()
    build: tuple[str, ...] = ()

    def _key(self) -> tuple[Any, ...]:
        # semver 2.0 precedence: a release sorts after its pre-releases; numeric
        # identifiers sort numerically and before alphanumeric ones.
        pre = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in self.pre)
        return (self.major, self.minor, self.patch, 0 if self.pre else 1, pre)

    def compare(self, other: Semver) -> int:
        a, b = self._key(), other._key()
        return (a > b) - (a < b)

    def canonical(self) -> str:
        """Spelling without build metadata: equal precedence <=> equal string."""
        base = f"{self.major}.{self.minor}.{self.patch}"
        return base + ("-" + ".".join(self.pre) if self.pre else "")

    def __str__(self) -> str:
        return self.canonical() + ("+" + ".".join(self.build) if self.build else "")


def _normalize_semver(text: str) -> str:
    # Mirrors the Kubernetes semver library's "normalize": optional "v" prefix,
    # missing minor/patch filled with 0, leading zeros dropped.
    text = text[1:] if text.startswith("v") else text
    core, sep, rest = text, "", ""
    for marker in ("-", "+"):
        idx = text.find(marker)
        if idx >= 0 and (not sep or idx < len(core)):
            core, sep, rest = text[:idx], marker, text[idx + 1 :]
    parts = core.split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise SemverError(f"invalid semantic version {text!r}")
    parts = [str(int(p)) for p in parts] + ["0"] * (3 - len(parts))
    return ".".join(parts) + (sep + rest if sep else "")


@lru_cache(maxsize=4096)
def parse_semver(text: str, normalize: bool = False) -> Semver:
    """Parse a strict semver 2.0.0 string (or a tolerant one with ``normalize``)."""
    if not isinstance(text, str) or len(text) > 256:
        raise SemverError("semantic version must be a string of at most 256 characters")
    source = _normalize_semver(text) if normalize else text
    m = _SEMVER.fullmatch(source)
    if m is None:
        raise SemverError(f"invalid semantic version {text!r}")
    pre = tuple(m.group(4).split(".")) if m.group(4) else ()
    build = tuple(m.group(5).split(".")) if m.group(5) else ()
    return Semver(int(m.group(1)), int(m.group(2)), int(m.group(3)), pre, build)


# --------------------------------------------------------------------------- CEL values


def quantity_value(q: Quantity) -> dict[str, str]:
    return {QUANTITY_KEY: _canonical(q)}


@lru_cache(maxsize=4096)
def _canonical(q: Quantity) -> str:
    # Parsed quantities are cached by text, so devices publishing the same capacity share one
    # Quantity; rendering its exact value as text is the costly part of a device's activation.
    return q.canonical()


def semver_value(v: Semver) -> dict[str, str]:
    return {SEMVER_KEY: v.canonical()}


@lru_cache(maxsize=8192)
def _quantity_from_canonical(text: str) -> Quantity:
    return Quantity(Fraction(text))


def _as_quantity(value: Any) -> Quantity:
    if isinstance(value, dict) and QUANTITY_KEY in value:
        return _quantity_from_canonical(value[QUANTITY_KEY])
    raise TypeError(f"no such overload: expected a quantity, got {_type_name(value)}")


def _as_semver(value: Any) -> Semver:
    if isinstance(value, dict) and SEMVER_KEY in value:
        return parse_semver(value[SEMVER_KEY])
    raise TypeError(f"no such overload: expected a semver, got {_type_name(value)}")


def _type_name(value: Any) -> str:
    if isinstance(value, dict):
        if QUANTITY_KEY in value:
            return "kubernetes.Quantity"
        if SEMVER_KEY in value:
            return "kubernetes.Semver"
        return "map"
    return {bool: "bool", int: "int", float: "double", str: "string", list: "list"}.get(type(value), type(value).__name__)


def _is_kind(value: Any, key: str) -> bool:
    return isinstance(value, dict) and key in value


# --------------------------------------------------------------------------- functions


def _fn_quantity(text: Any) -> dict[str, str]:
    if not isinstance(text, str):
        raise TypeError("no such overload: quantity() takes a string")
    try:
        return quantity_value(parse_quantity(text))
    except QuantityError as exc:
        raise ValueError(str(exc)) from None


def _fn_is_quantity(text: Any) -> bool:
    return is_quantity(text)


def _fn_semver(text: Any, normalize: bool = False) -> dict[str, str]:
    if not isinstance(text, str):
        raise TypeError("no such overload: semver() takes a string")
    try:
        return semver_value(parse_semver(text, bool(normalize)))
    except SemverError as exc:
        raise ValueError(str(exc)) from None


def _fn_is_semver(text: Any, normalize: bool = False) -> bool:
    if not isinstance(text, str):
        return False
    try:
        parse_semver(text, bool(normalize))
    except SemverError:
        return False
    return True


def _fn_compare_to(a: Any, b: Any) -> int:
    if _is_kind(a, SEMVER_KEY):
        return _as_semver(a).compare(_as_semver(b))
    return _as_quantity(a).compare(_as_quantity(b))


def _fn_greater(a: Any, b: Any) -> bool:
    return _fn_compare_to(a, b) > 0


def _fn_less(a: Any, b: Any) -> bool:
    return _fn_compare_to(a, b) < 0


def _quantity_operand(value: Any) -> Quantity:
    if isinstance(value, int) and not isinstance(value, bool):
        return Quantity(Fraction(value))
    return _as_quantity(value)


def _fn_add(a: Any, b: Any) -> dict[str, str]:
    return quantity_value(_as_quantity(a) + _quantity_operand(b))


def _fn_sub(a: Any, b: Any) -> dict[str, str]:
    return quantity_value(_as_quantity(a) - _quantity_operand(b))


def _fn_as_integer(a: Any) -> int:
    try:
        return _as_quantity(a).as_integer()
    except QuantityError as exc:
        raise ValueError(str(exc)) from None


def _fn_as_float(a: Any) -> float:
    return _as_quantity(a).as_float()


def _fn_is_integer(a: Any) -> bool:
    return _as_quantity(a).is_integer()


def _fn_sign(a: Any) -> int:
    return _as_quantity(a).sign()


def _semver_part(index: int) -> Callable[[Any], int]:
    def part(v: Any) -> int:
        s = _as_semver(v)
        return (s.major, s.minor, s.patch)[index]

    return part


def _fn_index_of(container: Any, item: Any, *rest: Any) -> int:
    # ext.Strings indexOf and library.Lists indexOf share one name.
    if isinstance(container, list):
        for i, x in enumerate(container):
            if type(x) is type(item) and x == item:
                return i
        return -1
    return int(EXTENSIONS["strings"]["indexOf"](container, item, *rest))


def _fn_last_index_of(container: Any, item: Any, *rest: Any) -> int:
    if isinstance(container, list):
        for i in range(len(container) - 1, -1, -1):
            if type(container[i]) is type(item) and container[i] == item:
                return i
        return -1
    return int(EXTENSIONS["strings"]["lastIndexOf"](container, item, *rest))


def _fn_is_sorted(items: Any) -> bool:
    if not isinstance(items, list):
        raise TypeError("no such overload: isSorted() takes a list")
    return all(items[i] <= items[i + 1] for i in range(len(items) - 1))


_MAX_RANGE = 100_000


def _fn_lists_range(n: Any) -> list[int]:
    # Bounded: a huge range would allocate before any cost check could react.
    if not isinstance(n, int) or isinstance(n, bool) or n > _MAX_RANGE:
        raise ValueError(f"lists.range: argument must be an int <= {_MAX_RANGE}")
    return list(range(max(n, 0)))


def _fn_find(s: Any, pattern: Any) -> str:
    m = re.search(str(pattern), str(s))
    return m.group(0) if m else ""


def _fn_find_all(s: Any, pattern: Any, limit: int = -1) -> list[str]:
    found = [m.group(0) for m in re.finditer(str(pattern), str(s))]
    return found if limit < 0 else found[:limit]


def _build_functions() -> dict[str, Callable[..., Any]]:
    functions: dict[str, Callable[..., Any]] = {}
    for lib in ("core", "strings", "sets", "lists"):
        functions.update(EXTENSIONS[lib])
    functions.update(
        {
            "quantity": _fn_quantity,
            "isQuantity": _fn_is_quantity,
            "semver": _fn_semver,
            "isSemver": _fn_is_semver,
            "compareTo": _fn_compare_to,
            "isGreaterThan": _fn_greater,
            "isLessThan": _fn_less,
            "add": _fn_add,
            "sub": _fn_sub,
            "asInteger": _fn_as_integer,
            "asApproximateFloat": _fn_as_float,
            "isInteger": _fn_is_integer,
            "sign": _fn_sign,
            "major": _semver_part(0),
            "minor": _semver_part(1),
            "patch": _semver_part(2),
            "indexOf": _fn_index_of,
            "lastIndexOf": _fn_last_index_of,
            "isSorted": _fn_is_sorted,
            "lists.range": _fn_lists_range,
            "find": _fn_find,
            "findAll": _fn_find_all,
        }
    )
    return functions


FUNCTIONS: dict[str, Callable[..., Any]] = _build_functions()

# Functions cel-rust implements natively (global or method style).
_NATIVE_FUNCTIONS = frozenset(
    {
        "size", "int", "uint", "double", "string", "bytes", "dyn", "type", "duration", "timestamp",
        "contains", "startsWith", "endsWith", "matches", "orValue", "hasValue", "value", "or",
        "optional.of", "optional.none", "optional.ofNonZeroValue",
        "getFullYear", "getMonth", "getDayOfYear", "getDayOfMonth", "getDate", "getDayOfWeek",
        "getHours", "getMinutes", "getSeconds", "getMilliseconds",
    }
)  # fmt: skip
_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
_KNOWN_FUNCTIONS = _NATIVE_FUNCTIONS | frozenset(FUNCTIONS)
_NAMESPACES = frozenset({"optional", "sets", "lists", "strings", "cel"})
_TYPE_IDENTS = frozenset({"int", "uint", "double", "string", "bytes", "bool", "list", "map", "null_type", "type"})


# --------------------------------------------------------------------------- lexer

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+|//[^\n]*)
  | (?P<string>(?:[rR][bB]?|[bB][rR]?)?
        (?:\"\"\"(?:\\.|[^\\])*?\"\"\"|'''(?:\\.|[^\\])*?'''|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'))
  | (?P<number>0[xX][0-9a-fA-F]+[uU]?|(?:\d+\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\.\d+(?:[eE][+-]?\d+)?)|\d+[uU]?)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>==|!=|<=|>=|&&|\|\||\.\?|[-+*/%<>!?:.,\[\](){}])
    """,
    re.VERBOSE | re.DOTALL,
)


@dataclass(frozen=True)
class _Tok:
    kind: str  # string, number, ident, op, eof
    text: str
    pos: int


def _tokenize(source: str) -> list[_Tok]:
    tokens: list[_Tok] = []
    pos = 0
    while pos < len(source):
        m = _TOKEN.match(source, pos)
        if m is None:
            raise SyntaxError(f"unexpected character {source[pos]!r} at offset {pos}")
        kind = m.lastgroup or ""
        if kind != "ws":
            tokens.append(_Tok(kind, m.group(), pos))
        pos = m.end()
    tokens.append(_Tok("eof", "", pos))
    return tokens


# --------------------------------------------------------------------------- AST


@dataclass
class _Node:
    pass


@dataclass
class _Lit(_Node):
    text: str
    kind: str  # int, uint, double, string, bytes, bool, null


@dataclass
class _Ident(_Node):
    name: str


@dataclass
class _Select(_Node):
    operand: _Node
    field: str
    optional: bool = False
    test: bool = False


@dataclass
class _Index(_Node):
    operand: _Node
    index: _Node
    optional: bool = False


@dataclass
class _Call(_Node):
    fn: str
    target: _Node | None
    args: list[_Node]


@dataclass
class _List(_Node):
    items: list[_Node]


@dataclass
class _Map(_Node):
    entries: list[tuple[_Node, _Node]]


@dataclass
class _Unary(_Node):
    op: str
    operand: _Node


@dataclass
class _Binary(_Node):
    op: str
    left: _Node
    right: _Node


@dataclass
class _Cond(_Node):
    cond: _Node
    then: _Node
    other: _Node


@dataclass
class _Comp(_Node):
    macro: str
    target: _Node
    var: str
    body: _Node


_REL_OPS = frozenset({"<", "<=", ">", ">=", "==", "!=", "in"})


class _Parser:
    """Recursive-descent parser for the CEL grammar (enough to rewrite and estimate)."""

    def __init__(self, source: str) -> None:
        self.toks = _tokenize(source)
        self.i = 0
        self.depth = 0

    def peek(self, offset: int = 0) -> _Tok:
        return self.toks[min(self.i + offset, len(self.toks) - 1)]

    def take(self) -> _Tok:
        tok = self.toks[self.i]
        self.i += 1
        return tok

    def accept(self, text: str) -> bool:
        tok = self.peek()
        if tok.kind in ("op", "ident") and tok.text == text:
            self.i += 1
            return True
        return False

    def expect(self, text: str) -> None:
        if not self.accept(text):
            tok = self.peek()
            raise SyntaxError(f"expected {text!r} at offset {tok.pos}, found {tok.text or 'end of input'!r}")

    def parse(self) -> _Node:
        node = self.expr()
        if self.peek().kind != "eof":
            tok = self.peek()
            raise SyntaxError(f"unexpected {tok.text!r} at offset {tok.pos}")
        return node

    def expr(self) -> _Node:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise SyntaxError("expression nested too deeply")
        node = self.or_expr()
        if self.accept("?"):
            then = self.or_expr()
            self.expect(":")
            node = _Cond(node, then, self.expr())
        self.depth -= 1
        return node

    def or_expr(self) -> _Node:
        node = self.and_expr()
        while self.accept("||"):
            node = _Binary("||", node, self.and_expr())
        return node

    def and_expr(self) -> _Node:
        node = self.relation()
        while self.accept("&&"):
            node = _Binary("&&", node, self.relation())
        return node

    def relation(self) -> _Node:
        node = self.addition()
        while self.peek().text in _REL_OPS and self.peek().kind in ("op", "ident"):
            op = self.take().text
            node = _Binary(op, node, self.addition())
        return node

    def addition(self) -> _Node:
        node = self.multiplication()
        while self.peek().kind == "op" and self.peek().text in ("+", "-"):
            op = self.take().text
            node = _Binary(op, node, self.multiplication())
        return node

    def multiplication(self) -> _Node:
        node = self.unary()
        while self.peek().kind == "op" and self.peek().text in ("*", "/", "%"):
            op = self.take().text
            node = _Binary(op, node, self.unary())
        return node

    def unary(self) -> _Node:
        if self.peek().kind == "op" and self.peek().text in ("!", "-"):
            op = self.take().text
            self.depth += 1
            if self.depth > MAX_NESTING:
                raise SyntaxError("expression nested too deeply")
            node = _Unary(op, self.unary())
            self.depth -= 1
            return node
        return self.member()

    def member(self) -> _Node:
        node = self.primary()
        while True:
            if self.accept("."):
                name = self.ident()
                node = _Call(name, node, self.args(")")) if self.accept("(") else _Select(node, name)
            elif self.accept(".?"):
                node = _Select(node, self.ident(), optional=True)
            elif self.accept("["):
                optional = self.accept("?")
                index = self.expr()
                self.expect("]")
                node = _Index(node, index, optional)
            else:
                return node

    def ident(self) -> str:
        tok = self.take()
        if tok.kind != "ident":
            raise SyntaxError(f"expected identifier at offset {tok.pos}")
        return tok.text

    def args(self, close: str) -> list[_Node]:
        items: list[_Node] = []
        if self.accept(close):
            return items
        while True:
            items.append(self.expr())
            if self.accept(close):
                return items
            self.expect(",")
            if self.accept(close):  # trailing comma
                return items

    def primary(self) -> _Node:
        tok = self.take()
        if tok.kind == "number":
            text = tok.text
            is_hex = text.lower().startswith("0x")
            kind = "uint" if text[-1] in "uU" else "double" if not is_hex and any(c in text for c in ".eE") else "int"
            return _Lit(text, kind)
        if tok.kind == "string":
            # The prefix is what precedes the quote: "b..." is a string, b"..." bytes.
            prefix = tok.text[: len(tok.text) - len(tok.text.lstrip("rRbB"))]
            return _Lit(tok.text, "bytes" if "b" in prefix.lower() else "string")
        if tok.kind == "ident":
            if tok.text in ("true", "false"):
                return _Lit(tok.text, "bool")
            if tok.text == "null":
                return _Lit(tok.text, "null")
            if self.accept("("):
                return _Call(tok.text, None, self.args(")"))
            if self.peek().text == "{" and self.peek().kind == "op":
                raise SyntaxError("message construction is not supported in DRA selectors")
            return _Ident(tok.text)
        if tok.kind == "op":
            if tok.text == "(":
                node = self.expr()
                self.expect(")")
                return node
            if tok.text == "[":
                return _List(self.args("]"))
            if tok.text == "{":
                return _Map(self.map_entries())
            if tok.text == ".":
                return self.primary()  # leading-dot absolute name
        raise SyntaxError(f"unexpected {tok.text or 'end of input'!r} at offset {tok.pos}")

    def map_entries(self) -> list[tuple[_Node, _Node]]:
        entries: list[tuple[_Node, _Node]] = []
        if self.accept("}"):
            return entries
        while True:
            key = self.expr()
            self.expect(":")
            entries.append((key, self.expr()))
            if self.accept("}"):
                return entries
            self.expect(",")
            if self.accept("}"):
                return entries


# --------------------------------------------------------------------------- rewriting


def _some(node: _Node) -> _Node:
    return _Call("of", _Ident("optional"), [node])


def _none() -> _Node:
    return _Call("none", _Ident("optional"), [])


def _string_lit(value: str) -> _Lit:
    return _Lit('"' + value + '"', "string")


@dataclass
class _Rewriter:
    """Turns the Kubernetes dialect into what cel-rust understands; checks names."""

    scope: list[str] = field(default_factory=list)
    optional_nodes: set[int] = field(default_factory=set)

    def is_device(self, node: _Node) -> bool:
        return isinstance(node, _Ident) and node.name == "device" and "device" not in self.scope

    def is_domain_map(self, node: _Node) -> bool:
        return (
            isinstance(node, _Select)
            and not node.optional
            and node.field in ("attributes", "capacity")
            and self.is_device(node.operand)
        )

    def mark(self, node: _Node) -> _Node:
        self.optional_nodes.add(id(node))
        return node

    def is_optional(self, node: _Node) -> bool:
        return id(node) in self.optional_nodes

    def rw(self, node: _Node) -> _Node:
        if isinstance(node, _Lit):
            return node
        if isinstance(node, _Ident):
            return self.ident(node)
        if isinstance(node, _Select):
            return self.select(node)
        if isinstance(node, _Index):
            return self.index(node)
        if isinstance(node, _Call):
            return self.call(node)
        if isinstance(node, _List):
            return _List([self.rw(x) for x in node.items])
        if isinstance(node, _Map):
            return _Map([(self.rw(k), self.rw(v)) for k, v in node.entries])
        if isinstance(node, _Unary):
            return _Unary(node.op, self.rw(node.operand))
        if isinstance(node, _Binary):
            return _Binary(node.op, self.rw(node.left), self.rw(node.right))
        if isinstance(node, _Cond):
            return _Cond(self.rw(node.cond), self.rw(node.then), self.rw(node.other))
        raise SyntaxError(f"unsupported expression node {type(node).__name__}")

    def ident(self, node: _Ident) -> _Node:
        if node.name in self.scope or node.name == "device" or node.name in _TYPE_IDENTS:
            return node
        raise SyntaxError(f"undeclared reference to {node.name!r}")

    def select(self, node: _Select) -> _Node:
        if node.test:
            return _Select(self.rw(node.operand), node.field, test=True)
        operand = self.rw(node.operand)
        if self.is_domain_map(node.operand) and not node.optional:
            # device.attributes.dom -> empty map for an unknown domain.
            return _Cond(_Binary("in", _string_lit(node.field), operand), _Select(operand, node.field), _Map([]))
        if self.is_optional(operand):
            inner = _Call("value", operand, [])
            present: _Node = _Call("hasValue", operand, [])
            if node.optional:
                present = _Binary("&&", present, _Select(inner, node.field, test=True))
            return self.mark(_Cond(present, _some(_Select(inner, node.field)), _none()))
        if node.optional:
            if self.is_domain_map(node.operand):
                return self.mark(_some(self.select(_Select(node.operand, node.field))))
            return self.mark(_Cond(_Select(operand, node.field, test=True), _some(_Select(operand, node.field)), _none()))
        return _Select(operand, node.field)

    def index(self, node: _Index) -> _Node:
        operand = self.rw(node.operand)
        key = self.rw(node.index)
        if self.is_domain_map(node.operand):
            lookup = _Cond(_Binary("in", key, operand), _Index(operand, key), _Map([]))
            return self.mark(_some(lookup)) if node.optional else lookup
        if self.is_optional(operand):
            inner = _Call("value", operand, [])
            present: _Node = _Call("hasValue", operand, [])
            if node.optional:
                present = _Binary("&&", present, _Binary("in", key, inner))
            return self.mark(_Cond(present, _some(_Index(inner, key)), _none()))
        if node.optional:
            return self.mark(_Cond(_Binary("in", key, operand), _some(_Index(operand, key)), _none()))
        return _Index(operand, key)

    def call(self, node: _Call) -> _Node:
        target = node.target
        if target is None and node.fn == "has":
            return self.has(node)
        if isinstance(target, _Ident) and target.name == "cel" and node.fn == "bind":
            return self.bind(node)
        if target is not None and node.fn in _MACROS and node.args and isinstance(node.args[0], _Ident):
            return self.macro(node, target)
        name = node.fn
        if isinstance(target, _Ident) and target.name in _NAMESPACES and target.name not in self.scope:
            name = f"{target.name}.{node.fn}"
            if name not in _KNOWN_FUNCTIONS:
                raise SyntaxError(f"undeclared reference to {name!r}")
            result = _Call(node.fn, target, [self.rw(a) for a in node.args])
            return self.mark(result) if name.startswith("optional.") else result
        if name not in _KNOWN_FUNCTIONS:
            raise SyntaxError(f"undeclared reference to {name!r}")
        new_target = self.rw(target) if target is not None else None
        result = _Call(node.fn, new_target, [self.rw(a) for a in node.args])
        if name in ("first", "last") or (name == "or" and new_target is not None and self.is_optional(new_target)):
            return self.mark(result)
        return result

    def has(self, node: _Call) -> _Node:
        if len(node.args) != 1 or not isinstance(node.args[0], _Select) or node.args[0].optional:
            raise SyntaxError("invalid argument to has() macro")
        arg = node.args[0]
        return _Select(self.rw(arg.operand), arg.field, test=True)

    def bind(self, node: _Call) -> _Node:
        if len(node.args) != 3 or not isinstance(node.args[0], _Ident):
            raise SyntaxError("cel.bind() requires (identifier, init, expression)")
        var = node.args[0].name
        init = self.rw(node.args[1])
        self.scope.append(var)
        body = self.rw(node.args[2])
        self.scope.pop()
        # [init].map(var, body)[0] evaluates body once with var bound to init.
        return _Index(_Comp("map", _List([init]), var, body), _Lit("0", "int"))

    def macro(self, node: _Call, target: _Node) -> _Node:
        if len(node.args) != 2:
            raise SyntaxError(f"{node.fn}() with {len(node.args)} arguments (two-variable comprehensions unsupported)")
        var = node.args[0]
        assert isinstance(var, _Ident)
        new_target = self.rw(target)
        self.scope.append(var.name)
        body = self.rw(node.args[1])
        self.scope.pop()
        return _Comp(node.fn, new_target, var.name, body)


# --------------------------------------------------------------------------- unparse


def _unparse(node: _Node) -> str:
    if isinstance(node, _Lit):
        return node.text
    if isinstance(node, _Ident):
        return node.name
    if isinstance(node, _Select):
        inner = f"{_target(node.operand)}.{node.field}"
        return f"has({inner})" if node.test else inner
    if isinstance(node, _Index):
        return f"{_target(node.operand)}[{_unparse(node.index)}]"
    if isinstance(node, _Call):
        args = ", ".join(_unparse(a) for a in node.args)
        if node.target is None:
            return f"{node.fn}({args})"
        return f"{_target(node.target)}.{node.fn}({args})"
    if isinstance(node, _Comp):
        return f"{_target(node.target)}.{node.macro}({node.var}, {_unparse(node.body)})"
    if isinstance(node, _List):
        return "[" + ", ".join(_unparse(x) for x in node.items) + "]"
    if isinstance(node, _Map):
        return "{" + ", ".join(f"{_unparse(k)}: {_unparse(v)}" for k, v in node.entries) + "}"
    if isinstance(node, _Unary):
        if node.op == "-" and isinstance(node.operand, _Lit) and node.operand.kind in ("int", "double"):
            return f"-{node.operand.text}"  # keeps -9223372036854775808 representable
        return f"{node.op}({_unparse(node.operand)})"
    if isinstance(node, _Binary):
        return f"({_unparse(node.left)} {node.op} {_unparse(node.right)})"
    if isinstance(node, _Cond):
        return f"({_unparse(node.cond)} ? {_unparse(node.then)} : {_unparse(node.other)})"
    raise TypeError(type(node).__name__)


def _target(node: _Node) -> str:
    text = _unparse(node)
    if isinstance(node, (_Unary, _Lit)) and not (isinstance(node, _Lit) and node.kind in ("string", "bytes")):
        return f"({text})"
    return text


# --------------------------------------------------------------------------- cost


_UNKNOWN_SIZE = 1024  # assumed length of lists/strings whose size is not known statically
_ATTR_STRING = 64  # DeviceAttributeMaxValueLength
_MAP_SIZE = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice


def _lit_size(node: _Lit) -> int:
    return max(len(node.text) - 2, 0) if node.kind in ("string", "bytes") else 1


def _size(node: _Node) -> int:
    """Upper bound on the element count (list/map) or length (string) of a value."""
    if isinstance(node, _List):
        return len(node.items)
    if isinstance(node, _Map):
        return len(node.entries)
    if isinstance(node, _Lit):
        return _lit_size(node)
    if isinstance(node, _Comp):
        return _size(node.target) if node.macro in ("map", "filter") else 1
    if isinstance(node, _Binary) and node.op == "+":
        return _size(node.left) + _size(node.right)
    if isinstance(node, _Cond):
        return max(_size(node.then), _size(node.other))
    if isinstance(node, (_Select, _Index)) and _rooted_at_device(node):
        return _MAP_SIZE if _device_depth(node) < 3 else _ATTR_STRING
    if isinstance(node, _Call):
        return _call_size(node)
    return _UNKNOWN_SIZE


def _call_size(node: _Call) -> int:
    if node.fn == "range" and isinstance(node.target, _Ident) and node.args:
        arg = node.args[0]
        if isinstance(arg, _Lit) and arg.kind == "int":
            return min(int(arg.text, 0), _MAX_RANGE)
        return _MAX_RANGE
    if node.fn in ("split", "sort", "distinct", "reverse", "slice", "lowerAscii", "upperAscii", "trim") and node.target:
        return _size(node.target) + 1
    return _UNKNOWN_SIZE


def _rooted_at_device(node: _Node) -> bool:
    while isinstance(node, (_Select, _Index, _Cond)):
        node = node.then if isinstance(node, _Cond) else node.operand
    return isinstance(node, _Ident) and node.name == "device"


def _device_depth(node: _Node) -> int:
    depth = 0
    while isinstance(node, (_Select, _Index, _Cond)):
        node = node.then if isinstance(node, _Cond) else node.operand
        depth += 1
    return depth


_LINEAR_FUNCTIONS = frozenset(
    {"matches", "find", "findAll", "split", "replace", "sort", "contains", "distinct", "flatten", "join",
     "indexOf", "lastIndexOf", "isSorted", "sum", "min", "max", "equivalent", "intersects"}
)  # fmt: skip


def _cost(node: _Node) -> int:
    """Worst-case evaluation steps: every node counts 1, comprehensions multiply."""
    if isinstance(node, _Comp):
        iterations = _size(node.target)
        return 1 + _cost(node.target) + iterations * (1 + _cost(node.body))
    children = _children(node)
    extra = 0
    if isinstance(node, _Call) and node.fn in _LINEAR_FUNCTIONS:
        # Linear-time helpers over strings or lists (namespace targets like
        # ``sets`` are not values and have no size).
        extra = sum(_size(c) for c in children if not (isinstance(c, _Ident) and c.name in _NAMESPACES))
    elif isinstance(node, _Call) and node.fn == "range":
        # lists.range(n) allocates n elements each time it runs: inside a comprehension that is
        # iterations x n, which the per-node count of 1 hid (a memory bomb passed the check).
        extra = _call_size(node)
    return 1 + extra + sum(_cost(c) for c in children)


def _children(node: _Node) -> list[_Node]:
    if isinstance(node, (_Select, _Unary)):
        return [node.operand]
    if isinstance(node, _Index):
        return [node.operand, node.index]
    if isinstance(node, _Call):
        return ([node.target] if node.target is not None else []) + list(node.args)
    if isinstance(node, _List):
        return list(node.items)
    if isinstance(node, _Map):
        return [x for kv in node.entries for x in kv]
    if isinstance(node, _Binary):
        return [node.left, node.right]
    if isinstance(node, _Cond):
        return [node.cond, node.then, node.other]
    return []


_NON_BOOL_OPS = frozenset({"+", "-", "*", "/", "%"})


def _obviously_not_bool(node: _Node) -> str | None:
    """A result type the Kubernetes checker would reject at compile time."""
    if isinstance(node, _Lit) and node.kind != "bool":
        return node.kind
    if isinstance(node, _List):
        return "list"
    if isinstance(node, _Map):
        return "map"
    if isinstance(node, _Binary) and node.op in _NON_BOOL_OPS:
        return "a number or string"
    if isinstance(node, _Unary) and node.op == "-":
        return "a number"
    if isinstance(node, _Comp) and node.macro in ("map", "filter"):
        return "list"
    return None


# --------------------------------------------------------------------------- compile


@dataclass
class CompiledSelector:
    """A compiled selector; evaluate with :meth:`evaluate`."""

    expression: str
    rewritten: str
    program: Any  # cel.Program (untyped package)
    estimated_cost: int
    poisoned: str | None = None
    # Set when the expression is exactly ``device.driver == "<literal>"`` (either order), the
    # usual DeviceClass selector: it is then answered by comparing strings, which gives the same
    # result as cel-rust and spares the device its CEL context (~40 us to build).
    driver_equals: str | None = None

    def evaluate(self, activation: DeviceActivation) -> bool:
        """Evaluate against one device; raises :class:`CelRuntimeError` (never returns False on error)."""
        if self.poisoned is not None:
            raise CelRuntimeError(self.expression, self.poisoned)
        if activation.error is not None:
            raise CelRuntimeError(self.expression, activation.error)
        if self.driver_equals is not None:
            driver = activation.variables.get("driver")
            if isinstance(driver, str):
                return driver == self.driver_equals
        start = time.perf_counter()
        try:
            result = self.program.execute(activation.context())
        except Exception as exc:  # cel raises KeyError/TypeError/RuntimeError/ValueError...
            raise CelRuntimeError(self.expression, _runtime_message(exc)) from None
        finally:
            elapsed = time.perf_counter() - start
            if elapsed > RUNTIME_LIMIT_S:
                self.poisoned = f"operation cancelled: actual cost limit exceeded ({elapsed:.2f}s > {RUNTIME_LIMIT_S}s budget)"
        if self.poisoned is not None:
            raise CelRuntimeError(self.expression, self.poisoned)
        if not isinstance(result, bool):
            raise CelRuntimeError(self.expression, f"must evaluate to bool, got {_type_name(result)}")
        return result


_PY_FAILURE = re.compile(r"Function '([\w.]+)' error: Python function call failed: \w+: (.*)", re.DOTALL)


def _runtime_message(exc: Exception) -> str:
    """Shorten cel-rust's verbose messages to what the scheduler would say."""
    if isinstance(exc, KeyError):
        return f"no such key: {exc.args[0] if exc.args else ''}"
    text = str(exc)
    m = _PY_FAILURE.match(text)
    if m:
        text = f"{m.group(1)}(): {m.group(2)}"
    for noise in (". Check ", " CEL does not coerce"):
        text = text.split(noise)[0]
    return text.rstrip(". ")[:500]


_COMPILE_LOCK = threading.Lock()


@lru_cache(maxsize=2048)
def _compile_cached(expression: str) -> CompiledSelector | CelCompileError:
    # Errors are cached too: a broken class selector is evaluated per device.
    try:
        return _compile(expression)
    except CelCompileError as exc:
        return exc


def compile_selector(expression: str) -> CompiledSelector:
    """Compile (once, cached by text) a DRA selector. Raises :class:`CelCompileError`."""
    if not isinstance(expression, str):
        raise CelCompileError(str(expression), "CEL expression must be a string")
    with _COMPILE_LOCK:
        result = _compile_cached(expression)
    if isinstance(result, CelCompileError):
        raise result
    return result


def _compile(expression: str) -> CompiledSelector:
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise CelCompileError(expression, f"expression too long: {len(expression)} > {MAX_EXPRESSION_LENGTH} characters")
    if not expression.strip():
        raise CelCompileError(expression, "compilation failed: empty expression")
    try:
        ast = _Parser(expression).parse()
        rewritten_ast = _Rewriter().rw(ast)
    except (SyntaxError, RecursionError) as exc:
        message = exc.msg if isinstance(exc, SyntaxError) else "expression nested too deeply"
        raise CelCompileError(expression, f"compilation failed: {message}") from None
    wrong = _obviously_not_bool(ast)
    if wrong is not None:
        raise CelCompileError(expression, f"must evaluate to bool, not {wrong}")
    cost = _cost(rewritten_ast)
    if cost > MAX_COST:
        raise CelCostError(
            expression, f"estimated cost {cost} exceeds the limit of {MAX_COST} (nested comprehensions over large lists)"
        )
    rewritten = _unparse(rewritten_ast)
    try:
        program = cel.compile(rewritten)
    except Exception as exc:
        raise CelCompileError(expression, f"compilation failed: {exc}") from None
    return CompiledSelector(expression, rewritten, program, cost, driver_equals=_driver_equality(ast))


def _driver_equality(ast: _Node) -> str | None:
    """The literal of a ``device.driver == "..."`` selector, None for any other expression.

    Only plain quoted literals without escapes qualify, so the text between the quotes is the
    value; anything else (raw, bytes, triple-quoted, escapes, other operators) stays with CEL.
    """
    if not isinstance(ast, _Binary) or ast.op != "==":
        return None
    for field_side, lit_side in ((ast.left, ast.right), (ast.right, ast.left)):
        if (
            isinstance(field_side, _Select)
            and field_side.field == "driver"
            and not field_side.optional
            and not field_side.test
            and isinstance(field_side.operand, _Ident)
            and field_side.operand.name == "device"
            and isinstance(lit_side, _Lit)
            and lit_side.kind == "string"
        ):
            text = lit_side.text
            if (len(text) >= 2 and text[0] in "\"'" and text[-1] == text[0] and "\\" not in text
                    and not text.startswith(text[0] * 3)):
                return text[1:-1]
    return None


# --------------------------------------------------------------------------- activation


def split_qualified_name(name: str, driver: str) -> tuple[str, str]:
    """``domain/id`` -> (domain, id); an unqualified name belongs to ``driver``."""
    domain, sep, ident = name.partition("/")
    return (domain, ident) if sep else (driver, name)


_ATTRIBUTE_TYPES: dict[str, type] = {"int": int, "bool": bool, "string": str, "version": str}


def _attribute_value(raw: Any) -> Any:
    # Runs for every attribute of every device that meets CEL, hence the plain-dict fast path.
    if type(raw) is not dict and not isinstance(raw, Mapping):
        raise ValueError("attribute is not an object")
    kind = ""
    for k in _ATTRIBUTE_TYPES:
        if raw.get(k) is not None:
            if kind:
                kind = "?"
                break
            kind = k
    if kind in ("", "?"):
        raise ValueError("exactly one of int, bool, string, version must be set")
    value = raw[kind]
    if not isinstance(value, _ATTRIBUTE_TYPES[kind]) or (kind == "int" and isinstance(value, bool)):
        raise ValueError(f"{kind} attribute has a {type(value).__name__} value")
    if kind == "version":
        try:
            return semver_value(parse_semver(value))
        except SemverError as exc:
            raise ValueError(f"parse semantic version: {exc}") from None
    return value


class DeviceActivation:
    """Per-device CEL input, built once and reused for every expression.

    ``error`` is set when the device data itself is broken (bad attribute or
    capacity); the scheduler reports that as an evaluation error.
    """

    __slots__ = ("_context", "error", "variables")

    def __init__(self, variables: dict[str, Any], error: str | None) -> None:
        self.variables = variables
        self.error = error
        self._context: Any = None

    @property
    def has_context(self) -> bool:
        return self._context is not None

    def context(self) -> Any:
        # Building a cel.Context converts the dict into CEL values and wraps the functions on
        # first use (~40 us together), so it happens once per device and only for devices that
        # reach a CEL evaluation.  The context is published only after a first execution has
        # built its environment: cel.Context is not thread-safe while that cache is filled.
        ctx = self._context
        if ctx is None:
            with _CONTEXT_LOCK:
                ctx = self._context
                if ctx is None:
                    ctx = cel.Context(variables={"device": self.variables}, functions=FUNCTIONS)
                    _warm_up().execute(ctx)
                    self._context = ctx
        return ctx


_CONTEXT_LOCK = threading.Lock()


@lru_cache(maxsize=1)
def _warm_up() -> Any:
    return cel.compile("true")


def device_activation(
    driver: str,
    attributes: Mapping[str, Any] | None,
    capacity: Mapping[str, Any] | None,
    allow_multiple_allocations: bool = False,
) -> DeviceActivation:
    """Build the ``device`` variable from API-shaped attribute and capacity maps."""
    attrs: dict[str, dict[str, Any]] = {}
    caps: dict[str, dict[str, Any]] = {}
    errors: list[str] = []
    for name, raw in _items(attributes):
        try:
            value = _attribute_value(raw)
        except ValueError as exc:
            errors.append(f"attribute {name}: {exc}")
            continue
        domain, ident = split_qualified_name(str(name), driver)
        attrs.setdefault(domain, {})[ident] = value
    for name, raw in _items(capacity):
        try:
            value = raw.get("value") if type(raw) is dict or isinstance(raw, Mapping) else None
            q = parse_quantity(value)  # type: ignore[arg-type]
        except QuantityError as exc:
            errors.append(f"capacity {name}: {exc}")
            continue
        domain, ident = split_qualified_name(str(name), driver)
        caps.setdefault(domain, {})[ident] = quantity_value(q)
    variables = {
        "driver": driver,
        "attributes": attrs,
        "capacity": caps,
        "allowMultipleAllocations": bool(allow_multiple_allocations),
    }
    return DeviceActivation(variables, "; ".join(errors) or None)


def _items(value: Mapping[str, Any] | None) -> Iterable[tuple[str, Any]]:
    return value.items() if type(value) is dict or isinstance(value, Mapping) else ()
