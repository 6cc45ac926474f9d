"""Chat templates rendered in a child process that a deadline or Cancel can really stop.

The in-sandbox budget (``template.TemplateEngine``) counts every loop step and refuses oversized
strings before they are made, but a single C-level operation (a quadratic ``sum`` of lists, a
huge sort) never returns to a budget check. So templates render in one long-lived spawned child:
it compiles each template once and renders conversation after conversation, sending results back
in batches; this process waits with a watchdog. When nothing comes back within a conversation's
budget plus a grace period, or when the job is cancelled, the child is killed (SIGKILL) and the
conversations not yet rendered get the built-in format with a warning. The child has a memory limit
(``RLIMIT_AS``: what it holds after start-up plus ``MEMORY_HEADROOM``), so an allocation that slips
past the size checks is a MemoryError there, not a swapping machine here.

The child is started on first use and shared by every render in this process (a lock serialises
them); a killed child is replaced on the next render.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from studio.core.chat.template import DEFAULT_TIME_BUDGET_S, RenderedChat, TemplateEngine, fallback_text
from studio.core.jobs import JobCancelled, JobContext

__all__ = ["child_peak_rss", "render_in_child", "stop_worker"]

START_TIMEOUT_S = 120.0  # a spawn on a loaded machine imports numpy and jinja2: allow it time
GRACE_S = 0.75  # beyond a conversation's own budget before the child is killed
MEMORY_HEADROOM = 256 << 20
POLL_S = 0.02
_BATCH = 256  # results sent back at least this often (or every 0.1 s)
_SPAWN = multiprocessing.get_context("spawn")


def _limit_memory() -> None:
    try:
        import resource  # child side, and POSIX only (absent on Windows)

        with open("/proc/self/statm") as f:
            vm = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        limit = vm + MEMORY_HEADROOM
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, OSError, ValueError):  # pragma: no cover - no /proc (macOS, Windows)
        pass


def _peak_rss() -> int:
    # VmHWM: the peak of this process's own memory since exec (ru_maxrss would also count the
    # parent's pages the fork before exec shared, hundreds of MB in a window that loaded torch)
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # pragma: no cover - no /proc
        pass
    try:
        import resource  # child side, and POSIX only (absent on Windows)

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    except ImportError:  # pragma: no cover - Windows
        return 0


def _child_main(conn: Any) -> None:
    _limit_memory()
    conn.send(("ready", os.getpid()))
    engines: dict[tuple[str, str], TemplateEngine] = {}
    while True:
        try:
            req = conn.recv()
        except (EOFError, OSError):
            return
        if req[0] == "stats":
            conn.send(("stats", _peak_rss()))
            continue
        _, template, source, conversations, opts = req
        key = (template, source)
        engine = engines.get(key)
        if engine is None:
            if len(engines) >= 4:
                engines.clear()
            engine = engines[key] = TemplateEngine(template, source)
        batch: list[tuple[str, str, str | None]] = []
        last = time.monotonic()
        for msgs in conversations:
            r = engine.render(msgs, **opts)
            batch.append((r.text, r.template, r.warning))
            if len(batch) >= _BATCH or time.monotonic() - last > 0.1:
                conn.send(("part", batch))
                batch, last = [], time.monotonic()
        conn.send(("done", batch))


class _Worker:
    """The shared child and the pipe to it."""

    def __init__(self) -> None:
        self.proc: Any = None
        self.conn: Any = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.is_alive()

    def start(self, ctx: JobContext | None) -> None:
        here, there = _SPAWN.Pipe()
        proc = _SPAWN.Process(target=_child_main, args=(there,), name="studio-chat-template", daemon=True)
        proc.start()
        there.close()
        self.proc, self.conn = proc, here
        until = time.monotonic() + START_TIMEOUT_S
        while not here.poll(POLL_S):
            if ctx is not None and ctx.cancelled:
                self.kill()
                raise JobCancelled()
            if not proc.is_alive() or time.monotonic() > until:
                self.kill()
                raise OSError("the template process did not start")
        here.recv()

    def kill(self) -> None:
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(5)
        if self.conn is not None:
            self.conn.close()
        self.proc = self.conn = None


_LOCK = threading.Lock()
_WORKER = _Worker()  # the one template child of this process (a resource, like an open file)


def stop_worker() -> None:
    """End the template child (it is started again on the next render)."""
    with _LOCK:
        _WORKER.kill()


def child_peak_rss() -> int:
    """Peak resident memory of the template child in bytes (0 when none runs)."""
    with _LOCK:
        if not _WORKER.alive:
            return 0
        _WORKER.conn.send(("stats",))
        return int(_WORKER.conn.recv()[1])


def render_in_child(
    template: str,
    conversations: Sequence[Sequence[dict[str, str]]],
    opts: dict[str, Any],
    *,
    source: str,
    ctx: JobContext | None,
) -> list[RenderedChat]:
    """``TemplateEngine(template).render(c, **opts)`` for each conversation, in the child, under a watchdog."""
    budget = float(opts.get("time_budget_s") or DEFAULT_TIME_BUDGET_S)
    n = len(conversations)
    out: list[RenderedChat] = []
    add_gen = bool(opts.get("add_generation_prompt", True))
    if ctx is not None:
        ctx.check_cancelled()
    with _LOCK:
        try:
            if not _WORKER.alive:
                _WORKER.kill()
                _WORKER.start(ctx)
            _WORKER.conn.send(("render", template, source, list(conversations), opts))
        except (OSError, ValueError, EOFError):
            # no child can be started here: the in-process budget is what is left
            _WORKER.kill()
            engine = TemplateEngine(template, source, ctx)
            return [engine.render(c, **opts) for c in conversations]
        deadline = time.monotonic() + budget + GRACE_S
        why = None
        while True:
            if ctx is not None and ctx.cancelled:
                _WORKER.kill()
                raise JobCancelled()
            try:
                ready = _WORKER.conn.poll(POLL_S)
                msg = _WORKER.conn.recv() if ready else None
            except (EOFError, OSError):
                msg, why = None, "its rendering process died (out of memory or crashed)"
            if msg is not None:
                out.extend(RenderedChat(*r) for r in msg[1])
                deadline = time.monotonic() + budget + GRACE_S
                if ctx is not None and n > 1:
                    ctx.report(len(out), n, f"Rendered {len(out):,} of {n:,} chats")
                if msg[0] == "done":
                    return out
                continue
            if why is None and time.monotonic() > deadline:
                why = f"it exceeded its rendering budget (it ran longer than {budget:g} s and was stopped)"
            elif why is None and not _WORKER.alive:
                why = "its rendering process died (out of memory or crashed)"
            if why is not None:
                _WORKER.kill()
                warning = (
                    f"The chat template of {source} was not used because {why}; "
                    "a plain built-in format is used instead."
                )
                out.extend(
                    RenderedChat(fallback_text(c, add_gen), "fallback", warning)
                    for c in conversations[len(out) :]
                )
                return out
