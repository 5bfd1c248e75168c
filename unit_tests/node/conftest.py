"""The node plugin's fixtures: ``env``, an :class:`nodefix.Env` over the test's temporary directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from nodefix import Env, MpsEnv


@pytest.fixture
def env(tmp_path: Path) -> Env:
    """A DeviceState over a fresh state directory, with a fake backend and claim reader."""
    return Env(tmp_path)


@pytest.fixture
def menv(tmp_path: Path) -> MpsEnv:
    """An Env whose state runs MPS control daemons, held in memory by a FakeDaemons."""
    return MpsEnv(tmp_path)
