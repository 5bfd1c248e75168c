"""Pure mapping from a pod and its prepared claims to per-container CDI devices.

Works on pods as plain API JSON dicts (camelCase), as returned by the API server.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .model import PreparedDevice

Pod = Mapping[str, Any]


class ClaimNamePending(Exception):
    """A template-generated claim has no entry in pod status yet (the controller is behind)."""


def pod_claim_names(pod: Pod) -> dict[str, str | None]:
    """Pod claim name -> ResourceClaim name; ``None`` means the claim is not needed.

    The resource-claim controller records the generated name in ``status.resourceClaimStatuses``;
    an entry with a null name means no claim is needed, a missing entry means "not yet".
    """
    statuses = {s.get("name"): s for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
    out: dict[str, str | None] = {}
    for pc in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = pc.get("name", "")
        if pc.get("resourceClaimName"):
            out[name] = pc["resourceClaimName"]
        elif pc.get("resourceClaimTemplateName"):
            if name not in statuses:
                raise ClaimNamePending(f'pod claim "{name}": ResourceClaim not created yet from template')
            out[name] = statuses[name].get("resourceClaimName") or None
        else:
            out[name] = None
    return out


def extended_resource_claim(pod: Pod) -> tuple[str | None, list[dict[str, str]]]:
    ext = (pod.get("status") or {}).get("extendedResourceClaimStatus") or {}
    return ext.get("resourceClaimName") or None, list(ext.get("requestMappings") or [])


def claims_to_prepare(pod: Pod) -> list[str]:
    """Names of all ResourceClaims the pod needs, in a stable order without duplicates."""
    names = [n for n in pod_claim_names(pod).values() if n]
    ext, _ = extended_resource_claim(pod)
    if ext:
        names.append(ext)
    return list(dict.fromkeys(names))


def device_matches(request_names: Sequence[str], request: str) -> bool:
    """The kubelet's rule: an empty container request or an empty device list means "all"."""
    return not request or not request_names or request in request_names


def all_containers(pod: Pod) -> list[Mapping[str, Any]]:
    spec = pod.get("spec") or {}
    return list(spec.get("initContainers") or []) + list(spec.get("containers") or [])


def _ids(devices: Iterable[PreparedDevice], request: str) -> list[str]:
    return [i for d in devices if device_matches(d.request_names, request) for i in d.cdi_device_ids]


def container_cdi_ids(pod: Pod, devices_by_claim: Mapping[str, Sequence[PreparedDevice]]) -> dict[str, list[str]]:
    """Container name -> CDI device IDs to inject, in claim order, without duplicates.

    ``devices_by_claim`` is keyed by ResourceClaim name. Raises ClaimNamePending like
    ``pod_claim_names``.
    """
    names = pod_claim_names(pod)
    ext_claim, mappings = extended_resource_claim(pod)
    out: dict[str, list[str]] = {}
    for c in all_containers(pod):
        cname = c.get("name", "")
        ids: list[str] = []
        for ref in (c.get("resources") or {}).get("claims") or []:
            claim = names.get(ref.get("name", ""))
            if claim:
                ids += _ids(devices_by_claim.get(claim, ()), ref.get("request") or "")
        if ext_claim:
            for m in mappings:
                if m.get("containerName") == cname:
                    ids += _ids(devices_by_claim.get(ext_claim, ()), m.get("requestName") or "")
        out[cname] = list(dict.fromkeys(ids))
    return out


def spec_env(container: Mapping[str, Any]) -> dict[str, str]:
    """Literal env of the container spec (valueFrom needs a real kubelet and is skipped)."""
    return {e["name"]: e["value"] for e in container.get("env") or [] if "name" in e and "value" in e}
