"""What the quantizer benchmarks share: best-of-N timing, peak RSS and the accelerator to time on.

Imported as ``_common`` by the scripts in this folder (run as ``python bench/NAME.py``, so this
folder is first on ``sys.path``); the scripts also put the repository root on ``sys.path``.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable
from typing import Any


def best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """(fastest wall time in seconds over ``repeat`` calls, the last call's result)."""
    fastest, res = float("inf"), None
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        res = fn()
        fastest = min(fastest, time.perf_counter() - t0)
    return fastest, res


def peak_mib(who: int = resource.RUSAGE_SELF) -> float:
    """Peak resident memory of this process (or ``RUSAGE_CHILDREN``) in MiB."""
    rss = resource.getrusage(who).ru_maxrss
    return rss / (1 << 20) if sys.platform == "darwin" else rss / 1024  # bytes on macOS, KiB on Linux


def accelerator() -> Any:
    """The CUDA or MPS torch device, or None (no torch, or only a CPU)."""
    try:
        import torch
    except ImportError:
        return None
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps")
    return None


def synced(fn: Callable[[], Any], device: Any) -> Callable[[], Any]:
    """``fn`` followed by waiting for ``device``'s queued kernels, so a timer sees the whole run."""

    def run() -> Any:
        res = fn()
        kind = getattr(device, "type", device)
        if kind in ("cuda", "mps"):
            import torch

            (torch.cuda if kind == "cuda" else torch.mps).synchronize()
        return res

    return run
