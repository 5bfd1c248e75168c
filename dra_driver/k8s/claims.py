"""Reading and editing ResourceClaims and Pods as decoded JSON: status, reservations, finalizers."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any, cast

from dra_driver.k8s.bodies import DeviceClasses, RawDeviceClass
from dra_driver.k8s.objects import Obj, as_mapping, meta

FINALIZER = "resource.kubernetes.io/delete-protection"
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"


# --------------------------------------------------------------------------------------------
# Small accessors


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return as_mapping(meta(obj).get("annotations"))


def uid_of(obj: Mapping[str, Any]) -> str:
    return str(meta(obj).get("uid", ""))


def status_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return as_mapping(obj.get("status"))


def is_allocated(claim: Mapping[str, Any]) -> bool:
    return bool(status_of(claim).get("allocation"))


def reserved_for(claim: Mapping[str, Any]) -> list[Any]:
    r = status_of(claim).get("reservedFor")
    return list(r) if isinstance(r, list) else []


def is_deleting(obj: Mapping[str, Any]) -> bool:
    return bool(meta(obj).get("deletionTimestamp"))


def is_generated_for_pod(claim: Mapping[str, Any]) -> bool:
    """Claims the resourceclaim controller created from a template for a pod."""
    if POD_CLAIM_NAME_ANNOTATION in annotations_of(claim):
        return True
    for ref in meta(claim).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") and ref.get("kind") == "Pod":
            return True
    return False


def has_finalizer(obj: Mapping[str, Any], name: str = FINALIZER) -> bool:
    return name in (meta(obj).get("finalizers") or [])


def pod_is_done(pod: Mapping[str, Any]) -> bool:
    """Terminal phase, or deleted before it was scheduled: it will never use its claims."""
    phase = status_of(pod).get("phase")
    if phase in ("Succeeded", "Failed"):
        return True
    return is_deleting(pod) and not as_mapping(pod.get("spec")).get("nodeName")


def pod_claim_keys(pod: Mapping[str, Any]) -> set[str]:
    """``namespace/name`` of every claim a pod that is not done waits for or uses."""
    if pod_is_done(pod):
        return set()
    ns = meta(pod).get("namespace") or "default"
    keys: set[str] = set()
    for rc in as_mapping(pod.get("spec")).get("resourceClaims") or []:
        if isinstance(rc, Mapping) and rc.get("resourceClaimName"):
            keys.add(f"{ns}/{rc['resourceClaimName']}")
    for st in status_of(pod).get("resourceClaimStatuses") or []:
        if isinstance(st, Mapping) and st.get("resourceClaimName"):
            keys.add(f"{ns}/{st['resourceClaimName']}")
    ext = status_of(pod).get("extendedResourceClaimStatus")
    if isinstance(ext, Mapping) and ext.get("resourceClaimName"):
        keys.add(f"{ns}/{ext['resourceClaimName']}")
    return keys


EXTENDED_RESOURCES_CLAIM = "extended resources"
"""What a pod calls the claim the scheduler made for its extended resources: that claim has no
entry, so no name, in the pod's spec."""


def pod_claim_names(pod: Mapping[str, Any]) -> dict[str, list[str]]:
    """``namespace/name`` of every claim a pod that is not done waits for or uses, each with the
    names the pod gives it (``spec.resourceClaims[].name``; :data:`EXTENDED_RESOURCES_CLAIM` for
    the extended-resource claim): what a person reading the pod knows the claim by."""
    if pod_is_done(pod):
        return {}
    ns = meta(pod).get("namespace") or "default"
    out: dict[str, list[str]] = {}

    def add(claim: Any, name: Any) -> None:
        if claim:
            names = out.setdefault(f"{ns}/{claim}", [])
            if name and str(name) not in names:
                names.append(str(name))

    for rc in as_mapping(pod.get("spec")).get("resourceClaims") or []:
        if isinstance(rc, Mapping):
            add(rc.get("resourceClaimName"), rc.get("name"))
    for st in status_of(pod).get("resourceClaimStatuses") or []:
        if isinstance(st, Mapping):
            add(st.get("resourceClaimName"), st.get("name"))
    ext = status_of(pod).get("extendedResourceClaimStatus")
    if isinstance(ext, Mapping):
        add(ext.get("resourceClaimName"), EXTENDED_RESOURCES_CLAIM)
    return out


def pod_node(pod: Mapping[str, Any]) -> str | None:
    n = as_mapping(pod.get("spec")).get("nodeName")
    return str(n) if n else None


def device_ids(allocation: Mapping[str, Any] | None, *, exclusive_only: bool = False) -> set[tuple[str, str, str]]:
    """``(driver, pool, device)`` of an allocation's results.

    With ``exclusive_only``, results that do not take the device for themselves (admin access,
    consumable-capacity shares with a ``shareID``) are left out.
    """
    out: set[tuple[str, str, str]] = set()
    if not isinstance(allocation, Mapping):
        return out
    for r in as_mapping(allocation.get("devices")).get("results") or []:
        if not isinstance(r, Mapping):
            continue
        if exclusive_only and (r.get("adminAccess") or r.get("shareID")):
            continue
        out.add((str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", ""))))
    return out


def classes_by_name(classes: DeviceClasses | Iterable[RawDeviceClass]) -> dict[str, RawDeviceClass]:
    """DeviceClasses by name, from a list of objects or a mapping that is already keyed by name."""
    if isinstance(classes, Mapping):
        return {str(k): v for k, v in cast(DeviceClasses, classes).items()}
    return {str(meta(c).get("name", "")): c for c in classes if isinstance(c, Mapping) and meta(c).get("name")}


def with_finalizer(claim: Obj) -> Obj:
    new = copy.deepcopy(claim)
    fins = list(new.setdefault("metadata", {}).get("finalizers") or [])
    if FINALIZER not in fins:
        fins.append(FINALIZER)
    new["metadata"]["finalizers"] = fins
    return new


def without_finalizer(claim: Obj) -> Obj:
    new = copy.deepcopy(claim)
    fins = [f for f in (new.setdefault("metadata", {}).get("finalizers") or []) if f != FINALIZER]
    new["metadata"]["finalizers"] = fins
    return new


def with_allocation(claim: Obj, allocation: Mapping[str, Any] | None) -> Obj:
    new = copy.deepcopy(claim)
    status = dict(new.get("status") or {})
    if allocation is None:
        status.pop("allocation", None)
        status.pop("devices", None)
    else:
        status["allocation"] = copy.deepcopy(dict(allocation))
    new["status"] = status
    return new
