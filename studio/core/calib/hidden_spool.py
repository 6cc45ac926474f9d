"""The hidden states of every calibration chunk, kept on disk while the layer runner walks the layers.

A layer-wise run holds the states that enter a layer and those that leave it, for every chunk: at 8B
widths and 128 chunks of 512 tokens that is 2 × 1.07 GB in RAM. When they are large the runner keeps them
here instead: one unlinked temporary file per set (nothing is left behind when the process is killed),
written chunk by chunk as a layer produces them and read back one chunk at a time, so RAM holds one
chunk. The operating system's page cache keeps what fits, so a machine with room loses little time.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np

from studio.core.errors import CalibrationError
from studio.core.plan.job_estimate import SPOOL_ABOVE, spool_states

__all__ = ["SPOOL_ABOVE", "HiddenSpool", "spool_states"]


class HiddenSpool:
    """A list-like set of per-chunk float32 tensors (all of one shape) in an unlinked temporary file:
    ``append`` writes one, ``[c]`` reads one back as a fresh tensor."""

    def __init__(self, folder: str | os.PathLike[str] | None = None) -> None:
        self._folder = folder
        self._file: Any = None
        self._shape: tuple[int, ...] | None = None
        self._nbytes = 0
        self._n = 0

    def _open(self) -> int:
        if self._file is None:
            try:
                self._file = tempfile.TemporaryFile(dir=self._folder, prefix="quant-studio-hidden-")
            except OSError as e:
                where = self._folder or tempfile.gettempdir()
                raise CalibrationError(
                    f"Could not make a file for the hidden states in {where}: {e.strerror}."
                ) from None
        return self._file.fileno()

    def append(self, t: Any) -> None:
        """Write one chunk's states (a float32 torch tensor) after the last."""
        arr = np.ascontiguousarray(t.detach().to("cpu").numpy(), dtype=np.float32)
        if self._shape is None:
            self._shape, self._nbytes = tuple(arr.shape), int(arr.nbytes)
        elif tuple(arr.shape) != self._shape:
            raise CalibrationError(f"Hidden states of shape {tuple(arr.shape)} do not match {self._shape}.")
        fd = self._open()
        view = memoryview(arr).cast("B")
        off, done = self._n * self._nbytes, 0
        try:
            while done < len(view):
                done += os.pwrite(fd, view[done:], off + done)
        except OSError as e:
            where = self._folder or tempfile.gettempdir()
            need = self._nbytes * (self._n + 1) / 1e9
            raise CalibrationError(
                f"No room for the spooled hidden states ({need:.1f} GB) in {where}: {e.strerror}."
            ) from None
        self._n += 1

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, c: int) -> Any:
        import torch

        if c < 0:
            c += self._n
        if not 0 <= c < self._n or self._shape is None or self._file is None:
            raise IndexError(c)
        buf = np.empty(self._shape, dtype=np.float32)
        view = memoryview(buf).cast("B")
        off, done = c * self._nbytes, 0
        while done < self._nbytes:
            got = os.preadv(self._file.fileno(), [view[done:]], off + done)
            if got <= 0:
                raise CalibrationError("The spooled hidden states were cut short.")
            done += got
        return torch.from_numpy(buf)

    def __iter__(self) -> Iterator[Any]:
        return (self[c] for c in range(self._n))

    def close(self) -> None:
        """Give the file's space back (it has no name, so closing deletes it)."""
        if self._file is not None:
            self._file.close()
            self._file = None
