"""What a model folder made from a GGUF file inherits: its weights already lie on that file's grid (the
demo is SmolLM2 dequantized from a Q4_1 file), so exporting back to that type, or to one whose grid holds
it, loses almost nothing. The Summary page says so, and the budget dialog leaves those types out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from studio.core.paths import SOURCE_MARKER

__all__ = ["inherited_types", "origin_text"]

# A Q4_1 block (min + d·q, q < 16) is also a Q5_1 block (scale d/2, q' = 2q < 32); the same for Q4_0/Q5_0.
_COUSINS = {"Q4_1": ("Q5_1",), "Q4_0": ("Q5_0",)}


def _source(info: Any) -> tuple[str, str] | None:
    """(the GGUF's main quantized type, its file name) for a folder made from a GGUF, else None."""
    try:
        marker = json.loads((Path(info.path) / SOURCE_MARKER).read_text(encoding="utf-8"))  # noqa: TID251 - the source marker is written by write_hf_folder into the studio's own cache folder
        types = dict(marker.get("types") or {})
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    quant = {str(q): n for q, n in types.items() if not str(q).upper().startswith(("F", "BF"))}
    if not quant:
        return None
    return max(quant, key=lambda q: quant[q]), Path(str(marker.get("source", ""))).name


def inherited_types(info: Any) -> tuple[str, ...]:
    """The qtypes whose error on this model is an artefact of its GGUF origin (empty for other models)."""
    src = _source(info)
    return () if src is None else (src[0], *_COUSINS.get(src[0], ()))


def origin_text(info: Any) -> str:
    """One paragraph on where the weights came from and what it means for those types, or ""."""
    src = _source(info)
    if src is None:
        return ""
    main, name = src
    same = " and ".join(inherited_types(info))
    return (
        f"The original here is dequantized from a {main} GGUF file ({name}): its weights already lie on "
        f"{main}'s grid. Exporting to {same} therefore reproduces them almost exactly, so their error and KL "
        "come out near 0; on a full-precision model they would cost what their bits suggest. The budget "
        f"plan leaves {same} out (Types not to choose)."
    )
