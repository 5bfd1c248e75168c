"""What the controller's informers keep of each object (their :data:`dra_driver.k8s.informer.Transform`).

A controller beside a 5,000-node cluster sees 150,000 Pods and 20,000 ResourceClaims, most of which
need nothing from it. Decoded whole, a Pod or an allocated claim costs many times what the
controller reads of it (``e2e/bench/storemem.py`` measures them; docs/scale.md#the-codes-figures).
So each store keeps only what the controller reads:

* **Pods** (only those not running yet: :data:`dra_driver.controller.reconciler.WAITING_PODS`): the
  claim references and the node (what :func:`dra_driver.k8s.claims.pod_claim_keys`
  and :func:`~dra_driver.k8s.claims.pod_node` read), and nothing for a pod that waits for no claim:
  most pods use no device, and a finished pod waits for nothing. A pod that starts or stops
  waiting for a claim reaches the handler as an add or a delete.
* **ResourceClaims** that need no work (allocated, not being deleted, none of our annotations):
  identity and allocated devices, what the other claims' accounting reads
  (:func:`dra_driver.k8s.wire.allocation_view`). Any change that could give the controller work
  arrives as a watch event with the whole object, and is kept whole again. Explained claims
  without the explanation document (see :func:`claim_view`).
* **ResourceSlices**: whole, as the engine reads them, but with the many equal attribute, capacity
  and counter values shared (:class:`dra_driver.k8s.compact.Interner`), a fraction of their decoded
  size. Read in protobuf (:func:`slice_reading`), which the API server encodes in far less time than
  JSON.
* Everything: without ``managedFields``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

from dra_driver.controller.keys import EXPLANATION_ANNOTATION, OUR_ANNOTATIONS
from dra_driver.k8s import wire
from dra_driver.k8s.bodies import ClaimStatus, PodClaimRef, PodSpec, PodView, RawMeta, Toleration
from dra_driver.k8s.claims import annotations_of, is_allocated, is_deleting, pod_claim_names
from dra_driver.k8s.compact import Interner, without_managed_fields
from dra_driver.k8s.objects import Obj, as_list, as_mapping, meta
from dra_driver.k8s.wire import Reduced, allocation_view


def pod_view(pod: Obj) -> PodView | None:
    """What the controller reads of a pod that waits for claims: name, UID (its Events name it),
    node, what the scheduler's node filters read of it, and every claim it references, wherever
    the pod names it (``spec.resourceClaims``,
    ``status.resourceClaimStatuses``, ``status.extendedResourceClaimStatus``), all under
    ``spec.resourceClaims`` with the name the pod gives each (one entry per name). None when it
    waits for no claim, finished pods included; so for a kept pod
    :func:`dra_driver.k8s.claims.pod_is_done` is False, as for the pod itself."""
    names = pod_claim_names(pod)
    if not names:
        return None
    m = meta(pod)
    spec = as_mapping(pod.get("spec"))
    node = spec.get("nodeName")
    refs: list[PodClaimRef] = []
    for key in sorted(names):
        claim = key.partition("/")[2]
        refs += [{"name": n, "resourceClaimName": claim} for n in names[key]] or [{"resourceClaimName": claim}]
    view_spec: PodSpec = {"resourceClaims": refs}
    if node:
        view_spec["nodeName"] = node
    # What the scheduler's node filters read (dra_driver.controller.placement).
    if spec.get("nodeSelector"):
        view_spec["nodeSelector"] = dict(as_mapping(spec["nodeSelector"]))
    # An empty field means what an absent one does (JSON omits it, protobuf carries it as ""): the
    # view leaves both out, so the two encodings of one pod give one view.
    tolerations = [cast(Toleration, {f: t[f] for f in ("key", "operator", "value", "effect") if t.get(f)})
                   for t in map(as_mapping, as_list(spec.get("tolerations")))]
    if tolerations:
        view_spec["tolerations"] = tolerations
    required = as_mapping(as_mapping(spec.get("affinity")).get("nodeAffinity")).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    if required:
        view_spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    identity = cast(RawMeta, {k: m[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in m})
    return {"metadata": identity, "spec": view_spec}


def needs_no_work(claim: Mapping[str, Any]) -> bool:
    """Allocated, not being deleted and carrying none of our annotations: the controller only counts
    its devices as taken (:func:`dra_driver.controller.verdicts.classify` says IGNORE, and stays so
    until the claim changes)."""
    return is_allocated(claim) and not is_deleting(claim) and not any(a in annotations_of(claim) for a in OUR_ANNOTATIONS)


def claim_view(claim: Obj) -> Obj:
    """A claim that needs no work reduced to its identity and devices; any other one whole, but for
    our own explanation: its hash and summary annotations say what the controller needs to know
    (:func:`dra_driver.controller.annotations.annotation_patch`), the document itself is up to
    32 KiB, and 10,000 explained claims would keep 300 MiB of them. A claim being deleted keeps it:
    finalizing writes the cached claim back."""
    if not needs_no_work(claim):
        m = claim.get("metadata")
        if isinstance(m, dict) and not is_deleting(claim):
            annotations = m.get("annotations")
            if isinstance(annotations, dict) and EXPLANATION_ANNOTATION in annotations:
                m["annotations"] = {**annotations, EXPLANATION_ANNOTATION: ""}
        return without_managed_fields(claim)
    view = cast(Obj, allocation_view(claim))  # kept in the claim informer's store, a plain dict
    view["metadata"]["resourceVersion"] = str(meta(claim).get("resourceVersion") or "")
    view["apiVersion"], view["kind"] = claim.get("apiVersion"), claim.get("kind")
    return view


def holdings(claim: Mapping[str, Any] | None) -> ClaimStatus:
    """The devices a claim holds, as the accounting of the others reads them (none for no claim)."""
    return allocation_view(claim)["status"] if claim is not None else {}


def _share(interner: Interner, parent: Any, field: str) -> None:
    if isinstance(parent, dict) and field in parent:
        parent[field] = interner.share(parent[field])


def slice_reading() -> Reduced[Obj]:
    """How the slice informer reads slices: in protobuf, values shared as they are decoded
    (:func:`dra_driver.k8s.wire.slice_reading`); a JSON answer's slices through :func:`slice_view`."""
    return wire.slice_reading(from_json=slice_view())


def slice_view() -> Callable[[Obj], Obj]:
    """A transform for one slice informer: whole slices, the flat values of every device's
    attributes, capacity and counters shared with equal ones of other devices."""
    interner = Interner()

    def view(obj: Obj) -> Obj:
        spec = obj.get("spec")
        if isinstance(spec, dict):
            for device in spec.get("devices") or ():
                if isinstance(device, dict):
                    _share(interner, device, "attributes")
                    _share(interner, device, "capacity")
                    for consumed in device.get("consumesCounters") or ():
                        _share(interner, consumed, "counters")
            for counter_set in spec.get("sharedCounters") or ():
                _share(interner, counter_set, "counters")
        return without_managed_fields(obj)

    return view
