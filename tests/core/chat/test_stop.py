"""Stop acts within one token and leaves the model usable (FAULTS 47); a dead child fails only its column."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from studio.core.chat import ChatSession, Message, Sampling, StopReason, generate
from studio.core.chat.hf_backend import TransformersBackend
from studio.core.chat.hf_process import TransformersChildBackend
from studio.core.chat.llama_backend import LlamaCppBackend
from studio.core.chat.types import ChatError


@pytest.fixture(params=["llama.cpp", "transformers", "transformers-child"])
def backend(request, chat_model, f32_gguf):
    if request.param == "llama.cpp":
        b = LlamaCppBackend(f32_gguf, n_ctx=1024)
    elif request.param == "transformers-child":  # the chat's column: transformers in its own process
        b = TransformersChildBackend(chat_model, n_ctx=1024, device="cpu")
    else:
        b = TransformersBackend(chat_model, n_ctx=1024, device="cpu")
    b.load()
    yield b
    b.close()


def test_stop_ends_generation_within_one_token_and_the_model_stays_usable(backend):
    seen: list[tuple[float, int]] = []
    five = threading.Event()
    out: dict[str, object] = {}

    def on_token(ev):
        seen.append((time.monotonic(), ev.index))
        if ev.index == 4:
            five.set()

    def run():
        out["result"] = generate(
            backend, [Message("user", "Go on and on.")], Sampling(max_tokens=900), on_token=on_token
        )

    t = threading.Thread(target=run)
    t.start()
    assert five.wait(60), "no tokens arrived"
    t_stop = time.monotonic()
    backend.request_stop()  # as the GUI's Stop button does, from another thread
    t.join(30)
    t_end = time.monotonic()
    assert not t.is_alive()
    res = out["result"]
    assert res.stop_reason is StopReason.STOPPED
    late = [i for ts, i in seen if ts > t_stop]
    assert len(late) <= 1, f"{len(late)} tokens arrived after Stop"
    assert len(res.tokens) < 900
    assert t_end - t_stop < 0.5, f"Stop took {t_end - t_stop:.3f} s"
    # the model answers the next prompt normally: as a freshly loaded copy of it does
    again = generate(backend, [Message("user", "Hello")], Sampling(max_tokens=5))
    kw = {"device": "cpu"} if backend.kind == "transformers" else {}
    fresh = type(backend)(backend.path, n_ctx=1024, **kw)
    fresh.load()
    try:
        want = generate(fresh, [Message("user", "Hello")], Sampling(max_tokens=5))
    finally:
        fresh.close()
    assert again.token_ids == want.token_ids and len(again.tokens) > 0
    assert again.stop_reason is want.stop_reason


def test_a_dead_child_fails_its_column_only(chat_model, f32_gguf, gguf_of):
    victim = LlamaCppBackend(f32_gguf, n_ctx=256, label="victim")
    # every token sent at once: batched, the tiny model's 40 tokens (~15 ms) all reached this process
    # before the kill at the third one, and the column had its whole answer
    victim.stream_window_s = 0.0
    other = LlamaCppBackend(gguf_of(chat_model, "Q8_0"), n_ctx=256, label="survivor")
    session = ChatSession([victim, other])
    try:
        assert session.load_all() == [None, None]
        pid = victim.worker.pid

        def on_token(column, ev):
            if column == 0 and ev.index == 2:
                os.kill(pid, signal.SIGKILL)

        dead, alive = session.send("Hello, how are you?", Sampling(max_tokens=40), on_token=on_token)
        assert dead.result is None
        assert "victim" in dead.error and "stopped unexpectedly" in dead.error and "SIGKILL" in dead.error
        assert alive.error is None and len(alive.result.tokens) == 40
        assert not victim.loaded
        with pytest.raises(ChatError, match="not loaded"):
            list(victim.stream([1, 2, 3], Sampling(max_tokens=2)))
        # loading again starts a fresh child and chat continues in that column
        dead2, alive2 = session.send("And now?", Sampling(max_tokens=5))
        assert dead2.error is None and len(dead2.result.tokens) == 5
        assert victim.worker.pid != pid
    finally:
        session.close()
