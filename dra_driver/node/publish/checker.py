"""Would the API server accept this device? The ResourceSlice rules one device can break, checked
before the plugin writes it.

The rules are those of ``pkg/apis/resource/validation/validation.go`` (``validateDevice``,
``validateDeviceNodeSelection`` and what they call) of Kubernetes **1.38**, which is stricter than
1.37 in three places; the checker always applies the stricter rule, so a slice written today is still
accepted after the control plane is upgraded (and on 1.38 any change to ``spec.devices`` revalidates
every device, so one device that became invalid would block every later update of its slice):

* ``one-slash``: an attribute or capacity name has at most one ``/`` (1.37 accepted ``a/b/c``);
* ``one-term``: a per-device ``nodeSelector`` has exactly one term;
* ``version-18-digits``: a version's numeric identifiers have at most 18 digits;
* ``fractional-request-policy``: a request policy's fractional range is checked in milli units
  (DRAFractionalCapacityRange, on by default from 1.38).

``own-driver-domain`` is not an API-server rule but the Go helper's (k/k #142218): an attribute or
capacity named ``<own driver>/x`` is the same as ``x`` and makes lookups ambiguous.

``nodeAllocatableResources`` (alpha, never published by this driver) is not checked.

Pure functions: :func:`check_device` lists every problem of one device; :func:`partition` splits a
device list into what may be published and what is withheld. A :class:`Violation`'s ``rule`` comes
from the fixed set :data:`RULES` (it is a metric label).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dra_driver.k8s.names import (
    is_c_identifier,
    is_dns_label,
    is_dns_subdomain,
    is_driver_name,
    is_label_name,
    is_label_value,
)
from dra_driver.k8s.quantity import Quantity, QuantityError, parse_quantity

MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ATTRIBUTE_VALUES = 48
MAX_VALUE_BYTES = 64
MAX_ID_LENGTH = 32
MAX_TAINTS = 16
MAX_BINDING_CONDITIONS = 4
MAX_COUNTER_CONSUMPTIONS = 2
MAX_COUNTERS_PER_CONSUMPTION = 32
MAX_VALID_VALUES = 10
TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")
NODE_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)

RULES = (
    "malformed", "device-name", "attribute-count", "attribute-value-count", "qualified-name", "one-slash",
    "own-driver-domain", "attribute-value", "string-length", "version", "version-18-digits", "capacity-value",
    "request-policy", "fractional-request-policy", "counter-consumption", "taint", "binding-conditions",
    "node-selection", "one-term",
    "api-server-refused",
)
"""Every rule a violation can name; ``api-server-refused`` is a write the API server refused anyway."""

STRICTER_SINCE_1_38 = frozenset({"one-slash", "one-term", "version-18-digits", "fractional-request-policy"})
"""Rules the 1.37 API server does not enforce yet. ``fractional-request-policy``: a consumable
capacity's ``validRange`` with fractions is checked in milli units when DRAFractionalCapacityRange
is on, by default from 1.38 (a 1.37 API server turns it on only at a minimum compatibility version of
1.37, and otherwise rounds the values up to integers)."""

NOT_AN_API_SERVER_RULE = frozenset({"own-driver-domain"})
"""Rules no API server enforces (the Go helper's)."""

_NUMBER = r"(0|[1-9]\d*)"
_NUMBER_18 = r"(0|[1-9]\d{0,17})"


def _semver(number: str) -> re.Pattern[str]:
    pre = rf"({number}|\d*[a-zA-Z-][0-9a-zA-Z-]*)"
    build = r"[0-9a-zA-Z-]+"
    return re.compile(rf"{number}\.{number}\.{number}(-{pre}(\.{pre})*)?(\+{build}(\.{build})*)?", re.ASCII)


_SEMVER_ANY_DIGITS = _semver(_NUMBER)
_SEMVER_18_DIGITS = _semver(_NUMBER_18)


@dataclass(frozen=True)
class Violation:
    """One rule one device breaks."""

    device: str
    rule: str
    """One of :data:`RULES`."""
    field: str
    """Where in the device, as the API server names it (``attributes[driverVersion]``)."""
    message: str

    def describe(self) -> str:
        return f"device {self.device}: {self.field}: {self.message} (rule {self.rule})"


def _bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _quantity(value: Any) -> Quantity | None:
    try:
        return parse_quantity(value) if isinstance(value, str) else None
    except QuantityError:
        return None


class _Found:
    """Collects the violations of one device."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.items: list[Violation] = []

    def add(self, rule: str, where: str, message: str) -> None:
        self.items.append(Violation(self.device, rule, where, message))


# --- names ---------------------------------------------------------------------------------------

def _qualified_name(found: _Found, name: Any, where: str, driver: str) -> None:
    """Attribute and capacity names: ``id`` or ``domain/id``."""
    if not isinstance(name, str):
        found.add("malformed", where, f"name {name!r} is not a string")
        return
    parts = name.split("/", 2)
    if len(parts) > 2:
        found.add("one-slash", f"{where}[{name}]", "must not contain more than one slash (Kubernetes 1.38)")
        return
    if len(parts) == 2:
        domain, ident = parts
        if not domain:
            found.add("qualified-name", f"{where}[{name}]", "the domain must not be empty")
        elif not is_driver_name(domain):
            found.add("qualified-name", f"{where}[{name}]",
                      f"the domain {domain!r} must be a DNS subdomain of at most 63 characters")
        elif domain == driver:
            found.add("own-driver-domain", f"{where}[{name}]",
                      f"use the unqualified {ident!r}: the driver's own domain is implied")
    else:
        ident = parts[0]
    if not ident:
        found.add("qualified-name", f"{where}[{name}]", "the name must not be empty")
        return
    if len(ident) > MAX_ID_LENGTH:
        found.add("qualified-name", f"{where}[{name}]", f"the name {ident!r} is longer than {MAX_ID_LENGTH} characters")
    if not is_c_identifier(ident):
        found.add("qualified-name", f"{where}[{name}]", f"the name {ident!r} must be a C identifier")


# --- attributes ----------------------------------------------------------------------------------

_SCALARS = ("int", "bool", "string", "version")
_LISTS = ("ints", "bools", "strings", "versions")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and _INT64_MIN <= value <= _INT64_MAX


def _string(found: _Found, value: Any, where: str) -> None:
    if not isinstance(value, str):
        found.add("attribute-value", where, f"{value!r} is not a string")
    elif _bytes(value) > MAX_VALUE_BYTES:
        found.add("string-length", where, f"longer than {MAX_VALUE_BYTES} bytes ({_bytes(value)})")


def _version(found: _Found, value: Any, where: str) -> None:
    if not isinstance(value, str):
        found.add("attribute-value", where, f"{value!r} is not a string")
        return
    if not _SEMVER_ANY_DIGITS.fullmatch(value):
        found.add("version", where, f"{value!r} is not a semver.org 2.0.0 version")
    elif not _SEMVER_18_DIGITS.fullmatch(value):
        found.add("version-18-digits", where, f"{value!r} has a number of more than 18 digits (Kubernetes 1.38)")
    if _bytes(value) > MAX_VALUE_BYTES:
        found.add("string-length", where, f"longer than {MAX_VALUE_BYTES} bytes ({_bytes(value)})")


def _attribute(found: _Found, value: Any, where: str) -> None:
    if not isinstance(value, Mapping):
        found.add("malformed", where, "must be an object with one value")
        return
    unknown = sorted(set(value) - set(_SCALARS) - set(_LISTS))
    if unknown:
        found.add("attribute-value", where, f"unknown value types {unknown}")
    present = [k for k in (*_SCALARS, *_LISTS) if value.get(k) is not None]
    if len(present) != 1:
        found.add("attribute-value", where, "exactly one value must be specified")
    for kind in present:
        item = value[kind]
        at = f"{where}.{kind}"
        if kind in _LISTS:
            _attribute_list(found, kind, item, at)
        else:
            _scalar(found, kind, item, at)


def _scalar(found: _Found, kind: str, item: Any, at: str) -> None:
    """One value of an attribute of ``kind`` (``int``, ``bool``, ``string``, ``version``), alone or in a list."""
    if kind == "int" and not _is_int(item):
        found.add("attribute-value", at, f"{item!r} is not a 64-bit integer")
    elif kind == "bool" and not isinstance(item, bool):
        found.add("attribute-value", at, f"{item!r} is not a boolean")
    elif kind == "string":
        _string(found, item, at)
    elif kind == "version":
        _version(found, item, at)


def _attribute_list(found: _Found, kind: str, items: Any, where: str) -> None:
    if not isinstance(items, list):
        found.add("attribute-value", where, "must be a list")
        return
    if not items:
        found.add("attribute-value", where, "must not be empty if specified")
    for i, item in enumerate(items):
        _scalar(found, kind.removesuffix("s"), item, f"{where}[{i}]")


def _value_count(attributes: Mapping[str, Any]) -> int:
    """Attribute values as the API server counts them: one per scalar, one per list item."""
    count = 0
    for value in attributes.values():
        lists = [value.get(k) for k in _LISTS] if isinstance(value, Mapping) else []
        items = sum(len(v) for v in lists if isinstance(v, list))
        count += items if items else 1
    return count


# --- capacity ------------------------------------------------------------------------------------

def _capacity(found: _Found, capacity: Any, where: str, multiple: bool) -> None:
    if not isinstance(capacity, Mapping):
        found.add("malformed", where, "must be an object with a value")
        return
    total = _quantity(capacity.get("value"))
    if total is None:
        found.add("capacity-value", f"{where}.value", f"{capacity.get('value')!r} is not a quantity")
        return
    policy = capacity.get("requestPolicy")
    if policy is None:
        return
    if not multiple:
        found.add("request-policy", f"{where}.requestPolicy", "allowMultipleAllocations must be true")
        return
    if not isinstance(policy, Mapping):
        found.add("malformed", f"{where}.requestPolicy", "must be an object")
        return
    for problem in request_policy_problems(total, policy):
        rule = "fractional-request-policy" if problem.startswith(_MILLI) else "request-policy"
        found.add(rule, f"{where}.requestPolicy", problem.removeprefix(_MILLI))


_MILLI = "milli:"
"""Marks a request-policy problem found only in milli units (``fractional-request-policy``)."""


def request_policy_problems(total: Quantity, policy: Mapping[str, Any]) -> list[str]:
    """What the API server says of a consumable capacity's ``requestPolicy`` (``total`` is the
    capacity's value), with DRAFractionalCapacityRange on, as 1.38 has it by default. Problems
    only the milli-unit checks find start with ``milli:``."""
    values = policy.get("validValues")
    valid_range = policy.get("validRange")
    raw_default = policy.get("default")
    default = _quantity(raw_default) if raw_default is not None else None
    if raw_default is not None and default is None:
        return [f"default {raw_default!r} is not a quantity"]
    if values and valid_range is not None:
        return ['exactly one policy can be specified, cannot specify "validValues" and "validRange" at the same time']
    if values:
        if default is None:
            return ["default is required when validValues is defined"]
        return _valid_values_problems(total, default, values)
    if valid_range is not None:
        if default is None:
            return ["default is required when validRange is defined"]
        if not isinstance(valid_range, Mapping):
            return ["validRange must be an object"]
        return _range_problems(total, default, valid_range)
    return []


def _valid_values_problems(total: Quantity, default: Quantity, raw: Any) -> list[str]:
    if not isinstance(raw, list):
        return ["validValues must be a list"]
    values = [_quantity(v) for v in raw]
    if any(v is None for v in values):
        return [f"validValues {raw!r} are not all quantities"]
    options = [v for v in values if v is not None]
    problems = [f"validValues[{i + 1}]: values must be sorted in ascending order"
                for i in range(len(options) - 1) if options[i] > options[i + 1]]
    if len(options) > MAX_VALID_VALUES:
        return [*problems, f"validValues: more than {MAX_VALID_VALUES} options"]
    problems += [f"validValues[{i}]: option {v} is larger than capacity value {total}"
                 for i, v in enumerate(options) if v > total]
    seen: set[Fraction] = set()
    for i, v in enumerate(options):
        if v.value in seen:
            problems.append(f"validValues[{i}]: duplicate value {v}")
        seen.add(v.value)
    if default.value not in seen:
        problems.append(f"default {default} is not one of validValues")
    return problems


def _milli_exact(q: Quantity) -> bool:
    milli = q.value * 1000
    return milli.denominator == 1 and _INT64_MIN <= milli.numerator <= _INT64_MAX


def _range_problems(total: Quantity, default: Quantity, valid_range: Mapping[str, Any]) -> list[str]:
    bounds: dict[str, Quantity | None] = {}
    for key in ("min", "max", "step"):
        raw = valid_range.get(key)
        bounds[key] = _quantity(raw) if raw is not None else None
        if raw is not None and bounds[key] is None:
            return [f"validRange.{key} {raw!r} is not a quantity"]
    low, high, step = bounds["min"], bounds["max"], bounds["step"]
    if low is None:
        return ["validRange.min is required when validRange is defined"]
    problems = []
    if low > total:
        problems.append(f"validRange.min {low} is larger than capacity value {total}")
    if default < low:
        problems.append(f"validRange.default {default} is less than min {low}")
    if high is not None:
        if low > high:
            problems.append(f"validRange.max: min {low} is larger than max {high}")
        if high > total:
            problems.append(f"validRange.max {high} is larger than capacity value {total}")
        if default > high:
            problems.append(f"validRange.default {default} is more than max {high}")
    named = [("default", default), ("min", low), ("max", high), ("step", step)]
    milli = any(q is not None and q.value.denominator != 1 for _, q in named)
    if milli:
        inexact = [f"{_MILLI}validRange.{name} {q} cannot be represented as a milli value"
                   for name, q in named if q is not None and not _milli_exact(q)]
        if inexact:
            return problems + inexact
    if step is None:
        return problems
    if step.sign() <= 0:
        return [*problems, f"validRange.step {step} must be greater than zero"]
    if low + step > total:
        problems.append(f"validRange.step: one step {low + step} is larger than capacity value {total}")
    if not milli:
        unsafe = [f"validRange.{name} {q} must be between 0 and {_INT64_MAX}"
                  for name, q in named if q is not None and not 0 <= q.value <= _INT64_MAX]
        if unsafe:
            return problems + unsafe
    scale = 1000 if milli else 1
    for name, q in (("default", default), ("max", high)):
        if q is not None and (_scaled(q, scale) - _scaled(low, scale)) % _scaled(step, scale) != 0:
            problems.append(f"{_MILLI if milli else ''}validRange.step: {name} {q} is not a multiple of step {step} "
                            f"from min {low}")
    return problems


def _scaled(q: Quantity, scale: int) -> int:
    # Quantity.Value() and MilliValue() round up to the next integer.
    scaled = q.value * scale
    return -((-scaled.numerator) // scaled.denominator)


# --- counters, taints, binding conditions, node selection ----------------------------------------

def _counter_consumptions(found: _Found, entries: Any) -> None:
    where = "consumesCounters"
    if not isinstance(entries, list):
        found.add("malformed", where, "must be a list")
        return
    if len(entries) > MAX_COUNTER_CONSUMPTIONS:
        found.add("counter-consumption", where, f"more than {MAX_COUNTER_CONSUMPTIONS} counter sets")
        return
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        at = f"{where}[{i}]"
        if not isinstance(entry, Mapping):
            found.add("malformed", at, "must be an object")
            continue
        name = entry.get("counterSet")
        if not is_dns_label(name):
            found.add("counter-consumption", f"{at}.counterSet", f"{name!r} must be a DNS label")
        elif name in seen:
            found.add("counter-consumption", f"{at}.counterSet", f"duplicate counter set {name!r}")
        else:
            seen.add(name)
        counters = entry.get("counters")
        if not isinstance(counters, Mapping) or not counters:
            found.add("counter-consumption", f"{at}.counters", "required: at least one counter")
            continue
        if len(counters) > MAX_COUNTERS_PER_CONSUMPTION:
            found.add("counter-consumption", f"{at}.counters", f"more than {MAX_COUNTERS_PER_CONSUMPTION} counters")
            continue
        for key, counter in counters.items():
            if not is_dns_label(key):
                found.add("counter-consumption", f"{at}.counters", f"counter name {key!r} must be a DNS label")
            value = counter.get("value") if isinstance(counter, Mapping) else None
            if _quantity(value) is None:
                found.add("counter-consumption", f"{at}.counters[{key}].value", f"{value!r} is not a quantity")


def _taints(found: _Found, taints: Any) -> None:
    if not isinstance(taints, list):
        found.add("malformed", "taints", "must be a list")
        return
    if len(taints) > MAX_TAINTS:
        found.add("taint", "taints", f"more than {MAX_TAINTS} taints")
        return
    for i, taint in enumerate(taints):
        at = f"taints[{i}]"
        if not isinstance(taint, Mapping):
            found.add("malformed", at, "must be an object")
            continue
        if not is_label_name(taint.get("key")):
            found.add("taint", f"{at}.key", f"{taint.get('key')!r} must be a label key")
        value = taint.get("value")
        if value not in (None, "") and not is_label_value(value):
            found.add("taint", f"{at}.value", f"{value!r} must be a label value")
        if taint.get("effect") not in TAINT_EFFECTS:
            found.add("taint", f"{at}.effect", f"{taint.get('effect')!r} must be one of {', '.join(TAINT_EFFECTS)}")


def _binding_conditions(found: _Found, device: Mapping[str, Any]) -> None:
    lists: dict[str, list[Any]] = {}
    for key in ("bindingConditions", "bindingFailureConditions"):
        value = device.get(key) or []
        if not isinstance(value, list):
            found.add("malformed", key, "must be a list")
            return
        lists[key] = value
        if len(value) > MAX_BINDING_CONDITIONS:
            found.add("binding-conditions", key, f"more than {MAX_BINDING_CONDITIONS} conditions")
            continue
        for i, item in enumerate(value):
            if not is_label_name(item):
                found.add("binding-conditions", f"{key}[{i}]", f"{item!r} must be a label key")
            elif item in value[:i]:
                found.add("binding-conditions", f"{key}[{i}]", f"duplicate condition {item!r}")
    conditions, failures = lists["bindingConditions"], lists["bindingFailureConditions"]
    overlap = sorted(set(map(str, conditions)) & set(map(str, failures)))
    if overlap:
        found.add("binding-conditions", "bindingFailureConditions", f"{overlap} also in bindingConditions")
    if bool(conditions) != bool(failures):
        found.add("binding-conditions", "bindingConditions",
                  "bindingConditions and bindingFailureConditions are required together")


def _node_selector(found: _Found, selector: Any) -> None:
    where = "nodeSelector.nodeSelectorTerms"
    terms = selector.get("nodeSelectorTerms") if isinstance(selector, Mapping) else None
    if not isinstance(terms, list) or not terms:
        found.add("node-selection", where, "must have at least one node selector term")
        return
    for i, term in enumerate(terms):
        if not isinstance(term, Mapping):
            found.add("malformed", f"{where}[{i}]", "must be an object")
            continue
        for j, req in enumerate(term.get("matchExpressions") or []):
            _node_requirement(found, req, f"{where}[{i}].matchExpressions[{j}]")
        for j, req in enumerate(term.get("matchFields") or []):
            at = f"{where}[{i}].matchFields[{j}]"
            values = req.get("values") or [] if isinstance(req, Mapping) else []
            if not isinstance(req, Mapping) or req.get("operator") not in ("In", "NotIn") or len(values) != 1:
                found.add("node-selection", at, "a node field selector takes operator In or NotIn and one value")
            elif req.get("key") != "metadata.name" or not is_dns_subdomain(values[0]):
                found.add("node-selection", at, "the only node field is metadata.name, a node name")
    if len(terms) != 1:
        found.add("one-term", where, "must have exactly one node selector term (Kubernetes 1.38)")


def _node_requirement(found: _Found, req: Any, where: str) -> None:
    if not isinstance(req, Mapping):
        found.add("malformed", where, "must be an object")
        return
    op, values = req.get("operator"), req.get("values") or []
    if op not in NODE_SELECTOR_OPERATORS:
        found.add("node-selection", f"{where}.operator", f"{op!r} is not a valid selector operator")
    elif op in ("In", "NotIn") and not values:
        found.add("node-selection", f"{where}.values", "required when operator is In or NotIn")
    elif op in ("Exists", "DoesNotExist") and values:
        found.add("node-selection", f"{where}.values", "forbidden when operator is Exists or DoesNotExist")
    elif op in ("Gt", "Lt") and len(values) != 1:
        found.add("node-selection", f"{where}.values", "exactly one value when operator is Gt or Lt")
    if not is_label_name(req.get("key")):
        found.add("node-selection", f"{where}.key", f"{req.get('key')!r} must be a label key")
    for k, value in enumerate(values if isinstance(values, list) else [values]):
        if not is_label_value(value):
            found.add("node-selection", f"{where}.values[{k}]", f"{value!r} must be a label value")


def _node_selection(found: _Found, device: Mapping[str, Any], per_device: bool) -> None:
    node_name, selector, all_nodes = device.get("nodeName"), device.get("nodeSelector"), device.get("allNodes")
    if not per_device:
        if node_name is not None or selector is not None or all_nodes is not None:
            found.add("node-selection", "nodeName",
                      "nodeName, nodeSelector and allNodes need perDeviceNodeSelection in the slice")
        return
    chosen = 0
    if node_name is not None:
        if not node_name:
            found.add("node-selection", "nodeName", "must not be empty")
        else:
            chosen += 1
            if not is_dns_subdomain(node_name):
                found.add("node-selection", "nodeName", f"{node_name!r} is not a node name")
    if selector is not None:
        chosen += 1
        _node_selector(found, selector)
    if all_nodes is not None:
        if all_nodes is True:
            chosen += 1
        else:
            found.add("node-selection", "allNodes", "must be either unset or set to true")
    if chosen != 1:
        found.add("node-selection", "nodeName", "exactly one of nodeName, nodeSelector or allNodes is required")


# --- the device ----------------------------------------------------------------------------------

def check_device(device: Any, driver: str, *, per_device_node_selection: bool = False) -> list[Violation]:
    """Every rule ``device`` (a resource.k8s.io/v1 Device as JSON) breaks in a slice of ``driver``;
    empty when the API server (1.37 and 1.38) would accept it."""
    if not isinstance(device, Mapping):
        return [Violation("", "malformed", "", "a device must be an object")]
    name = device.get("name")
    found = _Found(str(name) if name is not None else "")
    if not is_dns_label(name):
        found.add("device-name", "name", f"{name!r} must be a DNS label (at most 63 characters)")
    attributes = device.get("attributes") or {}
    capacity = device.get("capacity") or {}
    if not isinstance(attributes, Mapping) or not isinstance(capacity, Mapping):
        found.add("malformed", "attributes", "attributes and capacity must be objects")
        return found.items
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        found.add("attribute-count", "attributes",
                  f"{len(attributes) + len(capacity)} attributes and capacities, at most {MAX_ATTRIBUTES_AND_CAPACITIES}")
    if _value_count(attributes) > MAX_ATTRIBUTE_VALUES:
        found.add("attribute-value-count", "attributes",
                  f"{_value_count(attributes)} attribute values, at most {MAX_ATTRIBUTE_VALUES}")
    for key, value in attributes.items():
        _qualified_name(found, key, "attributes", driver)
        _attribute(found, value, f"attributes[{key}]")
    multiple = device.get("allowMultipleAllocations") is True
    for key, value in capacity.items():
        _qualified_name(found, key, "capacity", driver)
        _capacity(found, value, f"capacity[{key}]", multiple)
    if device.get("consumesCounters") is not None:
        _counter_consumptions(found, device["consumesCounters"])
    if device.get("taints") is not None:
        _taints(found, device["taints"])
    _binding_conditions(found, device)
    _node_selection(found, device, per_device_node_selection)
    return found.items


@dataclass(frozen=True)
class Partition:
    publish: list[dict[str, Any]]
    withheld: dict[str, list[Violation]]
    """By device name, in the devices' order."""


def partition(devices: Sequence[dict[str, Any]], driver: str,
              refused: Mapping[str, Iterable[Violation]] | None = None) -> Partition:
    """The devices that may be published, and those withheld with their violations: the checker's,
    and ``refused`` (the API server's verdicts on devices the checker passed, by name)."""
    publish: list[dict[str, Any]] = []
    withheld: dict[str, list[Violation]] = {}
    for device in devices:
        problems = check_device(device, driver)
        name = str(device.get("name", "")) if isinstance(device, Mapping) else ""
        if not problems and refused:
            problems = list(refused.get(name, ()))
        if problems:
            withheld.setdefault(name, []).extend(problems)
        else:
            publish.append(device)
    return Partition(publish, withheld)
