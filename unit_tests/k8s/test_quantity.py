"""Exact Kubernetes quantity parsing (dra_driver.k8s.quantity)."""

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dra_driver.k8s.quantity import Quantity, QuantityError, compare_quantities, is_quantity, parse_quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("80Gi", 80 * 2**30),
        ("40G", 40 * 10**9),
        ("7", 7),
        ("100m", Fraction(1, 10)),
        ("1.5Ki", 1536),
        ("1e3", 1000),
        ("1E-3", Fraction(1, 1000)),
        ("-2k", -2000),
        ("+3M", 3_000_000),
        (".5", Fraction(1, 2)),
        ("1Ei", 2**60),
        ("5n", Fraction(5, 10**9)),
        ("2u", Fraction(2, 10**6)),
    ],
)
def test_parse(text: str, value: Fraction) -> None:
    assert parse_quantity(text).value == value


@pytest.mark.parametrize("text", ["", "1K", "abc", "1Gi1", "Gi", "1 Gi", "1e99999", "--1", "1.2.3"])
def test_invalid(text: str) -> None:
    with pytest.raises(QuantityError):
        parse_quantity(text)
    assert not is_quantity(text)


def test_sub_nano_rounds_up() -> None:
    assert parse_quantity("0.0000000001").value == Fraction(1, 10**9)


def test_equality_across_suffixes() -> None:
    assert parse_quantity("1Gi") == parse_quantity("1024Mi")
    assert compare_quantities("1G", "1Gi") == -1
    assert compare_quantities("1000m", "1") == 0


def test_integer_helpers() -> None:
    assert parse_quantity("2k").as_integer() == 2000
    assert not parse_quantity("1.5").is_integer()
    assert not parse_quantity("10Ei").is_integer()  # beyond int64
    with pytest.raises(QuantityError):
        parse_quantity("1.5").as_integer()
    assert parse_quantity("-1").sign() == -1
    assert (parse_quantity("1Gi") + parse_quantity("1Gi")).value == 2**31


def test_not_a_string() -> None:
    with pytest.raises(QuantityError):
        parse_quantity(1.5)  # type: ignore[arg-type]
    assert parse_quantity(5) == Quantity(Fraction(5))
    assert not is_quantity(5)


@given(st.integers(min_value=0, max_value=2**40), st.sampled_from(["", "k", "M", "Ki", "Mi", "Gi", "m"]))
def test_ordering_matches_value(n: int, suffix: str) -> None:
    q = parse_quantity(f"{n}{suffix}")
    assert q <= parse_quantity(f"{n + 1}{suffix}")
    assert q.canonical() == str(q.value)
