"""Hostile model cards on the real Hub panel over the fake Hub (issue 25): the GUI thread is never blocked
for more than 200 ms by a card, links open only for http(s) after the user saw the address, nothing is
loaded from local files."""

from __future__ import annotations

import time

import pytest
from PySide6.QtCore import QObject, QPoint, Qt, QTimer, QUrl, Slot
from PySide6.QtGui import QDesktopServices, QTextCursor, QTextDocument

from studio.qt.jobs import JobManager
from studio.qt.panels.hub_panel import HubPanel
from studio.qt.state import StudioState
from tests.core.hub.fakehub import FakeHub, FakeRepo, default_repos, prepare_env

BLOCK_LIMIT_S = 0.200
NESTED_20 = "# Twenty tables\n\n" + "<table><tr><td>" * 20 + "inner cell" + "</td></tr></table>" * 20
NESTED_3000 = "# Deep tables\n\n" + "<table><tr><td>" * 3000 + "deepest cell" + "</td></tr></table>" * 3000
BRACKETS = "[" * (2 * 1024 * 1024)
LINKS = """# Links

[web page](https://example.org/page?q=1) and [plain](http://example.net/x).

[passwd](file:///etc/passwd) [relative](../secret.txt) [script](javascript:alert(1))
[share](smb://attacker/share) [editor](vscode://file/etc/passwd) [custom](ms-msdt:/id)

[top](#links)
"""
IMAGES = "# Images\n\n![zero](/dev/zero) ![local](file:///etc/passwd)\n"
SCHEMES = ("http", "https", "file", "smb", "vscode", "javascript", "ms-msdt")
EVIL_LICENSE = "<table><tr><td>" * 50 + "mit\x1b[31m"


def _repo(repo_id: str, card: str, **kw) -> FakeRepo:
    return FakeRepo(repo_id, files={"README.md": card.encode(), "config.json": b"{}"}, **kw)


@pytest.fixture
def hub(monkeypatch, tmp_path):
    repos = default_repos()
    for r in (
        _repo("evil-org/nested-20", NESTED_20, downloads=5),
        _repo("evil-org/nested-3000", NESTED_3000, downloads=4),
        _repo("evil-org/brackets", BRACKETS, downloads=3),
        _repo("evil-org/links", LINKS, downloads=2),
        _repo("evil-org/images", IMAGES, downloads=1, card_data={"license": EVIL_LICENSE}),
    ):
        repos[r.repo_id] = r
    with FakeHub(repos) as server:
        server.cache_dir = prepare_env(monkeypatch, tmp_path, server)
        monkeypatch.setattr("studio.core.hub.auth.get_token", lambda: (None, None))
        yield server


@pytest.fixture
def panel(qtbot, hub):
    p = HubPanel(StudioState(), JobManager())
    qtbot.addWidget(p)
    p.resize(1200, 800)
    p.show()
    p.search_edit.setText("evil")
    qtbot.keyClick(p.search_edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: p.results.rowCount() == 5, timeout=20_000)
    yield p
    p.shutdown()
    p.jobs.shutdown()


class _Ticker:
    """Records how long the GUI thread went without running a 10 ms timer (its longest block)."""

    def __init__(self) -> None:
        self.timer = QTimer()
        self.timer.setInterval(10)
        self.times: list[float] = []
        self.timer.timeout.connect(lambda: self.times.append(time.perf_counter()))

    def __enter__(self) -> _Ticker:
        self.times.append(time.perf_counter())
        self.timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.timer.stop()
        self.times.append(time.perf_counter())

    @property
    def longest(self) -> float:
        return max(b - a for a, b in zip(self.times, self.times[1:], strict=False))


def _show_card(qtbot, panel, repo_id: str) -> float:
    """Select ``repo_id`` in the results and wait for its card; returns the GUI thread's longest block."""
    with _Ticker() as tick:
        for r in range(panel.results.rowCount()):
            if panel.results.item(r, 0).data(Qt.ItemDataRole.UserRole) == repo_id:
                panel.results.selectRow(r)
        qtbot.waitUntil(lambda: panel._details is not None and panel._details.id == repo_id, timeout=60_000)
        panel.card.viewport().repaint()  # the layout and a paint of what is shown count too
        qtbot.wait(100)
    return tick.longest


@pytest.mark.parametrize(
    ("repo_id", "shown"),
    [
        ("evil-org/nested-20", "inner cell"),
        ("evil-org/nested-3000", "deepest cell"),
        ("evil-org/brackets", "The card is cut here"),
    ],
)
def test_hostile_card_never_blocks_the_gui_thread(qtbot, panel, repo_id, shown):
    longest = _show_card(qtbot, panel, repo_id)
    print(f"{repo_id}: the GUI thread's longest block was {longest * 1000:.0f} ms")
    assert shown in panel.card.toPlainText()
    assert longest < BLOCK_LIMIT_S, f"the GUI thread was blocked {longest * 1000:.0f} ms"
    assert panel.isVisible()


class _Opened(QObject):
    """Stands in for the system browser: every scheme's openUrl lands here (also Qt's own calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    @Slot(QUrl)
    def handle(self, url: QUrl) -> None:
        self.urls.append(url.toString())


@pytest.fixture
def opened():
    rec = _Opened()
    for scheme in SCHEMES:
        QDesktopServices.setUrlHandler(scheme, rec, "handle")
    yield rec
    for scheme in SCHEMES:
        QDesktopServices.unsetUrlHandler(scheme)


def _click_link(qtbot, browser, href: str) -> None:
    """A real mouse click on the link ``href`` where it is drawn."""
    doc = browser.document()
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            if frag.charFormat().isAnchor() and frag.charFormat().anchorHref() == href:
                cur = QTextCursor(doc)
                cur.setPosition(frag.position() + max(1, frag.length() // 2))
                rect = browser.cursorRect(cur)
                pos = QPoint(rect.left() - 2, rect.center().y())
                qtbot.mouseClick(browser.viewport(), Qt.MouseButton.LeftButton, pos=pos)
                return
            it += 1
        block = block.next()
    raise AssertionError(f"no link {href!r} on the card")


def test_links_open_only_for_http_after_the_user_saw_the_address(qtbot, panel, opened):
    _show_card(qtbot, panel, "evil-org/links")
    card = panel.card
    before = card.toPlainText()
    asked: list[str] = []
    answer = [False]
    card.confirm_link = lambda parent, address: (asked.append(address), answer[0])[1]
    errors: list[str] = []
    panel.errorShown.connect(errors.append)

    _click_link(qtbot, card, "https://example.org/page?q=1")
    assert asked == ["https://example.org/page?q=1"] and opened.urls == []  # shown, declined: not opened
    answer[0] = True
    _click_link(qtbot, card, "http://example.net/x")
    assert asked[-1] == "http://example.net/x"
    qtbot.waitUntil(lambda: opened.urls == ["http://example.net/x"], timeout=5_000)

    for href in (
        "file:///etc/passwd",
        "../secret.txt",
        "javascript:alert(1)",
        "smb://attacker/share",
        "vscode://file/etc/passwd",
        "ms-msdt:/id",
    ):
        n_errors = len(errors)
        _click_link(qtbot, card, href)
        qtbot.wait(50)
        assert len(errors) == n_errors + 1 and "was not opened" in errors[-1], href
        assert card.toPlainText() == before, href  # no local file shown inside the pane
    assert len(asked) == 2 and opened.urls == ["http://example.net/x"]


def test_card_loads_nothing_from_local_files_and_the_license_is_text(qtbot, panel):
    _show_card(qtbot, panel, "evil-org/images")
    card = panel.card
    assert (
        card.loadResource(QTextDocument.ResourceType.ImageResource.value, QUrl("file:///etc/passwd")) is None
    )
    assert "<img" not in card.toHtml() and "/dev/zero" not in card.toHtml()
    label = panel.title_label.text()
    assert "&lt;table&gt;" in label and "<table>" not in label and "\x1b" not in label


def test_a_server_message_of_nested_tables_is_shown_as_text(qtbot, panel, hub):
    from tests.core.hub.fakehub import Fault

    msg = "<table><tr><td>" * 300 + "no"
    hub.add_fault(
        Fault(
            "status",
            path="/api/models/evil-org/links*",
            times=None,
            status=403,
            headers={"X-Error-Code": "Forbidden", "X-Error-Message": msg},
        )
    )
    with _Ticker() as tick:
        for r in range(panel.results.rowCount()):
            if panel.results.item(r, 0).data(Qt.ItemDataRole.UserRole) == "evil-org/links":
                panel.results.selectRow(r)
        qtbot.waitUntil(lambda: "403" in panel.status.text(), timeout=60_000)
        panel.status.repaint()
        qtbot.wait(100)
    assert "<table><tr><td>" in panel.status.text()  # the server's words, as text
    assert panel.status.textFormat() == Qt.TextFormat.PlainText
    assert tick.longest < BLOCK_LIMIT_S, f"the GUI thread was blocked {tick.longest * 1000:.0f} ms"
