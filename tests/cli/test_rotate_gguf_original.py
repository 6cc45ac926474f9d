"""``export GGUF --rotate`` (issue 41): a GGUF original is rotated through its float32 Hugging Face folder,
converted once into the cache as the calibrated paths do, instead of being refused; the rotated file computes
the unrotated requantization's function in llama.cpp."""

from __future__ import annotations

import json

import numpy as np
import pytest

from studio.cli import main
from studio.core.gguf.read import read_gguf


@pytest.fixture(scope="module")
def llama_worker():
    """One llama.cpp child for this module."""
    from studio.core.llamacpp import LlamaRunner

    w = LlamaRunner(label="llama.cpp (tests)")
    yield w
    w.close()


@pytest.fixture(scope="module")
def q8_gguf(tiny_model, tmp_path_factory):
    """The tiny tied Qwen2 as a Q8_0 GGUF alone in a folder (no config or tokenizer beside it)."""
    from studio.core.export.run import export_gguf

    out = tmp_path_factory.mktemp("lone-gguf") / "qwen-q8.gguf"
    export_gguf(tiny_model("qwen2"), out, "Q8_0")
    return out


def _kld(p: np.ndarray, q: np.ndarray) -> float:
    def logsoftmax(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64) - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    lp, lq = logsoftmax(p), logsoftmax(q)
    return float((np.exp(lp) * (lp - lq)).sum(-1).mean())


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
    assert _kld(want, got) < 1e-3
