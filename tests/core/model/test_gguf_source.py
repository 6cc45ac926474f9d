"""A GGUF as the original: decoders, the stored-type summary, and the Hugging Face folder written from it.

The folder round trip (HF → our F32 GGUF → HF folder) must give back the original tensors bit for bit:
that proves the inverse of every transform (llama Q/K permutation, GPT-2 Conv1D transpose, Gemma 2's
norm + 1, tied embeddings, fused Phi-3 projections).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from studio.core.errors import ModelOpenError
from studio.core.jobs import JobCancelled, JobContext, null_context
from studio.core.model import gguf_source, open_model
from studio.core.model.gguf_source import (
    SOURCE_MARKER,
    UnsupportedTensorTypeError,
    can_decode,
    dequantize_tensor,
    folder_is_complete,
    hf_folder_for,
    source_summary,
    write_hf_folder,
)
from tests.core.chat import fixtures as _fixtures

chat_model = _fixtures.chat_model
f32_gguf = _fixtures.f32_gguf
gguf_of = _fixtures.gguf_of


def _tensors(folder: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    out: dict[str, np.ndarray] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update({k: v.astype(np.float32) for k, v in load_file(str(f)).items()})
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma2", "phi3", "gpt2"])
def test_hf_folder_of_an_f32_export_gives_back_the_original_tensors(arch, tiny_model, gguf_of, tmp_path):
    model = tiny_model(arch, layers=1)
    folder = write_hf_folder(gguf_of(model, "F32"), tmp_path / "hf")
    want, got = _tensors(model), _tensors(folder)
    if "lm_head.weight" not in got:  # tied to the embeddings: llama.cpp stores it once
        want.pop("lm_head.weight", None)
    assert sorted(got) == sorted(want)
    for name, w in want.items():
        assert np.array_equal(got[name], w), f"{arch}: {name} differs after the round trip"
    a = json.loads((model / "config.json").read_text())
    b = json.loads((folder / "config.json").read_text())
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        if key in a:
            assert b[key] == a[key], key
    assert b["architectures"] == a["architectures"]
    from transformers import AutoTokenizer

    text = "Hello world, 1234 déjà vu! Быстрая лиса."
    assert (
        AutoTokenizer.from_pretrained(str(folder))(text)["input_ids"]
        == AutoTokenizer.from_pretrained(str(model))(text)["input_ids"]
    )
    assert folder_is_complete(folder) and not list(tmp_path.glob(".*partial"))


def test_hf_folder_keeps_tokenizer_template_and_answers_like_the_original(chat_model, f32_gguf, tmp_path):
    from transformers import AutoTokenizer

    folder = write_hf_folder(f32_gguf, tmp_path / "hf", sha256="ab" * 32)
    tok = AutoTokenizer.from_pretrained(str(folder))
    ref = AutoTokenizer.from_pretrained(str(chat_model))
    msgs = [{"role": "user", "content": "Hi there"}]
    assert tok.apply_chat_template(msgs, tokenize=False) == ref.apply_chat_template(msgs, tokenize=False)
    assert json.loads((folder / SOURCE_MARKER).read_text())["sha256"] == "ab" * 32
    assert folder_is_complete(folder, "ab" * 32) and not folder_is_complete(folder, "cd" * 32)


@pytest.mark.parametrize(
    "qtype",
    ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"],
)
def test_decoders_agree_with_gguf_py_bit_for_bit(qtype):
    import gguf

    from studio.core.quant.blocks import quantize

    x = np.random.default_rng(1).standard_normal((8, 512)).astype(np.float32) * 3
    q = quantize(x, qtype)
    ours = dequantize_tensor(q, qtype, x.shape)
    ref = gguf.quants.dequantize(q, gguf.GGMLQuantizationType[qtype]).reshape(x.shape)
    assert ours.dtype == np.float32 and np.array_equal(ours, ref)


def test_plain_types_and_raw_bytes_decode():
    x = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
    assert np.array_equal(dequantize_tensor(x.view(np.uint8), "F32", (3, 4)), x)
    assert np.array_equal(dequantize_tensor(x.astype(np.float16).view(np.uint8), "F16", (3, 4)), x)
    bf = (x.view(np.uint32) >> 16).astype(np.uint16)
    assert np.array_equal(dequantize_tensor(bf.view(np.uint8), "BF16", (3, 4)), x)
    assert np.array_equal(dequantize_tensor(x.astype(np.int32).view(np.uint8), "I32", (3, 4)), x)
    assert can_decode("IQ2_XXS") and can_decode("MXFP4") and not can_decode("Q8_K")


def _gguf_with(
    path: Path, tensors: list[tuple[str, np.ndarray, tuple[int, ...], str]], tokenizer: bool = True
) -> Path:
    """A small llama GGUF written by gguf-py with the given raw tensors (name, data, numpy shape, type)."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_embedding_length(32)
    if tokenizer:
        w.add_tokenizer_model("gpt2")
        w.add_token_list(["a", "b"])
    for name, data, qtype in tensors:
        w.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[qtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unsupported_tensor_type_is_one_sentence_naming_the_tensor(tmp_path):
    # Q8_K is llama.cpp's dot-product intermediate: a valid ggml type that no decoder turns into floats
    path = _gguf_with(
        tmp_path / "odd.gguf",
        [
            ("token_embd.weight", np.zeros((2, 292), np.uint8), "Q8_K"),
            ("output_norm.weight", np.ones(32, np.float32), "F32"),
        ],
    )
    with open_model(path) as ck:  # the header opens: inspect still works
        assert ck.info.tensor("token_embd.weight").dtype == "Q8_K"
        with pytest.raises(
            UnsupportedTensorTypeError, match="'token_embd.weight' of odd.gguf is stored as Q8_K"
        ):
            ck.read("token_embd.weight")
    with pytest.raises(UnsupportedTensorTypeError, match="stored as Q8_K"):
        write_hf_folder(path, tmp_path / "hf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["odd.gguf"]  # nothing half-written


def test_gguf_without_a_tokenizer_is_refused_before_any_work(tmp_path):
    path = _gguf_with(
        tmp_path / "bare.gguf",
        [("output_norm.weight", np.ones(32, np.float32), "F32")],
        tokenizer=False,
    )
    with pytest.raises(ModelOpenError, match="bare.gguf has no tokenizer in its metadata"):
        write_hf_folder(path, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_cancel_leaves_no_folder_and_an_old_one_is_replaced_whole(f32_gguf, tmp_path):
    target = tmp_path / "hf"
    target.mkdir()
    (target / "junk.txt").write_text("stale")
    ctx = JobContext(
        on_progress=lambda d, t, m: ctx.cancel() if m.startswith("Writing") else None, min_interval=0
    )
    with pytest.raises(JobCancelled):
        write_hf_folder(f32_gguf, target, ctx)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"] and (target / "junk.txt").exists()
    write_hf_folder(f32_gguf, target)
    assert not (target / "junk.txt").exists() and folder_is_complete(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_a_folder_another_process_finished_first_is_kept_not_replaced(f32_gguf, tmp_path):
    """Two exports of one GGUF convert it at once: the later one keeps the folder the other may be reading."""
    target, sha = tmp_path / "hf", "cd" * 32
    write_hf_folder(f32_gguf, target, sha256=sha)
    first = (target / "model.safetensors").stat().st_ino
    write_hf_folder(f32_gguf, target, sha256=sha)  # finds a whole folder of the same file at its end
    assert (target / "model.safetensors").stat().st_ino == first and folder_is_complete(target, sha)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # and no work folder left
    other = hf_folder_for(f32_gguf, cache_dir=tmp_path / "cache")  # named by the file: no sha256 given
    inode = (other / "model.safetensors").stat().st_ino
    write_hf_folder(f32_gguf, other)
    assert (other / "model.safetensors").stat().st_ino == inode
    write_hf_folder(f32_gguf, target, sha256="ef" * 32)  # another file's folder is replaced
    assert (target / "model.safetensors").stat().st_ino != first and folder_is_complete(target, "ef" * 32)


def test_a_second_conversion_waits_for_the_first_and_reuses_its_folder(f32_gguf, tmp_path, monkeypatch):
    """Two commands convert one GGUF at once: the second waits on the first's lock and reuses its folder
    (session 20's race converted it twice, minutes and 7 GB of float32 each for the 1.5B)."""
    target, first = tmp_path / "hf", tmp_path / "first"
    write_hf_folder(f32_gguf, first)  # what the first process is writing
    inode = (first / "model.safetensors").stat().st_ino
    writes: list[Path] = []
    real = gguf_source._write_safetensors
    monkeypatch.setattr(
        gguf_source, "_write_safetensors", lambda path, *a: (writes.append(path), real(path, *a))
    )
    msgs: list[str] = []
    waiting = threading.Event()
    ctx = JobContext(on_progress=lambda d, t, m: (msgs.append(m), m.startswith("Waiting") and waiting.set()),
                     min_interval=0)  # fmt: skip
    got: dict[str, Path] = {}
    with gguf_source._conversion_lock(target, f32_gguf, null_context()):  # the first process holds it
        second = threading.Thread(
            target=lambda: got.setdefault("dir", write_hf_folder(f32_gguf, target, ctx))
        )
        second.start()
        assert waiting.wait(20), msgs
        assert (
            msgs == [f"Waiting for another conversion of {f32_gguf.name} to finish"] and not target.exists()
        )
        os.replace(first, target)  # the first process moves its finished folder into place
    second.join(60)
    assert got["dir"] == target and writes == [], writes  # reused, not converted again
    assert (target / "model.safetensors").stat().st_ino == inode and folder_is_complete(target)


def test_a_wait_for_another_conversion_can_be_cancelled(f32_gguf, tmp_path):
    target = tmp_path / "hf"
    ctx = JobContext(
        on_progress=lambda d, t, m: ctx.cancel() if m.startswith("Waiting") else None, min_interval=0
    )
    with gguf_source._conversion_lock(target, f32_gguf, null_context()):
        with pytest.raises(JobCancelled):
            write_hf_folder(f32_gguf, target, ctx)
    assert list(tmp_path.iterdir()) == []
    write_hf_folder(f32_gguf, target)  # the lock was given back: a later conversion runs
    assert folder_is_complete(target)


def test_source_summary_warns_only_for_quantized_matrices(chat_model, gguf_of):
    from studio.core.gguf.read import read_gguf

    f32 = source_summary(read_gguf(gguf_of(chat_model, "F32")))
    assert f32.warning is None and not f32.quantized and f32.main_type == "F32" and f32.bpw == 32.0
    q8 = source_summary(read_gguf(gguf_of(chat_model, "Q8_0")))
    assert q8.quantized and q8.main_type == "Q8_0" and "already quantized" in q8.warning
    assert "Q8_0 (" in q8.describe() and "bits per weight" in q8.describe()
