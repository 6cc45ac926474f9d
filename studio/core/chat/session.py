"""Running generations: one back end with timings, or several side by side on the same conversation.

``generate`` renders, tokenizes and streams one reply, measuring time to first token and tokens/s.
``ChatSession`` keeps one conversation per column (the user turns are shared, each column keeps its
own replies) and runs every column at once on its own thread, so a column whose model fails or
whose child process dies reports its error while the others go on.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from studio.core.chat import threads as chat_threads
from studio.core.chat.backend import ChatBackend, StopCheck
from studio.core.chat.hf_process import TransformersChildBackend
from studio.core.chat.llama_backend import LlamaCppBackend
from studio.core.chat.loading import forget as forget_load
from studio.core.chat.loading import load_timed
from studio.core.chat.types import GenerationResult, Message, Prompt, Sampling, StopReason, TokenEvent
from studio.core.errors import StudioError
from studio.core.jobs import JobCancelled, JobContext

TokenSink = Callable[[int, TokenEvent], None]  # (column, token)


def open_backend(
    path: str | Path,
    *,
    n_ctx: int = 2048,
    device: str = "auto",
    dtype: str = "auto",
    n_gpu_layers: int = 0,
    label: str | None = None,
    extra_buffers: str = "auto",
    allow_pickle: bool = False,
    kv_type: str | None = None,
) -> ChatBackend:
    """A back end for ``path``: llama.cpp for a .gguf file, transformers for a checkpoint folder, each
    in a child process.

    ``extra_buffers`` (auto/on/off) is llama.cpp's weight repacking, see ``studio.core.llamacpp``;
    ``allow_pickle`` lets a pickle-only folder be converted (in a child process) instead of refused;
    ``kv_type`` (``f32``, ``f16``, ``q8_0``, ``q4_0``) is llama.cpp's KV-cache type; transformers ignores it.
    """
    p = Path(path).expanduser()
    if p.suffix.lower() == ".gguf":
        return LlamaCppBackend(
            p,
            n_ctx=n_ctx,
            n_gpu_layers=n_gpu_layers,
            label=label,
            extra_buffers=extra_buffers,
            kv_type=kv_type,
        )

    # in its own process, as a GGUF is: generating in this one held the GIL the other columns'
    # pipe readers need (issue 26)
    return TransformersChildBackend(
        p, n_ctx=n_ctx, device=device, dtype=dtype, label=label, allow_pickle=allow_pickle
    )


def generate(
    backend: ChatBackend,
    messages: Sequence[Message],
    sampling: Sampling,
    *,
    on_token: Callable[[TokenEvent], None] | None = None,
    should_stop: StopCheck | None = None,
    truncate: bool = False,
    ctx: JobContext | None = None,
    prompt: Prompt | None = None,
    started: float | None = None,
) -> GenerationResult:
    """Generate one reply to ``messages`` and time it (TTFT includes rendering and the prompt).

    ``prompt`` skips rendering and tokenizing (a prompt shared between columns); ``started`` is the
    ``time.monotonic()`` the timings count from.
    """
    t0 = time.monotonic() if started is None else started

    def stop() -> bool:
        return bool((should_stop is not None and should_stop()) or (ctx is not None and ctx.cancelled))

    if prompt is None:
        prompt = backend.prompt(messages, max_tokens=sampling.max_tokens, truncate=truncate, ctx=ctx)
    gen = backend.stream(prompt.ids, sampling, should_stop=stop)
    tokens: list[TokenEvent] = []
    reason = StopReason.LENGTH
    first = None  # when the first token arrived (the time to first token)
    made_first = made_last = None  # when the first and last tokens were made (tokens/s)
    while True:
        try:
            ev = next(gen)
        except StopIteration as end:
            reason = end.value or StopReason.LENGTH
            break
        now = time.monotonic()
        first = now if first is None else first
        # a batch's tokens arrive together; the last one waited for the end-of-text step, which
        # counted as one token more in the rate (issue 26): the rate counts when they were made
        made = now - max(0.0, ev.lag)
        made_first = made if made_first is None else made_first
        made_last = max(made, made_last if made_last is not None else made)
        ev = dataclasses.replace(ev, seconds=now - t0)
        tokens.append(ev)
        if on_token is not None:
            on_token(ev)
    end_t = time.monotonic()
    if stop() and reason is not StopReason.EOS:
        reason = StopReason.STOPPED
    ttft = (first - t0) if first is not None else end_t - t0
    tps = (
        (len(tokens) - 1) / (made_last - made_first)
        if made_first is not None and made_last is not None and made_last > made_first
        else 0.0
    )
    return GenerationResult(
        label=backend.label,
        text="".join(t.text for t in tokens),
        tokens=tuple(tokens),
        prompt_tokens=len(prompt.ids),
        stop_reason=reason,
        ttft_s=ttft,
        seconds=end_t - t0,
        tokens_per_s=tps,
        prompt=prompt,
    )


def same_vocabulary(a: ChatBackend, b: ChatBackend) -> bool:
    """Whether two back ends use the same token strings for the same ids (padding aside)."""
    va = getattr(a, "vocab_tokens", lambda: None)()
    vb = getattr(b, "vocab_tokens", lambda: None)()
    if not va or not vb:
        return False
    n = min(len(va), len(vb))
    return va[:n] == vb[:n]


def share_prompt(backends: Sequence[ChatBackend], prompts: list[Prompt | None]) -> None:
    """Give every column the first column's token ids where the vocabulary and prompt text agree.

    Tokenizers of a checkpoint and of its GGUF can split text around special tokens differently
    (llama.cpp adds a space after them in SentencePiece vocabularies); comparing quantization needs
    the same ids in every column, so a matching column reuses the reference column's ids.
    """
    ref = next((i for i, p in enumerate(prompts) if p is not None), None)
    if ref is None:
        return
    rp = prompts[ref]
    assert rp is not None
    limit = min(len(getattr(backends[ref], "vocab_tokens", lambda: None)() or ()), 1 << 62)
    for i, p in enumerate(prompts):
        if i == ref or p is None or p.text != rp.text or p.ids == rp.ids:
            continue
        if not same_vocabulary(backends[ref], backends[i]):
            continue
        vb = getattr(backends[i], "vocab_tokens", lambda: None)() or ()
        if any(t >= min(limit, len(vb)) for t in rp.ids) or len(rp.ids) >= backends[i].n_ctx:
            continue
        prompts[i] = dataclasses.replace(p, ids=rp.ids, tokenized_by=rp.tokenized_by)


def first_divergence(a: Sequence[TokenEvent], b: Sequence[TokenEvent]) -> int | None:
    """Index of the first token whose text differs between two replies (None when they agree)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x.text != y.text or (x.token_id != y.token_id and x.text == ""):
            return i
    if len(a) != len(b):
        return min(len(a), len(b))
    return None


@dataclass(frozen=True)
class ColumnOutcome:
    """What one column produced for one turn: a result, or the error sentence to show in it."""

    column: int
    label: str
    result: GenerationResult | None = None
    error: str | None = None
    notes: tuple[str, ...] = ()  # what the column's back end told since the last turn (retries, fallbacks)


class ChatSession:
    """Several back ends answering the same user turns; each column keeps its own replies."""

    def __init__(
        self,
        backends: Sequence[ChatBackend],
        *,
        system: str | None = None,
        cores: int | None = None,
        set_torch_threads: Callable[[int], None] | None = None,
    ) -> None:
        self.backends = list(backends)
        self.system = system
        self.cores = cores  # None: the cores this process may use
        # torch's thread count is global state the core never sets: the face that owns the process
        # passes ``torch.set_num_threads``, called with the transformers columns' share on each Send
        self.set_torch_threads = set_torch_threads
        self.share = chat_threads.share(len(self.backends), cores)  # threads per column (ThreadShare)
        self.user_turns: list[str] = []
        self.replies: list[list[str]] = [[] for _ in self.backends]
        self._notes_told = [0] * len(self.backends)  # notes of each back end already in an outcome

    def messages(self, column: int, next_user: str | None = None) -> list[Message]:
        """The conversation as column ``column`` sees it (plus an upcoming user turn)."""
        out = [Message("system", self.system)] if self.system else []
        for i, user in enumerate(self.user_turns):
            out.append(Message("user", user))
            if i < len(self.replies[column]):
                out.append(Message("assistant", self.replies[column][i]))
        if next_user is not None:
            out.append(Message("user", next_user))
        return out

    def reset(self) -> None:
        """Start a new conversation (models stay loaded)."""
        self.user_turns.clear()
        self.replies = [[] for _ in self.backends]

    def load_all(self, ctx: JobContext | None = None) -> list[str | None]:
        """Load every back end at once; returns an error sentence per column (None when it loaded)."""
        errors: list[str | None] = [None] * len(self.backends)

        def run(i: int, b: ChatBackend) -> None:
            try:
                load_timed(b, ctx)  # waits for a load the column started when it was added
            except JobCancelled:
                errors[i] = "Loading was cancelled."
            except StudioError as err:
                errors[i] = str(err)
            except Exception as err:  # noqa: BLE001 - one column's bug must not stop the others
                errors[i] = f"Loading {b.label} failed unexpectedly ({type(err).__name__}: {err})."

        _run_threads([(i, b) for i, b in enumerate(self.backends) if not b.loaded], run)
        return errors

    def send(
        self,
        text: str,
        sampling: Sampling,
        *,
        on_token: TokenSink | None = None,
        should_stop: StopCheck | None = None,
        truncate: bool = False,
        ctx: JobContext | None = None,
    ) -> list[ColumnOutcome]:
        """Send one user turn to every column at once and wait for all replies."""
        n = len(self.backends)
        outcomes: list[ColumnOutcome | None] = [None] * n
        prompts: list[Prompt | None] = [None] * n
        # every column sees the conversation as it stood before this turn
        convs = [self.messages(i, text) for i in range(n)]
        # every column generates at once: an equal share of the cores each, no oversubscription
        self.share = chat_threads.apply(self.backends, self.cores)
        n_torch = chat_threads.torch_threads(self.backends)
        if n_torch and self.set_torch_threads is not None:
            self.set_torch_threads(n_torch)  # for loading here; each column thread sets its own below
        load_errors = self.load_all(ctx)  # loading is not part of the time to first token
        for i, err in enumerate(load_errors):
            if err is not None:
                outcomes[i] = ColumnOutcome(i, self.backends[i].label, error=err)
        t0 = time.monotonic()

        def fail(i: int, b: ChatBackend, err: BaseException) -> None:
            if isinstance(err, JobCancelled):
                msg = "Stopped before the reply started."
            elif isinstance(err, StudioError):
                msg = str(err)
            else:  # a bug in one column is shown in that column only
                msg = f"{b.label} failed unexpectedly ({type(err).__name__}: {err})."
            outcomes[i] = ColumnOutcome(i, b.label, error=msg)

        def prepare(i: int, b: ChatBackend) -> None:
            if outcomes[i] is not None:
                return
            try:
                prompts[i] = b.prompt(convs[i], max_tokens=sampling.max_tokens, truncate=truncate, ctx=ctx)
            except Exception as err:  # noqa: BLE001
                fail(i, b, err)

        def run(i: int, b: ChatBackend) -> None:
            if prompts[i] is None:
                return
            n = chat_threads.torch_threads([b])
            if n and self.set_torch_threads is not None:
                # torch (OpenMP) keeps its thread count per OS thread: set it on the column's own thread
                self.set_torch_threads(n)
            try:
                sink = (lambda ev: on_token(i, ev)) if on_token is not None else None
                res = generate(
                    b,
                    convs[i],
                    sampling,
                    on_token=sink,
                    should_stop=should_stop,
                    ctx=ctx,
                    prompt=prompts[i],
                    started=t0,
                )
                outcomes[i] = ColumnOutcome(i, b.label, result=res)
            except Exception as err:  # noqa: BLE001
                fail(i, b, err)

        _run_threads(list(enumerate(self.backends)), prepare)
        share_prompt(self.backends, prompts)
        _run_threads(list(enumerate(self.backends)), run)
        self.user_turns.append(text)
        for i, out in enumerate(outcomes):
            reply = out.result.text if out is not None and out.result is not None else ""
            self.replies[i].append(reply)
        return [
            self._with_notes(
                o if o is not None else ColumnOutcome(i, self.backends[i].label, error="No result.")
            )
            for i, o in enumerate(outcomes)
        ]

    def _with_notes(self, out: ColumnOutcome) -> ColumnOutcome:
        notes = tuple(getattr(self.backends[out.column], "notes", ()))
        new = notes[self._notes_told[out.column] :]
        self._notes_told[out.column] = len(notes)
        return dataclasses.replace(out, notes=new) if new else out

    def request_stop(self) -> None:
        """Ask every column to stop before its next token."""
        for b in self.backends:
            b.request_stop()

    def close(self) -> None:
        """Close every back end."""
        for b in self.backends:
            forget_load(b)
            try:
                b.close()
            except Exception:  # noqa: BLE001 - closing must go on for the others
                pass


def _run_threads(items: list[tuple[int, Any]], fn: Callable[[int, Any], None]) -> None:
    if len(items) == 1:
        fn(*items[0])
        return
    threads = [threading.Thread(target=fn, args=it, name=f"chat-column-{it[0]}", daemon=True) for it in items]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
