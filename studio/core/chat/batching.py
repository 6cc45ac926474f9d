"""Tokens sent from the llama.cpp child in small batches instead of one message each.

One pipe message per token woke the window's process for every token; on two cores that wake-up
took its slice from one of llama.cpp's threads, and the other waited for it at the next barrier
(``bench/chat_latency.py``: 0.70 × the direct call's tokens/s, issue 26). ``batched`` groups a
stream's items: the first goes at once (the time to the first token is untouched), later ones
wait at most about ``window_s`` for the next send while the model keeps its pace, and an item whose
successor is expected after that (a slow model) goes at once too. The last items go out the moment
the stream ends, so tokens/s measured where they arrive is the model's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

WINDOW_S = 0.04  # a batch every 40 ms at most: 25 updates a second, smooth to the eye


def batched(
    items: Iterator[T], window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic
) -> Generator[list[T], None, R]:
    """Lists of ``items`` in order (none empty): the first alone, then at most one list per ``window_s``.

    An item is held only while the next one is expected in time (the last gap between items, added
    to the age of the batch, stays under the window); the rest goes out when ``items`` ends, whose
    return value this returns.
    """
    batch: list[T] = []
    sent_at: float | None = None
    last: float | None = None
    while True:
        try:
            item = next(items)
        except StopIteration as end:
            if batch:
                yield batch
            return end.value
        now = clock()
        gap = now - last if last is not None else window_s
        last = now
        batch.append(item)
        if sent_at is None or (now - sent_at) + gap >= window_s:
            yield batch
            batch = []
            sent_at = clock()


def token_messages(tokens: Iterator[tuple[Any, ...]], window_s: float = WINDOW_S) -> Iterator[dict[str, Any]]:
    """The pipe messages of a child's answer: ``{"t": [(*token, waited_s), ...]}`` per batch of
    ``tokens`` (each ``(*token, made_at)``), then ``{"end": <the tokens' return value>}``."""
    batches = batched(tokens, window_s)
    while True:
        try:
            batch = next(batches)
        except StopIteration as end:
            yield {"end": end.value}
            return
        now = time.monotonic()  # each token says how long it waited (the parent's clock may differ)
        yield {"t": [(*tok[:-1], now - tok[-1]) for tok in batch]}
