"""The original's logits of every evaluated chunk, kept until each variant is scored against them.

At Llama 3's vocabulary they are 17 chunks × 511 rows × 128,256 × 4 B = 4.5 GB for eval's default text. Above
``IN_MEMORY_LIMIT`` they go to a temporary file, written and read back with plain file I/O a chunk at a
time. A memory map of that file (what eval used before) counts every page written or read as the process's
resident memory until the kernel needs it back: on the 8B fixture eval peaked at 6.66 GB, the head
pass's float32 head beside 4.5 GB of mapped logits. Read into a buffer of its own (``readinto``), the pages
stay in the kernel's page cache, which it drops as it likes, and the process holds one chunk at a time.
"""

from __future__ import annotations

import errno
import io
import math
import os
import tempfile
from pathlib import Path

import numpy as np

from studio.core.errors import EvaluationError
from studio.core.units import format_bytes

IN_MEMORY_LIMIT = 256 << 20  # original logits above this size go to a temporary file


class LogitStore:
    """Chunk i's float32 logit rows (``rows`` × ``vocab``), set once and read any number of times."""

    def __init__(self, n_chunks: int, rows: int, vocab: int, limit: int | None = None) -> None:
        self.shape = (n_chunks, rows, vocab)
        self._chunk_bytes = rows * vocab * 4
        self._mem: np.ndarray | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._f: io.FileIO | None = None
        if math.prod(self.shape) * 4 <= (IN_MEMORY_LIMIT if limit is None else limit):
            self._mem = np.empty(self.shape, dtype=np.float32)
            return
        self._dir = tempfile.TemporaryDirectory(prefix="quant-studio-eval-")
        self._f = io.FileIO(os.path.join(self._dir.name, "base.f32"), "x+")

    @property
    def on_disk(self) -> bool:
        """Whether the logits are kept in a temporary file."""
        return self._mem is None

    def __len__(self) -> int:
        return self.shape[0]

    def __setitem__(self, ci: int, rows: np.ndarray) -> None:
        a = np.ascontiguousarray(rows, dtype=np.float32)
        if a.shape != self.shape[1:]:
            raise ValueError(f"chunk {ci} has logits of shape {a.shape}, not {self.shape[1:]}")
        if self._mem is not None:
            self._mem[ci] = a
            return
        assert self._f is not None and self._dir is not None
        view = memoryview(a).cast("B")
        try:
            self._f.seek(ci * self._chunk_bytes)
            while view:  # a raw write may take less than it is given
                n = self._f.write(view) or 0
                if n <= 0:
                    raise OSError(errno.ENOSPC, "no space left")
                view = view[n:]
        except OSError as err:
            raise EvaluationError(
                f"The original's logits ({format_bytes(math.prod(self.shape) * 4)}) do not fit in "
                f"{Path(self._dir.name).parent} ({err.strerror or err}): free some space there, or "
                f"evaluate fewer chunks (--chunks)."
            ) from None

    def __getitem__(self, ci: int) -> np.ndarray:
        if not 0 <= ci < self.shape[0]:
            raise IndexError(ci)
        if self._mem is not None:
            return self._mem[ci]
        assert self._f is not None
        out = np.empty(self.shape[1:], dtype=np.float32)
        view = memoryview(out).cast("B")
        self._f.seek(ci * self._chunk_bytes)
        while view:
            n = self._f.readinto(view) or 0
            if n <= 0:
                raise OSError(f"the evaluation's temporary logits file ended before chunk {ci}")
            view = view[n:]
        return out

    def close(self) -> None:
        """Drop the logits (and delete the temporary file)."""
        self._mem = None
        if self._f is not None:
            self._f.close()
            self._f = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None
