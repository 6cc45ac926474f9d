"""A rotated export (issue 41) runs in the pinned llama.cpp and computes the unrotated file's logits."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from studio.core.export.run import export_gguf
from studio.core.gguf.read import read_gguf
from studio.core.llamacpp import LoadOptions
from studio.core.model.rotate import Rotation, RotationError

TEXT = "The quick brown fox jumps over the lazy dog. Grüße aus Köln, 12345 and more words to read."


def _kld(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """Mean KL(P‖Q) over positions of the softmaxes of two logit arrays."""

    def logsoftmax(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64)
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    lp, lq = logsoftmax(p_logits), logsoftmax(q_logits)
    return float((np.exp(lp) * (lp - lq)).sum(-1).mean())


R1_FAMILIES = [
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "phi3",
    "gpt2",
    "mixtral",
    "qwen3_moe",
    "granite",
    "smollm3",
]
R2_FAMILIES = ["gemma", "gemma2", "gemma3_text", "olmo2"]  # R1 cannot fold there: R2 alone (BERT below)
TIED = ("qwen2", "qwen3", "gpt2", "granite", "smollm3")  # R1 unties their head
MOE = ("mixtral", "qwen3_moe")


@pytest.mark.parametrize("arch", R1_FAMILIES + R2_FAMILIES)
def test_rotated_f16_matches_the_unrotated_f16_in_llamacpp(
    arch, tiny_model, exported, llama_worker, tmp_path
):
    """Every family the studio exports, its own mapping's and llama.cpp's converter's (mixtral, qwen3_moe,
    granite, smollm3, gemma3_text, olmo2: the converter reads the rotated view's values)."""
    from transformers import AutoTokenizer

    model = tiny_model(arch)
    # MoE: an F16 rounding can flip a router's near-tie between two experts on a token (mixtral, seed 7: one
    # token of 54 at KL 0.26, the rest 1e-5), so their function is compared in F32, where it is exact
    ftype = "F32" if arch in MOE else "F16"
    plain = exported(model, ftype, ftype)
    rot = tmp_path / f"{arch}-rot.gguf"
    res = export_gguf(model, rot, ftype, rotation=Rotation(seed=7))
    g = read_gguf(rot)
    meta = {k: v for k, v in g.metadata.items() if k.startswith("quantize.rotation.")}
    r1 = arch in R1_FAMILIES
    assert meta["quantize.rotation.seed"] == 7 and meta["quantize.rotation.r2"] is True
    assert meta["quantize.rotation.r1"] is r1
    assert any(n.startswith("Only R2") for n in res.notes) is not r1  # the export says why
    names = {t.name for t in g.tensors}
    plain_names = {t.name for t in read_gguf(plain).tensors}
    if r1:  # R1 gives the head its own tensor, untied if it was tied
        assert "output.weight" in names
        assert names - plain_names == ({"output.weight"} if arch in TIED else set())
    else:
        assert names == plain_names
    ids = AutoTokenizer.from_pretrained(model, trust_remote_code=False)(TEXT)["input_ids"]
    opts = LoadOptions(logits_all=True, n_ctx=256, f32_kv=True)
    llama_worker.load(plain, opts)
    want = llama_worker.request("eval_logits", ids=ids)
    llama_worker.load(rot, opts)
    got = llama_worker.request("eval_logits", ids=ids)
    assert _kld(want, got) < (1e-8 if ftype == "F32" else 1e-3)
    assert (got.argmax(-1) == want.argmax(-1)).mean() > 0.9
    # and the values did turn: R2 the values (fused qkv for phi3 and gpt2), R1 the embedding too
    data = [{t.name: bytes(t.data) for t in gguf.GGUFReader(f).tensors} for f in (plain, rot)]
    v = "blk.0.attn_qkv.weight" if "blk.0.attn_qkv.weight" in data[0] else "blk.0.attn_v.weight"
    assert data[0][v] != data[1][v]
    assert (data[0]["token_embd.weight"] != data[1]["token_embd.weight"]) is r1


def test_rotated_bert_embeds_as_the_unrotated_one_in_llamacpp(bert_model, exported, llama_worker, tmp_path):
    """BERT (post-LayerNorm: R2 alone): llama.cpp's hidden states of the rotated F16 file are the plain one's."""
    plain = exported(bert_model, "F16", "F16")
    rot = tmp_path / "bert-rot.gguf"
    res = export_gguf(bert_model, rot, "F16", rotation=Rotation(seed=7))
    assert read_gguf(rot).metadata["quantize.rotation.r1"] is False
    assert any("post-LayerNorm" in n for n in res.notes)
    opts = LoadOptions(embedding=True, n_ctx=256)
    llama_worker.load(plain, opts)
    want = llama_worker.request("embed", text=TEXT)["embeddings"]
    llama_worker.load(rot, opts)
    got = llama_worker.request("embed", text=TEXT)["embeddings"]
    assert got.shape == want.shape
    assert float(np.abs(got - want).max()) <= 1e-2 * float(want.max() - want.min())
    data = [{t.name: bytes(t.data) for t in gguf.GGUFReader(f).tensors} for f in (plain, rot)]
    turned = {n for n in data[0] if data[0][n] != data[1][n]}
    assert {n for n in turned if n.startswith("blk.0.")} == {
        "blk.0.attn_v.weight",
        "blk.0.attn_v.bias",
        "blk.0.attn_output.weight",
    }


def test_a_family_it_cannot_fold_writes_nothing(tiny_model, tmp_path):
    """A model type the rotation does not know (here a Llama folder that calls itself StarCoder 2)."""
    import json
    import shutil

    model = tmp_path / "m"
    shutil.copytree(tiny_model("llama"), model)
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(cfg | {"model_type": "starcoder2"}))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(RotationError, match="does not cover model type 'starcoder2'"):
        export_gguf(model, out / "g.gguf", "F16", rotation=Rotation())
    assert not list(out.iterdir())


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_the_planner_counts_the_untied_head(tiny_model, tmp_path, arch):
    from studio.core.model import open_model
    from studio.core.model.rotate import RotatedCheckpoint
    from studio.core.plan.gguf_file import export_file_bytes
    from studio.core.plan.plan import plan_from_preset

    model = tiny_model(arch)  # tied: the rotation unties the head
    out = tmp_path / "r.gguf"
    export_gguf(model, out, "Q8_0", rotation=Rotation(seed=4))
    with open_model(model) as ck:
        view = RotatedCheckpoint(ck, Rotation(seed=4))
        plain = export_file_bytes(ck.info, plan_from_preset(ck.info, "Q8_0"))
        rotated = export_file_bytes(view.info, plan_from_preset(view.info, "Q8_0"))
        head = view.info.tensor("lm_head.weight")
    assert rotated == out.stat().st_size  # the size the planner predicts is the file's
    assert rotated - plain >= head.n_elements  # at least a byte per weight of the untied head


@pytest.mark.parametrize("name", ["x.txt", "missing/x.gguf"])
def test_a_bad_output_path_is_refused_before_the_rotation_is_checked(tiny_model, tmp_path, monkeypatch, name):
    """The float32 check loads the model twice in transformers: a wrong name or folder costs none of it."""
    from studio.core.errors import ExportError
    from studio.core.export import run

    def checked(*_a, **_k):
        raise AssertionError("the rotation was checked before the output path")

    monkeypatch.setattr(run, "check_rotation", checked)
    with pytest.raises(ExportError):
        export_gguf(tiny_model("gpt2"), tmp_path / name, "Q4_0", rotation=Rotation())
    assert not list(tmp_path.iterdir())
