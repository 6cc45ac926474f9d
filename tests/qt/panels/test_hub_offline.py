"""The Hub page offline (issue 26): its one sentence within 3 s, for a closed port and an unresolvable name."""

from __future__ import annotations

import time

import pytest
from PySide6.QtCore import Qt

from studio.core.hub import reach
from studio.qt.jobs import JobManager
from studio.qt.panels.hub_panel import HubPanel
from studio.qt.state import StudioState
from tests.core.hub.test_offline_quick import closed_port_url


@pytest.mark.parametrize("where", ["closed-port", "unresolvable"])
def test_hub_page_offline_says_so_within_three_seconds(qtbot, monkeypatch, tmp_path, where):
    url = closed_port_url() if where == "closed-port" else "http://nonexistent.invalid"
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr("studio.core.hub.auth.get_token", lambda: (None, None))
    reach.forget()
    panel = HubPanel(StudioState(), JobManager())
    qtbot.addWidget(panel)
    panel.show()
    errors: list[str] = []
    panel.errorShown.connect(errors.append)
    try:
        panel.search_edit.setText("llama")
        t0 = time.monotonic()
        qtbot.keyClick(panel.search_edit, Qt.Key.Key_Return)
        qtbot.waitUntil(lambda: bool(errors), timeout=5_000)
        took = time.monotonic() - t0
        assert took <= 3.0, took
        assert errors[0].startswith(f"The Hub at {url} cannot be reached")
        assert "cannot be reached" in panel.status.text()
    finally:
        panel.shutdown()
        panel.jobs.shutdown()
