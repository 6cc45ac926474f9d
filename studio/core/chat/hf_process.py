"""The original checkpoint through transformers in a child process, as a chat column (``TransformersChildBackend``).

The transformers column used to generate in the window's own process: its Python-level loop held the
GIL and delayed the thread that reads the llama.cpp child's pipe, so a GGUF column beside it got its
tokens late (first token 1.30 × its direct call's, tokens/s by arrival 0.84–0.91 ×; issue 26). Now
both kinds of column are a child and a pipe: this one runs ``studio.core.chat.hf_ops`` in a
``LlamaWorker`` (the same spawn context, request/stream protocol and dead-child errors), stops through
the same shared-memory byte, and the window's process only renders prompts (in its sandbox) and
reads tokens. The folder is checked here first (config.json, no custom code) and a pickle-only folder
is refused or converted here, in its own child (a daemonic child cannot start one); the child then
loads the safetensors with ``TransformersBackend`` and never runs code from the folder. torch's
threads are the child's own, so ``set_threads`` reaches it directly (``threads.torch_threads``
leaves this column out: the window's torch is not involved).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import Any

from studio.core import errors
from studio.core.chat import types as chat_types
from studio.core.chat.backend import StopCheck
from studio.core.chat.batching import WINDOW_S
from studio.core.chat.child_column import ChildColumn, exit_how, make_flag
from studio.core.chat.hf_backend import check_folder
from studio.core.chat.types import ChatError, Sampling, StopReason, TokenEvent
from studio.core.errors import ChildProcessError_, ModelOpenError, StudioError
from studio.core.jobs import JobCancelled, JobContext
from studio.core.llamacpp.worker import LlamaWorker
from studio.core.model.hf_folder import transformers_folder

HF_OPS = "studio.core.chat.hf_ops"
CANCEL_POLL_S = 0.1  # how often a load watches for Cancel (the child is killed then)


def _raise_failure(reply: Any) -> None:
    """Re-raise a ``{"error", "hint", "kind"}`` reply of the child as its own ``StudioError`` class."""
    if not (isinstance(reply, dict) and "error" in reply):
        return
    kind = str(reply.get("kind", ""))
    cls = getattr(errors, kind, None) or getattr(chat_types, kind, None)
    if not (isinstance(cls, type) and issubclass(cls, StudioError)) or cls is chat_types.PromptTooLongError:
        cls = ChatError
    raise cls(str(reply["error"]), hint=reply.get("hint") or None)


class TransformersChildBackend(ChildColumn):
    """The original Hugging Face checkpoint, run by transformers in its own process."""

    kind = "transformers"
    engine = "transformers"
    own_process = True  # torch runs in the child: the window's torch threads are not this column's

    def __init__(
        self,
        path: str | Path,
        *,
        device: str = "auto",
        dtype: str = "auto",
        n_ctx: int = 2048,
        label: str | None = None,
        allow_pickle: bool = False,
        extra_ops: str = HF_OPS,
        worker_factory: Callable[..., Any] | None = None,
    ) -> None:
        super().__init__(path, n_ctx=n_ctx, label=label)
        self.allow_pickle = allow_pickle
        self.device_request = device
        self.dtype_request = dtype
        self.device = ""
        self.dtype = ""
        self.extra_ops = extra_ops
        self._factory = worker_factory
        self._worker: Any = None
        self._shm: Any = None
        self._vocab: tuple[str, ...] | None = None
        self._bos_id: tuple[int | None] | None = None
        self.n_threads: int | None = None  # the column's share of the cores (None: torch's choice)
        self._threads_in_child: int | None = None
        self.threads_used: int | None = None  # torch's thread count in the child's last generation
        self.stream_window_s = WINDOW_S  # the child sends tokens in batches at most this far apart

    @property
    def worker(self) -> Any:
        """The ``LlamaWorker`` child running transformers (None until loaded)."""
        return self._worker

    def set_threads(self, n: int | None) -> None:
        """torch's threads in the child, from the next load or reply."""
        self.n_threads = int(n) if n else None

    def _sync_threads(self) -> None:
        if self.n_threads is None or self.n_threads == self._threads_in_child:
            return
        self._threads_in_child = int(self._call("hf_threads", n=self.n_threads))

    # -- loading ------------------------------------------------------------------------------------

    def load(self, ctx: JobContext | None = None) -> None:
        """Check the folder, start the child and load the model there (Cancel kills the child)."""
        if self._loaded:
            return
        check_folder(self.path)  # one sentence at once, before a child starts
        # refused, or converted in the pickle loader's own child, before the load
        weights = transformers_folder(self.path, allow_pickle=self.allow_pickle, ctx=ctx)
        if ctx is not None:
            ctx.check_cancelled()
        if self._shm is None:
            self._shm = make_flag()  # before the child starts: both share one resource tracker
        self._kill()
        label = f"transformers ({self.path.name})"
        try:
            factory = self._factory or LlamaWorker
            self._worker = factory(label=label, extra_ops=self.extra_ops)
        except StudioError as err:
            raise ChildProcessError_(
                f"The transformers process for {self.label} could not start: {err.message}"
            ) from None
        args = {
            "path": str(weights),
            "n_ctx": self.n_ctx,
            "device": self.device_request,
            "dtype": self.dtype_request,
            "label": self.label,
            "n_threads": self.n_threads,
        }
        done = threading.Event()
        watcher = None
        if ctx is not None:
            watcher = threading.Thread(target=self._watch_cancel, args=(ctx, done), daemon=True)
            watcher.start()
        try:
            info = self._worker.request("hf_load", **args)
        except ChildProcessError_ as err:
            if ctx is not None and ctx.cancelled:
                self._kill()
                raise JobCancelled() from None
            how = exit_how(self._worker)
            alive = self._worker.alive
            self._kill()
            if alive:  # an unexpected error in the child, which is still running
                raise ModelOpenError(f"transformers could not load {self.path}: {err.message}") from None
            raise ChildProcessError_(
                f"The transformers process of {self.label} stopped unexpectedly ({how}) while loading it.",
                hint="The model may be too large for this machine's memory; the other models are not affected.",
            ) from None
        finally:
            done.set()
            if watcher is not None:
                watcher.join()
        try:
            _raise_failure(info)
        except StudioError as err:
            self._kill()
            if weights != self.path:  # name the user's folder, not its converted copy in the cache
                raise type(err)(err.message.replace(str(weights), str(self.path)), hint=err.hint) from None
            raise
        self.template = info.get("template")
        self.bos_token = str(info.get("bos_token") or "")
        self.eos_token = str(info.get("eos_token") or "")
        self.n_ctx = int(info.get("n_ctx", self.n_ctx))
        self.device = str(info.get("device", "cpu"))
        self.dtype = str(info.get("dtype", ""))
        self._notes.extend(str(n) for n in info.get("notes", ()))
        self._threads_in_child = self.n_threads
        self._vocab = None
        self._bos_id = None
        self._loaded = True

    def _watch_cancel(self, ctx: JobContext, done: threading.Event) -> None:
        while not done.wait(CANCEL_POLL_S):
            if ctx.cancelled:
                worker = self._worker
                if worker is not None:
                    worker.kill()  # the load's request then fails, and ``load`` raises JobCancelled
                return

    # -- requests -----------------------------------------------------------------------------------

    def _child(self) -> Any:
        return self._worker

    def _on_end(self, msg: dict[str, Any]) -> None:
        self.threads_used = msg.get("threads")

    def _on_failure(self, msg: dict[str, Any]) -> None:
        _raise_failure(msg)

    def _call(self, op: str, **args: Any) -> Any:
        self._require_loaded()
        try:
            reply = self._worker.request(op, **args)
        except ChildProcessError_ as err:
            if not self._worker.alive:
                self._loaded = False
                raise self._died(f"running {op}") from None
            raise ChatError(f"transformers failed with {self.label}: {err.message}") from None
        _raise_failure(reply)
        return reply

    def _tokenize(self, text: str, add_special: bool) -> list[int]:
        return [int(i) for i in self._call("hf_tokenize", text=text, add_special=add_special)]

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of plain text (BOS added as the tokenizer does by default)."""
        return self._tokenize(text, add_special)

    def vocab_tokens(self) -> tuple[str, ...] | None:
        """Token strings by id, from the child's tokenizer (asked once)."""
        if self._vocab is None and self._loaded:
            self._vocab = tuple(str(t) for t in self._call("hf_vocab"))
        return self._vocab or None

    @property
    def bos_id(self) -> int | None:
        """The BOS id when the tokenizer adds one to plain text, else None."""
        if self._bos_id is None:
            value = self._call("hf_bos_id")
            self._bos_id = (int(value) if value is not None else None,)
        return self._bos_id[0]

    def logits(self, ids: Sequence[int]) -> Any:
        """float32 logits (n, vocab) of one forward pass over ``ids`` from an empty context."""
        return self._call("hf_logits", ids=[int(i) for i in ids])

    def stream(
        self, ids: Sequence[int], sampling: Sampling, should_stop: StopCheck | None = None
    ) -> Generator[TokenEvent, None, StopReason]:
        """Stream tokens from the child (sent in batches); Stop sets the shared byte the child checks
        before every token, and tokens of a batch after Stop are dropped here."""
        return (yield from self._child_stream("hf_generate", ids, sampling, should_stop, str))

    # -- teardown -----------------------------------------------------------------------------------

    def _kill(self) -> None:
        if self._worker is not None:
            with contextlib.suppress(Exception):
                self._worker.close(timeout=2.0)


__all__ = ["HF_OPS", "TransformersChildBackend"]
