"""Progress and cooperative cancellation for background work, shared by the GUI, the CLI and tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol


class JobCancelled(Exception):
    """Raised by ``JobContext.check_cancelled`` once the job has been asked to stop."""


ProgressSink = Callable[[int, int, str], None]
LogSink = Callable[[str], None]


class CancelFlag(Protocol):
    """What cancellation is read from: a ``threading.Event``, or a ``multiprocessing`` one a child shares."""

    def set(self) -> None: ...
    def is_set(self) -> bool: ...


@dataclass
class JobContext:
    """What a core function gets to report progress and notice cancellation.

    ``report`` is throttled (at most one call to the sink every ``min_interval`` seconds, plus the
    final one) so a tight loop cannot flood a GUI event queue. A report held back is sent at the first
    ``check_cancelled`` after the interval: a step announced just after the one before ended (GPTQ's
    down_proj after up_proj) runs for minutes, and the line went on naming the step before.
    """

    on_progress: ProgressSink | None = None
    on_log: LogSink | None = None
    min_interval: float = 0.05
    cancel_flag: CancelFlag = field(default_factory=threading.Event, repr=False)
    _last: float = field(default=0.0, repr=False)
    _held: tuple[int, int, str] | None = field(default=None, repr=False)

    def report(self, done: int, total: int, msg: str = "") -> None:
        """Report that ``done`` of ``total`` units are finished."""
        if self.on_progress is None:
            return
        now = time.monotonic()
        if done >= total or now - self._last >= self.min_interval:
            self._last = now
            self._held = None
            self.on_progress(done, total, msg)
        else:
            self._held = (done, total, msg)

    def log(self, msg: str) -> None:
        """Append one line to the job's log."""
        if self.on_log is not None:
            self.on_log(msg)

    def cancel(self) -> None:
        """Ask the job to stop at its next check."""
        self.cancel_flag.set()

    @property
    def cancelled(self) -> bool:
        """Whether cancellation has been requested."""
        return self.cancel_flag.is_set()

    def check_cancelled(self) -> None:
        """Raise ``JobCancelled`` if the job has been asked to stop; send a report held back by the
        throttle once its interval has passed."""
        if self.cancel_flag.is_set():
            raise JobCancelled()
        held = self._held
        if held is not None and self.on_progress is not None:
            now = time.monotonic()
            if now - self._last >= self.min_interval:
                self._last = now
                self._held = None
                self.on_progress(*held)

    def span(self, lo: float, hi: float) -> JobSpan:
        """A context for one step of this job: its progress fills the ``[lo, hi)`` fraction of this
        job's (reported in ``SPAN_STEPS`` units); it logs here and shares this job's cancellation."""
        return JobSpan(self, lo, hi)

    def muted(self) -> JobSpan:
        """A context for a step whose own progress and log are not shown (its caller reports for it);
        it shares this job's cancellation."""
        return JobSpan(self, 0.0, 0.0, muted=True)


SPAN_STEPS = 1000  # units of a job's progress as its spans report it


class JobSpan(JobContext):
    """``JobContext.span`` and ``muted``: maps a step's progress onto part of the parent's; shares its
    cancel flag (the same object, which a child process or a kernel may poll)."""

    def __init__(self, parent: JobContext, lo: float, hi: float, *, muted: bool = False) -> None:
        super().__init__()
        self._parent = parent
        self._lo, self._hi = lo, hi
        self._muted = muted
        self._last = (0, 1)
        self.cancel_flag = parent.cancel_flag

    def report(self, done: int, total: int, msg: str = "") -> None:
        self._last = (done, total)
        if self._muted:
            return
        frac = min(1.0, done / total) if total > 0 else 0.0
        self._parent.report(int(SPAN_STEPS * (self._lo + (self._hi - self._lo) * frac)), SPAN_STEPS, msg)

    def say(self, msg: str) -> None:
        """The step's last progress again, with ``msg``."""
        self.report(*self._last, msg)

    def log(self, msg: str) -> None:
        if not self._muted:
            self._parent.log(msg)

    def cancel(self) -> None:
        self._parent.cancel()

    @property
    def cancelled(self) -> bool:
        return self._parent.cancelled

    def check_cancelled(self) -> None:
        self._parent.check_cancelled()


def null_context() -> JobContext:
    """A context that reports nowhere and is never cancelled."""
    return JobContext()
