"""Reading the ResourceClaims of a NodePrepareResources call: concurrently, outside the state lock
(the API round-trip dominates; 100 claims must not take 100 round-trips), each failure kept as the
claim's value instead of raised."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import cast

from dra_driver.k8s.bodies import RawClaim
from dra_driver.k8s.client import CLAIMS, ApiError, KubeApi
from dra_driver.node.prepare.calls import ClaimRef

CLAIM_READ_CONCURRENCY = 32
"""Claims of one NodePrepareResources batch read in parallel; the API client's pool matches it."""

Fetched = RawClaim | BaseException
"""A claim as read, or why it could not be."""


def read_error(exc: BaseException) -> str:
    """How a failed claim read is reported to the kubelet: the server's answer marked as such, or the
    transport failure as it is."""
    return f"API server: {exc}" if isinstance(exc, ApiError) and not exc.unreachable else str(exc)


class ClaimReader:
    def __init__(self, api: KubeApi, max_parallel: int = CLAIM_READ_CONCURRENCY) -> None:
        self._api = api
        self._pool = ThreadPoolExecutor(max_workers=max(1, max_parallel), thread_name_prefix="claim-get")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def read(self, claims: Sequence[ClaimRef], meanwhile: Callable[[ClaimRef], object]) -> dict[str, Fetched]:
        """Every claim by UID. A single claim is read on the caller's thread, with ``meanwhile(claim)``
        run while the API server works on it (:meth:`KubeApi.get`)."""
        if len(claims) == 1:
            one = claims[0]
            return {one.uid: self._get(one, lambda: meanwhile(one))}
        return {c.uid: r for c, r in zip(claims, self._pool.map(self._get, claims), strict=True)}

    def _get(self, claim: ClaimRef, meanwhile: Callable[[], object] | None = None) -> Fetched:
        try:
            obj = self._api.get(CLAIMS, claim.name, namespace=claim.namespace, meanwhile=meanwhile)
        except Exception as exc:  # the client's (ApiError, transport failures): the claim's answer says which
            return exc
        if not isinstance(obj, dict):
            return RuntimeError(f"API server returned {type(obj).__name__} for ResourceClaim {claim.ref}")
        return cast(RawClaim, obj)
