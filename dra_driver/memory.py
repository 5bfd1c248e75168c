"""The C heap of both programs: glibc's malloc tuned for long-lived processes with many threads.

glibc gives a thread that finds the main heap busy an arena of its own, up to eight per CPU, and
keeps what the thread freed there. In the node plugin a burst of kubelet calls spreads over the
gRPC pool's threads, so after one the plugin held several mostly empty arenas (with
``MALLOC_ARENA_MAX=2`` the same workload left less behind). In the controller the informers
and the 16 workers each decode and free in their own arena: on the scale bench, pods that need
nothing from it grew a synced controller in steps, each larger than the one before; with two
arenas it ended below where it started (the figures: docs/scale.md#the-codes-figures). Two are enough:
the threads spend their time in Python, under one interpreter lock, or waiting on the network and
the disk, not in malloc. :func:`trim` hands pages freed inside the heaps back to the kernel: the
plugin calls it when the kubelet has gone quiet, the informers after each list and every 1,000
watch events. Elsewhere than on glibc both do nothing.
"""

from __future__ import annotations

import ctypes
from typing import Any

M_ARENA_MAX = -8
"""mallopt's parameter number for the arena limit (glibc ``malloc.h``)."""


def _glibc() -> Any | None:
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


_LIBC = _glibc()


def limit_arenas(arenas: int = 2) -> bool:
    """At most ``arenas`` malloc arenas from now on; call it before starting threads."""
    return _LIBC is not None and _LIBC.mallopt(M_ARENA_MAX, arenas) == 1


def trim() -> bool:
    """Return free heap pages to the kernel; True when glibc released any."""
    return _LIBC is not None and _LIBC.malloc_trim(0) == 1
