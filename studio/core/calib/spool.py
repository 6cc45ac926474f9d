"""A spool of finished tensors: what a calibrated run chose, kept on disk until the export writes it.

A calibrated run decides each tensor's GGUF bytes (or, for a norm AWQ rescaled, its new float values)
layer by layer, long before the export streams the file in llama.cpp's tensor order; holding them in
memory would cost the whole quantized model. The spool appends each one to a single file next to the
output (``.NAME.spool-PID.partial``, under an advisory lock, so the stale-file cleaner recognises a
killed run's leftovers) and reads it back once. Data is stored as the GGUF file holds it (rows in GGUF
order, float values transformed), so the export copies it as is.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from studio.core.errors import ExportError
from studio.core.gguf.writer import PARTIAL_SUFFIX, clean_stale_partials

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


@dataclass(frozen=True)
class SpooledTensor:
    """Where one tensor sits in the spool."""

    name: str  # HF tensor name
    qtype: str  # GGUF type of the data (F32 for float values)
    offset: int
    shape: tuple[int, ...]
    dtype: str


class TensorSpool:
    """Append-only store of finished tensors, deleted on ``close`` (use as a context manager)."""

    def __init__(self, out: Path) -> None:
        out = Path(out)
        clean_stale_partials(out.parent)  # spools and partials of killed runs in this folder
        self.path = out.with_name(f".{out.stem}.spool-{os.getpid()}{PARTIAL_SUFFIX}")
        self._f = open(self.path, "w+b")  # noqa: SIM115 - closed in close()
        if fcntl is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._index: dict[str, SpooledTensor] = {}
        self.nbytes = 0

    def __enter__(self) -> TensorSpool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __len__(self) -> int:
        return len(self._index)

    def names(self) -> list[str]:
        """Names spooled so far, in order."""
        return list(self._index)

    def entry(self, name: str) -> SpooledTensor:
        """Where ``name`` sits (KeyError if absent)."""
        return self._index[name]

    def qtype_of(self, name: str) -> str:
        """The GGUF type of the data stored under ``name``."""
        return self._index[name].qtype

    def put(self, name: str, data: np.ndarray, qtype: str) -> None:
        """Store ``data`` (uint8 GGUF bytes of ``qtype``, or float32 values for F32) under ``name``."""
        a = np.ascontiguousarray(data)
        self._f.seek(0, os.SEEK_END)
        off = self._f.tell()
        try:
            self._f.write(a.tobytes())
        except OSError as err:
            raise ExportError(
                f"Keeping the quantized tensor {name} on disk failed: {err.strerror or err}."
            ) from err
        self._index[name] = SpooledTensor(name, qtype, off, tuple(a.shape), a.dtype.str)
        self.nbytes += a.nbytes

    def get(self, name: str) -> np.ndarray:
        """The data stored under ``name``."""
        e = self._index[name]
        count = int(np.prod(e.shape, dtype=np.int64))
        self._f.seek(e.offset)
        a = np.fromfile(self._f, dtype=np.dtype(e.dtype), count=count)
        if a.size != count:
            raise ExportError(f"The spooled tensor {name} is truncated in {self.path.name}.")
        return a.reshape(e.shape)

    def close(self) -> None:
        """Delete the spool file."""
        if self._f.closed:
            return
        self._f.close()
        with contextlib.suppress(OSError):
            self.path.unlink()


__all__ = ["SpooledTensor", "TensorSpool"]
