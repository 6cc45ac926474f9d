"""The protocol every chat back end follows, and the prompt logic they share.

A back end loads one model (``load``), turns a conversation into token ids with the model's chat
template rendered in our sandbox (``prompt``), and streams generated tokens (``stream``) until the
end-of-generation token, ``max_tokens``, a full context or Stop. ``stream`` is a generator whose
return value (``StopIteration.value``) is the ``StopReason``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from studio.core.chat.render import render_chat
from studio.core.chat.types import (
    ChatError,
    Message,
    Prompt,
    PromptTooLongError,
    Sampling,
    StopReason,
    TokenEvent,
)
from studio.core.jobs import JobContext

StopCheck = Callable[[], bool]
MIN_CTX = 8  # smallest context a back end accepts (evaluation's smallest chunk)


@runtime_checkable
class ChatBackend(Protocol):
    """One model that can chat: the original checkpoint (transformers) or a GGUF (llama.cpp)."""

    kind: str  # "transformers" or "llama.cpp"
    label: str
    path: Path
    n_ctx: int

    @property
    def loaded(self) -> bool:
        """Whether ``load`` has succeeded and ``close`` has not been called."""
        ...

    @property
    def notes(self) -> tuple[str, ...]:
        """Things the user should know about how the model was loaded (fallbacks, retries)."""
        ...

    def load(self, ctx: JobContext | None = None) -> None:
        """Load the model; raises a StudioError naming the file on failure."""
        ...

    def prompt(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int = 128,
        truncate: bool = False,
        ctx: JobContext | None = None,
    ) -> Prompt:
        """Render and tokenize a conversation; raises PromptTooLongError unless ``truncate``."""
        ...

    def stream(
        self, ids: Sequence[int], sampling: Sampling, should_stop: StopCheck | None = None
    ) -> Generator[TokenEvent, None, StopReason]:
        """Generate after ``ids``; yields tokens, returns why it ended."""
        ...

    def request_stop(self) -> None:
        """Ask a running ``stream`` (on another thread) to end before its next token."""
        ...

    def close(self) -> None:
        """Free the model (and its child process)."""
        ...


class BaseBackend:
    """Shared parts: label, stop flag, template rendering, prompt length checks."""

    kind = "base"

    def __init__(self, path: str | Path, *, n_ctx: int = 2048, label: str | None = None) -> None:
        self.path = Path(path)
        self.label = label or self.path.name
        self.n_ctx = int(n_ctx)
        if self.n_ctx < MIN_CTX:
            raise ChatError(
                f"A context of {self.n_ctx} tokens is too small for {self.label}; use at least {MIN_CTX}."
            )
        self.template: str | None = None
        self.bos_token = ""
        self.eos_token = ""
        self._notes: list[str] = []
        self._stop = threading.Event()
        self._loaded = False

    @property
    def loaded(self) -> bool:
        """Whether the model is ready."""
        return self._loaded

    @property
    def notes(self) -> tuple[str, ...]:
        """Load-time notes (template warnings, GPU retries)."""
        return tuple(self._notes)

    def _require_loaded(self) -> None:
        if not self._loaded:
            raise ChatError(f"{self.label} is not loaded; load it before chatting.")

    def _tokenize(self, text: str, add_special: bool) -> list[int]:  # pragma: no cover - abstract
        raise NotImplementedError

    def prompt(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int = 128,
        truncate: bool = False,
        ctx: JobContext | None = None,
    ) -> Prompt:
        """Render ``messages`` with the model's template (sandboxed) and tokenize the result."""
        self._require_loaded()
        rendered = render_chat(
            self.template,
            messages,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            source=str(self.path),
            ctx=ctx,
        )
        # A template writes its own BOS (as HF's apply_chat_template assumes); plain text gets the model's.
        ids = self._tokenize(rendered.text, add_special=rendered.template != "model")
        if ctx is not None:
            ctx.check_cancelled()
        limit = self.n_ctx - 1  # at least one position must stay free for the answer
        truncated_from = None
        if len(ids) > limit:
            if not truncate:
                raise PromptTooLongError(len(ids), limit, self.label)
            keep = max(1, self.n_ctx - min(max_tokens, self.n_ctx // 2))
            truncated_from = len(ids)
            ids = ids[-keep:]
        return Prompt(
            rendered.text, tuple(ids), rendered.template, rendered.warning, truncated_from, self.label
        )

    def vocab_tokens(self) -> tuple[str, ...] | None:
        """The token strings by id (used to tell whether two back ends may share token ids)."""
        return None

    def request_stop(self) -> None:
        """Ask the running generation to end before its next token."""
        self._stop.set()

    def _stopper(self, should_stop: StopCheck | None) -> StopCheck:
        self._stop.clear()
        stop = self._stop
        if should_stop is None:
            return stop.is_set
        return lambda: stop.is_set() or bool(should_stop())

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:  # pragma: no cover - overridden
        self._loaded = False
