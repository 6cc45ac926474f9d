"""llama.cpp's own quantizer (the ggml library shipped in llama-cpp-python), reached through ctypes.

This is the reference our quantizers are checked against byte for byte, the baseline of the
benchmarks, and a possible back end for the export. ctypes releases the GIL during the foreign call
and ggml's quantizers are thread-safe, so callers may run chunks of rows in a thread pool.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import sys
import threading
from pathlib import Path

import gguf
import numpy as np

from studio.core.errors import QuantizationError
from studio.core.ggml_types import NEWER_THAN_GGUF_PY

__all__ = [
    "ReferenceUnavailable",
    "available",
    "ggml_dequantize",
    "ggml_quantize",
    "ggml_quantize_into",
    "ggml_row_size",
    "type_id",
]


class ReferenceUnavailable(QuantizationError):
    """The ggml library of llama-cpp-python cannot be found or lacks a needed symbol."""


class _TypeTraits(ctypes.Structure):
    # Mirrors ``struct ggml_type_traits`` in ggml.h (llama-cpp-python >= 0.3.x); only read, never written.
    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


_TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
_LOAD_LOCK = threading.Lock()


def _lib_dir() -> Path:
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise ReferenceUnavailable(
            "llama-cpp-python is not installed, so llama.cpp's quantizer is unavailable."
        )
    return Path(next(iter(spec.submodule_search_locations))) / "lib"


def _candidates(base: Path) -> list[Path]:
    # ggml_quantize_chunk lives in ggml-base; older wheels had a single libggml.
    names = ["ggml-base", "ggml"]
    if sys.platform == "win32":
        return [base / f"{p}{n}.dll" for n in names for p in ("", "lib")]
    exts = [".so", ".dylib"] if sys.platform == "darwin" else [".so"]
    return [base / f"lib{n}{e}" for n in names for e in exts]


@functools.lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    with _LOAD_LOCK:
        base = _lib_dir()
        errors: list[str] = []
        if sys.platform == "win32":
            os.add_dll_directory(str(base))
        for path in _candidates(base):
            if not path.exists():
                continue
            try:
                lib = ctypes.CDLL(str(path))
                fn = lib.ggml_quantize_chunk
            except (OSError, AttributeError) as exc:
                errors.append(f"{path.name}: {exc}")
                continue
            fn.argtypes = [
                ctypes.c_int,
                ctypes.c_void_p,
                ctypes.c_void_p,
                ctypes.c_int64,
                ctypes.c_int64,
                ctypes.c_int64,
                ctypes.c_void_p,
            ]
            fn.restype = ctypes.c_size_t
            lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
            lib.ggml_row_size.restype = ctypes.c_size_t
            lib.ggml_quantize_init.argtypes = [ctypes.c_int]
            lib.ggml_quantize_init.restype = None
            lib.ggml_quantize_requires_imatrix.argtypes = [ctypes.c_int]
            lib.ggml_quantize_requires_imatrix.restype = ctypes.c_bool
            lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
            lib.ggml_get_type_traits.restype = ctypes.POINTER(_TypeTraits)
            return lib
        detail = "; ".join(errors) if errors else f"no ggml library under {base}"
        raise ReferenceUnavailable(f"llama.cpp's ggml library could not be loaded ({detail}).")


def available() -> bool:
    """Whether the reference quantizer can be loaded."""
    try:
        _lib()
    except QuantizationError:
        return False
    return True


@functools.lru_cache(maxsize=64)
def type_id(qtype: str) -> int:
    """ggml's numeric type id for a type name such as ``"Q4_K"`` (as in gguf.GGMLQuantizationType)."""
    try:
        return int(gguf.GGMLQuantizationType[qtype.upper()])
    except KeyError:
        if qtype.upper() in NEWER_THAN_GGUF_PY:  # a ggml type gguf-py cannot name yet (Q2_0)
            return NEWER_THAN_GGUF_PY[qtype.upper()].type_id
        raise QuantizationError(f"Unknown GGML type {qtype!r}.") from None


def ggml_row_size(qtype: str, n_per_row: int) -> int:
    """Bytes one row of ``n_per_row`` values takes in ``qtype``, as ggml computes it."""
    return int(_lib().ggml_row_size(type_id(qtype), int(n_per_row)))


def _block_size(tid: int) -> int:
    return int(_lib().ggml_get_type_traits(tid).contents.blck_size)


def ggml_quantize(x: np.ndarray, qtype: str, imatrix: np.ndarray | None = None) -> np.ndarray:
    """Quantize a 2-D float32 array (rows, n_per_row) with llama.cpp; returns uint8 (rows, row bytes)."""
    return ggml_quantize_into(x, qtype, None, imatrix)


def ggml_quantize_into(
    x: np.ndarray, qtype: str, out: np.ndarray | None, imatrix: np.ndarray | None = None
) -> np.ndarray:
    """Like ``ggml_quantize`` but writes into ``out`` (C-contiguous uint8 (rows, row bytes)) when given."""
    lib = _lib()
    tid = type_id(qtype)
    a = np.ascontiguousarray(x, dtype=np.float32)
    if a.ndim == 1:
        a = a.reshape(1, -1)
    if a.ndim != 2:
        raise QuantizationError(f"Reference quantizer needs a 2-D array, got shape {tuple(x.shape)}.")
    nrows, n_per_row = a.shape
    blck = _block_size(tid)
    if n_per_row % blck:
        raise QuantizationError(
            f"Row length {n_per_row} of shape {tuple(a.shape)} is not a multiple of {qtype}'s block size {blck}."
        )
    qw = None
    if imatrix is not None:
        qw = np.ascontiguousarray(imatrix, dtype=np.float32).reshape(-1)
        if qw.size != n_per_row:
            raise QuantizationError(
                f"Importance matrix has {qw.size} values but rows have {n_per_row}; one per input column is needed."
            )
    elif lib.ggml_quantize_requires_imatrix(tid):
        raise QuantizationError(f"{qtype} needs an importance matrix in llama.cpp.")
    row_bytes = int(lib.ggml_row_size(tid, n_per_row))
    if out is None:
        out = np.empty((nrows, row_bytes), dtype=np.uint8)
    elif out.dtype != np.uint8 or out.shape != (nrows, row_bytes) or not out.flags.c_contiguous:
        raise QuantizationError(f"Output buffer must be C-contiguous uint8 of shape {(nrows, row_bytes)}.")
    if nrows == 0 or n_per_row == 0:
        return out
    written = lib.ggml_quantize_chunk(
        tid,
        a.ctypes.data,
        out.ctypes.data,
        0,
        nrows,
        n_per_row,
        None if qw is None else qw.ctypes.data,
    )
    if written != out.nbytes:
        raise QuantizationError(f"llama.cpp wrote {written} bytes for {qtype}, expected {out.nbytes}.")
    return out


def ggml_dequantize(data: np.ndarray, qtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Decode ``data`` (bytes of ``qtype``) back to float32 of ``shape`` with ggml's own ``to_float``."""
    lib = _lib()
    tid = type_id(qtype)
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    n = int(np.prod(shape, dtype=np.int64))
    if qtype.upper() == "F32":
        return raw.view(np.float32)[:n].reshape(shape).copy()
    traits = lib.ggml_get_type_traits(tid).contents
    if not traits.to_float:
        raise ReferenceUnavailable(f"ggml has no to_float for {qtype}.")
    n_per_row = int(shape[-1]) if len(shape) else 1
    need = ggml_row_size(qtype, n_per_row) * (n // max(n_per_row, 1))
    if raw.size < need:
        raise QuantizationError(f"{qtype} data has {raw.size} bytes, {need} needed for shape {tuple(shape)}.")
    out = np.empty(n, dtype=np.float32)
    if n:
        _TO_FLOAT(traits.to_float)(raw.ctypes.data, out.ctypes.data, n)
    return out.reshape(shape)
