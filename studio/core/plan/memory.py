"""The one memory model: what llama.cpp allocates besides the weights, the KV cache and the overhead.

The estimates (``plan.estimate``), the budget planner's ``vram=`` budgets (``plan.allocate``), the
Plan page and the Lab's memory calculator (``lab.memory``) all count with these two functions; they
differ only in what they know of the model (a config with sliding-window layers, or a bare shape).
"""

from __future__ import annotations

from collections.abc import Iterable

from studio.core.llamacpp.kvcache import kv_type

__all__ = ["OVERHEAD_BATCH_TOKENS", "OVERHEAD_FIXED_BYTES", "OVERHEAD_FRACTION", "kv_bytes", "overhead_bytes"]

OVERHEAD_FRACTION = 0.05
OVERHEAD_FIXED_BYTES = 64 * 1024**2
OVERHEAD_BATCH_TOKENS = 512


def kv_bytes(cells: Iterable[int], kv_heads: int, head_dim: int, kv: str = "f16") -> int:
    """Bytes of a KV cache with ``cells`` cells in each layer: a K and a V vector of ``kv_heads`` ×
    ``head_dim`` values per cell, stored in llama.cpp's cache type ``kv`` (f32, f16, q8_0, q4_0)."""
    t = kv_type(kv)
    return sum(cells) * 2 * kv_heads * head_dim * t.block_bytes // t.block_size


def overhead_bytes(weights: int, vocab: int) -> int:
    """Compute buffers and scratch: 5 % of the weights + 64 MiB + the float32 logits of a 512-token
    batch (``vocab`` × 512 × 4 bytes; give ``vocab`` 0 for a model without a language-model head)."""
    return int(OVERHEAD_FRACTION * weights) + OVERHEAD_FIXED_BYTES + vocab * OVERHEAD_BATCH_TOKENS * 4
