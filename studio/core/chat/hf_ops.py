"""Child-side ops of the transformers column, served by ``LlamaWorker(extra_ops="studio.core.chat.hf_ops")``.

The original model generates in its own process, as a GGUF does in llama.cpp's: its Python-level
generation loop held the window's GIL and delayed the thread reading the llama.cpp child's pipe, so
the GGUF column's tokens arrived late when both ran together (issue 26). Here the child holds a
``TransformersBackend`` (the one loading path: safetensors only, never remote code, pickle folders
already converted by the parent) and streams its tokens in the same batches and with the same
shared-memory stop byte as ``studio.core.chat.llama_ops``. torch's thread count is this process's
own, so the column's share of the cores is set here (``hf_threads``), never in the window.

An op that fails with a ``StudioError`` returns ``{"error": ..., "hint": ..., "kind": ...}`` rather than
raising, so the parent re-raises the same class with its hint (the pipe protocol carries only the text).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from studio.core.chat.batching import WINDOW_S, token_messages
from studio.core.chat.hf_backend import TransformersBackend
from studio.core.chat.llama_ops import _flag
from studio.core.chat.types import Sampling, StopReason
from studio.core.errors import StudioError

USES_LLAMA_CPP = False  # ``LlamaWorker``'s child then leaves llama.cpp unimported (and its log alone)


def _failure(err: StudioError) -> dict[str, Any]:
    return {"error": err.message, "hint": err.hint, "kind": type(err).__name__}


def _need(state: Any) -> TransformersBackend:
    backend = getattr(state, "hf", None)
    if backend is None or not backend.loaded:
        raise RuntimeError("no model is loaded in the transformers worker")
    return backend


def _set_threads(n: int | None) -> int:
    import torch

    if n:
        torch.set_num_threads(max(1, int(n)))
    return int(torch.get_num_threads())


def _op_hf_load(
    state: Any,
    path: str,
    *,
    n_ctx: int,
    device: str,
    dtype: str,
    label: str,
    n_threads: int | None = None,
) -> dict[str, Any]:
    """Load the (already checked and, for pickles, converted) folder; what the parent needs to chat."""
    threads = _set_threads(n_threads)  # loading runs on the column's share too
    backend = TransformersBackend(path, n_ctx=n_ctx, device=device, dtype=dtype, label=label)
    try:
        backend.load()
    except StudioError as err:
        return _failure(err)
    state.hf = backend
    return {
        "template": backend.template,
        "bos_token": backend.bos_token,
        "eos_token": backend.eos_token,
        "n_ctx": backend.n_ctx,
        "device": backend.device,
        "dtype": backend.dtype,
        "notes": list(backend.notes),
        "threads": threads,
    }


def _op_hf_threads(state: Any, n: int) -> int:
    """Run generation on ``n`` torch threads from now on (the column's share of the cores)."""
    return _set_threads(n)


def _op_hf_tokenize(state: Any, text: str, add_special: bool) -> list[int]:
    return _need(state)._tokenize(text, add_special)


def _op_hf_vocab(state: Any) -> list[str]:
    return list(_need(state).vocab_tokens() or ())


def _op_hf_bos_id(state: Any) -> int | None:
    return _need(state).bos_id


def _op_hf_logits(state: Any, ids: list[int]) -> Any:
    return _need(state).logits(ids)


def _op_hf_generate(
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
    """Stream ``{"t": [(id, text, p, waited_s), ...]}`` batches, then ``{"end": reason, "threads": n}``
    (or ``{"error": ...}`` for a ``StudioError``, such as a prompt with no tokens)."""
    import torch

    backend = _need(state)
    flag = _flag(state, stop_name)
    stopped = (lambda: flag.buf[0] != 0) if flag is not None else None
    sampling = Sampling(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    threads = int(torch.get_num_threads())

    def made() -> Any:
        gen = backend.stream(ids, sampling, should_stop=stopped)
        while True:
            try:
                ev = next(gen)
            except StopIteration as end:
                return end.value or StopReason.LENGTH
            yield ev.token_id, ev.text, ev.prob, time.monotonic()

    try:
        for msg in token_messages(made(), window_s):
            if "end" in msg:
                msg = {"end": StopReason(msg["end"]).value, "threads": threads}
            yield msg
    except StudioError as err:
        yield _failure(err)


OPS = {
    "hf_load": _op_hf_load,
    "hf_threads": _op_hf_threads,
    "hf_tokenize": _op_hf_tokenize,
    "hf_vocab": _op_hf_vocab,
    "hf_bos_id": _op_hf_bos_id,
    "hf_logits": _op_hf_logits,
    "hf_generate": _op_hf_generate,
}
