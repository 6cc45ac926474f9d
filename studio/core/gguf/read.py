"""A bounded GGUF header reader: metadata and tensor infos, with every count checked against the file.

gguf-py's GGUFReader and llama.cpp trust the counts a file declares (a 44-byte file can claim 2^64
tensors), so this reader runs first. Every count, string length and array length is compared with the
bytes left in the file before anything is allocated; tensor infos are checked the way llama.cpp
checks them (at most 4 dims, no negative dim, no element-count overflow, a known type whose block
size divides the row, aligned offsets inside the file, unique names). Strings that are not UTF-8 are
decoded with replacement characters and reported as warnings instead of crashing.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.errors import CorruptFileError
from studio.core.ggml_types import ggml_types

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_NAME_BYTES = 63  # GGML_MAX_NAME is 64 including the terminating NUL
MAX_ARRAY_DEPTH = 3
_I64_MAX = 2**63 - 1

# GGUF metadata value types: id -> (name, struct format or None for variable size).
_UINT8, _INT8, _UINT16, _INT16, _UINT32, _INT32, _FLOAT32, _BOOL = range(8)
_STRING, _ARRAY, _UINT64, _INT64, _FLOAT64 = range(8, 13)
_SCALARS: dict[int, tuple[str, np.dtype]] = {
    _UINT8: ("<B", np.dtype("<u1")),
    _INT8: ("<b", np.dtype("<i1")),
    _UINT16: ("<H", np.dtype("<u2")),
    _INT16: ("<h", np.dtype("<i2")),
    _UINT32: ("<I", np.dtype("<u4")),
    _INT32: ("<i", np.dtype("<i4")),
    _FLOAT32: ("<f", np.dtype("<f4")),
    _BOOL: ("<?", np.dtype("?")),
    _UINT64: ("<Q", np.dtype("<u8")),
    _INT64: ("<q", np.dtype("<i8")),
    _FLOAT64: ("<d", np.dtype("<f8")),
}
# Smallest encoding of one value of each kind, used to bound counts before reading them.
_MIN_STRING = 8  # the u64 length
_MIN_ARRAY = 12  # u32 element type + u64 count
_MIN_KV = 8 + 4 + 1  # key length + value type + smallest value
_MIN_TENSOR_INFO = 8 + 4 + 4 + 8  # name length + n_dims + type + offset


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor info. ``ne`` is ggml's order (fastest-varying first); ``shape`` is numpy's."""

    name: str
    ne: tuple[int, ...]
    type_id: int
    type_name: str
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """The numpy shape (``ne`` reversed)."""
        return tuple(reversed(self.ne))

    @property
    def n_elements(self) -> int:
        """Number of elements."""
        n = 1
        for d in self.ne:
            n *= d
        return n


@dataclass(frozen=True)
class GGUFFile:
    """A validated GGUF header."""

    path: Path
    version: int
    alignment: int
    metadata: dict[str, Any]  # strings as str, numeric arrays as numpy arrays, string arrays as lists
    tensors: tuple[GGUFTensor, ...]
    data_start: int
    file_size: int
    warnings: tuple[str, ...] = field(default=())
    # key -> (GGUF value type, element type of an array or None): what a faithful copy must write
    value_types: dict[str, tuple[int, int | None]] = field(default_factory=dict)


def _ggml_types() -> dict[int, tuple[str, int, int]]:
    """ggml type id -> (name, block size, bytes per block), from gguf-py's tables and the types of the
    pinned llama.cpp that gguf-py cannot name yet (Q2_0)."""
    return ggml_types()


class _Cursor:
    """Reads little-endian values from a buffer, refusing to run past its end."""

    def __init__(self, buf: Any, size: int, path: Path) -> None:
        self.buf = buf
        self.size = size
        self.pos = 0
        self.path = path
        self.warnings: list[str] = []
        self.last_etype: int | None = None  # element type of the last top-level array read

    @property
    def remaining(self) -> int:
        return self.size - self.pos

    def bad(self, what: str) -> CorruptFileError:
        return CorruptFileError(
            f"{self.path} is not a valid GGUF file: {what}.",
            hint="Re-download it or convert it again.",
        )

    def need(self, n: int, what: str) -> None:
        if n > self.remaining:
            raise CorruptFileError(
                f"{self.path} is incomplete or corrupt: {what} needs {n} bytes "
                f"but only {self.remaining} remain in the file.",
                hint="Re-download it or convert it again.",
            )

    def scalar(self, fmt: str, what: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v

    def u32(self, what: str) -> int:
        return self.scalar("<I", what)

    def u64(self, what: str) -> int:
        return self.scalar("<Q", what)

    def string(self, what: str) -> str:
        n = self.u64(f"the length of {what}")
        self.need(n, what)
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.warnings.append(f"{what} is not valid UTF-8; shown with replacement characters")
            return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int, what: str, depth: int = 0) -> Any:
        if vtype in _SCALARS:
            v = self.scalar(_SCALARS[vtype][0], what)
            return bool(v) if vtype == _BOOL else v
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            if depth >= MAX_ARRAY_DEPTH:
                raise self.bad(f"{what} nests arrays deeper than {MAX_ARRAY_DEPTH} levels")
            etype = self.u32(f"the element type of {what}")
            if depth == 0:
                self.last_etype = etype
            count = self.u64(f"the length of {what}")
            if etype in _SCALARS:
                dt = _SCALARS[etype][1]
                self.need(count * dt.itemsize, f"array {what} of {count} elements")
                arr = np.frombuffer(self.buf, dtype=dt, count=count, offset=self.pos).copy()
                self.pos += count * dt.itemsize
                return arr
            min_size = {_STRING: _MIN_STRING, _ARRAY: _MIN_ARRAY}.get(etype)
            if min_size is None:
                raise self.bad(f"{what} has unknown array element type {etype}")
            self.need(count * min_size, f"array {what} of {count} elements")
            return [self.value(etype, f"{what}[{i}]", depth + 1) for i in range(count)]
        raise self.bad(f"{what} has unknown value type {vtype}")


def read_gguf(path: Path | str) -> GGUFFile:
    """Read and validate a GGUF file's header, metadata and tensor infos (no tensor data)."""
    path = Path(path)
    try:
        size = os.stat(path).st_size
        if size == 0:
            raise CorruptFileError(f"{path} is empty (0 bytes), not a GGUF file.")
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return _parse(mm, size, path)
    except OSError as err:
        raise CorruptFileError(f"Cannot read {path}: {err.strerror or err}.") from err


def _parse(buf: Any, size: int, path: Path) -> GGUFFile:
    cur = _Cursor(buf, size, path)
    if size < 4 or bytes(buf[:4]) != GGUF_MAGIC:
        raise CorruptFileError(
            f"{path} is not a GGUF file: it does not start with the GGUF magic bytes.",
            hint="Choose a .gguf file written by llama.cpp or Quant Studio.",
        )
    cur.pos = 4
    version = cur.u32("the version")
    if version == 1:
        raise cur.bad("it uses GGUF version 1, which is no longer supported; convert the model again")
    if version not in SUPPORTED_VERSIONS:
        if struct.unpack(">I", struct.pack("<I", version))[0] in SUPPORTED_VERSIONS:
            raise cur.bad("it is a big-endian GGUF file, which is not supported")
        raise cur.bad(f"it declares GGUF version {version}; this reader supports versions 2 and 3")
    n_tensors = cur.u64("the tensor count")
    n_kv = cur.u64("the metadata count")
    # Bound both counts by what the rest of the file could hold before looping over them.
    if n_tensors * _MIN_TENSOR_INFO + n_kv * _MIN_KV > cur.remaining:
        raise cur.bad(
            f"it claims {n_tensors} tensors and {n_kv} metadata entries, more than its {size} bytes can hold"
        )

    metadata: dict[str, Any] = {}
    value_types: dict[str, tuple[int, int | None]] = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key #{i}")
        if key in metadata:
            raise cur.bad(f"metadata key {key!r} appears twice")
        vtype = cur.u32(f"the type of metadata {key!r}")
        cur.last_etype = None
        metadata[key] = cur.value(vtype, f"metadata {key!r}")
        value_types[key] = (vtype, cur.last_etype if vtype == _ARRAY else None)

    alignment = DEFAULT_ALIGNMENT
    if "general.alignment" in metadata:
        a = metadata["general.alignment"]
        if not isinstance(a, int) or isinstance(a, bool) or a <= 0 or a & (a - 1):
            raise cur.bad(f"general.alignment is {a!r}, not a positive power of two")
        alignment = a

    types = _ggml_types()
    infos: list[tuple[str, tuple[int, ...], int, int]] = []
    names: set[str] = set()
    for i in range(n_tensors):
        name = cur.string(f"the name of tensor #{i}")
        if len(name.encode("utf-8", errors="replace")) > MAX_NAME_BYTES:
            raise cur.bad(f"tensor #{i} has a name longer than {MAX_NAME_BYTES} bytes ({name[:80]!r}...)")
        if name in names:
            raise cur.bad(f"tensor {name!r} appears twice")
        names.add(name)
        n_dims = cur.u32(f"the dimension count of tensor {name!r}")
        if n_dims > MAX_DIMS:
            raise cur.bad(f"tensor {name!r} has {n_dims} dimensions; at most {MAX_DIMS} are allowed")
        ne = tuple(cur.u64(f"a dimension of tensor {name!r}") for _ in range(n_dims))
        n_el = 1
        for d in ne:
            if d > _I64_MAX:
                raise cur.bad(f"tensor {name!r} has a negative dimension ({d - 2**64})")
            n_el *= d
            if n_el > _I64_MAX:
                raise cur.bad(f"tensor {name!r} has shape {list(ne)} whose element count overflows")
        type_id = cur.u32(f"the type of tensor {name!r}")
        if type_id not in types:
            raise cur.bad(f"tensor {name!r} has unknown ggml type id {type_id}")
        offset = cur.u64(f"the offset of tensor {name!r}")
        infos.append((name, ne, type_id, offset))

    data_start = -(-cur.pos // alignment) * alignment
    tensors: list[GGUFTensor] = []
    for name, ne, type_id, offset in infos:
        type_name, block, type_size = types[type_id]
        row = ne[0] if ne else 1
        if row % block:
            raise cur.bad(
                f"tensor {name!r} has rows of {row} elements, not a multiple of {type_name}'s block of {block}"
            )
        n_el = 1
        for d in ne:
            n_el *= d
        nbytes = n_el // block * type_size
        if offset % alignment:
            raise cur.bad(f"tensor {name!r} has offset {offset}, not a multiple of the alignment {alignment}")
        if data_start + offset + nbytes > size:
            raise CorruptFileError(
                f"{path} is incomplete: the data of tensor {name!r} lies beyond the end of the file.",
                hint="Re-download it or convert it again.",
            )
        tensors.append(GGUFTensor(name, ne, type_id, type_name, data_start + offset, nbytes))

    end = 0
    prev = ""
    for t in sorted(tensors, key=lambda t: t.offset):
        if t.nbytes and t.offset < end:
            raise cur.bad(f"tensor {t.name!r} overlaps tensor {prev!r}")
        if t.nbytes:
            end, prev = t.offset + t.nbytes, t.name
    return GGUFFile(
        path=path,
        version=version,
        alignment=alignment,
        metadata=metadata,
        tensors=tuple(tensors),
        data_start=data_start,
        file_size=size,
        warnings=tuple(cur.warnings),
        value_types=value_types,
    )
