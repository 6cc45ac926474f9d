"""Fixtures for the Hub client tests: a fake Hub per test, a temporary cache, and recorded waits."""

from __future__ import annotations

import pytest

from studio.core.hub import retry
from tests.core.hub.fakehub import FakeHub, prepare_env


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """A running fake Hub with HF_ENDPOINT and a temporary cache pointed at it."""
    with FakeHub() as server:
        server.cache_dir = prepare_env(monkeypatch, tmp_path, server)
        yield server


@pytest.fixture
def waits(monkeypatch):
    """Backoff waits recorded instead of slept (each entry is one 0.1 s tick)."""
    ticks: list[float] = []
    monkeypatch.setattr(retry, "_sleep", lambda s: ticks.append(s))
    return ticks
