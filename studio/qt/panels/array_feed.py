"""A feed of numpy arrays from a worker thread to the GUI thread, always as read-only snapshots."""

from __future__ import annotations

from typing import Any

import numpy as np
from PySide6.QtCore import QObject, Signal


class ArrayFeed(QObject):
    """``publish(arr)`` from any thread emits ``arrays`` with a read-only copy of ``arr``."""

    arrays = Signal(object)

    def publish(self, arr: Any) -> None:
        """Emit a read-only snapshot of ``arr``."""
        snap = np.array(arr, copy=True)
        snap.flags.writeable = False
        self.arrays.emit(snap)


def make_array_feed(parent: Any = None) -> Any:
    """An ``ArrayFeed``: ``publish(arr)`` from any thread emits ``arrays`` with a read-only copy
    (tests/qt/panels/test_threads.py::test_emitted_arrays_are_snapshots_under_1khz_mutation).

    A worker that keeps writing into its buffer can never tear what the GUI is drawing, because the
    GUI only ever receives a snapshot that nobody else holds.
    """
    return ArrayFeed(parent)
