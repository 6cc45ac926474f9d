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

__all__ = ["MATCH_BUDGET_S", "SafePattern", "check_limits", "compile_pattern"]

MATCH_BUDGET_S = 2.0  # all matches of one pattern together (a plan matches ~2 names per tensor)
MAX_PATTERN_CHARS = 4096
MAX_REPEAT = 1000  # one {n,m} count; the regex package unrolls counted repeats when it compiles
MAX_NESTED_REPEAT = 10_000  # counts multiplied through nested groups: (?:a{1000}){1000} compiles for seconds
_COUNT = regex.compile(r"\{(\d*)(?:,(\d*))?\}")
_RECURSION = regex.compile(r"\(\?(?:R|[-+]?\d+\)|&|P>)")  # (?R), (?1), (?-1), (?&name), (?P>name)


def check_limits(pattern: str) -> str | None:
    """Why ``pattern`` is refused before it is compiled (recursion, a repeat count over the limits), or None.

    A rough walk over the text (escapes and character classes skipped): enough to bound what the
    compiler unrolls, not a full parse of the syntax, which the compiler checks afterwards. Each open
    group keeps the largest product of counts inside it; a closing group followed by ``{n}`` is an
    atom worth that product times ``n``.
    """
    frames = [1]  # per open group: the largest count product of an atom inside it
    atom = 1  # the value of the atom just read (a group's inner product, or 1)
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i, atom = i + 2, 1
            continue
        if c == "[":  # a class: skip to its closing bracket (a leading ] or ^] is literal)
            j = i + 1 + (pattern[i + 1 : i + 2] == "^")
            j += pattern[j : j + 1] == "]"
            while j < n and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            i, atom = j + 1, 1
            continue
        if c == "(":
            if _RECURSION.match(pattern, i):
                return "it recurses ((?R), (?1) and (?&name) are not allowed)"
            frames.append(1)
            i += 1
            continue
        if c == ")":
            atom = frames.pop() if len(frames) > 1 else 1
            frames[-1] = max(frames[-1], atom)
            i += 1
            continue
        m = _COUNT.match(pattern, i) if c == "{" else None
        if m and (m.group(1) or m.group(2)):
            count = max(int(m.group(1) or 0), int(m.group(2) or 0))
            if count > MAX_REPEAT:
                return f"a repeat count of {count:,} is over {MAX_REPEAT:,}"
            atom *= count
            if atom > MAX_NESTED_REPEAT:
                return f"nested repeat counts multiply to {atom:,}, over {MAX_NESTED_REPEAT:,}"
            frames[-1] = max(frames[-1], atom)
            i, atom = m.end(), 1
            continue
        i, atom = i + 1, 1
    return None


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
        why = check_limits(pattern)
        if why:
            raise error(f"The override pattern {quote(pattern)} is refused: {why}.")
        try:
            self._rx = regex.compile(pattern)
        except (regex.error, ValueError, OverflowError, RecursionError, MemoryError) as err:
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
