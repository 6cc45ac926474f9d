"""The quant type of a GGUF file: from its name (remote listings) or its header (local files).

A file's quant type is the name of its file type, ``general.file_type``: a preset such as
``Q4_K_M`` (or a qtype such as ``F16``, which names the preset of that qtype alone).

The header reader is deliberately tiny and bounded: it walks the key/value section only until
``general.file_type``, checks every length against the bytes left in the file, and gives up (None)
on anything odd, because a hostile GGUF must not make a badge allocate or loop without end.
"""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path

from studio.core.quant.types import ftype_name

# Longest names first so "Q4_K_M" wins over "Q4_K" and "IQ2_XXS" over "IQ2_XS".
_QUANT_NAMES = (
    "IQ2_XXS IQ3_XXS IQ1_S IQ1_M IQ2_XS IQ2_S IQ2_M IQ3_XS IQ3_S IQ3_M IQ4_XS IQ4_NL "
    "Q2_K_S Q2_K_L Q3_K_XL Q3_K_S Q3_K_M Q3_K_L Q4_K_XL Q4_K_S Q4_K_M Q4_K_L Q5_K_XL Q5_K_S Q5_K_M Q5_K_L "
    "Q6_K_XL Q6_K_L Q8_K_XL Q4_0_4_4 Q4_0_4_8 Q4_0_8_8 Q2_K Q3_K Q4_K Q5_K Q6_K Q8_K Q4_0 Q4_1 Q5_0 Q5_1 "
    "Q8_0 Q8_1 TQ1_0 TQ2_0 Q1_0 Q2_0 MXFP4 BF16 F16 F32 FP16 FP32"
).split()
_QUANT_RE = re.compile(
    r"(?<![A-Za-z0-9])(" + "|".join(sorted(_QUANT_NAMES, key=len, reverse=True)) + r")(?![A-Za-z0-9])",
    re.IGNORECASE,
)

# Sizes of the fixed-size GGUF value types (u8 i8 u16 i16 u32 i32 f32 bool _ _ u64 i64 f64).
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_MAX_KEY = 1 << 16


def quant_type_from_name(filename: str) -> str | None:
    """The quant type written in a GGUF file name (``model-Q4_K_M.gguf`` -> ``Q4_K_M``), or None."""
    base = os.path.basename(filename)
    if base.lower().endswith(".gguf"):
        base = base[:-5]
    matches = _QUANT_RE.findall(base)
    if not matches:
        return None
    name = matches[-1].upper()  # the last one: "llama-3-8b-f16-Q4_K_M" is Q4_K_M
    return {"FP16": "F16", "FP32": "F32"}.get(name, name)


def file_type_name(file_type: int) -> str | None:
    """The name of a ``general.file_type`` value (e.g. 15 -> ``Q4_K_M``), as the type registry gives it."""
    return ftype_name(file_type)


class _Bounded:
    def __init__(self, f, size: int) -> None:  # noqa: ANN001
        self.f, self.size = f, size

    def take(self, n: int) -> bytes:
        if n < 0 or self.f.tell() + n > self.size:
            raise ValueError("out of bounds")
        data = self.f.read(n)
        if len(data) != n:
            raise ValueError("short read")
        return data

    def skip(self, n: int) -> None:
        if n < 0 or self.f.tell() + n > self.size:
            raise ValueError("out of bounds")
        self.f.seek(n, os.SEEK_CUR)

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]


def _skip_value(r: _Bounded, vtype: int) -> None:
    if vtype in _FIXED:
        r.skip(_FIXED[vtype])
    elif vtype == _STRING:
        r.skip(r.u64())
    elif vtype == _ARRAY:
        etype, count = r.u32(), r.u64()
        if etype in _FIXED:
            if count > r.size:  # cheap guard before the multiplication
                raise ValueError("array too long")
            r.skip(count * _FIXED[etype])
        elif etype == _STRING:
            if count * 8 > r.size:
                raise ValueError("array too long")
            for _ in range(count):
                r.skip(r.u64())
        else:
            raise ValueError("nested or unknown array type")
    else:
        raise ValueError("unknown value type")


def quant_type_from_header(path: str | os.PathLike[str]) -> str | None:
    """The quant type recorded in a local GGUF's ``general.file_type``, or None (bounded; never raises)."""
    p = Path(path)
    try:
        size = p.stat().st_size
        with open(p, "rb") as f:
            r = _Bounded(f, size)
            if r.take(4) != b"GGUF":
                return None
            version = r.u32()
            if version not in (2, 3):
                return None
            r.u64()  # n_tensors: not needed here
            n_kv = r.u64()
            if n_kv > size // 13:  # smallest possible key/value is 13 bytes
                return None
            for _ in range(n_kv):
                klen = r.u64()
                if klen > _MAX_KEY:
                    return None
                key = r.take(klen)
                vtype = r.u32()
                if key == b"general.file_type" and vtype in (4, 5):
                    return file_type_name(struct.unpack("<I" if vtype == 4 else "<i", r.take(4))[0])
                _skip_value(r, vtype)
    except (OSError, ValueError, struct.error):
        return None
    return None


def quant_type(path_or_name: str | os.PathLike[str]) -> str | None:
    """The quant type of a GGUF: from the header when the file exists locally, else from its name."""
    p = Path(path_or_name)
    if p.is_file():
        found = quant_type_from_header(p)
        if found:
            return found
    return quant_type_from_name(p.name)
