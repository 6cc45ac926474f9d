"""Small files (JSON, text, bookkeeping) written atomically: a reader sees the old file or the new one.

The bytes go to a temporary file next to the target (same file system, so the rename is atomic),
are fsynced, and the temporary file is renamed over the target; on any error it is removed and the
target is untouched. Large streamed outputs (GGUF files, models) have their own writers.
"""

from __future__ import annotations

import contextlib
import os
import threading

__all__ = ["write_atomic"]


def write_atomic(path: str | os.PathLike[str], data: str | bytes, *, temp_suffix: str = ".partial") -> None:
    """Replace ``path`` with ``data`` (text is written as UTF-8); OSError when it cannot be written.

    The temporary name is unique per process and thread (``NAME.<pid>.<thread><temp_suffix>``), so
    concurrent writers never share one; the folder must exist. ``path`` may be a Windows long path
    (``\\\\?\\`` prefix): the temporary name is built on the string.
    """
    target = os.fspath(path)
    tmp = f"{target}.{os.getpid()}.{threading.get_ident()}{temp_suffix}"
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        with open(tmp, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
