"""``export --imatrix`` equals llama.cpp's quantizer with that imatrix, tensor by tensor, for every block type."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from studio.core.calib.imatrix import read_imatrix
from studio.core.export.run import export_gguf
from studio.core.model import open_model
from studio.core.plan.plan import Override, plan_uniform
from studio.core.quant.reference import ggml_quantize

# One export covers every type the plan can name: each blk.* matrix of the tiny llama gets another type.
SPREAD = {
    r"blk\.0\.attn_q\.": "Q2_K",
    r"blk\.0\.attn_k\.": "Q3_K",
    r"blk\.0\.attn_v\.": "Q4_K",
    r"blk\.0\.attn_output\.": "Q5_K",
    r"blk\.0\.ffn_gate\.": "Q6_K",
    r"blk\.0\.ffn_up\.": "Q4_0",
    r"blk\.0\.ffn_down\.": "Q4_1",
    r"blk\.1\.attn_q\.": "Q5_0",
    r"blk\.1\.attn_k\.": "Q5_1",
    r"blk\.1\.attn_v\.": "Q8_0",
    r"blk\.1\.attn_output\.": "IQ4_NL",
}


@pytest.fixture(scope="module")
def f32_values(llama_model, tmp_path_factory):
    out = export_gguf(llama_model, tmp_path_factory.mktemp("f32") / "f32.gguf", "F32").path
    return {t.name: np.array(t.data, dtype=np.float32) for t in gguf.GGUFReader(out).tensors}


def test_export_with_imatrix_equals_ggml_quantize_chunk(
    llama_model, llama_imatrix_file, f32_values, tmp_path
):
    im = read_imatrix(llama_imatrix_file)
    with open_model(llama_model) as ck:
        plan = plan_uniform(ck.info, "Q4_K", [Override(rx, t) for rx, t in SPREAD.items()])
    res = export_gguf(llama_model, tmp_path / "spread.gguf", plan, imatrix=im)
    seen, changed = set(), 0
    for t in gguf.GGUFReader(res.path).tensors:
        qtype = t.tensor_type.name
        if qtype in ("F32", "F16"):
            continue
        x = f32_values[t.name]
        qw = im[t.name] if t.name in im else None
        want = ggml_quantize(x.reshape(-1, x.shape[-1]), qtype, qw)
        got = np.array(t.data).view(np.uint8).reshape(want.shape)
        assert np.array_equal(got, want), (
            f"{t.name} ({qtype}) differs from ggml_quantize_chunk with the imatrix"
        )
        if qw is not None:
            seen.add(qtype)
            plain = ggml_quantize(x.reshape(-1, x.shape[-1]), qtype, None)
            changed += not np.array_equal(want, plain)
            assert qtype == "Q8_0" or not np.array_equal(want, plain), f"{qtype} ignored the imatrix"
    assert seen == set(SPREAD.values()) | {"Q4_K"}  # 12 types, every one with an imatrix
    meta = {f.name for f in gguf.GGUFReader(res.path).fields.values()}
    assert {
        "quantize.imatrix.file",
        "quantize.imatrix.entries_count",
        "quantize.imatrix.chunks_count",
    } <= meta


def test_iq4_xs_with_imatrix_equals_ggml_quantize_chunk(llama_imatrix_file, f32_values):
    """IQ4_XS is not yet in the plan's type table (issue 11 adds it); its quantizer takes the imatrix."""
    from studio.core.quant.blocks import quantize

    im = read_imatrix(llama_imatrix_file)
    for name in ("blk.0.attn_q.weight", "blk.1.ffn_down.weight"):
        x = f32_values[name].reshape(-1, f32_values[name].shape[-1])
        want = ggml_quantize(x, "IQ4_XS", im[name])
        assert np.array_equal(quantize(x, "IQ4_XS", im[name]).reshape(want.shape), want)
        assert not np.array_equal(want, ggml_quantize(x, "IQ4_XS", None))


def test_llama_cpp_backend_records_the_imatrix_too(llama_model, llama_imatrix_file, tmp_path):
    im = read_imatrix(llama_imatrix_file)
    a = export_gguf(llama_model, tmp_path / "a.gguf", "Q4_K_M", imatrix=im, backend="studio")
    b = export_gguf(llama_model, tmp_path / "b.gguf", "Q4_K_M", imatrix=im, backend="llama.cpp")
    ra, rb = gguf.GGUFReader(a.path), gguf.GGUFReader(b.path)
    ta = {t.name: bytes(t.data) for t in ra.tensors}
    tb = {t.name: bytes(t.data) for t in rb.tensors}
    assert ta == tb
    kb = {f.name for f in rb.fields.values() if f.name.startswith("quantize.imatrix.")}
    assert len(kb) == 4
