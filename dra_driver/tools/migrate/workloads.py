"""Which workloads ask for a device plugin name, and what serves each of them after the switch.

The workloads are Pods (those no controller owns: the others are reported through their
controller), Deployments, StatefulSets, DaemonSets, Jobs and CronJobs; a container's
``resources.limits`` (else ``requests``) are read, init containers included. A name is reported when
it is one the fleet's device plugin configs advertise (``nvidia.com/...``) or a GPU-memory or
GPU-core extension of another device plugin (``aliyun.com/gpu-mem``, ``nvidia.com/gpumem``, ...).
For each: served or not, by which class and as what, and where it is not (or a count the class
cannot mean), the ResourceClaimTemplate to write instead. Whether it fits now is the fleet view's
``fit``: the caller passes it in as ``fit`` (None: not computed), asked with :class:`FitAsk`: the
claim each pod would get after the switch (as KEP-5004's scheduler makes it for an extended
resource: per container and name, a request for that many devices of the class; or the
template's request), and how many pods. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver.k8s.objects import as_mapping, as_mappings, as_str, meta
from dra_driver.tools.migrate.classes import Served


@dataclass(frozen=True)
class FitAsk:
    """What the fleet view's ``fit`` is asked about one workload."""

    workload: Mapping[str, Any]
    requests: tuple[dict[str, Any], ...]
    """The device requests of the claim each of its pods would get after the switch."""
    pods: int | None
    """How many pods at once (replicas, a Job's parallelism); None: a DaemonSet, one on each node."""
    classes: tuple[Mapping[str, Any], ...] = ()
    """The DeviceClasses migrate would create: the requests may name them before they exist."""


FitFn = Callable[[FitAsk], str]
"""The fleet view's answer for one workload: whether, and where, its pods fit now."""

MEMORY_EXTENSIONS = {"aliyun.com/gpu-mem": "Gi", "nvidia.com/gpumem": "Mi", "tencent.com/vcuda-memory": "256Mi"}
"""Device plugins that sell GPU memory, and the unit of their count: served here as a share of a
GPU with that much ``memory`` (``--consumable-shares``)."""
COMPUTE_EXTENSIONS = ("nvidia.com/gpucores", "nvidia.com/gpumem-percentage", "tencent.com/vcuda-core",
                      "aliyun.com/gpu-core.percentage")
"""Names that sell a percentage of a GPU: not expressible as one; the template asks for a share and says so."""
COUNT_EXTENSIONS = ("aliyun.com/gpu-count",)
SHARED_CLASS = "shared-gpu"
"""The chart's class of shareable full GPUs (``shared-gpu.<driver>``)."""


@dataclass(frozen=True)
class Request:
    resource: str
    count: int
    containers: tuple[str, ...]


def pod_spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    kind = obj.get("kind")
    spec = as_mapping(obj.get("spec"))
    if kind == "Pod":
        return spec
    if kind == "CronJob":
        spec = as_mapping(as_mapping(spec.get("jobTemplate")).get("spec"))
    return as_mapping(as_mapping(spec.get("template")).get("spec"))


def owned(obj: Mapping[str, Any]) -> bool:
    return any(ref.get("controller") is True for ref in as_mappings(meta(obj).get("ownerReferences")))


def asked_resources(spec: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Each container's (init containers first) name and the resources it asks for: ``limits`` over ``requests``."""
    out = []
    for container in [*as_mappings(spec.get("initContainers")), *as_mappings(spec.get("containers"))]:
        resources = as_mapping(container.get("resources"))
        asked = {**as_mapping(resources.get("requests")), **as_mapping(resources.get("limits"))}
        out.append((as_str(container.get("name")) or "", asked))
    return out


def _count(value: Any) -> int:
    text = str(value).strip()
    return int(text) if text.isdigit() else 0


def is_gpu_name(resource: str, served: Mapping[str, Served]) -> bool:
    return (resource in served or resource.startswith("nvidia.com/") or resource in MEMORY_EXTENSIONS
            or resource in COMPUTE_EXTENSIONS or resource in COUNT_EXTENSIONS)


def requests(spec: Mapping[str, Any], served: Mapping[str, Served]) -> list[Request]:
    found: dict[tuple[str, int], list[str]] = {}
    for container, asked in asked_resources(spec):
        for resource, value in asked.items():
            if is_gpu_name(str(resource), served):
                found.setdefault((str(resource), _count(value)), []).append(container)
    return [Request(r, c, tuple(names)) for (r, c), names in sorted(found.items())]


def workload_name(obj: Mapping[str, Any]) -> str:
    metadata = meta(obj)
    return f"{as_str(obj.get('kind'))} {as_str(metadata.get('namespace')) or ''}/{as_str(metadata.get('name')) or ''}"


def claim_template(obj: Mapping[str, Any], request: Mapping[str, Any], suffix: str) -> dict[str, Any]:
    metadata = meta(obj)
    name = f"{as_str(metadata.get('name')) or 'workload'}-{suffix}"[:63].rstrip("-.")
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": as_str(metadata.get("namespace")) or "default"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": dict(request)}]}}},
    }


def _row(obj: Mapping[str, Any], req: Request, served: Mapping[str, Served], driver: str) -> dict[str, Any]:
    row: dict[str, Any] = {"workload": workload_name(obj), "containers": list(req.containers),
                           "resource": req.resource, "count": req.count}
    entry = served.get(req.resource)
    if entry is not None:
        meanings = sorted({b.describe() for b in entry.backings})
        row.update(served=True, deviceClass=entry.class_name, meaning=" or ".join(meanings))
        if entry.shares and req.count > 1:
            row["note"] = (f"{req.count} of {req.resource} become {req.count} devices of the class, each one "
                           f"share, possibly of different GPUs; for {req.count} shares of one GPU use the template")
            if entry.refused_more:
                row["note"] += " (the device plugin refused it: failRequestsGreaterThanOne)"
            row["template"] = claim_template(obj, {"deviceClassName": entry.class_name,
                                                   "capacity": {"requests": {"shares": str(req.count)}}}, "gpu")
        return row
    row.update(served=False, deviceClass=None)
    unit = MEMORY_EXTENSIONS.get(req.resource)
    if unit is not None:
        amount = f"{req.count * 256}Mi" if unit == "256Mi" else f"{req.count}{unit}"
        row["note"] = (f"no DeviceClass can serve {req.resource}: a class asks for devices, not memory; claim a "
                       f"share of {amount} of a GPU (the plugin with --consumable-shares)")
        row["template"] = claim_template(obj, {"deviceClassName": f"{SHARED_CLASS}.{driver}",
                                               "capacity": {"requests": {"memory": amount}}}, "gpu")
    elif req.resource in COMPUTE_EXTENSIONS or req.resource in COUNT_EXTENSIONS:
        row["note"] = (f"no DeviceClass can serve {req.resource}; claim a share of a GPU (capacity.requests "
                       "multiprocessors sets its compute share)")
        row["template"] = claim_template(obj, {"deviceClassName": f"{SHARED_CLASS}.{driver}"}, "gpu")
    else:
        row["note"] = f"no node's config serves {req.resource} through this driver: no class is generated for it"
    return row


def pod_count(obj: Mapping[str, Any]) -> int | None:
    """How many pods of the workload run at once: 1 for a Pod, ``replicas`` (default 1), a Job's
    ``parallelism`` (default 1); None for a DaemonSet (one on each node)."""
    kind = obj.get("kind")
    spec = as_mapping(obj.get("spec"))
    if kind == "DaemonSet":
        return None
    if kind == "CronJob":
        spec = as_mapping(as_mapping(spec.get("jobTemplate")).get("spec"))
    field = "replicas" if kind in ("Deployment", "StatefulSet", "ReplicaSet") else "parallelism" if kind in (
        "Job", "CronJob") else None
    value = spec.get(field) if field else None
    return max(value, 0) if isinstance(value, int) and not isinstance(value, bool) else 1


def fit_requests(asked: Iterable[Request], rows: Iterable[Mapping[str, Any]]) -> tuple[dict[str, Any], ...] | None:
    """The device requests of a pod's claim after the switch, one per container and name: ``count``
    devices of the class that serves the name, else the template's request; None where a name has
    neither (nothing to fit it with) or no count."""
    out: list[dict[str, Any]] = []
    for req, row in zip(asked, rows, strict=True):
        if row.get("served"):
            exactly: dict[str, Any] = {"deviceClassName": row["deviceClass"], "count": req.count}
        elif row.get("template"):
            exactly = dict(row["template"]["spec"]["spec"]["devices"]["requests"][0]["exactly"])
        else:
            return None
        if req.count < 1:
            return None
        for _ in req.containers:
            out.append({"name": f"gpu-{len(out)}", "exactly": dict(exactly)})
    return tuple(out) or None


def report(objects: Iterable[Mapping[str, Any]], served: Mapping[str, Served], driver: str,
           fit: FitFn | None = None, classes: Iterable[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """One row per workload and device plugin name it asks for, in the order of the workloads;
    ``fit``'s answer on each row of a workload whose every name can be fitted (``classes``: the
    DeviceClasses migrate would create, for ``fit``)."""
    planned = tuple(classes)
    rows: list[dict[str, Any]] = []
    for obj in objects:
        if obj.get("kind") == "Pod" and owned(obj):
            continue
        asked = requests(pod_spec(obj), served)
        mine = [_row(obj, req, served, driver) for req in asked]
        wanted = fit_requests(asked, mine) if fit is not None and asked else None
        if fit is not None and wanted is not None:
            fits = fit(FitAsk(obj, wanted, pod_count(obj), planned))
            for row in mine:
                row["fit"] = fits
        rows += mine
    return rows
