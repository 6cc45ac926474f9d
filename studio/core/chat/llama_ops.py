"""Child-side ops for chat and evaluation, added to ``LlamaWorker`` with ``extra_ops="studio.core.chat.llama_ops"``.

``chat_load`` loads a GGUF with llama-cpp-python's own chat-template machinery switched off (templates
are rendered by the parent's sandbox, never by llama-cpp-python). ``chat_generate`` streams tokens
of our own generation loop: raw logits → the shared numpy sampler → each token's bytes and
probability, sent in small batches (``studio.core.chat.batching``: the first token at once, then
at most one message per 40 ms) rather than one message per token. Stop is a byte in shared memory
the parent sets; the loop checks it before every token and between prompt batches, so it ends
within one token.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Generator, Iterator
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from studio.core.chat.batching import WINDOW_S, token_messages
from studio.core.chat.sampling import choose, make_rng
from studio.core.llamacpp.worker import _OPS, _need, before_decode

PROMPT_BATCH = 256  # prompt tokens evaluated between two checks of the stop flag


class _NoTemplate:
    """Stands in for llama-cpp-python's Jinja2ChatFormatter so no template is compiled or rendered here."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def to_chat_handler(self) -> Any:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(
                "chat templates are rendered by Quant Studio's sandbox, not in the llama.cpp worker"
            )

        return refuse


def _disable_llamacpp_templates() -> None:
    import llama_cpp.llama as llama_mod

    llama_mod.llama_chat_format.Jinja2ChatFormatter = _NoTemplate  # type: ignore[attr-defined]


def _op_chat_load(state: Any, path: str, **kwargs: Any) -> dict[str, Any]:
    _disable_llamacpp_templates()
    state.chat_flag = None
    info = _OPS["load"](state, path=path, **kwargs)
    info.pop("metadata", None)  # the parent reads metadata itself, bounded and with lossy UTF-8
    llm = state.llm
    info["n_batch"] = int(getattr(llm, "n_batch", 512))
    return info


def _flag(state: Any, name: str | None) -> Any:
    if not name:
        return None
    cached = getattr(state, "chat_flag", None)
    if cached is not None and cached[0] == name:
        return cached[1]

    # the parent made it before starting this child, so both share one resource tracker and the
    # parent's unlink settles it
    shm = shared_memory.SharedMemory(name=name)
    state.chat_flag = (name, shm)
    return shm


def _piece(vocab: Any, tok: int) -> bytes:
    import llama_cpp

    size = 64
    while True:
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_token_to_piece(vocab, tok, buf, size, 0, False)
        if n >= 0:
            return buf.raw[:n]
        size = -n + 8  # the piece needs -n bytes


def _tokens(
    state: Any,
    ids: list[int],
    max_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    seed: int,
    stop_name: str | None,
) -> Generator[tuple[int, bytes, float, float], None, str]:
    """``(id, bytes, p, time made)`` per token; returns why it ended (``eos``, ``length``, ``context``, ``stopped``)."""
    import llama_cpp

    llm = _need(state)
    before_decode(state)
    flag = _flag(state, stop_name)
    stopped = (lambda: flag.buf[0] != 0) if flag is not None else (lambda: False)
    vocab = llm._model.vocab
    n_vocab = llm.n_vocab()
    n_ctx = llm.n_ctx()
    ids = [int(i) for i in ids]
    if not ids:
        raise ValueError("the prompt has no tokens")
    if len(ids) >= n_ctx:
        raise ValueError(f"prompt too long ({len(ids)} > {n_ctx - 1} tokens)")
    # keep the cached prefix the new prompt shares with what is in the KV cache (follow-up turns)
    have = list(llm.input_ids[: llm.n_tokens])
    common = 0
    for a, b in zip(have, ids, strict=False):
        if a != b:
            break
        common += 1
    common = min(common, len(ids) - 1)  # at least one token must be evaluated to get logits
    llm.n_tokens = common
    for start in range(common, len(ids), PROMPT_BATCH):
        if stopped():
            return "stopped"
        llm.eval(ids[start : start + PROMPT_BATCH])
    rng = None if temperature <= 0 else make_rng(seed)
    ctx_ptr = llm._ctx.ctx
    pending: int | None = None  # the last token, evaluated only if another one is wanted
    for _ in range(max_tokens):
        if stopped():
            return "stopped"
        if pending is not None:
            if llm.n_tokens >= n_ctx:
                return "context"
            llm.eval([pending])
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx_ptr, -1), shape=(n_vocab,))
        tok, p = choose(logits, rng, temperature=temperature, top_k=top_k, top_p=top_p)
        if llama_cpp.llama_vocab_is_eog(vocab, tok):
            return "eos"
        yield tok, _piece(vocab, tok), p, time.monotonic()
        pending = tok
    return "length"


def _op_chat_generate(
    state: Any,
    ids: list[int],
    max_tokens: int = 128,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    stop_name: str | None = None,
    window_s: float = WINDOW_S,
) -> Iterator[dict[str, Any]]:
    """Stream ``{"t": [(id, bytes, p, waited_s), ...]}`` batches of tokens (``batching``), then one ``{"end": reason}``."""
    return token_messages(
        _tokens(state, ids, max_tokens, temperature, top_k, top_p, seed, stop_name), window_s
    )


def _op_chat_threads(state: Any, n: int) -> int:
    """Run generation and prompt batches on ``n`` threads from now on (the chat's share of the cores)."""
    import llama_cpp

    llm = _need(state)
    n = max(1, int(n))
    llama_cpp.llama_set_n_threads(llm._ctx.ctx, n, n)
    llm.n_threads = llm.n_threads_batch = n
    return int(llama_cpp.llama_n_threads(llm._ctx.ctx))


OPS = {
    "chat_load": _op_chat_load,
    "chat_threads": _op_chat_threads,
    "chat_generate": _op_chat_generate,
}
