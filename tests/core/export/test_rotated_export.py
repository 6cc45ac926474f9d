"""A rotated export (issue 41) runs in the pinned llama.cpp and computes the unrotated file's logits."""

from __future__ import annotations

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


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3", "phi3"])
def test_rotated_f16_matches_the_unrotated_f16_in_llamacpp(
    arch, tiny_model, exported, llama_worker, tmp_path
):
    from transformers import AutoTokenizer

    model = tiny_model(arch)
    plain = exported(model, "F16", "F16")
    rot = tmp_path / f"{arch}-rot.gguf"
    res = export_gguf(model, rot, "F16", rotation=Rotation(seed=7))
    g = read_gguf(rot)
    meta = {k: v for k, v in g.metadata.items() if k.startswith("quantize.rotation.")}
    assert meta["quantize.rotation.seed"] == 7 and meta["quantize.rotation.r2"] is True
    names = {t.name for t in g.tensors}
    assert "output.weight" in names  # the head is its own tensor, untied if it was tied
    assert res.n_tensors == len(read_gguf(plain).tensors) + (arch in ("qwen2", "qwen3"))
    ids = AutoTokenizer.from_pretrained(model, trust_remote_code=False)(TEXT)["input_ids"]
    opts = LoadOptions(logits_all=True, n_ctx=256, f32_kv=True)
    llama_worker.load(plain, opts)
    want = llama_worker.request("eval_logits", ids=ids)
    llama_worker.load(rot, opts)
    got = llama_worker.request("eval_logits", ids=ids)
    assert _kld(want, got) < 1e-3
    assert (got.argmax(-1) == want.argmax(-1)).mean() > 0.9


def test_a_family_it_cannot_fold_writes_nothing(tiny_model, tmp_path):
    out = tmp_path / "g.gguf"
    with pytest.raises(RotationError, match="post-norms"):
        export_gguf(tiny_model("gemma2"), out, "F16", rotation=Rotation())
    assert not list(tmp_path.iterdir())


def test_the_planner_counts_the_untied_head(tiny_model, tmp_path):
    from studio.core.model import open_model
    from studio.core.model.rotate import RotatedCheckpoint
    from studio.core.plan.gguf_file import export_file_bytes
    from studio.core.plan.plan import plan_from_preset

    model = tiny_model("qwen2")  # tied: the rotation unties the head
    out = tmp_path / "r.gguf"
    export_gguf(model, out, "Q8_0", rotation=Rotation(seed=4))
    with open_model(model) as ck:
        view = RotatedCheckpoint(ck, Rotation(seed=4))
        plain = export_file_bytes(ck.info, plan_from_preset(ck.info, "Q8_0"))
        rotated = export_file_bytes(view.info, plan_from_preset(view.info, "Q8_0"))
        head = view.info.tensor("lm_head.weight")
    assert rotated == out.stat().st_size  # the size the planner predicts is the file's
    assert rotated - plain >= head.n_elements  # at least a byte per weight of the untied head
