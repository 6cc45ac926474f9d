"""Architecture adapters: role and layer of real tensor names of each supported family."""

from __future__ import annotations

import pytest

from studio.core.model.adapters import adapter_for, gguf_adapter, parse_layer
from studio.core.modelinfo import Role

R = Role

CASES = {
    "llama": [
        ("model.embed_tokens.weight", R.TOKEN_EMBD, None),
        ("model.layers.0.self_attn.q_proj.weight", R.ATTN_Q, 0),
        ("model.layers.11.self_attn.k_proj.weight", R.ATTN_K, 11),
        ("model.layers.3.self_attn.v_proj.weight", R.ATTN_V, 3),
        ("model.layers.3.self_attn.o_proj.weight", R.ATTN_OUT, 3),
        ("model.layers.3.mlp.gate_proj.weight", R.FFN_GATE, 3),
        ("model.layers.3.mlp.up_proj.weight", R.FFN_UP, 3),
        ("model.layers.3.mlp.down_proj.weight", R.FFN_DOWN, 3),
        ("model.layers.3.input_layernorm.weight", R.NORM, 3),
        ("model.layers.3.post_attention_layernorm.weight", R.NORM, 3),
        ("model.layers.3.self_attn.rotary_emb.inv_freq", R.OTHER, 3),
        ("model.norm.weight", R.NORM, None),
        ("lm_head.weight", R.OUTPUT, None),
    ],
    "qwen2": [
        ("model.layers.1.self_attn.q_proj.bias", R.ATTN_Q, 1),
        ("model.layers.1.self_attn.k_proj.bias", R.ATTN_K, 1),
        ("model.layers.1.self_attn.v_proj.bias", R.ATTN_V, 1),
    ],
    "qwen3": [
        ("model.layers.2.self_attn.q_norm.weight", R.NORM, 2),
        ("model.layers.2.self_attn.k_norm.weight", R.NORM, 2),
        ("model.layers.2.self_attn.q_proj.weight", R.ATTN_Q, 2),
    ],
    "gemma2": [
        ("model.layers.0.pre_feedforward_layernorm.weight", R.NORM, 0),
        ("model.layers.0.post_feedforward_layernorm.weight", R.NORM, 0),
        ("model.layers.0.mlp.gate_proj.weight", R.FFN_GATE, 0),
    ],
    "gemma": [("model.embed_tokens.weight", R.TOKEN_EMBD, None)],
    "mistral": [("model.layers.5.self_attn.v_proj.weight", R.ATTN_V, 5)],
    "phi3": [
        ("model.layers.0.self_attn.qkv_proj.weight", R.ATTN_QKV, 0),
        ("model.layers.0.self_attn.o_proj.weight", R.ATTN_OUT, 0),
        ("model.layers.0.mlp.gate_up_proj.weight", R.FFN_GATE_UP, 0),
        ("model.layers.0.mlp.down_proj.weight", R.FFN_DOWN, 0),
        ("model.norm.weight", R.NORM, None),
    ],
    "gpt2": [
        ("transformer.wte.weight", R.TOKEN_EMBD, None),
        ("wte.weight", R.TOKEN_EMBD, None),
        ("transformer.wpe.weight", R.POS_EMBD, None),
        ("transformer.h.0.ln_1.weight", R.NORM, 0),
        ("transformer.h.0.attn.c_attn.weight", R.ATTN_QKV, 0),
        ("transformer.h.0.attn.c_attn.bias", R.ATTN_QKV, 0),
        ("transformer.h.0.attn.c_proj.weight", R.ATTN_OUT, 0),
        ("transformer.h.0.attn.bias", R.OTHER, 0),
        ("transformer.h.10.ln_2.bias", R.NORM, 10),
        ("transformer.h.10.mlp.c_fc.weight", R.FFN_UP, 10),
        ("transformer.h.10.mlp.c_proj.weight", R.FFN_DOWN, 10),
        ("transformer.ln_f.weight", R.NORM, None),
        ("lm_head.weight", R.OUTPUT, None),
    ],
    "bert": [
        ("embeddings.word_embeddings.weight", R.TOKEN_EMBD, None),
        ("bert.embeddings.word_embeddings.weight", R.TOKEN_EMBD, None),
        ("embeddings.position_embeddings.weight", R.POS_EMBD, None),
        ("embeddings.token_type_embeddings.weight", R.TYPE_EMBD, None),
        ("embeddings.LayerNorm.weight", R.NORM, None),
        ("embeddings.position_ids", R.OTHER, None),
        ("encoder.layer.0.attention.self.query.weight", R.ATTN_Q, 0),
        ("encoder.layer.0.attention.self.key.bias", R.ATTN_K, 0),
        ("encoder.layer.0.attention.self.value.weight", R.ATTN_V, 0),
        ("encoder.layer.0.attention.output.dense.weight", R.ATTN_OUT, 0),
        ("encoder.layer.0.attention.output.LayerNorm.weight", R.NORM, 0),
        ("encoder.layer.5.intermediate.dense.weight", R.FFN_UP, 5),
        ("encoder.layer.5.output.dense.weight", R.FFN_DOWN, 5),
        ("encoder.layer.5.output.LayerNorm.bias", R.NORM, 5),
        ("pooler.dense.weight", R.OTHER, None),
    ],
}


@pytest.mark.parametrize(
    "model_type,name,role,layer",
    [(mt, n, r, layer) for mt, rows in CASES.items() for n, r, layer in rows],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_roles(model_type, name, role, layer):
    a = adapter_for(model_type)
    assert a.role(name) is role
    assert parse_layer(name) == layer


def test_architecture_name_fallback():
    assert adapter_for("", "Qwen2ForCausalLM").role("model.layers.0.mlp.up_proj.weight") is R.FFN_UP
    assert adapter_for("", "GPT2LMHeadModel").role("transformer.h.0.attn.c_attn.weight") is R.ATTN_QKV


def test_gpt2_conv1d_weights_are_flagged_transposed():
    a = adapter_for("gpt2")
    assert a.is_transposed("transformer.h.0.attn.c_attn.weight")
    assert a.is_transposed("transformer.h.0.mlp.c_proj.weight")
    assert not a.is_transposed("transformer.h.0.attn.c_attn.bias")
    assert not a.is_transposed("transformer.wte.weight")
    assert not adapter_for("llama").is_transposed("model.layers.0.self_attn.q_proj.weight")


@pytest.mark.parametrize(
    "name,role,layer",
    [
        ("token_embd.weight", R.TOKEN_EMBD, None),
        ("position_embd.weight", R.POS_EMBD, None),
        ("token_types.weight", R.TYPE_EMBD, None),
        ("blk.0.attn_norm.weight", R.NORM, 0),
        ("blk.0.attn_q.weight", R.ATTN_Q, 0),
        ("blk.0.attn_q_norm.weight", R.NORM, 0),
        ("blk.1.attn_k.bias", R.ATTN_K, 1),
        ("blk.1.attn_v.weight", R.ATTN_V, 1),
        ("blk.1.attn_qkv.weight", R.ATTN_QKV, 1),
        ("blk.12.attn_output.weight", R.ATTN_OUT, 12),
        ("blk.12.attn_output_norm.weight", R.NORM, 12),
        ("blk.2.ffn_gate.weight", R.FFN_GATE, 2),
        ("blk.2.ffn_up.weight", R.FFN_UP, 2),
        ("blk.2.ffn_down.weight", R.FFN_DOWN, 2),
        ("blk.2.ffn_norm.weight", R.NORM, 2),
        ("output_norm.weight", R.NORM, None),
        ("output.weight", R.OUTPUT, None),
        ("rope_freqs.weight", R.OTHER, None),
    ],
)
def test_gguf_roles(name, role, layer):
    assert gguf_adapter().role(name) is role
    assert parse_layer(name) == layer


def test_unknown_family_marks_only_obvious_roles():
    a = adapter_for("rwkv9", "Rwkv9ForCausalLM")
    assert a.role("rwkv.blocks.0.attention.key.weight") is R.UNKNOWN
    assert a.role("rwkv.blocks.0.ln1.weight") is R.UNKNOWN  # not obviously a norm by our rules
    assert a.role("rwkv.blocks.0.pre_norm.weight") is R.NORM
    assert a.role("lm_head.weight") is R.OUTPUT
    assert parse_layer("rwkv.blocks.7.attention.key.weight") == 7
