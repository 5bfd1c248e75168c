"""What a claim asks, as the search reads it: its requests (with subrequests) and constraints parsed,
a request's class selectors compiled, and a device's taints and attributes as a request sees them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dra_driver.allocator.cel.compile import CompiledSelector, compile_selector
from dra_driver.allocator.cel.errors import CelCompileError
from dra_driver.allocator.inventory import (
    Device,
    key_str,
    published_attribute,
    quantity_or_none,
)
from dra_driver.allocator.rules import SchedulerRules
from dra_driver.allocator.slicechecks import semver_ok
from dra_driver.k8s.bodies import DeviceClasses, RawDeviceClass
from dra_driver.k8s.objects import as_int, as_list, as_mapping, as_str
from dra_driver.k8s.quantity import Quantity

UNSUPPORTED_CLASSES: Mapping[str, str] = {
    "vfio.gpu.nvidia.com": "VFIO passthrough",
    "compute-domain-daemon.nvidia.com": "ComputeDomains (IMEX daemons)",
    "compute-domain-default-channel.nvidia.com": "ComputeDomains (IMEX channels)",
    "imex.nvidia.com": "IMEX channels",
}
"""NVIDIA's DeviceClasses for features of their driver that this one does not have: a claim for one
is told so, not only that the class is missing."""


@dataclass
class Alt:
    """One allocatable alternative: a plain request or one firstAvailable subrequest."""

    name: str  # "req" or "req/sub"
    base: str
    sub: str
    class_name: str
    selectors: list[str]
    mode: str
    count: int
    admin: bool
    tolerations: list[Mapping[str, Any]]
    capacity: dict[str, Quantity]
    error: str | None = None
    compiled: list[tuple[str, CompiledSelector]] = field(default_factory=list)
    """The class's selectors, then the request's."""
    class_selectors: int = 0
    """How many of ``compiled`` are the class's."""
    class_obj: RawDeviceClass | None = None


@dataclass
class Constraint:
    kind: str  # match | distinct
    attribute: str
    requests: set[str]
    value: tuple[str, Any] | None = None
    members: int = 0
    seen: Counter[tuple[str, Any]] = field(default_factory=Counter)
    # The 1.36 scheduler's distinctAttribute (see DISTINCT_LATEST_ONLY): the value of each request's
    # latest device, keyed by the (parent) request name.
    latest_only: bool = False
    latest: dict[str, tuple[str, Any]] = field(default_factory=dict)

    def applies(self, alt: Alt) -> bool:
        return not self.requests or alt.base in self.requests or (bool(alt.sub) and alt.name in self.requests)


def _parse_alt(base: str, sub: str, body: Mapping[str, Any], admin_allowed: bool) -> Alt:
    mode = as_str(body.get("allocationMode")) or "ExactCount"
    count_raw = body.get("count")
    count = 1 if count_raw is None and mode == "ExactCount" else as_int(count_raw)
    alt = Alt(
        name=f"{base}/{sub}" if sub else base, base=base, sub=sub,
        class_name=as_str(body.get("deviceClassName")) or "",
        selectors=[], mode=mode, count=count or 0,
        admin=admin_allowed and body.get("adminAccess") is True,
        tolerations=[as_mapping(t) for t in as_list(body.get("tolerations"))], capacity={},
    )  # fmt: skip
    for i, sel in enumerate(as_list(body.get("selectors"))):
        expr = as_str(as_mapping(as_mapping(sel).get("cel")).get("expression"))
        if expr is None:
            alt.error = f"selector #{i}: CEL expression empty (unsupported selector type?)"
        else:
            alt.selectors.append(expr)
    for cname, val in as_mapping(as_mapping(body.get("capacity")).get("requests")).items():
        q = quantity_or_none(val)
        if q is None or q.value < 0:
            alt.error = f"capacity request {cname}: invalid quantity {val!r}"
        else:
            alt.capacity[cname] = q
    if mode not in ("ExactCount", "All"):
        alt.error = f"unsupported allocation mode {mode!r}"
    elif mode == "ExactCount" and (count is None or count <= 0):
        alt.error = f"count must be a positive integer, got {count_raw!r}"
    elif mode == "All" and count_raw is not None:
        alt.error = "count must not be set with allocationMode All"
    if not alt.class_name:
        alt.error = alt.error or "missing device class name"
    return alt


def parse_requests(claim: Mapping[str, Any], errors: list[str]) -> list[list[Alt]]:
    out: list[list[Alt]] = []
    names: set[str] = set()
    for i, req in enumerate(as_list(as_mapping(as_mapping(claim.get("spec")).get("devices")).get("requests"))):
        req = as_mapping(req)
        name = as_str(req.get("name")) or f"request-{i}"
        if name in names:
            errors.append(f"duplicate request name {name}")
        names.add(name)
        if isinstance(req.get("exactly"), Mapping):
            out.append([_parse_alt(name, "", req["exactly"], admin_allowed=True)])
        elif as_list(req.get("firstAvailable")):
            subs = [as_mapping(s) for s in as_list(req.get("firstAvailable"))]
            out.append([_parse_alt(name, as_str(s.get("name")) or f"sub-{j}", s, False) for j, s in enumerate(subs)])
        else:
            errors.append(f"request {name}: neither exactly nor firstAvailable is set")
    if not out and not errors:
        errors.append("claim has no requests")
    return out


def parse_constraints(claim: Mapping[str, Any], errors: list[str], distinct_latest_only: bool = False) -> list[Constraint]:
    """``distinct_latest_only``: judge distinctAttribute as kube-scheduler 1.36 does (DISTINCT_LATEST_ONLY)."""
    out: list[Constraint] = []
    for i, c in enumerate(as_list(as_mapping(as_mapping(claim.get("spec")).get("devices")).get("constraints"))):
        c = as_mapping(c)
        reqs = {r for r in as_list(c.get("requests")) if isinstance(r, str)}
        match, distinct = as_str(c.get("matchAttribute")), as_str(c.get("distinctAttribute"))
        if match and "/" in match:
            out.append(Constraint("match", match, reqs))
        elif distinct and "/" in distinct:
            out.append(Constraint("distinct", distinct, reqs, latest_only=distinct_latest_only))
        else:
            errors.append(f"constraint #{i}: needs a fully-qualified matchAttribute or distinctAttribute")
    return out


def prepare_alt(alt: Alt, classes: DeviceClasses) -> None:
    """Look up the class and compile all selectors (class first, like the scheduler)."""
    if alt.error:
        return
    cls = classes.get(alt.class_name)
    if cls is None:
        alt.error = f"device class {alt.class_name} not found"
        if alt.class_name in UNSUPPORTED_CLASSES:
            alt.error += (f": it is NVIDIA's {UNSUPPORTED_CLASSES[alt.class_name]} class, a feature of their "
                          "driver that this driver does not have")
        return
    alt.class_obj = cls
    sources = [(f"class {alt.class_name} selector #{i}", as_mapping(s)) for i, s in enumerate(_class_selectors(cls))]
    alt.class_selectors = len(sources)
    sources += [(f"request {alt.name} selector #{i}", {"cel": {"expression": e}}) for i, e in enumerate(alt.selectors)]
    for label, sel in sources:
        expr = as_str(as_mapping(sel.get("cel")).get("expression"))
        if expr is None:
            alt.error = f"{label}: CEL expression empty (unsupported selector type?)"
            return
        try:
            alt.compiled.append((label, compile_selector(expr)))
        except CelCompileError as exc:
            alt.error = f"{label}: CEL compile error: {exc.message}"
            return


def _class_selectors(cls: RawDeviceClass) -> list[Any]:
    return as_list(as_mapping(cls.get("spec")).get("selectors"))


# =========================================================================== per-device checks


def _tolerates(tol: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    effect = as_str(tol.get("effect")) or ""
    if effect and effect != taint.get("effect"):
        return False
    key = as_str(tol.get("key")) or ""
    operator = as_str(tol.get("operator")) or "Equal"
    if not key:
        return operator == "Exists"
    if key != taint.get("key"):
        return False
    return operator == "Exists" or (tol.get("value") or "") == (taint.get("value") or "")


def taint_blocking(dev: Device, alt: Alt) -> Mapping[str, Any] | None:
    for taint in dev.taints:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not any(_tolerates(t, taint) for t in alt.tolerations):
            return taint
    return None


class UnsupportedAttribute(Exception):
    """kube-scheduler 1.38: a constraint met an attribute whose value it cannot compare."""


def lookup_attribute(dev: Device, name: str, rules: SchedulerRules | None = None) -> tuple[str, Any] | None:
    """The value a matchAttribute/distinctAttribute constraint on ``name`` compares, None when the
    device lacks it.

    Keys are fully qualified (unqualified ones under the driver's domain, the qualified spelling
    winning), which is the scheduler's lookup rule.  Up to 1.37 versions compare as strings
    (semver 2.0 demands the minimal spelling) and a value of another type (a list) counts as
    missing.  With ``rules`` of 1.38 versions compare without their build metadata (semver
    ``Equals``) and such a value raises :class:`UnsupportedAttribute`."""
    value = dev.attribute(name)
    if rules is None or not (rules.constraint_type_errors or rules.versions_ignore_build):
        return value
    if rules.constraint_type_errors and (value is None or not _comparable(*value)):
        if value is not None or published_attribute(as_mapping(dev.raw.get("attributes")), dev.key[0], name) is not None:
            raise UnsupportedAttribute(f"device {key_str(dev.key)}: unsupported attribute value for {name}")
        return None
    if value is not None and value[0] == "version" and rules.versions_ignore_build and isinstance(value[1], str):
        return ("version", value[1].partition("+")[0])
    return value


def _comparable(kind: str, value: Any) -> bool:
    """Whether the scheduler's conversion gives a value its constraints compare: a string, an
    int, a bool, or a version semver parses (another value becomes nil, or a list)."""
    if kind == "version":
        return isinstance(value, str) and semver_ok(value)
    return isinstance(value, {"string": str, "int": int, "bool": bool}[kind])
