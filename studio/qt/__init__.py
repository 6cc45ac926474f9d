"""The Qt face of Quant Studio: main window, panels, item models and background workers.

Everything here shows or is shown; computation lives in ``studio.core`` and runs in workers
(``studio.qt.jobs``). Panels never import each other: they talk through ``studio.qt.state.StudioState``.
"""
