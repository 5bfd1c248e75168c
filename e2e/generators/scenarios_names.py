"""Seeded scenarios aimed at where the 1.38 kube-scheduler decides differently from 1.36 and 1.37.

The structured allocator's ``stable`` variant that a 1.38 scheduler runs changes a few decisions
(issue 42; ``/work/shared/reference/kubernetes-1.38.md`` §3.2); each scenario of this family
exercises one of them, named by its seed (:func:`rule_of`) and recorded in its features as
``names:<rule>`` (with ``names:<rule>/<variant>`` for the variant):

- ``dual-attribute``: devices publish both ``x`` and ``<driver>/x`` with different values, read by
  a class or claim selector, or compared by matchAttribute / distinctAttribute;
- ``capacity-names``: capacity published as ``memory`` or ``<driver>/memory``, requested either
  way, or both ways at once in one request (an error in 1.38);
- ``build-metadata``: driver versions that differ only in build metadata (``570.86.10+a``,
  ``570.86.10+b``) under matchAttribute / distinctAttribute;
- ``uncomparable``: a version attribute whose numbers do not fit the scheduler's semver type (the
  1.37 API server accepts them, 1.38's does not parse them), under matchAttribute /
  distinctAttribute: 1.38 aborts when a constraint meets it;
- ``all-incomplete``: an ``All`` request beside a pool that declares more slices than it has, on one
  node, while the other node's pool is complete;
- ``exclusive-shares``: another claim of the namespace holds a share of a device whose slice now
  says it cannot be shared.

Pure and deterministic like :mod:`e2e.generators.scenarios`, whose builders it uses; every object is
one the 1.37 API server accepts (:func:`e2e.generators.scenarios.validate_scenario`).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from typing import Any

from e2e.generators.scenarios import (
    DRIVER,
    MODELS,
    SHARE_AMOUNTS,
    Scenario,
    device_class,
    make_device,
    make_shareable,
    make_slice,
)

__all__ = ["FAMILY_SIZE", "FIRST_SEED", "RULES", "generate", "generate_many", "rule_of"]

RULES = ("dual-attribute", "capacity-names", "build-metadata", "uncomparable", "all-incomplete", "exclusive-shares")
# Seeds of their own, far from the ordinary corpus's, so that both can share a bed (names carry the seed).
FIRST_SEED = 100_000
FAMILY_SIZE = 40 * len(RULES)
# Larger than 2^64 - 1: the API server of 1.37 takes it as a semantic version, the 1.38
# scheduler's semver type cannot hold it.
HUGE_VERSION = "100000000000000000000.0.0"
_BUILDS = ("570.86.10+a", "570.86.10+b", "570.86.10", "570.86.11+a")
_MEMORY_NAMES = ("memory", f"{DRIVER}/memory")


def rule_of(seed: int) -> str:
    return RULES[seed % len(RULES)]


def _variant(seed: int, count: int) -> int:
    """Cycles through a rule's ``count`` variants over its consecutive seeds."""
    return (seed // len(RULES)) % count


def generate(seed: int, nodes: tuple[str, ...] = ("node-0", "node-1"), namespace: str = "default") -> Scenario:
    """One scenario of the family; ``nodes`` must be real node names when used on a cluster."""
    rng = random.Random(seed)
    rule = rule_of(seed)
    prefix = f"s{seed}"
    class_name = f"{prefix}-gpu"
    s = Scenario(seed, [], [device_class(class_name)], _claim(prefix, namespace, []), [f"names:{rule}"])
    _BUILD[rule](rng, s, nodes, class_name)
    return s


def generate_many(first_seed: int, count: int, **kwargs: Any) -> list[Scenario]:
    return [generate(first_seed + i, **kwargs) for i in range(count)]


# --------------------------------------------------------------------------- shared parts


def _claim(prefix: str, namespace: str, requests: list[dict[str, Any]], name: str = "claim") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": f"{prefix}-{name}", "namespace": namespace, "uid": f"{prefix}-{name}-uid"},
        "spec": {"devices": {"requests": requests}},
    }  # fmt: skip


def _request(name: str, class_name: str, count: int | None = 1, selectors: tuple[str, ...] = (),
             capacity: dict[str, str] | None = None) -> dict[str, Any]:
    """An ``exactly`` request: ``count`` devices, or all of them when ``count`` is None."""
    body: dict[str, Any] = {"deviceClassName": class_name}
    body.update({"allocationMode": "All"} if count is None else {"allocationMode": "ExactCount", "count": count})
    if selectors:
        body["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    if capacity:
        body["capacity"] = {"requests": capacity}
    return {"name": name, "exactly": body}


def _devices(rng: random.Random, low: int, high: int) -> list[dict[str, Any]]:
    n = rng.randint(low, high)
    return [make_device(rng, i, n, frozenset(), set()) for i in range(n)]


def _node_slices(s: Scenario, nodes: tuple[str, ...], make: Callable[[str], list[dict[str, Any]]]) -> None:
    for node in nodes:
        pool = f"s{s.seed}-{node}"
        s.slices.append(make_slice(f"{pool}-devices", pool, node, 1, make(node)))


def _constraint(rng: random.Random, s: Scenario, attribute: str, kind: str) -> None:
    devices = s.claim["spec"]["devices"]
    constraint: dict[str, Any] = {kind: f"{DRIVER}/{attribute}"}
    if len(devices["requests"]) > 1 and rng.random() < 0.3:
        constraint["requests"] = [devices["requests"][0]["name"]]
    devices["constraints"] = [constraint]


def _constrained_requests(rng: random.Random, class_name: str) -> list[dict[str, Any]]:
    """Two or three devices in one request, or one or two in each of two requests."""
    if rng.random() < 0.5:
        return [_request("r0", class_name, rng.choice((2, 2, 3)))]
    return [_request("r0", class_name, rng.choice((1, 2))), _request("r1", class_name, 1)]


# --------------------------------------------------------------------------- the rules


def _dual_attribute(rng: random.Random, s: Scenario, nodes: tuple[str, ...], class_name: str) -> None:
    variant = ("class-cel", "claim-cel", "match", "distinct")[_variant(s.seed, 4)]
    s.features.append(f"names:dual-attribute/{variant}")
    name = rng.choice(("model", "numaNode"))

    def other(value: dict[str, Any]) -> dict[str, Any]:
        if "string" in value:
            return {"string": rng.choice([m for m in MODELS if m != value["string"]])}
        return {"int": 1 - int(value["int"])}

    def devices(_: str) -> list[dict[str, Any]]:
        out = _devices(rng, 2, 4)
        for dev in out:
            attrs = dev["attributes"]
            roll = rng.random()
            if roll < 0.7:  # both spellings, different values, either one first
                attrs[f"{DRIVER}/{name}"] = other(attrs[name])
                if rng.random() < 0.5:
                    dev["attributes"] = {f"{DRIVER}/{name}": attrs.pop(f"{DRIVER}/{name}"), **attrs}
            elif roll < 0.85:  # the qualified spelling alone
                attrs[f"{DRIVER}/{name}"] = attrs.pop(name)
        return out

    _node_slices(s, nodes, devices)
    wanted = f'"{rng.choice(MODELS)}"' if name == "model" else str(rng.randint(0, 1))
    selector = f'device.attributes["{DRIVER}"].{name} == {wanted}'
    if variant == "class-cel":
        s.classes[0]["spec"]["selectors"].append({"cel": {"expression": selector}})
        s.claim["spec"]["devices"]["requests"] = [_request("r0", class_name, rng.choice((1, 2, 3)))]
    elif variant == "claim-cel":
        s.claim["spec"]["devices"]["requests"] = [_request("r0", class_name, rng.choice((1, 2, 3)), (selector,))]
    else:
        s.claim["spec"]["devices"]["requests"] = _constrained_requests(rng, class_name)
        _constraint(rng, s, name, "matchAttribute" if variant == "match" else "distinctAttribute")


def _capacity_names(rng: random.Random, s: Scenario, nodes: tuple[str, ...], class_name: str) -> None:
    variant = ("one-way", "both-ways")[_variant(s.seed, 2)]
    s.features.append(f"names:capacity-names/{variant}")

    def devices(_: str) -> list[dict[str, Any]]:
        out = _devices(rng, 1, 3)
        for dev in out:
            if rng.random() < 0.7:
                make_shareable(rng, dev, set())  # publishes memory under either spelling
            else:
                dev["capacity"] = {rng.choice(_MEMORY_NAMES): dev["capacity"]["memory"]}
        return out

    _node_slices(s, nodes, devices)
    amount = rng.choice(SHARE_AMOUNTS)
    if variant == "one-way":
        capacity = {rng.choice(_MEMORY_NAMES): amount}
    else:
        capacity = {"memory": amount, f"{DRIVER}/memory": rng.choice((amount, rng.choice(SHARE_AMOUNTS)))}
    requests = [_request("r0", class_name, rng.choice((1, 1, 2)), capacity=capacity)]
    if rng.random() < 0.4:  # an earlier request that names no capacity, which either verdict may follow
        requests.insert(0, _request("first", class_name, 1))
    s.claim["spec"]["devices"]["requests"] = requests


def _build_metadata(rng: random.Random, s: Scenario, nodes: tuple[str, ...], class_name: str) -> None:
    kind = ("matchAttribute", "distinctAttribute")[_variant(s.seed, 2)]
    s.features.append(f"names:build-metadata/{kind}")

    def devices(_: str) -> list[dict[str, Any]]:
        out = _devices(rng, 2, 4)
        for dev in out:
            dev["attributes"]["driverVersion"] = {"version": rng.choice(_BUILDS)}
        return out

    _node_slices(s, nodes, devices)
    s.claim["spec"]["devices"]["requests"] = _constrained_requests(rng, class_name)
    _constraint(rng, s, "driverVersion", kind)


def _uncomparable(rng: random.Random, s: Scenario, nodes: tuple[str, ...], class_name: str) -> None:
    kind = ("matchAttribute", "matchAttribute", "distinctAttribute")[_variant(s.seed, 3)]
    s.features.append(f"names:uncomparable/{kind}")
    huge_nodes = {n for n in nodes if rng.random() < 0.6} or {rng.choice(nodes)}

    def devices(node: str) -> list[dict[str, Any]]:
        out = _devices(rng, 2, 4)
        for dev in out:
            huge = node in huge_nodes and rng.random() < 0.5
            dev["attributes"]["firmwareVersion"] = {"version": HUGE_VERSION if huge else rng.choice(("1.2.3", "1.4.0"))}
        return out

    _node_slices(s, nodes, devices)
    s.claim["spec"]["devices"]["requests"] = _constrained_requests(rng, class_name)
    _constraint(rng, s, "firmwareVersion", kind)


def _all_incomplete(rng: random.Random, s: Scenario, nodes: tuple[str, ...], class_name: str) -> None:
    # One node's pool declares a slice more than it has; in a few scenarios both nodes' pools do.
    incomplete = {nodes[0]} | ({nodes[1]} if len(nodes) > 1 and rng.random() < 0.2 else set())
    s.features.append("names:all-incomplete/" + ("both" if len(incomplete) > 1 else "one"))
    for node in nodes:
        pool = f"s{s.seed}-{node}"
        s.slices.append(make_slice(f"{pool}-devices", pool, node, 2 if node in incomplete else 1, _devices(rng, 1, 4)))
    model = rng.choice(MODELS)
    selectors = (f'device.attributes["{DRIVER}"].model == "{model}"',) if rng.random() < 0.5 else ()
    requests = [_request("r0", class_name, None, selectors)]
    if rng.random() < 0.4:
        requests.insert(0, _request("first", class_name, rng.choice((1, 2))))
    s.claim["spec"]["devices"]["requests"] = requests


def _exclusive_shares(rng: random.Random, s: Scenario, nodes: tuple[str, ...], class_name: str) -> None:
    s.features.append("names:exclusive-shares/" + ("selected" if _variant(s.seed, 2) else "any"))
    held_nodes = [nodes[0], *(n for n in nodes[1:] if rng.random() < 0.5)]
    for node in nodes:
        devices = _devices(rng, 1, 3)  # ordinary devices: the slice no longer allows shares
        pool = f"s{s.seed}-{node}"
        s.slices.append(make_slice(f"{pool}-devices", pool, node, 1, devices))
        if node in held_nodes:
            s.allocated.append(_held(rng, s, len(s.allocated), class_name, node, pool, devices[0]["name"]))
    # "selected": the request wants the held devices (index 0) in particular.
    selectors = (f'device.attributes["{DRIVER}"].index == 0',) if _variant(s.seed, 2) else ()
    s.claim["spec"]["devices"]["requests"] = [_request("r0", class_name, rng.choice((1, 1, 2, 3)), selectors)]


def _held(rng: random.Random, s: Scenario, index: int, class_name: str, node: str, pool: str, device: str) -> dict[str, Any]:
    """A claim allocated earlier with a share of ``device``, when its slice still allowed shares."""
    held = _claim(f"s{s.seed}", s.claim["metadata"]["namespace"],
                  [_request("r0", class_name, 1, capacity={"memory": "8Gi"})], name=f"held-{index}")  # fmt: skip
    result: dict[str, Any] = {"request": "r0", "driver": DRIVER, "pool": pool, "device": device,
                              "shareID": str(uuid.UUID(int=rng.getrandbits(128), version=4))}  # fmt: skip
    # With a consumedCapacity of the device's memory, 1.37 counts an exclusive allocation's whole
    # memory on top of it and finds no room either; a share without one blocks only from 1.38 on.
    if rng.random() < 0.5:
        result["consumedCapacity"] = {"memory": rng.choice(("8Gi", "16Gi"))}
    on_node = {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}
    held["status"] = {"allocation": {"devices": {"results": [result]}, "nodeSelector": on_node}}
    return held


_BUILD: dict[str, Callable[[random.Random, Scenario, tuple[str, ...], str], None]] = {
    "dual-attribute": _dual_attribute,
    "capacity-names": _capacity_names,
    "build-metadata": _build_metadata,
    "uncomparable": _uncomparable,
    "all-incomplete": _all_incomplete,
    "exclusive-shares": _exclusive_shares,
}
