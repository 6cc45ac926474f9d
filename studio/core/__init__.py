"""The GUI-free core of Quant Studio: model access, statistics, quantizers, export, evaluation, Hub.

Nothing under this package imports Qt; the GUI (studio.qt) and the CLI (studio.cli) are thin faces
over these functions.
"""
