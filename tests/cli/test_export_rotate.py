"""``quant-studio-cli export --rotate`` (issue 41): the rotated file, its metadata, and the refusals."""

from __future__ import annotations

import json

from studio.cli import main
from studio.core.gguf.read import read_gguf


def test_export_rotate_writes_an_untied_head_and_the_seed(qwen2_model, tmp_path, capsys):
    out = tmp_path / "r.gguf"
    argv = ["export", str(qwen2_model), "-o", str(out), "--preset", "Q4_0", "--json"]
    assert main([*argv, "--rotate", "--rotate-seed", "11"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["types"]["output.weight"] in ("Q6_K", "Q8_0")  # the tied Qwen2 head became its own tensor
    g = read_gguf(out)
    assert g.metadata["quantize.rotation.seed"] == 11
    assert g.metadata["quantize.rotation.method"] == "randomized-hadamard"


def test_export_rotate_refusals_are_one_line(qwen2_model, tiny_model, tmp_path, capsys):
    out = tmp_path / "r.gguf"
    base = ["export", str(qwen2_model), "-o", str(out)]
    assert main([*base, "--preset", "Q4_0", "--rotate", "--rotate-seed", "-1"]) == 2
    err = capsys.readouterr().err  # the numbers door names the option and its range
    assert "--rotate-seed" in err and "out of range; give 0 to 4,294,967,295" in err
    model = _retyped(tiny_model("llama"), tmp_path / "m", "starcoder2")  # a type the rotation does not know
    assert main(["export", str(model), "-o", str(out), "--preset", "Q4_0", "--rotate"]) != 0
    err = capsys.readouterr().err
    assert "does not cover model type 'starcoder2'" in err and err.count("\n") == 1
    assert not out.exists()


def _retyped(src, dst, model_type: str):
    """A copy of the folder ``src`` whose config names another ``model_type``."""
    import shutil

    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(cfg | {"model_type": model_type}))
    return dst


def test_export_rotate_of_a_family_r1_cannot_fold_says_it_folds_r2_alone(gemma2_model, tmp_path, capsys):
    out = tmp_path / "g.gguf"
    assert main(["export", str(gemma2_model), "-o", str(out), "--preset", "Q4_0", "--rotate"]) == 0
    err = capsys.readouterr().err
    note = next(line for line in err.splitlines() if line.startswith("note: Only R2"))
    assert "post-norms" in note
    g = read_gguf(out)
    assert g.metadata["quantize.rotation.r1"] is False and g.metadata["quantize.rotation.r2"] is True
