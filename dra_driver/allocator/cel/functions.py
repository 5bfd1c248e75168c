"""The Kubernetes CEL library on top of cel-rust: quantity and semver values, and the functions the
scheduler's environment adds (``quantity()``, ``compareTo()``, ``semver()``, ``lists``, ``strings``...)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

from dra_driver.allocator.cel.package import EXTENSIONS
from dra_driver.k8s.quantity import Quantity, QuantityError, is_quantity, parse_quantity

QUANTITY_KEY = "kubernetes.Quantity"
SEMVER_KEY = "kubernetes.Semver"


# --------------------------------------------------------------------------- semver


class SemverError(ValueError):
    pass


_UINT64_MAX = 2**64 - 1


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
    for number in (m.group(1), m.group(2), m.group(3), *(p for p in pre if p.isdigit())):
        if int(number) > _UINT64_MAX:
            # The scheduler's semver type holds each number in a uint64 (blang/semver's Parse).
            raise SemverError(f'strconv.ParseUint: parsing "{number}": value out of range')
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
    raise TypeError(f"no such overload: expected a quantity, got {type_name(value)}")


def _as_semver(value: Any) -> Semver:
    if isinstance(value, dict) and SEMVER_KEY in value:
        return parse_semver(value[SEMVER_KEY])
    raise TypeError(f"no such overload: expected a semver, got {type_name(value)}")


def type_name(value: Any) -> str:
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


MAX_RANGE = 100_000


def _fn_lists_range(n: Any) -> list[int]:
    # Bounded: a huge range would allocate before any cost check could react.
    if not isinstance(n, int) or isinstance(n, bool) or n > MAX_RANGE:
        raise ValueError(f"lists.range: argument must be an int <= {MAX_RANGE}")
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
MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
KNOWN_FUNCTIONS = _NATIVE_FUNCTIONS | frozenset(FUNCTIONS)
NAMESPACES = frozenset({"optional", "sets", "lists", "strings", "cel"})
TYPE_IDENTS = frozenset({"int", "uint", "double", "string", "bytes", "bool", "list", "map", "null_type", "type"})
