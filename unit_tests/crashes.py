"""An in-process stand-in for a process killed at a failpoint: tests catch it where a real run dies."""

from __future__ import annotations


class Crash(BaseException):
    """Raised where the plugin would have been killed (BaseException: no handler of ours catches it)."""
