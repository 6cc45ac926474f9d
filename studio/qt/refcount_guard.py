"""A guard against PySide6 6.12's lost references to None, True and False on Python 3.11.

PySide6 6.12.0 (the only release the package index offers here) returns ``None`` from every void
method (``setText``, ``QTimer.start``, ``processEvents`` …) and ``True``/``False`` from some bool
ones without taking a reference, so on Python 3.11, where these singletons are still reference
counted, each call drops one: after a few tens of thousands of calls (a long chat stream, a progress
bar, a test session) the interpreter aborts with "deallocating None". Python 3.12 made them immortal
(PEP 683), so there the guard does nothing. The singletons are never freed anyway, so giving them
2**48 extra references changes nothing else (a count of 2**48 cannot be walked down by calls).
"""

from __future__ import annotations

import ctypes
import sys

EXTRA = 1 << 48  # far more calls than any session makes, far from ssize_t's 2**63
_protected = False


def protect_singletons() -> bool:
    """Give None, True and False enough extra references to outlive the lost ones; True if it did."""
    global _protected
    if sys.version_info >= (3, 12) or _protected:
        return False
    for obj in (None, True, False):
        # ob_refcnt is the first field of every CPython object (Include/object.h, PyObject_HEAD)
        ctypes.c_ssize_t.from_address(id(obj)).value += EXTRA
    _protected = True
    return True
