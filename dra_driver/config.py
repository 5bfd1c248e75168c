"""Settings come from flags whose defaults come from environment variables; the two helpers here
read those variables the same way for the node plugin and the controller."""

from __future__ import annotations

import os


def env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def env_flag(text: str | None) -> bool:
    return (text or "").strip().lower() in ("1", "true", "yes", "on")
