"""Signal a process read from a file only while it is still the process the bed started.

The bed stops what it left running (``make cluster-down``, ``make demo-down``, the private dockerd)
by pids it wrote to files. PIDs wrap (at 32,768 on the project's machines) and a long build spawns
thousands of processes, so a stale file can name another program's process, and the bed runs as
root. So, when a process starts, its :class:`Identity` is recorded beside its pid: the boot and the
start time the kernel keeps for it (``/proc/<pid>/stat``, field 22, in clock ticks after boot),
which no later process with the same pid can have. :func:`send` signals only a process that still
has them; anything else is left alone.

The check and the signal go through a pidfd held across both, so a process that exits in between
is not replaced by another one under the same number (a process group is signalled by its leader's
number: that part narrows the window to the time between two system calls).
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROC = Path("/proc")
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@dataclass(frozen=True)
class Identity:
    """A process as the bed started it: what the pid named then."""

    pid: int
    start_time: int
    """``/proc/<pid>/stat`` field 22: clock ticks from boot to the process's start."""
    boot_id: str

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "start_time": self.start_time, "boot_id": self.boot_id}


def boot_id() -> str:
    return BOOT_ID.read_text().strip()


def start_time(pid: int) -> int | None:
    """The process's start time, or None when no process has that pid."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # Field 2, the command name in parentheses, may hold spaces and ')': count from the last ')'.
    # What follows it starts at field 3, so field 22 is the 20th.
    return int(stat.rsplit(")", 1)[1].split()[19])


def identify(pid: int) -> Identity | None:
    """Record what ``pid`` names now (call it right after starting the process)."""
    started = start_time(pid)
    return None if started is None else Identity(pid=pid, start_time=started, boot_id=boot_id())


def from_json(value: object) -> Identity | None:
    """An identity as :meth:`Identity.to_json` wrote it; None for anything else (a bare pid written
    by an older bed cannot be checked, so it is never signalled)."""
    if not isinstance(value, dict):
        return None
    pid, started, boot = value.get("pid"), value.get("start_time"), value.get("boot_id")
    if isinstance(pid, int) and isinstance(started, int) and isinstance(boot, str):
        return Identity(pid=pid, start_time=started, boot_id=boot)
    return None


def is_running(recorded: Identity) -> bool:
    """Whether the process the identity names still exists (a zombie included)."""
    return recorded.boot_id == boot_id() and start_time(recorded.pid) == recorded.start_time


def command_line(pid: int) -> list[str] | None:
    """The process's arguments, or None when there is no such process."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return raw.decode(errors="replace").split("\0")[:-1]


def send(recorded: Identity, sig: int, group: bool = False) -> bool:
    """Send ``sig`` to the recorded process (with ``group``, to the process group it leads) if it is
    still that process; returns whether it was sent."""
    try:
        fd = os.pidfd_open(recorded.pid)
    except ProcessLookupError:
        return False
    try:
        if not is_running(recorded):
            return False
        if group:
            os.killpg(recorded.pid, sig)
        else:
            signal.pidfd_send_signal(fd, sig)
    except ProcessLookupError:
        return False
    finally:
        os.close(fd)
    return True
