"""A tensor a GGUF original already stores in its planned type is copied, not rounded again.

A calibrated export of a GGUF original (GPTQ, AWQ, the imatrix method, a budget plan) runs on the float32
Hugging Face folder made from it (``studio.core.model.gguf_source``). llama-quantize copies a tensor whose
planned type is its stored type (``quantize = tensor->type != new_type``), so its file keeps those tensors
exactly. Rounding their dequantized values again onto the same type's grid, which no search recovers
exactly, adds a whole rounding error there: on the Q4_K_M-born bench model a Q3_K_M plan keeps about a
third of its weights at Q4_K/Q6_K, their stored types.

``stored_source`` finds the GGUF a folder was made from (its marker file) and ``StoredSource.copy_of`` gives
a tensor's stored bytes when its stored type is the planned one and its stored values dequantize to exactly
the values about to be written. A method that changed the values (AWQ's scales, a rotation, GPTQ's error
feedback from an earlier tensor does not reach another tensor's weights) therefore never gets a copy.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.gguf.read import GGUFTensor, read_gguf
from studio.core.paths import SOURCE_MARKER

_FLOAT = frozenset({"F32", "F16", "BF16", "F64"})


@dataclass(frozen=True)
class StoredSource:
    """The quantized tensors of the GGUF file a converted folder was made from, by GGUF tensor name."""

    path: Path
    tensors: Mapping[str, GGUFTensor]

    def candidate(self, gguf_name: str, qtype: str, shape: tuple[int, ...]) -> GGUFTensor | None:
        """The stored tensor ``gguf_name`` when it is quantized as ``qtype`` with numpy ``shape``, else None."""
        t = self.tensors.get(gguf_name)
        if t is None or t.type_name != qtype or qtype in _FLOAT or tuple(t.shape) != tuple(shape):
            return None
        return t

    def raw_rows(self, t: GGUFTensor) -> np.ndarray:
        """The stored bytes of ``t`` as rows × row bytes (rows in the file's order)."""
        rows = int(np.prod(t.shape[:-1])) if len(t.shape) > 1 else 1
        with open(self.path, "rb") as f:
            f.seek(t.offset)
            b = f.read(t.nbytes)
        if len(b) != t.nbytes:
            return np.zeros((0, 0), np.uint8)  # the file changed under us: no copy
        return np.frombuffer(b, dtype=np.uint8).reshape(rows, -1)

    def copy_of(
        self, gguf_name: str, qtype: str, shape: tuple[int, ...], values: Iterable[Any]
    ) -> np.ndarray | None:
        """The stored bytes (rows × row bytes, file order) of ``gguf_name`` when it is stored as ``qtype``
        and ``values`` (its float32 rows in the file's order, as consecutive blocks from row 0) are
        exactly what the stored bytes decode to; else None."""
        t = self.candidate(gguf_name, qtype, shape)
        if t is None:
            return None
        raw = self.raw_rows(t)
        if raw.shape[0] == 0:
            return None
        from studio.core.quant.blocks import dequantize

        n = int(t.shape[-1])
        row = 0
        for block in values:
            b = np.asarray(block, dtype=np.float32).reshape(-1, n)
            end = row + b.shape[0]
            if end > raw.shape[0]:
                return None
            if not np.array_equal(dequantize(raw[row:end], qtype, (b.shape[0], n)), b):
                return None
            row = end
        return raw if row == raw.shape[0] else None


def stored_source(folder: str | os.PathLike[str]) -> StoredSource | None:
    """The GGUF a folder was converted from (``write_hf_folder``'s marker), when it is still there at the
    size recorded; None for any other folder."""
    marker = Path(folder) / SOURCE_MARKER
    if not marker.is_file():
        return None
    try:
        info = json.loads(marker.read_text(encoding="utf-8"))  # noqa: TID251 - the marker is written by write_hf_folder into the studio's own cache
        src = Path(str(info["source"]))
        if src.stat().st_size != int(info["source_bytes"]):
            return None
        g = read_gguf(src)  # bounded: counts and offsets checked against the file
    except Exception:  # noqa: BLE001 - a moved, changed or unreadable source: no copies, every tensor rounded
        return None
    return StoredSource(src, {t.name: t for t in g.tensors if t.type_name not in _FLOAT})


def copied_note(n: int, source: StoredSource) -> str:
    """The export's note on the ``n`` tensors it copied from ``source``."""
    return (
        f"{n} tensor(s) already stored in their planned type in {source.path.name} were copied from it "
        "unchanged (as llama-quantize does), not rounded again."
    )


__all__ = ["StoredSource", "copied_note", "stored_source"]
