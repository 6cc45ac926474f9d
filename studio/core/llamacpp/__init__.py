"""llama.cpp (through llama-cpp-python) run in a child process.

``LlamaRunner`` is the one way to load a GGUF (it decides extra buffers and restarts a crashed first
decode once without them); ``LlamaWorker`` is the bare child it drives; ``LoadOptions`` says how.

The names below are re-exported lazily, so that reading the load options (the window does at its
start) does not import the runner, the child's side and what they need (numpy, gguf-py).
"""

from __future__ import annotations

import importlib
from typing import Any

_HOME = {
    "EXTRA_BUFFERS_ENV": "options",
    "EXTRA_BUFFER_CHOICES": "options",
    "ExtraBuffers": "options",
    "ExtraBuffersDecision": "runner",
    "LlamaRunner": "runner",
    "LlamaWorker": "worker",
    "LoadOptions": "options",
    "parse_extra_buffers": "options",
    "resolve_extra_buffers": "runner",
}
__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(f"studio.core.llamacpp.{_HOME[name]}"), name)
    raise AttributeError(f"module 'studio.core.llamacpp' has no attribute {name!r}")
