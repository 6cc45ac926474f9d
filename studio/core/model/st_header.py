"""A strict, bounded reader of safetensors headers: the tensor inventory without touching the data.

It applies the checks the safetensors library makes (header length within the file and under
100 MB, a JSON object, known dtypes, shape x dtype equal to the byte range, ranges contiguous from 0
to the end of the file) and a few it leaves to callers (duplicate keys, non-integer shapes), so the
inventory can be trusted before any tensor is memory-mapped. Zero-size tensors may share an offset.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from studio.core import safejson
from studio.core.errors import CorruptFileError

MAX_HEADER_BYTES = 100_000_000  # the limit the safetensors library enforces
_U64_MAX = 2**64 - 1

# Bits per element of every safetensors dtype (sub-byte types pack along the last axis).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}


@dataclass(frozen=True)
class StEntry:
    """One tensor's header entry; ``begin``/``end`` are absolute byte offsets in the file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data."""
        return self.end - self.begin


@dataclass(frozen=True)
class StHeader:
    """A validated safetensors header."""

    path: Path
    metadata: dict[str, str]
    entries: tuple[StEntry, ...]
    data_start: int  # 8 + header length


def _bad(path: Path, what: str) -> CorruptFileError:
    return CorruptFileError(
        f"{path} is not a valid safetensors file: {what}.",
        hint="Re-download it or verify its checksum.",
    )


def _no_duplicates(path: Path):
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                raise _bad(path, f"its header names {k!r} twice")
            out[k] = v
        return out

    return hook


def _int(v: Any) -> bool:
    return type(v) is int  # json gives plain ints; bool is excluded


def read_header(path: Path | str) -> StHeader:
    """Read and validate the header of one ``.safetensors`` file; reads only the header bytes."""
    path = Path(path)
    try:
        size = os.stat(path).st_size
        with open(path, "rb") as f:
            if size < 8:
                raise _bad(path, f"it is only {size} bytes long")
            n = int.from_bytes(f.read(8), "little")
            if n > MAX_HEADER_BYTES:
                raise _bad(path, f"its header claims {n} bytes, over the 100 MB limit")
            if 8 + n > size:
                raise CorruptFileError(
                    f"{path} is incomplete: its header claims {n} bytes but the file has only {size}.",
                    hint="Re-download it or verify its checksum.",
                )
            raw = f.read(n)
    except OSError as err:
        raise CorruptFileError(f"Cannot read {path}: {err.strerror or err}.") from err
    if len(raw) != n:
        raise _bad(path, "the file shrank while it was being read")
    if not raw.startswith(b"{"):
        raise _bad(path, "its header does not start with '{'")
    try:
        text = raw.decode("utf-8")
        header = safejson.loads(text, "header", ValueError, object_pairs_hook=_no_duplicates(path))
    except CorruptFileError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise _bad(path, f"its header is not valid JSON ({type(err).__name__})") from err
    if not isinstance(header, dict):
        raise _bad(path, "its header is not a JSON object")

    metadata_raw = header.pop("__metadata__", None) or {}
    if not isinstance(metadata_raw, dict) or not all(isinstance(v, str) for v in metadata_raw.values()):
        raise _bad(path, "its __metadata__ is not a map of strings")

    data_len = size - 8 - n
    data_start = 8 + n
    entries: list[StEntry] = []
    for name, spec in header.items():
        if not isinstance(spec, dict):
            raise _bad(path, f"the entry for tensor {name!r} is not an object")
        dtype, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
        if dtype not in DTYPE_BITS:
            raise _bad(path, f"tensor {name!r} has unknown dtype {dtype!r}")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not (_int(offsets[0]) and _int(offsets[1]))
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise _bad(path, f"tensor {name!r} has invalid data_offsets {offsets!r}")
        if not isinstance(shape, list):
            raise _bad(path, f"tensor {name!r} has an invalid shape {shape!r}")
        # Python ints do not overflow, but readers in other languages do: refuse what a u64 cannot hold
        # (the library's ValidationOverflow), which also keeps the product cheap to compute.
        n_el = 1
        for d in shape:
            if not _int(d) or d < 0:
                raise _bad(path, f"tensor {name!r} has an invalid shape {shape!r}")
            n_el *= d
            if n_el > _U64_MAX or d > _U64_MAX:
                raise _bad(path, f"tensor {name!r} shape {shape} overflows a 64-bit element count")
        bits = n_el * DTYPE_BITS[dtype]
        if bits > _U64_MAX:
            raise _bad(path, f"tensor {name!r} shape {shape} x {dtype} overflows a 64-bit byte count")
        if bits % 8:
            raise _bad(path, f"tensor {name!r} does not fill a whole number of bytes")
        if bits // 8 != offsets[1] - offsets[0]:
            raise _bad(
                path,
                f"tensor {name!r} shape {shape} x {dtype} needs {bits // 8} bytes "
                f"but its data_offsets span {offsets[1] - offsets[0]}",
            )
        entries.append(StEntry(name, dtype, tuple(shape), data_start + offsets[0], data_start + offsets[1]))

    # Ranges must tile [0, data_len) exactly: no overlap, no hole, nothing past the end.
    pos = data_start
    prev = "the header"
    for e in sorted(entries, key=lambda e: (e.begin, e.end)):
        begin, end = e.begin, e.end
        if begin < pos:
            raise _bad(path, f"tensor {e.name!r} overlaps {prev}")
        if begin > pos:
            if begin > size:
                raise _incomplete(path, begin - data_start, data_len)
            raise _bad(path, f"there is a hole of {begin - pos} bytes before tensor {e.name!r}")
        pos = end
        if end > begin:
            prev = f"tensor {e.name!r}"
    if pos != size:
        if pos > size:
            raise _incomplete(path, pos - data_start, data_len)
        raise _bad(path, f"{size - pos} bytes after the last tensor belong to no tensor")
    return StHeader(path, dict(metadata_raw), tuple(entries), data_start)


def _incomplete(path: Path, need: int, have: int) -> CorruptFileError:
    return CorruptFileError(
        f"{path} is incomplete: its header describes {need} bytes of tensor data "
        f"but only {have} are in the file.",
        hint="Re-download it or verify its checksum.",
    )
