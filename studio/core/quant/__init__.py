"""Quantizers: GGUF block formats byte-identical to llama.cpp, and generic INT/FP8 quantizers for analysis.

The public names of ``studio.core.quant.blocks`` are re-exported lazily, so importing a sibling
module (plans, presets) does not pay for numba's import.
"""

from __future__ import annotations

from typing import Any

__all__ = ["QTYPES", "QTypeInfo", "dequantize", "fallback_type", "qtype_info", "quantize", "row_bytes"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from studio.core.quant import blocks

        return getattr(blocks, name)
    raise AttributeError(f"module 'studio.core.quant' has no attribute {name!r}")
