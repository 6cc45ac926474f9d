"""``quant-studio-cli inspect`` on every factory model, checked against safetensors' own headers and an
independent per-tensor type choice; every bad input gives one line and exit status 2."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from studio.cli import main
from studio.core.modelinfo import Role
from studio.core.plan.estimate import LOW_BIT_PRESETS

R = Role
MODELS = [
    "llama_model",
    "mistral_model",
    "qwen2_model",
    "qwen3_model",
    "gemma_model",
    "gemma2_model",
    "phi3_model",
    "gpt2_model",
    "bert_model",
    "sharded_llama_model",
    "odd_hidden_model",
]

# Expected roles by name (after the layer prefix), written independently of the adapters.
DECODER_LAYER = {
    "self_attn.q_proj": R.ATTN_Q,
    "self_attn.k_proj": R.ATTN_K,
    "self_attn.v_proj": R.ATTN_V,
    "self_attn.qkv_proj": R.ATTN_QKV,
    "self_attn.o_proj": R.ATTN_OUT,
    "self_attn.q_norm": R.NORM,
    "self_attn.k_norm": R.NORM,
    "mlp.gate_proj": R.FFN_GATE,
    "mlp.up_proj": R.FFN_UP,
    "mlp.gate_up_proj": R.FFN_GATE_UP,
    "mlp.down_proj": R.FFN_DOWN,
    "input_layernorm": R.NORM,
    "post_attention_layernorm": R.NORM,
    "pre_feedforward_layernorm": R.NORM,
    "post_feedforward_layernorm": R.NORM,
}
DECODER_TOP = {"model.embed_tokens": R.TOKEN_EMBD, "model.norm": R.NORM, "lm_head": R.OUTPUT}
GPT2_LAYER = {
    "ln_1": R.NORM,
    "ln_2": R.NORM,
    "attn.c_attn": R.ATTN_QKV,
    "attn.c_proj": R.ATTN_OUT,
    "mlp.c_fc": R.FFN_UP,
    "mlp.c_proj": R.FFN_DOWN,
}
GPT2_TOP = {"wte": R.TOKEN_EMBD, "wpe": R.POS_EMBD, "ln_f": R.NORM, "lm_head": R.OUTPUT}
BERT_LAYER = {
    "attention.self.query": R.ATTN_Q,
    "attention.self.key": R.ATTN_K,
    "attention.self.value": R.ATTN_V,
    "attention.output.dense": R.ATTN_OUT,
    "attention.output.LayerNorm": R.NORM,
    "intermediate.dense": R.FFN_UP,
    "output.dense": R.FFN_DOWN,
    "output.LayerNorm": R.NORM,
}
BERT_TOP = {
    "embeddings.word_embeddings": R.TOKEN_EMBD,
    "embeddings.position_embeddings": R.POS_EMBD,
    "embeddings.token_type_embeddings": R.TYPE_EMBD,
    "embeddings.LayerNorm": R.NORM,
    "embeddings.position_ids": R.OTHER,
    "pooler.dense": R.OTHER,
}


def expected_role(model_type: str, name: str) -> tuple[Role, int | None]:
    if model_type == "gpt2":
        layer_map, top, prefix = GPT2_LAYER, GPT2_TOP, r"(?:transformer\.)?h\.(\d+)\."
        name = name.removeprefix("transformer.") if not name.startswith("transformer.h.") else name
    elif model_type == "bert":
        layer_map, top, prefix = BERT_LAYER, BERT_TOP, r"encoder\.layer\.(\d+)\."
        name = name.removeprefix("bert.")
    else:
        layer_map, top, prefix = DECODER_LAYER, DECODER_TOP, r"model\.layers\.(\d+)\."
    base = re.sub(r"\.(weight|bias)$", "", name)
    m = re.match(prefix, name)
    if m:
        return layer_map[re.sub(prefix, "", base)], int(m.group(1))
    return top[base], None


# ---------------------------------------------------------------- independent llama.cpp type choice

BLOCKS = {
    "F32": (1, 4),
    "F16": (1, 2),
    "Q8_0": (32, 34),
    "Q5_0": (32, 22),
    "Q4_K": (256, 144),
    "Q6_K": (256, 210),
}


def _more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def exported(model_type: str, config: dict, names: set[str], name: str) -> bool:
    """Whether llama.cpp's converter writes this tensor (buffers, BERT pooler, tied lm_head are dropped)."""
    n = name.removeprefix("bert.")
    if n.endswith(("position_ids", "inv_freq", ".attn.bias", ".attn.masked_bias")) or n.startswith("pooler."):
        return False
    if n == "lm_head.weight":
        tied = config.get("tie_word_embeddings", model_type in ("gemma", "gemma2", "gpt2"))
        return not (model_type in ("gemma", "gemma2", "gpt2") or tied)
    return True


def choose(
    role: Role, shape: list[int], row: int, layer: int | None, n_layers: int, preset: str, has_out: bool
) -> str:
    if len(shape) < 2 or role in (R.NORM, R.POS_EMBD, R.TYPE_EMBD):
        return "F32"
    base = {"Q8_0": "Q8_0", "Q4_K_M": "Q4_K"}[preset]
    typ = base
    if role is R.OUTPUT or (role is R.TOKEN_EMBD and not has_out):
        typ = "Q8_0" if row % BLOCKS[base][0] else ("Q8_0" if base == "Q8_0" else "Q6_K")
    elif preset == "Q4_K_M" and role in (R.ATTN_V, R.ATTN_QKV, R.FFN_DOWN) and _more_bits(layer, n_layers):
        typ = "Q6_K"
    if row % BLOCKS[typ][0]:
        typ = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}[typ]
    return typ


def header_listing(folder: Path) -> dict[str, tuple[list[int], str, Path]]:
    """name -> (shape, dtype, file) as safetensors itself reads the headers."""
    from safetensors import safe_open

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="numpy") as h:
            for k in h.keys():
                sl = h.get_slice(k)
                out[k] = (list(sl.get_shape()), sl.get_dtype(), f)
    return out


def run_json(capsys, *args: str) -> dict:
    assert main(["inspect", *args, "--json"]) == 0
    out = capsys.readouterr().out
    return json.loads(out)


@pytest.mark.parametrize("fixture", MODELS)
def test_inspect_json_on_factory_models(fixture, request, capsys):
    folder: Path = request.getfixturevalue(fixture)
    config = json.loads((folder / "config.json").read_text())
    mt = config["model_type"]
    r = run_json(capsys, str(folder))
    listing = header_listing(folder)

    # every tensor of the safetensors files, with shape, dtype, role and layer
    assert {t["name"] for t in r["tensors"]} == set(listing)
    for t in r["tensors"]:
        shape, dtype, _ = listing[t["name"]]
        assert t["shape"] == shape and t["dtype"] == dtype, t["name"]
        role, layer = expected_role(mt, t["name"])
        assert (t["role"], t["layer"]) == (role.value, layer), t["name"]
    assert r["architecture"] == config["architectures"][0]
    assert r["layers"] == config.get("num_hidden_layers", config.get("n_layer"))
    n_elements = sum(_prod(s) for s, _, _ in listing.values())
    assert r["parameters"] == n_elements

    # Q8_0 and Q4_K_M sizes against an independent block-size computation
    n_layers = r["layers"]
    names = set(listing)
    keep = {n for n in names if exported(mt, config, names, n)}
    has_out = any(expected_role(mt, n)[0] is R.OUTPUT for n in keep)
    est = {e["preset"]: e for e in r["estimates"]}
    for preset in ("Q8_0", "Q4_K_M"):
        want = 0
        for n in keep:
            shape = listing[n][0]
            role, layer = expected_role(mt, n)
            conv1d = mt == "gpt2" and len(shape) == 2 and role not in (R.TOKEN_EMBD, R.POS_EMBD, R.OUTPUT)
            row = shape[0] if conv1d else (shape[-1] if shape else 1)
            typ = choose(role, shape, row, layer, n_layers, preset, has_out)
            block, size = BLOCKS[typ]
            want += _prod(shape) // block * size
        assert est[preset]["tensor_bytes"] == want, (fixture, preset)
        assert 0 <= est[preset]["file_bytes"] - want <= 64 * 1024, (fixture, preset)
    assert [e["preset"] for e in r["estimates"]] == [
        "F16",
        "Q8_0",
        "Q6_K",
        "Q5_K_M",
        "Q4_K_M",
        "Q4_0",
        "Q3_K_M",
        "Q2_K",
        *LOW_BIT_PRESETS,
    ]
    for e in r["estimates"]:
        assert e["verdict"] in ("fits on the GPU", "fits with partial offload", "CPU only", "does not fit")
        assert e["memory_bytes"] > e["tensor_bytes"]


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def test_inspect_text_summary(llama_model, capsys):
    assert main(["inspect", str(llama_model), "--ctx", "2048"]) == 0
    out = capsys.readouterr().out
    assert "Architecture: LlamaForCausalLM" in out and "2 layers" in out
    assert re.search(r"Parameters:\s+[\d,]+", out)
    assert "attn_v" in out and "ffn_down" in out
    assert "context 2048" in out
    for preset in ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K"):
        assert re.search(rf"^\s+{preset}\s+[\d.]+ MB", out, re.M), preset


def test_ctx_changes_memory_not_file(llama_model, capsys):
    a = run_json(capsys, str(llama_model), "--ctx", "1024")
    b = run_json(capsys, str(llama_model), "--ctx", "8192")
    for ea, eb in zip(a["estimates"], b["estimates"], strict=True):
        assert ea["file_bytes"] == eb["file_bytes"]
        assert eb["memory_bytes"] - ea["memory_bytes"] == eb["kv_bytes"] - ea["kv_bytes"] > 0


# ------------------------------------------------------------------------------------ bad inputs


def _bad_inputs(tmp: Path, llama: Path) -> dict[str, tuple[Path, str]]:
    import shutil

    cases: dict[str, tuple[Path, str]] = {}
    empty = tmp / "empty"
    empty.mkdir()
    cases["empty folder"] = (empty, "empty")

    cfg_only = tmp / "cfg_only"
    cfg_only.mkdir()
    shutil.copy(llama / "config.json", cfg_only / "config.json")
    cases["config without weights"] = (cfg_only, "no weights")

    trunc = tmp / "trunc"
    shutil.copytree(llama, trunc)
    st = trunc / "model.safetensors"
    with open(st, "r+b") as f:
        f.truncate(st.stat().st_size // 2)
    cases["truncated safetensors"] = (trunc, "incomplete")

    lying = tmp / "lying"
    shutil.copytree(llama, lying)
    st = lying / "model.safetensors"
    raw = bytearray(st.read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    first = next(k for k in header if k != "__metadata__")
    header[first]["data_offsets"][1] += 64  # overlaps the next tensor
    text = json.dumps(header).encode()
    text += b" " * (n - len(text)) if len(text) <= n else b""
    st.write_bytes(struct.pack("<Q", len(text)) + text + bytes(raw[8 + n :]))
    cases["lying offsets"] = (lying, "not a valid safetensors file")

    remote = tmp / "remote"
    shutil.copytree(llama, remote)
    cfg = json.loads((remote / "config.json").read_text())
    cfg.update(
        model_type="evil_custom",
        architectures=["EvilForCausalLM"],
        auto_map={"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"},
    )
    (remote / "config.json").write_text(json.dumps(cfg))
    cases["remote code"] = (remote, "custom Python code")

    text_gguf = tmp / "notes.gguf"
    text_gguf.write_text("this is a text file\n")
    cases["text file named .gguf"] = (text_gguf, "not a GGUF file")

    bomb = tmp / "bomb.gguf"
    bomb.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2**60, 0) + b"\0" * 20)
    cases["GGUF claiming 2^60 tensors"] = (bomb, "more than its 44 bytes can hold")
    return cases


def test_each_bad_input_is_one_line_and_exit_2(tmp_path, llama_model, capsys):
    for what, (path, phrase) in _bad_inputs(tmp_path, llama_model).items():
        code = main(["inspect", str(path)])
        err = capsys.readouterr().err
        assert code == 2, what
        lines = err.strip().splitlines()
        assert len(lines) == 1, (what, err)
        assert lines[0].startswith("error: ") and phrase in lines[0], (what, lines[0])
        assert path.name in lines[0] or "https://" in lines[0] or str(path) in lines[0], (what, lines[0])
        assert "Traceback" not in err


def test_real_process_exit_status(tmp_path):
    bomb = tmp_path / "bomb.gguf"
    bomb.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2**60, 0) + b"\0" * 20)
    out = subprocess.run(
        [sys.executable, "-m", "studio.cli", "inspect", str(bomb), "--json"], capture_output=True, text=True
    )
    assert out.returncode == 2
    assert out.stdout == "" and out.stderr.count("\n") == 1 and "bomb.gguf" in out.stderr


def test_output_into_a_closed_pipe_is_no_traceback(llama_model) -> None:
    """`inspect MODEL | true` ends quietly although the reader closed the pipe before any output."""
    import subprocess
    import sys

    cmd = f'"{sys.executable}" -m studio.cli inspect "{llama_model}" | true'
    out = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert "Traceback" not in out.stderr, out.stderr
