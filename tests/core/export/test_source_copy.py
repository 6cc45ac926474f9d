"""A folder converted from a GGUF keeps the tensors the GGUF stores in their planned type byte for byte, as
llama-quantize does, in the plain export and in a calibrated one; values a method changed are never copied."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.core.calib import conftest as _calib

calib_text = _calib.calib_text  # fixture

CTX, CHUNKS = 64, 24  # 1536 tokens: twice the 768 columns of the tiny llama's down_proj


def _tensors(path: Path) -> dict[str, tuple[str, bytes]]:
    from studio.core.gguf.read import read_gguf

    data = path.read_bytes()
    return {t.name: (t.type_name, data[t.offset : t.offset + t.nbytes]) for t in read_gguf(path).tensors}


@pytest.fixture(scope="module")
def born(llama_model, tmp_path_factory):
    """(the tiny llama exported to Q4_K_M, the float32 folder converted from that file)."""
    from studio.core.export.run import export_gguf
    from studio.core.model.gguf_source import hf_folder_for

    root = tmp_path_factory.mktemp("born")
    src = root / "born-q4km.gguf"
    export_gguf(llama_model, src, "Q4_K_M")
    return src, hf_folder_for(src, cache_dir=root / "cache")


def test_rounding_the_stored_values_again_would_change_them(born):
    """The premise: llama.cpp's own search does not recover a Q4_K tensor's bytes from its values."""
    from studio.core.gguf.read import read_gguf
    from studio.core.model.gguf_source import dequantize_tensor
    from studio.core.quant import blocks

    src, _ = born
    shapes = {t.name: t.shape for t in read_gguf(src).tensors}
    changed = 0
    for name, (qtype, raw) in _tensors(src).items():
        if qtype != "Q4_K":
            continue
        shape = shapes[name]
        rows = np.frombuffer(raw, np.uint8).reshape(shape[0], -1)
        again = blocks.quantize(dequantize_tensor(rows, qtype, shape), qtype)
        changed += not np.array_equal(again, rows)
    assert changed >= 4


def test_the_plain_export_of_the_folder_copies_every_stored_tensor(born, tmp_path):
    from studio.core.export.run import export_gguf

    src, folder = born
    out = tmp_path / "again.gguf"
    res = export_gguf(folder, out, "Q4_K_M")
    want, got = _tensors(src), _tensors(out)
    assert got == want  # every tensor: the quantized ones copied, the F32 norms written as they were
    n = sum(1 for q, _ in want.values() if q not in ("F32", "F16"))
    assert any(f"{n} tensor(s) already stored in their planned type in {src.name}" in x for x in res.notes)


def test_gptq_copies_what_keeps_its_type_and_rounds_the_rest(born, calib_text, tmp_path):
    from studio.core.calib.quantize import export_calibrated
    from studio.core.model import open_model
    from studio.core.plan.plan import plan_from_preset, with_method

    src, folder = born
    with open_model(folder) as ck:
        info = ck.info
    plan = with_method(plan_from_preset(info, "Q3_K_M", imatrix=True), info, "gptq")
    out = tmp_path / "q3km.gguf"
    res = export_calibrated(folder, out, plan, text=calib_text, n_ctx=CTX, n_chunks=CHUNKS, device="cpu")
    want, got = _tensors(src), _tensors(out)
    kept = [n for n in want if got[n][0] == want[n][0] and want[n][0] not in ("F32", "F16")]
    moved = [n for n in want if got[n][0] != want[n][0]]
    assert kept and moved  # Q3_K_M keeps attn_output, some attn_v/ffn_down and the head at their types
    assert all(got[n][1] == want[n][1] for n in kept)
    assert any(f"{len(kept)} tensor(s) already stored" in w for w in res.warnings)
    by_name = {t.name: t.method for layer in res.layers for t in layer.tensors}
    copies = {n for n, m in by_name.items() if m == "copy"}
    assert copies and all(by_name[n] == "gptq" for n in by_name if n not in copies)


def test_a_value_that_differs_or_a_changed_source_gets_no_copy(born, tmp_path):
    from studio.core.export.source_copy import stored_source
    from studio.core.gguf.read import read_gguf
    from studio.core.model.gguf_source import dequantize_tensor

    src, folder = born
    stored = stored_source(folder)
    assert stored is not None and stored.path == src.resolve()
    t = next(t for t in read_gguf(src).tensors if t.type_name == "Q4_K")
    raw = stored.raw_rows(t)
    x = dequantize_tensor(raw, "Q4_K", t.shape)
    assert np.array_equal(stored.copy_of(t.name, "Q4_K", t.shape, [x[:3], x[3:]]), raw)
    y = x.copy()
    y[-1, -1] = np.nextafter(y[-1, -1], np.float32(np.inf))  # one ulp on the last value
    assert stored.copy_of(t.name, "Q4_K", t.shape, [y]) is None
    assert stored.copy_of(t.name, "Q5_K", t.shape, [x]) is None  # another type is rounded, not copied

    moved = tmp_path / "folder"
    shutil.copytree(folder, moved)
    assert stored_source(moved) is not None
    with open(src, "ab") as f:  # the source changed since the folder was made
        f.write(b"\0")
    try:
        assert stored_source(moved) is None
    finally:
        with open(src, "r+b") as f:
            f.truncate(src.stat().st_size - 1)


def _scan_of(src: Path, kl: float = 0.1):
    """A scan of ``src``'s quantized tensors with Q4_K and Q8_0 candidates at KL ``kl`` each."""
    from studio.core.gguf.read import read_gguf
    from studio.core.plan.scan import Sensitivity, TensorSensitivity, TypeCost
    from studio.core.quant.types import tensor_bytes

    tensors = []
    for t in read_gguf(src).tensors:
        if t.type_name in ("F32", "F16"):
            continue
        by = {q: TypeCost(q, kl, tensor_bytes(q, t.shape), q, True) for q in ("Q4_K", "Q8_0")}
        tensors.append(TensorSensitivity(t.name, t.name, "", 0, int(np.prod(t.shape)), by))
    return Sensitivity("m", "text", "exact", "imatrix", ("Q4_K", "Q8_0"), 64, tuple(tensors))


def test_the_plan_counts_a_stored_type_as_free_only_where_the_export_copies(born, llama_model):
    import dataclasses

    from studio.core.calib.stored_types import with_stored_copies

    src, folder = born
    scan = _scan_of(src)
    stored = {n: q for n, (q, _) in _tensors(src).items()}
    planned, note = with_stored_copies(scan, folder, "imatrix")
    free = [t.gguf_name for t in planned.tensors if t.by_type["Q4_K"].kl == 0.0]
    assert free == [t.gguf_name for t in scan.tensors if stored[t.gguf_name] == "Q4_K"] and free
    assert all(t.by_type["Q8_0"].kl == 0.1 for t in planned.tensors)  # not its stored type: as measured
    assert note.startswith(f"{len(free)} tensor(s) cost no error at their stored type in {src.name}")
    assert with_stored_copies(scan, folder, "gptq")[1]  # GPTQ leaves a tensor's values as they are too
    for args in ((scan, folder, "awq+gptq"), (dataclasses.replace(scan, rotation=3), folder, "imatrix")):
        assert with_stored_copies(*args) == (args[0], "")  # AWQ's scales and rotations change the values
    assert with_stored_copies(scan, llama_model, "imatrix") == (scan, "")  # not a converted folder


def test_plan_of_a_converted_folder_says_which_types_are_free(born, tmp_path, capsys, monkeypatch):
    import json

    from studio.cli import main
    from studio.core.factory import sample_text

    monkeypatch.setenv("QUANT_STUDIO_CACHE", str(tmp_path / "cache"))
    text = tmp_path / "calib.txt"
    text.write_text(sample_text(), encoding="utf-8")
    src, folder = born
    scan = ["--types", "Q4_K,Q8_0", "--exact", "--scan-ctx", "32", "--scan-chunks", "2"]
    scan += ["--calib-ctx", "64", "--calib-chunks", "4"]
    budget = str(src.stat().st_size + 200_000)
    argv = [
        "plan",
        str(folder),
        "--budget",
        budget,
        "-o",
        str(tmp_path / "p.json"),
        "--calib-text",
        str(text),
    ]
    assert main([*argv, *scan, "--json"]) == 0
    p = json.loads(capsys.readouterr().out)
    assert any("cost no error at their stored type in born-q4km.gguf" in n for n in p["notes"])
