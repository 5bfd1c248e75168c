"""NodePrepareResources / NodeUnprepareResources (DRA v1) over a node plugin's Unix socket, as the kubelet
sends them: the one DRA client of the suites and the benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from dra_driver._proto.dra.v1 import api_pb2, api_pb2_grpc

Claim = tuple[str, str, str]
"""(namespace, name, uid)"""


class DraClient:
    def __init__(self, socket: Path, ready_timeout: float = 30.0) -> None:
        self.channel = grpc.insecure_channel(f"unix:{socket}")
        grpc.channel_ready_future(self.channel).result(timeout=ready_timeout)
        self.stub = api_pb2_grpc.DRAPluginStub(self.channel)  # type: ignore[no-untyped-call]

    @staticmethod
    def _claims(claims: Sequence[Claim]) -> list[Any]:
        return [api_pb2.Claim(namespace=ns, name=name, uid=uid) for ns, name, uid in claims]

    def prepare_request(self, claims: Sequence[Claim]) -> Any:
        return api_pb2.NodePrepareResourcesRequest(claims=self._claims(claims))

    def unprepare_request(self, claims: Sequence[Claim]) -> Any:
        return api_pb2.NodeUnprepareResourcesRequest(claims=self._claims(claims))

    def prepare(self, claims: Sequence[Claim], timeout: float = 60.0) -> dict[str, Any]:
        """The response per claim UID (``.error`` is empty when prepared, ``.devices`` what it got)."""
        return dict(self.stub.NodePrepareResources(self.prepare_request(claims), timeout=timeout).claims)

    def unprepare(self, claims: Sequence[Claim], timeout: float = 60.0) -> dict[str, Any]:
        return dict(self.stub.NodeUnprepareResources(self.unprepare_request(claims), timeout=timeout).claims)

    def close(self) -> None:
        self.channel.close()


def timed(call: Callable[[Sequence[Claim]], dict[str, Any]], claims: Sequence[Claim]) -> tuple[float, dict[str, Any]]:
    """(seconds the call took, its responses)."""
    start = time.monotonic()
    out = call(claims)
    return time.monotonic() - start, out


def check_errors(results: dict[str, Any], expected: int, what: str) -> None:
    errors = {uid: r.error for uid, r in results.items() if r.error}
    if errors or len(results) != expected:
        sample = next(iter(errors.values()), "")
        raise RuntimeError(f"{what}: {len(errors)} of {len(results)} claims failed (expected {expected}): {sample}")


def dra_socket(bed: Any, node: str) -> Path:
    return Path(bed.fleet.nodes[node].plugins_dir) / "gpu.dra-driver.io" / "dra.sock"
