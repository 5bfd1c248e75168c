"""structlog set-up: key-value events, JSON in production, readable lines for people."""

from __future__ import annotations

import logging
import sys
from typing import Any, cast

import structlog


def configure(fmt: str = "json", level: str = "info") -> None:
    if fmt not in ("json", "console"):
        raise ValueError(f"log format must be 'json' or 'console', got {fmt!r}")
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    renderer: Any = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


class _LazyLogger:
    """Binds to structlog's configuration when used, not when created.

    Module-level loggers are created at import, before :func:`configure` has run; binding them
    then froze structlog's default set-up (console format on stdout, every level) into them.
    """

    def __init__(self, values: dict[str, Any]) -> None:
        self._values = values

    def bind(self, **values: Any) -> Any:
        return structlog.get_logger().bind(**self._values, **values)

    def __getattr__(self, name: str) -> Any:
        return getattr(structlog.get_logger().bind(**self._values), name)


def get(name: str, **bound: Any) -> structlog.stdlib.BoundLogger:
    return cast(structlog.stdlib.BoundLogger, _LazyLogger({"logger": name, **bound}))
