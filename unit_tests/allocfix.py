"""The engine's test fixtures: a device class, devices, slices, requests and claims in API shape."""

from __future__ import annotations

from typing import Any

D = "gpu.dra-driver.io"

CLASSES = [
    {"metadata": {"name": "gpu"}, "spec": {
        "selectors": [{"cel": {"expression": f'device.driver == "{D}"'}}],
        "config": [{"opaque": {"driver": D, "parameters": {"sharing": "none"}}}]}},
    {"metadata": {"name": "broken"}, "spec": {"selectors": [{"cel": {"expression": "device.driver =="}}]}},
]  # fmt: skip


def dev(name: str, model: str = "H100", numa: int = 0, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {"model": {"string": model}, "numa": {"int": numa}, "index": {"int": int(name.split("-")[-1])}},
        "capacity": {"memory": {"value": "80Gi"}},
        **extra,
    }


def slice_(node: str | None, devices: list[dict[str, Any]], pool: str | None = None, gen: int = 1,
           count: int = 1, name: str | None = None, **spec: Any) -> dict[str, Any]:  # fmt: skip
    body: dict[str, Any] = {"driver": D, "pool": {"name": pool or node or "shared", "generation": gen,
                                                  "resourceSliceCount": count}, "devices": devices, **spec}  # fmt: skip
    if node:
        body["nodeName"] = node
    elif not any(k in spec for k in ("allNodes", "nodeSelector", "perDeviceNodeSelection")):
        body["allNodes"] = True
    return {"metadata": {"name": name or f"{pool or node or 'shared'}-{gen}"}, "spec": body}


def request(name: str = "gpu", count: int | None = 1, selectors: tuple[str, ...] = (), cls: str = "gpu",
            **extra: Any) -> dict[str, Any]:  # fmt: skip
    body: dict[str, Any] = {"deviceClassName": cls, **extra}
    if count is not None:
        body["count"] = count
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    return {"name": name, "exactly": body}


def claim(*requests: dict[str, Any], constraints: list[Any] | None = None, config: list[Any] | None = None,
          uid: str = "uid-1") -> dict[str, Any]:  # fmt: skip
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    if config:
        devices["config"] = config
    return {"metadata": {"name": "c", "namespace": "ns", "uid": uid}, "spec": {"devices": devices}}


def picked(res: Any) -> list[str]:
    assert res.allocation is not None, res.explanation.render()
    return [f"{r['pool']}/{r['device']}" for r in res.allocation["devices"]["results"]]


NODE_A = slice_("node-a", [dev("gpu-0", numa=0), dev("gpu-1", "A100", numa=0), dev("gpu-2", numa=1), dev("gpu-3", numa=1)])
NODE_B = slice_("node-b", [dev("gpu-0", numa=0), dev("gpu-1", numa=1)])


def mig_node() -> dict[str, Any]:
    # gpu-1 is a MIG device without a "profile" attribute: selecting on it is a CEL runtime error.
    full = dev("gpu-0")
    full["attributes"]["profile"] = {"string": "full"}
    return slice_("node-a", [full, {"name": "mig-1", "attributes": {"index": {"int": 1}}}])
