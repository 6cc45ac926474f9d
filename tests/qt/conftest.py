"""Fixtures for GUI tests: isolated settings, a window factory, and a check that no worker is left running."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QCoreApplication, QStandardPaths, QThreadPool  # noqa: E402
from PySide6.QtWidgets import QMessageBox  # noqa: E402

from studio.qt.heap import settle_heap  # noqa: E402
from studio.qt.main_window import MainWindow  # noqa: E402
from studio.qt.services import Services  # noqa: E402
from studio.qt.settings import AppSettings  # noqa: E402

# Qt's own complaints about threads misused: any of them fails the test (FAULTS.md rows 48 and 51).
THREAD_MISUSE_MESSAGES = (
    "Destroyed while thread",
    "Cannot create children for a parent that is in a different thread",
    "Timers cannot be started from another thread",
    "Timers cannot be stopped from another thread",
    "QBasicTimer can only be used with threads started with QThread",
    "Cannot set parent, new parent is in a different thread",
    "not safe to use pixmaps outside the GUI thread",
)


@pytest.fixture(autouse=True)
def _isolated_qt(qapp, qtlog, tmp_path: Path) -> Iterator[None]:
    """Never touch the user's settings or data folders; fail a test that leaves a worker running or misuses threads."""
    QStandardPaths.setTestModeEnabled(True)
    QCoreApplication.setOrganizationName("QuantStudioTests")
    QCoreApplication.setApplicationName("quant-studio-tests")
    yield
    pool = QThreadPool.globalInstance()
    leftover = pool.activeThreadCount()
    # Drain it anyway so one failure does not cascade into the next test.
    pool.waitForDone(10_000)
    assert leftover == 0, f"{leftover} worker thread(s) still running after the test"
    misuse = [r.message for r in qtlog.records if any(m in r.message for m in THREAD_MISUSE_MESSAGES)]
    assert not misuse, f"Qt reported thread misuse: {misuse}"


@pytest.fixture
def settled_heap() -> Iterator[int]:
    """The heap as the window leaves it after its start-up job: everything alive now is frozen, so a full
    cycle collection that trips inside a timed GUI action walks only what came after (yields the count).

    Without it the test process's own heap (every earlier test's objects) makes one such pass cost
    0.5-0.9 s, which the window, whose start-up heap is frozen, never pays; tests that time a GUI action
    use this fixture so that they measure the window's work, not the suite's history."""
    gc.collect()
    try:
        yield settle_heap()
    finally:
        gc.unfreeze()


@pytest.fixture
def settings_path(tmp_path: Path) -> Path:
    """An INI file standing in for the user's settings."""
    return tmp_path / "settings" / "quant-studio.ini"


@pytest.fixture
def real_services() -> Services:
    """The services the app really uses (studio.app's composition root)."""
    from studio.app import build_services

    return build_services()


@pytest.fixture
def make_window(qtbot, settings_path: Path, real_services: Services) -> Iterator[Callable[..., MainWindow]]:
    """Build shown main windows over isolated settings; they are closed (jobs cancelled and joined) afterwards."""
    windows: list[MainWindow] = []

    def make(services: Services | None = None, settings_file: Path | None = None) -> MainWindow:
        settings = AppSettings.from_file(str(settings_file or settings_path))
        win = MainWindow(services or real_services, settings=settings)
        qtbot.addWidget(win)
        win.show()
        windows.append(win)
        return win

    yield make
    for win in windows:
        win.close()
        # close() cancels and joins the window's jobs: nothing may still run right after it.
        assert QThreadPool.globalInstance().activeThreadCount() == 0


class DialogRecorder:
    """Stands in for QMessageBox's static functions and records what would have been shown."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.answer = QMessageBox.StandardButton.Cancel

    def recorder(self, kind: str) -> Callable[..., QMessageBox.StandardButton]:
        def record(_parent, title: str, text: str, *args, **kwargs) -> QMessageBox.StandardButton:
            self.calls.append((kind, title, text))
            return self.answer

        return record


@pytest.fixture
def dialogs(monkeypatch: pytest.MonkeyPatch) -> DialogRecorder:
    """Capture QMessageBox.warning/critical/information/question instead of opening modal dialogs."""
    rec = DialogRecorder()
    for kind in ("warning", "critical", "information", "question"):
        monkeypatch.setattr(QMessageBox, kind, staticmethod(rec.recorder(kind)))
    return rec


@pytest.fixture(scope="session")
def tiny_models(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], Path]:
    """``tiny_models("llama")`` -> path of a cached two-layer factory checkpoint of that architecture.

    Uses the shared ``tiny_model`` fixture of tests/factory_fixtures.py when it is registered, so the GUI
    tests reuse the models the core tests built; otherwise builds its own.
    """
    try:
        shared = request.getfixturevalue("tiny_model")
    except pytest.FixtureLookupError:
        shared = None
    if shared is not None:
        return lambda arch: shared(arch)

    from studio.core.factory import make_tiny_model

    root = tmp_path_factory.mktemp("qt-models")
    cache: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in cache:
            cache[arch] = make_tiny_model(root / arch, arch, hidden=256, layers=2, seed=0)
        return cache[arch]

    return get
