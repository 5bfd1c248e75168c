"""key=value logging on stderr; every line carries the node name."""

from __future__ import annotations

import logging
import sys
from typing import Any

_node = "-"


def _quote(v: Any) -> str:
    s = str(v)
    if s == "" or any(c in s for c in ' "=\n\t'):
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    return s


def kv(event: str, **fields: Any) -> str:
    parts = [f"msg={_quote(event)}"]
    parts += [f"{k}={_quote(v)}" for k, v in fields.items() if v is not None]
    return " ".join(parts)


class _NodeFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.node = _node
        return True


def setup_logging(node: str, level: str) -> None:
    global _node
    _node = node
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_NodeFilter())
    handler.setFormatter(logging.Formatter("ts=%(asctime)s level=%(levelname)s node=%(node)s logger=%(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # The gRPC/urllib3 internals are too chatty below WARNING for an e2e log.
    for noisy in ("urllib3", "kubernetes"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
