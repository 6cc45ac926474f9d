"""numba's ``njit`` that degrades gracefully: one place for every compiled kernel of the core."""

from __future__ import annotations

try:  # numba is a declared dependency; without it the torch implementation on CPU is used instead.
    from numba import njit as _numba_njit

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised only on broken installs
    HAVE_NUMBA = False
    _numba_njit = None


def njit(**options):
    """``numba.njit(**options)``, compiling without the disk cache when no cache folder is writable.

    With ``cache=True`` numba refuses to decorate at all ("no locator available") when neither the
    package's ``__pycache__``, ``NUMBA_CACHE_DIR`` nor the user cache can be written (a read-only
    system-wide install): that must cost compile time on each start, never the import.
    """

    def wrap(fn):
        if _numba_njit is None:  # pragma: no cover - broken installs run plain Python
            return fn
        try:
            return _numba_njit(**options)(fn)
        except RuntimeError as err:
            if not options.get("cache") or "cannot cache" not in str(err):
                raise
            return _numba_njit(**{**options, "cache": False})(fn)

    return wrap


__all__ = ["HAVE_NUMBA", "njit"]
