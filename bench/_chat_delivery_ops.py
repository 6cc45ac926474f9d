"""Child-side op of ``bench/chat_delivery.py``: the chat's llama.cpp generation, each token sent at
once with the moment it was sent (``time.monotonic``, one clock for every process on Linux).

Loaded with ``LlamaCppBackend(extra_ops="_chat_delivery_ops")`` (the bench folder is on the spawned
child's ``sys.path``). The fourth field of each token, which the chat uses for how long it waited,
carries the send time instead; the bench reads it from ``TokenEvent.lag``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from studio.core.chat import llama_ops


def _op_chat_generate(
    state: Any,
    ids: list[int],
    max_tokens: int = 128,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    stop_name: str | None = None,
    window_s: float = 0.0,
) -> Iterator[dict[str, Any]]:
    """``{"t": [(id, bytes, p, sent_at)]}`` per token, then ``{"end": reason}``."""
    tokens = llama_ops._tokens(state, ids, max_tokens, temperature, top_k, top_p, seed, stop_name)
    while True:
        try:
            tok, piece, p, _made = next(tokens)
        except StopIteration as end:
            yield {"end": end.value}
            return
        yield {"t": [(tok, piece, p, time.monotonic())]}


OPS = {**llama_ops.OPS, "chat_generate": _op_chat_generate}
