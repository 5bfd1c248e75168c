"""One local bed shared by every benchmark of a run, started on first use.

Starting a bed costs tens of seconds on the 2-core machine, so the benchmarks share it; each one
works in its own namespace and under its own node names so they do not see each other's objects.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_driver.k8s import client as kube
from dra_driver.k8s.client import ApiError, Resource, RestKubeApi
from e2e.testbed import cluster as cluster_mod

NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
PLUGIN_NODE = "bench-node"


@dataclass
class BenchBed:
    """The shared bed: the cluster, a REST client and a scratch directory for node plugins."""

    workdir: Path
    keep: bool = False
    _cluster: cluster_mod.Cluster | None = None
    _api: RestKubeApi | None = None
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    started_s: float = 0.0
    # Benchmarks create objects from thread pools; the first touch must start one cluster, not several.
    _lock: threading.RLock = field(default_factory=threading.RLock)

    @property
    def cluster(self) -> cluster_mod.Cluster:
        with self._lock:
            if self._cluster is None:
                t0 = time.monotonic()
                self._cluster = self._stack.enter_context(
                    cluster_mod.running(nodes=(PLUGIN_NODE,), workdir=self.workdir / "bed"))
                self.started_s = time.monotonic() - t0
            return self._cluster

    @property
    def kubeconfig(self) -> Path:
        return self.cluster.kubeconfig

    @property
    def api(self) -> RestKubeApi:
        with self._lock:
            if self._api is None:
                # 32 connections: parallel object creation.
                self._api = RestKubeApi(kube.load_credentials(str(self.kubeconfig)), request_timeout=60.0,
                                        user_agent="dra-driver-bench", pool_size=32)
            return self._api

    def close(self) -> None:
        if self._api is not None:
            self._api.close()
        self._stack.close()
        if not self.keep:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def remove_nodes(self, names: Iterable[str]) -> None:
        """Delete Node objects and their ResourceSlices, so later benchmarks see only their own devices."""
        for name in names:
            self.cluster.kubectl("delete", "resourceslices", "--field-selector", f"spec.nodeName={name}",
                                 "--ignore-not-found", "--wait=false")
            self.cluster.kubectl("delete", "node", name, "--ignore-not-found", "--wait=false")

    def namespace(self, name: str) -> str:
        """Create ``name`` (if missing) and wait for its default ServiceAccount (pods need it)."""
        with contextlib.suppress(ApiError):
            self.api.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        deadline = time.monotonic() + 60
        sa = Resource("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True)
        while time.monotonic() < deadline:
            try:
                self.api.get(sa, "default", namespace=name)
                return name
            except ApiError:
                time.sleep(0.2)
        raise TimeoutError(f"no default ServiceAccount in {name}")


@contextlib.contextmanager
def bench_bed(keep: bool = False) -> Iterator[BenchBed]:
    bed = BenchBed(Path(tempfile.mkdtemp(prefix="dra-bench-")), keep=keep)
    try:
        yield bed
    finally:
        bed.close()


def parallel(fn: Callable[[Any], Any], items: Iterable[Any], workers: int = 16) -> list[Any]:
    """``fn`` over ``items`` on a thread pool (API round-trips overlap; the apiserver is the bottleneck)."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(fn, items))


def wait_until(what: str, probe: Callable[[], Any], timeout: float = 60.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
