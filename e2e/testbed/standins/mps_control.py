"""A stand-in ``nvidia-cuda-mps-control``: the MPS control daemon and its client, as NVIDIA's MPS
documentation describes them.

* ``nvidia-cuda-mps-control -d`` starts the daemon in the background and returns; it serves in
  ``$CUDA_MPS_PIPE_DIRECTORY`` (default ``/tmp/nvidia-mps``) and logs to
  ``$CUDA_MPS_LOG_DIRECTORY/control.log`` (default ``/var/log/nvidia-mps``). A second ``-d`` for a
  pipe directory whose daemon runs fails, as the real one does.
* ``nvidia-cuda-mps-control`` with no option is the client: it sends each line of stdin to the
  daemon and prints the answers; without a daemon it fails. Commands: ``get_server_list``,
  ``set_default_active_thread_percentage <pct>``, ``get_default_active_thread_percentage``,
  ``set_default_device_pinned_mem_limit <dev> <value>``, ``get_default_device_pinned_mem_limit <dev>``,
  ``quit``.

The daemon here is a Python process listening on ``<pipe dir>/control`` (a Unix socket, where the
real daemon has its named pipes); it writes its pid to ``<pipe dir>/nvidia-cuda-mps-control.pid`` as it starts.
Every run and every command the daemon answers is appended to ``calls.jsonl`` in the stand-ins'
folder (see :mod:`e2e.testbed.standins.nvidia_smi`), with the daemon's pid and pipe directory.
``mps.json`` there may hold ``{"readyDelay": <seconds>}`` (the daemon answers only after it) or
``{"failStart": "<message>"}`` (``-d`` fails): error injection.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

STATE_ENV = "DRA_STANDIN_STATE_DIR"
CONTROL = "control"
PID_FILE = "nvidia-cuda-mps-control.pid"


def state_dir() -> Path:
    given = os.environ.get(STATE_ENV)
    return Path(given) if given else Path(__file__).resolve().parents[2] / "var" / "standins"


def record(entry: dict[str, Any]) -> None:
    folder = state_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "calls.jsonl", "a") as calls:
        calls.write(json.dumps({"tool": "nvidia-cuda-mps-control", "time": time.time(), **entry}) + "\n")


def settings() -> dict[str, Any]:
    path = state_dir() / "mps.json"
    loaded: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    return loaded


def pipe_dir() -> Path:
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps")


def log_dir() -> Path:
    return Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY") or "/var/log/nvidia-mps")


def ask(line: str) -> str | None:
    """The daemon's answer to one command; None without a daemon."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(10)
            os.chdir(pipe_dir())  # a socket's path is limited to 108 bytes; the folder's is not
            conn.connect(CONTROL)
            conn.sendall(line.encode() + b"\n")
            conn.shutdown(socket.SHUT_WR)
            chunks = []
            while chunk := conn.recv(4096):
                chunks.append(chunk)
            return b"".join(chunks).decode()
    except OSError:
        return None


class Daemon:
    def __init__(self) -> None:
        self.percentage = 100
        self.limits: dict[str, str] = {}

    def answer(self, line: str) -> tuple[str, bool]:
        """The answer to one command, and whether to quit."""
        words = line.split()
        if not words:
            return "", False
        command, args = words[0], words[1:]
        if command == "quit":
            return "", True
        if command == "get_server_list":
            return "", False  # no client has connected, so no server runs
        if command == "set_default_active_thread_percentage" and len(args) == 1 and args[0].isdigit() \
                and 1 <= int(args[0]) <= 100:
            self.percentage = int(args[0])
            return f"{self.percentage}.0\n", False
        if command == "get_default_active_thread_percentage":
            return f"{self.percentage}.0\n", False
        if command == "set_default_device_pinned_mem_limit" and len(args) == 2:
            self.limits[args[0]] = args[1]
            return "", False
        if command == "get_default_device_pinned_mem_limit" and len(args) == 1:
            return f"{self.limits.get(args[0], '0')}\n", False
        return f"Unrecognized command {line.strip()!r}\n", False

    def serve(self) -> None:
        pipes, logs = pipe_dir(), log_dir()
        (pipes / PID_FILE).write_text(f"{os.getpid()}\n")
        delay = float(settings().get("readyDelay", 0))
        if delay:
            time.sleep(delay)
        path = pipes / CONTROL
        path.unlink(missing_ok=True)
        os.chdir(pipes)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
            server.bind(CONTROL)
            server.listen(8)
            with open(logs / "control.log", "a") as log:
                log.write(f"[{time.ctime()}] Control daemon started, CUDA_VISIBLE_DEVICES="
                          f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')}\n")
            while True:
                conn, _ = server.accept()
                with conn:
                    data = b""
                    while chunk := conn.recv(4096):
                        data += chunk
                    done = False
                    for line in data.decode().splitlines():
                        reply, done = self.answer(line)
                        record({"daemon": os.getpid(), "pipe": str(pipes), "command": line.strip()})
                        conn.sendall(reply.encode())
                        if done:
                            break
                if done:
                    break
        path.unlink(missing_ok=True)
        (pipes / PID_FILE).unlink(missing_ok=True)


def start() -> int:
    pipes, logs = pipe_dir(), log_dir()
    record({"args": ["-d"], "pipe": str(pipes), "visible": os.environ.get("CUDA_VISIBLE_DEVICES", "")})
    failure = settings().get("failStart")
    if failure:
        sys.stderr.write(f"{failure}\n")
        return 1
    if ask("get_default_active_thread_percentage") is not None:
        sys.stderr.write("An instance of this daemon is already running\n")
        return 1
    pipes.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    if os.fork():
        return 0
    os.setsid()
    if os.fork():
        os._exit(0)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    try:
        Daemon().serve()
    finally:
        os._exit(0)


def client() -> int:
    code = 0
    for line in sys.stdin.read().splitlines():
        if not line.strip():
            continue
        reply = ask(line)
        record({"args": [], "command": line.strip(), "pipe": str(pipe_dir()), "answered": reply is not None})
        if reply is None:
            sys.stderr.write("Cannot find MPS control daemon process\n")
            return 1
        sys.stdout.write(reply)
        if reply.startswith("Unrecognized"):
            code = 1
    return code


def main(argv: list[str]) -> int:
    if argv == ["-d"]:
        return start()
    if not argv:
        return client()
    sys.stderr.write(f"Unsupported option {' '.join(argv)}\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
