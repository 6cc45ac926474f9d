"""The imatrix in llama.cpp's formats: round trips, llama.cpp's own tools reading ours, other models refused."""

from __future__ import annotations

import subprocess

import gguf
import numpy as np
import pytest

from studio.core.calib.imatrix import (
    Imatrix,
    ImatrixEntry,
    check_for_model,
    imatrix_from_stats,
    read_imatrix,
    write_imatrix,
)
from studio.core.errors import CalibrationError
from studio.core.model import open_model

from .conftest import CHUNKS, CTX, llama_tool


def _info(model):
    with open_model(model) as ck:
        return ck.info


def test_semantics_follow_llama_imatrix(llama_model, llama_stats):
    im = imatrix_from_stats(llama_stats, _info(llama_model))
    # blk.* only: 7 matrices per layer, no output.weight unless asked (and this head is untied)
    assert len(im) == 14 and all(n.startswith("blk.") for n in im)
    assert im.chunk_count == CHUNKS and im.chunk_size == CTX
    e = im.entries["blk.0.attn_q.weight"]
    assert e.counts.tolist() == [CHUNKS * CTX] and e.sums.shape == (1, 256)
    st = llama_stats.inputs["model.layers.0.self_attn.q_proj.weight"]
    np.testing.assert_array_equal(
        im["blk.0.attn_q.weight"], (st.sum_sq[0].astype(np.float32) / np.float32(CHUNKS * CTX))
    )


def test_gguf_file_has_llama_cpps_layout(llama_imatrix_file):
    r = gguf.GGUFReader(llama_imatrix_file)
    keys = [f.name for f in r.fields.values() if not f.name.startswith("GGUF.")]
    assert keys == ["general.type", "imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size"]
    assert bytes(r.fields["general.type"].parts[-1]).decode() == "imatrix"
    names = [t.name for t in r.tensors]
    assert names == sorted(names, key=lambda n: (n.rsplit(".", 1)[0], n.endswith(".counts")))
    t = {t.name: t for t in r.tensors}
    assert list(t["blk.0.ffn_down.weight.in_sum2"].shape) == [768, 1]  # ne = [n_cols, n_experts]
    assert list(t["blk.0.ffn_down.weight.counts"].shape) == [1, 1]
    assert all(x.tensor_type == gguf.GGMLQuantizationType.F32 for x in r.tensors)


def test_gguf_and_dat_round_trip(llama_model, llama_stats, tmp_path):
    im = imatrix_from_stats(llama_stats, _info(llama_model))
    g = read_imatrix(write_imatrix(im, tmp_path / "a.gguf").path)
    d = read_imatrix(write_imatrix(im, tmp_path / "a.dat").path)
    assert not g.legacy and d.legacy and set(g) == set(d) == set(im)
    assert d.chunk_count == g.chunk_count == CHUNKS and d.datasets == g.datasets == im.datasets
    for n in im:
        np.testing.assert_array_equal(g[n], im[n])
        # .dat stores (Σx²/count)·ncall and llama-quantize divides by ncall: float32 rounding only
        np.testing.assert_allclose(d[n], im[n], rtol=3e-7)
        assert d.entries[n].counts.tolist() == [(CHUNKS * CTX + CTX - 1) // CTX]
    assert not (tmp_path / "a.gguf.partial").exists() and not (tmp_path / "a.dat.partial").exists()


def test_experts_keep_their_own_counts(tmp_path):
    sums = np.array([[4.0, 8.0], [0.0, 0.0], [3.0, 6.0]], dtype=np.float32)
    im = Imatrix(
        {
            "blk.0.ffn_down_exps.weight": ImatrixEntry(
                "blk.0.ffn_down_exps.weight", sums, np.array([2, 0, 3], np.float32)
            )
        },
        ("d",),
        1,
        4,
    )
    want = np.array(
        [2, 4, 1, 1, 1, 2], dtype=np.float32
    )  # an expert that saw no token gets 1, as in llama-quantize
    np.testing.assert_array_equal(im["blk.0.ffn_down_exps.weight"], want)
    back = read_imatrix(write_imatrix(im, tmp_path / "moe.gguf").path)
    np.testing.assert_array_equal(back["blk.0.ffn_down_exps.weight"], want)
    assert back.entries["blk.0.ffn_down_exps.weight"].counts.tolist() == [2, 0, 3]
    dat = read_imatrix(write_imatrix(im, tmp_path / "moe.dat").path)
    np.testing.assert_allclose(dat["blk.0.ffn_down_exps.weight"], want)


def test_quantize_metadata_as_llama_quantize_writes_it(llama_imatrix_file):
    im = read_imatrix(str(llama_imatrix_file))
    meta = dict(im.quantize_metadata())
    assert meta == {
        "quantize.imatrix.file": str(llama_imatrix_file),
        "quantize.imatrix.dataset": im.datasets[0],
        "quantize.imatrix.entries_count": 14,
        "quantize.imatrix.chunks_count": CHUNKS,
    }
    long = im.with_path("/" + "x" * 300 + ".gguf")
    assert len(dict(long.quantize_metadata())["quantize.imatrix.file"].encode()) == 127


def test_another_models_imatrix_is_refused(llama_imatrix_file, odd_hidden_model, tiny_model):
    im = read_imatrix(llama_imatrix_file)
    with pytest.raises(CalibrationError) as exc:
        check_for_model(im, _info(odd_hidden_model))  # hidden 320 instead of 256
    msg = str(exc.value)
    assert (
        "was made for another model" in msg and "256 values" in msg and "needs 320" in msg and "\n" not in msg
    )
    one_layer = tiny_model("llama", layers=1)
    with pytest.raises(CalibrationError, match=r"entry for blk\.1\..* does not have"):
        check_for_model(im, _info(one_layer))
    check_for_model(im, _info(tiny_model("llama")))  # its own model is fine


def test_damaged_files_are_refused(llama_imatrix_file, tmp_path, llama_model):
    data = llama_imatrix_file.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 2])
    with pytest.raises(CalibrationError):
        read_imatrix(tmp_path / "cut.gguf")
    (tmp_path / "junk.dat").write_bytes(b"\x05\x00\x00\x00" + b"\xff" * 10)
    with pytest.raises(CalibrationError, match="neither a GGUF imatrix nor"):
        read_imatrix(tmp_path / "junk.dat")
    # a model GGUF is not an imatrix
    from studio.core.export.run import export_gguf

    model = export_gguf(llama_model, tmp_path / "model.gguf", "F32").path
    with pytest.raises(CalibrationError, match="without imatrix metadata"):
        read_imatrix(model)


def test_llama_imatrix_computes_the_same(llama_model, llama_imatrix_file, calib_text, tmp_path):
    """llama.cpp's own llama-imatrix on our F32 export of the same model and text agrees with ours."""
    tool = llama_tool("llama-imatrix")
    from studio.core.export.run import export_gguf

    f32 = export_gguf(llama_model, tmp_path / "f32.gguf", "F32").path
    out = tmp_path / "theirs.gguf"
    subprocess.run(
        [
            str(tool),
            "-m",
            str(f32),
            "-f",
            str(calib_text),
            "-c",
            str(CTX),
            "--chunks",
            str(CHUNKS),
            "-o",
            str(out),
            "--no-ppl",
            "-t",
            "2",
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    ours, theirs = read_imatrix(llama_imatrix_file), read_imatrix(out)
    assert set(ours) == set(theirs) and theirs.chunk_count == CHUNKS
    for n in ours:
        assert ours.entries[n].counts.tolist() == theirs.entries[n].counts.tolist()
        rel = np.abs(ours[n] - theirs[n]) / np.abs(theirs[n])
        assert np.median(rel) < 1e-3 and rel.max() < 1e-2, n


@pytest.mark.parametrize("fmt", ["gguf", "dat"])
def test_llama_quantize_reads_ours_and_writes_what_we_write(llama_model, llama_stats, tmp_path, fmt):
    """llama-quantize loads our file (both formats); its Q4_K_M equals ours byte for byte, metadata too."""
    tool = llama_tool("llama-quantize")
    from studio.cli import main

    im = imatrix_from_stats(llama_stats, _info(llama_model))
    path = str(tmp_path / f"imatrix.{fmt}")
    write_imatrix(im, path)
    assert main(["export", str(llama_model), "-o", str(tmp_path / "f32.gguf"), "--preset", "F32"]) == 0
    assert (
        main(
            [
                "export",
                str(llama_model),
                "-o",
                str(tmp_path / "ours.gguf"),
                "--preset",
                "Q4_K_M",
                "--imatrix",
                path,
            ]
        )
        == 0
    )
    r = subprocess.run(
        [
            str(tool),
            "--imatrix",
            path,
            str(tmp_path / "f32.gguf"),
            str(tmp_path / "theirs.gguf"),
            "Q4_K_M",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "loaded 14 importance matrix entries" in r.stdout + r.stderr
    a, b = gguf.GGUFReader(tmp_path / "ours.gguf"), gguf.GGUFReader(tmp_path / "theirs.gguf")
    ta = {t.name: (t.tensor_type, bytes(t.data)) for t in a.tensors}
    tb = {t.name: (t.tensor_type, bytes(t.data)) for t in b.tensors}
    assert ta.keys() == tb.keys()
    for n in ta:
        assert ta[n] == tb[n], n

    def kv(r):
        out = {}
        for f in r.fields.values():
            if f.name.startswith("quantize.imatrix."):
                v = f.parts[f.data[0]]
                out[f.name] = (
                    bytes(v).decode() if f.types[0] == gguf.GGUFValueType.STRING else (int(v[0]), f.types[0])
                )
        return out

    assert kv(a) == kv(b) and len(kv(a)) == 4
