"""Exact Kubernetes ``resource.Quantity`` parsing and arithmetic.

The kube-scheduler compares capacities and counters with arbitrary-precision
decimals, so this module uses :class:`fractions.Fraction` throughout: floats
would make ``"1Gi" == "1073741824"`` or counter sums order-dependent.

Accepted syntax (as ``k8s.io/apimachinery/pkg/api/resource.ParseQuantity``):
``[+-]<digits>[.<digits>]<suffix>`` where suffix is one of the binary SI
suffixes ``Ki Mi Gi Ti Pi Ei``, the decimal SI suffixes ``n u m "" k M G T P E``
or a decimal exponent ``e<int>`` / ``E<int>``.  Values finer than one nano
unit are rounded up to the next nano unit, as the API server does.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

__all__ = [
    "Quantity",
    "QuantityError",
    "compare_quantities",
    "format_canonical",
    "is_quantity",
    "parse_quantity",
]

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_NUMBER = re.compile(r"([+-]?)(\d*)(?:\.(\d*))?")
_EXPONENT = re.compile(r"[eE]([+-]?\d+)")
_NANO = Fraction(1, 10**9)
_CANONICAL_BINARY = ((6, "Ei"), (5, "Pi"), (4, "Ti"), (3, "Gi"), (2, "Mi"), (1, "Ki"))
_CANONICAL_DECIMAL = ((6, "E"), (5, "P"), (4, "T"), (3, "G"), (2, "M"), (1, "k"))
# Longest quantity string we bother to parse; real ones are a few characters.
# The bound keeps a hostile "1e999999999" from allocating a huge integer.
_MAX_TEXT = 256
_MAX_EXPONENT = 1000
_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)


class QuantityError(ValueError):
    """Raised for a string that is not a valid Kubernetes quantity."""


@dataclass(frozen=True, order=False)
class Quantity:
    """An exact quantity value. ``text`` is the original spelling (for messages)."""

    value: Fraction
    text: str = ""

    def __eq__(self, other: object) -> bool:
        # Quantities are equal when their values are: "1Gi" == "1024Mi".
        return isinstance(other, Quantity) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)

    def __lt__(self, other: Quantity) -> bool:
        return self.value < other.value

    def __le__(self, other: Quantity) -> bool:
        return self.value <= other.value

    def __gt__(self, other: Quantity) -> bool:
        return self.value > other.value

    def __ge__(self, other: Quantity) -> bool:
        return self.value >= other.value

    def __add__(self, other: Quantity) -> Quantity:
        return Quantity(self.value + other.value)

    def __sub__(self, other: Quantity) -> Quantity:
        return Quantity(self.value - other.value)

    def compare(self, other: Quantity) -> int:
        """-1, 0 or 1, like ``Quantity.Cmp``."""
        return (self.value > other.value) - (self.value < other.value)

    def sign(self) -> int:
        return (self.value > 0) - (self.value < 0)

    def is_integer(self) -> bool:
        """True when the value is integral and fits in int64 (``Quantity.AsInt64`` succeeds)."""
        return self.value.denominator == 1 and _INT64_MIN <= self.value.numerator <= _INT64_MAX

    def as_integer(self) -> int:
        if not self.is_integer():
            raise QuantityError(f"cannot convert value to integer: {self}")
        return self.value.numerator

    def as_float(self) -> float:
        return float(self.value)

    def canonical(self) -> str:
        """A spelling that is equal for equal values (used as CEL identity)."""
        return str(self.value)

    def __str__(self) -> str:
        return self.text or format_quantity(self.value)


def format_quantity(value: Fraction) -> str:
    """Render an exact value as a plain decimal quantity string (``1.5``, ``250m``)."""
    if value.denominator == 1:
        return str(value.numerator)
    milli = value * 1000
    if milli.denominator == 1:
        return f"{milli.numerator}m"
    nano = math.ceil(value / _NANO)
    return f"{nano}n"


def format_canonical(value: int, binary: bool = True) -> str:
    """A non-negative integer as the apiserver's canonical Quantity string.

    Binary (bytes): the largest power-of-1024 suffix that divides exactly (``80Gi``, ``81559Mi``);
    like the apiserver, values below 1024 are written in decimal-SI form. Decimal: the largest
    power-of-1000 suffix that divides exactly (``14``, ``1k``).
    """
    if value < 0:
        raise ValueError("quantities here are non-negative")
    if value == 0:
        return "0"
    if binary and value >= 1024:
        for power, suffix in _CANONICAL_BINARY:
            if value % (1024**power) == 0:
                return f"{value // 1024**power}{suffix}"
        return str(value)
    for power, suffix in _CANONICAL_DECIMAL:
        if value % (1000**power) == 0:
            return f"{value // 1000**power}{suffix}"
    return str(value)


def _round_up_to_nano(value: Fraction) -> Fraction:
    if (value / _NANO).denominator == 1:
        return value
    return Fraction(math.ceil(value / _NANO)) * _NANO


def _split_number(text: str) -> tuple[Fraction, str]:
    match = _NUMBER.match(text)
    if match is None:  # pragma: no cover - the pattern matches the empty prefix
        raise QuantityError(f"invalid quantity {text!r}")
    sign, whole, frac = match.group(1), match.group(2), match.group(3)
    if not whole and not frac:
        raise QuantityError(f"invalid quantity {text!r}: missing digits")
    digits = (whole or "0") + (frac or "")
    number = Fraction(int(digits), 10 ** len(frac or ""))
    return (-number if sign == "-" else number), text[match.end() :]


def _suffix_factor(suffix: str, text: str) -> Fraction:
    if suffix in _BINARY:
        return Fraction(_BINARY[suffix])
    if suffix in _DECIMAL:
        return Fraction(10) ** _DECIMAL[suffix]
    exp = _EXPONENT.fullmatch(suffix)
    if exp is None:
        raise QuantityError(f"invalid quantity {text!r}: unknown suffix {suffix!r}")
    power = int(exp.group(1))
    if abs(power) > _MAX_EXPONENT:
        raise QuantityError(f"invalid quantity {text!r}: exponent out of range")
    return Fraction(10) ** power


@lru_cache(maxsize=4096)
def _parse_text(text: str) -> Quantity:
    if not text or len(text) > _MAX_TEXT:
        raise QuantityError(f"invalid quantity {text!r}")
    number, suffix = _split_number(text)
    return Quantity(_round_up_to_nano(number * _suffix_factor(suffix, text)), text)


def parse_quantity(value: str | int | Quantity) -> Quantity:
    """Parse a quantity string (or pass an int/Quantity through). Raises :class:`QuantityError`."""
    if isinstance(value, Quantity):
        return value
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise QuantityError(f"quantity must be a string, got {type(value).__name__}")
    if isinstance(value, int):
        return Quantity(Fraction(value), str(value))
    return _parse_text(value)


def is_quantity(value: object) -> bool:
    """True when ``value`` is a string that parses as a quantity."""
    if not isinstance(value, str):
        return False
    try:
        _parse_text(value)
    except QuantityError:
        return False
    return True


def compare_quantities(a: str | int | Quantity, b: str | int | Quantity) -> int:
    """Compare two quantities exactly: -1, 0 or 1."""
    return parse_quantity(a).compare(parse_quantity(b))
