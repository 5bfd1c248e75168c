"""The node plugin's fixtures: ``env``, an :class:`nodefix.Env` over the test's temporary directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from nodefix import Env


@pytest.fixture
def env(tmp_path: Path) -> Env:
    """A DeviceState over a fresh state directory, with a fake backend and claim reader."""
    return Env(tmp_path)
