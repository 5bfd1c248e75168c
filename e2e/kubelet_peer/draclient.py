"""Calls into a DRA plugin's NodePrepareResources/NodeUnprepareResources, version-aware."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from .model import ClaimRef, ClaimResult, DriverCallError, PreparedDevice
from .protos import DRA_SERVICES, Protos

CALL_TIMEOUT_S = 45.0


def _rpc_error(method: str, e: grpc.RpcError) -> DriverCallError:
    code = e.code() if hasattr(e, "code") else None
    details = e.details() if hasattr(e, "details") else str(e)
    return DriverCallError(f"{method} failed: {getattr(code, 'name', code)}: {details}")


class DRAClient:
    def __init__(self, protos: Protos, channel: grpc.Channel, version: str) -> None:
        service = DRA_SERVICES[version]
        package = service.rsplit(".", 1)[0]
        self.version = version
        self._claim = protos.message(f"{package}.Claim")
        self._prepare_req = protos.request_type(service, "NodePrepareResources")
        self._unprepare_req = protos.request_type(service, "NodeUnprepareResources")
        self._prepare = protos.unary(channel, service, "NodePrepareResources")
        self._unprepare = protos.unary(channel, service, "NodeUnprepareResources")

    def _claims(self, claims: Sequence[ClaimRef]) -> list[Any]:
        return [self._claim(namespace=c.namespace, uid=c.uid, name=c.name) for c in claims]

    def prepare(self, claims: Sequence[ClaimRef], timeout: float = CALL_TIMEOUT_S) -> dict[str, ClaimResult]:
        try:
            resp = self._prepare(self._prepare_req(claims=self._claims(claims)), timeout=timeout)
        except grpc.RpcError as e:
            raise _rpc_error("NodePrepareResources", e) from e
        out: dict[str, ClaimResult] = {}
        for uid, r in resp.claims.items():
            devices = []
            for d in r.devices:
                share = None
                if "share_id" in d.DESCRIPTOR.fields_by_name and d.HasField("share_id"):
                    share = d.share_id
                devices.append(
                    PreparedDevice(
                        pool_name=d.pool_name,
                        device_name=d.device_name,
                        request_names=tuple(d.request_names),
                        cdi_device_ids=tuple(d.cdi_device_ids),
                        share_id=share,
                    )
                )
            out[uid] = ClaimResult(devices=devices, error=r.error)
        return out

    def unprepare(self, claims: Sequence[ClaimRef], timeout: float = CALL_TIMEOUT_S) -> dict[str, str]:
        try:
            resp = self._unprepare(self._unprepare_req(claims=self._claims(claims)), timeout=timeout)
        except grpc.RpcError as e:
            raise _rpc_error("NodeUnprepareResources", e) from e
        return {uid: r.error for uid, r in resp.claims.items()}
