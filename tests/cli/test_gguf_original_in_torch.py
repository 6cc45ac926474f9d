"""A GGUF file as the original of the steps that run the model in torch (issue 38): calibrate and a
calibrated export convert it once into the cache, say so in one line, and go on."""

from __future__ import annotations

import json

import pytest

from studio.cli import main
from studio.core.gguf.read import read_gguf
from tests.core.chat import fixtures as _fixtures

chat_model = _fixtures.chat_model
gguf_of = _fixtures.gguf_of


@pytest.fixture(scope="module")
def q8_gguf(chat_model, gguf_of, tmp_path_factory):
    """The tiny Llama as a Q8_0 GGUF alone in a folder: no config or tokenizer beside it."""
    folder = tmp_path_factory.mktemp("lone-gguf")
    dst = folder / "tiny-q8.gguf"
    dst.write_bytes(gguf_of(chat_model, "Q8_0").read_bytes())
    return dst


def _notes(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("note:") and "runs the model in torch" in ln]


def test_calibrate_converts_a_gguf_once_and_says_so(q8_gguf, tmp_path, capsys):
    out = tmp_path / "imatrix.gguf"
    argv = ["calibrate", str(q8_gguf), "-o", str(out), "--ctx", "64", "--chunks", "2", "--json"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    notes = _notes(captured.err)
    assert len(notes) == 1 and "tiny-q8.gguf is a GGUF file and calibration" in notes[0]
    assert json.loads(captured.out)  # the usual report
    assert read_gguf(out).metadata.get("general.type") == "imatrix"
    # the second run reuses the converted folder (the note says so again; no second folder)
    from studio.core.paths import user_cache_dir

    folders = sorted((user_cache_dir() / "gguf-hf").glob("tiny-q8-*"))
    assert len(folders) == 1
    assert main([*argv[:3], str(tmp_path / "again.gguf"), *argv[4:]]) == 0
    assert sorted((user_cache_dir() / "gguf-hf").glob("tiny-q8-*")) == folders


def test_export_gptq_from_a_gguf_original(q8_gguf, tmp_path, capsys):
    out = tmp_path / "gptq.gguf"
    argv = ["export", str(q8_gguf), "-o", str(out), "--preset", "Q4_K_M", "--method", "gptq"]
    assert main([*argv, "--calib-ctx", "64", "--calib-chunks", "2", "--json"]) == 0
    captured = capsys.readouterr()
    assert len(_notes(captured.err)) == 1
    d = json.loads(captured.out)
    assert d["calibration"]["method"] == "gptq"
    written = {t.name: t.type_name for t in read_gguf(out).tensors}
    assert written == d["types"] and "Q4_K" in written.values()
    # the tokenizer came from the GGUF itself (there is none beside it): the file carries it
    assert read_gguf(out).metadata.get("tokenizer.ggml.model")


def test_a_plain_preset_export_stays_a_requantization(q8_gguf, tmp_path, capsys):
    assert main(["export", str(q8_gguf), "-o", str(tmp_path / "q4.gguf"), "--preset", "Q4_K_M"]) == 0
    assert _notes(capsys.readouterr().err) == []


def test_export_budget_from_a_lone_gguf_takes_its_tokenizer_from_the_file(q8_gguf, tmp_path, capsys):
    # the failure this replaces: "... has neither tokenizer.model nor tokenizer.json" (none lies beside it)
    out = tmp_path / "budget.gguf"
    argv = ["export", str(q8_gguf), "-o", str(out), "--budget", "1000000", "--no-heldout"]
    argv += ["--calib-ctx", "64", "--calib-chunks", "2", "--scan-ctx", "32", "--scan-chunks", "1", "--json"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert len(_notes(captured.err)) == 1 and "the budget's scan" in _notes(captured.err)[0]
    d = json.loads(captured.out)
    assert d["file_bytes"] == out.stat().st_size <= 1_000_000
    assert read_gguf(out).metadata.get("tokenizer.ggml.model")
