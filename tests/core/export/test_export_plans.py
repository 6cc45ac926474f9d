"""Mixed plans are honoured tensor by tensor, both back ends write the same bytes, the file chats."""

from __future__ import annotations

import json

import gguf
import pytest

from studio.core.export.run import export_gguf
from studio.core.gguf.layout import layout
from studio.core.gguf.read import read_gguf
from studio.core.llamacpp import LoadOptions
from studio.core.model import open_model
from studio.core.plan.plan import Override, plan_first_last


@pytest.fixture(scope="module")
def llama8(tiny_model):
    return tiny_model("llama", layers=8, intermediate=704)


def _info(model):
    with open_model(model) as ck:
        return ck.info


def _tensors(path):
    return {t.name: (t.tensor_type.name, bytes(t.data)) for t in gguf.GGUFReader(path).tensors}


def test_first_last_plan_is_honoured(llama8, tmp_path):
    info = _info(llama8)
    plan = plan_first_last(info, 1, "Q8_0", "Q4_K")
    out = export_gguf(llama8, tmp_path / "mixed.gguf", plan).path
    types = {t.name: t.type_name for t in read_gguf(out).tensors}
    checked = 0
    for tm in layout(info).tensors:
        assert types[tm.gguf_name] == plan.types[tm.hf_name], tm.gguf_name
        if tm.layer is not None and tm.gguf_name.endswith(("attn_q.weight", "ffn_gate.weight")):
            want = "Q8_0" if tm.layer in (0, 7) else "Q4_K"
            assert types[tm.gguf_name] == want, tm.gguf_name
            checked += 1
        if tm.gguf_name.endswith("ffn_down.weight") and tm.layer not in (0, 7):
            assert types[tm.gguf_name] == "Q5_0"  # rows of 704 cannot be Q4_K: llama.cpp's fallback
        if len(tm.shape) == 1:
            assert types[tm.gguf_name] == "F32"
    assert checked == 16
    meta = read_gguf(out).metadata
    saved = json.loads(meta["quant_studio.plan"])
    assert saved["version"] == 1 and saved["types"] == dict(plan.types)
    assert meta["general.file_type"] == plan.ftype


def test_backends_write_identical_tensor_bytes(llama8, tmp_path):
    info = _info(llama8)
    plan = plan_first_last(
        info,
        1,
        "Q8_0",
        "Q4_K",
        [
            Override(r"attn_v", "Q6_K"),
            Override(r"blk\.2\.", "Q2_K"),
            Override(r"blk\.3\.", "Q3_K"),
            Override(r"blk\.4\.", "Q5_K"),
            Override(r"attn_output", "Q4_0"),
            Override(r"blk\.5\.", "F16"),
        ],
    )
    assert {"Q8_0", "Q4_K", "Q6_K", "Q2_K", "Q3_K", "Q5_K", "Q4_0", "F16", "F32"} <= set(plan.types.values())
    a = export_gguf(llama8, tmp_path / "studio.gguf", plan, backend="studio")
    b = export_gguf(llama8, tmp_path / "llamacpp.gguf", plan, backend="llama.cpp")
    ta, tb = _tensors(a.path), _tensors(b.path)
    assert set(ta) == set(tb)
    for name in ta:
        assert ta[name][0] == tb[name][0], name
        assert ta[name][1] == tb[name][1], f"{name} ({ta[name][0]}) differs between back ends"
    mb = read_gguf(b.path).metadata
    assert mb["general.file_type"] == plan.ftype
    assert json.loads(mb["quant_studio.plan"])["types"] == dict(plan.types)
    # nothing but the two results is left in the folder
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llamacpp.gguf", "studio.gguf"]


@pytest.mark.parametrize("arch", ["qwen2", "llama", "gemma", "phi3"])
def test_export_chats_with_its_template(arch, request, exported, llama_worker):
    from transformers import AutoTokenizer

    model = request.getfixturevalue(f"{arch}_model")
    path = exported(model, "Q8_0", "Q8_0")
    messages = [{"role": "user", "content": "Say hello in French."}]
    want = AutoTokenizer.from_pretrained(model, trust_remote_code=False).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    llama_worker.load(path, LoadOptions(n_ctx=256, f32_kv=False))
    assert llama_worker.request("chat_prompt", messages=messages) == want
    # temperature > 0: llama-cpp-python 0.3.36's greedy path fails to decode after a token that is
    # an incomplete UTF-8 sequence (which random tiny models emit)
    r = llama_worker.request("chat", messages=messages, max_tokens=4, temperature=0.8, seed=1)
    assert r["choices"][0]["message"]["role"] == "assistant"
    assert r["usage"]["completion_tokens"] >= 1


def test_imatrix_backends_identical_and_types_follow_llamacpp(llama8, exported, llama_worker, tmp_path):
    import numpy as np

    from studio.core.plan.plan import plan_from_preset
    from studio.core.plan.presets import allows_quantization, preset_types

    info = _info(llama8)
    rng = np.random.default_rng(1)
    imatrix = {
        tm.hf_name: rng.uniform(0.1, 4.0, tm.n_per_row).astype(np.float32)
        for tm in layout(info).tensors
        if allows_quantization(tm.gguf_name, len(tm.shape))
    }
    # with an imatrix llama.cpp's Q4_0 keeps the first ffn_down layers at Q4_1: so do we
    f32 = exported(llama8, "F32", "F32")
    by_gguf = {tm.gguf_name: imatrix[tm.hf_name] for tm in layout(info).tensors if tm.hf_name in imatrix}
    ref = tmp_path / "ref.gguf"
    llama_worker.request("quantize", src=str(f32), dst=str(ref), ftype=2, imatrix=by_gguf, nthread=1)
    want = {t.name: t.tensor_type.name for t in gguf.GGUFReader(ref).tensors}
    to_gguf = {t.hf_name: t.gguf_name for t in layout(info).tensors}
    ours = {to_gguf[k]: v for k, v in preset_types(info, "Q4_0", imatrix=True).items()}
    assert ours == {k: want[k] for k in ours}
    assert ours["blk.0.ffn_down.weight"] == "Q4_1"
    # and both back ends quantize with the imatrix to the same bytes
    plan = plan_from_preset(info, "Q4_K_M", imatrix=True)
    a = export_gguf(llama8, tmp_path / "a.gguf", plan, imatrix=imatrix)
    b = export_gguf(llama8, tmp_path / "b.gguf", plan, imatrix=imatrix, backend="llama.cpp")
    plain = export_gguf(llama8, tmp_path / "plain.gguf", plan)
    ta, tb, tp = _tensors(a.path), _tensors(b.path), _tensors(plain.path)
    for name in ta:
        assert ta[name] == tb[name], f"{name} differs between back ends with an imatrix"
    assert ta["blk.1.attn_q.weight"] != tp["blk.1.attn_q.weight"]  # the imatrix changed the Q4_K blocks


def _gpu() -> str | None:
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return None


@pytest.mark.skipif(_gpu() is None, reason="needs a CUDA or MPS device")
def test_gpu_export_writes_the_cpu_bytes(llama_model, exported, tmp_path):
    cpu = exported(llama_model, "Q4_K_M", "Q4_K_M")
    gpu = export_gguf(llama_model, tmp_path / "gpu.gguf", "Q4_K_M", device=_gpu())
    assert _tensors(gpu.path) == _tensors(cpu)


def test_unavailable_device_is_refused(llama_model, tmp_path):
    from studio.core.errors import ExportError

    if _gpu() == "cuda":
        pytest.skip("CUDA is available here")
    with pytest.raises(ExportError, match="no CUDA device"):
        export_gguf(llama_model, tmp_path / "m.gguf", "Q8_0", device="cuda")
    assert list(tmp_path.iterdir()) == []


def test_export_from_the_hub_cache_records_the_source_repo(llama_model, tmp_path) -> None:
    """A model opened from a Hub cache snapshot writes general.source.repo_url; a plain folder does not."""
    import shutil

    import gguf

    from studio.core.export.run import export_gguf

    snap = tmp_path / "hub" / "models--tiny-org--tiny-llama" / "snapshots" / ("a" * 40)
    shutil.copytree(llama_model, snap)
    out = tmp_path / "from-hub.gguf"
    export_gguf(snap, out, "Q8_0")
    fields = gguf.GGUFReader(out).fields
    url = fields["general.source.repo_url"]
    assert bytes(url.parts[url.data[0]]).decode() == "https://huggingface.co/tiny-org/tiny-llama"

    plain = tmp_path / "plain.gguf"
    export_gguf(llama_model, plain, "Q8_0")
    assert "general.source.repo_url" not in gguf.GGUFReader(plain).fields
