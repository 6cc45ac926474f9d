"""``quant-studio-cli export``: presets, plans, --keep-first-last, --json, errors as one line."""

from __future__ import annotations

import json

from studio.cli import main
from studio.core.gguf.read import read_gguf


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
    captured = capsys.readouterr()
    assert "top-1 agreement" in captured.out
    assert "Loading weights" not in captured.err  # transformers' own bar stays out of our progress


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


def _one_error_line(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error:"), err
    return err[0]


def test_save_plan_into_missing_folder_is_one_error_line(llama_model, tmp_path, capsys):
    # regression: --save-plan into a missing folder ended in a FileNotFoundError traceback (exit 1)
    argv = ["export", str(llama_model), "-o", str(tmp_path / "m.gguf"), "--preset", "Q8_0"]
    assert main([*argv, "--save-plan", str(tmp_path / "no" / "p.json")]) == 2
    assert "Cannot write the plan" in _one_error_line(capsys)
    assert not (tmp_path / "m.gguf").exists()


def test_keep_first_last_with_plan_is_refused(llama_model, tmp_path, capsys):
    # regression: --keep-first-last was silently ignored next to --plan
    plan_path = tmp_path / "plan.json"
    argv = ["export", str(llama_model), "-o", str(tmp_path / "a.gguf"), "--preset", "Q4_0"]
    assert main([*argv, "--save-plan", str(plan_path)]) == 0
    capsys.readouterr()
    argv = ["export", str(llama_model), "-o", str(tmp_path / "b.gguf"), "--plan", str(plan_path)]
    assert main([*argv, "--keep-first-last", "1:Q8_0"]) == 2
    assert "--keep-first-last goes with --preset or --uniform" in _one_error_line(capsys)
    assert not (tmp_path / "b.gguf").exists()


def test_malformed_plan_file_is_one_error_line_naming_it(llama_model, tmp_path, capsys):
    bad = tmp_path / "edited.json"
    bad.write_text('{"version": 1, "types": {"x": "Q8_0"}, "fallbacks": [1]}')
    assert main(["export", str(llama_model), "-o", str(tmp_path / "m.gguf"), "--plan", str(bad)]) == 2
    line = _one_error_line(capsys)
    assert "edited.json" in line and "malformed" in line


def test_llamacpp_backend_keeps_llamacpp_warnings_off_stderr(llama_model, tmp_path, capfd):
    # regression: llama-cpp-python maps ggml's log levels off by one, so with verbose=False every
    # per-tensor "llama_tensor_get_type: ... applying manual override" warning reached the terminal
    out = tmp_path / "m.gguf"
    argv = ["export", str(llama_model), "-o", str(out), "--preset", "Q4_K_M", "--backend", "llama.cpp"]
    assert main(argv) == 0
    err = capfd.readouterr().err
    assert out.exists() and "llama_tensor_get_type" not in err and "llama_model_quantize" not in err


def test_export_pickle_checkpoint_needs_and_honours_allow_pickle(llama_model, tmp_path, capsys):
    # regression: the refusal told the user to pass --allow-pickle, which export did not have
    import shutil

    import torch
    from safetensors.torch import load_file

    folder = tmp_path / "pickled"
    shutil.copytree(llama_model, folder, ignore=shutil.ignore_patterns("*.safetensors*"))
    torch.save(load_file(str(llama_model / "model.safetensors")), folder / "pytorch_model.bin")
    out = tmp_path / "m.gguf"
    argv = ["export", str(folder), "-o", str(out), "--preset", "Q8_0"]
    assert main(argv) == 2
    assert "--allow-pickle" in _one_error_line(capsys) and not out.exists()
    assert main([*argv, "--allow-pickle", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["types"]["blk.0.attn_q.weight"] == "Q8_0" and out.exists()
    # --verify would run transformers on the pickle in this process: refused before exporting
    out2 = tmp_path / "v.gguf"
    argv = ["export", str(folder), "-o", str(out2), "--preset", "Q8_0", "--allow-pickle", "--verify"]
    assert main(argv) == 2
    assert "only pickle weights" in _one_error_line(capsys) and not out2.exists()


def test_verify_accepts_a_single_safetensors_file_as_model(tmp_path, capsys):
    # regression: MODEL given as a .safetensors file made verification read that file as config.json
    from studio.core.factory import make_tiny_model

    model = make_tiny_model(tmp_path / "m", "gpt2", hidden=64, layers=1, outliers=False)
    out = tmp_path / "m.gguf"
    argv = [
        "export",
        str(model / "model.safetensors"),
        "-o",
        str(out),
        "--preset",
        "F32",
        "--verify",
        "--json",
    ]
    assert main(argv) == 0
    v = json.loads(capsys.readouterr().out)["verify"]
    assert v["top1_agreement"] == 1.0 and v["relative_max_diff"] < 1e-3
