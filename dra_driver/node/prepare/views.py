"""What each container of a claim is told about its devices: one view per request, one for the claim.

A container names a claim, or one request of it. The kubelet gives it the CDI devices of every
device of the requests it names, in the order this plugin answered them (all of the claim's when
it names no request), and CDI applies their environment in that order, a later value of a name
replacing an earlier one. So ``NVIDIA_VISIBLE_DEVICES``, ``DRA_GPU_COUNT``, ``DRA_GPU_DEVICES``,
the ``DRA_GPU_<i>_*`` variables and the MPS client limits (whose GPU ordinals count in
``NVIDIA_VISIBLE_DEVICES``) cannot ride on the devices themselves, nor on the claim's spec as a
whole: they would list the claim's devices in a container that was given one request's.

Instead, in a claim of several requests, each request has a view, a CDI device
``<claimUID>-request-<request>`` carrying that environment for its devices only, handed out with
the request's first device. A container of the whole claim gets every request's view, and then,
last, the claim's view ``<claimUID>-claim``, which sets the same names for all of the claim's
devices (and empties any that a request's view set and it does not). The kubelet hands that one out
to containers of the whole claim only because it comes as a device entry of its own whose request
name (:data:`WHOLE_CLAIM`) no container can name; its pool and device are the claim's last
device's, so what the kubelet reports per device stays true. The views live in a spec file of their
own (:meth:`dra_driver.node.prepare.cdi.CdiSpecs.build_views_spec`).

A claim of one request, and a claim prepared before views existed, keep the layout of before (the
environment on the devices and in the claim's spec-wide edits): every container of the former sees
the same, and the kubelet holds the latter's CDI IDs and hands out exactly those to a container
that restarts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from dra_driver.gpuconfig import base_request
from dra_driver.node.prepare.calls import ResponseDevice
from dra_driver.node.prepare.entries import PreparedDevice

WHOLE_CLAIM = "dra-driver.io/whole-claim"
"""The request name of the claim view's device entry: a request's name is a DNS label, which has
neither ``.`` nor ``/``, so no container can name this one."""


def view_device_name(claim_uid: str, request: str | None) -> str:
    """The CDI device name of ``request``'s view, or of the whole claim's for None (``claim_uid``
    and ``request`` validated by the caller)."""
    return f"{claim_uid}-claim" if request is None else f"{claim_uid}-request-{request}"


def requests_of(devices: Sequence[PreparedDevice]) -> list[str]:
    """The claim's top-level requests, in the order of their first device."""
    return list(dict.fromkeys(base_request(r) for d in devices for r in d.requests))


def with_view_ids(kind: str, claim_uid: str, devices: Sequence[PreparedDevice]) -> tuple[PreparedDevice, ...]:
    """``devices`` with each request's view ID added to the request's first device, for a claim of
    several requests (one of a single request needs no views: all its containers see the same)."""
    if len(requests_of(devices)) < 2:
        return tuple(devices)
    seen: set[str] = set()
    out: list[PreparedDevice] = []
    for dev in devices:
        extra = []
        for request in dict.fromkeys(base_request(r) for r in dev.requests):
            if request not in seen:
                seen.add(request)
                extra.append(f"{kind}={view_device_name(claim_uid, request)}")
        out.append(replace(dev, cdi_device_ids=(*dev.cdi_device_ids, *extra)) if extra else dev)
    return tuple(out)


def has_views(kind: str, claim_uid: str, devices: Sequence[PreparedDevice]) -> bool:
    """Whether the claim was prepared with views (else it keeps the earlier layout)."""
    ids = {i for d in devices for i in d.cdi_device_ids}
    return any(f"{kind}={view_device_name(claim_uid, r)}" in ids for r in requests_of(devices))


def response_devices(kind: str, claim_uid: str, devices: Sequence[PreparedDevice]) -> tuple[ResponseDevice, ...]:
    """What the kubelet is told of the claim's devices: one entry per device, and for a claim of
    several requests prepared with views, last, the entry of the whole claim's view."""
    out = [ResponseDevice(request_names=tuple(dict.fromkeys(base_request(r) for r in d.requests)), pool_name=d.pool,
                          device_name=d.device, cdi_device_ids=d.cdi_device_ids, share_id=d.share_id) for d in devices]
    if devices and len(requests_of(devices)) > 1 and has_views(kind, claim_uid, devices):
        last = devices[-1]
        out.append(ResponseDevice(request_names=(WHOLE_CLAIM,), pool_name=last.pool, device_name=last.device,
                                  cdi_device_ids=(f"{kind}={view_device_name(claim_uid, None)}",),
                                  share_id=last.share_id))
    return tuple(out)
