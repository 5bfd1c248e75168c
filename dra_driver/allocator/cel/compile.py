"""Compile a selector (parse, check, estimate, hand to cel-rust) and build the activation of a device."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from dra_driver.allocator.cel.cost import MAX_COST, estimate_cost, obviously_not_bool
from dra_driver.allocator.cel.errors import CelCompileError, CelCostError, CelRuntimeError
from dra_driver.allocator.cel.functions import (
    FUNCTIONS,
    NAMESPACES,
    SemverError,
    parse_semver,
    quantity_value,
    semver_value,
    type_name,
)
from dra_driver.allocator.cel.package import cel
from dra_driver.allocator.cel.reads import WHOLE, Reads, selector_reads
from dra_driver.allocator.cel.syntax import MAX_EXPRESSION_LENGTH, Binary, Ident, Lit, Node, Parser, Rewriter, Select, unparse
from dra_driver.k8s.quantity import QuantityError, parse_quantity

RUNTIME_LIMIT_S = 0.5


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
    # result as cel-rust and spares the device its CEL context (far costlier to build than the
    # comparison; docs/benchmarks.md#the-codes-figures).
    driver_equals: str | None = None
    # The parts of ``device`` the outcome depends on (see cel/reads.py).
    reads: Reads = WHOLE
    # The program calls none of the Kubernetes functions: it runs on the plain variables, without
    # a cel.Context (whose conversion costs more than the evaluation).
    plain: bool = False

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
        result = self._execute(activation)
        if result[1] > RUNTIME_LIMIT_S:
            # Once more before condemning the expression for good: a garbage collection or a busy
            # machine can stall one run past the limit, and a poisoned class selector would fail
            # every claim of the class until the process restarts.
            result = self._execute(activation)
            if result[1] > RUNTIME_LIMIT_S:
                self.poisoned = (f"operation cancelled: actual cost limit exceeded ({result[1]:.2f}s > "
                                 f"{RUNTIME_LIMIT_S}s budget)")
                raise CelRuntimeError(self.expression, self.poisoned)
        outcome = result[0]
        if isinstance(outcome, CelRuntimeError):
            raise _unreadable(activation, outcome)
        return _as_bool(self.expression, outcome)

    def _execute(self, activation: DeviceActivation) -> tuple[Any, float]:
        """(result or CelRuntimeError, seconds taken)."""
        start = time.perf_counter()
        try:
            result = self.program.execute({"device": activation.variables} if self.plain else activation.context())
        except Exception as exc:  # cel raises KeyError/TypeError/RuntimeError/ValueError...
            result = CelRuntimeError(self.expression, _runtime_message(exc))
        return result, time.perf_counter() - start


def _unreadable(activation: DeviceActivation, error: CelRuntimeError) -> CelRuntimeError:
    """``error`` in kube-scheduler 1.38's words where the key it missed is an attribute the device's
    input left out as unreadable (see :func:`device_activation` ``on_read``)."""
    missing = error.message.removeprefix("no such key: ") if error.message.startswith("no such key: ") else None
    if missing is None or missing not in activation.unreadable:
        return error
    return CelRuntimeError(error.expression, f"attribute {missing}: value is invalid or its type is not supported by "
                                             "this version")


def _as_bool(expression: str, result: Any) -> bool:
    if not isinstance(result, bool):
        raise CelRuntimeError(expression, f"must evaluate to bool, got {type_name(result)}")
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
        return compile_uncached(expression)
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


def compile_uncached(expression: str) -> CompiledSelector:
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise CelCompileError(expression, f"expression too long: {len(expression)} > {MAX_EXPRESSION_LENGTH} characters")
    if not expression.strip():
        raise CelCompileError(expression, "compilation failed: empty expression")
    try:
        ast = Parser(expression).parse()
        rewritten_ast = Rewriter().rw(ast)
    except (SyntaxError, RecursionError) as exc:
        message = exc.msg if isinstance(exc, SyntaxError) else "expression nested too deeply"
        raise CelCompileError(expression, f"compilation failed: {message}") from None
    wrong = obviously_not_bool(ast)
    if wrong is not None:
        raise CelCompileError(expression, f"must evaluate to bool, not {wrong}")
    cost = estimate_cost(rewritten_ast)
    if cost > MAX_COST:
        raise CelCostError(
            expression, f"estimated cost {cost} exceeds the limit of {MAX_COST} (nested comprehensions over large lists)"
        )
    rewritten = unparse(rewritten_ast)
    try:
        program = cel.compile(rewritten)
    except Exception as exc:  # what it catches: cel-rust's compile errors, of no documented type
        raise CelCompileError(expression, f"compilation failed: {exc}") from None
    return CompiledSelector(expression, rewritten, program, cost, driver_equals=_driver_equality(ast),
                            reads=selector_reads(expression), plain=_plain(program))


def _plain(program: Any) -> bool:
    """Whether ``program`` calls none of the Kubernetes functions (``lists.range`` is ``range`` on
    the variable ``lists`` to cel-rust)."""
    names = {name.rpartition(".")[2] for name in FUNCTIONS}
    return names.isdisjoint(program.functions()) and NAMESPACES.isdisjoint(program.variables())


def _driver_equality(ast: Node) -> str | None:
    """The literal of a ``device.driver == "..."`` selector, None for any other expression.

    Only plain quoted literals without escapes qualify, so the text between the quotes is the
    value; anything else (raw, bytes, triple-quoted, escapes, other operators) stays with CEL.
    """
    if not isinstance(ast, Binary) or ast.op != "==":
        return None
    for field_side, lit_side in ((ast.left, ast.right), (ast.right, ast.left)):
        if (
            isinstance(field_side, Select)
            and field_side.field == "driver"
            and not field_side.optional
            and not field_side.test
            and isinstance(field_side.operand, Ident)
            and field_side.operand.name == "device"
            and isinstance(lit_side, Lit)
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
    """A device's CEL input, for the expressions evaluated on it.

    ``error`` is set when the device data itself is broken (bad attribute or
    capacity); the scheduler reports that as an evaluation error. ``unreadable``: the identifiers
    of attributes left out because they do not convert (only with ``on_read``, see
    :func:`device_activation`).
    """

    __slots__ = ("error", "unreadable", "variables")

    def __init__(self, variables: dict[str, Any], error: str | None, unreadable: frozenset[str] = frozenset()) -> None:
        self.variables = variables
        self.error = error
        self.unreadable = unreadable

    def context(self) -> Any:
        """The calling thread's cel.Context, holding this device: execute with it at once.

        A context wraps every function on creation (a cel.Context is also not thread-safe while
        it fills its caches), so each thread keeps one and only the ``device`` variable changes."""
        ctx = getattr(_THREAD, "context", None)
        if ctx is None:
            ctx = _THREAD.context = cel.Context(variables={"device": self.variables}, functions=FUNCTIONS)
        else:
            ctx.add_variable("device", self.variables)
        return ctx


_THREAD = threading.local()


def device_activation(
    driver: str,
    attributes: Mapping[str, Any] | None,
    capacity: Mapping[str, Any] | None,
    allow_multiple_allocations: bool = False,
    qualified_first: bool = False,
    on_read: bool = False,
) -> DeviceActivation:
    """Build the ``device`` variable from API-shaped attribute and capacity maps.

    Where a device publishes both ``x`` and ``<driver>/x``, the later of the two as published
    fills the field, or with ``qualified_first`` (kube-scheduler 1.38) always ``<driver>/x``.

    An attribute that does not convert (a version whose numbers semver cannot hold) is an error of
    the whole input, failing every selector on the device, as kube-scheduler 1.36 and 1.37 convert
    every attribute first.  With ``on_read`` (the rules' ``cel_converts_on_read``, 1.38) it is left
    out instead and only an expression that reads it fails, in 1.38's words; ``has()`` of it is
    then false where 1.38 fails too (the one read that tells the two apart)."""
    attrs: dict[str, dict[str, Any]] = {}
    caps: dict[str, dict[str, Any]] = {}
    errors: list[str] = []
    unreadable: set[str] = set()
    for name, raw in _items(attributes):
        if qualified_first and _shadowed(str(name), driver, attributes):
            continue
        domain, ident = split_qualified_name(str(name), driver)
        try:
            value = _attribute_value(raw)
        except ValueError as exc:
            if on_read:
                unreadable.add(ident)
            else:
                errors.append(f"attribute {name}: {exc}")
            continue
        attrs.setdefault(domain, {})[ident] = value
    for name, raw in _items(capacity):
        if qualified_first and _shadowed(str(name), driver, capacity):
            continue
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
    return DeviceActivation(variables, "; ".join(errors) or None, frozenset(unreadable))


def _shadowed(name: str, driver: str, entries: Mapping[str, Any] | None) -> bool:
    """Whether ``name`` is unqualified and ``entries`` also hold it as ``<driver>/name``, which wins."""
    return "/" not in name and entries is not None and f"{driver}/{name}" in entries


def _items(value: Mapping[str, Any] | None) -> Iterable[tuple[str, Any]]:
    return value.items() if type(value) is dict or isinstance(value, Mapping) else ()
