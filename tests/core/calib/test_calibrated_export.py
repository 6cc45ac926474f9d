"""Calibrated exports (gptq, awq+gptq): standard files llama.cpp runs, the preset's types, faults handled."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from studio.core.jobs import JobCancelled, JobContext

CTX, CHUNKS = 64, 24  # 1536 tokens: twice the 768 columns of the tiny llama's down_proj


@pytest.fixture(scope="module")
def llama_worker():
    """One llama.cpp child for this module, loaded the studio's one way (extra buffers decided by LoadOptions)."""
    from studio.core.llamacpp import LlamaRunner

    w = LlamaRunner(label="llama.cpp (tests)")
    yield w
    w.close()


@pytest.fixture(scope="module")
def plan_of(llama_model):
    from studio.core.model import open_model
    from studio.core.plan.plan import plan_from_preset, with_method

    with open_model(llama_model) as ck:
        info = ck.info

    def make(method: str, preset: str = "Q4_K_M"):
        return with_method(plan_from_preset(info, preset, imatrix=True), info, method), info

    return make


@pytest.fixture(scope="module")
def calibrated(llama_model, calib_text, plan_of, tmp_path_factory):
    """``calibrated(method) -> CalibratedExport`` of the tiny llama at Q4_K_M, once per method."""
    from studio.core.calib.quantize import export_calibrated

    root = tmp_path_factory.mktemp("calibrated")
    cache = {}

    def run(method: str):
        if method not in cache:
            plan, _ = plan_of(method)
            out = root / f"llama-{method}.gguf"
            cache[method] = export_calibrated(
                llama_model, out, plan, text=calib_text, n_ctx=CTX, n_chunks=CHUNKS, device="cpu"
            )
        return cache[method]

    return run


def _tensors(path: Path) -> dict[str, tuple[str, tuple[int, ...], np.ndarray]]:
    from studio.core.gguf.read import read_gguf

    g = read_gguf(path)
    out = {}
    for t in g.tensors:
        raw = np.fromfile(path, dtype=np.uint8, count=t.nbytes, offset=t.offset)
        out[t.name] = (t.type_name, tuple(t.shape), raw)
    return out


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hf_with_file_weights(model_dir: Path, gguf: Path):
    """The transformers model whose weights are the file's tensors as the studio's dequantizer decodes them."""
    import torch
    from transformers import AutoModelForCausalLM

    from studio.core.gguf.arch import Transform, head_counts
    from studio.core.gguf.layout import layout
    from studio.core.model import open_model
    from studio.core.quant.blocks import dequantize

    with open_model(model_dir) as ck:
        info = ck.info
    lay = layout(info)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, trust_remote_code=False).eval()
    n_head, n_kv = head_counts(info.config)
    ts = _tensors(gguf)
    state = hf.state_dict()
    for tm in lay.tensors:
        qtype, shape, raw = ts[tm.gguf_name]
        v = raw.view(np.float32).reshape(shape) if qtype == "F32" else dequantize(raw, qtype, shape)
        if tm.transform is Transform.PERMUTE_Q:
            v = _unpermute(v, n_head)
        elif tm.transform is Transform.PERMUTE_K:
            v = _unpermute(v, n_kv)
        state[tm.hf_name].copy_(torch.from_numpy(np.ascontiguousarray(v)).reshape(state[tm.hf_name].shape))
    return hf


@pytest.mark.parametrize("method", ["gptq", "awq+gptq"])
def test_calibrated_file_is_standard_and_decodes_as_the_studio_does(
    method, calibrated, plan_of, llama_model, llama_worker
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from studio.core.gguf.layout import layout
    from studio.core.llamacpp import LoadOptions
    from studio.core.quant.blocks import dequantize
    from studio.core.quant.reference import ggml_dequantize

    res = calibrated(method)
    plan, info = plan_of(method)
    path = res.export.path
    ts = _tensors(path)
    # the per-tensor types are the preset's, as llama.cpp would choose them
    want = {tm.gguf_name: plan.type_of(tm.hf_name) for tm in layout(info).tensors}
    assert {k: ts[k][0] for k in want} == want
    assert res.export.tensor_types == {k: v[0] for k, v in ts.items()}
    # llama.cpp's own decoder reads every quantized tensor as the studio's dequantizer does
    for name, (qtype, shape, raw) in ts.items():
        if qtype not in ("F32", "F16"):
            assert np.array_equal(ggml_dequantize(raw, qtype, shape), dequantize(raw, qtype, shape)), name
    # and llama.cpp runs the file: its logits are transformers' with the file's weights
    text = "The quick brown fox jumps over the lazy dog. Grüße aus Köln, 12345."
    ids = AutoTokenizer.from_pretrained(llama_model, trust_remote_code=False)(text)["input_ids"]
    llama_worker.load(path, LoadOptions(n_ctx=128, logits_all=True, f32_kv=True))
    got = llama_worker.request("eval_logits", ids=ids)
    with torch.no_grad():
        ref = _hf_with_file_weights(llama_model, path)(torch.tensor([ids])).logits[0].numpy()
        orig = AutoModelForCausalLM.from_pretrained(llama_model, dtype=torch.float32, trust_remote_code=False)
        float_logits = orig(torch.tensor([ids])).logits[0].numpy()
    # llama.cpp multiplies K-quant weights with 8-bit quantized activations, so it cannot match a float
    # matmul exactly; but its distance to the file's weights must be far below the quantization's own
    # distance to the float model (a wrong row order or a lost AWQ fold would be as large or larger)
    own = float(np.abs(got - ref).max())
    quant = float(np.abs(ref - float_logits).max())
    assert own < 0.5 * quant, f"llama.cpp vs file weights {own:.3g}, file vs float model {quant:.3g}"
    # the sweep did better than llama.cpp's rounding on the calibration data, tensor by tensor
    gains = [t.gain for lr in res.layers for t in lr.tensors if t.gain is not None]
    assert len(gains) == 15 and max(gains) < 1.0 and float(np.mean(gains)) < 0.8
    assert res.tokens == CTX * CHUNKS and not res.warnings


def test_awq_folds_into_the_norms_of_the_file(calibrated) -> None:
    plain = _tensors(calibrated("gptq").export.path)  # the checkpoint's norms
    res = calibrated("awq+gptq")
    scaled = _tensors(res.export.path)
    norm = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    seen = []
    for lr in res.layers:
        for prev, alpha in lr.awq_alphas:
            seen.append(alpha)
            if prev in norm:
                name = f"blk.{lr.layer}.{norm[prev]}.weight"
                # a norm changes in the file exactly when its group chose scales (α > 0)
                assert (not np.array_equal(scaled[name][2], plain[name][2])) == (alpha > 0), name
    assert len(seen) == 8 and any(a > 0 for a in seen)


def test_plain_imatrix_method_matches_an_export_with_the_calibration_imatrix(
    llama_model, calib_text, plan_of, tmp_path
) -> None:
    from studio.core.calib import calibrate, imatrix_from_stats
    from studio.core.calib.quantize import export_calibrated
    from studio.core.export.run import export_gguf

    plan, info = plan_of("imatrix")
    res = export_calibrated(llama_model, tmp_path / "a.gguf", plan, text=calib_text, n_ctx=CTX, n_chunks=6)
    assert res.layers == () and res.run is not None  # one run of the float model, no weights changed
    im = imatrix_from_stats(calibrate(llama_model, calib_text, n_ctx=CTX, n_chunks=6, device="cpu"), info)
    ref = export_gguf(llama_model, tmp_path / "b.gguf", plan, imatrix=im)
    a, b = _tensors(res.export.path), _tensors(ref.path)
    assert all(np.array_equal(a[n][2], b[n][2]) for n in b)


def _plan(llama_model, method):
    from studio.core.model import open_model
    from studio.core.plan.plan import plan_from_preset, with_method

    with open_model(llama_model) as ck:
        info = ck.info
    return with_method(plan_from_preset(info, "Q4_K_M"), info, method)


def test_fake_gpu_oom_retries_smaller_then_on_the_cpu(llama_model, calib_text, tmp_path, monkeypatch) -> None:
    import torch

    import studio.core.quant.gptq as gq
    from studio.core.calib.quantize import export_calibrated

    real = gq.gptq_quantize
    calls = {"n": 0, "fail": 0}

    def flaky(w, h, qtype, **kw):
        calls["n"] += 1
        if calls["n"] <= calls["fail"]:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return real(w, h, qtype, **kw)

    monkeypatch.setattr(gq, "gptq_quantize", flaky)
    plan = _plan(llama_model, "gptq")
    for fail, said in (
        (1, "quantized again with batches of 64 columns"),
        (3, "quantized on the CPU instead"),
    ):
        calls.update(n=0, fail=fail)
        lines: list[str] = []
        res = export_calibrated(
            llama_model,
            tmp_path / f"oom{fail}.gguf",
            plan,
            text=calib_text,
            n_ctx=CTX,
            n_chunks=4,
            device="cpu",
            ctx=JobContext(on_log=lines.append),
        )
        hit = [w for w in res.warnings if said in w]
        assert len(hit) == 1 and "ran out of memory" in hit[0] and hit[0] in lines
        assert res.export.path.exists()


def test_singular_hessian_falls_back_to_the_imatrix_search(
    llama_model, calib_text, tmp_path, monkeypatch
) -> None:
    import studio.core.quant.gptq as gq
    from studio.core.calib.quantize import export_calibrated

    def never(*_a, **_k):
        raise gq.HessianError("The Hessian is not positive definite even with damping 10.")

    monkeypatch.setattr(gq, "gptq_quantize", never)
    res = export_calibrated(
        llama_model, tmp_path / "s.gguf", _plan(llama_model, "gptq"), text=calib_text, n_ctx=CTX, n_chunks=4
    )
    used = {t.method for lr in res.layers for t in lr.tensors}
    assert used == {"imatrix"}
    assert any("not positive definite" in w and "imatrix search instead" in w for w in res.warnings)


def test_too_few_tokens_warn_and_cancel_leaves_no_file(llama_model, calib_text, tmp_path) -> None:
    from studio.core.calib.quantize import export_calibrated

    out = tmp_path / "c.gguf"
    ctx = JobContext()

    def progress(done, total, msg):
        if "layer 2/2: gptq" in msg:
            ctx.cancel()  # mid-run: layer 1 is done and spooled, layer 2 is being quantized

    ctx.on_progress = progress
    ctx.min_interval = 0.0
    with pytest.raises(JobCancelled):
        export_calibrated(
            llama_model, out, _plan(llama_model, "gptq"), text=calib_text, n_ctx=CTX, n_chunks=2, ctx=ctx
        )
    assert list(tmp_path.iterdir()) == []  # no output, no partial, no spool
    res = export_calibrated(
        llama_model, out, _plan(llama_model, "gptq"), text=calib_text, n_ctx=CTX, n_chunks=2
    )
    few = [w for w in res.warnings if "fewer than twice" in w]
    assert len(few) == 2 and "128 tokens" in few[0] and "256 input columns" in few[0]
    assert math.isfinite(res.seconds)


def test_nan_activations_stop_the_run_in_one_sentence(llama_model, calib_text, tmp_path) -> None:
    import shutil

    from safetensors.numpy import load_file, save_file

    from studio.core.calib.quantize import export_calibrated
    from studio.core.errors import CalibrationError

    bad = tmp_path / "nan-llama"
    shutil.copytree(llama_model, bad)
    st = load_file(bad / "model.safetensors")
    st["model.layers.0.mlp.up_proj.weight"][3, :] = np.nan
    save_file(st, bad / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CalibrationError, match="NaN") as e:
        export_calibrated(
            bad, tmp_path / "n.gguf", _plan(bad, "gptq"), text=calib_text, n_ctx=CTX, n_chunks=2
        )
    assert "\n" not in str(e.value)
    assert not (tmp_path / "n.gguf").exists()


def test_gptq_on_the_q2_0_grid_writes_a_file_llama_cpp_runs(
    llama_model, calib_text, plan_of, llama_worker, tmp_path
) -> None:
    """Q2_0 (ggml type 42, which gguf-py 0.19 cannot name) through the calibrated export, as for the other
    scalar low-bit grids: the preset's types, llama.cpp decodes the bytes as the studio does and runs the
    file, and GPTQ beats llama.cpp's rounding on every Q2_0 tensor."""
    from studio.core.calib.quantize import export_calibrated
    from studio.core.gguf.layout import layout
    from studio.core.llamacpp import LoadOptions
    from studio.core.quant.blocks import dequantize
    from studio.core.quant.reference import ggml_dequantize

    plan, info = plan_of("gptq", "Q2_0")
    res = export_calibrated(
        llama_model, tmp_path / "q2.gguf", plan, text=calib_text, n_ctx=CTX, n_chunks=CHUNKS, device="cpu"
    )
    ts = _tensors(res.export.path)
    want = {tm.gguf_name: plan.type_of(tm.hf_name) for tm in layout(info).tensors}
    assert {k: ts[k][0] for k in want} == want
    q2 = {k for k, v in want.items() if v == "Q2_0"}
    assert len(q2) >= 10  # every linear of the blocks; token_embd/output take Q4_K/Q6_K as in llama.cpp
    for name in q2:
        qtype, shape, raw = ts[name]
        assert np.array_equal(ggml_dequantize(raw, qtype, shape), dequantize(raw, qtype, shape)), name
    gains = {t.name: t.gain for lr in res.layers for t in lr.tensors if t.gain is not None}
    assert len(gains) >= len(q2) and max(gains.values()) < 1.0, gains
    llama_worker.load(res.export.path, LoadOptions(n_ctx=128, logits_all=True, f32_kv=True))
    got = np.asarray(llama_worker.request("eval_logits", ids=[1, 2, 3, 4, 5, 6]))
    assert got.shape[0] == 6 and np.isfinite(got).all()


def test_a_layer_lets_go_of_each_inverse_factor_once_its_last_reader_is_rounded(
    llama_model, calib_text, tmp_path, monkeypatch
) -> None:
    """When GPTQ makes a factor, the layer holds none of an input whose tensors are all rounded: held to
    the layer's end, ``down_proj``'s (0.8 GB at 8B widths) sat beside its output errors. The tensors that
    share an input (q/k/v, gate/up) still share one factor."""
    from studio.core.calib.quantize import export_calibrated
    from studio.core.quant.gptq import FactorCache

    held_at_make: list[int] = []
    makes: list[int] = []
    real = FactorCache.factor

    def watched(self, h, how, make):
        def counted():
            makes.append(1)
            held_at_make.append(len(self._made))
            return make()

        return real(self, h, how, counted)

    monkeypatch.setattr(FactorCache, "factor", watched)
    export_calibrated(
        llama_model, tmp_path / "f.gguf", _plan(llama_model, "gptq"), text=calib_text, n_ctx=CTX, n_chunks=4,
        device="cpu",
    )  # fmt: skip
    # per layer four inputs (q/k/v, o, gate/up, down), and the output head's: each factored once and let
    # go before the next is made
    layers = json.loads((Path(llama_model) / "config.json").read_text())["num_hidden_layers"]
    assert len(makes) == 4 * layers + 1
    assert held_at_make == [0] * len(makes)
