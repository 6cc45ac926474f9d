"""A text browser for rich text from strangers (model cards): bounded layout, no local files, asked-for links.

``SafeTextBrowser.show_untrusted_markdown`` renders ``studio.core.untrusted.card_markdown``'s subset
with raw HTML switched off as well, so layout time stays bounded whatever the card holds. It loads no
resource at all (an image named ``file:///…`` or ``/dev/zero`` would otherwise be read by the GUI
thread) and never follows a link itself: a click on an http(s) address shows the address and opens it
in the system browser only when the user agrees; ``#anchors`` scroll; every other link (``file:``,
relative, ``javascript:``, custom schemes) is refused and reported through ``linkRefused``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QUrl, Signal, Slot
from PySide6.QtGui import QDesktopServices, QTextDocument
from PySide6.QtWidgets import QMessageBox, QTextBrowser, QWidget

from studio.core.untrusted import card_markdown, link_allowed, short, terminal_safe

_FEATURES = QTextDocument.MarkdownFeature.MarkdownDialectGitHub | QTextDocument.MarkdownFeature.MarkdownNoHTML


def ask_open_link(parent: QWidget, address: str) -> bool:
    """Show the address and ask whether to open it in the system browser."""
    answer = QMessageBox.question(
        parent,
        "Open link",
        f"Open this address in your web browser?\n\n{address}",
        QMessageBox.StandardButton.Open | QMessageBox.StandardButton.Cancel,
        QMessageBox.StandardButton.Cancel,
    )
    return answer == QMessageBox.StandardButton.Open


class SafeTextBrowser(QTextBrowser):
    """A ``QTextBrowser`` for untrusted Markdown; see the module doc."""

    linkRefused = Signal(str)  # a sentence: which link was not opened and why
    linkOpened = Signal(str)  # the address handed to the system browser

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        # (parent, address) -> open it?: a dialog, or a test's stand-in.
        self.confirm_link: Callable[[QWidget, str], bool] = ask_open_link
        self.anchorClicked.connect(self._on_anchor)

    def show_untrusted_markdown(self, text: str) -> None:
        """Render ``text`` (a model card) as the bounded, HTML-free subset."""
        self.document().setMarkdown(card_markdown(text), _FEATURES)

    def loadResource(self, kind: int, name: QUrl) -> Any:  # noqa: N802 - Qt's name
        """Nothing is loaded: a card's images would be read from local paths on the GUI thread."""
        return None

    @Slot(QUrl)
    def _on_anchor(self, url: QUrl) -> None:
        address = url.toString()
        if not address:
            return
        if address.startswith("#"):
            self.scrollToAnchor(url.fragment())
            return
        shown = terminal_safe(short(address, 300))
        if not link_allowed(address) or url.isRelative() or url.isLocalFile():
            self.linkRefused.emit(f"The link {shown} was not opened: only http and https addresses open.")
            return
        if self.confirm_link(self, shown):
            QDesktopServices.openUrl(QUrl(address))
            self.linkOpened.emit(address)
