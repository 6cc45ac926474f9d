"""Tokens come from the llama.cpp child in batches: the same tokens as one message each, the first at
once, none held past the window, and Stop still ends a reply within one token (issue 26)."""

from __future__ import annotations

import threading
import time
from collections.abc import Generator

import pytest

from studio.core.chat import Message, Sampling, StopReason, generate
from studio.core.chat.batching import batched
from studio.core.chat.llama_backend import LlamaCppBackend
from studio.core.chat.types import Prompt, TokenEvent


def _timed(times: list[float], clock: list[float]) -> Generator[int, None, str]:
    """Items 0, 1, … made at ``times`` (the fake clock jumps to each), then returns ``"done"``."""
    for i, t in enumerate(times):
        clock[0] = t
        yield i
    return "done"


def _run(times: list[float], window: float) -> tuple[list[tuple[float, list[int]]], str]:
    clock = [0.0]
    gen = batched(_timed(times, clock), window, clock=lambda: clock[0])
    sent: list[tuple[float, list[int]]] = []
    while True:
        try:
            batch = next(gen)
        except StopIteration as end:
            return sent, end.value
        sent.append((clock[0], batch))


def test_a_fast_stream_goes_first_alone_then_in_batches_none_held_past_the_window():
    times = [i * 0.01 for i in range(20)]  # 100 items a second, a window of 40 ms
    sent, value = _run(times, 0.04)
    assert value == "done"
    assert [i for _, b in sent for i in b] == list(range(20))  # every item once, in order
    assert sent[0][1] == [0]  # the first at once, alone
    assert all(b for _, b in sent) and len(sent) < 10
    for at, batch in sent[1:-1]:
        assert len(batch) > 1
        assert at - times[batch[0]] <= 0.04 + 1e-9  # no item waited longer than the window


def test_a_slow_stream_sends_every_item_at_once():
    times = [i * 0.05 for i in range(6)]  # slower than the window: nothing is worth holding
    sent, _ = _run(times, 0.04)
    assert [b for _, b in sent] == [[i] for i in range(6)]
    assert [at for at, _ in sent] == times


def test_no_window_is_one_message_per_item_and_an_empty_stream_sends_nothing():
    sent, _ = _run([0.0, 0.001, 0.002], 0.0)
    assert [b for _, b in sent] == [[0], [1], [2]]
    sent, value = _run([], 0.04)
    assert sent == [] and value == "done"


@pytest.fixture(scope="module")
def f32_llama(f32_gguf):
    b = LlamaCppBackend(f32_gguf, n_ctx=512)
    b.load()
    yield b
    b.close()


def _reply(backend: LlamaCppBackend, window: float, max_tokens: int = 48):
    """A greedy reply with the child's batch window ``window``, and the messages the child sent."""
    backend.stream_window_s = window
    messages: list[dict] = []
    runner_stream = backend.runner.stream

    def counting(*args, **kwargs):
        it = runner_stream(*args, **kwargs)
        result = None
        while True:
            try:
                msg = next(it)
            except StopIteration as end:
                result = end.value
                break
            messages.append(msg)
            yield msg
        return result

    backend.runner.stream = counting
    try:
        res = generate(
            backend, [Message("user", "Tell me a long story about rivers.")], Sampling(max_tokens=max_tokens)
        )
    finally:
        del backend.runner.stream
    return res, messages


def test_batched_tokens_are_the_tokens_of_one_message_each(f32_llama):
    one, msgs = _reply(f32_llama, 0.0)
    assert len(one.tokens) == 48 and one.stop_reason is StopReason.LENGTH
    assert [len(m["t"]) for m in msgs[:-1]] == [1] * 48 and msgs[-1] == {"end": "length"}
    for window in (0.04, 10.0):
        got, msgs = _reply(f32_llama, window)
        assert got.token_ids == one.token_ids
        assert got.text == one.text
        # (the prompt's cached prefix is reused, so the last prompt token runs alone: float noise)
        assert [t.prob for t in got.tokens] == pytest.approx([t.prob for t in one.tokens], abs=1e-5)
        assert [t.index for t in got.tokens] == list(range(48))
        assert got.stop_reason is StopReason.LENGTH
        assert len(msgs[0]["t"]) == 1  # the first token alone, at once
    # a window longer than the reply: the first token, then all the others in one message
    assert [len(m["t"]) for m in msgs[:-1]] == [1, 47] and msgs[-1] == {"end": "length"}
    # each held token says how long it waited, the earliest longest
    lags = [t.lag for t in got.tokens]
    assert lags[0] < 0.05 and lags[1] > lags[-1] >= 0 and lags[1:] == sorted(lags[1:], reverse=True)


class _Batched:
    """A back end whose tokens come as a child's batches do: token 0 at once, tokens 1-4 made every
    100 ms but handed over together 100 ms after the last (the end-of-text step), with their lags."""

    label = "batched"

    def stream(self, ids, sampling, should_stop=None):
        yield TokenEvent(0, 10, "a", 0.5)
        time.sleep(0.5)
        for i, lag in enumerate((0.4, 0.3, 0.2, 0.1), start=1):
            yield TokenEvent(i, 10 + i, "b", 0.5, lag=lag)
        return StopReason.EOS


def test_tokens_per_s_counts_when_tokens_were_made_not_when_a_batch_arrived():
    prompt = Prompt("x", (1, 2), "none")
    res = generate(_Batched(), [], Sampling(max_tokens=8), prompt=prompt)
    assert len(res.tokens) == 5 and res.stop_reason is StopReason.EOS
    # made 0.1 … 0.4 s after the first: 4 tokens in 0.4 s (10/s), not in the 0.5 s until they arrived (8/s)
    assert res.tokens_per_s == pytest.approx(10.0, rel=0.1)
    assert res.tokens[-1].seconds >= 0.5  # shown when it arrived


def test_stop_is_prompt_while_tokens_wait_in_a_batch(f32_llama):
    f32_llama.stream_window_s = 30.0  # the child holds every token after the first
    first = threading.Event()
    seen: list[float] = []
    out: dict[str, object] = {}

    def on_token(ev):
        seen.append(time.monotonic())
        first.set()

    def run():
        out["result"] = generate(
            f32_llama, [Message("user", "Go on and on.")], Sampling(max_tokens=100_000), on_token=on_token
        )

    t = threading.Thread(target=run)
    t.start()
    assert first.wait(60), "the first token did not come at once"
    t_stop = time.monotonic()  # the child goes on making tokens, held for the next message
    f32_llama.request_stop()
    t.join(30)
    assert not t.is_alive()
    assert time.monotonic() - t_stop < 0.5
    res = out["result"]
    assert res.stop_reason is StopReason.STOPPED
    assert [s for s in seen if s > t_stop] == []  # tokens held in the batch are not shown after Stop
    assert len(res.tokens) == 1
    f32_llama.stream_window_s = 0.04
    again, _ = _reply(f32_llama, 0.04, max_tokens=4)  # the model is usable afterwards
    assert len(again.tokens) == 4
