"""``quant-studio-cli inspect`` on the architectures llama.cpp's converter maps: roles and layers of
every tensor (experts included), the expert counts, active versus total weights, and who exports it."""

from __future__ import annotations

import json
import re

import pytest

from studio.cli import main
from tests.core.export.converter_fixtures import MOE, NEW_ARCHS, need_converter, new_arch_model

# Expected roles by name after the layer prefix, written independently of the adapters.
LAYER = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "mlp.gate": "ffn_gate_inp",
    "block_sparse_moe.gate": "ffn_gate_inp",
    "mlp.experts.E.gate_proj": "ffn_gate_exps",
    "mlp.experts.E.up_proj": "ffn_up_exps",
    "mlp.experts.E.down_proj": "ffn_down_exps",
    "block_sparse_moe.experts.E.w1": "ffn_gate_exps",
    "block_sparse_moe.experts.E.w3": "ffn_up_exps",
    "block_sparse_moe.experts.E.w2": "ffn_down_exps",
}


def _expected(name: str) -> tuple[str, int | None]:
    if name in ("model.embed_tokens.weight",):
        return "token_embd", None
    if name == "lm_head.weight":
        return "output", None
    if name == "model.norm.weight":
        return "norm", None
    m = re.match(r"model\.layers\.(\d+)\.(.*)\.weight$", name)
    assert m, name
    rest = re.sub(r"experts\.\d+\.", "experts.E.", m.group(2))
    role = "norm" if rest.endswith(("norm", "layernorm")) else LAYER[rest]
    return role, int(m.group(1))


@pytest.mark.parametrize("arch", list(NEW_ARCHS))
def test_inspect_shows_roles_layers_experts(arch, tiny_model, capsys):
    need_converter()
    model = new_arch_model(tiny_model, arch)
    assert main(["inspect", str(model), "--json", "--ctx", "512"]) == 0
    r = json.loads(capsys.readouterr().out)
    for t in r["tensors"]:
        assert (t["role"], t["layer"]) == _expected(t["name"]), t["name"]
    assert r["export"] == {"via": "llama.cpp", "error": None}
    q4 = next(e for e in r["estimates"] if e["preset"] == "Q4_K_M")
    assert q4["exact"] and q4["parameters"] == r["parameters"]
    if arch in MOE:
        n = {"qwen3_moe": 4, "mixtral": 8}[arch]
        assert r["experts"] == {"per_layer": n, "used": 2}
        per_layer = r["layer_roles"]
        assert per_layer["ffn_gate_exps"] == per_layer["ffn_up_exps"] == per_layer["ffn_down_exps"] == n
        assert per_layer["ffn_gate_inp"] == 1
        expert_w = sum(
            t["bytes"] // 4 for t in r["tensors"] if t["role"].endswith("_exps")
        )  # float32 checkpoint: 4 bytes a weight
        assert q4["active_parameters"] == r["parameters"] - expert_w + expert_w * 2 // n
    else:
        assert r["experts"] is None and q4["active_parameters"] == q4["parameters"]
    main(["inspect", str(model), "--ctx", "512"])
    text = capsys.readouterr().out
    assert "GGUF export:  by llama.cpp's converter" in text and "Each layer:" in text
    if arch in MOE:
        assert f"Experts:      {r['experts']['per_layer']} per layer, 2 used per token" in text
