"""Loggers created before logs.configure() (module level, at import) follow the configuration."""

from __future__ import annotations

import json

import pytest
import structlog

from dra_driver import logs


def test_logger_created_before_configure_uses_json_and_level(capsys: pytest.CaptureFixture[str]) -> None:
    structlog.reset_defaults()
    early = logs.get("early", node="n1")
    logs.configure("json", "warning")
    try:
        early.info("hidden by the level")
        early.warning("shown", extra=1)
        early.bind(claim="c").error("bound after configure")
        err = capsys.readouterr().err
        lines = [json.loads(x) for x in err.splitlines()]
        assert [x["event"] for x in lines] == ["shown", "bound after configure"]
        assert lines[0]["logger"] == "early" and lines[0]["node"] == "n1" and lines[1]["claim"] == "c"
    finally:
        structlog.reset_defaults()
