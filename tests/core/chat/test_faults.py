"""FAULTS.md rows 15-18 and 45 for chat: hostile GGUF files and templates, GPU load failures."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from studio.core.chat import ChatSession, Message, Sampling, generate
from studio.core.chat.llama_backend import LlamaCppBackend, gpu_attempts
from studio.core.errors import ChildProcessError_, ModelOpenError
from tests.core.chat.fixtures import evil_template, model_with_template

FAKE_OPS = "tests.core.chat.fake_ops"


def _patched(src: Path, dst: Path, find: bytes, offset: int, new: bytes) -> Path:
    data = src.read_bytes()
    i = data.index(find) + offset
    dst.write_bytes(data[:i] + new + data[i + len(new) :])
    return dst


# -- FAULTS 15: a GGUF that crashes native code ------------------------------------------------------


def test_gguf_that_aborts_llamacpp_leaves_the_parent_alive(f32_gguf, tmp_path):
    # llama.cpp aborts on block_count > 512 (llama.cpp #25821-class); the file is otherwise valid
    key = b"llama.block_count"
    data = f32_gguf.read_bytes()
    at = data.index(key) + len(key)
    assert struct.unpack_from("<I", data, at)[0] == 4  # a uint32 value follows
    bad = tmp_path / "too-many-blocks.gguf"
    bad.write_bytes(data[: at + 4] + struct.pack("<I", 600) + data[at + 8 :])
    b = LlamaCppBackend(bad, n_ctx=64)
    with pytest.raises(ChildProcessError_) as err:
        b.load()
    msg = str(err.value)
    assert "too-many-blocks.gguf crashed the llama.cpp loader (signal SIGABRT)" in msg
    assert "malicious" in msg and "update llama-cpp-python" in msg
    assert b.worker is None and not b.loaded


def test_segfault_in_the_loader_is_reported(f32_gguf, monkeypatch):
    monkeypatch.setenv("FAKE_CRASH_ON_LOAD", "1")
    b = LlamaCppBackend(f32_gguf, n_ctx=64, extra_ops=FAKE_OPS)
    with pytest.raises(ChildProcessError_, match=r"crashed the llama.cpp loader \(signal SIGSEGV\)"):
        b.load()


# -- FAULTS 16: metadata that is not UTF-8 -----------------------------------------------------------


def test_non_utf8_chat_template_loads_with_a_warning(f32_gguf, tmp_path):
    # one byte of the literal '<|assistant|>' in the template becomes 0xFF
    bad = _patched(f32_gguf, tmp_path / "latin1-template.gguf", b"<|assistant|>", 8, b"\xff")
    b = LlamaCppBackend(bad, n_ctx=128)
    try:
        b.load()
        assert any("chat_template" in n and "UTF-8" in n for n in b.notes)
        res = generate(b, [Message("user", "hi")], Sampling(max_tokens=4))
        assert "<|assist\ufffdnt|>" in res.prompt.text and res.prompt.template == "model"
        assert len(res.tokens) > 0
    finally:
        b.close()


def test_non_utf8_token_text_is_a_clear_error(f32_gguf, tmp_path):
    # the EOS token's text "</s>" (u64 length 4) gets a 0xFF byte; llama-cpp-python decodes it strictly
    bad = _patched(
        f32_gguf, tmp_path / "bad-token.gguf", b"\x04\x00\x00\x00\x00\x00\x00\x00</s>", 10, b"\xff"
    )
    b = LlamaCppBackend(bad, n_ctx=64)
    with pytest.raises(ModelOpenError, match="bad-token.gguf .*not valid UTF-8"):
        b.load()
    assert b.worker is None


# -- FAULTS 17 and 18: hostile templates inside a GGUF ------------------------------------------------


@pytest.mark.parametrize(
    "kind, template, why",
    [
        ("escape", None, "sandbox refused"),
        (
            "dos",
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            "ran longer",
        ),
        ("syntax", "{% for m in messages %}{{ m.content }", "syntax error"),
    ],
    ids=["escape", "dos", "syntax"],
)
def test_hostile_template_in_a_gguf_falls_back(
    kind, template, why, chat_model, gguf_of, canary, tmp_path_factory, monkeypatch
):
    import studio.core.chat.backend as backend_mod

    real = backend_mod.render_chat
    monkeypatch.setattr(backend_mod, "render_chat", lambda *a, **k: real(*a, **{**k, "time_budget_s": 0.3}))
    model = model_with_template(
        chat_model,
        tmp_path_factory.getbasetemp() / f"chat-{kind}-template",
        template or evil_template(canary),
    )
    gguf = gguf_of(model, "F32")
    s = ChatSession([LlamaCppBackend(gguf, n_ctx=128)])
    try:
        (out,) = s.send("Hello", Sampling(max_tokens=4))
        assert out.error is None
        p = out.result.prompt
        assert p.template == "fallback" and p.text == "User: Hello\nAssistant:"
        assert why in p.warning and gguf.name in p.warning
        assert len(out.result.tokens) > 0
    finally:
        s.close()
    assert not canary.exists()


# -- FAULTS 45: llama.cpp load fails on the GPU ------------------------------------------------------


def test_gpu_attempts_go_down_in_layers_then_context():
    assert gpu_attempts(-1, 8, 1024) == [
        (-1, 1024),
        (4, 1024),
        (2, 1024),
        (1, 1024),
        (0, 1024),
        (0, 512),
        (0, 256),
    ]
    assert gpu_attempts(0, 8, 512) == [(0, 512), (0, 256)]


def test_gpu_load_failure_retries_with_fewer_layers_and_a_smaller_context(f32_gguf):
    b = LlamaCppBackend(f32_gguf, n_ctx=1024, n_gpu_layers=-1, extra_ops=FAKE_OPS)
    try:
        b.load()
        assert b.loaded and b.n_gpu_layers == 0 and b.n_ctx == 256
        note = " ".join(b.notes)
        assert "did not load as asked" in note and "CUDA out of memory" in note and "context of 256" in note
        res = generate(b, [Message("user", "hi")], Sampling(max_tokens=3))
        assert os.getpid() != b.worker.pid
    finally:
        b.close()
    # the retried load answers exactly as a plain CPU load with that context does
    plain = LlamaCppBackend(f32_gguf, n_ctx=256)
    try:
        plain.load()
        want = generate(plain, [Message("user", "hi")], Sampling(max_tokens=3))
        assert res.token_ids == want.token_ids and len(res.tokens) > 0
        assert res.stop_reason is want.stop_reason
    finally:
        plain.close()


def test_load_that_fails_everywhere_is_one_clear_error(f32_gguf, tmp_path):
    bad = _patched(f32_gguf, tmp_path / "unknown-arch.gguf", b"general.architecture", 32, b"zzzzz")
    b = LlamaCppBackend(bad, n_ctx=64)
    with pytest.raises(ModelOpenError, match="llama.cpp could not load unknown-arch.gguf"):
        b.load()
