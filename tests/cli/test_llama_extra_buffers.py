"""``--llama-extra-buffers`` on ``chat``, ``eval`` and ``export --verify``: a first-decode crash with
extra buffers on is retried once without them and told in one ``note:`` line; Q8_0 and Q4_K_M run."""

from __future__ import annotations

import json

import pytest

from studio.cli import main
from studio.core.llamacpp import EXTRA_BUFFERS_ENV
from studio.core.llamacpp.memory import remembered_choice
from studio.core.llamacpp.worker import TEST_CRASH_ENV
from tests.core.chat import fixtures as _fixtures

chat_model = _fixtures.chat_model
gguf_of = _fixtures.gguf_of


@pytest.fixture
def crashing(tmp_path, monkeypatch):
    """Children die by SIGSEGV in their first decode with extra buffers on; a private remembered choice."""
    monkeypatch.setenv("QUANT_STUDIO_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(EXTRA_BUFFERS_ENV, raising=False)
    monkeypatch.setenv(TEST_CRASH_ENV, "decode")


def _notes(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("note:")]


@pytest.mark.parametrize("preset", ["Q8_0", "Q4_K_M"])
def test_chat_retries_once_and_says_so(preset, crashing, chat_model, gguf_of, capsys):
    gguf = gguf_of(chat_model, preset)
    argv = ["chat", "--model", str(gguf), "--prompt", "Hello there", "--max-tokens", "6", "--ctx", "128"]
    assert main([*argv, "--llama-extra-buffers", "off", "--json"]) == 0
    want = json.loads(capsys.readouterr().out)["models"][0]
    assert remembered_choice() is None
    assert main([*argv, "--llama-extra-buffers", "on", "--json"]) == 0
    captured = capsys.readouterr()
    row = json.loads(captured.out)["models"][0]
    assert row["error"] is None and row["tokens"] == want["tokens"] and row["text"] == want["text"]
    (note,) = _notes(captured.err)
    assert note.startswith("note: llama.cpp crashed (SIGSEGV) in the first decode of " + gguf.name)
    assert "restarted once with them off" in note and row["notes"] == [note.removeprefix("note: ")]
    assert remembered_choice().extra_buffers is False
    # auto now starts without extra buffers on this machine: no crash, no note
    assert main(argv) == 0
    assert _notes(capsys.readouterr().err) == []


def test_eval_retries_once_and_reports_the_same_numbers(crashing, chat_model, gguf_of, capsys):
    q4 = gguf_of(chat_model, "Q4_K_M")
    argv = ["eval", "--original", str(chat_model), "--variant", str(q4), "--ctx", "64", "--chunks", "2"]
    argv += ["--device", "cpu", "--json"]
    assert main([*argv, "--llama-extra-buffers", "off"]) == 0
    want = json.loads(capsys.readouterr().out)
    assert main([*argv, "--llama-extra-buffers", "on"]) == 0
    captured = capsys.readouterr()
    got = json.loads(captured.out)
    (note,) = _notes(captured.err)
    assert q4.name in note and "SIGSEGV" in note
    assert got["notes"] == [note.removeprefix("note: ")] and want["notes"] == []
    for key in ("ppl", "kld_mean", "kld_p99", "same_top_pct"):
        assert got["variants"][0][key] == want["variants"][0][key]


@pytest.mark.parametrize("preset", ["Q8_0", "Q4_K_M"])
def test_export_verify_retries_once(preset, crashing, chat_model, tmp_path, capsys):
    out = tmp_path / f"m-{preset}.gguf"
    argv = ["export", str(chat_model), "-o", str(out), "--preset", preset, "--verify", "--json"]
    assert main([*argv, "--llama-extra-buffers", "on"]) == 0
    captured = capsys.readouterr()
    v = json.loads(captured.out)["verify"]
    (note,) = _notes(captured.err)
    assert "SIGSEGV" in note and out.name in note and v["notes"] == [note.removeprefix("note: ")]
    from studio.core.export.verify import verify_gguf

    ref = verify_gguf(out, chat_model, extra_buffers="off")  # the file as written, run without extra buffers
    assert ref.notes == () and (v["top1_agreement"], v["mean_kl"]) == (ref.top1_agreement, ref.mean_kl)


def test_a_bad_choice_is_refused(chat_model, capsys):
    with pytest.raises(SystemExit) as e:
        main(["chat", "--model", str(chat_model), "--prompt", "hi", "--llama-extra-buffers", "maybe"])
    assert e.value.code == 2
    assert "invalid choice: 'maybe'" in capsys.readouterr().err
