"""Architectures only llama.cpp's converter maps (Gemma 3, Qwen3-MoE, Mixtral, OLMo 2, Granite,
SmolLM3): exported through the converter into the studio's plan, quantizers and writer, their F32
files compute what transformers computes, equal the converter's own output, and Q4_K_M runs."""

from __future__ import annotations

import numpy as np
import pytest

from studio.core.llamacpp import LoadOptions
from tests.core.export.converter_fixtures import MOE, NEW_ARCHS, need_converter, new_arch_model, read_gguf_all

TEXT = "Hello, world! Grüße aus Köln. Привет, мир! 你好，世界。 こんにちは 🌍🚀👍🏽 naïve café 12345 " * 2
# the keys the studio adds (module docstring of studio.core.gguf.llama_converter)
STUDIO_KEYS = {"quant_studio.version", "quant_studio.plan"}


@pytest.fixture(autouse=True)
def _converter() -> None:
    need_converter()


def _ids(model) -> list[int]:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model, trust_remote_code=False)(TEXT)["input_ids"]


def _reference_logits(model, ids: list[int]) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(
        model, dtype=torch.float32, trust_remote_code=False, attn_implementation="eager"
    )
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].numpy()


@pytest.mark.parametrize("arch", list(NEW_ARCHS))
def test_f32_logits_match_transformers(arch, tiny_model, exported, llama_worker):
    model = new_arch_model(tiny_model, arch)
    gguf_path = exported(model, "F32", "F32")
    ids = _ids(model)
    assert len(ids) > 64  # longer than Gemma 3's sliding window
    llama_worker.load(gguf_path, LoadOptions(logits_all=True, n_ctx=256, f32_kv=True))
    got = llama_worker.request("eval_logits", ids=ids)
    ref = _reference_logits(model, ids)
    assert got.shape == ref.shape
    rel = float(np.abs(got - ref).max()) / float(ref.max() - ref.min())
    # routing picks the top experts: a near tie may flip under float noise, hence MoE's looser bound
    assert rel <= (2e-2 if arch in MOE else 1e-3), f"{arch}: max |Δlogit| is {rel:.3g} of the logit range"


@pytest.mark.parametrize("arch", list(NEW_ARCHS))
def test_f32_file_equals_the_converters_own(arch, tiny_model, exported, tmp_path):
    from studio.core.gguf.llama_converter import reference_convert
    from studio.core.model import open_model

    model = new_arch_model(tiny_model, arch)
    ours = exported(model, "F32", "F32")
    with open_model(model) as ck:
        ref = reference_convert(ck.info, tmp_path / "ref.gguf")
    kv_a, ts_a = read_gguf_all(ours)
    kv_b, ts_b = read_gguf_all(ref)
    assert list(ts_a) == list(ts_b)  # same tensors, in the converter's order
    for name, (t, shape, data) in ts_b.items():
        assert ts_a[name][:2] == (t, shape), name
        assert ts_a[name][2] == data, f"{name}: values differ from llama.cpp's converter"
    assert set(kv_a) - set(kv_b) == STUDIO_KEYS and set(kv_b) <= set(kv_a)
    assert {k: v for k, v in kv_a.items() if k not in STUDIO_KEYS} == kv_b


@pytest.mark.parametrize("arch", list(NEW_ARCHS))
def test_q4_k_m_runs(arch, tiny_model, exported, llama_worker):
    from studio.core.gguf.read import read_gguf

    model = new_arch_model(tiny_model, arch)
    f32 = exported(model, "F32", "F32")
    q = exported(model, "Q4_K_M", "Q4_K_M")
    types = {t.name: t.type_name for t in read_gguf(q).tensors}
    assert "Q4_K" in types.values() and "Q6_K" in types.values()
    if arch in MOE:
        assert {types[n] for n in types if "_exps." in n} >= {"Q4_K"}
    ids = _ids(model)[:48]
    llama_worker.load(f32, LoadOptions(logits_all=True, n_ctx=128, f32_kv=True))
    ref = llama_worker.request("eval_logits", ids=ids)
    llama_worker.load(q, LoadOptions(logits_all=True, n_ctx=128, f32_kv=True))
    got = llama_worker.request("eval_logits", ids=ids)
    assert np.isfinite(got).all()
    # a 4-bit copy of the same model, not noise: per position, its logits correlate with the F32
    # file's (measured 0.955-0.990 over the six; a mismatched tensor gives about 0.3-0.5)
    a = ref - ref.mean(-1, keepdims=True)
    b = got - got.mean(-1, keepdims=True)
    corr = (a * b).sum(-1) / np.sqrt((a * a).sum(-1) * (b * b).sum(-1))
    assert float(corr.mean()) >= 0.9, f"{arch}: mean logit correlation with F32 {float(corr.mean()):.3f}"


MOE_PRESETS = ["Q4_K_M", "Q3_K_M", "Q3_K_L", "Q5_K_M", "Q4_K_S", "Q2_K", "Q4_0"]


@pytest.mark.parametrize("arch", MOE)
def test_moe_preset_types_equal_llamacpp(arch, tiny_model, exported, llama_worker, tmp_path):
    """Merged 3-D expert tensors, routers and attention get the types llama_model_quantize gives
    them (Mixtral's 8 experts trigger llama.cpp's 8-expert rules)."""
    import gguf

    from studio.core.gguf.layout import layout
    from studio.core.model import open_model
    from studio.core.plan.presets import PRESETS, preset_types

    model = new_arch_model(tiny_model, arch)
    f32 = exported(model, "F32", "F32")
    with open_model(model) as ck:
        info = ck.info
    to_gguf = {t.hf_name: t.gguf_name for t in layout(info).tensors}
    for preset in MOE_PRESETS:
        out = tmp_path / f"{preset}.gguf"
        llama_worker.request("quantize", src=str(f32), dst=str(out), ftype=PRESETS[preset].ftype, nthread=1)
        want = {t.name: t.tensor_type.name for t in gguf.GGUFReader(out).tensors}
        ours = {to_gguf[k]: v for k, v in preset_types(info, preset).items()}
        assert ours == want, f"{arch} {preset}: " + ", ".join(
            f"{k}: ours {ours.get(k)} llama.cpp {want.get(k)}" for k in want if ours.get(k) != want.get(k)
        )


def test_moe_q4_k_m_with_expert_imatrix_equals_llamacpp(tiny_model, tmp_path):
    """One importance vector per expert (as llama-imatrix stores them): the studio's quantizers give
    the bytes llama_model_quantize gives with the same imatrix, through both export back ends."""
    from studio.core.export.run import export_gguf
    from studio.core.model import open_model
    from studio.core.model.experts import expert_layout, merge_expert_imatrix

    model = new_arch_model(tiny_model, "mixtral")
    with open_model(model) as ck:
        experts = expert_layout(ck.info)
    assert experts is not None and experts.n_experts == 8 and experts.n_used == 2
    rng = np.random.default_rng(0)
    stats = {
        name: (rng.uniform(0.1, 4.0, t.n_per_row).astype(np.float32), int(rng.integers(1, 50)))
        for t in experts.tensors
        for name in t.sources
    }
    imatrix = {k: v.mean() for k, v in merge_expert_imatrix(experts, stats).items()}
    assert len(imatrix) == 3 * 2 and all(v.shape[0] == 8 for v in imatrix.values())
    a = export_gguf(model, tmp_path / "studio.gguf", "Q4_K_M", imatrix=imatrix)
    b = export_gguf(model, tmp_path / "llama.gguf", "Q4_K_M", imatrix=imatrix, backend="llama.cpp")
    _, ta = read_gguf_all(a.path)
    _, tb = read_gguf_all(b.path)
    assert set(ta) == set(tb)
    for name in tb:
        assert ta[name] == tb[name], f"{name}: {ta[name][0]} vs llama.cpp {tb[name][0]}"
    # the imatrix changed the expert bytes (an ignored imatrix would pass the comparison above)
    plain = export_gguf(model, tmp_path / "plain.gguf", "Q4_K_M")
    _, tp = read_gguf_all(plain.path)
    assert tp["blk.0.ffn_down_exps.weight"][2] != ta["blk.0.ffn_down_exps.weight"][2]


def test_calibration_counts_the_tokens_routed_to_each_expert(tiny_model, tmp_path):
    """The calibration (studio.core.calib) keeps one row per expert: its token counts are the
    router's top-2 choices that transformers itself makes on the same chunks, and that imatrix
    exports through both back ends to the same bytes."""
    import torch
    from transformers import AutoModelForCausalLM

    from studio.core.calib.calibrate import calibrate, prepare_input
    from studio.core.calib.imatrix import imatrix_from_stats
    from studio.core.export.run import export_gguf
    from studio.core.model import open_model

    model = new_arch_model(tiny_model, "mixtral")
    stats = calibrate(model, n_ctx=32, n_chunks=2, histogram=False)
    with open_model(model) as ck:
        im = imatrix_from_stats(stats, ck.info)
    chunks = torch.tensor(prepare_input(model, n_ctx=32, n_chunks=2).chunks.tokens)
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32, trust_remote_code=False)
    with torch.no_grad():
        routed = hf(chunks, output_router_logits=True).router_logits  # per layer: (tokens, experts)
    for layer, logits in enumerate(routed):
        want = np.bincount(logits.topk(2, dim=-1).indices.reshape(-1).numpy(), minlength=8)
        for proj in ("gate", "up", "down"):
            e = im.entries[f"blk.{layer}.ffn_{proj}_exps.weight"]
            assert e.n_experts == 8 and e.counts.tolist() == want.tolist(), (layer, proj)
    a = export_gguf(model, tmp_path / "a.gguf", "Q4_K_M", imatrix=im)
    b = export_gguf(model, tmp_path / "b.gguf", "Q4_K_M", imatrix=im, backend="llama.cpp")
    assert read_gguf_all(a.path)[1] == read_gguf_all(b.path)[1]


# measured (3 chunks of 64 tokens): qwen3_moe median 1e-4, max 1.3e-3; mixtral (planted outlier
# channels, 8 experts) median 1.9e-3, max 7.3e-2 in layer 1's ffn_down_exps, whose inputs are small
IMATRIX_TOL = {"qwen3_moe": (1e-3, 1e-2), "mixtral": (5e-3, 0.15)}


@pytest.mark.parametrize("arch", MOE)
def test_moe_imatrix_equals_llama_imatrix(arch, tiny_model, exported, tmp_path):
    """llama.cpp's own llama-imatrix on the F32 export: the same entries (one row per expert in the
    merged expert tensors, and the router), the same tokens routed to each expert, the same sums."""
    import subprocess

    from studio.core.calib import calibrate
    from studio.core.calib.imatrix import imatrix_from_stats, read_imatrix
    from studio.core.factory import sample_text
    from studio.core.model import open_model
    from tests.core.calib.conftest import llama_tool

    tool = llama_tool("llama-imatrix")
    model = new_arch_model(tiny_model, arch)
    text = tmp_path / "calib.txt"
    text.write_text(sample_text() * 2, encoding="utf-8")
    ctx, chunks = 64, 3
    stats = calibrate(model, text, n_ctx=ctx, n_chunks=chunks, device="cpu")
    with open_model(model) as ck:
        ours = imatrix_from_stats(stats, ck.info)
    out = tmp_path / "theirs.gguf"
    cmd = [str(tool), "-m", str(exported(model, "F32", "F32")), "-f", str(text), "-c", str(ctx)]
    cmd += ["--chunks", str(chunks), "-o", str(out), "--no-ppl", "-t", "2"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    theirs = read_imatrix(out)
    assert set(ours) == set(theirs)
    assert {n for n in theirs if theirs.entries[n].n_experts > 1} == {n for n in theirs if "_exps." in n}
    med_tol, max_tol = IMATRIX_TOL[arch]
    for n in theirs:
        a, b = ours.entries[n], theirs.entries[n]
        assert a.n_experts == b.n_experts and a.counts.tolist() == b.counts.tolist(), n
        rel = np.abs(ours[n] - theirs[n]) / np.abs(theirs[n])
        assert np.median(rel) < med_tol and rel.max() < max_tol, f"{n}: {np.median(rel):.2g} {rel.max():.2g}"


class _OneTensor:
    """A calibrated run's spool holding one tensor (enough to ask for the calibrated path)."""

    def __contains__(self, name: object) -> bool:
        return name == "x"

    def __len__(self) -> int:
        return 1

    def qtype_of(self, name: str) -> str:
        return "Q4_K"

    def get(self, name: str) -> np.ndarray:
        return np.zeros(144, np.uint8)


def test_calibrated_tensors_on_a_converter_architecture_are_refused_in_one_sentence(tiny_model, tmp_path):
    """GPTQ/AWQ tensors (studio.core.calib.quantize) are written by the studio's own layout only; an
    architecture that goes through llama.cpp's converter says so before anything is written."""
    from studio.core.errors import ExportError
    from studio.core.export.run import export_gguf

    model = new_arch_model(tiny_model, "olmo2")
    out = tmp_path / "c.gguf"
    with pytest.raises(ExportError, match="Calibrated methods do not cover .* rtn or imatrix"):
        export_gguf(model, out, "Q4_K_M", precomputed=_OneTensor())
    assert not out.exists() and not list(tmp_path.glob("*.partial"))
