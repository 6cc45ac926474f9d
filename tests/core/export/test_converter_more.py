"""Around the converter: an architecture nobody knows, one only the converter knows, the expert map
calibration uses, and estimates that count every expert."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from studio.core.errors import ExportError
from studio.core.llamacpp import LoadOptions
from tests.core.export.converter_fixtures import need_converter, new_arch_model


def _renamed(src: Path, dst: Path, model_type: str, arch: str) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text(encoding="utf-8"))
    cfg.update(model_type=model_type, architectures=[arch])
    (dst / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return dst


def _one_sentence(text: str) -> bool:
    return text.endswith(".") and ". " not in text and "\n" not in text


@pytest.mark.parametrize("installed", [True, False])
def test_unknown_architecture_gives_one_sentence_naming_it(installed, tiny_model, tmp_path, monkeypatch):
    from studio.core.export.run import export_gguf
    from studio.core.gguf import converter_bundle

    if installed:
        need_converter()
    else:
        monkeypatch.setenv(converter_bundle.ENV_VAR, str(tmp_path / "no-converter"))
    model = _renamed(new_arch_model(tiny_model, "olmo2"), tmp_path / "m", "foo_lm", "FooLMForCausalLM")
    with pytest.raises(ExportError) as e:
        export_gguf(model, tmp_path / "out.gguf", "Q4_K_M")
    msg = str(e.value)
    assert "FooLMForCausalLM" in msg and "'foo_lm'" in msg and _one_sentence(msg), msg
    assert ("Neither Quant Studio nor llama.cpp's converter" in msg) if installed else ("install.sh" in msg)
    assert not list(tmp_path.glob("out.gguf*"))


def _starcoder2(folder: Path) -> Path:
    """A tiny StarCoder2 (an architecture only llama.cpp's converter maps) with a trained tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from studio.core.factory import build_tokenizer

    tok, _, _ = build_tokenizer("gpt2")
    cfg = AutoConfig.for_model(
        "starcoder2", hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        intermediate_size=256, vocab_size=len(tok), max_position_embeddings=512,
        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(cfg, trust_remote_code=False)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def test_an_architecture_only_the_converter_knows(tmp_path, llama_worker):
    """Roles from the converter's tensor map; the F32 export computes what transformers computes."""
    need_converter()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from studio.core.export.run import export_gguf
    from studio.core.model import open_model
    from studio.core.modelinfo import Role

    model = _starcoder2(tmp_path / "sc2")
    with open_model(model) as ck:
        roles = {t.name: t.role for t in ck.info.tensors}
        assert not ck.info.warnings
    assert Role.UNKNOWN not in roles.values()
    assert roles["model.layers.1.self_attn.q_proj.weight"] is Role.ATTN_Q
    assert roles["model.layers.0.mlp.c_fc.weight"] is Role.FFN_UP
    assert roles["model.layers.0.mlp.c_proj.bias"] is Role.FFN_DOWN
    r = export_gguf(model, tmp_path / "sc2.gguf", "F32")
    assert r.tensor_types["blk.0.ffn_up.weight"] == "F32"
    ids = AutoTokenizer.from_pretrained(model)("def hello(world): return world * 2  # a comment " * 3)[
        "input_ids"
    ]
    llama_worker.load(r.path, LoadOptions(logits_all=True, n_ctx=256, f32_kv=True))
    got = llama_worker.request("eval_logits", ids=ids)
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32, trust_remote_code=False)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].numpy()
    assert float(np.abs(got - ref).max()) <= 1e-3 * float(ref.max() - ref.min())


def test_expert_layout_names_every_expert(tiny_model):
    need_converter()
    from studio.core.model import open_model
    from studio.core.model.experts import expert_layout, merge_expert_imatrix
    from studio.core.modelinfo import Role

    with open_model(new_arch_model(tiny_model, "mixtral")) as ck:
        info = ck.info
    ex = expert_layout(info)
    assert ex is not None and (ex.n_experts, ex.n_used) == (8, 2)
    assert {t.role for t in ex.in_layer(1)} == {Role.FFN_GATE_EXPS, Role.FFN_UP_EXPS, Role.FFN_DOWN_EXPS}
    t, e = ex.expert_of("model.layers.1.block_sparse_moe.experts.5.w2.weight")
    assert (t.gguf_name, e, t.role) == ("blk.1.ffn_down_exps.weight", 5, Role.FFN_DOWN_EXPS)
    assert t.sources[5] == "model.layers.1.block_sparse_moe.experts.5.w2.weight"
    assert (t.n_experts, t.rows, t.n_per_row) == (8, 256, 256)  # hidden 256, expert width 256
    assert ex.routers == {
        0: "model.layers.0.block_sparse_moe.gate.weight",
        1: "model.layers.1.block_sparse_moe.gate.weight",
    }
    assert ex.expert_of("model.layers.0.self_attn.q_proj.weight") is None
    # per-expert Σx² and token counts → llama-imatrix's per-merged-tensor entry
    down = ex.in_layer(0)[[x.role for x in ex.in_layer(0)].index(Role.FFN_DOWN_EXPS)]
    stats = {name: (np.full(down.n_per_row, 2.0 * (e + 1)), 2 * e) for e, name in enumerate(down.sources)}
    entry = merge_expert_imatrix(ex, stats)[down.gguf_name]
    assert entry.in_sum2.shape == (8, down.n_per_row) and entry.counts.tolist() == [2 * e for e in range(8)]
    mean = entry.mean()
    assert np.all(mean[0] == 1.0)  # expert 0 saw no token: neutral weights
    assert np.allclose(mean[3], 8.0 / 6.0)
    with open_model(tiny_model("llama")) as ck:
        assert expert_layout(ck.info) is None  # dense


def test_moe_estimates_count_every_expert_and_the_active_share(tiny_model, exported):
    need_converter()
    from studio.core.gguf.layout import layout
    from studio.core.gguf.read import read_gguf
    from studio.core.hardware import HardwareInfo
    from studio.core.model import open_model
    from studio.core.plan.estimate import estimate_preset

    model = new_arch_model(tiny_model, "mixtral")
    with open_model(model) as ck:
        info = ck.info
    hw = HardwareInfo("cpu", 4, 64 << 30, 32 << 30)
    est = estimate_preset(info, "Q4_K_M", hw, ctx_len=512)
    written = read_gguf(exported(model, "Q4_K_M", "Q4_K_M"))
    assert est.exact and est.tensor_bytes == sum(t.nbytes for t in written.tensors)
    lay = layout(info)
    experts = sum(int(np.prod(t.shape)) for t in lay.tensors if t.n_experts)
    assert est.n_params == sum(int(np.prod(t.shape)) for t in lay.tensors) == info.parameters
    assert (est.n_experts, est.n_experts_used) == (8, 2)
    assert est.n_active_params == est.n_params - experts + experts * 2 // 8


def test_sliding_window_layers_keep_a_smaller_kv_cache():
    from studio.core.plan.estimate import kv_cache_bytes, kv_cells, sliding_layers

    cfg = {
        "model_type": "gemma3_text", "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 64, "sliding_window": 1024,
    }  # fmt: skip
    # llama.cpp's Gemma 3 pattern: every 6th layer global, the others local
    assert sliding_layers(cfg, 12) == tuple((i + 1) % 6 != 0 for i in range(12))
    # local layers: pad256(min(ctx, window + 512)) cells (llama-kv-cache-iswa.cpp), global: ctx
    assert kv_cells(cfg, 6, 32768) == (1536,) * 5 + (32768,)
    assert kv_cells(cfg, 6, 1000) == (1024,) * 5 + (1000,)
    assert kv_cache_bytes(cfg, 6, 32768) == (5 * 1536 + 32768) * 2 * 2 * 64 * 2
    listed = dict(cfg, layer_types=["sliding_attention", "full_attention"] * 3)
    assert kv_cells(listed, 6, 32768) == (1536, 32768) * 3
    dense = {k: v for k, v in cfg.items() if k != "sliding_window"}
    assert kv_cache_bytes(dense, 6, 32768) == 6 * 32768 * 2 * 2 * 64 * 2


def test_custom_tokenizer_code_is_never_run(tiny_model, tmp_path):
    """Some of the converter's tokenizer paths pass trust_remote_code=True: refused up front (FAULTS 8)."""
    need_converter()
    from studio.core.errors import RemoteCodeError
    from studio.core.export.run import export_gguf

    model = tmp_path / "m"
    shutil.copytree(new_arch_model(tiny_model, "olmo2"), model)
    canary = tmp_path / "canary"
    (model / "tok.py").write_text(f"open({str(canary)!r}, 'w').write('ran')\n", encoding="utf-8")
    tc = json.loads((model / "tokenizer_config.json").read_text(encoding="utf-8"))
    tc["auto_map"] = {"AutoTokenizer": ["tok.Tok", None]}
    (model / "tokenizer_config.json").write_text(json.dumps(tc), encoding="utf-8")
    with pytest.raises(RemoteCodeError, match="auto_map"):
        export_gguf(model, tmp_path / "out.gguf", "F32")
    assert not canary.exists() and not list(tmp_path.glob("out.gguf*"))


def test_a_hub_moe_config_is_estimated_with_all_its_experts():
    """Qwen3-30B-A3B's config alone (as the Hub panel has it): "30.5B in total and 3.3B activated"
    (its model card), every expert in the file size."""
    from studio.core.hardware import HardwareInfo
    from studio.core.plan.estimate import estimate_from_config

    cfg = dict(
        model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], hidden_size=2048,
        num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        vocab_size=151936, intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
        num_experts_per_tok=8, tie_word_embeddings=False,
    )  # fmt: skip
    est = {
        e.preset: e
        for e in estimate_from_config(cfg, 30_532_122_624, HardwareInfo("cpu", 8, 64 << 30, 48 << 30))
    }
    q4 = est["Q4_K_M"]
    assert abs(q4.n_params / 30.5e9 - 1) < 0.01 and abs(q4.n_active_params / 3.3e9 - 1) < 0.03
    assert (q4.n_experts, q4.n_experts_used) == (128, 8)
    assert est["F16"].tensor_bytes == pytest.approx(2 * q4.n_params, rel=0.01)
    assert 4.7 < q4.bits_per_weight < 5.0
