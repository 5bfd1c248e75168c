"""The real Kubernetes control plane, kubelet and etcd for the test bed, built from their pins.

Both come from committed Go modules (``e2e/tooling/gotools/{kubernetes,kubernetes-1.36,etcd}``),
built by ``gotools`` with ``-mod=readonly`` and cached under a key that hashes the pins.

The bed runs the current minor; ``DRA_TESTBED_KUBERNETES=1.36`` makes it run the oldest supported
minor instead (``make e2e-oldest`` runs the smoke subset that way). ``DRA_TESTBED_SCHEDULER=1.38``
runs the kube-scheduler of another minor beside that control plane (``make e2e-next``): only that
minor's scheduler is built, besides the control plane's own binaries.

A bed whose nodes are all kubelet peers (``make demo``) asks for the control plane without the
kubelet; the folder is the same, so a later full bed builds the kubelet alone into it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from e2e.tooling import gotools

# Supported minors -> the gotools tool that pins them; the first is the default. Once 1.38.0 builds
# whole (docs/testbed.md, "Kubernetes 1.38"), its tool builds every command and the one line that
# makes it the default is this one: {"1.38": "kubernetes-1.38", "1.37": "kubernetes", "1.36": ...}.
MINORS = {"1.37": "kubernetes", "1.36": "kubernetes-1.36"}
MINOR_ENV = "DRA_TESTBED_KUBERNETES"
# Minors whose pin builds kube-scheduler alone: the registry does not serve the rest of 1.38 yet.
SCHEDULER_ONLY_MINORS = {"1.38": "kubernetes-1.38"}
SCHEDULER_ENV = "DRA_TESTBED_SCHEDULER"
SCHEDULER = "kube-scheduler"
KUBELET = "kubelet"


def kubernetes_minor() -> str:
    minor = os.environ.get(MINOR_ENV) or next(iter(MINORS))
    if minor not in MINORS:
        raise gotools.ToolError(f"{MINOR_ENV}={minor!r} is not a supported minor; use one of {', '.join(MINORS)}")
    return minor


def kubernetes_tool() -> str:
    return MINORS[kubernetes_minor()]


def scheduler_tool(minor: str) -> str:
    """The tool whose kube-scheduler is that minor's; a bad minor is refused, naming the ones there are."""
    tools = {**MINORS, **SCHEDULER_ONLY_MINORS}
    if minor not in tools:
        raise gotools.ToolError(f"kube-scheduler {minor!r} is not a pinned minor; use one of {', '.join(tools)}")
    return tools[minor]


def scheduler_minor() -> str | None:
    """The minor of the kube-scheduler asked for beside the control plane (``DRA_TESTBED_SCHEDULER``), if
    it is not the control plane's own."""
    minor = os.environ.get(SCHEDULER_ENV) or None
    if minor is None:
        return None
    scheduler_tool(minor)
    return None if minor == kubernetes_minor() else minor


def tools() -> tuple[str, str]:
    return kubernetes_tool(), "etcd"


def kubernetes_version() -> str:
    """The Kubernetes release the bed's control plane runs, e.g. ``v1.37.2``."""
    return gotools.TOOLS[kubernetes_tool()].version()


def scheduler_version(minor: str | None) -> str:
    """The release of the kube-scheduler the bed runs with this scheduler minor (None: the control plane's)."""
    return gotools.TOOLS[scheduler_tool(minor)].version() if minor else kubernetes_version()


def bin_dir() -> Path:
    return gotools.bin_dir(tools())


def control_plane() -> list[str]:
    """The binaries a bed of kubelet peers runs: every one of the bed's tools but the kubelet."""
    return [b for name in tools() for b in gotools.TOOLS[name].commands.values() if b != KUBELET]


def ensure(log: bool = True, kubelet: bool = True) -> Path:
    """Return the directory holding the bed's binaries (``kubelet=False``: the control plane's alone),
    building what is missing, and build the kube-scheduler ``DRA_TESTBED_SCHEDULER`` asks for."""
    out = gotools.ensure(tools(), log=log, only=None if kubelet else control_plane())
    minor = scheduler_minor()
    if minor:
        ensure_scheduler(minor, log=log)
    return out


def ensure_scheduler(minor: str, log: bool = True) -> Path:
    """The kube-scheduler binary of this minor, built from its pin if not yet cached."""
    return gotools.ensure([scheduler_tool(minor)], log=log) / SCHEDULER


def main(argv: list[str] | None = None) -> int:
    return gotools.ensure_command(ensure, "Build or locate the cached Kubernetes test-bed binaries.", argv)


if __name__ == "__main__":
    sys.exit(main())
