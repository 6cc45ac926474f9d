"""Columns share the cores without oversubscription: threads per running column, set in torch and llama.cpp.

Two models generating at once on two cores used to run torch with 2 threads in the window's process
and llama.cpp with 1–2 in its child: 3–4 busy threads on 2 cores, and the original fell from
8.5 to 1.1–1.4 tokens/s (issue 26). ``share`` gives every running column an equal whole share of
the cores (at least one thread); ``apply`` tells each back end (``set_threads``), and ``describe`` is
the line the chat shows in each column's header. torch's thread count is process-wide, so every
transformers column gets the same share (that is why the share is equal for all columns), and it is
global torch state, which the core never touches: ``torch_threads`` tells the face that owns the
process (the Chat page, ``quant-studio-cli chat``) what to pass to ``torch.set_num_threads`` before
its columns run (threads started afterwards take it; the calling thread is set at once).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def cpu_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells, else all of them)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class ThreadShare:
    """How many threads each of ``columns`` running columns gets on ``cores`` cores."""

    cores: int
    columns: int
    threads: int  # per column, in torch and in llama.cpp alike

    @property
    def oversubscribed(self) -> bool:
        """More columns than cores: each still needs one thread."""
        return self.columns * self.threads > self.cores

    def describe(self) -> str:
        """``1 thread of 2 cores (2 models share them)`` for a column header."""
        t = f"{self.threads} thread{'s' if self.threads != 1 else ''}"
        c = f"{self.cores} core{'s' if self.cores != 1 else ''}"
        if self.columns <= 1:
            return f"{t} of {c}"
        if self.oversubscribed:
            return f"{t} of {c} ({self.columns} models, more than the cores)"
        return f"{t} of {c} ({self.columns} models share them)"


def share(columns: int, cores: int | None = None) -> ThreadShare:
    """An equal whole share of the cores for each of ``columns`` columns (at least one thread each)."""
    n_cores = cpu_cores() if cores is None else max(1, int(cores))
    n_cols = max(1, int(columns))
    return ThreadShare(n_cores, n_cols, max(1, n_cores // n_cols))


def torch_threads(backends: Sequence[Any]) -> int | None:
    """The share torch should run with (``torch.set_num_threads``) for these columns; None without a
    transformers column on the CPU (then torch is left as it is)."""
    shares = [
        getattr(b, "n_threads", None)
        for b in backends
        if getattr(b, "kind", "") == "transformers" and getattr(b, "device", "cpu") in ("", "cpu")
    ]
    shares = [s for s in shares if s]
    return min(shares) if shares else None


def apply(backends: Sequence[Any], cores: int | None = None) -> ThreadShare:
    """Give every back end its share (``set_threads``); back ends without it are left alone."""
    s = share(len(backends), cores)
    for b in backends:
        setter = getattr(b, "set_threads", None)
        if setter is not None:
            setter(s.threads)
    return s
