"""Thin wrapper over the official Kubernetes client that speaks raw API JSON (dicts).

Raw JSON avoids two client-model pitfalls: fields newer than the client's models (e.g.
``status.extendedResourceClaimStatus``) would be dropped on deserialisation, and model
serialisation of MicroTime values can lose the fraction the API server requires.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
REQUEST_TIMEOUT_S = 30

__all__ = ["ApiException", "Kube", "micro_time", "rfc3339"]


def rfc3339(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_time(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _json(resp: Any) -> dict[str, Any]:
    data = resp.data
    return json.loads(data) if data else {}


class Kube:
    def __init__(self, kubeconfig: str) -> None:
        self.api = config.new_client_from_config(config_file=kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.resource = client.ResourceV1Api(self.api)
        self.coordination = client.CoordinationV1Api(self.api)

    # --- pods ---------------------------------------------------------------------------------

    def list_pods(self, node: str) -> tuple[list[dict[str, Any]], str]:
        doc = _json(
            self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={node}", _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
            )
        )
        return list(doc.get("items") or []), str((doc.get("metadata") or {}).get("resourceVersion", ""))

    def watch_pods(self, node: str, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        """Raw watch events ({type, object}); raises ApiException(410) when the RV is too old."""
        w = watch.Watch()
        yield from w.stream(
            self.core.list_pod_for_all_namespaces,
            field_selector=f"spec.nodeName={node}",
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=timeout_s,
            _request_timeout=timeout_s + 30,
            deserialize=False,
        )

    def patch_pod(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self.core.patch_namespaced_pod(
            name, namespace, body, _content_type=STRATEGIC, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
        )

    def patch_pod_status(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self.core.patch_namespaced_pod_status(
            name, namespace, body, _content_type=STRATEGIC, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
        )

    def delete_pod_now(self, namespace: str, name: str, uid: str) -> None:
        """Final deletion (grace 0) guarded by the UID, so a same-named successor is never hit."""
        try:
            self.core.delete_namespaced_pod(
                name,
                namespace,
                grace_period_seconds=0,
                body=client.V1DeleteOptions(grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid)),
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
        except ApiException as e:
            if e.status not in (404, 409):
                raise

    def create_pod_event(self, pod: dict[str, Any], reason: str, message: str, node: str, type_: str) -> None:
        meta = pod.get("metadata") or {}
        now = datetime.now(UTC)
        ev = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{meta.get('name', 'pod')}.", namespace=meta.get("namespace")),
            involved_object=client.V1ObjectReference(
                api_version="v1",
                kind="Pod",
                name=meta.get("name"),
                namespace=meta.get("namespace"),
                uid=meta.get("uid"),
                resource_version=meta.get("resourceVersion"),
            ),
            reason=reason,
            message=message[:1024],
            type=type_,
            count=1,
            first_timestamp=now,
            last_timestamp=now,
            source=client.V1EventSource(component="kubelet", host=node),
            reporting_component="kubelet",
            reporting_instance=node,
        )
        self.core.create_namespaced_event(
            meta.get("namespace", "default"), ev, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
        )

    # --- claims and slices --------------------------------------------------------------------

    def get_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return _json(
                self.resource.read_namespaced_resource_claim(
                    name, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
                )
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def delete_slices(self, field_selector: str) -> None:
        self.resource.delete_collection_resource_slice(
            field_selector=field_selector, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
        )

    # --- node and lease -----------------------------------------------------------------------

    def get_node(self, name: str) -> dict[str, Any] | None:
        try:
            return _json(self.core.read_node(name, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def create_node(self, name: str, labels: dict[str, str]) -> None:
        node = client.V1Node(metadata=client.V1ObjectMeta(name=name, labels=labels))
        try:
            self.core.create_node(node, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S)
        except ApiException as e:
            if e.status != 409:
                raise

    def patch_node_status(self, name: str, body: dict[str, Any]) -> None:
        self.core.patch_node_status(
            name, body, _content_type=STRATEGIC, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
        )

    def renew_lease(self, namespace: str, name: str, spec: dict[str, Any]) -> None:
        """Merge-patch the Lease; create it first when missing (timestamps stay raw strings)."""
        body = {"spec": spec}
        try:
            self.coordination.patch_namespaced_lease(
                name, namespace, body, _content_type=MERGE, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
            )
            return
        except ApiException as e:
            if e.status != 404:
                raise
        lease = client.V1Lease(
            metadata=client.V1ObjectMeta(name=name, namespace=namespace),
            spec=client.V1LeaseSpec(
                holder_identity=spec.get("holderIdentity"), lease_duration_seconds=spec.get("leaseDurationSeconds")
            ),
        )
        try:
            self.coordination.create_namespaced_lease(
                namespace, lease, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
            )
        except ApiException as e:
            if e.status != 409:
                raise
        self.coordination.patch_namespaced_lease(
            name, namespace, body, _content_type=MERGE, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
        )
