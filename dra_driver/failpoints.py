"""Crash injection for reliability tests: SIGKILL this process at named points.

Enabled only through the environment, never by a flag, so that a production manifest cannot turn
it on by accident::

    DRA_DRIVER_FAILPOINTS="prepare.after-cdi-write=0.2,unprepare.after-spec-delete=0.1"
    DRA_DRIVER_FAILPOINTS_SEED=42          # optional; reproducible sequence of decisions

Each ``name=probability`` arms one point; every time the code passes an armed point it dies with
that probability. SIGKILL (not an exception, not ``sys.exit``) is the point: no ``finally``, no
atexit, no buffered write gets flushed, exactly like the OOM killer or a node losing power.

When the variable is unset, :func:`hit` is one global read and a return. An unknown point name or
a probability outside [0, 1] makes :func:`configure` raise, so a typo cannot silently disable the
crash test that relies on it.
"""

from __future__ import annotations

import os
import random
import signal
import threading
from collections.abc import Mapping

ENV = "DRA_DRIVER_FAILPOINTS"
SEED_ENV = "DRA_DRIVER_FAILPOINTS_SEED"

POINTS: Mapping[str, str] = {
    "prepare.after-intent": "checkpoint has a claim as PrepareStarted without devices, its ResourceClaim being read",
    "prepare.after-started": "checkpoint has the batch as PrepareStarted, no CDI spec written yet",
    "prepare.after-cdi-write": "one claim's CDI spec written, the batch still PrepareStarted",
    "prepare.after-time-slice": "a claim's GPUs given their time-slice (the batch recorded as PrepareStarted), no CDI spec yet",
    "prepare.after-mps-start": "a claim's MPS control daemons running (the batch PrepareStarted), no CDI spec yet",
    "prepare.after-completed": "checkpoint says PrepareCompleted, the kubelet has no answer yet",
    "unprepare.after-spec-delete": "CDI spec deleted, checkpoint entry still present",
    "unprepare.after-time-slice": "a GPU's time-slice reset, its last claim's entry still in the checkpoint",
    "unprepare.after-mps-stop": "an MPS control daemon stopped, its last claim's entry still in the checkpoint",
    "unprepare.after-checkpoint": "entry removed from the checkpoint, the kubelet has no answer yet",
    "atomic-write.before-rename": "temporary file written and synced, not yet renamed over the target",
    "checkpoint.before-flush": "checkpoint journal record appended, not yet flushed to disk",
    "lock.acquired": "serialize.lock taken for a batch, the checkpoint not yet re-read",
    "lock.before-release": "a batch done under serialize.lock, the lock not yet released",
}

_armed: dict[str, float] | None = None
_rng = random.Random()
_lock = threading.Lock()


def parse(spec: str) -> dict[str, float]:
    """``"a=0.5,b=1"`` -> ``{"a": 0.5, "b": 1.0}``; raises ValueError on unknown names or bad numbers."""
    armed: dict[str, float] = {}
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, value = item.partition("=")
        name = name.strip()
        if name not in POINTS:
            raise ValueError(f"unknown failpoint {name!r}; known: {', '.join(sorted(POINTS))}")
        try:
            probability = float(value) if sep else 1.0
        except ValueError:
            raise ValueError(f"failpoint {name}: probability {value!r} is not a number") from None
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"failpoint {name}: probability {probability} is not within [0, 1]")
        armed[name] = probability
    return armed


def configure(environ: Mapping[str, str] | None = None) -> None:
    """(Re-)read the failpoints from ``environ`` (default: ``os.environ``)."""
    global _armed
    env = os.environ if environ is None else environ
    spec = env.get(ENV, "")
    armed = parse(spec) if spec.strip() else {}
    seed = env.get(SEED_ENV)
    with _lock:
        _rng.seed(int(seed) if seed not in (None, "") else None)
        _armed = armed or None


def armed() -> dict[str, float]:
    return dict(_armed or {})


def _die(name: str) -> None:
    # One raw write: stdio buffers would die with the process, and the test counts these lines.
    os.write(2, f'{{"level":"warning","event":"failpoint fired, killing the process","failpoint":"{name}",'
                f'"pid":{os.getpid()}}}\n'.encode())
    os.kill(os.getpid(), signal.SIGKILL)


def hit(name: str) -> None:
    """Pass the failpoint ``name``: dies here with its probability when armed."""
    points = _armed
    if points is None:
        return
    probability = points.get(name)
    if not probability:
        return
    with _lock:
        fire = _rng.random() < probability
    if fire:
        _die(name)


configure()
