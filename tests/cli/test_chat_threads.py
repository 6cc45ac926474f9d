"""``quant-studio-cli chat`` says each model's load time apart and its share of the cores (issue 26)."""

from __future__ import annotations

import json

from studio.cli import main
from studio.core.chat import threads as chat_threads
from tests.core.chat import fixtures as _fixtures

chat_model = _fixtures.chat_model
f32_gguf = _fixtures.f32_gguf
gguf_of = _fixtures.gguf_of


def test_chat_reports_load_time_and_thread_share(f32_gguf, gguf_of, chat_model, capsys):
    q8 = gguf_of(chat_model, "Q8_0")
    argv = ["chat", "--model", str(f32_gguf), "--compare", str(q8), "--prompt", "Hi", "--max-tokens", "3"]
    assert main([*argv, "--ctx", "128", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["models"]
    cores = chat_threads.cpu_cores()
    assert rows[0]["threads"] == rows[1]["threads"] and 1 <= rows[0]["threads"] <= max(1, cores // 2)
    for row in rows:
        assert row["load_s"] > 0 and row["ttft_s"] > 0  # the first token counts from Send, the load apart
    assert main([*argv, "--ctx", "128"]) == 0
    out = capsys.readouterr().out
    stats = [line for line in out.splitlines() if line.startswith("--- ")]
    assert len(stats) == 2
    assert all(", loaded in " in s and f" of {cores} core" in s and "first token after" in s for s in stats)
