"""ggml's ``ggml_validate_row_data`` in numpy: no NaN or Inf in a tensor's GGUF bytes.

llama-quantize validates every quantized chunk and stops ("quantized data validation failed")
rather than write a file llama.cpp would compute NaN from. The writer runs this on every chunk it
writes, before the final rename: F32/F16/BF16 values, and the fp16 scales (``d``, and ``dmin``/``m``
where the block has one) at their offsets in each block, as ggml-quants.c checks them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["BLOCK_SCALES", "RowCheck", "first_bad_block"]

# qtype -> (block bytes, byte offsets of fp16 scales in the block); ggml-common.h's block layouts
BLOCK_SCALES: dict[str, tuple[int, tuple[int, ...]]] = {
    "Q4_0": (18, (0,)),
    "Q4_1": (20, (0, 2)),
    "Q5_0": (22, (0,)),
    "Q5_1": (24, (0, 2)),
    "Q8_0": (34, (0,)),
    "Q2_K": (84, (80, 82)),
    "Q3_K": (110, (108,)),
    "Q4_K": (144, (0, 2)),
    "Q5_K": (176, (0, 2)),
    "Q6_K": (210, (208,)),
    "IQ2_XXS": (66, (0,)),
    "IQ2_XS": (74, (0,)),
    "IQ2_S": (82, (0,)),
    "IQ3_XXS": (98, (0,)),
    "IQ3_S": (110, (0,)),
    "IQ1_S": (50, (0,)),
    "IQ4_NL": (18, (0,)),
    "IQ4_XS": (136, (0,)),
    "TQ1_0": (54, (52,)),
    "TQ2_0": (66, (64,)),
    "Q1_0": (18, (0,)),
    "Q2_0": (18, (0,)),
}
_IQ1_M_BYTES = 56  # its fp16 scale is spread over the top nibbles of scales[0..3] (bytes 48..55)


def _bad_f16_bits(bits: np.ndarray) -> np.ndarray:
    return (bits & 0x7C00) == 0x7C00


def first_bad_block(qtype: str, data: np.ndarray) -> int | None:
    """Index of the first block (or value, for float types) holding NaN/Inf, else None.

    ``data`` is the chunk as written: a float array for F32/F16, raw bytes (uint8) for block types.
    Types without fp16 scales, and unknown ones, pass.
    """
    if data.size == 0:
        return None
    if data.dtype.kind == "f":
        bad = ~np.isfinite(data.reshape(-1))
    elif qtype == "BF16":
        bits = np.ascontiguousarray(data).reshape(-1).view(np.uint16)
        bad = (bits & 0x7F80) == 0x7F80
    elif qtype in ("F16", "F32"):
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        vals = raw.view(np.float16 if qtype == "F16" else np.float32)
        bad = ~np.isfinite(vals)
    elif qtype in BLOCK_SCALES or qtype == "IQ1_M":
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        size, offsets = BLOCK_SCALES.get(qtype, (_IQ1_M_BYTES, ()))
        if raw.size % size:
            return 0
        blocks = raw.reshape(-1, size)
        if qtype == "IQ1_M":
            sc = np.ascontiguousarray(blocks[:, 48:56]).view("<u2").astype(np.uint16)
            bits = (
                (sc[:, 0] >> 12)
                | ((sc[:, 1] >> 8) & 0x00F0)
                | ((sc[:, 2] >> 4) & 0x0F00)
                | (sc[:, 3] & 0xF000)
            )
            bad = _bad_f16_bits(bits)
        else:
            bad = np.zeros(blocks.shape[0], dtype=bool)
            for off in offsets:
                bits = np.ascontiguousarray(blocks[:, off : off + 2]).view("<u2").reshape(-1)
                bad |= _bad_f16_bits(bits)
    else:
        return None
    hits = np.flatnonzero(bad)
    return int(hits[0]) if hits.size else None


@dataclass
class RowCheck:
    """Checks one tensor's chunks in order; ``feed`` returns the first bad block's index in the tensor.

    Raw byte chunks need not end on a block boundary (a copied tensor is streamed in fixed-size pieces):
    the bytes of a block cut by a chunk's end are kept and checked with the next chunk.
    """

    qtype: str
    seen: int = 0
    carry: bytes = b""

    def _unit(self) -> int:
        if self.qtype in ("F16", "BF16"):
            return 2
        if self.qtype == "F32":
            return 4
        return BLOCK_SCALES.get(self.qtype, (_IQ1_M_BYTES, ()))[0]

    def feed(self, chunk: np.ndarray) -> int | None:
        """The tensor-wide index of the first NaN/Inf block in ``chunk``, else None."""
        arr = np.asarray(chunk)
        if arr.dtype.kind == "f":  # values, never cut
            bad = first_bad_block(self.qtype, arr)
            n = arr.size
        else:
            unit = self._unit()
            raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
            if self.carry:
                raw = np.concatenate([np.frombuffer(self.carry, np.uint8), raw])
            whole = raw.size - raw.size % unit
            self.carry = raw[whole:].tobytes()
            raw = raw[:whole]
            bad = first_bad_block(self.qtype, raw)
            n = whole // unit
        at = None if bad is None else self.seen + bad
        self.seen += n
        return at
