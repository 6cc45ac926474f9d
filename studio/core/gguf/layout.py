"""Which mapping lays out a checkpoint's tensors in GGUF: a GGUF original keeps its own names, the
studio's families take its own mapping (``arch``), every other architecture llama.cpp's converter's
(``llama_converter``)."""

from __future__ import annotations

from studio.core.errors import ExportError
from studio.core.gguf import llama_converter
from studio.core.gguf.arch import Layout, gguf_layout, studio_converts, studio_layout
from studio.core.modelinfo import ModelInfo

__all__ = ["export_route", "layout"]


def layout(info: ModelInfo) -> Layout:
    """Map every tensor of ``info`` to its GGUF name, shape and transform: a GGUF original keeps its
    own names; the studio's own mapping covers its families, llama.cpp's converter every other
    architecture; ExportError (one sentence naming the architecture) when neither converts it. Kept with
    ``info`` (``ModelInfo.derived``): the same object is laid out once."""
    memo = getattr(info, "derived", None)
    if memo is not None and "layout" in memo:
        return memo["layout"]
    if getattr(info.format, "value", info.format) == "gguf":  # a GGUF original keeps its own names
        out = gguf_layout(info)
    elif not studio_converts(info):
        out = llama_converter.converter_layout(info)
    else:
        out = studio_layout(info)
    if memo is not None:
        memo["layout"] = out
    return out


def export_route(info: ModelInfo) -> tuple[str | None, str | None]:
    """Who converts ``info`` to GGUF: ("studio", None), ("llama.cpp", None) for llama.cpp's
    converter, or (None, the one sentence saying why neither can). A GGUF original is the studio's
    (requantized with its own names)."""
    try:
        return layout(info).source, None
    except ExportError as err:
        return None, err.message
