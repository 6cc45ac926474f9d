"""Columns share the cores without oversubscription: threads per running column, set in torch and llama.cpp.

Two models generating at once on two cores used to run torch with 2 threads in the window's process
and llama.cpp with 1–2 in its child: 3–4 busy threads on 2 cores, and the original fell from
8.5 to 1.1–1.4 tokens/s (issue 26). ``share`` gives every running column an equal whole share of
the cores that are free (at least one thread): the cores this process may use, less what other
programs keep busy (the 1-minute load average), because a spinning thread pool whose threads wait
for a busy core ran a model 20 times slower than one thread did (``bench/chat_latency.py`` at load
20 on 2 cores). ``apply`` tells each back end (``set_threads``), and ``describe`` is the line the
chat shows in each column's header. The chat's transformers column runs in its own process
(``hf_process``) and sets torch's threads there. torch's thread count is process-wide, so a
transformers back end in the caller's process is global torch state, which the core never touches:
``torch_threads`` tells the face that owns the process (the Chat page, ``quant-studio-cli chat``)
what to pass to ``torch.set_num_threads`` before such columns run (threads started afterwards take
it; the calling thread is set at once).
"""

from __future__ import annotations

import os
import time
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
    busy: float = 0.0  # cores other programs kept busy (load average) when the share was made

    @property
    def oversubscribed(self) -> bool:
        """More columns than cores: each still needs one thread."""
        return self.columns * self.threads > self.cores

    @property
    def limited_by_load(self) -> bool:
        """Fewer threads than the cores alone would give, because other programs keep cores busy."""
        return self.threads < max(1, self.cores // self.columns)

    def describe(self) -> str:
        """``1 thread of 2 cores (2 models share them)`` for a column header."""
        t = f"{self.threads} thread{'s' if self.threads != 1 else ''}"
        c = f"{self.cores} core{'s' if self.cores != 1 else ''}"
        models = f"{self.columns} models" if self.columns > 1 else ""
        if self.oversubscribed:
            why = f"{models}, more than the cores"
        elif self.limited_by_load:
            why = f"{models + '; ' if models else ''}other programs keep {self.busy:.1f} cores busy"
        else:
            why = f"{models} share them" if models else ""
        return f"{t} of {c} ({why})" if why else f"{t} of {c}"


LOAD_SAMPLES = 5  # reads of the runnable count, the least kept: a passing process is not a busy core
LOAD_SAMPLE_GAP_S = 0.002


def busy_cores(loadavg: str = "/proc/loadavg", samples: int = LOAD_SAMPLES) -> float:
    """Cores other programs keep busy: the 1-minute load average, but no more than the threads that
    are runnable now besides the caller (Linux), so the studio's own work of the last minute (a
    model it just loaded) does not count against it; 0 where the OS tells nothing.

    "Now" is the least of up to ``samples`` reads 2 ms apart (one read when nothing else runs): a
    single read counted whatever happened to run at that instant (a shell, a short-lived helper)
    as a busy core, and one busy core took a whole thread from a single column on two cores.
    """
    try:
        avg = max(0.0, float(os.getloadavg()[0]))
    except (AttributeError, OSError):
        return 0.0
    running: int | None = None
    for i in range(max(1, samples)):
        if i:
            time.sleep(LOAD_SAMPLE_GAP_S)
        try:
            with open(loadavg, encoding="ascii") as f:
                now = int(f.read().split()[3].split("/")[0]) - 1  # "R/T": R counts the reader too
        except (OSError, ValueError, IndexError):
            break
        running = now if running is None else min(running, now)
        if running <= 0:
            break
    if running is None:
        return avg
    return max(0.0, min(avg, float(running)))


def share(columns: int, cores: int | None = None, busy: float | None = None) -> ThreadShare:
    """An equal whole share of the free cores for each of ``columns`` columns (at least one thread each).

    ``busy`` (default: the load average now) is subtracted from the cores first; call this before
    the columns start generating, so the load is the others'.
    """
    n_cores = cpu_cores() if cores is None else max(1, int(cores))
    n_cols = max(1, int(columns))
    load = busy_cores() if busy is None else max(0.0, float(busy))
    free = max(0.0, n_cores - load)
    per = max(1, min(n_cores // n_cols, int(free // n_cols)))
    return ThreadShare(n_cores, n_cols, per, round(load, 2))


def torch_threads(backends: Sequence[Any]) -> int | None:
    """The share this process's torch should run with (``torch.set_num_threads``) for these columns;
    None without a transformers column on the CPU in this process (then torch is left as it is)."""
    shares = [
        getattr(b, "n_threads", None)
        for b in backends
        if getattr(b, "kind", "") == "transformers"
        and getattr(b, "device", "cpu") in ("", "cpu")
        and not getattr(b, "own_process", False)  # a column in its own process sets its own torch
    ]
    shares = [s for s in shares if s]
    return min(shares) if shares else None


def apply(backends: Sequence[Any], cores: int | None = None, busy: float | None = None) -> ThreadShare:
    """Give every back end its share (``set_threads``); back ends without it are left alone."""
    s = share(len(backends), cores, busy)
    for b in backends:
        setter = getattr(b, "set_threads", None)
        if setter is not None:
            setter(s.threads)
    return s
