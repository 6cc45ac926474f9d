"""``quant-studio-cli eval`` and ``chat``: JSON shapes, identical greedy text for a model and its F32 export."""

from __future__ import annotations

import json
import re

import pytest

from studio.cli import main
from tests.core.chat import fixtures as _fixtures

# shared session fixtures (exports are cached in that module)
chat_model = _fixtures.chat_model
f32_gguf = _fixtures.f32_gguf
gguf_of = _fixtures.gguf_of


def _json(capsys) -> dict:
    out = capsys.readouterr().out
    return json.loads(out)


def test_eval_json(chat_model, f32_gguf, gguf_of, capsys):
    q4 = gguf_of(chat_model, "Q4_K_M")
    rc = main(
        [
            "eval",
            "--original",
            str(chat_model),
            "--variant",
            str(f32_gguf),
            "--variant",
            str(q4),
            "--ctx",
            "64",
            "--chunks",
            "3",
            "--device",
            "cpu",
            "--json",
        ]
    )
    assert rc == 0
    d = _json(capsys)
    assert d["original"]["ppl"] > 1 and d["chunks"] == 3 and d["ctx"] == 64
    f32, q = d["variants"]
    for v in (f32, q):
        assert {"path", "ppl", "kld_mean", "kld_p99", "same_top_pct", "file_bytes", "bpw"} <= set(v)
    assert f32["path"] == str(f32_gguf) and f32["kld_mean"] < 1e-5 and f32["same_top_pct"] >= 99.9
    assert q["kld_mean"] > f32["kld_mean"] and q["bpw"] < f32["bpw"] and q["file_bytes"] < f32["file_bytes"]


def test_eval_table_and_bad_variant(chat_model, f32_gguf, tmp_path, capsys):
    missing = tmp_path / "nope.gguf"
    rc = main(
        [
            "eval",
            "--original",
            str(chat_model),
            "--variant",
            str(f32_gguf),
            "--variant",
            str(missing),
            "--ctx",
            "64",
            "--chunks",
            "1",
            "--device",
            "cpu",
        ]
    )
    captured = capsys.readouterr()
    assert rc == 2
    assert "KL mean" in captured.out and f32_gguf.name[:28] in captured.out
    assert "nope.gguf" in captured.err


def test_chat_compare_greedy_gives_identical_text(chat_model, f32_gguf, capsys):
    rc = main(
        [
            "chat",
            "--model",
            str(chat_model),
            "--compare",
            str(f32_gguf),
            "--prompt",
            "Hello, who are you?",
            "--max-tokens",
            "24",
            "--device",
            "cpu",
            "--ctx",
            "256",
            "--json",
        ]
    )
    assert rc == 0
    d = _json(capsys)
    orig, f32 = d["models"]
    assert orig["error"] is None and f32["error"] is None
    assert len(orig["tokens"]) > 0
    assert f32["text"] == orig["text"] and f32["tokens"] == orig["tokens"]
    assert f32["first_divergence"] is None and orig["template"] == "model"
    assert d["sampling"]["temperature"] == 0.0 and f32["tokens_per_s"] > 0


def test_chat_text_output_and_seed(f32_gguf, capsys):
    args = [
        "chat",
        "--model",
        str(f32_gguf),
        "--prompt",
        "Hi",
        "--max-tokens",
        "8",
        "--temperature",
        "1.0",
        "--seed",
        "5",
        "--ctx",
        "128",
    ]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out.split("---")[0] == first.split("---")[0]
    assert f"=== {f32_gguf.name}" in first and "tokens/s" in first


def test_chat_prompt_too_long_is_one_line_error(f32_gguf, capsys):
    rc = main(["chat", "--model", str(f32_gguf), "--prompt", "word " * 400, "--ctx", "64"])
    err = capsys.readouterr().err
    assert rc == 2 and re.search(r"prompt too long \(\d+ > \d+ tokens\)", err) and err.count("\n") == 1


@pytest.mark.parametrize("cmd", ["eval", "chat"])
def test_missing_required_arguments_exit_non_zero(cmd):
    with pytest.raises(SystemExit) as e:
        main([cmd])
    assert e.value.code == 2
