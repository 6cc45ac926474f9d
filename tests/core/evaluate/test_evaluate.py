"""Evaluation of real exports: F32 is lossless, KL grows as bits shrink, and the numbers match a direct computation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from studio.core.errors import EvaluationError
from studio.core.evaluate import evaluate, load_text
from studio.core.evaluate.run import gguf_size

CTX = 128
CHUNKS = 4
VARIANTS = ("F32", "Q8_0", "Q6_K", "Q4_K_M", "Q2_K")


@pytest.fixture(scope="module")
def report(chat_model, gguf_of):
    return evaluate(
        chat_model, [gguf_of(chat_model, p) for p in VARIANTS], n_ctx=CTX, max_chunks=CHUNKS, device="cpu"
    )


def _by(report):
    return {v.label.rsplit("-", 1)[-1].removesuffix(".gguf"): v for v in report.variants}


def test_f32_export_is_lossless(report):
    v = _by(report)["F32"]
    assert v.error is None
    assert v.kld_mean < 1e-5 and v.kld_p99 < 1e-4
    assert v.same_top_pct >= 99.9
    assert v.ppl == pytest.approx(report.original.ppl, rel=1e-4)
    assert v.bpw == pytest.approx(32.0)


def test_kl_grows_as_bits_shrink_on_a_model_with_outliers(report):
    v = _by(report)
    kl = [v[p].kld_mean for p in ("Q8_0", "Q6_K", "Q4_K_M", "Q2_K")]
    assert kl == sorted(kl) and len(set(kl)) == 4, kl
    bpw = [v[p].bpw for p in ("Q8_0", "Q6_K", "Q4_K_M", "Q2_K")]
    assert bpw == sorted(bpw, reverse=True)
    assert v["Q2_K"].same_top_pct < v["Q8_0"].same_top_pct
    assert all(x.kld_p99 >= x.kld_median for x in report.variants)
    pts = report.quality_vs_size()
    assert [p.label for p in pts][0].endswith("Q2_K.gguf") and len(pts) == 5


def test_report_shape_and_json(report):
    assert report.n_ctx == CTX and report.n_chunks == CHUNKS
    assert report.original.n_scored == CHUNKS * (CTX // 2 - 1)
    d = json.loads(json.dumps(report.to_dict()))
    assert set(d["original"]) >= {"ppl"}
    for v in d["variants"]:
        assert set(v) >= {"path", "ppl", "kld_mean", "kld_p99", "same_top_pct", "file_bytes", "bpw"}
    size, bpw = gguf_size(_by(report)["Q8_0"].path)
    assert size == _by(report)["Q8_0"].file_bytes and 8.0 < bpw < 9.0


def test_kl_matches_transformers_and_llama_cpp_python_computed_directly(report, chat_model):
    """Recompute PPL and KL for Q4_K_M with transformers, llama_cpp.Llama's scores and torch's own kl_div.

    llama.cpp runs in a child through ``LlamaRunner`` (the one way to load a GGUF), outside the
    chat back end that ``evaluate`` uses, and with transformers' tokenizer instead of the GGUF's.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from studio.core.llamacpp import LlamaRunner, LoadOptions

    v = _by(report)["Q4_K_M"]
    tok = AutoTokenizer.from_pretrained(chat_model, trust_remote_code=False)
    ids = tok(load_text("sample").text)["input_ids"]
    hf = AutoModelForCausalLM.from_pretrained(chat_model, dtype=torch.float32, trust_remote_code=False)
    llm = LlamaRunner(label="llama.cpp (direct check)")
    llm.load(v.path, LoadOptions(n_ctx=CTX, logits_all=True, f32_kv=True))
    kls, nlls, same = [], [], []
    for c in range(CHUNKS):
        chunk = [tok.bos_token_id] + ids[c * CTX + 1 : (c + 1) * CTX]
        with torch.no_grad():
            ref = hf(torch.tensor([chunk])).logits[0]
        got = torch.from_numpy(np.asarray(llm.request("eval_logits", ids=chunk), dtype=np.float32))
        rows = slice(CTX // 2, CTX - 1)
        lp = torch.log_softmax(ref[rows].double(), -1)
        lq = torch.log_softmax(got[rows].double(), -1)
        kls.append(torch.nn.functional.kl_div(lq, lp, log_target=True, reduction="none").sum(-1))
        targets = torch.tensor(ids[c * CTX + CTX // 2 + 1 : (c + 1) * CTX])
        nlls.append(torch.nn.functional.cross_entropy(got[rows].double(), targets, reduction="none"))
        same.append(ref[rows].argmax(-1) == got[rows].argmax(-1))
    llm.close()
    kl = torch.cat(kls).numpy()
    assert v.kld_mean == pytest.approx(float(kl.mean()), rel=1e-6)
    assert v.kld_p99 == pytest.approx(float(np.percentile(kl, 99)), rel=1e-6)
    assert v.same_top_pct == pytest.approx(100.0 * float(torch.cat(same).double().mean()))
    assert v.ppl == pytest.approx(float(torch.exp(torch.cat(nlls).mean())), rel=1e-6)


def test_user_text_file_and_errors(chat_model, f32_gguf, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("Only a few words here.", encoding="utf-8")
    with pytest.raises(EvaluationError, match="short.txt has .* tokens, fewer than one chunk of 128"):
        evaluate(chat_model, [f32_gguf], text=short, n_ctx=CTX, device="cpu")
    with pytest.raises(EvaluationError, match="cannot be read"):
        load_text(tmp_path / "missing.txt")
    text = load_text(short)
    assert text.name == "short.txt" and text.text.startswith("Only")
    assert len(load_text("sample").text.split()) > 2500


def test_wikitext_without_datasets_is_a_clear_error(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_datasets(name, *a, **k):
        if name == "datasets":
            raise ImportError("no datasets")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_datasets)
    with pytest.raises(EvaluationError, match="WikiText-2 needs the 'datasets' package"):
        load_text("wikitext-2")


def test_a_broken_variant_is_reported_and_the_others_still_run(chat_model, f32_gguf, tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x00" * 20)
    rep = evaluate(chat_model, [broken, f32_gguf], n_ctx=64, max_chunks=1, device="cpu")
    bad, good = rep.variants
    assert bad.error and "broken.gguf" in bad.error
    assert good.error is None and good.kld_mean < 1e-5


def _header_only_gguf(path, *, layers: int, width: int):
    """A GGUF with only the metadata the identity check reads (no tensors)."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(layers)
    w.add_embedding_length(width)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_gguf_of_another_model_is_refused_by_its_dimensions(chat_model, f32_gguf, tmp_path):
    # the same tokenizer and vocabulary size, but 128 wide: KL against it would be meaningless numbers
    other = _header_only_gguf(tmp_path / "other.gguf", layers=2, width=128)
    rep = evaluate(chat_model, [other, chat_model, f32_gguf], n_ctx=64, max_chunks=1, device="cpu")
    bad, folder, good = rep.variants
    assert folder.error and f"{chat_model.name} is a folder; a variant must be a GGUF file" in folder.error
    assert bad.error and "other.gguf has 2 layers of width 128" in bad.error
    assert "it is not a variant of this model" in bad.error and "256" in bad.error
    assert good.error is None and good.kld_mean < 1e-5


def test_a_vocabulary_with_other_tokens_is_refused():
    from pathlib import Path

    from studio.core.evaluate.run import _Identity

    ident = _Identity("orig", ("<s>", "a", "b"), None)
    ident.check_vocab(Path("same.gguf"), ("<s>", "a", "b", "pad"))  # extra padding rows are fine
    ident.check_vocab(Path("unknown.gguf"), None)
    with pytest.raises(EvaluationError, match=r"v.gguf has another vocabulary .*token 1 is 'x' there, 'a'"):
        ident.check_vocab(Path("v.gguf"), ("<s>", "x", "b"))


def test_zero_chunks_is_refused_before_loading_anything(tmp_path):
    with pytest.raises(EvaluationError, match="At least one chunk must be evaluated, not 0"):
        evaluate(tmp_path / "not-loaded", [], n_ctx=64, max_chunks=0)


def test_binary_or_non_utf8_text_is_refused(tmp_path):
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("café au lait ".encode("latin-1") * 50)
    with pytest.raises(EvaluationError, match=r"latin1.txt is not UTF-8 text \(byte 3"):
        load_text(latin)  # used to be scored as U+FFFD replacement characters
    binary = tmp_path / "blob.txt"
    binary.write_bytes(b"GGUF\x00\x00\x00\x03" * 64)
    with pytest.raises(EvaluationError, match="blob.txt contains NUL bytes"):
        load_text(binary)
    utf8 = tmp_path / "ok.txt"
    utf8.write_text("café ✓ " * 10, encoding="utf-8")
    assert load_text(utf8).text.startswith("café ✓")


def test_model_dims_count_mtp_layers_as_llama_cpp_blocks(tmp_path):
    from studio.core.evaluate.run import _model_dims

    folder = tmp_path / "glm"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"num_hidden_layers": 46, "num_nextn_predict_layers": 1, "hidden_size": 4096})
    )
    gguf_file = _header_only_gguf(tmp_path / "glm.gguf", layers=47, width=4096)
    assert _model_dims(folder) == _model_dims(gguf_file) == (47, 4096)
    assert _model_dims(tmp_path / "missing") is None
