"""Place the stand-in tools in a driver root and read what they recorded.

``python -m e2e.testbed.standins.install ROOT --python /opt/dra-driver/bin/python`` makes a root for
another machine (a kind node: run-e2e.sh copies it there for the plugin's image to run).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TOOLS = {"nvidia-smi": HERE / "nvidia_smi.py", "nvidia-cuda-mps-control": HERE / "mps_control.py"}
BIN = "usr/bin"


def install(driver_root: Path, names: tuple[str, ...] = tuple(TOOLS), python: str = sys.executable) -> Path:
    """``<driver_root>/usr/bin/<name>`` for each stand-in, run by ``python`` (this interpreter
    unless told); returns the root."""
    bin_dir = driver_root / BIN
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in names:
        target = bin_dir / name
        target.write_text(f"#!{python}\n" + TOOLS[name].read_text())
        target.chmod(0o755)
    return driver_root


def state_dir(driver_root: Path) -> Path:
    return driver_root / "var" / "standins"


def calls(driver_root: Path, tool: str = "nvidia-smi") -> list[list[str]]:
    """The argument lists the stand-in ``tool`` was run with, in order."""
    path = state_dir(driver_root) / "calls.jsonl"
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line]
    return [line["args"] for line in lines if line["tool"] == tool]


def mps_calls(driver_root: Path) -> list[dict[str, Any]]:
    """What the stand-in MPS control was asked: runs (``args``) and the commands its daemons answered
    (``daemon``: the daemon's pid, ``command``)."""
    path = state_dir(driver_root) / "calls.jsonl"
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line]
    return [line for line in lines if line["tool"] == "nvidia-cuda-mps-control"]


def set_mps(driver_root: Path, **settings: Any) -> None:
    """Error injection for the stand-in MPS control (``readyDelay``, ``failStart``); none clears it."""
    folder = state_dir(driver_root)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "mps.json").write_text(json.dumps(settings))


def gpus(driver_root: Path) -> dict[str, dict[str, Any]]:
    """The GPUs as the stand-ins hold them: UUID -> computeMode, timeslice."""
    path = state_dir(driver_root) / "state.json"
    found: dict[str, dict[str, Any]] = json.loads(path.read_text()).get("gpus", {}) if path.exists() else {}
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.testbed.standins.install", description=__doc__)
    parser.add_argument("root", type=Path, help="the driver root to make")
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs them there")
    args = parser.parse_args(argv)
    print(install(args.root, python=args.python))
    return 0


if __name__ == "__main__":
    sys.exit(main())
