"""The ggml types gguf-py cannot name yet (Q2_0 in gguf 0.19): their facts are the pinned llama.cpp's,
and the studio writes, reads back (with the bounded reader's checks) and decodes them."""

from __future__ import annotations

import os
import re
from pathlib import Path

import gguf
import numpy as np
import pytest

from studio.core.errors import CorruptFileError
from studio.core.ggml_types import NEWER_THAN_GGUF_PY, ggml_type_id, ggml_types
from studio.core.gguf.read import read_gguf
from studio.core.gguf.writer import AtomicGGUFWriter
from studio.core.hub.gguf_quant import file_type_name, quant_type_from_name
from studio.core.model.gguf_source import can_decode, dequantize_tensor
from studio.core.quant import blocks
from studio.core.quant import reference as ref
from studio.core.quant.types import QTYPES, fallback_type, ftype_name, ftype_of, qtype_info

LLAMA_SRC = Path(os.environ.get("QS_LLAMA_SRC", "/work/llama.cpp/src"))


def test_the_studio_names_q2_0_whatever_gguf_py_is_installed():
    info = QTYPES["Q2_0"]
    assert (info.type_id, info.block_size, info.type_size, info.ftype) == (42, 64, 18, 41)
    assert info.bits_per_weight == 2.25 and info.fallback == "Q4_0" and not info.needs_imatrix
    assert qtype_info(42) is info and qtype_info("q2_0") is info and qtype_info(12).name == "Q4_K"
    assert ftype_of("Q2_0") == 41 and ftype_name(41) == "Q2_0" and file_type_name(41) == "Q2_0"
    assert ggml_type_id("Q2_0") == 42 and ggml_type_id("Q4_K") == 12
    assert ggml_types()[42] == ("Q2_0", 64, 18)
    assert fallback_type("Q2_0", 576).qtype == "Q2_0" and fallback_type("Q2_0", 96).qtype == "Q4_0"
    assert quant_type_from_name("SmolLM2-135M-Q2_0.gguf") == "Q2_0"
    # gguf-py's own entries always win: the table only adds what it lacks
    for name, t in NEWER_THAN_GGUF_PY.items():
        if name in gguf.GGMLQuantizationType.__members__:
            assert int(gguf.GGMLQuantizationType[name]) == t.type_id


@pytest.mark.skipif(not ref.available(), reason="llama-cpp-python's ggml library is missing")
@pytest.mark.parametrize("name", list(NEWER_THAN_GGUF_PY))
def test_newer_types_are_the_pinned_ggml_librarys(name):
    """Number, block and bytes as the ggml library llama-cpp-python ships (the pinned build) states them."""
    t = NEWER_THAN_GGUF_PY[name]
    traits = ref._lib().ggml_get_type_traits(t.type_id).contents
    assert traits.type_name.decode().upper() == name
    assert (int(traits.blck_size), int(traits.type_size)) == (t.block_size, t.type_size)
    assert ref.ggml_row_size(name, 4 * t.block_size) == 4 * t.type_size


@pytest.mark.parametrize("name", list(NEWER_THAN_GGUF_PY))
def test_newer_types_are_the_pinned_trees_gguf_py(name):
    """The same facts in the gguf-py vendored with the pinned llama.cpp (the converter bundle install.sh
    makes, else the extracted sdist's copy); CI installs the bundle, so there this never skips."""
    from studio.core.gguf.converter_bundle import converter_available, load_bundle_gguf

    t = NEWER_THAN_GGUF_PY[name]
    ok, why = converter_available()
    if ok:
        g = load_bundle_gguf()
        q = g.GGMLQuantizationType[name]
        assert int(q) == t.type_id
        assert tuple(g.GGML_QUANT_SIZES[q]) == (t.block_size, t.type_size)
        assert int(g.LlamaFileType[f"MOSTLY_{name}"]) == t.ftype
        return
    if os.environ.get("QUANT_STUDIO_REQUIRE_CONVERTER"):
        pytest.fail(f"llama.cpp's converter must be installed here: {why}")
    consts = LLAMA_SRC / "gguf-py" / "gguf" / "constants.py"
    if not consts.is_file():
        pytest.skip(str(why))
    text = consts.read_text()
    assert int(re.search(rf"\n\s+{name}\s*=\s*(\d+)", text).group(1)) == t.type_id
    assert int(re.search(rf"MOSTLY_{name}\s*=\s*(\d+)", text).group(1)) == t.ftype


def _q2_0_file(path: Path, rows: int = 3, cols: int = 128) -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(3).standard_normal((rows, cols)).astype(np.float32)
    q = blocks.quantize(x, "Q2_0")
    with AtomicGGUFWriter(path, "llama") as w:
        w.add_tensor_info("blk.0.ffn_up.weight", x.shape, "Q2_0", q.nbytes)
        w.begin()
        w.write_tensor("blk.0.ffn_up.weight", q)
        w.commit()  # validates by re-reading the header with the bounded reader
    return x, q


def test_a_q2_0_tensor_is_written_read_back_and_decoded(tmp_path):
    p = tmp_path / "q2.gguf"
    x, q = _q2_0_file(p)
    g = read_gguf(p)
    (t,) = g.tensors
    assert (t.type_id, t.type_name, t.shape, t.nbytes) == (42, "Q2_0", (3, 128), q.nbytes)
    raw = np.frombuffer(p.read_bytes(), np.uint8, count=t.nbytes, offset=t.offset)
    assert np.array_equal(raw, q.reshape(-1))
    assert can_decode("Q2_0")
    y = dequantize_tensor(raw, "Q2_0", t.shape)
    assert y.shape == x.shape and np.corrcoef(y.ravel(), x.ravel())[0, 1] > 0.6  # a real reconstruction
    if ref.available():  # llama.cpp's own to_float reads the same values
        np.testing.assert_array_equal(y, ref.ggml_dequantize(q, "Q2_0", x.shape))


def test_a_damaged_q2_0_file_is_refused(tmp_path):
    p = tmp_path / "q2.gguf"
    _q2_0_file(p)
    data = p.read_bytes()
    head = read_gguf(p)
    (t,) = head.tensors
    short = tmp_path / "short.gguf"
    short.write_bytes(data[: t.offset + t.nbytes - 1])  # the tensor's last byte is missing
    with pytest.raises(CorruptFileError, match="beyond the end of the file"):
        read_gguf(short)
    # a row of 96 values is not a multiple of Q2_0's 64-value block: the header is refused
    odd = tmp_path / "odd.gguf"
    needle = np.array([128, 3], "<u8").tobytes()
    at = data.index(needle, 0, head.data_start)
    odd.write_bytes(data[:at] + np.array([96, 3], "<u8").tobytes() + data[at + 16 :])
    with pytest.raises(CorruptFileError, match="not a multiple of Q2_0's block of 64"):
        read_gguf(odd)


def test_a_q2_0_export_opens_as_an_original_and_requantizes(tiny_model, tmp_path):
    """The studio's Q2_0 file as a model source: inspect reads its types, a tensor decodes as llama.cpp
    decodes it, and it requantizes (a GGUF original) to Q8_0."""
    from studio.core.export.run import export_gguf
    from studio.core.model import open_model

    model = tiny_model("llama")
    q2 = export_gguf(model, tmp_path / "m-Q2_0.gguf", "Q2_0").path
    g = read_gguf(q2)
    t = next(t for t in g.tensors if t.name == "blk.0.ffn_up.weight")
    assert t.type_name == "Q2_0" and g.metadata["general.file_type"] == 41
    raw = np.fromfile(q2, np.uint8, count=t.nbytes, offset=t.offset)
    with open_model(q2) as ck:
        assert ck.info.tensor(t.name).dtype == "Q2_0"
        w = np.asarray(ck.read(t.name), np.float32)
    if ref.available():
        np.testing.assert_array_equal(w, ref.ggml_dequantize(raw, "Q2_0", t.shape))
    out = export_gguf(q2, tmp_path / "m-Q8_0.gguf", "Q8_0").path
    assert {t.type_name for t in read_gguf(out).tensors} <= {"Q8_0", "F32"}


def test_the_row_check_finds_a_q2_0_block_with_an_infinite_scale():
    """llama-quantize's ggml_validate_row_data checks Q2_0's fp16 d; so does the writer's row check."""
    from studio.core.gguf.rowcheck import RowCheck, first_bad_block

    q = blocks.quantize(np.random.default_rng(0).standard_normal((2, 128)).astype(np.float32), "Q2_0")
    assert first_bad_block("Q2_0", q.reshape(-1)) is None
    q.reshape(-1, 18)[2, 0:2] = np.frombuffer(np.float16(np.inf).tobytes(), np.uint8)
    assert first_bad_block("Q2_0", q.reshape(-1)) == 2
    check = RowCheck("Q2_0")
    assert check.feed(q.reshape(-1)[:40]) is None and check.feed(q.reshape(-1)[40:]) == 2
