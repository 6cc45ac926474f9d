"""ggml's tensor types by number, name and block geometry, including those gguf-py does not name yet.

gguf-py from PyPI (0.19, its newest) lags the pinned llama.cpp: it has no ``Q2_0`` (ggml type 42,
``LLAMA_FTYPE_MOSTLY_Q2_0`` 41). ``NEWER_THAN_GGUF_PY`` carries those types' facts, copied from the
pinned tree's headers (ggml.h's ``enum ggml_type``, ggml-common.h's block structs, llama.h's
``llama_ftype``), so that the type registry (``quant.types``), the GGUF writer and the bounded reader
(``gguf``) know them whatever gguf-py is installed; a gguf-py that names a type is always read first.
tests/core/test_ggml_types.py holds these facts to the pinned ggml library and to the pinned tree's
own gguf-py. This module sits below both ``quant`` and ``gguf``, which may not import each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

import gguf

__all__ = ["NEWER_THAN_GGUF_PY", "NewerType", "ggml_type_id", "ggml_types"]


class NewerType(NamedTuple):
    """A ggml type of the pinned llama.cpp that gguf-py from PyPI may not name yet."""

    type_id: int  # ggml.h's enum ggml_type
    block_size: int  # ggml-common.h's QKx_y: weights per block
    type_size: int  # sizeof(block_...): bytes per block
    ftype: int  # llama.h's LLAMA_FTYPE_MOSTLY_<name>


NEWER_THAN_GGUF_PY: Mapping[str, NewerType] = MappingProxyType(
    {"Q2_0": NewerType(type_id=42, block_size=64, type_size=2 + 64 // 4, ftype=41)}
)
"""The pinned llama.cpp's types that gguf 0.19 lacks, by ggml's name."""


def ggml_types() -> dict[int, tuple[str, int, int]]:
    """ggml type id -> (name, weights per block, bytes per block): gguf-py's table, then the newer types."""
    out = {int(q): (q.name, int(b), int(s)) for q, (b, s) in gguf.GGML_QUANT_SIZES.items()}
    for name, t in NEWER_THAN_GGUF_PY.items():
        out.setdefault(t.type_id, (name, t.block_size, t.type_size))
    return out


def ggml_type_id(name: str) -> int:
    """ggml's number of the type ``name`` (``"Q4_K"`` -> 12, ``"Q2_0"`` -> 42); KeyError if unknown."""
    member = gguf.GGMLQuantizationType.__members__.get(name)
    if member is not None:
        return int(member)
    return NEWER_THAN_GGUF_PY[name].type_id
