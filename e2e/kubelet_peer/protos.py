"""Runtime loading of the kubelet gRPC protos from ``api/proto``.

The .proto files are compiled with grpc_tools' protoc into a *private* descriptor pool. Loading
them into the default pool (what ``grpc.protos_and_services`` does) would clash with the
driver's generated modules, which register the same fully-qualified message names: whichever
side loads second would fail with "duplicate symbol" when both live in one process (pytest).
"""

from __future__ import annotations

import functools
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message
from grpc_tools import protoc  # type: ignore[import-untyped,unused-ignore]

PROTO_FILES = (
    "pluginregistration/api.proto",
    "dra/v1/api.proto",
    "dra/v1beta1/api.proto",
    "drahealth/v1/api.proto",
    "drahealth/v1alpha1/api.proto",
)

REGISTRATION_SERVICE = "pluginregistration.Registration"
# Advertised version string -> fully-qualified gRPC service name.
DRA_SERVICES: dict[str, str] = {
    "v1.DRAPlugin": "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
    "v1beta1.DRAPlugin": "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
}
# Health stream versions in the 1.37 kubelet's order of preference; the version string is also
# the service name (the health protos use an unqualified package).
HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")


def default_proto_root() -> Path:
    # e2e/kubelet_peer/protos.py -> <repo>/api/proto
    return Path(__file__).resolve().parents[2] / "api" / "proto"


class ProtoError(RuntimeError):
    pass


class Protos:
    """Message classes and call helpers built from one private descriptor pool."""

    def __init__(self, pool: descriptor_pool.DescriptorPool) -> None:
        self._pool = pool

    def message(self, full_name: str) -> type[Message]:
        return message_factory.GetMessageClass(self._pool.FindMessageTypeByName(full_name))

    def _method(self, service: str, method: str) -> tuple[str, type[Message], type[Message]]:
        svc = self._pool.FindServiceByName(service)
        m = svc.methods_by_name[method]
        req = message_factory.GetMessageClass(m.input_type)
        resp = message_factory.GetMessageClass(m.output_type)
        return f"/{service}/{method}", req, resp

    def request_type(self, service: str, method: str) -> type[Message]:
        return self._method(service, method)[1]

    def unary(self, channel: grpc.Channel, service: str, method: str) -> grpc.UnaryUnaryMultiCallable:
        path, req, resp = self._method(service, method)
        return channel.unary_unary(path, request_serializer=req.SerializeToString, response_deserializer=resp.FromString)

    def server_stream(self, channel: grpc.Channel, service: str, method: str) -> grpc.UnaryStreamMultiCallable:
        path, req, resp = self._method(service, method)
        return channel.unary_stream(path, request_serializer=req.SerializeToString, response_deserializer=resp.FromString)

    def server_handler(self, service: str, impls: dict[str, Callable[..., Any]]) -> grpc.GenericRpcHandler:
        """A generic handler for serving ``service`` (used by tests' fake plugins).

        Implementations of server-streaming methods must be generators; that is how they are told apart.
        """
        handlers: dict[str, grpc.RpcMethodHandler] = {}
        svc = self._pool.FindServiceByName(service)
        for name, fn in impls.items():
            m = svc.methods_by_name[name]
            req = message_factory.GetMessageClass(m.input_type)
            resp = message_factory.GetMessageClass(m.output_type)
            if m.server_streaming:
                handlers[name] = grpc.unary_stream_rpc_method_handler(
                    fn, request_deserializer=req.FromString, response_serializer=resp.SerializeToString
                )
            else:
                handlers[name] = grpc.unary_unary_rpc_method_handler(
                    fn, request_deserializer=req.FromString, response_serializer=resp.SerializeToString
                )
        return grpc.method_handlers_generic_handler(service, handlers)


def _compile(root: Path) -> descriptor_pb2.FileDescriptorSet:
    missing = [f for f in PROTO_FILES if not (root / f).is_file()]
    if missing:
        raise ProtoError(f"proto files missing under {root}: {missing}")
    with tempfile.TemporaryDirectory(prefix="kubelet-peer-protos-") as tmp:
        out = os.path.join(tmp, "set.pb")
        rc = protoc.main(["protoc", f"-I{root}", f"--descriptor_set_out={out}", "--include_imports", *PROTO_FILES])
        if rc != 0:
            raise ProtoError(f"protoc failed (rc={rc}) compiling {PROTO_FILES} under {root}")
        fds = descriptor_pb2.FileDescriptorSet()
        fds.ParseFromString(Path(out).read_bytes())
        return fds


@functools.lru_cache(maxsize=4)
def load_protos(root: str | None = None) -> Protos:
    fds = _compile(Path(root) if root else default_proto_root())
    pool = descriptor_pool.DescriptorPool()
    for f in fds.file:
        pool.Add(f)
    return Protos(pool)
