"""The window's "llama.cpp extra buffers" setting (Auto / On / Off), kept in ``AppSettings``.

The choice reaches every llama.cpp load of the app (chat columns, evaluation, the export dialog's
verification child) through ``EXTRA_BUFFERS_ENV``, which ``studio.core.llamacpp`` reads when a load
asks for ``auto``; so no panel needs its own wiring.
"""

from __future__ import annotations

import os

from PySide6.QtGui import QAction, QActionGroup
from PySide6.QtWidgets import QMenu, QWidget

from studio.core.llamacpp.options import EXTRA_BUFFERS_ENV, ExtraBuffers, parse_extra_buffers
from studio.qt.settings import AppSettings

LABELS = {
    ExtraBuffers.AUTO: "&Auto (off on CPUs with AMX or after a crash)",
    ExtraBuffers.ON: "&On",
    ExtraBuffers.OFF: "O&ff",
}


def stored_choice(settings: AppSettings) -> ExtraBuffers:
    """The saved choice (auto when unset or unreadable: ``AppSettings`` decodes to the allowed words)."""
    return parse_extra_buffers(settings.llama_extra_buffers)


def apply_choice(choice: ExtraBuffers) -> None:
    """Make this process and the children it starts load llama.cpp as ``choice`` says."""
    if choice is ExtraBuffers.AUTO:
        os.environ.pop(EXTRA_BUFFERS_ENV, None)
    else:
        os.environ[EXTRA_BUFFERS_ENV] = choice.value


class ExtraBuffersMenu(QMenu):
    """A submenu with one checkable action per choice; picking one saves and applies it."""

    def __init__(self, settings: AppSettings, parent: QWidget | None = None) -> None:
        super().__init__("llama.cpp e&xtra buffers", parent)
        self.setToolTipsVisible(True)
        self.setToolTip(
            "Whether llama.cpp repacks weights into its extra buffer types (AMX, interleaved rows)"
        )
        self._settings = settings
        self.group = QActionGroup(self)
        self.group.setExclusive(True)
        self.actions_by_choice: dict[ExtraBuffers, QAction] = {}
        current = stored_choice(settings)
        for choice, label in LABELS.items():
            act = QAction(label, self, checkable=True)
            act.setData(choice.value)
            act.setChecked(choice is current)
            act.triggered.connect(lambda _=False, c=choice: self.set_choice(c))
            self.group.addAction(act)
            self.addAction(act)
            self.actions_by_choice[choice] = act
        if current is not ExtraBuffers.AUTO:
            apply_choice(
                current
            )  # an unset (auto) choice leaves a QUANT_STUDIO_LLAMA_EXTRA_BUFFERS of the user alone

    def choice(self) -> ExtraBuffers:
        """The checked choice."""
        act = self.group.checkedAction()
        return ExtraBuffers(act.data()) if act is not None else ExtraBuffers.AUTO

    def set_choice(self, choice: ExtraBuffers | str) -> None:
        """Check, save and apply ``choice``."""
        choice = parse_extra_buffers(choice)
        self.actions_by_choice[choice].setChecked(True)
        self._settings.llama_extra_buffers = choice.value
        apply_choice(choice)


def install_extra_buffers_menu(menu: QMenu, settings: AppSettings, parent: QWidget) -> ExtraBuffersMenu:
    """Add the setting as a submenu of ``menu``; returns it."""
    sub = ExtraBuffersMenu(settings, parent)
    menu.addSeparator()
    menu.addMenu(sub)
    return sub
