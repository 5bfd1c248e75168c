"""A stand-in ``nvidia-smi``: the compute-mode and time-slice commands, on a state file.

Emulated, as ``nvidia-smi --help`` documents them:

* ``-L``: the GPUs it holds state for;
* ``--query-gpu=compute_mode --format=csv,noheader -i <uuid>``: ``Default``, ``Exclusive_Process``
  or ``Prohibited``;
* ``-i <uuid> -c <mode>``: mode ``0``/``DEFAULT``, ``1``/``EXCLUSIVE_PROCESS``, ``2``/``PROHIBITED``;
* ``compute-policy -i <uuid> --set-timeslice=<0..3>`` (``0``/DEFAULT, ``1``/SHORT, ``2``/MEDIUM,
  ``3``/LONG).

Every call is appended to ``calls.jsonl`` beside ``state.json`` in the folder named by
:data:`STATE_ENV`, or else ``<driver root>/var/standins`` (the script sits in
``<driver root>/usr/bin``), which tests read. A GPU is any ``GPU-`` UUID; one not seen before is
in the ``Default`` mode with time-slice 0. A GPU's ``"fail"`` key in the state file makes every
command on it fail with that message (error injection).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

STATE_ENV = "DRA_STANDIN_STATE_DIR"
MODES = {"0": "Default", "DEFAULT": "Default", "1": "Exclusive_Process", "EXCLUSIVE_PROCESS": "Exclusive_Process",
         "2": "Prohibited", "PROHIBITED": "Prohibited"}
SLICES = {"0": 0, "DEFAULT": 0, "1": 1, "SHORT": 1, "2": 2, "MEDIUM": 2, "3": 3, "LONG": 3}


def state_dir() -> Path:
    given = os.environ.get(STATE_ENV)
    return Path(given) if given else Path(__file__).resolve().parents[2] / "var" / "standins"


def _option(args: list[str], *names: str) -> str | None:
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def run(args: list[str], state: dict[str, Any]) -> tuple[int, str]:
    gpus: dict[str, dict[str, Any]] = state.setdefault("gpus", {})
    if args == ["-L"]:
        return 0, "".join(f"GPU {i}: stand-in (UUID: {u})\n" for i, u in enumerate(sorted(gpus)))
    target = _option(args, "-i", "--id")
    if target is None or not target.startswith("GPU-"):
        return 6, "No devices were found\n"
    gpu = gpus.setdefault(target, {"computeMode": "Default", "timeslice": 0})
    if gpu.get("fail"):
        return 4, f"{gpu['fail']}\n"
    if args and args[0] == "compute-policy":
        value = _option(args, "--set-timeslice")
        if value is None or value.upper() not in SLICES:
            return 2, "Invalid combination of input arguments. Please run 'nvidia-smi compute-policy -h' for help.\n"
        gpu["timeslice"] = SLICES[value.upper()]
        return 0, f"Set timeslice to {gpu['timeslice']} for GPU {target}.\n"
    if _option(args, "--query-gpu") == "compute_mode":
        return 0, f"{gpu['computeMode']}\n"
    mode = _option(args, "-c", "--compute-mode")
    if mode is not None:
        if mode.upper() not in MODES:
            return 2, "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"
        gpu["computeMode"] = MODES[mode.upper()]
        return 0, f"Set compute mode to {mode.upper()} for GPU {target}.\nAll done.\n"
    return 2, "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"


def main(argv: list[str]) -> int:
    folder = state_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = folder / "state.json"
        state = json.loads(path.read_text()) if path.exists() else {}
        code, out = run(argv, state)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
        os.replace(tmp, path)
        with open(folder / "calls.jsonl", "a") as calls:
            calls.write(json.dumps({"tool": "nvidia-smi", "args": argv, "rc": code, "time": time.time()}) + "\n")
    (sys.stdout if code == 0 else sys.stderr).write(out)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
