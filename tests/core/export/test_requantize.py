"""Export from a GGUF original: what llama-quantize --allow-requantize writes, tensor for tensor.

The reference is llama.cpp's own ``llama_model_quantize`` run on the same file in the child process
(``_op_quantize``), so no llama.cpp build is needed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from studio.core.export.run import export_gguf
from studio.core.plan.presets import PRESETS
from tests.core.chat import fixtures as _fixtures

chat_model = _fixtures.chat_model
gguf_of = _fixtures.gguf_of


@pytest.fixture(scope="module")
def worker() -> Iterator[Any]:
    """One llama.cpp child for the module."""
    from studio.core.llamacpp import LlamaWorker

    w = LlamaWorker(label="llama.cpp (requantize tests)")
    yield w
    w.close()


def read(path: Path) -> tuple[dict[str, tuple[str, bytes]], list[str], dict[str, Any]]:
    """(name → (type, bytes)), tensor order and metadata (key → contents), read with gguf-py."""
    import gguf

    r = gguf.GGUFReader(path)
    tensors = {t.name: (t.tensor_type.name, bytes(t.data)) for t in r.tensors}
    meta = {f.name: f.contents() for f in r.fields.values() if not f.name.startswith("GGUF.")}
    return tensors, [t.name for t in r.tensors], meta


def llama_quantize(worker: Any, src: Path, dst: Path, preset: str) -> Path:
    """llama.cpp's own quantizer on ``src`` with the preset's file type (llama-quantize --allow-requantize)."""
    worker.request(
        "quantize",
        src=str(src),
        dst=str(dst),
        ftype=PRESETS[preset].ftype,
        nthread=os.cpu_count() or 1,  # the bytes do not depend on the thread count
        allow_requantize=True,
    )
    return dst


@pytest.mark.parametrize(
    ("source", "preset"),
    [
        ("F32", "Q8_0"),
        ("F32", "Q4_K_M"),
        ("F16", "Q4_K_M"),
        ("BF16", "Q6_K"),
        ("F16", "Q2_K"),
        ("Q8_0", "Q4_K_M"),
    ],
)
def test_requantized_tensors_equal_llama_quantize(source, preset, chat_model, gguf_of, worker, tmp_path):
    src = gguf_of(chat_model, source)
    ref_t, ref_order, ref_meta = read(llama_quantize(worker, src, tmp_path / "ref.gguf", preset))
    res = export_gguf(src, tmp_path / "ours.gguf", preset)
    got_t, got_order, got_meta = read(res.path)
    assert got_order == ref_order  # llama.cpp's tensor order
    for name, (t, data) in ref_t.items():
        assert got_t[name][0] == t, f"{name}: {got_t[name][0]} vs llama.cpp {t}"
        assert got_t[name][1] == data, f"{name} ({t}): bytes differ from llama_model_quantize"
    # every key llama.cpp writes, with the same value (the studio adds only its own quant_studio.* keys)
    ours = {k: v for k, v in got_meta.items() if not k.startswith("quant_studio.")}
    theirs = {k: v for k, v in ref_meta.items() if not k.startswith("quant_studio.")}
    assert list(ours) == list(theirs) and ours == theirs
    assert got_meta["general.file_type"] == PRESETS[preset].ftype
    warned = any("already quantized" in n for n in res.notes)
    assert warned == (source == "Q8_0")


def test_metadata_tokenizer_and_template_carry_over(chat_model, gguf_of, tmp_path):
    src = gguf_of(chat_model, "F16")
    out = export_gguf(src, tmp_path / "q.gguf", "Q4_K_M").path
    _, _, a = read(src)
    _, _, b = read(out)
    for key in (
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.model",
        "tokenizer.chat_template",
        "general.architecture",
    ):
        assert b[key] == a[key], key
    assert '"preset": "Q4_K_M"' in b["quant_studio.plan"]


def test_a_tensor_already_of_its_planned_type_is_copied_byte_for_byte(chat_model, gguf_of, tmp_path):
    src = gguf_of(chat_model, "Q8_0")
    res = export_gguf(src, tmp_path / "same.gguf", "Q8_0")
    a, _, _ = read(src)
    b, _, _ = read(res.path)
    assert a == b
    assert any("copied unchanged" in n for n in res.notes)


def test_llamacpp_backend_follows_the_plan_from_a_gguf(chat_model, gguf_of, tmp_path):
    src = gguf_of(chat_model, "F32")
    studio = export_gguf(src, tmp_path / "studio.gguf", "Q4_K_M")
    cpp = export_gguf(src, tmp_path / "cpp.gguf", "Q4_K_M", backend="llama.cpp")
    assert cpp.tensor_types == studio.tensor_types
    a, _, _ = read(studio.path)
    b, _, _ = read(cpp.path)
    assert a == b  # both quantizers write the same bytes without an imatrix


def test_verification_of_a_requantized_file_runs_both_in_llama_cpp(chat_model, gguf_of, tmp_path):
    from studio.core.export.verify import verify_gguf

    src = gguf_of(chat_model, "F32")
    out = export_gguf(src, tmp_path / "q8.gguf", "Q8_0").path
    same = verify_gguf(src, src, max_tokens=24)
    assert same.top1_agreement == 1.0 and same.max_abs_diff == 0.0
    v = verify_gguf(out, src, max_tokens=24)
    assert v.n_tokens == 24 and v.top1_agreement >= 0.9 and 0 < v.mean_kl < 0.01
