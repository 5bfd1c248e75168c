"""NodePrepareResources / NodeUnprepareResources / GetInfo over a node plugin's real sockets (v1 API)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import grpc

from dra_driver._proto.dra.v1 import api_pb2, api_pb2_grpc


class DraCaller:
    def __init__(self, dra_socket: Path) -> None:
        self.channel = grpc.insecure_channel(f"unix:{dra_socket}")
        self.stub = api_pb2_grpc.DRAPluginStub(self.channel)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        self.channel.close()

    @staticmethod
    def _claims(claims: list[tuple[str, str, str]]) -> list[Any]:
        return [api_pb2.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]

    def prepare(self, claims: list[tuple[str, str, str]], timeout: float = 60) -> tuple[float, dict[str, Any]]:
        """(seconds, response claims by UID); claims are (namespace, name, uid)."""
        start = time.monotonic()
        resp = self.stub.NodePrepareResources(api_pb2.NodePrepareResourcesRequest(claims=self._claims(claims)),
                                              timeout=timeout)
        return time.monotonic() - start, dict(resp.claims)

    def unprepare(self, claims: list[tuple[str, str, str]], timeout: float = 60) -> tuple[float, dict[str, Any]]:
        start = time.monotonic()
        resp = self.stub.NodeUnprepareResources(
            api_pb2.NodeUnprepareResourcesRequest(claims=self._claims(claims)), timeout=timeout)
        return time.monotonic() - start, dict(resp.claims)


def dra_socket(bed: Any, node: str) -> Path:
    return Path(bed.fleet.nodes[node].plugins_dir) / "gpu.dra-driver.io" / "dra.sock"
