"""``inspect|export|eval|chat`` take a ``.gguf`` where they take a model folder."""

from __future__ import annotations

import json

import numpy as np

from studio.cli import main
from tests.core.chat import fixtures as _fixtures
from tests.core.export import test_requantize as _rq

chat_model = _fixtures.chat_model
f32_gguf = _fixtures.f32_gguf
gguf_of = _fixtures.gguf_of
worker = _rq.worker
llama_quantize, read = _rq.llama_quantize, _rq.read


def _errors(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]


def test_export_of_an_f32_gguf_equals_llama_quantize_tensor_for_tensor(f32_gguf, worker, tmp_path, capsys):
    out = tmp_path / "Y.gguf"
    assert main(["export", str(f32_gguf), "-o", str(out), "--preset", "Q8_0"]) == 0
    assert "warning" not in capsys.readouterr().err  # an F32 source loses nothing
    ref, ref_order, _ = read(llama_quantize(worker, f32_gguf, tmp_path / "ref.gguf", "Q8_0"))
    got, got_order, _ = read(out)
    assert got_order == ref_order and got == ref


def test_export_from_a_quantized_gguf_warns_and_works(chat_model, gguf_of, tmp_path, capsys):
    src = gguf_of(chat_model, "Q8_0")
    out = tmp_path / "q4.gguf"
    assert main(["export", str(src), "-o", str(out), "--preset", "Q4_K_M"]) == 0
    cap = capsys.readouterr()
    warnings = [ln for ln in cap.err.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and "already quantized (mostly Q8_0" in warnings[0]
    assert "--allow-requantize" in warnings[0] and "types: F32×5" in cap.out
    assert main(["export", str(src), "-o", str(tmp_path / "j.gguf"), "--preset", "Q4_K_M", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["source"]["main_type"] == "Q8_0" and d["source"]["quantized"] and d["source"]["warning"]
    assert any("already quantized" in n for n in d["notes"])


def test_inspect_shows_what_a_gguf_is_stored_as(chat_model, gguf_of, capsys):
    src = gguf_of(chat_model, "Q8_0")
    assert main(["inspect", str(src)]) == 0
    text = capsys.readouterr().out
    assert "Stored as:    Q8_0×16, F32×5" in text and "already quantized" in text
    assert main(["inspect", str(src), "--json"]) == 0
    stored = json.loads(capsys.readouterr().out)["stored_as"]
    assert stored["types"] == {"Q8_0": 16, "F32": 5} and stored["bpw"] > 8


def test_export_of_a_gguf_with_an_unsupported_type_is_one_line_and_writes_nothing(tmp_path, capsys):
    from tests.core.model.test_gguf_source import _gguf_with

    src = _gguf_with(
        tmp_path / "odd.gguf",
        [
            ("blk.0.ffn_up.weight", np.zeros((2, 292), np.uint8), "Q8_K"),
            ("output_norm.weight", np.ones(32, np.float32), "F32"),
        ],
    )
    assert main(["export", str(src), "-o", str(tmp_path / "out.gguf"), "--uniform", "Q4_0"]) == 2
    errors = _errors(capsys)
    assert len(errors) == 1 and "'blk.0.ffn_up.weight' of odd.gguf is stored as Q8_K" in errors[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["odd.gguf"]


def test_eval_and_chat_take_a_gguf_original(chat_model, f32_gguf, gguf_of, tmp_path, capsys, monkeypatch):
    from studio.core.chat import threads as chat_threads

    # the chat's thread share follows the machine's load; the two single-column chats compared below
    # run at the same thread count
    monkeypatch.setattr(chat_threads, "busy_cores", lambda *a, **k: 0.0)
    q8 = gguf_of(chat_model, "Q8_0")
    argv = [
        "eval",
        "--original",
        str(f32_gguf),
        "--variant",
        str(q8),
        "--ctx",
        "64",
        "--chunks",
        "2",
        "--json",
    ]
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["original"]["kind"] == "llama.cpp" and 0 < d["variants"][0]["kld_mean"] < 0.05
    assert main([*argv, "--dequantize", "--device", "cpu"]) == 0
    e = json.loads(capsys.readouterr().out)
    assert e["original"]["kind"] == "transformers"
    # the float32 folder written from the F32 GGUF is the original model: same perplexity
    assert abs(e["original"]["ppl"] - d["original"]["ppl"]) / d["original"]["ppl"] < 1e-3
    chat = ["chat", "--model", str(f32_gguf), "--compare", str(q8), "--prompt", "Hello", "--max-tokens", "6"]
    assert main([*chat, "--json"]) == 0
    models = json.loads(capsys.readouterr().out)["models"]
    assert [m["error"] for m in models] == [None, None] and len(models[0]["tokens"]) == 6
    assert main([*chat, "--json", "--dequantize", "--device", "cpu"]) == 0
    folder = json.loads(capsys.readouterr().out)["models"][0]
    assert (
        main(
            [
                "chat",
                "--model",
                str(chat_model),
                "--prompt",
                "Hello",
                "--max-tokens",
                "6",
                "--device",
                "cpu",
                "--json",
            ]
        )
        == 0
    )
    original = json.loads(capsys.readouterr().out)["models"][0]
    # transformers on the folder written from the F32 GGUF answers exactly as on the original model
    # (the same weights: the same tokens; the probabilities to float32 noise, since torch's CPU kernels
    # may take another vector path for another buffer alignment on AVX-512 machines)
    assert folder["tokens"] == original["tokens"]
    assert np.allclose(folder["probs"], original["probs"], rtol=0, atol=1e-5)


def test_a_gguf_without_a_tokenizer_is_one_sentence_for_chat_and_eval_and_still_exports(tmp_path, capsys):
    from tests.core.model.test_gguf_source import _gguf_with

    bare = _gguf_with(
        tmp_path / "bare.gguf", [("output_norm.weight", np.ones(32, np.float32), "F32")], tokenizer=False
    )
    sentence = "bare.gguf has no tokenizer in its metadata (tokenizer.ggml.*)"
    assert main(["chat", "--model", str(bare), "--prompt", "hi"]) == 2
    errors = _errors(capsys)
    assert len(errors) == 1 and sentence in errors[0]
    assert main(["eval", "--original", str(bare), "--variant", str(bare)]) == 2
    errors = _errors(capsys)
    assert len(errors) == 1 and sentence in errors[0]
    # requantizing needs no tokenizer (llama-quantize does not either): the file is copied as it is
    assert main(["export", str(bare), "-o", str(tmp_path / "copy.gguf"), "--preset", "Q8_0"]) == 0
    assert read(tmp_path / "copy.gguf")[0] == read(bare)[0]
