"""Conformance of the studio's own converter: for each family it maps itself, its F32 GGUF equals
llama.cpp's converter's output tensor for tensor and key for key, except for the documented keys
below (each with its reason; a listed exception that stops occurring fails the test too, so the
list stays true).

The reference is the converter run on a copy of the checkpoint completed as Hub repositories are:
transformers 5 writes added tokens only to tokenizer.json, while the converter reads their
special flags from tokenizer_config.json's ``added_tokens_decoder`` (transformers 4 wrote both),
and GPT-2 configs on the Hub carry ``n_ctx``, which the converter requires.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.core.export.converter_fixtures import need_converter, read_gguf_all

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "gpt2", "bert"]

_FLAGS = (
    "the studio always states whether the tokenizer adds BOS/EOS (found by running the HF tokenizer), "
    "where the converter copies only flags present in tokenizer_config.json; llama.cpp's default "
    "for a missing flag can differ from what the original tokenizer does"
)
# general.* keys are not listed: the studio derives them with the converter's own gguf-py code
# (studio.core.gguf.metadata), so they must be equal.
COMMON = {
    "quant_studio.version": "the studio's own record of the exporting version",
    "quant_studio.plan": "the studio's own record of the plan it followed",
}
EXCEPTIONS: dict[str, dict[str, str]] = {
    "llama": {"tokenizer.ggml.add_eos_token": _FLAGS},
    "mistral": {"tokenizer.ggml.add_eos_token": _FLAGS},
    "qwen2": {"tokenizer.ggml.add_eos_token": _FLAGS},
    "qwen3": {"tokenizer.ggml.add_eos_token": _FLAGS},
    "gemma": {
        "tokenizer.ggml.add_eos_token": _FLAGS,
        "gemma.rope.freq_base": "the studio writes the config's rope_theta; the converter omits it and "
        "llama.cpp assumes 10000, which is only right while the config says so",
        "tokenizer.ggml.eot_token_id": "the converter hard-codes 107, <end_of_turn> in Google's Gemma "
        "vocabulary; in any other vocabulary (this one) that id is an ordinary token",
    },
    "gemma2": {
        "tokenizer.ggml.add_eos_token": _FLAGS,
        "gemma2.rope.freq_base": "as for gemma: the config's rope_theta, stated",
    },
    "phi3": {
        "tokenizer.ggml.add_bos_token": _FLAGS,
        "tokenizer.ggml.add_eos_token": _FLAGS,
        "tokenizer.ggml.add_space_prefix": "the studio states tokenizer_config.json's add_prefix_space; "
        "the converter's Phi-3 path leaves llama.cpp's default",
    },
    "gpt2": {"tokenizer.ggml.add_bos_token": _FLAGS, "tokenizer.ggml.add_eos_token": _FLAGS},
    "bert": {
        "bert.attention.head_count_kv": "stated by the studio (equal to head_count, llama.cpp's default)",
        "bert.pooling_type": "stated by the studio from modules.json (none here: NONE, llama.cpp's "
        "default); the converter writes it only for sentence-transformers folders",
    },
}


def _hub_like(model: Path, dst: Path) -> Path:
    shutil.copytree(model, dst)
    tj = json.loads((dst / "tokenizer.json").read_text(encoding="utf-8"))
    tc_path = dst / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text(encoding="utf-8"))
    keys = ("content", "lstrip", "normalized", "rstrip", "single_word", "special")
    tc["added_tokens_decoder"] = {str(t["id"]): {k: t[k] for k in keys} for t in tj.get("added_tokens", [])}
    tc_path.write_text(json.dumps(tc, indent=1), encoding="utf-8")
    cfg_path = dst / "config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    if cfg.get("model_type") == "gpt2":
        cfg.setdefault("n_ctx", cfg["n_positions"])
        cfg_path.write_text(json.dumps(cfg, indent=1), encoding="utf-8")
    return dst


@pytest.mark.parametrize("family", FAMILIES)
def test_f32_equals_llamacpp_converter(family, request, exported, tmp_path):
    need_converter()
    from studio.core.gguf.llama_converter import reference_convert
    from studio.core.model import open_model

    model = request.getfixturevalue(f"{family}_model")
    ours = exported(model, "F32", "F32")
    # named as the original folder: both sides derive general.* names from it (gguf-py heuristics)
    with open_model(_hub_like(model, tmp_path / "ref" / Path(model).name)) as ck:
        ref = reference_convert(ck.info, tmp_path / "ref.gguf")
    kv_a, ts_a = read_gguf_all(ours)
    kv_b, ts_b = read_gguf_all(ref)
    # tensor for tensor (by name: the studio writes them block by block, as llama-quantize does)
    assert set(ts_a) == set(ts_b)
    for name, (t, shape, data) in ts_b.items():
        assert ts_a[name][:2] == (t, shape), f"{family} {name}: {ts_a[name][:2]} vs converter {(t, shape)}"
        assert ts_a[name][2] == data, f"{family} {name}: values differ from llama.cpp's converter"
    # key for key
    allowed = {**COMMON, **EXCEPTIONS[family]}
    differ = {k for k in set(kv_a) | set(kv_b) if kv_a.get(k, "<absent>") != kv_b.get(k, "<absent>")}
    unexplained = sorted(differ - set(allowed))
    assert not unexplained, f"{family}: keys differ from the converter's: " + ", ".join(
        f"{k}: ours {str(kv_a.get(k, '<absent>'))[:60]} converter {str(kv_b.get(k, '<absent>'))[:60]}"
        for k in unexplained
    )
    stale = sorted(set(allowed) - differ)
    assert not stale, f"{family}: documented exceptions that no longer occur: {stale}"
