"""Hugging Face → GGUF: architecture mapping, tokenizer, metadata and the atomic streaming writer."""

from studio.core.gguf.arch import Layout, TensorMap, Transform, gguf_arch, layout
from studio.core.gguf.writer import AtomicGGUFWriter, partial_path, remove_stale_partials, stale_partials

__all__ = [
    "AtomicGGUFWriter",
    "Layout",
    "TensorMap",
    "Transform",
    "gguf_arch",
    "layout",
    "partial_path",
    "remove_stale_partials",
    "stale_partials",
]
