"""llama.cpp (through llama-cpp-python) run in a child process.

``LlamaRunner`` is the one way to load a GGUF (it decides extra buffers and restarts a crashed first
decode once without them); ``LlamaWorker`` is the bare child it drives; ``LoadOptions`` says how.
"""

from studio.core.llamacpp.options import (
    EXTRA_BUFFER_CHOICES,
    EXTRA_BUFFERS_ENV,
    ExtraBuffers,
    LoadOptions,
    parse_extra_buffers,
)
from studio.core.llamacpp.runner import ExtraBuffersDecision, LlamaRunner, resolve_extra_buffers
from studio.core.llamacpp.worker import LlamaWorker

__all__ = [
    "EXTRA_BUFFERS_ENV",
    "EXTRA_BUFFER_CHOICES",
    "ExtraBuffers",
    "ExtraBuffersDecision",
    "LlamaRunner",
    "LlamaWorker",
    "LoadOptions",
    "parse_extra_buffers",
    "resolve_extra_buffers",
]
