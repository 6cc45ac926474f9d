"""A bounded, thread-safe cache of per-tensor results keyed by file, tensor name and file modification time.

A changed file (new mtime or size) never serves old statistics. Two workers asking for the same key
at once compute it once: the second waits for the first.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from studio.core.jobs import JobContext
from studio.core.modelinfo import TensorInfo

__all__ = ["CacheKey", "StatsCache", "cache_key", "checkpoint_key"]

DEFAULT_MAX_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class CacheKey:
    """Identity of one cached result: the file's path, size and mtime, the tensor, and the computation."""

    file: str
    name: str
    mtime_ns: int
    size: int
    variant: str = ""


def cache_key(info: TensorInfo, variant: str = "") -> CacheKey:
    """The key of ``info``'s tensor as its file is now on disk (a missing file gets mtime 0)."""
    try:
        st = os.stat(info.file)
        mtime, size = st.st_mtime_ns, st.st_size
    except OSError:
        mtime, size = 0, 0
    return CacheKey(str(info.file), info.name, mtime, size, variant)


def checkpoint_key(info: Any, variant: str) -> CacheKey:
    """The key of a whole-model result (a calibration run): the model folder, and the newest mtime and
    total size of its weight files, so that any changed shard invalidates it."""
    mtime, size = 0, 0
    for f in {t.file for t in info.tensors}:
        try:
            st = os.stat(f)
        except OSError:
            continue
        mtime, size = max(mtime, st.st_mtime_ns), size + st.st_size
    return CacheKey(str(info.path), "<checkpoint>", mtime, size, variant)


def _size_of(value: Any) -> int:
    n = getattr(value, "nbytes", None)
    return int(n) if isinstance(n, int) else 1024


class StatsCache:
    """Least-recently-used results up to ``max_bytes`` (measured by each value's ``nbytes``)."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = int(max_bytes)
        self._lock = threading.Lock()
        self._items: OrderedDict[CacheKey, tuple[Any, int]] = OrderedDict()
        self._pending: dict[CacheKey, threading.Event] = {}
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._items

    @property
    def nbytes(self) -> int:
        """Bytes held now."""
        with self._lock:
            return self._bytes

    def get(self, key: CacheKey) -> Any | None:
        """The cached value for ``key``, or None."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def put(self, key: CacheKey, value: Any) -> None:
        """Store ``value`` (a value larger than the whole budget is not kept)."""
        size = _size_of(value)
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if size > self.max_bytes:
                return
            self._items[key] = (value, size)
            self._bytes += size
            while self._bytes > self.max_bytes and self._items:
                _, (_, s) = self._items.popitem(last=False)
                self._bytes -= s

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def get_or_compute(self, key: CacheKey, compute: Callable[[], Any], ctx: JobContext | None = None) -> Any:
        """The cached value, or ``compute()`` stored under ``key``; concurrent callers of one key compute once.

        A caller waiting for another's computation still notices cancellation through ``ctx``.
        """
        while True:
            with self._lock:
                item = self._items.get(key)
                if item is not None:
                    self._items.move_to_end(key)
                    self.hits += 1
                    return item[0]
                event = self._pending.get(key)
                if event is None:
                    event = self._pending[key] = threading.Event()
                    self.misses += 1
                    break
            # Someone else computes this key: wait, then look again (it may have failed or been evicted).
            while not event.wait(0.05):
                if ctx is not None:
                    ctx.check_cancelled()
        try:
            value = compute()
            self.put(key, value)
            return value
        finally:
            with self._lock:
                self._pending.pop(key, None)
            event.set()
