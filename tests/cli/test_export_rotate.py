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


def test_export_rotate_refusals_are_one_line(qwen2_model, gemma2_model, tmp_path, capsys):
    out = tmp_path / "r.gguf"
    base = ["export", str(qwen2_model), "-o", str(out)]
    assert main([*base, "--preset", "Q4_0", "--rotate", "--rotate-seed", "-1"]) == 2
    err = capsys.readouterr().err  # the numbers door names the option and its range
    assert "--rotate-seed" in err and "out of range; give 0 to 4,294,967,295" in err
    assert main(["export", str(gemma2_model), "-o", str(out), "--preset", "Q4_0", "--rotate"]) != 0
    err = capsys.readouterr().err
    assert "post-norms" in err and err.count("\n") == 1
    assert not out.exists()
