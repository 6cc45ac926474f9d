"""The sequential layer runner against plain transformers: same statistics, same logits, consumers that
change weights, memory per layer, cancel, NaN activations."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from studio.core.calib import ActivationCollector, Consumer, calibrate, prepare_input, run_model
from studio.core.calib.imatrix import imatrix_from_stats
from studio.core.calib.runner import RunnerMode
from studio.core.errors import CalibrationError
from studio.core.jobs import JobCancelled, JobContext
from studio.core.model import open_model

from .conftest import CHUNKS, CTX


def _independent_sum_sq(model_dir, tokens):
    """Σx² and row counts per linear weight, from forward pre-hooks on the whole transformers model."""
    from transformers import AutoModelForCausalLM
    from transformers.pytorch_utils import Conv1D

    m = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, trust_remote_code=False
    ).eval()
    sums: dict[str, list] = {}

    def hook(name):
        def pre(_mod, args):
            x = args[0].reshape(-1, args[0].shape[-1]).double()
            acc = sums.setdefault(name, [0.0, 0])
            acc[0] = acc[0] + (x * x).sum(0)
            acc[1] += x.shape[0]

        return pre

    for name, mod in m.named_modules():
        if isinstance(mod, (torch.nn.Linear, Conv1D)) and name != "lm_head":
            mod.register_forward_pre_hook(hook(name + ".weight"))
    with torch.no_grad():
        for row in tokens:
            m(input_ids=torch.as_tensor(row[None]))
    return {k: (v[0].numpy(), v[1]) for k, v in sums.items()}


@pytest.mark.parametrize("arch", ["llama", "gpt2", "phi3"])
def test_imatrix_equals_plain_transformers_hooks(tiny_model, calib_text, arch):
    model = tiny_model(arch)
    stats = calibrate(model, calib_text, n_ctx=CTX, n_chunks=CHUNKS, device="cpu")
    assert stats.info.mode is RunnerMode.LAYERWISE
    with open_model(model) as ck:
        im = imatrix_from_stats(stats, ck.info)
    ref = _independent_sum_sq(
        model, prepare_input(model, calib_text, n_ctx=CTX, n_chunks=CHUNKS).chunks.tokens
    )
    by_hf = {s.name: s for s in stats.sites}
    assert set(ref) == set(by_hf)  # every linear of every layer was observed, nothing else
    from studio.core.gguf.layout import layout

    with open_model(model) as ck:
        gguf_of = {t.hf_name: t.gguf_name for t in layout(ck.info).tensors}
    for hf, (sum_sq, n) in ref.items():
        assert n == CHUNKS * CTX
        ours = im[gguf_of[hf]]
        want = (sum_sq / n).astype(np.float32)
        rel = np.abs(ours - want) / np.maximum(np.abs(want), 1e-30)
        assert np.median(rel) < 0.01, hf  # the acceptance bound
        assert rel.max() < 1e-4, hf  # in fact float32 rounding only


def test_whole_model_fallback_gives_the_same_statistics(llama_model, calib_text, llama_stats):
    whole = calibrate(llama_model, calib_text, n_ctx=CTX, n_chunks=CHUNKS, device="cpu", mode="whole")
    assert whole.info.mode is RunnerMode.WHOLE_MODEL
    assert {s.name for s in whole.sites} == {s.name for s in llama_stats.sites}
    for name, st in llama_stats.inputs.items():
        w = whole.inputs[name]
        assert (w.count == st.count).all()
        np.testing.assert_allclose(w.sum_sq, st.sum_sq, rtol=1e-5)
        np.testing.assert_allclose(w.absmax, st.absmax, rtol=1e-5)
        assert abs(int(w.hist.sum()) - int(st.hist.sum())) == 0
    for a, b in zip(whole.hidden, llama_stats.hidden, strict=True):
        assert a.max_norm == pytest.approx(b.max_norm, rel=1e-5)


def test_statistics_are_consistent(llama_stats):
    st = llama_stats.inputs["model.layers.0.self_attn.q_proj.weight"]
    assert st.tokens == CHUNKS * CTX and st.n_experts == 1
    assert int(st.hist.sum()) == st.tokens * st.n_cols  # every element binned once
    assert (st.channel_absmax**2 >= st.mean_sq[0] * (1 - 1e-6)).all()  # max² bounds the mean square
    assert (st.mean_abs <= st.rms * (1 + 1e-9)).all()  # mean |x| ≤ rms
    # q, k and v read one tensor: one accumulator, shared
    k = llama_stats.inputs["model.layers.0.self_attn.k_proj.weight"]
    assert k is st
    assert llama_stats.inputs["model.layers.0.mlp.down_proj.weight"].n_cols == 768
    assert [h.layer for h in llama_stats.hidden] == [0, 1] and all(
        h.tokens == CHUNKS * CTX for h in llama_stats.hidden
    )


class _Logits(Consumer):
    wants_head = True

    def __init__(self) -> None:
        self.rows: dict[int, np.ndarray] = {}

    def logits(self, chunk, logits):
        self.rows[chunk] = logits.cpu().numpy().copy()


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_head_logits_equal_transformers(tiny_model, calib_text, arch):
    """Issue 15's need: the runner's logits are the model's own (final norm, tied head, soft-capping)."""
    from transformers import AutoModelForCausalLM

    model = tiny_model(arch)
    inp = prepare_input(model, calib_text, n_ctx=CTX, n_chunks=2)
    cons = _Logits()
    with open_model(model) as ck:
        run_model(ck, inp.chunks, [cons], device="cpu")
    m = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32, trust_remote_code=False).eval()
    with torch.no_grad():
        for c, row in enumerate(inp.chunks.tokens):
            want = m(input_ids=torch.as_tensor(row[None])).logits[0].numpy()
            np.testing.assert_allclose(cons.rows[c], want, rtol=1e-4, atol=1e-4)


class _ZeroV(Consumer):
    """Issue 14's need: replace a layer's weight before its outputs are computed."""

    needs_layerwise = True

    def layer_collected(self, view):
        if view.index == 0:
            site = next(s for s in view.sites if s.name.endswith("self_attn.v_proj.weight"))
            view.set_weight(site, torch.zeros_like(view.weight(site)))


def test_a_consumer_changes_weights_and_the_next_layer_sees_it(
    llama_model, calib_text, llama_stats, tmp_path
):
    from safetensors.torch import load_file, save_file

    changed = ActivationCollector()
    inp = prepare_input(llama_model, calib_text, n_ctx=CTX, n_chunks=CHUNKS)
    stored = (llama_model / "model.safetensors").read_bytes()
    with open_model(llama_model) as ck:
        info = run_model(ck, inp.chunks, [changed, _ZeroV()], device="cpu")
    assert info.recomputed_layers == (0,)
    # the layer computes from a copy-on-write map of the file: the new weight never reaches the file
    assert (llama_model / "model.safetensors").read_bytes() == stored
    got = changed.result(info)
    name1 = "model.layers.1.self_attn.q_proj.weight"
    assert not np.allclose(got.inputs[name1].sum_sq, llama_stats.inputs[name1].sum_sq)
    # layer 0's own inputs are what they were: only its outputs changed
    name0 = "model.layers.0.self_attn.o_proj.weight"
    np.testing.assert_allclose(got.inputs[name0].sum_sq, llama_stats.inputs[name0].sum_sq, rtol=1e-6)
    # ... and layer 1 sees exactly what a checkpoint with that weight zeroed gives
    copy = tmp_path / "zeroed"
    shutil.copytree(llama_model, copy)
    sd = load_file(str(copy / "model.safetensors"))
    sd["model.layers.0.self_attn.v_proj.weight"] = torch.zeros_like(
        sd["model.layers.0.self_attn.v_proj.weight"]
    )
    save_file(sd, str(copy / "model.safetensors"), metadata={"format": "pt"})
    ref = calibrate(copy, calib_text, n_ctx=CTX, n_chunks=CHUNKS, device="cpu")
    np.testing.assert_allclose(got.inputs[name1].sum_sq, ref.inputs[name1].sum_sq, rtol=1e-5)


def test_whole_model_mode_refuses_weight_changing_consumers(llama_model, calib_text):
    inp = prepare_input(llama_model, calib_text, n_ctx=CTX, n_chunks=2)
    with open_model(llama_model) as ck, pytest.raises(CalibrationError, match="_ZeroV needs that"):
        run_model(ck, inp.chunks, [_ZeroV()], device="cpu", mode="whole")


def test_hessian_is_two_xtx_over_n(llama_model, calib_text):
    inp = prepare_input(llama_model, calib_text, n_ctx=CTX, n_chunks=3)
    name = "model.layers.1.mlp.down_proj.weight"
    col = ActivationCollector(hessian_for=lambda s: s.name == name)

    class Keep(Consumer):
        xs: list = []

        def observe(self, site, x, chunk, expert=0):
            if site.name == name:
                self.xs.append(x.double().clone())

    keep = Keep()
    with open_model(llama_model) as ck:
        run_model(ck, inp.chunks, [col, keep], device="cpu")
    x = torch.cat(keep.xs)
    want = (2.0 * x.T @ x / x.shape[0]).numpy()
    np.testing.assert_allclose(col.hessians()[name], want, rtol=1e-5, atol=1e-7)


def test_peak_layer_bytes_is_one_layer(llama_model, calib_text, llama_stats):
    with open_model(llama_model) as ck:
        layer0 = sum(t.nbytes for t in ck.info.tensors if t.name.startswith("model.layers.0."))
    assert llama_stats.info.peak_layer_bytes == layer0


def test_progress_per_layer_and_chunk_with_eta_and_cancel_mid_layer(llama_model, calib_text, tmp_path):
    seen: list[str] = []
    ctx = JobContext(min_interval=0.0)

    def progress(done, total, msg):
        seen.append(msg)
        if msg.startswith("layer 2/2: chunk 2/"):
            ctx.cancel()

    ctx.on_progress = progress
    with pytest.raises(JobCancelled):
        calibrate(llama_model, calib_text, n_ctx=CTX, n_chunks=4, device="cpu", ctx=ctx)
    assert any(m.startswith("layer 1/2: chunk 4/4 · ETA") for m in seen)
    assert seen[-1].startswith("layer 2/2: chunk 2/4")  # stopped inside layer 2, at the next chunk


def _poisoned(model, tmp_path, value):
    from safetensors.torch import load_file, save_file

    copy = tmp_path / "poisoned"
    shutil.copytree(model, copy)
    sd = load_file(str(copy / "model.safetensors"))
    key = "model.layers.1.post_attention_layernorm.weight"
    sd[key] = sd[key].clone()
    sd[key][3] = value
    save_file(sd, str(copy / "model.safetensors"), metadata={"format": "pt"})
    return copy


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_nan_or_inf_activations_name_the_layer(llama_model, calib_text, tmp_path, value):
    bad = _poisoned(llama_model, tmp_path, value)
    with pytest.raises(CalibrationError) as exc:
        calibrate(bad, calib_text, n_ctx=CTX, n_chunks=2, device="cpu")
    msg = str(exc.value)
    assert "layer 1" in msg and "NaN or Inf" in msg and "mlp.gate_proj" in msg and "\n" not in msg


def test_gguf_file_is_refused(tmp_path, calib_text):
    p = tmp_path / "model.gguf"
    import gguf

    w = gguf.GGUFWriter(str(p), "llama")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    with pytest.raises(Exception, match="GGUF"):
        calibrate(p, calib_text, n_ctx=CTX, n_chunks=2, device="cpu")


def test_result_is_cached_with_the_weight_statistics(llama_model, calib_text):
    from studio.core.stats.cache import StatsCache

    cache = StatsCache()
    a = calibrate(llama_model, calib_text, n_ctx=CTX, n_chunks=2, device="cpu", cache=cache)
    b = calibrate(llama_model, calib_text, n_ctx=CTX, n_chunks=2, device="cpu", cache=cache)
    assert a is b and cache.hits == 1 and cache.nbytes >= a.nbytes > 0
    c = calibrate(llama_model, calib_text, n_ctx=CTX, n_chunks=3, device="cpu", cache=cache)
    assert c is not a and cache.misses == 2
