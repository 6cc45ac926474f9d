"""Run one core function in a spawned child process, with its progress, events and cancel in this one.

Work that can exhaust the machine (QAT holds weights, gradients and two AdamW moments in float32) or
that should not import torch into the window's process runs through ``call_in_child``: the child is a
fresh ``multiprocessing`` spawn (no inherited state), its ``JobContext`` reports back over a queue,
and its ``check_cancelled`` reads an event this process sets when its own context is cancelled. A
child killed by the operating system (out of memory) becomes one sentence, never a vanished window
(FAULTS.md rows 43-44). Errors cross as their sentence: a ``StudioError`` keeps its text, anything
else is named and its traceback printed to the child's stderr.

``target`` is a module-level function (spawn pickles it by name) called as
``target(ctx, emit, **kwargs)``; ``emit(event)`` sends any picklable value to ``on_event`` here.
"""

from __future__ import annotations

import multiprocessing
import queue
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from studio.core.errors import ChildProcessError_, StudioError
from studio.core.jobs import JobCancelled, JobContext, null_context

__all__ = ["call_in_child"]

POLL_S = 0.1
CANCEL_GRACE_S = 10.0  # a cancelled child that does not stop by itself within this is terminated
_SPAWN = multiprocessing.get_context("spawn")


def _child_main(out: Any, cancel_event: Any, target: Callable[..., Any], kwargs: dict[str, Any]) -> None:
    # progress and log lines go to the parent; cancel is the parent's event
    ctx = JobContext(
        on_progress=lambda d, t, m: out.put(("progress", d, t, m)),
        on_log=lambda m: out.put(("log", m)),
        min_interval=0.1,
        cancel_flag=cancel_event,
    )
    try:
        result = target(ctx, lambda ev: out.put(("event", ev)), **kwargs)
        out.put(("ok", result))
    except JobCancelled:
        out.put(("cancelled",))
    except StudioError as err:
        out.put(("error", str(err)))
    except BaseException as err:  # one sentence for the user; the traceback goes to the child's stderr
        traceback.print_exc()
        detail = str(err).strip().splitlines()[0] if str(err).strip() else ""
        out.put(("crash", f"{type(err).__name__}: {detail}" if detail else type(err).__name__))


def call_in_child(
    target: Callable[..., Any],
    kwargs: Mapping[str, Any] | None = None,
    *,
    what: str,
    ctx: JobContext | None = None,
    on_event: Callable[[Any], None] | None = None,
    poll_s: float = POLL_S,
    process_name: str | None = None,
    cancel_grace_s: float = CANCEL_GRACE_S,
) -> Any:
    """``target(ctx, emit, **kwargs)`` in a spawned child; its result, or its error raised here.

    ``what`` names the work in error sentences ("QAT"); the process is ``studio-<process_name or what>``.
    Cancelling ``ctx`` asks the child to stop at its next ``check_cancelled`` (then raises
    ``JobCancelled`` here); a child that has not stopped ``cancel_grace_s`` later is terminated.
    """
    ctx = ctx or null_context()
    out = _SPAWN.Queue()
    cancel_event = _SPAWN.Event()
    proc = _SPAWN.Process(
        target=_child_main,
        args=(out, cancel_event, target, dict(kwargs or {})),
        name=f"studio-{(process_name or what).lower().replace(' ', '-')}",
        daemon=False,  # it may start children of its own (llama.cpp)
    )
    proc.start()
    cancel_deadline: float | None = None
    try:
        while True:
            if ctx.cancelled and cancel_deadline is None:
                cancel_event.set()
                cancel_deadline = time.monotonic() + cancel_grace_s
            try:
                msg = out.get(timeout=poll_s)
            except queue.Empty:
                if cancel_deadline is not None and time.monotonic() > cancel_deadline:
                    raise JobCancelled() from None
                if not proc.is_alive():
                    try:  # the last message may have arrived just before the child exited
                        msg = out.get(timeout=1.0)
                    except queue.Empty:
                        raise _died(what, proc.exitcode) from None
                else:
                    continue
            kind = msg[0]
            if kind == "progress":
                ctx.report(int(msg[1]), int(msg[2]), str(msg[3]))
            elif kind == "log":
                ctx.log(str(msg[1]))
            elif kind == "event":
                if on_event is not None:
                    on_event(msg[1])
            elif kind == "ok":
                return msg[1]
            elif kind == "cancelled":
                raise JobCancelled()
            elif kind == "error":
                raise StudioError(str(msg[1]))
            else:
                raise ChildProcessError_(
                    f"{what[:1].upper()}{what[1:]} failed with an unexpected error ({msg[1]})."
                )
    finally:
        # a cancelled child gets what is left of its grace to exit by itself (a child that answered
        # "cancelled" is exiting), not 2 s more: Cancel must be prompt
        proc.join(2.0 if cancel_deadline is None else max(0.1, cancel_deadline - time.monotonic()))
        if proc.is_alive():
            proc.terminate()
            proc.join(5.0)
            if proc.is_alive():
                proc.kill()
                proc.join(5.0)
        out.close()
        out.join_thread()


def _died(what: str, exitcode: int | None) -> ChildProcessError_:
    killed = exitcode is not None and exitcode < 0
    return ChildProcessError_(
        f"The {what} process stopped unexpectedly (exit code {exitcode})"
        + ("; the machine may be out of memory." if killed or exitcode is None else ".")
    )
