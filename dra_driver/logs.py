"""structlog set-up: key-value events, JSON in production, readable lines for people."""

from __future__ import annotations

import logging
import sys
from typing import Any, TypeAlias, cast


def _import_structlog_without_rich() -> None:
    """structlog's ``dev`` module imports ``rich`` whenever it is installed (common-expression-language
    requires it), for console tracebacks these processes never render: memory in every process,
    the node plugin's included (docs/benchmarks.md#the-codes-figures). ``rich`` is hidden while
    structlog loads, so its console renderer uses plain tracebacks; anything else may still
    import ``rich``."""
    if "rich" in sys.modules or "structlog" in sys.modules:
        return
    sys.modules["rich"] = None  # type: ignore[assignment]  # None: "import rich" raises ImportError
    try:
        import structlog  # noqa: F401
    finally:
        del sys.modules["rich"]


_import_structlog_without_rich()
import structlog  # noqa: E402


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


Logger: TypeAlias = structlog.stdlib.BoundLogger
"""The type of every logger passed between components: what :func:`get` returns, bound or not."""


def get(name: str, **bound: Any) -> Logger:
    return cast(Logger, _LazyLogger({"logger": name, **bound}))
