"""Regular expressions from untrusted places (plan files, typed overrides), matched under a time limit.

Python's ``re`` backtracks without bound: ``(.*.*.*.*)*Z$`` against one tensor name runs for
minutes in C code that nothing can interrupt. The ``regex`` package takes a ``timeout`` on every
match and optimises many such patterns away; each compiled pattern here also has a total time
budget across all its matches, and running out of either is one sentence naming the pattern.
"""

from __future__ import annotations

import time
from typing import Any

import regex

from studio.core.errors import StudioError, quote

__all__ = ["MATCH_BUDGET_S", "SafePattern", "compile_pattern"]

MATCH_BUDGET_S = 2.0  # all matches of one pattern together (a plan matches ~2 names per tensor)
MAX_PATTERN_CHARS = 4096


class SafePattern:
    """A compiled pattern whose ``search`` stops at the time budget with ``error``."""

    def __init__(self, pattern: str, error: type[StudioError], budget_s: float = MATCH_BUDGET_S) -> None:
        self.pattern = pattern
        self._error = error
        self._left = budget_s
        if len(pattern) > MAX_PATTERN_CHARS:
            raise error(
                f"The override pattern {quote(pattern)} is longer than {MAX_PATTERN_CHARS} characters."
            )
        try:
            self._rx = regex.compile(pattern)
        except (regex.error, ValueError, OverflowError, RecursionError) as err:
            raise error(
                f"Override pattern {quote(pattern)} is not a valid regex ({quote(str(err), 100)})."
            ) from None

    def search(self, text: str) -> Any:
        """``regex.search`` of ``text``, or the error once this pattern's matches ran over their budget."""
        if self._left <= 0:
            raise self._slow()
        t0 = time.monotonic()
        try:
            return self._rx.search(text, timeout=self._left)
        except TimeoutError:
            self._left = 0.0
            raise self._slow() from None
        finally:
            self._left -= time.monotonic() - t0

    def _slow(self) -> StudioError:
        return self._error(
            f"The override pattern {quote(self.pattern)} takes too long to match tensor names "
            "(it backtracks without bound); write it without nested repetition such as (.*)*."
        )


def compile_pattern(pattern: str, error: type[StudioError], budget_s: float = MATCH_BUDGET_S) -> SafePattern:
    """``pattern`` compiled for matching under a time limit; ``error`` (one sentence) if it is invalid."""
    return SafePattern(str(pattern), error, budget_s)
