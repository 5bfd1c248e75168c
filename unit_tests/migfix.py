"""Fleets for migrate's tests: Nodes, and the slices the node plugin publishes for them (by its own path)."""

from __future__ import annotations

import copy
from typing import Any

from dra_driver.tools.migrate.config import CONFIG_LABEL
from e2e.generators.clusterobjects import plugin_slice

DRIVER = "gpu.dra-driver.io"


def slice_of(n: int, profile: str = "h100-8x", *, shares: int = 0) -> dict[str, Any]:
    """Node ``n``'s slice; ``shares``: as published with ``--consumable-shares=<shares>``."""
    body = copy.deepcopy(plugin_slice(n, profile))
    if shares:
        for device in body["spec"]["devices"]:
            device["allowMultipleAllocations"] = True
            device.setdefault("capacity", {})["shares"] = {"value": str(shares), "requestPolicy": {"default": "1"}}
    return body


def node(n: int, label: str | None = None, *, device_plugin: dict[str, str] | None = None) -> dict[str, Any]:
    capacity = {"cpu": "8", **(device_plugin or {})}
    return {"metadata": {"name": f"node-{n:04d}", "labels": {CONFIG_LABEL: label} if label else {}},
            "status": {"capacity": capacity, "allocatable": capacity}}


def pod(name: str, resources: dict[str, str], *, node_name: str | None = None, namespace: str = "ml",
        kind: str = "Pod") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "cuda", "resources": {"limits": resources}}]}
    if node_name:
        spec["nodeName"] = node_name
    if kind == "Pod":
        return {"kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": spec}
    template = {"template": {"spec": spec}}
    body = {"jobTemplate": {"spec": template}} if kind == "CronJob" else template
    return {"kind": kind, "metadata": {"name": name, "namespace": namespace}, "spec": body}
