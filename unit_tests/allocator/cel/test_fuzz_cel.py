"""Fuzzing DRA CEL selectors: any text compiles or fails with a typed error, and evaluation is bounded."""

from __future__ import annotations

import time

import pytest
from fuzzing import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from nodefix import build_devices

from dra_driver.allocator.cel.compile import compile_selector, device_activation
from dra_driver.allocator.cel.errors import CelCompileError, CelCostError, CelError, CelRuntimeError
from dra_driver.node.describe.devices import describe

DRIVER = "gpu.dra-driver.io"
DEVICE = describe(build_devices(), DRIVER, False)[0][0]
ACTIVATION = device_activation(DRIVER, DEVICE.get("attributes"), DEVICE.get("capacity"))
BROKEN = device_activation(DRIVER, {"x": {"int": "seven"}}, {"memory": {"value": "lots"}})
COMPILE_BUDGET_S = 2.0
EVAL_BUDGET_S = 2.0  # the selector's own runtime limit is 0.5 s; this adds slack for a loaded machine

ATOMS = st.sampled_from([
    "device.driver", f"device.attributes['{DRIVER}'].productName", f"device.attributes['{DRIVER}'].index",
    f"device.capacity['{DRIVER}'].memory", "device.attributes['other.io'].x", "device.allowMultipleAllocations",
    "1", "0", "-1", "9223372036854775807", "1.5", "'gpu'", "\"\"", "true", "false", "null", "[1, 2, 3]",
    "{'a': 1}", "quantity('10Gi')", "semver('1.2.3')", "lists.range(10)", "x", "device", "device.nope",
    "'a'.size()", "b'\\x00'", "1u", "duration('1s')",
])
OPS = st.sampled_from(["==", "!=", "<", ">", "<=", ">=", "&&", "||", "+", "-", "*", "/", "%", " in "])


def expressions() -> st.SearchStrategy[str]:
    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.tuples(inner, OPS, inner).map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
            inner.map(lambda e: f"!({e})"),
            inner.map(lambda e: f"({e})"),
            st.tuples(inner, inner, inner).map(lambda t: f"{t[0]} ? {t[1]} : {t[2]}"),
            inner.map(lambda e: f"lists.range(5).all(i, {e})"),
            inner.map(lambda e: f"[{e}].exists(v, v == {e})"),
            inner.map(lambda e: f"{e}.isGreaterThan(quantity('1'))"),
            inner.map(lambda e: f"has({e})"),
            inner.map(lambda e: f"{e}.matches('^a+$')"),
            st.tuples(inner, st.sampled_from([")", "(", "]", ".", ",", "'", "?"])).map(lambda t: t[0] + t[1]),
        )

    return st.recursive(ATOMS, extend, max_leaves=8)


def run(expression: str) -> None:
    start = time.monotonic()
    try:
        selector = compile_selector(expression)
    except CelCompileError as exc:
        assert time.monotonic() - start < COMPILE_BUDGET_S
        assert str(exc) and "Traceback" not in str(exc)
        return
    assert time.monotonic() - start < COMPILE_BUDGET_S
    for activation in (ACTIVATION, BROKEN):
        start = time.monotonic()
        try:
            result = selector.evaluate(activation)
        except CelRuntimeError as exc:
            assert "Traceback" not in str(exc)
        else:
            assert isinstance(result, bool)
        assert time.monotonic() - start < EVAL_BUDGET_S, f"{expression!r} ran {time.monotonic() - start:.2f}s"


@given(expressions())
def test_generated_expressions(expression: str) -> None:
    run(expression)


@given(st.text(max_size=200))
def test_arbitrary_text(expression: str) -> None:
    run(expression)


@settings(max_examples=examples(0.5))
@given(st.integers(1, 100_000), st.integers(1, 4))
def test_nested_comprehension_bombs(n: int, depth: int) -> None:
    body = "true"
    for level in range(depth):
        body = f"lists.range({n}).all(v{level}, {body})"
    run(body)


@pytest.mark.parametrize("expression", [
    "lists.range(1000).all(a, lists.range(1000).all(b, lists.range(1000).all(c, true)))",
    "lists.range(100000).map(a, lists.range(100000)).size() > 0",
    "lists.range(1000).map(x, 'aaaaaaaaaa' + 'aaaaaaaaaa').join('').size() > 0",
    "['a','b','c','d','e','f','g','h'].map(x, ['a','b','c','d','e','f','g','h'].map(y, "
    "['a','b','c','d','e','f','g','h'].map(z, x + y + z))).size() > 0",
    "'" + "a" * 9000 + "'.matches('(a+)+$')",
    "(" * 500 + "true" + ")" * 500,
    "!" * 5000 + "true",
    "device.attributes['" + DRIVER + "'].productName" + ".size()" * 2000 + " > 0",
    "x" * 20_000,
])
def test_cost_bombs_fail_typed_and_fast(expression: str) -> None:
    start = time.monotonic()
    try:
        selector = compile_selector(expression)
        selector.evaluate(ACTIVATION)
    except (CelCompileError, CelCostError, CelRuntimeError) as exc:
        assert isinstance(exc, CelError)
    assert time.monotonic() - start < 2 * EVAL_BUDGET_S


def test_cubic_comprehension_is_refused_at_compile_time() -> None:
    with pytest.raises(CelCostError):
        compile_selector("lists.range(1000).all(a, lists.range(1000).all(b, lists.range(1000).all(c, true)))")


def test_regression_range_inside_map_is_a_cost_error() -> None:
    # Found by test_cost_bombs_fail_typed_and_fast: the estimate counted lists.range(n) as 1, so
    # this compiled (estimated 400007) and evaluation tried to build 10**10 elements, killing the process.
    with pytest.raises(CelCostError):
        compile_selector("lists.range(100000).map(a, lists.range(100000)).size() > 0")
    assert compile_selector("lists.range(100).all(a, lists.range(100).exists(b, a == b))").evaluate(ACTIVATION)
