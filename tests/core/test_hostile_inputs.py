"""Issue 25 items 6, 8, 9 and 11: hostile numbers and files end in one bounded sentence, quickly.

Each test names the case of the issue it covers (FAULTS.md, "Wave 3: hostile input").
"""

from __future__ import annotations

import json
import math
import re
import shutil
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from studio.cli import main
from studio.core.calib.data import read_chats
from studio.core.calib.imatrix import Imatrix, ImatrixEntry, read_imatrix, write_imatrix
from studio.core.errors import CalibrationError, CorruptFileError, ExportError, QuantizationError, StudioError
from studio.core.gguf.writer import AtomicGGUFWriter
from studio.core.model import open_model

try:  # the export pipeline, plans and layouts moved to their own modules (issue 22)
    from studio.core.export.run import export_gguf
    from studio.core.gguf.layout import layout
    from studio.core.plan.plan import Override, Plan, plan_uniform
except ImportError:  # this branch, before that move
    from studio.core.export.run import export_gguf
    from studio.core.gguf.arch import layout
    from studio.core.plan.plan import Override, Plan, plan_uniform
from tests.core.chat import fixtures as _fixtures

chat_model = _fixtures.chat_model
f32_gguf = _fixtures.f32_gguf
gguf_of = _fixtures.gguf_of

ONE_LINE = 320  # "about 300 characters": the message, and a hint after it


def _one_sentence(err: BaseException) -> str:
    msg = str(err)
    assert isinstance(err, StudioError), f"{type(err).__name__}: {msg[:200]}"
    assert "\n" not in msg and "Traceback" not in msg
    assert len(err.message) <= 300 and len(msg) <= 520, len(msg)
    return msg


def _info(model: Path):
    with open_model(model) as ck:
        return ck.info


def _plan_json(**fields) -> str:
    d = {"version": 1, "name": "p", "types": {"model.norm.weight": "F32"}}
    d.update(fields)
    return json.dumps(d)


# ------------------------------------------------------------------------------- item 9: plan JSON


@pytest.mark.parametrize(
    "text, why",
    [
        (_plan_json(ftype=1e400), "must be a whole number, not inf"),
        (_plan_json(ftype=-1), "ftype is -1; it must be between 0 and 1,024"),
        (_plan_json(ftype=2**40), "ftype is 1099511627776"),
        (_plan_json(ftype="7"), "must be a whole number"),
        (
            '{"version": 1, "ftype": ' + "9" * 5000 + ', "types": {"a": "F32"}}',
            "holds a number that cannot be read",
        ),
        ('{"version": ' + "9" * 5000 + "}", "holds a number that cannot be read"),
        ("[" * 100_000 + "]" * 100_000, "nests its JSON"),
        ('{"version": 1, "types": ' + '{"a":' * 200 + "1" + "}" * 201, "nests its JSON more than 64"),
        (
            json.dumps(
                {"version": 1, "recipe": {"kind": "first_last", "n": 1e400, "high": "Q8_0", "low": "Q4_0"}}
            ),
            "first/last layers must be a whole number, not inf",
        ),
        (
            json.dumps(
                {
                    "version": 1,
                    "recipe": {
                        "kind": "preset",
                        "preset": "Q4_K_M",
                        "keep_first_last": {"n": 2**70, "type": "Q8_0"},
                    },
                }
            ),
            "first/last layers is a number of about 2**71",
        ),
    ],
    ids=[
        "ftype-1e400",
        "ftype-negative",
        "ftype-2^40",
        "ftype-string",
        "5000-digit-ftype",
        "5000-digit-version",
        "deep-list",
        "deep-types",
        "first-last-1e400",
        "keep-first-last-2^70",
    ],
)
def test_plan_json_out_of_range_is_one_sentence(text, why, llama_model):
    with pytest.raises(QuantizationError) as err:
        Plan.from_json(text, _info(llama_model), source="p.json")
    assert why in _one_sentence(err.value)


def test_a_plan_with_a_1mb_name_gives_a_short_error_line(llama_model, capsys, tmp_path):
    # the plan's name is quoted when it names a tensor the model does not have
    text = _plan_json(name="N" * 1_000_000, types={"model.nope.weight": "Q8_0"})
    with pytest.raises(QuantizationError) as err:
        Plan.from_json(text, _info(llama_model))
    msg = _one_sentence(err.value)
    # the quoted name is shortened; the sentence around it (the tensor, the model, the hint) survives
    assert re.search(r"'N{20,}…N{10,}'", msg) and "for tensor '" in msg and "made for another model" in msg
    plan = tmp_path / "p.json"
    plan.write_text(text)
    capsys.readouterr()
    assert main(["export", str(llama_model), "-o", str(tmp_path / "o.gguf"), "--plan", str(plan)]) != 0
    assert 20 < len(capsys.readouterr().err) < 600


# ------------------------------------------------------------------- item 8: regex overrides, numbers


def test_a_catastrophic_override_regex_ends_quickly(llama_model):
    text = json.dumps(
        {
            "version": 1,
            "recipe": {"kind": "uniform", "type": "Q8_0", "overrides": [["(.*.*.*.*)*Z$", "Q4_0"]]},
        }
    )
    t0 = time.monotonic()
    plan = Plan.from_json(text, _info(llama_model))  # the regex package matches it without backtracking
    assert time.monotonic() - t0 < 5
    assert set(plan.types.values()) <= {"Q8_0", "F32"}


def test_an_override_regex_that_backtracks_is_stopped_in_one_sentence(llama_model):
    # slow in the regex package too: its time limit ends it, naming the pattern
    info = _info(llama_model)
    t0 = time.monotonic()
    with pytest.raises(QuantizationError) as err:
        plan_uniform(info, "Q8_0", [Override(r"((\w|\.)+|\w\w)+\d$", "Q4_0")])
    assert time.monotonic() - t0 < 10  # a 2 s budget; the regex package checks its clock coarsely
    assert "takes too long to match" in _one_sentence(err.value)


@pytest.mark.parametrize(
    "key, value",
    [
        ("num_hidden_layers", 10**12),
        ("num_hidden_layers", 10**6),
        ("vocab_size", 10**12),
        ("num_local_experts", 10**12),
        ("hidden_size", 10**15),
    ],
)
def test_config_numbers_are_checked_against_the_tensors(key, value, llama_model, tmp_path):
    model = tmp_path / "m"
    shutil.copytree(llama_model, model)
    cfg = json.loads((model / "config.json").read_text())
    cfg[key] = value
    (model / "config.json").write_text(json.dumps(cfg))
    t0 = time.monotonic()
    with pytest.raises(CorruptFileError) as err:
        _info(model)
    assert time.monotonic() - t0 < 10
    assert f"{key} = {value:,}" in _one_sentence(err.value) and "config is damaged" in str(err.value)
    assert main(["inspect", str(model)]) != 0


def test_a_gguf_with_a_huge_block_count_is_refused(f32_gguf, tmp_path):
    key = b"llama.block_count"
    data = f32_gguf.read_bytes()
    at = data.index(key) + len(key)
    bad = tmp_path / "blocks.gguf"
    bad.write_bytes(data[: at + 4] + struct.pack("<I", 4_000_000_000) + data[at + 8 :])
    with pytest.raises(CorruptFileError) as err:
        _info(bad)
    assert "num_hidden_layers = 4,000,000,000" in _one_sentence(err.value)
    from studio.core.model.gguf_source import write_hf_folder

    with pytest.raises(CorruptFileError) as err:  # the GGUF-as-original route, before transformers
        write_hf_folder(bad, tmp_path / "hf")
    assert "block_count = 4,000,000,000" in _one_sentence(err.value)
    assert not (tmp_path / "hf").exists()


# --------------------------------------------------------------------- items 6 and 9: imatrix files


def _imatrix(info, value: float = 1.0) -> Imatrix:
    entries = {}
    for tm in layout(info).tensors:
        if tm.gguf_name.startswith("blk.") and len(tm.shape) == 2:
            entries[tm.gguf_name] = ImatrixEntry(
                tm.gguf_name, np.full((1, tm.n_per_row), value, np.float32), np.array([1.0], np.float32)
            )
    return Imatrix(dict(sorted(entries.items())), ("t",), 1, 64)


def _imatrix_gguf(path: Path, chunk_count: object) -> Path:
    """A one-entry GGUF imatrix whose chunk_count KV is ``chunk_count`` (written with its own type)."""
    import gguf

    w = gguf.GGUFWriter(str(path), "")
    w.kv_data[0].pop("general.architecture", None)
    w.add_string("general.type", "imatrix")
    w.add_array("imatrix.datasets", ["t"])
    if isinstance(chunk_count, str):
        w.add_string("imatrix.chunk_count", chunk_count)
    else:
        w.add_uint64("imatrix.chunk_count", chunk_count)
    w.add_uint32("imatrix.chunk_size", 64)
    w.add_tensor("blk.0.attn_q.weight.in_sum2", np.ones((1, 256), np.float32))
    w.add_tensor("blk.0.attn_q.weight.counts", np.ones((1, 1), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_imatrix_chunk_count_out_of_range_or_a_string(tmp_path):
    assert read_imatrix(_imatrix_gguf(tmp_path / "ok.gguf", 7)).chunk_count == 7
    with pytest.raises(CalibrationError) as err:
        read_imatrix(_imatrix_gguf(tmp_path / "huge.gguf", 2**64 - 1))
    assert "chunk_count" in _one_sentence(err.value) and "between 0 and 4,294,967,295" in str(err.value)
    with pytest.raises(CalibrationError) as err:
        read_imatrix(_imatrix_gguf(tmp_path / "str.gguf", "abc"))
    assert "must be a whole number, not 'abc'" in _one_sentence(err.value)


@pytest.mark.parametrize("fmt", ["gguf", "dat"])
def test_imatrix_with_huge_finite_values_is_refused(fmt, llama_model, tmp_path):
    im = write_imatrix(_imatrix(_info(llama_model), 3e38), tmp_path / f"big.{fmt}")
    with pytest.raises(CalibrationError) as err:
        read_imatrix(im.path)
    assert "a value of 3e+38" in _one_sentence(err.value) and "refused" in str(err.value)
    out = tmp_path / "out.gguf"
    argv = ["export", str(llama_model), "-o", str(out), "--preset", "Q4_K_M", "--imatrix", str(im.path)]
    assert main(argv) != 0
    assert not out.exists() and not list(tmp_path.glob("*.partial"))


def test_export_never_writes_nan_scales(llama_model, tmp_path):
    # an in-memory imatrix (as a calibration makes it) with huge values: the writer's row check stops it
    info = _info(llama_model)
    im = {n: np.full(e.sums.shape[1], 3e38, np.float32) for n, e in _imatrix(info).entries.items()}
    out = tmp_path / "nan.gguf"
    with pytest.raises(ExportError) as err:
        export_gguf(llama_model, out, "Q4_K_M", imatrix=im)
    assert "holds NaN or Inf" in _one_sentence(err.value)
    assert list(tmp_path.iterdir()) == []


def test_row_check_matches_ggml_block_layouts(tmp_path):
    from studio.core.gguf.rowcheck import BLOCK_SCALES, first_bad_block
    from studio.core.quant import reference as ref

    for name, (size, _) in BLOCK_SCALES.items():  # ggml's own block sizes (gguf-py 0.19 lacks Q2_0)
        tid = ref.type_id(name)
        assert ref.ggml_row_size(name, ref._block_size(tid)) == size, name
    q = np.zeros((4, 34), np.uint8)
    q[2, 0:2] = np.frombuffer(np.float16(np.inf).tobytes(), np.uint8)
    assert first_bad_block("Q8_0", q) == 2
    assert first_bad_block("Q8_0", np.zeros((4, 34), np.uint8)) is None
    assert first_bad_block("F16", np.array([1, np.nan], np.float16)) == 1
    w = AtomicGGUFWriter(tmp_path / "x.gguf", "llama")
    w.add_tensor_info("t", (32 * 4,), "Q8_0", q.nbytes)
    w.begin()
    with pytest.raises(ExportError, match=r"'t' as Q8_0 holds NaN or Inf \(block 2\)"):
        w.write_tensor_chunks("t", [q])
    assert list(tmp_path.iterdir()) == []


def test_row_check_follows_blocks_across_chunks_cut_mid_block():
    """A copied tensor streams in fixed-size pieces that cut blocks: no false alarm, the right block."""
    from studio.core.gguf.rowcheck import RowCheck

    q = np.zeros((6, 34), np.uint8)
    q[:, 0:2] = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)  # finite scales everywhere
    raw = q.reshape(-1)
    check = RowCheck("Q8_0")
    assert [check.feed(raw[i : i + 50]) for i in range(0, raw.size, 50)] == [None] * 5
    q[4, 0:2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)
    check = RowCheck("Q8_0")
    found = [check.feed(raw[i : i + 50]) for i in range(0, raw.size, 50)]
    assert [f for f in found if f is not None] == [4]


# ---------------------------------------------------------------------- item 9: JSONL, configs, GGUF


@pytest.mark.parametrize(
    "line, why",
    [
        ("[" * 100_000 + "]" * 100_000, "nests its JSON"),
        ('{"messages": [{"role": "user", "content": "\\ud800"}]}', "lone surrogate"),
        ('{"messages": ' + "[" * 70 + "]" * 70 + "}", "more than 64 levels"),
    ],
    ids=["deep", "surrogate", "deep-but-parsable"],
)
def test_jsonl_chats_are_one_sentence(line, why, tmp_path):
    p = tmp_path / "chats.jsonl"
    p.write_text(line + "\n", encoding="utf-8")
    with pytest.raises(CalibrationError) as err:
        read_chats(p)
    assert why in _one_sentence(err.value) and "Line 1" in str(err.value)


def test_deeply_nested_tokenizer_config_is_one_sentence(llama_model, tmp_path, capsys):
    model = tmp_path / "m"
    shutil.copytree(llama_model, model)
    text = (model / "tokenizer_config.json").read_text()
    deep = "[" * 100_000 + "]" * 100_000
    (model / "tokenizer_config.json").write_text(text.rstrip()[:-1] + ', "deep": ' + deep + "}")
    out = tmp_path / "o.gguf"
    capsys.readouterr()
    assert main(["export", str(model), "-o", str(out), "--preset", "Q8_0"]) != 0
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "tokenizer_config.json" in err and "nests its JSON too deeply" in err and len(err) < 400
    assert not out.exists() and not list(tmp_path.glob("*.partial"))


@pytest.mark.parametrize("dim", [0, 1])
def test_a_gguf_source_with_a_zero_size_dimension(dim, chat_model, gguf_of, tmp_path):
    # a quantized GGUF as the original, one matrix declaring a zero-size dimension
    data = gguf_of(chat_model, "Q4_K_M").read_bytes()
    k = b"blk.0.attn_q.weight"
    at = data.index(struct.pack("<Q", len(k)) + k) + 8 + len(k) + 4 + 8 * dim
    src = tmp_path / "zero.gguf"
    src.write_bytes(data[:at] + struct.pack("<Q", 0) + data[at + 8 :])
    out = tmp_path / "out.gguf"
    assert main(["export", str(src), "-o", str(out), "--preset", "Q8_0"]) == 0
    from studio.core.gguf.read import read_gguf

    got = {t.name: (t.shape, t.type_name) for t in read_gguf(out).tensors}["blk.0.attn_q.weight"]
    assert 0 in got[0] and got[1] == "F32"  # empty, kept in F32 like every empty tensor
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.gguf", "zero.gguf"]


def test_error_helpers_bound_their_text():
    e = StudioError("x" * 10**6, hint="h" * 10**6)
    assert len(e.message) == 300 and len(str(e)) <= 501
    assert "…" in e.message
    assert math.isfinite(1.0)
