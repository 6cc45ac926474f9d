"""``quant-studio-cli export``: presets, plans, --keep-first-last, --json, errors as one line."""

from __future__ import annotations

import json

from studio.cli import main
from studio.core.gguf_read import read_gguf


def test_export_preset_json(llama_model, tmp_path, capsys):
    out = tmp_path / "m.gguf"
    assert main(["export", str(llama_model), "-o", str(out), "--preset", "Q4_K_M", "--json"]) == 0
    captured = capsys.readouterr()
    d = json.loads(captured.out)
    assert d["output"] == str(out) and d["plan"] == "Q4_K_M"
    assert d["types"]["output.weight"] == "Q6_K"
    assert {t.name: t.type_name for t in read_gguf(out).tensors} == d["types"]
    assert "%]" in captured.err  # progress goes to stderr


def test_export_keep_first_last_and_saved_plan(llama_model, tmp_path, capsys):
    out = tmp_path / "m.gguf"
    plan_path = tmp_path / "plan.json"
    argv = ["export", str(llama_model), "-o", str(out), "--uniform", "Q4_0", "--keep-first-last", "1:Q8_0"]
    assert main([*argv, "--save-plan", str(plan_path), "--override", r"down_proj=Q5_0"]) == 0
    plan = json.loads(plan_path.read_text())
    assert plan["version"] == 1 and plan["recipe"]["kind"] == "first_last"
    assert "wrote" in capsys.readouterr().out
    # the saved plan reproduces the same file types
    out2 = tmp_path / "m2.gguf"
    assert main(["export", str(llama_model), "-o", str(out2), "--plan", str(plan_path), "--json"]) == 0
    t1 = {t.name: t.type_name for t in read_gguf(out).tensors}
    t2 = {t.name: t.type_name for t in read_gguf(out2).tensors}
    assert t1 == t2 and t1["blk.0.ffn_down.weight"] == "Q5_0" and t1["blk.0.attn_q.weight"] == "Q8_0"


def test_export_verify_text(llama_model, tmp_path, capsys):
    out = tmp_path / "m.gguf"
    assert main(["export", str(llama_model), "-o", str(out), "--preset", "Q8_0", "--verify"]) == 0
    assert "top-1 agreement" in capsys.readouterr().out


def test_export_errors_are_one_line(llama_model, tmp_path, capsys):
    assert main(["export", str(llama_model), "-o", str(tmp_path / "no" / "m.gguf"), "--preset", "Q8_0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "does not exist" in err[0]
    assert main(["export", str(llama_model), "-o", str(tmp_path / "m.gguf"), "--preset", "Q9_K"]) == 2
    assert "Unknown preset" in capsys.readouterr().err
    bad_plan = tmp_path / "p.json"
    bad_plan.write_text('{"types": {}}')
    assert main(["export", str(llama_model), "-o", str(tmp_path / "m.gguf"), "--plan", str(bad_plan)]) == 2
    assert "version" in capsys.readouterr().err
    assert not (tmp_path / "m.gguf").exists()
