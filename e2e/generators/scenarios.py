"""Seeded generator of (ResourceSlices, DeviceClasses, ResourceClaim) scenarios.

Pure and deterministic: the same seed always yields the same objects.  Every
object is meant to be accepted by a real API server (``resource.k8s.io/v1``)
so that verdicts of :func:`dra_driver.allocator.resolve.resolve` can be compared with
the kube-scheduler's on a live cluster.  :func:`validate_scenario` re-checks
the name formats and limits the generator relies on.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DEFAULT_FEATURES", "DRIVER", "MODELS", "SHARE_AMOUNTS", "Scenario", "both_spellings",
           "cel_reads_both_spellings", "device_class", "generate", "generate_many", "make_device", "make_shareable",
           "make_slice", "validate_scenario"]

DRIVER = "gpu.dra-driver.io"
# Feature areas the generator may use; drop one for clusters with the gate off.
# "taint-none" (effect None) needs 1.35+, "counters" DRAPartitionableDevices,
# "taints" DRADeviceTaints, "firstAvailable" DRAPrioritizedList, "shares" DRAConsumableCapacity,
# "taint-rules" DeviceTaintRules served as resource.k8s.io/v1 (1.37+, DRADeviceTaintRules).
DEFAULT_FEATURES = frozenset({"selectors", "all", "constraints", "firstAvailable", "counters", "taints"})
# Of every SHARE_PERIOD consecutive seeds, the first SHARE_SEEDS get shareable devices and capacity
# requests (when "shares" is a feature), so that any long enough corpus holds a known share of them.
SHARE_PERIOD, SHARE_SEEDS = 5, 2

MODELS = ("H100", "A100", "L4")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_C_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Semantic versions as the 1.37 API server checks them: no limit on a number's digits (1.38 has one).
_SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
                     r"(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?")
_SELECTORS = (
    'device.attributes["gpu.dra-driver.io"].model == "{model}"',
    'device.attributes["gpu.dra-driver.io"].model != "{model}"',
    'device.capacity["gpu.dra-driver.io"].memory.compareTo(quantity("{mem}")) >= 0',
    'device.attributes["gpu.dra-driver.io"].index < {index}',
    'device.attributes["gpu.dra-driver.io"].driverVersion.isGreaterThan(semver("{version}"))',
    'has(device.attributes["gpu.dra-driver.io"].migCapable) && device.attributes["gpu.dra-driver.io"].migCapable',
    'device.attributes["gpu.dra-driver.io"].model.lowerAscii().startsWith("{prefix}")',
    '"gpu.dra-driver.io" in device.attributes',
)
# No has() guard: a CEL runtime error ("no such key") on the devices without migCapable, which
# makes the scheduler stop with an error if it evaluates the selector on one of them.
_RAISING_SELECTOR = 'device.attributes["gpu.dra-driver.io"].migCapable'
_NO_SUCH_MODEL = 'device.attributes["gpu.dra-driver.io"].model == "B200"'
# Shareable devices' capacity: the name as published (unqualified or with the driver's domain,
# which the scheduler treats as two different names) and the requestPolicy variants.
_CAPACITY_NAMES = ("memory", "gpu.dra-driver.io/memory")
SHARE_AMOUNTS = ("1Gi", "7Gi", "10Gi", "25Gi", "40Gi", "41Gi", "64Gi", "100Gi")


@dataclass
class Scenario:
    seed: int
    slices: list[dict[str, Any]]
    classes: list[dict[str, Any]]
    claim: dict[str, Any]
    features: list[str] = field(default_factory=list)
    # Other claims of the scenario's namespace, already allocated: each with the ``status`` to
    # write through the status subresource once the claim exists.
    allocated: list[dict[str, Any]] = field(default_factory=list)
    # DeviceTaintRules (cluster-scoped; each selects the scenario's own pools only).
    taint_rules: list[dict[str, Any]] = field(default_factory=list)

    def describe(self) -> str:
        reqs = self.claim["spec"]["devices"]["requests"]
        held = f", {len(self.allocated)} allocated claims" if self.allocated else ""
        rules = f", {len(self.taint_rules)} taint rules" if self.taint_rules else ""
        return (f"seed {self.seed}: {len(self.slices)} slices, {len(reqs)} requests{held}{rules}, "
                f"features {','.join(self.features)}")

    def selectors(self) -> list[str]:
        """Every CEL expression the scheduler evaluates for the claim: its classes' and its requests'."""
        exprs = [x["cel"]["expression"] for c in self.classes for x in c["spec"].get("selectors", [])]
        for req in self.claim["spec"]["devices"]["requests"]:
            for body in [req["exactly"]] if "exactly" in req else req["firstAvailable"]:
                exprs += [x["cel"]["expression"] for x in body.get("selectors", [])]
        return exprs


def both_spellings(s: Scenario) -> set[str]:
    """Names a device publishes both unqualified (``x``) and in its driver's domain (``<driver>/x``),
    as attribute or as capacity."""
    out: set[str] = set()
    for sl in s.slices:
        driver = sl["spec"]["driver"]
        for dev in sl["spec"].get("devices", []):
            for keys in (dev.get("attributes", {}), dev.get("capacity", {})):
                out |= {k for k in keys if "/" not in k and f"{driver}/{k}" in keys}
    return out


def cel_reads_both_spellings(s: Scenario) -> list[str]:
    """Names published both ways that a selector of the claim reads.  The 1.36 and 1.37 schedulers
    build CEL's attribute map from both entries in the map's random order, so which value such a
    selector sees is chance; 1.38 always reads ``<driver>/x``.  Judged from the text: a selector
    that mentions the name at all counts."""
    names = both_spellings(s)
    return sorted(n for n in names if any(re.search(rf"\b{re.escape(n)}\b", e) for e in s.selectors()))


def generate(
    seed: int,
    nodes: tuple[str, ...] = ("node-0", "node-1"),
    features: frozenset[str] = DEFAULT_FEATURES,
    namespace: str = "default",
) -> Scenario:
    """One scenario; ``nodes`` must be real node names when used on a cluster."""
    rng = random.Random(seed)
    prefix = f"s{seed}"
    used: set[str] = set()
    if "shares" not in features or seed % SHARE_PERIOD >= SHARE_SEEDS:
        features = features - {"shares"}
    slices: list[dict[str, Any]] = []
    for node in nodes:
        slices.extend(_node_slices(rng, prefix, node, features, used))
    class_name = f"{prefix}-gpu"
    classes = [device_class(class_name)]
    claim = _claim(rng, prefix, class_name, namespace, features, used)
    rules = _taint_rules(seed, prefix, slices, features, used)
    return Scenario(seed, slices, classes, claim, sorted(used), taint_rules=rules)


def _taint_rules(seed: int, prefix: str, slices: list[dict[str, Any]], features: frozenset[str],
                 used: set[str]) -> list[dict[str, Any]]:
    """DeviceTaintRules for a third of the scenarios: a whole pool or one device of it, with a
    taint the claim's tolerations may or may not cover. Drawn from a stream of their own, so the
    scenario's other objects stay those of its seed whether the feature is on or not."""
    if "taint-rules" not in features:
        return []
    rng = random.Random(f"taint-rules-{seed}")
    if rng.random() >= 0.35:
        return []
    used.add("taint-rules")
    pools = sorted({sl["spec"]["pool"]["name"] for sl in slices})
    effects = ["NoSchedule", "NoExecute"] + (["None"] if "taint-none" in features else [])
    rules = []
    for i in range(rng.randint(1, 2)):
        pool = rng.choice(pools)
        devices = [d["name"] for sl in slices if sl["spec"]["pool"]["name"] == pool for d in sl["spec"].get("devices", [])]
        selector = {"driver": DRIVER, "pool": pool}
        if devices and rng.random() < 0.7:
            selector["device"] = rng.choice(devices)
        taint = {"key": rng.choice(("gpu.dra-driver.io/unhealthy", "gpu.dra-driver.io/maintenance")),
                 "value": "planned", "effect": rng.choice(effects)}
        rules.append({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
                      "metadata": {"name": f"{prefix}-rule-{i}"}, "spec": {"deviceSelector": selector, "taint": taint}})
    return rules


def generate_many(first_seed: int, count: int, **kwargs: Any) -> list[Scenario]:
    return [generate(first_seed + i, **kwargs) for i in range(count)]


def _node_slices(rng: random.Random, prefix: str, node: str, features: frozenset[str], used: set[str]) -> list[dict[str, Any]]:
    pool = f"{prefix}-{node}"
    # Share scenarios keep nodes small, so that several shares must meet on one device.
    n = rng.randint(1, 3) if "shares" in features else rng.randint(1, 8)
    partitioned = "counters" in features and "shares" not in features and rng.random() < 0.3
    devices = [make_device(rng, i, n, features, used) for i in range(n)]
    counter_slice: dict[str, Any] | None = None
    if partitioned:
        used.add("counters")
        # Separate slice for the counters (required in 1.35+); two partitions per GPU.
        counter_slice = make_slice(f"{pool}-counters", pool, node, 2, [])
        counter_slice["spec"]["sharedCounters"] = [
            {"name": f"gpu-{i}-counters", "counters": {"memory": {"value": "80Gi"}}} for i in range(n)
        ]
        devices = []
        for i in range(n):
            for half in range(2):
                dev = make_device(rng, i, n, features, used)
                dev["name"] = f"gpu-{i}-part-{half}"
                dev["consumesCounters"] = [{"counterSet": f"gpu-{i}-counters", "counters": {"memory": {"value": "48Gi"}}}]
                devices.append(dev)
    device_slice = make_slice(f"{pool}-devices", pool, node, 2 if counter_slice else 1, devices)
    return [device_slice] + ([counter_slice] if counter_slice else [])


def make_slice(name: str, pool: str, node: str, count: int, devices: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": DRIVER,
        "nodeName": node,
        "pool": {"name": pool, "generation": 1, "resourceSliceCount": count},
    }
    if devices:
        spec["devices"] = devices
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name}, "spec": spec}


def make_device(rng: random.Random, index: int, total: int, features: frozenset[str], used: set[str]) -> dict[str, Any]:
    dev: dict[str, Any] = {
        "name": f"gpu-{index}",
        "attributes": {
            "model": {"string": rng.choice(MODELS)},
            "index": {"int": index},
            "numaNode": {"int": 0 if index < max(total // 2, 1) else 1},
            "driverVersion": {"version": rng.choice(("535.104.5", "550.54.15", "560.1.0"))},
        },
        "capacity": {"memory": {"value": rng.choice(("24Gi", "40Gi", "80Gi"))}},
    }
    if rng.random() < 0.5:
        dev["attributes"]["migCapable"] = {"bool": rng.random() < 0.5}
    if "taints" in features and rng.random() < 0.2:
        used.add("taints")
        effects = ["NoSchedule", "NoExecute"] + (["None"] if "taint-none" in features else [])
        dev["taints"] = [{"key": "gpu.dra-driver.io/unhealthy", "value": "xid", "effect": rng.choice(effects)}]
    if "shares" in features and rng.random() < 0.7:  # the rest stay ordinary devices among shareable ones
        make_shareable(rng, dev, used)
    return dev


def make_shareable(rng: random.Random, dev: dict[str, Any], used: set[str]) -> None:
    used.add("shares")
    total = dev["capacity"]["memory"]["value"]
    cap: dict[str, Any] = {"value": total}
    policy = rng.choice(("none", "range-step", "range", "values"))
    if policy == "range-step":
        used.add("validRange-step")
        cap["requestPolicy"] = {"default": "8Gi", "validRange": {"min": "8Gi", "max": total, "step": "8Gi"}}
    elif policy == "range":
        used.add("validRange")
        cap["requestPolicy"] = {"default": "4Gi", "validRange": {"min": "4Gi"}}
    elif policy == "values":
        used.add("validValues")
        cap["requestPolicy"] = {"default": "10Gi", "validValues": ["10Gi", "20Gi"] + (["40Gi"] if total != "24Gi" else [])}
    name = rng.choice(_CAPACITY_NAMES)
    if name != "memory":
        used.add("capacity-qualified")
    dev["capacity"] = {name: cap}
    dev["allowMultipleAllocations"] = True


def device_class(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
    }


def _selector(rng: random.Random) -> dict[str, Any]:
    template = rng.choice(_SELECTORS)
    expr = template.format(
        model=rng.choice(MODELS), mem=rng.choice(("20Gi", "40Gi", "64Gi")), index=rng.randint(1, 6),
        version=rng.choice(("535.0.0", "550.0.0")), prefix=rng.choice(("h", "a", "l")),
    )  # fmt: skip
    return {"cel": {"expression": expr}}


def _exact(rng: random.Random, class_name: str, features: frozenset[str], used: set[str]) -> dict[str, Any]:
    body: dict[str, Any] = {"deviceClassName": class_name}
    if "selectors" in features and rng.random() < 0.6:
        used.add("selectors")
        body["selectors"] = [_selector(rng) for _ in range(rng.randint(1, 2))]
    if "all" in features and rng.random() < 0.15:
        used.add("all")
        body["allocationMode"] = "All"
    else:
        body["allocationMode"] = "ExactCount"
        body["count"] = rng.choice((1, 1, 2, 2, 3, 4, 6))
    if "taints" in features and rng.random() < 0.3:
        used.add("tolerations")
        body["tolerations"] = [{"key": "gpu.dra-driver.io/unhealthy", "operator": "Exists"}]
    if "shares" in features and rng.random() < 0.75:
        name = rng.choice(_CAPACITY_NAMES)
        used.add("share-request-qualified" if "/" in name else "share-request")
        body["capacity"] = {"requests": {name: rng.choice(SHARE_AMOUNTS)}}
        if body["allocationMode"] == "ExactCount" and rng.random() < 0.3:
            body["count"] = rng.choice((2, 3))  # several shares of one device, on a small node
    return body


def _claim(
    rng: random.Random, prefix: str, class_name: str, namespace: str, features: frozenset[str], used: set[str]
) -> dict[str, Any]:
    requests: list[dict[str, Any]] = []
    for r in range(rng.randint(1, 3) if "shares" in features else rng.randint(1, 2)):
        name = f"r{r}"
        if "firstAvailable" in features and rng.random() < 0.3:
            used.add("firstAvailable")
            subs = []
            for j in range(rng.randint(2, 3)):
                sub = _exact(rng, class_name, features - {"all"}, used)
                subs.append({"name": f"alt{j}", **sub})
            if rng.random() < 0.4:
                # A later alternative that errors on some devices: whether the scheduler reaches
                # it (and so fails with an error) depends on the earlier ones failing first.
                used.add("firstAvailable-error")
                subs[-1].setdefault("selectors", []).append({"cel": {"expression": _RAISING_SELECTOR}})
            requests.append({"name": name, "firstAvailable": subs})
        else:
            requests.append({"name": name, "exactly": _exact(rng, class_name, features, used)})
    if len(requests) > 1 and rng.random() < 0.15:
        # A later request no device satisfies: the earlier ones decide whether the verdict is an
        # error (a CEL runtime error reached first) or unschedulable.
        used.add("later-empty")
        last = requests[-1].get("exactly") or requests[-1]["firstAvailable"][-1]
        last["selectors"] = [*last.get("selectors", []), {"cel": {"expression": _NO_SUCH_MODEL}}]
    devices: dict[str, Any] = {"requests": requests}
    if "constraints" in features and rng.random() < 0.4:
        devices["constraints"] = [_constraint(rng, requests, used)]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"{prefix}-claim", "namespace": namespace, "uid": f"{prefix}-uid"},
        "spec": {"devices": devices},
    }


def _constraint(rng: random.Random, requests: list[dict[str, Any]], used: set[str]) -> dict[str, Any]:
    scope = [] if rng.random() < 0.5 else [requests[0]["name"]]
    first = requests[0].get("exactly")
    if first is not None and first.get("allocationMode") == "ExactCount" and rng.random() < 0.4:
        # Three or more devices under one constraint: the 1.36 scheduler's distinctAttribute
        # compares each device only with the previous one of its request.
        first["count"] = rng.choice((3, 4))
        used.add("constraint-count3")
    kind = "distinctAttribute" if rng.random() < 0.35 else "matchAttribute"
    used.add("constraints" if kind == "matchAttribute" else "distinct")
    if kind == "matchAttribute" and any((r.get("exactly") or {}).get("allocationMode") == "All" for r in requests):
        used.add("all-match")
    constraint: dict[str, Any] = {kind: f"{DRIVER}/{rng.choice(('numaNode', 'numaNode', 'model'))}"}
    if scope:
        constraint["requests"] = scope
    return constraint


# --------------------------------------------------------------------------- validation


def _check_name(kind: str, value: Any, pattern: re.Pattern[str], limit: int, problems: list[str]) -> None:
    if not isinstance(value, str) or len(value) > limit or not pattern.fullmatch(value):
        problems.append(f"{kind} {value!r} is not valid")


def _check_key(key: str, problems: list[str]) -> None:
    domain, sep, ident = key.rpartition("/")
    if (sep and (len(domain) > 63 or not _DNS_SUBDOMAIN.fullmatch(domain))) or len(ident) > 32 or not _C_IDENT.fullmatch(ident):
        problems.append(f"attribute/capacity key {key!r} is not valid")


def validate_scenario(s: Scenario) -> list[str]:
    """Problems the API server would reject (subset of its validation); empty when fine."""
    problems: list[str] = []
    pools: dict[str, list[dict[str, Any]]] = {}
    for sl in s.slices:
        _check_name("slice name", sl["metadata"]["name"], _DNS_SUBDOMAIN, 253, problems)
        spec = sl["spec"]
        _check_name("driver", spec["driver"], _DNS_SUBDOMAIN, 63, problems)
        pools.setdefault(spec["pool"]["name"], []).append(spec)
        devices = spec.get("devices", [])
        advanced = any("taints" in d or "consumesCounters" in d for d in devices)
        if len(devices) > (64 if advanced else 128):
            problems.append(f"slice {sl['metadata']['name']}: too many devices")
        if devices and spec.get("sharedCounters"):
            problems.append(f"slice {sl['metadata']['name']}: devices and sharedCounters together")
        for d in devices:
            _check_name("device name", d["name"], _DNS_LABEL, 63, problems)
            if len(d.get("attributes", {})) + len(d.get("capacity", {})) > 32:
                problems.append(f"device {d['name']}: too many attributes")
            for key in [*d.get("attributes", {}), *d.get("capacity", {})]:
                _check_key(key, problems)
            for key, value in d.get("attributes", {}).items():
                if "version" in value and not _SEMVER.fullmatch(value["version"]):
                    problems.append(f"device {d['name']}: attribute {key} {value['version']!r} is not a semantic version")
    for name, specs in pools.items():
        # A pool may declare more slices than it has (one still being published: the API server
        # accepts that, the scheduler calls the pool incomplete), never fewer.
        counts = {sp["pool"]["resourceSliceCount"] for sp in specs}
        if len(counts) != 1 or min(counts) < len(specs):
            problems.append(f"pool {name}: resourceSliceCount {counts} for {len(specs)} slices")
        names = [d["name"] for sp in specs for d in sp.get("devices", [])]
        if len(names) != len(set(names)):
            problems.append(f"pool {name}: duplicate device names")
    for cls in s.classes:
        _check_name("class name", cls["metadata"]["name"], _DNS_SUBDOMAIN, 253, problems)
    _check_name("claim name", s.claim["metadata"]["name"], _DNS_SUBDOMAIN, 253, problems)
    for held in s.allocated:
        _check_name("claim name", held["metadata"]["name"], _DNS_SUBDOMAIN, 253, problems)
        results = held.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
        spec_requests = {r["name"] for r in held["spec"]["devices"]["requests"]}
        if not results or any(r["request"] not in spec_requests for r in results):
            problems.append(f"allocated claim {held['metadata']['name']}: results must name its requests")
    for req in s.claim["spec"]["devices"]["requests"]:
        _check_name("request name", req["name"], _DNS_LABEL, 63, problems)
        bodies = [req["exactly"]] if "exactly" in req else req["firstAvailable"]
        if len(bodies) > 8:
            problems.append(f"request {req['name']}: too many subrequests")
        for b in bodies:
            if b.get("allocationMode") == "All" and "count" in b:
                problems.append(f"request {req['name']}: count with All")
            if len(b.get("selectors", [])) > 32:
                problems.append(f"request {req['name']}: too many selectors")
    return problems
