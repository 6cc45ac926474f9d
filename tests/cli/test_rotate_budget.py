"""``sensitivity``, ``plan`` and ``export --budget`` with ``--rotate`` (issue 41): the scan, the imatrix and the
held-out judgement run on the rotated model, the planner pays for the head the rotation unties, and the file
is within its budget and loads in llama.cpp. A GGUF original is rotated through its float32 Hugging Face folder
(converted once into the cache, as the calibrated paths do) instead of being refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from studio.cli import main
from studio.core.gguf.read import read_gguf
from tests.cli import test_plan as _plan
from tests.core.export import conftest as _export
from tests.core.export.test_rotated_export import _kld

cache, text = _plan.cache, _plan.text  # fixtures
llama_worker = _export.llama_worker  # fixture

SCAN = ["--types", "Q4_0,Q8_0", "--exact", "--scan-ctx", "32", "--scan-chunks", "2"]
SCAN += ["--calib-ctx", "64", "--calib-chunks", "4"]


def _sizes(scan: dict) -> dict[str, int]:
    return {q: sum(t["by_type"][q]["bytes"] for t in scan["tensors"]) for q in ("Q4_0", "Q8_0")}


def test_a_rotated_budget_plan_of_a_tied_model_pays_for_its_head(
    qwen2_model, text, cache, tmp_path, capsys, llama_worker
):
    from studio.core.llamacpp import LoadOptions

    model, calib = str(qwen2_model), ["--calib-text", str(text)]
    plain_file, rot_file = tmp_path / "plain-scan.json", tmp_path / "rot-scan.json"
    assert main(["sensitivity", model, *calib, *SCAN, "-o", str(plain_file), "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    argv = ["sensitivity", model, *calib, *SCAN, "--rotate", "--rotate-seed", "3", "-o", str(rot_file)]
    assert main([*argv, "--json"]) == 0
    rot = json.loads(capsys.readouterr().out)
    # the tied head is untied by the rotation: the rotated scan measures it, the plain one has none to measure
    assert "lm_head.weight" in {t["name"] for t in rot["tensors"]}
    assert "lm_head.weight" not in {t["name"] for t in plain["tensors"]}
    assert rot["rotation"] == {"seed": 3} and "rotation" not in plain
    # measured on the rotated weights: the same tensor costs another KL
    kl = {
        s: {t["name"]: t["by_type"]["Q4_0"]["kl"] for t in d["tensors"]}
        for s, d in (("p", plain), ("r", rot))
    }
    q = "model.layers.0.mlp.down_proj.weight"
    assert kl["p"][q] != kl["r"][q]
    # two imatrices and two scans in the cache: nothing of one served the other
    assert len(list(cache.glob("imatrix-*.gguf"))) == 2 and len(list(cache.glob("sensitivity-*.json"))) == 2

    # a budget halfway between all-Q4_0 and all-Q8_0 of the rotated model (its head included)
    sizes = _sizes(rot)
    budget = 100_000 + (sizes["Q4_0"] + sizes["Q8_0"]) // 2
    plan_file = tmp_path / "plan.json"
    argv = ["plan", model, "--budget", str(budget), "-o", str(plan_file), *calib, *SCAN]
    assert main([*argv, "--rotate", "--rotate-seed", "3", "--json"]) == 0
    p = json.loads(capsys.readouterr().out)
    assert p["rotation"] == {"seed": 3} and p["file_bytes"] <= budget
    assert "lm_head.weight" in json.loads(plan_file.read_text())["types"]
    assert any("--rotate --rotate-seed 3" in n for n in p["notes"])
    assert p["heldout"]["heldout_kl"] > 0  # judged on held-out text, rotated
    # the same budget unrotated: no head to pay for, so more bytes go to the blocks
    assert main([*argv, "--json"]) == 0
    u = json.loads(capsys.readouterr().out)
    assert u["rotation"] is None and u["file_bytes"] <= budget
    assert p["types"] != u["types"]

    # a scan of the unrotated model does not plan the rotated one
    assert main([*argv, "--rotate", "--rotate-seed", "3", "--scan", str(plain_file)]) == 2
    err = capsys.readouterr().err
    assert "measured the unrotated model" in err and err.count("\n") == 1

    out = tmp_path / "b.gguf"
    argv = ["export", model, "-o", str(out), "--budget", str(budget), *calib, *SCAN]
    assert main([*argv, "--rotate", "--rotate-seed", "3", "--json"]) == 0
    e = json.loads(capsys.readouterr().out)
    assert out.stat().st_size == e["file_bytes"] == p["file_bytes"] <= budget
    assert np.isfinite(e["budget"]["llama_cpp"]["file_kl"])  # llama.cpp measured the partial file
    g = read_gguf(out)
    assert g.metadata["quantize.rotation.seed"] == 3
    assert "output.weight" in {t.name for t in g.tensors}
    assert any(k.startswith("quantize.imatrix") for k in g.metadata)  # the rotated model's imatrix
    llama_worker.load(out, LoadOptions(logits_all=True, n_ctx=64))
    logits = llama_worker.request("eval_logits", ids=[1, 2, 3, 4])
    assert logits.shape[0] == 4 and np.isfinite(logits).all()


def test_an_imatrix_file_does_not_go_with_rotate(qwen2_model, tmp_path, capsys):
    out = tmp_path / "r.gguf"
    from studio.core.calib.imatrix import Imatrix, ImatrixEntry, write_imatrix

    name = "blk.0.attn_q.weight"
    entry = ImatrixEntry(name, np.ones((1, 256), np.float32), np.ones(1, np.float32))
    im = write_imatrix(Imatrix({name: entry}, chunk_count=1, chunk_size=64), tmp_path / "x.imatrix.gguf").path
    argv = [
        "export",
        str(qwen2_model),
        "-o",
        str(out),
        "--preset",
        "Q4_K_M",
        "--rotate",
        "--imatrix",
        str(im),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "measured on the unrotated one" in err and err.count("\n") == 1
    assert not out.exists()


@pytest.fixture(scope="module")
def q8_gguf(tiny_model, tmp_path_factory):
    """The tiny tied Qwen2 as a Q8_0 GGUF alone in a folder (no config or tokenizer beside it)."""
    from studio.core.export.run import export_gguf

    out = tmp_path_factory.mktemp("lone-gguf") / "qwen-q8.gguf"
    export_gguf(tiny_model("qwen2"), out, "Q8_0")
    return out


def test_a_gguf_original_is_rotated_through_its_converted_folder(q8_gguf, tmp_path, capsys, llama_worker):
    from studio.core.llamacpp import LoadOptions
    from studio.core.paths import user_cache_dir

    rot, plain = tmp_path / "rot.gguf", tmp_path / "plain.gguf"
    argv = ["export", str(q8_gguf), "-o", str(rot), "--preset", "F16", "--rotate", "--rotate-seed", "5"]
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    notes = [ln for ln in captured.err.splitlines() if "converted from it once into the cache" in ln]
    assert len(notes) == 1 and "qwen-q8.gguf is a GGUF file and --rotate" in notes[0]
    assert json.loads(captured.out)["output"] == str(rot)
    assert len(sorted((user_cache_dir() / "gguf-hf").glob("qwen-q8-*"))) == 1
    g = read_gguf(rot)
    assert g.metadata["quantize.rotation.seed"] == 5
    assert "output.weight" in {t.name for t in g.tensors}  # the tied head, untied by the rotation
    assert g.metadata.get("tokenizer.ggml.model")  # the tokenizer came from the GGUF itself

    assert main(["export", str(q8_gguf), "-o", str(plain), "--preset", "F16", "--json"]) == 0  # requantized
    capsys.readouterr()
    ids = list(range(3, 40))
    opts = LoadOptions(logits_all=True, n_ctx=64, f32_kv=True)
    llama_worker.load(plain, opts)
    want = llama_worker.request("eval_logits", ids=ids)
    llama_worker.load(rot, opts)
    got = llama_worker.request("eval_logits", ids=ids)
    assert _kld(want, got) < 1e-3  # the same function
