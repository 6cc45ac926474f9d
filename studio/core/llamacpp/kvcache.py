"""KV-cache precision: the types llama.cpp can keep its K and V cache in, and how to ask for them.

llama.cpp stores each layer's K and V cache rows in ``type_k`` / ``type_v`` (llama-cpp-python's
``Llama(type_k=..., type_v=...)``, ggml type ids). A quantized V cache only works with flash
attention (llama.cpp refuses the context otherwise), so ``llama_kwargs`` switches it on exactly
when the cache is quantized; F16 and F32 keep llama.cpp's ordinary attention path.
"""

from __future__ import annotations

from dataclasses import dataclass

from studio.core.errors import StudioError
from studio.core.quant.types import qtype_info

__all__ = ["KV_TYPES", "KVType", "kv_type", "llama_kwargs"]

KV_TYPES: tuple[str, ...] = ("f32", "f16", "q8_0", "q4_0")
"""KV-cache types offered, most precise first (f32 is the studio's exact-comparison default)."""


@dataclass(frozen=True)
class KVType:
    """One KV-cache element type: its ggml id and its storage (values per block, bytes per block)."""

    name: str
    ggml_type: int
    block_size: int
    block_bytes: int

    @property
    def bytes_per_element(self) -> float:
        """Bytes one cached value takes: 4, 2, 34/32 or 18/32."""
        return self.block_bytes / self.block_size

    @property
    def quantized(self) -> bool:
        """Whether the type is a block format (needs flash attention for V)."""
        return self.block_size > 1


def kv_type(name: str) -> KVType:
    """The KV type called ``name`` (``f16``, ``q8_0``, ...); a StudioError for any other name."""
    key = str(name).strip().lower()
    if key not in KV_TYPES:
        raise StudioError(f"Unknown KV-cache type {name!r}; choose one of {', '.join(KV_TYPES)}.")

    # kept local: gguf-py and numpy (~0.3 s), which the CLI's --help and the window's start do not need

    info = qtype_info(key.upper())
    return KVType(key, int(info.ggml_type), info.block_size, info.type_size)


def llama_kwargs(name: str) -> dict[str, object]:
    """``Llama(...)`` keyword arguments for a KV cache of type ``name``."""
    t = kv_type(name)
    return {"type_k": t.ggml_type, "type_v": t.ggml_type, "flash_attn": t.quantized}
