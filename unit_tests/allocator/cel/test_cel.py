"""The DRA CEL environment (dra_driver.allocator.cel)."""

import threading
import time
from typing import Any
from unittest import mock

import pytest

from dra_driver.allocator.cel import compile as cel_compile
from dra_driver.allocator.cel.compile import DeviceActivation, compile_selector, device_activation
from dra_driver.allocator.cel.cost import MAX_COST
from dra_driver.allocator.cel.errors import CelCompileError, CelCostError, CelRuntimeError
from dra_driver.allocator.cel.functions import SemverError, parse_semver

D = "gpu.dra-driver.io"


@pytest.fixture(scope="module")
def act() -> DeviceActivation:
    return device_activation(
        D,
        {
            "model": {"string": "H100"},
            "index": {"int": 3},
            "numa.example.com/node": {"int": 1},
            "driverVersion": {"version": "550.54.15"},
            "mig": {"bool": True},
        },
        {"memory": {"value": "80Gi"}, "example.com/bw": {"value": "100G"}},
        allow_multiple_allocations=False,
    )


def ev(expr: str, act: DeviceActivation) -> bool:
    return compile_selector(expr).evaluate(act)


@pytest.mark.parametrize(
    "expr",
    [
        f'device.driver == "{D}"',
        f'device.attributes["{D}"].model == "H100"',
        'device.attributes["numa.example.com"].node == 1',  # qualified name split at "/"
        f'device.capacity["{D}"].memory.compareTo(quantity("40Gi")) >= 0',
        f'device.capacity["{D}"].memory == quantity("81920Mi")',  # quantity equality is by value
        f'!device.capacity["{D}"].memory.isGreaterThan(quantity("81Gi"))',
        f'device.capacity["{D}"].memory.isLessThan(quantity("81Gi"))',
        'device.capacity["example.com"].bw.asInteger() == 100000000000',
        'quantity("1Gi").add(quantity("1Gi")).sub(1) == quantity("2147483647")',
        'quantity("1.5").asApproximateFloat() == 1.5 && !quantity("1.5").isInteger()',
        'quantity("-1").sign() == -1 && isQuantity("1Gi") && !isQuantity("1K")',
        f'device.attributes["{D}"].driverVersion.isGreaterThan(semver("550.0.0"))',
        f'device.attributes["{D}"].driverVersion.major() == 550 && device.attributes["{D}"].driverVersion.minor() == 54',
        'semver("v1.2", true).compareTo(semver("1.2.0")) == 0 && semver("1.2.3").patch() == 3',
        'isSemver("1.2.3") && !isSemver("1.2") && isSemver("v1.2", true)',
        'semver("1.0.0-alpha").isLessThan(semver("1.0.0-alpha.1")) && semver("1.0.0-rc.1").isLessThan(semver("1.0.0"))',
        f'cel.bind(g, device.attributes["{D}"], g.mig && g.model == "H100")',
        f'device.attributes["{D}"].model.lowerAscii() == "h100"',
        '"a,b".split(",").size() == 2 && sets.contains([1, 2, 3], [2]) && [1, 2].indexOf(2) == 1',
        f'device.attributes["{D}"].?nokey.orValue(7) == 7',
        f'device.attributes["{D}"].?index.orValue(7) == 3',
        f'device.attributes[?"{D}"].hasValue()',
        f'device.attributes["{D}"].model.matches("^H[0-9]+$")',
        "device.allowMultipleAllocations == false",
        f'device.attributes.exists(d, d == "{D}")',
        f'has(device.attributes["{D}"].model) && !has(device.attributes["{D}"].nokey)',
    ],
)
def test_true_expressions(expr: str, act: DeviceActivation) -> None:
    assert ev(expr, act) is True


def test_unknown_domain_is_empty_map(act: DeviceActivation) -> None:
    assert ev('size(device.attributes["nope.example.com"]) == 0', act)
    assert ev('size(device.capacity["nope.example.com"]) == 0', act)
    assert not ev('has(device.attributes["nope.example.com"].model)', act)
    # "in" keeps its meaning: the domain does not exist.
    assert not ev('"nope.example.com" in device.attributes', act)


def test_unknown_key_is_runtime_error(act: DeviceActivation) -> None:
    with pytest.raises(CelRuntimeError, match="no such key"):
        ev(f'device.attributes["{D}"].nokey == "x"', act)
    with pytest.raises(CelRuntimeError, match="no such key"):
        ev('device.attributes["nope.example.com"].model == "x"', act)


def test_runtime_error_is_not_false(act: DeviceActivation) -> None:
    with pytest.raises(CelRuntimeError) as info:
        ev(f'device.attributes["{D}"].model + 1 == 2', act)
    assert info.value.expression.startswith("device.attributes")
    with pytest.raises(CelRuntimeError):
        ev(f'device.capacity["{D}"].memory.compareTo(quantity("bad")) > 0', act)


def test_non_bool_result_is_error(act: DeviceActivation) -> None:
    with pytest.raises(CelRuntimeError, match="bool"):
        ev("device.driver", act)
    with pytest.raises(CelCompileError, match="bool"):
        compile_selector("1 + 2")


@pytest.mark.parametrize(
    "expr", ["1 +", "foo == 1", "bar(1)", "[1, 2].all(i, v, v > 0)", "Foo{a: 1}", "", "(" * 300 + "true" + ")" * 300]
)
def test_compile_errors(expr: str) -> None:
    with pytest.raises(CelCompileError) as info:
        compile_selector(expr)
    assert info.value.expression == expr


def test_too_long() -> None:
    with pytest.raises(CelCompileError, match="too long"):
        compile_selector("true && " * 2000 + "true")


def test_cost_bomb_rejected_quickly() -> None:
    big = "[" + ",".join(str(i) for i in range(200)) + "]"
    expr = f"{big}.all(a, {big}.all(b, {big}.all(c, a + b + c >= 0)))"
    start = time.perf_counter()
    with pytest.raises(CelCostError, match="cost"):
        compile_selector(expr)
    with pytest.raises(CelCostError):
        compile_selector("lists.range(100000).all(a, lists.range(100000).all(b, true))")
    assert time.perf_counter() - start < 1.0
    assert compile_selector("lists.range(100).all(a, lists.range(100).all(b, true))").estimated_cost < MAX_COST


def test_runtime_budget_poisons(act: DeviceActivation, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cel_compile, "RUNTIME_LIMIT_S", 0.0)
    sel = compile_selector("lists.range(50).all(a, lists.range(50).all(b, a >= 0))")
    with pytest.raises(CelRuntimeError, match="cost limit"):
        sel.evaluate(act)
    monkeypatch.setattr(cel_compile, "RUNTIME_LIMIT_S", 10.0)
    with pytest.raises(CelRuntimeError, match="cost limit"):
        sel.evaluate(act)  # stays poisoned
    sel.poisoned = None


def test_compile_is_cached() -> None:
    assert compile_selector("true == true") is compile_selector("true == true")


def test_bad_device_data_is_error() -> None:
    bad = device_activation(D, {"v": {"version": "1.2"}, "x": {"int": 1, "bool": True}}, {"m": {"value": "1K"}})
    assert bad.error is not None
    with pytest.raises(CelRuntimeError, match="semantic version"):
        compile_selector("true").evaluate(bad)


def test_allow_multiple_allocations_variable() -> None:
    shared = device_activation(D, {}, {}, allow_multiple_allocations=True)
    assert compile_selector("device.allowMultipleAllocations").evaluate(shared)


def test_semver_parsing() -> None:
    assert parse_semver("1.2.3-rc.1+build.5").pre == ("rc", "1")
    assert parse_semver("v01.2", normalize=True) == parse_semver("1.2.0")
    with pytest.raises(SemverError):
        parse_semver("01.2.3")


@pytest.mark.parametrize("text", ["18446744073709551616.0.0", "1.18446744073709551616.0", "1.0.18446744073709551616",
                                  "1.0.0-rc.18446744073709551616", "18446744073709551616.0", "v100000000000000000000"])
def test_semver_numbers_must_fit_64_bits(text: str) -> None:
    # The API server of 1.37 accepts such versions; the scheduler's semver type (uint64s) does not.
    with pytest.raises(SemverError, match=r'strconv.ParseUint: parsing "\d+": value out of range'):
        parse_semver(text, normalize=not text[0].isdigit() or text.count(".") < 2)
    assert parse_semver("18446744073709551615.0.0-18446744073709551615+99999999999999999999999").major == 2**64 - 1


# --------------------------------------------------------------------------- driver comparison fast path


@pytest.mark.parametrize("expr,literal", [
    ('device.driver == "gpu.dra-driver.io"', "gpu.dra-driver.io"),
    ("'gpu.dra-driver.io' == device.driver", "gpu.dra-driver.io"),
    ('(device.driver == "b.example.com")', "b.example.com"),  # a string starting with b is no bytes literal
    ('device.driver == ""', ""),
    ("device.driver == 'it\"s'", 'it"s'),
])
def test_driver_comparison_is_recognized(expr: str, literal: str) -> None:
    assert compile_selector(expr).driver_equals == literal


@pytest.mark.parametrize("expr", [
    'device.driver != "x"', 'device.driver == "x" || false', 'device.driver == r"x"', 'device.driver == b"x"',
    'device.driver == "a\\\\b"', 'device.driver == """x"""', 'device.attributes["x"].driver == "x"',
    'device.driver == device.driver', 'has(device.driver)',
])
def test_other_expressions_stay_with_cel(expr: str) -> None:
    assert compile_selector(expr).driver_equals is None


@pytest.mark.parametrize("driver", ["gpu.dra-driver.io", "other.example.com", "", "GPU.dra-driver.io"])
def test_driver_fast_path_agrees_with_cel(driver: str) -> None:
    fast = compile_selector('device.driver == "gpu.dra-driver.io"')
    slow = compile_selector('device.driver == "gpu.dra-driver.io" && true')  # not recognized: evaluated by CEL
    assert fast.driver_equals is not None and slow.driver_equals is None
    activation = device_activation(driver, {"model": {"string": "X"}}, {"memory": {"value": "1Gi"}})
    with mock.patch.object(fast, "program") as program:
        fast_result = fast.evaluate(activation)
    assert not program.execute.called  # the fast path does not run CEL
    assert fast_result is slow.evaluate(activation) is (driver == "gpu.dra-driver.io")


def test_driver_fast_path_still_reports_broken_devices() -> None:
    activation = device_activation(D, {"model": {"int": "not an int"}}, None)
    with pytest.raises(CelRuntimeError, match="int attribute has a str value"):
        compile_selector(f'device.driver == "{D}"').evaluate(activation)


def test_a_string_starting_with_b_is_a_string() -> None:
    with pytest.raises(CelCompileError, match="not string"):
        compile_selector('"bar"')
    with pytest.raises(CelCompileError, match="not bytes"):
        compile_selector('b"bar"')


def test_one_context_per_thread_holds_the_device_evaluated() -> None:
    h100, a100 = (device_activation(D, {"model": {"string": m}}, None) for m in ("H100", "A100"))
    sel = compile_selector(f'device.attributes["{D}"].model == "H100"')
    assert sel.evaluate(h100) and not sel.evaluate(a100) and sel.evaluate(h100)
    assert h100.context() is a100.context()
    elsewhere: list[Any] = []
    worker = threading.Thread(target=lambda: elsewhere.append((a100.context(), sel.evaluate(a100))))
    worker.start()
    worker.join()
    assert elsewhere[0][0] is not h100.context() and elsewhere[0][1] is False


@pytest.mark.parametrize("expr,plain", [
    (f'device.attributes["{D}"].model == "H100"', True),
    (f'device.attributes["{D}"].model.startsWith("H") && [1, 2].all(x, x > 0)', True),
    (f'device.capacity["{D}"].memory.compareTo(quantity("1Gi")) >= 0', False),
    (f'device.attributes["{D}"].model.lowerAscii() == "h100"', False),
    ("lists.range(3).size() == 3", False),
    ('sets.contains([1, 2], [1]) && strings.quote("a") != ""', False),
])
def test_programs_without_kubernetes_functions_run_without_a_context(expr: str, plain: bool) -> None:
    sel = compile_selector(expr)
    assert sel.plain is plain
    activation = device_activation(D, {"model": {"string": "H100"}}, {"memory": {"value": "80Gi"}})
    with_context = cel_compile.compile_uncached(expr)
    with_context.plain = False
    assert sel.evaluate(activation) is with_context.evaluate(activation) is True
