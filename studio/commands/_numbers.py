"""The one door for numbers typed on the command line: argparse ``type=`` callables with a range.

Every numeric option's ``type=`` is one of these (``tests/cli/test_hostile_round4.py`` walks the
parser and fails on a bare ``int`` or ``float``), so a value is finite, within its range and of
sane size before any handler sees it: ``10^4000`` as a context, ``nan`` parameters or ``2^64``
threads are one argparse line and exit 2, not an OverflowError or hours of work. ``annotate``
writes each option's range into its help text.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
from dataclasses import dataclass
from typing import Any

from studio.core.errors import StudioError

MAX_DIGITS = 24  # no option needs a longer number; int() of thousands of digits is slow or refused
MAX_CTX = 1 << 20  # tokens: a context of over a million tokens is beyond every model here
MAX_LAYERS = 10_000
MAX_STEPS = 10**7  # steps, chunks, tokens to generate
MAX_THREADS = (os.cpu_count() or 1) * 4


def _shown(text: str) -> str:
    text = str(text)
    return repr(text) if len(text) <= 30 else repr(text[:12] + "…" + text[-6:]) + f" ({len(text)} characters)"


@dataclass(frozen=True)
class Whole:
    """An integer option in ``[lo, hi]``; argparse calls it with the typed text."""

    lo: int
    hi: int

    @property
    def range_text(self) -> str:
        """The range as the help text shows it."""
        return f"{self.lo:,} to {self.hi:,}"

    def __call__(self, text: str) -> int:
        t = str(text).strip().replace("_", "")
        if len(t) > MAX_DIGITS:
            raise argparse.ArgumentTypeError(
                f"{_shown(text)} is too long; give a whole number from {self.range_text}"
            )
        try:
            value = int(t)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{_shown(text)} is not a whole number") from None
        if not self.lo <= value <= self.hi:
            raise argparse.ArgumentTypeError(f"{_shown(text)} is out of range; give {self.range_text}")
        return value


@dataclass(frozen=True)
class Real:
    """A finite float option in ``[lo, hi]`` (``lo`` excluded when ``open_lo``)."""

    lo: float
    hi: float
    open_lo: bool = False

    @property
    def range_text(self) -> str:
        """The range as the help text shows it."""
        lo = "over 0" if self.open_lo and self.lo == 0 else f"{self.lo:g}"
        return f"{lo} to {self.hi:g}"

    def __call__(self, text: str) -> float:
        t = str(text).strip()
        if len(t) > 40:
            raise argparse.ArgumentTypeError(f"{_shown(text)} is too long to be a number")
        try:
            value = float(t)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{_shown(text)} is not a number") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{_shown(text)} is not a finite number; give {self.range_text}")
        if value < self.lo or value > self.hi or (self.open_lo and value == self.lo):
            raise argparse.ArgumentTypeError(f"{_shown(text)} is out of range; give {self.range_text}")
        return value


CTX = Whole(1, MAX_CTX)
CHUNKS = Whole(1, MAX_STEPS)
STEPS = Whole(1, MAX_STEPS)
TOKENS = Whole(1, MAX_STEPS)
LAYERS = Whole(1, MAX_LAYERS)
THREADS = Whole(1, MAX_THREADS)
GPU_LAYERS = Whole(-1, MAX_LAYERS)
HEADS = Whole(1, 65_536)
HEAD_DIM = Whole(1, 65_536)
VOCAB = Whole(0, 10**7)
BATCH = Whole(1, 4096)
BITS = Whole(2, 8)
LISTED = Whole(0, 10**6)  # rows to print (--top, --offset)
SEED = Whole(0, 2**32 - 1)
TOP_K = Whole(0, 10**7)
LIMIT = Whole(1, 1000)
PARAMS = Real(0.0, 1e14, open_lo=True)  # 100 trillion parameters
TEMPERATURE = Real(0.0, 100.0)
PROBABILITY = Real(0.0, 1.0)
LEARNING_RATE = Real(0.0, 10.0, open_lo=True)


class BadNumber(StudioError):
    """A numeric option out of its range: one sentence naming the option (raised through argparse)."""


@dataclass(frozen=True)
class _Option:
    """A ranged type bound to its option: a refusal is a ``BadNumber`` naming ``flag`` (argparse lets it
    through, so ``main`` prints it as every other error: one line, exit 2), or the option's ``Minimum``
    sentence from ``studio.commands._check`` when the value is below the range."""

    base: Whole | Real
    flag: str
    minimum: Any = None

    @property
    def range_text(self) -> str:
        """The base type's range."""
        return self.base.range_text

    def __call__(self, text: str) -> int | float:
        try:
            return self.base(text)
        except argparse.ArgumentTypeError as err:
            if self.minimum is not None:
                with contextlib.suppress(ValueError):
                    if len(str(text)) <= MAX_DIGITS and int(str(text)) < self.base.lo:
                        raise BadNumber(self.minimum.sentence(int(str(text)))) from None
            raise BadNumber(f"{self.flag}: {err}.") from None


def annotate(parser: argparse.ArgumentParser, command: str = "") -> None:
    """Bind each ranged option of ``parser`` and its subparsers to its flag, and append its range to its help."""
    from studio.commands._check import SPECS, Minimum  # the sentences of issue 26's lower bounds

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                annotate(sub, f"{command} {name}".strip())
            continue
        if not isinstance(action.type, (Whole, Real)):
            continue
        flag = action.option_strings[0] if action.option_strings else str(action.metavar or action.dest)
        minimum = next(
            (s for s in SPECS.get(command, ()) if isinstance(s, Minimum) and s.dest == action.dest), None
        )
        if action.help and "range:" not in action.help:
            action.help = f"{action.help} [range: {action.type.range_text}]"
        action.type = _Option(action.type, flag, minimum)
