"""``python -m e2e.kubelet_peer``: run the emulated kubelet for one node until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from .health import HealthStore
from .kube import Kube
from .logutil import kv, setup_logging
from .node import NodeHeartbeat, startup_wipe, wipe_slices
from .pods import PodController
from .protos import load_protos
from .registration import PluginManager
from .state import PeerState

log = logging.getLogger("kubelet_peer")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m e2e.kubelet_peer", description=__doc__)
    p.add_argument("--node-name", required=True)
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--registry-dir", required=True, help="kubelet plugins_registry directory to watch")
    p.add_argument("--cdi-dir", required=True, help="CDI spec directory the emulated runtime reads")
    p.add_argument("--state-dir", required=True, help="where peer-state.json and health.json live")
    p.add_argument("--wipe-delay", type=float, default=30.0, help="seconds without a connected plugin before wipe")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--proto-root", default=None, help="override the api/proto directory")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(args.node_name, args.log_level)
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info(kv("signal received, shutting down", signal=signal.Signals(signum).name))
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    state_dir = Path(args.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    Path(args.registry_dir).mkdir(parents=True, exist_ok=True)
    Path(args.cdi_dir).mkdir(parents=True, exist_ok=True)

    protos = load_protos(args.proto_root)
    kube = Kube(args.kubeconfig)
    state = PeerState(state_dir / "peer-state.json")
    state.load()
    log.info(
        kv(
            "starting",
            registry_dir=args.registry_dir,
            cdi_dir=args.cdi_dir,
            state_dir=str(state_dir),
            prepared_claims=len(state.claims),
        )
    )

    heartbeat = NodeHeartbeat(kube, args.node_name)
    try:
        heartbeat.ensure_node()
    except Exception as e:
        log.warning(kv("cannot check/create the Node object yet", error=e))
    threads = [threading.Thread(target=heartbeat.run, args=(stop,), name="node-heartbeat", daemon=True)]
    threads[0].start()

    # Like the kubelet: slices of this node are wiped before any plugin can (re)publish them.
    startup_wipe(kube, args.node_name, stop)
    # Tells the bed that plugins may start now: one started earlier would publish slices that the
    # wipe above deletes again, and tests would race the re-publish.
    (state_dir / "ready").write_text(str(os.getpid()))

    plugins = PluginManager(
        args.registry_dir,
        protos,
        on_wipe=lambda driver: wipe_slices(kube, args.node_name, driver),
        health_store=HealthStore(state_dir / "health.json"),
        wipe_delay=args.wipe_delay,
    )
    pods = PodController(kube, plugins, state, args.node_name, args.cdi_dir)
    for target, name in ((plugins.run, "plugin-watcher"), (pods.run, "pod-controller")):
        t = threading.Thread(target=target, args=(stop,), name=name, daemon=True)
        t.start()
        threads.append(t)

    while not stop.wait(1.0):
        pass
    for t in threads:
        t.join(timeout=10)
    try:
        state.save()
    except OSError as e:
        log.warning(kv("final state save failed", error=e))
    log.info(kv("stopped"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
