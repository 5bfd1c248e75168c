"""How the bed runs the driver's programs (node plugin, controller): as the image does.

The image runs everything with ``PYTHONOPTIMIZE=2`` (no docstrings, no asserts; 1.5 MiB less in
the plugin) from bytecode compiled when it is built (``deploy/image/Dockerfile``). The bed's
plugins and controller get ``-OO`` too, so the e2e suite tests and the benchmarks measure what
ships.

Where ``PYTHONDONTWRITEBYTECODE`` is set (as on CI machines), nothing would ever write the
``opt-2`` bytecode, and every plugin start would compile each module it imports from source again:
twice the start-up time and 2 MiB more memory, in every restart of the crash storms. So the first
command of a process compiles our package and the installed packages once (up-to-date files
are skipped: about 2 s when warm).
"""

from __future__ import annotations

import compileall
import functools
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OPTIMIZE = 2


@functools.cache
def shipped_python() -> tuple[str, ...]:
    """The interpreter and its flags, for ``[*shipped_python(), "-m", "dra_driver", COMMAND, ...]``."""
    for folder in (REPO / "dra_driver", Path(sysconfig.get_paths()["purelib"])):
        compileall.compile_dir(folder, quiet=2, optimize=[0, OPTIMIZE], workers=0)
    return (sys.executable, "-OO")
