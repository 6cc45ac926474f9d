"""A model starts loading when its column is added, and its load time is kept apart from the reply's.

``load_timed`` loads a back end once however many threads ask at the same time (the column's own
loading job and a Send that came early both wait for the one load), and records how long it took on
the back end as ``load_seconds``, so the chat shows "loaded in 2.1 s" beside a first-token time that
no longer hides the load (issue 26).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from studio.core.jobs import JobContext

_locks: dict[int, tuple[Any, threading.Lock]] = {}  # id(backend) → (backend, its lock)
_guard = threading.Lock()


def _lock_of(backend: Any) -> threading.Lock:
    # keyed by identity (back ends need be neither hashable nor weak-referenceable); the entry keeps
    # the back end so its id cannot be reused, and ``forget`` drops it when the column closes
    with _guard:
        entry = _locks.get(id(backend))
        if entry is None or entry[0] is not backend:
            entry = _locks[id(backend)] = (backend, threading.Lock())
        return entry[1]


def forget(backend: Any) -> None:
    """Drop the back end's lock (call when it is closed for good)."""
    with _guard:
        entry = _locks.get(id(backend))
        if entry is not None and entry[0] is backend:
            del _locks[id(backend)]


def load_seconds(backend: Any) -> float | None:
    """How long the back end's last load took (None before it loaded)."""
    return getattr(backend, "load_seconds", None)


def load_timed(backend: Any, ctx: JobContext | None = None) -> float:
    """Load ``backend`` unless loaded (waiting for a load another thread runs); returns its load seconds."""
    with _lock_of(backend):
        if backend.loaded:
            return float(load_seconds(backend) or 0.0)
        t0 = time.monotonic()
        backend.load(ctx)
        seconds = time.monotonic() - t0
        with contextlib.suppress(AttributeError):  # a back end with __slots__ just does not keep it
            backend.load_seconds = seconds
        return seconds
