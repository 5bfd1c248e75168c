"""``make test``'s Go builds for its later stages, run ahead in the background on idle CPU.

``make test`` runs its stages one after the other, and a cold run spends most of its time in Go
builds: Kubernetes for the bed, 1.36 for the smoke subset, the 1.38 kube-scheduler, kind's node
tools. The stages between them leave a core idle much of the time: pytest runs on one core, and
the e2e suite spends about half its time waiting on the control plane. ``start`` launches one
detached worker, at the lowest CPU priority, that builds every tool set ``make test`` will ask for,
in the order the stages ask for them (``make test`` runs ``e2e-oldest`` last, so that Kubernetes 1.36
builds beside the stages that wait most); each stage still calls ``gotools.ensure`` itself and
either finds the set complete, waits on the set's lock while the worker finishes it, or builds it.

The worker only warms the cache: the same pins, the same recipe, the same folders and locks as the
stages' own builds. A set it fails to build is logged and left to the stage, which then builds it
and reports the error where a person reads it. It stops, killing its build, as soon as the process
it watches (``make``) is gone, so an interrupted ``make test`` leaves nothing running.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from e2e.tooling import binaries, gotools, runtime, toolsets

LOG = Path(".run") / "prefetch.log"
WATCH_EVERY_S = 2.0


def tool_sets() -> list[tuple[str, ...]]:
    """Every tool set ``make test`` builds, in the order its stages first ask for it (the same
    names in the same order as each stage's call, so that each lands in the stage's folder)."""
    oldest = next(m for m in reversed(binaries.MINORS))
    sets: list[Sequence[str]] = [
        # make unit-no-helm: the CDI checks, NVML and the toolkit (small)
        [toolsets.CDI_VALIDATE_TOOL], [toolsets.MOCK_NVML_TOOL], [toolsets.FAKE_DRIVER_TOOL],
        # make e2e: the bed and its real node (what every stage after lint waits for), the scale
        # smoke's kwok; then helm, for the device-plugin test that make e2e runs last and for
        # make unit-helm after it
        (binaries.MINORS[binaries.kubernetes_minor()], "etcd"), runtime.RUNTIME_TOOLS, runtime.CNI_TOOLS, [toolsets.KWOK_TOOL],
        ["helm"],
        # make e2e-next
        *([tool] for tool in binaries.SCHEDULER_ONLY_MINORS.values()),
        # make e2e-kind: the node image (e2e.testbed.kindnode.ensure_binaries' order; the bed's
        # Kubernetes and the runtime are above)
        [toolsets.KIND_TOOL], toolsets.KIND_NODE_TOOLS, [toolsets.CRICTL_TOOL], [toolsets.KIND_ETCD_TOOL],
        [toolsets.COREDNS_TOOL], [toolsets.KINDNET_TOOL], [toolsets.LOCAL_PATH_TOOL],
        # make e2e-oldest, last in make test
        (binaries.MINORS[oldest], "etcd"),
    ]
    seen: list[tuple[str, ...]] = []
    for names in sets:
        if tuple(names) not in seen:
            seen.append(tuple(names))
    return seen


def alive(pid: int) -> bool:
    """Whether ``pid`` still runs: an exited process its parent has not reaped yet (a zombie) has not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:
        return True
    # The state follows the command name, which is in parentheses and may itself hold any character.
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def _watch(pid: int) -> None:
    """Stop the whole worker (its running go build too) once ``pid`` has exited."""
    while alive(pid):
        time.sleep(WATCH_EVERY_S)
    print(f"prefetch: process {pid} has exited; stopping", flush=True)
    os.killpg(os.getpgrp(), signal.SIGTERM)


def _stop(signum: int, _frame: FrameType | None) -> None:
    # SystemExit unwinds gotools.ensure's cleanup (its temporary folder, its lock).
    raise SystemExit(128 + signum)


def run(watch: int) -> int:
    os.nice(19)
    signal.signal(signal.SIGTERM, _stop)
    threading.Thread(target=_watch, args=(watch,), name="prefetch-watch", daemon=True).start()
    started = time.monotonic()
    for names in tool_sets():
        if not alive(watch):
            break
        t = time.monotonic()
        try:
            gotools.ensure(names, log=True)
        except (gotools.ToolError, OSError, subprocess.SubprocessError) as err:
            # The stage that needs this set builds it again and reports the error there.
            print(f"prefetch: {'+'.join(names)} not built here ({err}); its stage will build it", flush=True)
            continue
        print(f"prefetch: {'+'.join(names)} ready after {time.monotonic() - t:.0f}s", flush=True)
    print(f"prefetch: done in {time.monotonic() - started:.0f}s", flush=True)
    return 0


def start(watch: int, log: Path) -> int:
    if not alive(watch):
        print(f"prefetch: no process {watch} to watch; nothing started", file=sys.stderr)
        return 2
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        subprocess.Popen([sys.executable, "-m", "e2e.tooling.prefetch", "run", "--watch", str(watch)],
                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    print(f"prefetch: building the later stages' Go tools in the background, at the lowest priority (log: {log})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.tooling.prefetch", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("start", "run", "list"))
    parser.add_argument("--watch", type=int, default=os.getppid(),
                        help="stop when this process exits (make passes its own PID; default: the parent)")
    parser.add_argument("--log", type=Path, default=LOG)
    args = parser.parse_args(argv)
    if args.action == "list":
        for names in tool_sets():
            print(" ".join(names))
        return 0
    if args.action == "run":
        return run(args.watch)
    return start(args.watch, args.log)


if __name__ == "__main__":
    sys.exit(main())
