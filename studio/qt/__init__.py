"""The Qt face of Quant Studio: main window, panels, item models and background workers.

Everything here shows or is shown; computation lives in ``studio.core`` and runs in workers
(``studio.qt.jobs``). Panels never import each other: they talk through ``studio.qt.state.StudioState``.
"""

from studio.qt.refcount_guard import protect_singletons

protect_singletons()  # before the first PySide6 call: see refcount_guard for the PySide6 6.12 bug
