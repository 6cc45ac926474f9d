"""What every chat column whose model runs in a child process shares (``ChildColumn``).

Both kinds of column (llama.cpp for a GGUF, transformers for a folder) run their model in a
``LlamaWorker`` child and read its tokens from a pipe: the shared-memory Stop byte the child polls
before each token, the batched token stream with its early-exit drain, the dead-child sentences and
the teardown are one piece of code here; each back end names its engine, its child and how a
token's text is decoded.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Generator, Sequence
from multiprocessing import shared_memory
from typing import Any

from studio.core.chat.backend import BaseBackend, StopCheck
from studio.core.chat.batching import WINDOW_S
from studio.core.chat.types import ChatError, Sampling, StopReason, TokenEvent
from studio.core.errors import ChildProcessError_, StudioError


def make_flag() -> Any:
    """An 8-byte shared-memory Stop flag, or None where shared memory is unavailable."""
    try:
        return shared_memory.SharedMemory(create=True, size=8)
    except Exception:  # noqa: BLE001 - without shared memory Stop still works, one message later
        return None


def exit_how(worker: Any) -> str:
    """``signal SIGSEGV`` / ``exit code 1`` of a finished child."""
    proc = getattr(worker, "_proc", None)
    if proc is not None:
        with contextlib.suppress(Exception):
            proc.join(timeout=1.0)
    code = getattr(proc, "exitcode", None)
    if isinstance(code, int) and code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return "no exit code" if code is None else f"exit code {code}"


def detail(err: BaseException) -> str:
    """An error's message on one line, at most 300 characters."""
    text = getattr(err, "message", None) or str(err)
    return " ".join(str(text).split())[:300]


class ChildColumn(BaseBackend):
    """A chat back end whose model runs in a child: Stop flag, token stream and teardown."""

    engine = "the model"  # named in the column's sentences: "llama.cpp", "transformers"
    stream_window_s = WINDOW_S  # the child sends tokens in batches at most this far apart
    _shm: Any = None

    def _sync_threads(self) -> None:
        """Send the column's thread share to the child when it changed (before each reply)."""

    def _child(self) -> Any:
        """The child's handle (``stream``, ``alive``): the worker or the runner over it."""
        raise NotImplementedError

    def _died(self, what: str) -> ChildProcessError_:
        return ChildProcessError_(
            f"The {self.engine} process of {self.label} stopped unexpectedly "
            f"({exit_how(getattr(self, 'worker', None))}) while {what}.",
            hint="Load the model again to continue; the other models are not affected.",
        )

    def _on_end(self, msg: dict[str, Any]) -> None:
        """The child's end message, besides its reason (a back end may read more from it)."""

    def _on_failure(self, msg: dict[str, Any]) -> None:
        """An ``{"error": …}`` message the child sent before its end (raised once the stream ends)."""
        raise ChatError(str(msg.get("error")))

    def _child_stream(
        self,
        op: str,
        ids: Sequence[int],
        sampling: Sampling,
        should_stop: StopCheck | None,
        decode: Callable[[Any], str],
    ) -> Generator[TokenEvent, None, StopReason]:
        """Stream ``op``'s tokens from the child (sent in batches); Stop sets the shared byte the child
        checks before every token, and tokens of a batch after Stop are dropped here."""
        self._require_loaded()
        self._sync_threads()
        stop = self._stopper(should_stop)
        flag = self._shm
        if flag is not None:
            flag.buf[0] = 0
        child = self._child()
        try:
            it = child.stream(
                op,
                ids=[int(i) for i in ids],
                stop_name=flag.name if flag is not None else None,
                window_s=self.stream_window_s,
                **sampling.as_dict(),
            )
        except ChildProcessError_:
            self._loaded = False
            raise self._died("starting a generation") from None
        reason = StopReason.LENGTH
        index = 0
        finished = False
        failure: dict[str, Any] | None = None
        try:
            while True:
                try:
                    msg = next(it)
                except StopIteration:
                    finished = True
                    break
                if "error" in msg:  # read on to the child's final answer, then raise it
                    failure = msg
                    continue
                if "end" in msg:
                    reason = StopReason(msg["end"])
                    self._on_end(msg)
                    continue
                for tok, piece, p, waited in msg["t"]:  # a batch: the tokens made since the last message
                    if stop():
                        self._set_flag()
                        reason = StopReason.STOPPED
                        break  # drain: the child ends before its next token
                    yield TokenEvent(index, int(tok), decode(piece), float(p), lag=float(waited))
                    index += 1
                    if stop():
                        self._set_flag()
        except ChildProcessError_ as err:
            finished = True
            if not child.alive:
                self._loaded = False
                raise self._died("generating") from None
            raise ChatError(
                f"{self.engine} failed while generating with {self.label}: {detail(err)}"
            ) from None
        finally:
            if not finished:  # the consumer left early: stop the child and drain its answer
                self._set_flag()
                with contextlib.suppress(StopIteration, StudioError):
                    while True:
                        next(it)
        if failure is not None:
            self._on_failure(failure)
        return reason

    def _set_flag(self) -> None:
        if self._shm is not None:
            with contextlib.suppress(Exception):
                self._shm.buf[0] = 1

    def request_stop(self) -> None:
        """Stop before the next token (thread-safe: sets a byte the child polls)."""
        super().request_stop()
        self._set_flag()

    def _kill(self) -> None:
        """End the child (a back end closes its own handle)."""

    def close(self) -> None:
        """Stop the child and free the stop flag."""
        self._loaded = False
        self._kill()
        if self._shm is not None:
            with contextlib.suppress(Exception):
                self._shm.close()
                self._shm.unlink()
            self._shm = None
