"""What the fleet commands read, and the only client they are handed: one that can only read.

:class:`ReadOnly` wraps the API client and exposes its three reads (``list``,
``list_claim_allocations``, ``get``) and the server's version, nothing else: ``get``, ``top`` and
``fit`` cannot write, whatever they call. :func:`read_fleet` makes every read the views need, in
protobuf where the server speaks it (the slices as the controller's informer reads them, every
claim's allocation, the pods' claim references), from the watch cache. The slices, the longest
read, are read on a second connection (and built into the engine's inventory there) while
the rest is read on the first, as ``explain`` reads them:

* the ResourceSlices with the DeviceTaintRules merged into the devices they select;
* the DeviceClasses;
* every claim's allocation (cluster-wide: a device's state is the cluster's);
* the pods of the namespace asked for (every namespace with ``-A``): a 403 there hides the pod
  names, never the claims;
* the ``DeviceWithheld`` Events the node plugins write about the devices they leave out of their
  slices (a caller who may not list Events sees no withheld device, and is told so).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from dra_driver.allocator.devicestates import WITHHELD_REASON, Withheld, withheld_from
from dra_driver.allocator.inventory import Inventory
from dra_driver.allocator.resolve import Engine
from dra_driver.k8s.bodies import RawBody, RawDeviceClass, RawSlice
from dra_driver.k8s.claims import pod_claim_names
from dra_driver.k8s.client import (
    CLAIMS,
    DEVICE_CLASSES,
    PODS,
    ApiError,
    KubeApi,
    ListResult,
    Resource,
)
from dra_driver.k8s.events import node_events
from dra_driver.k8s.objects import Obj, key_of
from dra_driver.k8s.wire import POD_CLAIM_REFS, Reduced
from dra_driver.tools.explain.claim import read_now, tainted_slices


class ReadApi(Protocol):
    """The reads the fleet commands make: nothing here writes."""

    def list(self, res: Resource, *, namespace: str | None = None, field_selector: str | None = None,
             cached: bool = False, reduced: Reduced[Any] | None = None) -> ListResult: ...

    def list_claim_allocations(self) -> ListResult: ...

    def get(self, res: Resource, name: str, *, namespace: str | None = None) -> Obj: ...


class ReadOnly:
    """A client's reads and nothing else (no ``create``, ``replace``, ``delete``, patch or apply):
    what the fleet commands are given in place of the client."""

    __slots__ = ("_api", "_version")

    def __init__(self, api: KubeApi, server_version: Callable[[], str] | None = None) -> None:
        self._api = api
        self._version = server_version

    def list(self, res: Resource, *, namespace: str | None = None, field_selector: str | None = None,
             cached: bool = False, reduced: Reduced[Any] | None = None) -> ListResult:
        return self._api.list(res, namespace=namespace, field_selector=field_selector, cached=cached, reduced=reduced)

    def list_claim_allocations(self) -> ListResult:
        return self._api.list_claim_allocations()

    def get(self, res: Resource, name: str, *, namespace: str | None = None) -> Obj:
        return self._api.get(res, name, namespace=namespace)

    @property
    def server_version(self) -> Callable[[], str] | None:
        return self._version


@dataclass
class FleetObjects:
    """Everything the views are computed from (plain API dicts)."""

    slices: list[RawSlice]
    classes: Sequence[RawDeviceClass]
    claims: list[RawBody]
    """Every claim, reduced to its name, namespace, UID and allocation."""
    pods: list[RawBody]
    namespace: str | None
    """The namespace whose pods were read; None: every namespace."""
    pods_hidden: str | None = None
    """Why the pods could not be read (403), else None: the claims are shown without their pods."""
    withheld: list[Withheld] = field(default_factory=list)
    withheld_hidden: str | None = None
    unreadable: list[str] = field(default_factory=list)


def _forbidden(exc: ApiError, what: str) -> str:
    return f"you may not list {what} ({exc.reason or 'Forbidden'})"


def read_fleet(api: ReadApi, namespace: str | None, *, engine: Engine,
               pods: bool = True) -> tuple[FleetObjects, Inventory]:
    """:class:`FleetObjects` of the cluster, with the pods of ``namespace`` (None: every namespace;
    ``pods=False``: none), and ``engine``'s inventory of its slices. ApiError for what the views
    cannot do without, raised in the order of the reads: the slices', the classes', the claims'."""
    background = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleet-slices")
    try:
        slices = background.submit(tainted_slices, api)
        built = background.submit(lambda: engine.build_inventory(slices.result()))
        classes = read_now(lambda: api.list(DEVICE_CLASSES, cached=True).items)
        claims = read_now(api.list_claim_allocations)
        listed = read_now(lambda: api.list(PODS, namespace=namespace, cached=True, reduced=POD_CLAIM_REFS)) \
            if pods else None
        told = read_now(lambda: withheld_from(node_events(api, WITHHELD_REASON)))
        fleet = FleetObjects(slices.result(), classes.result(), claims.result().items, [], namespace)
        fleet.unreadable = [f"{CLAIMS.kind} {bad.ref}: {bad.reason}" for bad in claims.result().undecodable]
        if listed is not None:
            _pods_into(fleet, listed)
        try:
            fleet.withheld = told.result()
        except ApiError as exc:
            if not (exc.forbidden or exc.unauthorized or exc.not_found):
                raise
            fleet.withheld_hidden = _forbidden(exc, "Events in namespace default")
        return fleet, built.result()
    finally:
        # After an error the slices' read is not waited for; it ends with its request timeout.
        background.shutdown(wait=False, cancel_futures=True)


def _pods_into(fleet: FleetObjects, listed: Future[ListResult]) -> None:
    try:
        result = listed.result()
    except ApiError as exc:
        if not (exc.forbidden or exc.unauthorized):
            raise
        where = f"in namespace {fleet.namespace}" if fleet.namespace else "in every namespace"
        fleet.pods_hidden = _forbidden(exc, f"pods {where}")
        return
    fleet.pods = result.items
    fleet.unreadable += [f"{PODS.kind} {bad.ref}: {bad.reason}" for bad in result.undecodable]


def pods_by_claim(pods: list[RawBody]) -> dict[str, list[str]]:
    """``namespace/claim`` -> the ``namespace/pod`` of every pod not done that names it."""
    out: dict[str, list[str]] = {}
    for pod in pods:
        for claim_key in pod_claim_names(cast(Mapping[str, Any], pod)):
            out.setdefault(claim_key, []).append(key_of(pod))
    return {k: sorted(v) for k, v in out.items()}
