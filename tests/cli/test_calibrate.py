"""``quant-studio-cli calibrate``: writes an imatrix export can use; bad input is one line, exit 2, nothing written."""

from __future__ import annotations

import json

import pytest

from studio.cli import main
from studio.core.calib.imatrix import read_imatrix
from studio.core.gguf.read import read_gguf


def _text(tmp_path, llama_model):
    from studio.core.factory import sample_text

    p = tmp_path / "calib.txt"
    p.write_text(sample_text(), encoding="utf-8")
    return p


def _calibrate_argv(model, text, chunks: int, out) -> list[str]:
    return [
        "calibrate",
        str(model),
        "--text",
        str(text),
        "--ctx",
        "64",
        "--chunks",
        str(chunks),
        "-o",
        str(out),
    ]


def test_calibrate_then_export(llama_model, tmp_path, capsys):
    text = _text(tmp_path, llama_model)
    out = tmp_path / "imatrix.gguf"
    argv = _calibrate_argv(llama_model, text, 3, out)
    assert main([*argv, "--json", "--int8", "--device", "cpu"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["entries"] == 14 and d["chunks"] == 3 and d["tokens"] == 192 and d["mode"] == "layer-wise"
    assert d["outlier_features"] and all(f["absmax"] >= 6 for f in d["outlier_features"])
    assert len(d["int8"]["layers"]) == 8 and d["dataset"] == str(text)
    im = read_imatrix(out)
    assert len(im) == 14 and im.chunk_count == 3
    gg = tmp_path / "m.gguf"
    assert (
        main(
            ["export", str(llama_model), "-o", str(gg), "--preset", "Q4_K_M", "--imatrix", str(out), "--json"]
        )
        == 0
    )
    e = json.loads(capsys.readouterr().out)
    assert e["imatrix"] == {"file": str(out), "entries": 14, "chunks": 3}
    meta = read_gguf(gg).metadata
    assert meta["quantize.imatrix.file"] == str(out) and meta["quantize.imatrix.chunks_count"] == 3
    # text output and the legacy format
    dat = tmp_path / "imatrix.dat"
    assert main(_calibrate_argv(llama_model, text, 2, dat)) == 0
    shown = capsys.readouterr().out
    assert "wrote" in shown and "largest outlier features" in shown
    assert read_imatrix(dat).legacy


@pytest.mark.parametrize(
    ("content", "extra", "needle"),
    [
        (b"", [], "is empty"),
        (b"\xff\xfe not utf-8 " * 50, [], "not UTF-8"),
        (b"too short for two chunks", [], "at least 128"),
        (None, ["--chunks", "999"], "not 999"),
    ],
    ids=["empty", "non-utf8", "too-short", "too-many-chunks"],
)
def test_bad_text_is_one_line_and_nothing_is_written(llama_model, tmp_path, capsys, content, extra, needle):
    text = _text(tmp_path, llama_model)
    if content is not None:
        text.write_bytes(content)
    out = tmp_path / "imatrix.gguf"
    code = main(["calibrate", str(llama_model), "--text", str(text), "--ctx", "64", "-o", str(out), *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: ") and needle in err[-1]
    assert not out.exists() and not list(tmp_path.glob("*.partial"))


def test_export_refuses_another_models_imatrix(llama_model, odd_hidden_model, tmp_path, capsys):
    text = _text(tmp_path, llama_model)
    im = tmp_path / "other.gguf"
    assert (
        main(
            [
                "calibrate",
                str(odd_hidden_model),
                "--text",
                str(text),
                "--ctx",
                "64",
                "--chunks",
                "2",
                "-o",
                str(im),
            ]
        )
        == 0
    )
    capsys.readouterr()
    out = tmp_path / "m.gguf"
    assert main(["export", str(llama_model), "-o", str(out), "--preset", "Q4_K_M", "--imatrix", str(im)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was made for another model" in err[0]
    assert not out.exists() and not list(tmp_path.glob("m.gguf*"))
