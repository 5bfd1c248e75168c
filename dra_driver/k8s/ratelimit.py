"""A cap on how fast a client writes to the API server: a token bucket, and a KubeApi that spends it.

client-go caps every request of a client (``QPS``/``Burst``); this caps writes only, because the
controller's reads are watches and a few lists, which the API server serves from its cache, while
every write goes to etcd and through admission. Writes wait in line for their token; writes to
*best-effort* resources (Events) never wait: without a token at hand they fail at once with a
client-side 429, so a backlog of claim explanations is not slowed by the Events about them, and
the Event writer's own retry and drop rules apply.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from dra_driver.k8s.client import ApiError, KubeApi, ListResult, Resource
from dra_driver.k8s.objects import Obj


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up. Thread-safe; waiters are served in order
    (each reserves its token, possibly ahead of time, and sleeps until then)."""

    def __init__(self, rate: float, burst: int, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"a token bucket needs a positive rate and burst, got {rate}/s and {burst}")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = float(burst)
        self._at = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate)
        self._at = now

    def take(self) -> float:
        """Wait for a token; returns the seconds waited."""
        with self._lock:
            self._refill()
            self._tokens -= 1
            wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
        if wait > 0:
            self._sleep(wait)
        return wait

    def try_take(self) -> bool:
        """A token if one is here now (none while others wait for theirs)."""
        with self._lock:
            self._refill()
            if self._tokens < 1:
                return False
            self._tokens -= 1
            return True


class WriteLimitedApi:
    """``api`` with every write paid for from ``bucket`` (see the module's description)."""

    def __init__(self, api: KubeApi, bucket: TokenBucket, *, best_effort: frozenset[str] = frozenset(),
                 on_wait: Callable[[float], None] | None = None) -> None:
        self.api = api
        self.bucket = bucket
        self.best_effort = best_effort
        """Plurals (``events``) whose writes are dropped rather than delayed."""
        self._on_wait = on_wait

    def _pay(self, res: Resource) -> None:
        if res.plural in self.best_effort:
            if not self.bucket.try_take():
                raise ApiError(429, "ClientRateLimited",
                               f"{res.plural}: dropped, the controller's write budget ({self.bucket.rate:g}/s) is spent")
            return
        waited = self.bucket.take()
        if waited and self._on_wait is not None:
            self._on_wait(waited)

    # -- reads pass through

    def list(self, res: Resource, **kwargs: Any) -> ListResult:
        return self.api.list(res, **kwargs)

    def list_claim_allocations(self) -> ListResult:
        return self.api.list_claim_allocations()

    def watch(self, res: Resource, **kwargs: Any) -> Iterator[Obj]:
        return self.api.watch(res, **kwargs)

    def get(self, res: Resource, name: str, **kwargs: Any) -> Obj:
        return self.api.get(res, name, **kwargs)

    # -- writes pay

    def create(self, res: Resource, body: Obj, *, namespace: str | None = None, dry_run: bool = False) -> Obj:
        self._pay(res)
        return self.api.create(res, body, namespace=namespace, dry_run=dry_run)

    def replace(self, res: Resource, body: Obj) -> Obj:
        self._pay(res)
        return self.api.replace(res, body)

    def replace_status(self, res: Resource, body: Obj, *, dry_run: bool = False) -> Obj:
        self._pay(res)
        return self.api.replace_status(res, body, dry_run=dry_run)

    def merge_patch(self, res: Resource, name: str, patch: Obj, *, namespace: str | None = None) -> Obj:
        self._pay(res)
        return self.api.merge_patch(res, name, patch, namespace=namespace)

    def apply_status(self, res: Resource, name: str, body: Obj, *, namespace: str | None = None,
                     field_manager: str) -> Obj:
        self._pay(res)
        return self.api.apply_status(res, name, body, namespace=namespace, field_manager=field_manager)

    def delete(self, res: Resource, name: str, *, namespace: str | None = None, uid: str | None = None,
               resource_version: str | None = None) -> None:
        self._pay(res)
        self.api.delete(res, name, namespace=namespace, uid=uid, resource_version=resource_version)
