"""glibc malloc tuning of both programs."""

from __future__ import annotations

import subprocess
import sys

# In a child process: the arena limit stays for the life of a process. Freed blocks below one
# still in use stay in the heap until trimmed, as after a burst of calls.
CHILD = """
from dra_driver import memory

def rss_kib():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS"))

assert memory.limit_arenas(2)
blocks = [bytearray(4000) for _ in range(20000)]
keep = bytearray(4000)
del blocks
before = rss_kib()
released = memory.trim()
print(released, before - rss_kib())
"""


def test_trim_hands_freed_heap_back_to_the_kernel() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "True"
    assert int(out[1]) > 40_000, f"only {out[1]} KiB of 80 MB freed returned"
