"""Lexer, parser and AST of the CEL subset the scheduler accepts, the rewrites cel-rust needs, and
the way back to source text."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from dra_driver.allocator.cel.functions import KNOWN_FUNCTIONS, MACROS, NAMESPACES, TYPE_IDENTS

MAX_EXPRESSION_LENGTH = 10 * 1024
MAX_NESTING = 100


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
class Node:
    pass


@dataclass
class Lit(Node):
    text: str
    kind: str  # int, uint, double, string, bytes, bool, null


@dataclass
class Ident(Node):
    name: str


@dataclass
class Select(Node):
    operand: Node
    field: str
    optional: bool = False
    test: bool = False


@dataclass
class Index(Node):
    operand: Node
    index: Node
    optional: bool = False


@dataclass
class Call(Node):
    fn: str
    target: Node | None
    args: list[Node]


@dataclass
class List(Node):
    items: list[Node]


@dataclass
class Map(Node):
    entries: list[tuple[Node, Node]]


@dataclass
class Unary(Node):
    op: str
    operand: Node


@dataclass
class Binary(Node):
    op: str
    left: Node
    right: Node


@dataclass
class Cond(Node):
    cond: Node
    then: Node
    other: Node


@dataclass
class Comp(Node):
    macro: str
    target: Node
    var: str
    body: Node


_REL_OPS = frozenset({"<", "<=", ">", ">=", "==", "!=", "in"})


class Parser:
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

    def parse(self) -> Node:
        node = self.expr()
        if self.peek().kind != "eof":
            tok = self.peek()
            raise SyntaxError(f"unexpected {tok.text!r} at offset {tok.pos}")
        return node

    def expr(self) -> Node:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise SyntaxError("expression nested too deeply")
        node = self.or_expr()
        if self.accept("?"):
            then = self.or_expr()
            self.expect(":")
            node = Cond(node, then, self.expr())
        self.depth -= 1
        return node

    def or_expr(self) -> Node:
        node = self.and_expr()
        while self.accept("||"):
            node = Binary("||", node, self.and_expr())
        return node

    def and_expr(self) -> Node:
        node = self.relation()
        while self.accept("&&"):
            node = Binary("&&", node, self.relation())
        return node

    def relation(self) -> Node:
        node = self.addition()
        while self.peek().text in _REL_OPS and self.peek().kind in ("op", "ident"):
            op = self.take().text
            node = Binary(op, node, self.addition())
        return node

    def addition(self) -> Node:
        node = self.multiplication()
        while self.peek().kind == "op" and self.peek().text in ("+", "-"):
            op = self.take().text
            node = Binary(op, node, self.multiplication())
        return node

    def multiplication(self) -> Node:
        node = self.unary()
        while self.peek().kind == "op" and self.peek().text in ("*", "/", "%"):
            op = self.take().text
            node = Binary(op, node, self.unary())
        return node

    def unary(self) -> Node:
        if self.peek().kind == "op" and self.peek().text in ("!", "-"):
            op = self.take().text
            self.depth += 1
            if self.depth > MAX_NESTING:
                raise SyntaxError("expression nested too deeply")
            node = Unary(op, self.unary())
            self.depth -= 1
            return node
        return self.member()

    def member(self) -> Node:
        node = self.primary()
        while True:
            if self.accept("."):
                name = self.ident()
                node = Call(name, node, self.args(")")) if self.accept("(") else Select(node, name)
            elif self.accept(".?"):
                node = Select(node, self.ident(), optional=True)
            elif self.accept("["):
                optional = self.accept("?")
                index = self.expr()
                self.expect("]")
                node = Index(node, index, optional)
            else:
                return node

    def ident(self) -> str:
        tok = self.take()
        if tok.kind != "ident":
            raise SyntaxError(f"expected identifier at offset {tok.pos}")
        return tok.text

    def args(self, close: str) -> list[Node]:
        items: list[Node] = []
        if self.accept(close):
            return items
        while True:
            items.append(self.expr())
            if self.accept(close):
                return items
            self.expect(",")
            if self.accept(close):  # trailing comma
                return items

    def primary(self) -> Node:
        tok = self.take()
        if tok.kind == "number":
            text = tok.text
            is_hex = text.lower().startswith("0x")
            kind = "uint" if text[-1] in "uU" else "double" if not is_hex and any(c in text for c in ".eE") else "int"
            return Lit(text, kind)
        if tok.kind == "string":
            # The prefix is what precedes the quote: "b..." is a string, b"..." bytes.
            prefix = tok.text[: len(tok.text) - len(tok.text.lstrip("rRbB"))]
            return Lit(tok.text, "bytes" if "b" in prefix.lower() else "string")
        if tok.kind == "ident":
            if tok.text in ("true", "false"):
                return Lit(tok.text, "bool")
            if tok.text == "null":
                return Lit(tok.text, "null")
            if self.accept("("):
                return Call(tok.text, None, self.args(")"))
            if self.peek().text == "{" and self.peek().kind == "op":
                raise SyntaxError("message construction is not supported in DRA selectors")
            return Ident(tok.text)
        if tok.kind == "op":
            if tok.text == "(":
                node = self.expr()
                self.expect(")")
                return node
            if tok.text == "[":
                return List(self.args("]"))
            if tok.text == "{":
                return Map(self.map_entries())
            if tok.text == ".":
                return self.primary()  # leading-dot absolute name
        raise SyntaxError(f"unexpected {tok.text or 'end of input'!r} at offset {tok.pos}")

    def map_entries(self) -> list[tuple[Node, Node]]:
        entries: list[tuple[Node, Node]] = []
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


def _some(node: Node) -> Node:
    return Call("of", Ident("optional"), [node])


def _none() -> Node:
    return Call("none", Ident("optional"), [])


def _string_lit(value: str) -> Lit:
    return Lit('"' + value + '"', "string")


@dataclass
class Rewriter:
    """Turns the Kubernetes dialect into what cel-rust understands; checks names."""

    scope: list[str] = field(default_factory=list)
    optional_nodes: set[int] = field(default_factory=set)

    def is_device(self, node: Node) -> bool:
        return isinstance(node, Ident) and node.name == "device" and "device" not in self.scope

    def is_domain_map(self, node: Node) -> bool:
        return (
            isinstance(node, Select)
            and not node.optional
            and node.field in ("attributes", "capacity")
            and self.is_device(node.operand)
        )

    def mark(self, node: Node) -> Node:
        self.optional_nodes.add(id(node))
        return node

    def is_optional(self, node: Node) -> bool:
        return id(node) in self.optional_nodes

    def rw(self, node: Node) -> Node:
        if isinstance(node, Lit):
            return node
        if isinstance(node, Ident):
            return self.ident(node)
        if isinstance(node, Select):
            return self.select(node)
        if isinstance(node, Index):
            return self.index(node)
        if isinstance(node, Call):
            return self.call(node)
        if isinstance(node, List):
            return List([self.rw(x) for x in node.items])
        if isinstance(node, Map):
            return Map([(self.rw(k), self.rw(v)) for k, v in node.entries])
        if isinstance(node, Unary):
            return Unary(node.op, self.rw(node.operand))
        if isinstance(node, Binary):
            return Binary(node.op, self.rw(node.left), self.rw(node.right))
        if isinstance(node, Cond):
            return Cond(self.rw(node.cond), self.rw(node.then), self.rw(node.other))
        raise SyntaxError(f"unsupported expression node {type(node).__name__}")

    def ident(self, node: Ident) -> Node:
        if node.name in self.scope or node.name == "device" or node.name in TYPE_IDENTS:
            return node
        raise SyntaxError(f"undeclared reference to {node.name!r}")

    def select(self, node: Select) -> Node:
        if node.test:
            return Select(self.rw(node.operand), node.field, test=True)
        operand = self.rw(node.operand)
        if self.is_domain_map(node.operand) and not node.optional:
            # device.attributes.dom -> empty map for an unknown domain.
            return Cond(Binary("in", _string_lit(node.field), operand), Select(operand, node.field), Map([]))
        if self.is_optional(operand):
            inner = Call("value", operand, [])
            present: Node = Call("hasValue", operand, [])
            if node.optional:
                present = Binary("&&", present, Select(inner, node.field, test=True))
            return self.mark(Cond(present, _some(Select(inner, node.field)), _none()))
        if node.optional:
            if self.is_domain_map(node.operand):
                return self.mark(_some(self.select(Select(node.operand, node.field))))
            return self.mark(Cond(Select(operand, node.field, test=True), _some(Select(operand, node.field)), _none()))
        return Select(operand, node.field)

    def index(self, node: Index) -> Node:
        operand = self.rw(node.operand)
        key = self.rw(node.index)
        if self.is_domain_map(node.operand):
            lookup = Cond(Binary("in", key, operand), Index(operand, key), Map([]))
            return self.mark(_some(lookup)) if node.optional else lookup
        if self.is_optional(operand):
            inner = Call("value", operand, [])
            present: Node = Call("hasValue", operand, [])
            if node.optional:
                present = Binary("&&", present, Binary("in", key, inner))
            return self.mark(Cond(present, _some(Index(inner, key)), _none()))
        if node.optional:
            return self.mark(Cond(Binary("in", key, operand), _some(Index(operand, key)), _none()))
        return Index(operand, key)

    def call(self, node: Call) -> Node:
        target = node.target
        if target is None and node.fn == "has":
            return self.has(node)
        if isinstance(target, Ident) and target.name == "cel" and node.fn == "bind":
            return self.bind(node)
        if target is not None and node.fn in MACROS and node.args and isinstance(node.args[0], Ident):
            return self.macro(node, target)
        name = node.fn
        if isinstance(target, Ident) and target.name in NAMESPACES and target.name not in self.scope:
            name = f"{target.name}.{node.fn}"
            if name not in KNOWN_FUNCTIONS:
                raise SyntaxError(f"undeclared reference to {name!r}")
            result = Call(node.fn, target, [self.rw(a) for a in node.args])
            return self.mark(result) if name.startswith("optional.") else result
        if name not in KNOWN_FUNCTIONS:
            raise SyntaxError(f"undeclared reference to {name!r}")
        new_target = self.rw(target) if target is not None else None
        result = Call(node.fn, new_target, [self.rw(a) for a in node.args])
        if name in ("first", "last") or (name == "or" and new_target is not None and self.is_optional(new_target)):
            return self.mark(result)
        return result

    def has(self, node: Call) -> Node:
        if len(node.args) != 1 or not isinstance(node.args[0], Select) or node.args[0].optional:
            raise SyntaxError("invalid argument to has() macro")
        arg = node.args[0]
        return Select(self.rw(arg.operand), arg.field, test=True)

    def bind(self, node: Call) -> Node:
        if len(node.args) != 3 or not isinstance(node.args[0], Ident):
            raise SyntaxError("cel.bind() requires (identifier, init, expression)")
        var = node.args[0].name
        init = self.rw(node.args[1])
        self.scope.append(var)
        body = self.rw(node.args[2])
        self.scope.pop()
        # [init].map(var, body)[0] evaluates body once with var bound to init.
        return Index(Comp("map", List([init]), var, body), Lit("0", "int"))

    def macro(self, node: Call, target: Node) -> Node:
        if len(node.args) != 2:
            raise SyntaxError(f"{node.fn}() with {len(node.args)} arguments (two-variable comprehensions unsupported)")
        var = node.args[0]
        assert isinstance(var, Ident)
        new_target = self.rw(target)
        self.scope.append(var.name)
        body = self.rw(node.args[1])
        self.scope.pop()
        return Comp(node.fn, new_target, var.name, body)


# --------------------------------------------------------------------------- unparse


def children(node: Node) -> list[Node]:
    """The nodes directly under ``node``, in field order (lists of nodes and of node tuples too)."""
    out: list[Node] = []
    for value in vars(node).values():
        if isinstance(value, Node):
            out.append(value)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, Node):
                    out.append(item)
                elif isinstance(item, tuple):
                    out.extend(x for x in item if isinstance(x, Node))
    return out


def unparse(node: Node) -> str:
    if isinstance(node, Lit):
        return node.text
    if isinstance(node, Ident):
        return node.name
    if isinstance(node, Select):
        inner = f"{_target(node.operand)}.{node.field}"
        return f"has({inner})" if node.test else inner
    if isinstance(node, Index):
        return f"{_target(node.operand)}[{unparse(node.index)}]"
    if isinstance(node, Call):
        args = ", ".join(unparse(a) for a in node.args)
        if node.target is None:
            return f"{node.fn}({args})"
        return f"{_target(node.target)}.{node.fn}({args})"
    if isinstance(node, Comp):
        return f"{_target(node.target)}.{node.macro}({node.var}, {unparse(node.body)})"
    if isinstance(node, List):
        return "[" + ", ".join(unparse(x) for x in node.items) + "]"
    if isinstance(node, Map):
        return "{" + ", ".join(f"{unparse(k)}: {unparse(v)}" for k, v in node.entries) + "}"
    if isinstance(node, Unary):
        if node.op == "-" and isinstance(node.operand, Lit) and node.operand.kind in ("int", "double"):
            return f"-{node.operand.text}"  # keeps -9223372036854775808 representable
        return f"{node.op}({unparse(node.operand)})"
    if isinstance(node, Binary):
        return f"({unparse(node.left)} {node.op} {unparse(node.right)})"
    if isinstance(node, Cond):
        return f"({unparse(node.cond)} ? {unparse(node.then)} : {unparse(node.other)})"
    raise TypeError(type(node).__name__)


def _target(node: Node) -> str:
    text = unparse(node)
    if isinstance(node, (Unary, Lit)) and not (isinstance(node, Lit) and node.kind in ("string", "bytes")):
        return f"({text})"
    return text
