"""Compile the block kernels in a child process, so that a window's own process only loads them.

numba holds the GIL for hundreds of milliseconds at a time while it compiles a kernel (measured: a
thread compiling five K/I-quant kernels stalled a 10 ms sleep loop in another thread up to 584 ms, 15
times over 100 ms; a pure-Python loop of the same length, 37 ms at most). The budget dialog's scan
measures 23 types, so on a fresh install its first run froze the window for most of a second at a time.
``ensure_compiled`` compiles every kernel in a spawned child instead; numba's on-disk cache (``cache=True``,
the package's ``__pycache__`` or numba's user cache) then serves this process. A marker file in the
studio's cache folder, keyed by the kernels' sources and the numba and Python versions, spares the
child on later starts.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.atomic import write_atomic
from studio.core.childjob import call_in_child
from studio.core.errors import StudioError
from studio.core.jit import HAVE_NUMBA
from studio.core.jobs import JobContext
from studio.core.paths import user_cache_dir
from studio.core.quant import blocks
from studio.core.quant.types import QTYPES

log = logging.getLogger(__name__)

__all__ = ["call_named", "ensure_compiled", "kernels_key", "marker_path", "warm_kernels"]

ROW = 256  # one super-block: a whole row for every block size
# the modules holding the block kernels (their sources key numba's cache, and so the marker)
KERNEL_MODULES = ("numba_ops", "legacy", "kquants", "iquants", "iquants_grids", "lowbit", "blocks")

# One compile per process, as numba's own compiler lock is: the start-up job and a scan started before
# it ends share it (the second waits, its GIL released, rather than compile the same kernels again).
_lock = threading.Lock()
_done: list[bool] = []


def _readonly(a: np.ndarray) -> np.ndarray:
    b = a.copy()
    b.flags.writeable = False
    return b


def warm_kernels(ctx: JobContext | None = None) -> int:
    """Quantize and decode one tiny row in every GGUF type, with and without an importance matrix,
    so that numba compiles (or loads) every block kernel for the array types real calls use. Returns
    how many calls ran.

    numba compiles once per argument type, and a read-only array is another type: the scan's importance
    matrix is read-only (a cached file's buffer), as may be weights read from a file, so both kinds run."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, ROW)).astype(np.float32)
    qw = rng.random(ROW).astype(np.float32) + 0.5
    names = list(QTYPES)
    runs = 0
    for i, name in enumerate(names):
        if ctx is not None:
            ctx.check_cancelled()
            ctx.report(i, len(names), f"Compiling the {name} kernels")
        for rows in (x, _readonly(x)):
            for imatrix in (None, qw, _readonly(qw)):
                if imatrix is None and QTYPES[name].needs_imatrix:
                    continue
                try:
                    data = blocks.quantize(rows, name, imatrix=imatrix, threads=1)
                    blocks.dequantize(data, name, x.shape)
                    blocks.dequantize(_readonly(data), name, x.shape)  # a GGUF file's tensor
                except StudioError:  # a type these kernels do not write: nothing to compile
                    continue
                runs += 1
    return runs


def kernels_key(also: tuple[str, ...] = ()) -> str:
    """A digest of what numba's cache of the kernels depends on: their sources, numba and Python."""
    import numba  # the version keys the cache

    here = Path(__file__).resolve().parent
    h = hashlib.sha256(f"{sys.version}|{numba.__version__}|{here}|{','.join(also)}".encode())
    for mod in KERNEL_MODULES:
        st = (here / f"{mod}.py").stat()
        h.update(f"|{mod}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def marker_path(also: tuple[str, ...] = ()) -> Path:
    """The file that says the kernels of this install were compiled into numba's cache."""
    return user_cache_dir() / "kernels" / f"compiled-{kernels_key(also)}"


def call_named(name: str) -> Any:
    """Call ``"package.module:function"`` with no arguments (a kernel module's own ``prepare_kernels``)."""
    module, _, func = name.partition(":")
    return getattr(importlib.import_module(module), func)()


def _child(ctx: JobContext, _emit: Callable[[Any], None], also: tuple[str, ...] = ()) -> int:
    runs = warm_kernels(ctx)
    for name in also:
        ctx.check_cancelled()
        call_named(name)
        runs += 1
    return runs


def ensure_compiled(ctx: JobContext | None = None, also: tuple[str, ...] = ()) -> bool:
    """Compile every block kernel into numba's on-disk cache in a child process, once per install
    (the marker) and per process; True when the cache is known good. ``also``: more kernels' set-up
    functions (``"module:function"``, e.g. the calibration's reductions, above this layer) the child
    calls too. Waits while another thread of this process does it. Never raises for a failed
    compile: the kernels then compile on first use."""
    if not HAVE_NUMBA:
        return False
    with _lock:
        if _done:
            return True
        try:
            marker = marker_path(also)
            if not marker.is_file():
                runs = call_in_child(_child, {"also": tuple(also)}, what="kernel compile", ctx=ctx)
                marker.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(marker, f"{runs} kernel calls compiled\n")
        except StudioError as err:  # cancelled, or the child failed: the first use compiles instead
            log.warning("compiling the quantization kernels in a child failed: %s", err)
            return False
        except OSError as err:  # no cache folder: the child's compile is still in numba's cache
            log.warning("could not record the compiled kernels: %s", err)
        _done.append(True)
        return True
