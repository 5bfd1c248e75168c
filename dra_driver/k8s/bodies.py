"""The shapes of the Kubernetes objects the driver reads, and of the reduced views it builds of them.

Each shape is a ``TypedDict`` with ``total=False``: a plain dict at run time (a decoded JSON
object, or a view built of one), so declaring it costs no memory and no conversion. It names the
fields the driver reads, with the types the API server gives them; the fields it never reads are
left out and stay in the dict, unchecked.

A declared shape is what the API server promises, not what arrived. An object from the API server,
a checkpoint or a user is still read through :mod:`dra_driver.k8s.objects` (``as_mapping``,
``as_list``, ``as_str``, ``meta``), which give an empty value for a field of another type, so a
malformed or hostile object reads as one without that field rather than raising. The shapes say
what a seam hands on; the readers keep it safe to read.

The reduced views (:class:`PodView`, :class:`AllocationView`, :class:`NotedClaim`) are built by
the driver itself (:mod:`dra_driver.k8s.wire`, :mod:`dra_driver.controller.views`), in the shape of
the object they stand for, so the same readers read both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias, TypedDict

Labels: TypeAlias = Mapping[str, str]
Annotations: TypeAlias = Mapping[str, str]


# =========================================================================== every object


class RawMeta(TypedDict, total=False):
    """``metadata``, as far as the driver reads it."""

    name: str
    namespace: str
    uid: str
    resourceVersion: str
    generation: int
    labels: Labels
    annotations: Annotations
    finalizers: list[str]
    ownerReferences: list[Mapping[str, Any]]
    creationTimestamp: str
    deletionTimestamp: str
    managedFields: list[Mapping[str, Any]]


class RawBody(TypedDict, total=False):
    """Any object as the API server returns it: what a list or a watch yields before its kind is known."""

    apiVersion: str
    kind: str
    metadata: RawMeta
    spec: Mapping[str, Any]
    status: Mapping[str, Any]


# =========================================================================== selectors


class NodeSelectorRequirement(TypedDict, total=False):
    key: str
    operator: str
    values: list[str]


class NodeSelectorTerm(TypedDict, total=False):
    matchExpressions: list[NodeSelectorRequirement]
    matchFields: list[NodeSelectorRequirement]


class NodeSelector(TypedDict, total=False):
    nodeSelectorTerms: list[NodeSelectorTerm]


# =========================================================================== ResourceSlice


class DeviceTaint(TypedDict, total=False):
    key: str
    value: str
    effect: str
    timeAdded: str


class CounterSet(TypedDict, total=False):
    """A slice's ``sharedCounters[]``: counters by name, each ``{"value": quantity}``."""

    name: str
    counters: Mapping[str, Mapping[str, str]]


class CounterConsumption(TypedDict, total=False):
    """A device's ``consumesCounters[]``."""

    counterSet: str
    counters: Mapping[str, Mapping[str, str]]


class RawDevice(TypedDict, total=False):
    """A slice's ``spec.devices[]``. An attribute is one of ``{"int"|"bool"|"string"|"version": value}``,
    a capacity ``{"value": quantity}`` with an optional ``requestPolicy``."""

    name: str
    attributes: Mapping[str, Mapping[str, Any]]
    capacity: Mapping[str, Mapping[str, Any]]
    consumesCounters: list[CounterConsumption]
    nodeName: str
    nodeSelector: NodeSelector
    allNodes: bool
    taints: list[DeviceTaint]
    bindsToNode: bool
    bindingConditions: list[str]
    bindingFailureConditions: list[str]
    allowMultipleAllocations: bool


class SlicePool(TypedDict, total=False):
    name: str
    generation: int
    resourceSliceCount: int


class SliceSpec(TypedDict, total=False):
    driver: str
    pool: SlicePool
    nodeName: str
    nodeSelector: NodeSelector
    allNodes: bool
    perDeviceNodeSelection: bool
    devices: list[RawDevice]
    sharedCounters: list[CounterSet]


class RawSlice(TypedDict, total=False):
    """A ResourceSlice (resource.k8s.io/v1)."""

    apiVersion: str
    kind: str
    metadata: RawMeta
    spec: SliceSpec


# =========================================================================== ResourceClaim


class DeviceSubRequest(TypedDict, total=False):
    """One of a request's ``firstAvailable`` alternatives."""

    name: str
    deviceClassName: str
    selectors: list[Mapping[str, Any]]
    allocationMode: str
    count: int


class ExactDeviceRequest(TypedDict, total=False):
    deviceClassName: str
    selectors: list[Mapping[str, Any]]
    allocationMode: str
    count: int
    adminAccess: bool


class DeviceRequest(TypedDict, total=False):
    name: str
    exactly: ExactDeviceRequest
    firstAvailable: list[DeviceSubRequest]


class DeviceClaim(TypedDict, total=False):
    requests: list[DeviceRequest]
    constraints: list[Mapping[str, Any]]
    config: list[Mapping[str, Any]]


class ClaimSpec(TypedDict, total=False):
    devices: DeviceClaim


class AllocationResult(TypedDict, total=False):
    """One device of ``status.allocation.devices.results[]``."""

    request: str
    driver: str
    pool: str
    device: str
    adminAccess: bool
    shareID: str
    consumedCapacity: Mapping[str, str]


class AllocatedDevices(TypedDict, total=False):
    results: list[AllocationResult]
    config: list[Mapping[str, Any]]  # each {"source": "FromClass"|"FromClaim", "requests": [...], "opaque": {...}}


class Allocation(TypedDict, total=False):
    """``status.allocation``."""

    devices: AllocatedDevices
    nodeSelector: NodeSelector
    allocationTimestamp: str


class ClaimStatus(TypedDict, total=False):
    allocation: Allocation
    reservedFor: list[Mapping[str, Any]]
    devices: list[Mapping[str, Any]]


class RawClaim(TypedDict, total=False):
    """A ResourceClaim (resource.k8s.io/v1)."""

    apiVersion: str
    kind: str
    metadata: RawMeta
    spec: ClaimSpec
    status: ClaimStatus


class RawDeviceClass(TypedDict, total=False):
    """A DeviceClass: its ``spec`` holds ``selectors``, ``config`` and ``extendedResourceName``."""

    apiVersion: str
    kind: str
    metadata: RawMeta
    spec: Mapping[str, Any]


DeviceClasses: TypeAlias = Mapping[str, RawDeviceClass]
"""The DeviceClasses by name (:func:`dra_driver.k8s.claims.classes_by_name`): what a request's
``deviceClassName`` is looked up in."""


# =========================================================================== Pod


class PodClaimRef(TypedDict, total=False):
    """A pod's ``spec.resourceClaims[]`` or ``status.resourceClaimStatuses[]`` entry."""

    name: str
    resourceClaimName: str
    resourceClaimTemplateName: str


class Toleration(TypedDict, total=False):
    key: str
    operator: str
    value: str
    effect: str


class PodSpec(TypedDict, total=False):
    nodeName: str
    resourceClaims: list[PodClaimRef]
    nodeSelector: Labels
    tolerations: list[Toleration]
    affinity: Mapping[str, Any]  # read: nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution, a NodeSelector


class PodStatus(TypedDict, total=False):
    phase: str
    resourceClaimStatuses: list[PodClaimRef]
    extendedResourceClaimStatus: PodClaimRef


class RawPod(TypedDict, total=False):
    """A Pod (v1)."""

    apiVersion: str
    kind: str
    metadata: RawMeta
    spec: PodSpec
    status: PodStatus


# =========================================================================== the driver's views


class PodView(TypedDict, total=False):
    """What the controller keeps of a pod that waits for claims (:func:`dra_driver.controller.views.pod_view`):
    name, namespace, UID and resourceVersion; node, node selector, tolerations, required node
    affinity; every claim it references, under ``spec.resourceClaims``."""

    metadata: RawMeta
    spec: PodSpec


class AllocationView(TypedDict, total=False):
    """A claim reduced to its identity and allocated devices (:func:`dra_driver.k8s.wire.allocation_view`):
    ``metadata`` name, namespace and uid (the controller adds resourceVersion, apiVersion and kind),
    ``status.allocation.devices.results`` each with request, driver, pool and device, and
    adminAccess, shareID and consumedCapacity where set."""

    apiVersion: str
    kind: str
    metadata: RawMeta
    status: ClaimStatus


class NotedClaim(TypedDict, total=False):
    """A claim as ``explain -n``/``-A`` reads it (:func:`dra_driver.k8s.wire.noted_claims`): name,
    namespace, deletion, the named annotations; the requests' DeviceClasses of a claim not
    allocated, the devices (driver, pool, device) of an allocated one."""

    metadata: RawMeta
    spec: ClaimSpec
    status: ClaimStatus
