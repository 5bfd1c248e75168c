"""The plugin's C heap: glibc's malloc tuned for a long-lived process whose threads come in bursts.

glibc gives a thread that finds the main heap busy an arena of its own, up to eight per CPU, and
keeps what the thread freed there. A burst of kubelet calls spreads over the gRPC pool's threads,
so after one the plugin held several mostly empty arenas (with ``MALLOC_ARENA_MAX=2`` the same
workload left about 2 MiB less). Two arenas are enough: the threads spend their time in Python,
under one interpreter lock, or waiting on the disk and the network, not in malloc.
:func:`trim` hands pages freed inside the heaps back to the kernel after a burst; the plugin calls
it when the kubelet has gone quiet. Elsewhere than on glibc both do nothing.
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
