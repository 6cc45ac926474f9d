"""The transformers column runs in its own child process (issue 26): the window's process never runs
torch for it, the replies are the in-process back end's to the bit, and a dead, failing or cancelled
child is one sentence in its own column."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from studio.core.chat import ChatSession, Message, Sampling, generate
from studio.core.chat.hf_backend import TransformersBackend
from studio.core.chat.hf_process import TransformersChildBackend
from studio.core.chat.llama_backend import LlamaCppBackend
from studio.core.chat.session import open_backend
from studio.core.chat.threads import torch_threads
from studio.core.chat.types import ChatError
from studio.core.errors import ChildProcessError_, ModelOpenError, RemoteCodeError
from studio.core.jobs import JobCancelled, JobContext

ROOT = Path(__file__).resolve().parents[3]


def test_a_folder_opens_in_a_child_with_the_in_process_replies(chat_model):
    child = open_backend(chat_model, n_ctx=256, device="cpu")
    assert isinstance(child, TransformersChildBackend) and child.kind == "transformers"
    here = TransformersBackend(chat_model, n_ctx=256, device="cpu")
    try:
        child.load()
        here.load()
        assert child.worker.pid != os.getpid() and child.worker.alive
        assert (child.device, child.dtype) == ("cpu", "float32")
        assert child.template == here.template and child.bos_token == here.bos_token
        assert child.vocab_tokens() == here.vocab_tokens() and child.bos_id == here.bos_id
        for sampling in (Sampling(max_tokens=16), Sampling(max_tokens=16, temperature=0.9, seed=5)):
            a = generate(child, [Message("user", "Tell me about rivers.")], sampling)
            b = generate(here, [Message("user", "Tell me about rivers.")], sampling)
            assert a.prompt.ids == b.prompt.ids
            assert a.token_ids == b.token_ids and a.text == b.text and len(a.tokens) > 0
            assert np.allclose([t.prob for t in a.tokens], [t.prob for t in b.tokens], rtol=0, atol=1e-6)
        ids = child.tokenize("The river runs.")
        got, want = child.logits(ids), here.logits(ids)
        assert got.shape == want.shape == (len(ids), len(here.vocab_tokens()))
        assert np.allclose(got, want, rtol=0, atol=1e-4)
    finally:
        child.close()
        here.close()
    assert not child.worker.alive


def test_the_columns_share_sets_torch_in_the_child_not_here(chat_model):
    b = TransformersChildBackend(chat_model, n_ctx=256, device="cpu")
    try:
        b.set_threads(1)
        b.load()
        assert torch_threads([b]) is None  # the window's torch is not this column's
        generate(b, [Message("user", "Hi")], Sampling(max_tokens=3))
        assert b.threads_used == 1
        b.set_threads(2)
        generate(b, [Message("user", "Hi")], Sampling(max_tokens=3))
        assert b.threads_used == 2
    finally:
        b.close()


SCRIPT = """
import json, sys
from studio.core.chat import Sampling
from studio.core.chat.session import ChatSession, open_backend
def main():
    s = ChatSession([open_backend(p, n_ctx=256, device="cpu") for p in sys.argv[1:]])
    try:
        outs = s.send("Hello, how are you?", Sampling(max_tokens=8))
    finally:
        s.close()
    print(json.dumps({"errors": [o.error for o in outs], "tokens": [list(o.result.token_ids) for o in outs],
                      "torch": "torch" in sys.modules, "transformers": "transformers" in sys.modules}))
if __name__ == "__main__":
    main()
"""


def test_the_window_process_never_runs_torch_while_both_columns_chat(chat_model, f32_gguf, tmp_path):
    """The structural cause of the late llama.cpp tokens: no transformers loop holds this process's GIL."""
    script = tmp_path / "chat_two.py"
    script.write_text(SCRIPT, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, str(script), str(chat_model), str(f32_gguf)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["errors"] == [None, None]
    assert res["tokens"][0] == res["tokens"][1] and len(res["tokens"][0]) > 0
    assert res["torch"] is False and res["transformers"] is False


def test_a_dead_transformers_child_fails_its_column_only(chat_model, gguf_of):
    victim = TransformersChildBackend(chat_model, n_ctx=256, device="cpu", label="victim")
    victim.stream_window_s = 0.0  # every token sent at once, so the kill lands mid-answer
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
        assert dead.error.startswith(
            "The transformers process of victim stopped unexpectedly (signal SIGKILL)"
        )
        assert "\n" not in dead.error and "Traceback" not in dead.error
        assert alive.error is None and len(alive.result.tokens) == 40
        assert not victim.loaded
        with pytest.raises(ChatError, match="not loaded"):
            list(victim.stream([1, 2, 3], Sampling(max_tokens=2)))
        # the next Send loads it again in a fresh child
        dead2, _ = session.send("And now?", Sampling(max_tokens=5))
        assert dead2.error is None and len(dead2.result.tokens) == 5
        assert victim.worker.pid != pid
    finally:
        session.close()


def test_folder_errors_come_before_a_child_and_child_errors_keep_their_kind(chat_model, tmp_path):
    remote = tmp_path / "remote"
    shutil.copytree(chat_model, remote)
    cfg = json.loads((remote / "config.json").read_text())
    (remote / "config.json").write_text(json.dumps({**cfg, "auto_map": {"AutoModel": "x.Model"}}))
    b = TransformersChildBackend(remote, n_ctx=256, device="cpu")
    with pytest.raises(RemoteCodeError, match="custom Python code"):
        b.load()
    assert b.worker is None  # refused before any child started

    broken = tmp_path / "broken"
    shutil.copytree(chat_model, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    b = TransformersChildBackend(broken, n_ctx=256, device="cpu")
    with pytest.raises(ModelOpenError, match=f"transformers could not load {broken}"):
        b.load()
    assert not b.loaded and not b.worker.alive


def test_cancel_while_loading_kills_the_child(chat_model, monkeypatch):
    ctx = JobContext()
    b = TransformersChildBackend(chat_model, n_ctx=256, device="cpu")
    started = threading.Event()
    real_factory = b._factory

    def factory(**kw):
        from studio.core.llamacpp.worker import LlamaWorker

        w = (real_factory or LlamaWorker)(**kw)
        started.set()
        return w

    b._factory = factory
    threading.Thread(target=lambda: (started.wait(60), ctx.cancel()), daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(JobCancelled):
        b.load(ctx)
    assert time.monotonic() - t0 < 60
    assert not b.loaded and not b.worker.alive
    b.close()


def test_a_child_killed_while_loading_is_one_sentence(chat_model):
    b = TransformersChildBackend(
        chat_model, n_ctx=256, device="cpu", label="big", extra_ops="tests.core.chat.fake_hf_ops"
    )
    with pytest.raises(ChildProcessError_) as err:
        b.load()
    assert err.value.message == (
        "The transformers process of big stopped unexpectedly (signal SIGKILL) while loading it."
    )
    assert "memory" in err.value.hint
    assert not b.loaded and not b.worker.alive
    b.close()
