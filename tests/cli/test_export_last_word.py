"""``export --budget``: llama.cpp measures the partial file before its rename (issue 37); a file worse than
promised is not written as a success (one sentence, exit 2) unless ``--keep-if-worse``, which labels it."""

from __future__ import annotations

import json
import math

import pytest

from studio.cli import main
from studio.core.evaluate.last_word import LAST_WORD_TOKENS
from tests.llama_verdict import stub_llama_kl

CALIB = ["--calib-ctx", "64", "--calib-chunks", "4", "--scan-ctx", "32", "--scan-chunks", "2"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANT_STUDIO_CACHE", str(tmp_path / "cache"))


def _argv(llama_model, tmp_path, out):
    from studio.core.factory import sample_text

    text = tmp_path / "calib.txt"
    text.write_text(sample_text() * 3, encoding="utf-8")
    return ["export", str(llama_model), "-o", str(out), "--budget", "6bpw", "--calib-text", str(text)] + [
        "--types", "Q4_0,Q8_0", "--exact", *CALIB,
    ]  # fmt: skip


def test_a_file_worse_than_promised_is_not_written(llama_model, tmp_path, cache, monkeypatch, capsys):
    out = tmp_path / "b.gguf"
    seen = stub_llama_kl(monkeypatch, lambda p: 30.0)  # the destroyed file
    assert main(_argv(llama_model, tmp_path, out)) == 2  # a StudioError: one sentence
    err = capsys.readouterr().err
    assert "llama.cpp measures the file at KL 30.0000" in err and "--keep-if-worse" in err
    assert not out.exists() and not list(tmp_path.glob("b.gguf*"))  # no file, no partial
    assert seen and seen[0].endswith(".partial")  # measured before the rename


def test_keep_if_worse_keeps_it_labelled(llama_model, tmp_path, cache, monkeypatch, capsys):
    out = tmp_path / "b.gguf"
    stub_llama_kl(monkeypatch, lambda p: 30.0)
    assert main([*_argv(llama_model, tmp_path, out), "--keep-if-worse", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)["budget"]["llama_cpp"]
    assert out.is_file() and d["kept_anyway"] and not d["ok"] and d["file_kl"] == 30.0
    assert main([*_argv(llama_model, tmp_path, out), "--keep-if-worse"]) == 0
    assert "KEPT ANYWAY (--keep-if-worse)" in capsys.readouterr().out


def test_a_file_as_good_as_promised_is_written_with_llamacpps_number(
    llama_model, tmp_path, cache, monkeypatch, capsys
):
    out = tmp_path / "b.gguf"
    # the plan's file measures 0 (within its prediction); any preset file measures more
    stub_llama_kl(monkeypatch, lambda p: 0.0 if p.endswith(".partial") else 1.0)
    assert main([*_argv(llama_model, tmp_path, out), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)["budget"]["llama_cpp"]
    assert out.is_file() and d["ok"] and not d["kept_anyway"] and d["tokens"] == LAST_WORD_TOKENS


def test_with_the_trained_only_types_named_the_guarantees_hold(
    tiny_model, tmp_path, cache, monkeypatch, capsys
):
    # issue 37 Build 2: TQ1_0, TQ2_0, Q1_0 and Q2_0 named on a float model with a tied embedding (the issue's
    # case): no NaN printed, the embedding kept at least at the same-size preset's type (never a trained-only
    # type), and llama.cpp measures the file before its rename
    from studio.core.factory import sample_text

    model = tiny_model("llama", tie_embeddings=True, layers=2, hidden=256)
    text = tmp_path / "calib.txt"
    text.write_text(sample_text() * 3, encoding="utf-8")
    out = tmp_path / "b.gguf"
    seen = stub_llama_kl(monkeypatch, lambda p: 0.0 if p.endswith(".partial") else 1.0)
    named = ("Q2_0", "Q1_0", "TQ1_0", "TQ2_0")
    argv = ["export", str(model), "-o", str(out), "--budget", "4.5bpw", "--calib-text", str(text)] + [
        "--types", ",".join((*named, "Q4_0", "Q8_0")), *CALIB,
    ]  # fmt: skip
    assert main([*argv, "--json"]) == 0
    raw = capsys.readouterr().out
    d = json.loads(raw)
    assert "nan" not in raw.lower() and "infinity" not in raw.lower()
    assert math.isfinite(d["budget"]["predicted_kl"]) and d["budget"]["llama_cpp"]["ok"]
    assert seen and seen[0].endswith(".partial") and out.is_file()
    assert d["types"]["token_embd.weight"] not in named
    assert set(d["types"].values()) & set(named)  # named, they are used where the scan prices them well
