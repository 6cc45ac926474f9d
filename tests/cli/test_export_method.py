"""``quant-studio-cli export --method``: calibrated exports from the command line, bad input as one line."""

from __future__ import annotations

import json

from studio.cli import main
from studio.core.gguf.read import read_gguf


def _calib(tmp_path):
    from studio.core.factory import sample_text

    p = tmp_path / "calib.txt"
    p.write_text(sample_text() * 2, encoding="utf-8")
    return p


def test_export_gptq_json_records_the_method(llama_model, tmp_path, capsys):
    out, plan = tmp_path / "m.gguf", tmp_path / "plan.json"
    argv = ["export", str(llama_model), "-o", str(out), "--preset", "Q4_K_M", "--method", "gptq"]
    argv += ["--calib-text", str(_calib(tmp_path)), "--calib-ctx", "64", "--calib-chunks", "3"]
    assert main([*argv, "--save-plan", str(plan), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    c = d["calibration"]
    assert c["method"] == "gptq" and c["tokens"] == 192 and c["chunks"] == 3
    assert [lr["layer"] for lr in c["layers"]] == [0, 1, None]  # the untied head too
    assert {t["method"] for lr in c["layers"] for t in lr["tensors"]} == {"gptq"}
    assert any("fewer than twice" in w for w in c["warnings"])
    assert {t.name: t.type_name for t in read_gguf(out).tensors} == d["types"]
    saved = json.loads(plan.read_text())
    assert saved["method"] == "gptq" and saved["recipe"]["method"] == "gptq"


def test_method_errors_are_one_line(llama_model, tmp_path, capsys):
    base = ["export", str(llama_model), "-o", str(tmp_path / "m.gguf"), "--preset", "Q4_K_M"]
    cases = [
        (["--method", "spqr"], "Unknown method 'spqr'"),
        (["--calib-text", str(_calib(tmp_path))], "need a calibrated --method"),
        (["--method", "gptq", "--imatrix", str(tmp_path / "x.gguf")], None),  # missing file: its own sentence
        (["--method", "gptq", "--backend", "llama.cpp"], "studio back end"),
        (["--exclude", "Q4_1,Q5_1"], "go with --budget"),  # a preset names its types: not silently ignored
        (["--method", "best", "--no-heldout"], "go with --budget"),
    ]
    for extra, said in cases:
        assert main([*base, *extra]) == 2
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert len(err) == 1 and err[0].startswith("error:")
        if said:
            assert said in err[0]
    assert not (tmp_path / "m.gguf").exists()


def test_imatrix_file_goes_with_method_imatrix_only(llama_model, tmp_path, capsys):
    imx = tmp_path / "imatrix.gguf"
    argv = ["calibrate", str(llama_model), "-o", str(imx), "--text", str(_calib(tmp_path)), "--ctx", "64"]
    assert main([*argv, "--chunks", "2", "--json"]) == 0
    capsys.readouterr()
    base = ["export", str(llama_model), "-o", str(tmp_path / "m.gguf"), "--preset", "Q4_K_M"]
    assert main([*base, "--imatrix", str(imx), "--method", "awq"]) == 2
    assert "--imatrix goes with --method imatrix" in capsys.readouterr().err
    assert main([*base, "--imatrix", str(imx), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert "calibration" not in d and d["imatrix"]["chunks"] == 2


def test_best_calibrates_on_the_users_text_and_the_builtin_one(llama_model, tmp_path, capsys):
    text = _calib(tmp_path)
    base = ["export", str(llama_model), "--preset", "Q8_0", "--method", "best", "--calib-text", str(text)]
    base += ["--calib-ctx", "64", "--calib-chunks", "4", "--json"]
    assert main([*base, "-o", str(tmp_path / "mixed.gguf")]) == 0
    mixed = json.loads(capsys.readouterr().out)["calibration"]
    assert mixed["method"] == "awq+gptq"
    assert mixed["dataset"] == f"{text} + quant-studio built-in calibration text"
    assert main([*base, "-o", str(tmp_path / "own.gguf"), "--calib-only"]) == 0
    own = json.loads(capsys.readouterr().out)["calibration"]
    assert own["dataset"] == str(text) and own["tokens"] == mixed["tokens"] == 256
    # the mix's first four chunks already hold built-in text: the files differ
    assert (tmp_path / "mixed.gguf").read_bytes() != (tmp_path / "own.gguf").read_bytes()
