"""FAULTS.md rows 1-6, 8, 10-14, 16, 21, 22: each fault triggered, each expected behaviour checked."""

from __future__ import annotations

import json
import os
import pickle
import re
import struct
import subprocess
import sys

import gguf
import numpy as np
import pytest

from studio.core.errors import CorruptFileError, ModelOpenError, RemoteCodeError, StudioError, UnsafeFileError
from studio.core.gguf.read import read_gguf
from studio.core.hardware import HardwareInfo
from studio.core.model import CheckpointFormat, Role, open_model
from studio.core.plan.estimate import estimate_presets
from tests.core.gguf.test_read import gguf_bytes, one_tensor_file, s, tinfo
from tests.core.model.test_model_helpers import (
    LLAMA_CONFIG,
    llama_tensors,
    raw_safetensors,
    raw_with_header_text,
    write_folder,
)

HW = HardwareInfo("cpu", 4, 16 * 1024**3, 8 * 1024**3)


def _snapshot(folder):
    return sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir())


def _st_folder(tmp_path, blob: bytes, name="m"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(blob)
    return folder


def _library_rejects(path) -> str:
    """The safetensors library's own verdict on a file (its exception text)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            for k in f.keys():
                f.get_tensor(k)
    except Exception as err:  # SafetensorError
        return str(err)
    return ""


# ---------------------------------------------------------------------------------------- row 1


def test_row01_truncated_safetensors(tmp_path):
    folder = write_folder(tmp_path / "m", llama_tensors(), LLAMA_CONFIG)
    st = folder / "model.safetensors"
    with open(st, "r+b") as f:
        f.truncate(st.stat().st_size - 1000)  # cut mid-data
    assert "incomplete metadata" in _library_rejects(st)  # MetadataIncompleteBuffer
    before = _snapshot(folder)
    with pytest.raises(CorruptFileError, match=r"model\.safetensors is incomplete.*Re-download it or verify"):
        open_model(folder)
    assert _snapshot(folder) == before  # nothing written


def test_row01_truncated_after_open_is_a_clear_error_on_read(tmp_path):
    tensors = llama_tensors()
    folder = write_folder(tmp_path / "m", tensors, LLAMA_CONFIG)
    ck = open_model(folder)
    st = folder / "model.safetensors"
    with open(st, "r+b") as f:
        f.truncate(st.stat().st_size // 2)
    last = max(ck.info.tensors, key=lambda t: ck._entries[t.name].end)
    with pytest.raises(CorruptFileError, match="model.safetensors"):
        ck.read(last.name)


# ---------------------------------------------------------------------------------------- row 2


@pytest.mark.parametrize(
    "blob,match",
    [
        (struct.pack("<Q", 200_000_000) + b"{}", "over the 100 MB limit"),
        (struct.pack("<Q", 5000) + b'{"a": 1}', "incomplete: its header claims 5000 bytes"),
        (raw_with_header_text(b'  {"a": {}}'), "does not start with '{'"),
        (raw_with_header_text(b'{"a": {"dtype": "F32", '), "not valid JSON"),
        (raw_with_header_text(b"[1, 2]"), "does not start with '{'"),
        (raw_with_header_text(b'{"a": 1}' + b"\xff\xfe"), "not valid JSON"),
        (
            raw_with_header_text(
                b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},'
                b' "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}',
                b"\0" * 4,
            ),
            "names 'w' twice",
        ),
        (b"\x05\x00", "only 2 bytes long"),
    ],
    ids=["over-100MB", "beyond-file", "no-brace", "bad-json", "json-array", "not-utf8", "dup-keys", "tiny"],
)
def test_row02_bad_headers(tmp_path, blob, match):
    folder = _st_folder(tmp_path, blob)
    with pytest.raises(CorruptFileError, match=match) as err:
        open_model(folder)
    assert "model.safetensors" in str(err.value)
    if "dup-keys" not in match and "twice" not in match:
        assert _library_rejects(folder / "model.safetensors")  # the library agrees it is bad


def test_row02_huge_header_length_allocates_nothing(tmp_path, monkeypatch):
    folder = _st_folder(tmp_path, struct.pack("<Q", 2**63) + b"{}")
    import io

    real_open = io.open
    reads = []

    class F:
        def __init__(self, f):
            self.f = f

        def read(self, n=-1):
            reads.append(n)
            return self.f.read(n)

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

    monkeypatch.setattr(
        "builtins.open",
        lambda p, m="r", *a, **k: F(real_open(p, m, *a, **k)) if "b" in m else real_open(p, m, *a, **k),
    )
    with pytest.raises(CorruptFileError, match="100 MB"):
        open_model(folder / "model.safetensors")
    assert reads == [8]  # only the length prefix was read


# ---------------------------------------------------------------------------------------- row 3

F4 = struct.pack("<f", 1.0)


@pytest.mark.parametrize(
    "header,data,match",
    [
        (
            {
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
            },
            F4 * 3,
            "overlaps tensor 'a'",
        ),
        ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, F4, "incomplete"),
        (
            {
                "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]},
            },
            F4 * 3,
            "hole of 4 bytes",
        ),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, F4 * 2, "belong to no tensor"),
        ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 4]}}, F4, "needs 12 bytes"),
        ({"a": {"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 4]}}, F4, "overflows"),
        ({"a": {"dtype": "F32", "shape": [2**62], "data_offsets": [0, 4]}}, F4, "overflows a 64-bit byte"),
        ({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, F4, "invalid shape"),
        ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}, F4, "invalid data_offsets"),
        ({"a": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 4]}}, F4, "unknown dtype"),
        (
            {
                "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "e": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},
            },
            F4 * 2,
            "'e' overlaps tensor 'w'",
        ),
    ],
    ids=[
        "overlap",
        "out-of-file",
        "hole",
        "trailing",
        "shape-mismatch",
        "ne-overflow",
        "byte-overflow",
        "neg-dim",
        "reversed",
        "bad-dtype",
        "empty-inside-range",
    ],
)
def test_row03_lying_offsets(tmp_path, header, data, match):
    folder = _st_folder(tmp_path, raw_safetensors([], header=header) + data)
    with pytest.raises(CorruptFileError, match=match):
        open_model(folder)
    assert _library_rejects(folder / "model.safetensors")


def test_row03_zero_size_tensors_may_share_offsets(tmp_path):
    header = {
        "e1": {"dtype": "F32", "shape": [0], "data_offsets": [8, 8]},
        "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "e2": {"dtype": "F16", "shape": [0, 7], "data_offsets": [8, 8]},
        "e3": {"dtype": "F32", "shape": [3, 0], "data_offsets": [8, 8]},
        "e4": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]},
    }
    folder = _st_folder(tmp_path, raw_safetensors([], header=header) + F4 * 2)
    # e1/e2/e3 share offset 8 and e4 shares 0 with w; the library accepts the same file
    assert _library_rejects(folder / "model.safetensors") == ""
    with open_model(folder) as ck:
        assert ck.read("e2").shape == (0, 7) and ck.read("e3").shape == (3, 0)
        np.testing.assert_array_equal(ck.read("w"), [1.0, 1.0])
        assert ck.info.parameters == 2


# ---------------------------------------------------------------------------------------- row 4


def test_row04_index_names_missing_shard(tmp_path):
    folder = write_folder(tmp_path / "m", llama_tensors(), LLAMA_CONFIG, shards=3)
    (folder / "model-00003-of-00003.safetensors").unlink()
    with pytest.raises(ModelOpenError, match=r"Shard model-00003-of-00003\.safetensors .* is missing"):
        open_model(folder)


def test_row04_index_names_missing_tensor(tmp_path):
    folder = write_folder(tmp_path / "m", llama_tensors(), LLAMA_CONFIG, shards=2)
    idx = json.loads((folder / "model.safetensors.index.json").read_text())
    idx["weight_map"]["model.layers.9.mlp.up_proj.weight"] = "model-00002-of-00002.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(idx))
    with pytest.raises(
        CorruptFileError, match=r"'model\.layers\.9\.mlp\.up_proj\.weight' in model-00002.*no shard"
    ):
        open_model(folder)


def test_row04_tensor_in_two_shards(tmp_path):
    from safetensors.numpy import save_file

    tensors = llama_tensors()
    folder = write_folder(tmp_path / "m", tensors, LLAMA_CONFIG, shards=2)
    idx = json.loads((folder / "model.safetensors.index.json").read_text())
    in_second = next(n for n, f in idx["weight_map"].items() if f.startswith("model-00002-"))
    first = folder / "model-00001-of-00002.safetensors"
    from safetensors.numpy import load_file

    d = load_file(str(first))
    d[in_second] = tensors[in_second]
    save_file(d, str(first))
    with pytest.raises(CorruptFileError, match=rf"'{re.escape(in_second)}' is stored in two shards"):
        open_model(folder)


def test_row04_index_duplicate_key_in_json(tmp_path):
    folder = write_folder(tmp_path / "m", llama_tensors(), LLAMA_CONFIG, shards=2)
    text = (folder / "model.safetensors.index.json").read_text()
    # a JSON object listing the same tensor twice, in two different shards
    text = text.replace(
        '"weight_map": {',
        '"weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors", ',
        1,
    )
    (folder / "model.safetensors.index.json").write_text(text)
    with pytest.raises(StudioError, match="lm_head.weight"):
        open_model(folder)


# ---------------------------------------------------------------------------------------- row 5


class _Canary:
    """Pickles to a call of open(path, "w"): loading it creates the canary file."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _payloads(tmp_path, canary):
    torch = pytest.importorskip("torch")
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    (plain / "pytorch_model.bin").write_bytes(pickle.dumps({"w": _Canary(canary)}))
    zipped = tmp_path / "zipped"
    zipped.mkdir()
    (zipped / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    torch.save({"model.norm.weight": torch.ones(4), "evil": _Canary(canary)}, zipped / "pytorch_model.bin")
    return {"plain pickle": plain, "torch.save zip": zipped}


def test_row05_payload_is_live(tmp_path):
    """Control: the same payload does create its canary when unpickled without protection."""
    canary = tmp_path / "control-canary"
    pickle.loads(pickle.dumps(_Canary(canary)))
    assert canary.exists()


@pytest.mark.parametrize("allow", [False, True], ids=["default", "allow_pickle"])
def test_row05_malicious_pickle_refused(tmp_path, allow):
    canary = tmp_path / "canary"
    for what, folder in _payloads(tmp_path, canary).items():
        with pytest.raises(UnsafeFileError) as err:
            open_model(folder, allow_pickle=allow)
        msg = str(err.value)
        assert "pytorch_model.bin" in msg, what
        if allow:
            assert "refused" in msg and "other than tensors" in msg, (what, msg)
        else:
            assert "--allow-pickle" in msg and "weights_only=True" in msg, (what, msg)
        assert not canary.exists(), what


def test_row05_weights_only_passed_explicitly(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    folder = tmp_path / "good"
    folder.mkdir()
    torch.save({"model.norm.weight": torch.arange(4.0)}, folder / "pytorch_model.bin")
    seen = []
    real = torch.load

    def spy(*a, **k):
        seen.append(k.get("weights_only"))
        return real(*a, **k)

    # The unpickling runs in a spawned child, out of a spy's reach: check the very function the child
    # calls here, in-process, then open the file for real (through the child).
    from studio.core.model.pickle_loader import torch_load_weights_only

    monkeypatch.setattr(torch, "load", spy)
    assert list(torch_load_weights_only(folder / "pytorch_model.bin")) == ["model.norm.weight"]
    monkeypatch.setattr(torch, "load", real)
    assert seen == [True]
    with open_model(folder, allow_pickle=True) as ck:
        assert ck.info.format is CheckpointFormat.PYTORCH
        np.testing.assert_array_equal(ck.read("model.norm.weight"), [0, 1, 2, 3])
        assert any("pickle checkpoint" in w and "weights_only=True" in w for w in ck.info.warnings)


def test_row05_good_pickle_with_bf16(tmp_path):
    torch = pytest.importorskip("torch")
    folder = tmp_path / "good"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    w = torch.randn(8, 4).to(torch.bfloat16)
    torch.save({"model.layers.0.self_attn.v_proj.weight": w}, folder / "pytorch_model.bin")
    with open_model(folder, allow_pickle=True) as ck:
        t = ck.info.tensors[0]
        assert (t.dtype, t.role, t.layer, t.shape) == ("BF16", Role.ATTN_V, 0, (8, 4))
        np.testing.assert_array_equal(ck.read(t.name), w.float().numpy())
        assert ck.read_torch(t.name).dtype == torch.bfloat16


# ---------------------------------------------------------------------------------------- row 6


@pytest.mark.parametrize("allow", [False, True], ids=["default", "allow_pickle"])
def test_row06_force_no_weights_only_env_has_no_effect(tmp_path, monkeypatch, allow):
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    canary = tmp_path / "canary"
    for what, folder in _payloads(tmp_path, canary).items():
        with pytest.raises(UnsafeFileError):
            open_model(folder, allow_pickle=allow)
        assert not canary.exists(), what


# ---------------------------------------------------------------------------------------- row 8


def _remote_code_repo(tmp_path, canary, model_type="evil_custom"):
    folder = write_folder(
        tmp_path / "remote",
        llama_tensors(),
        dict(
            LLAMA_CONFIG,
            model_type=model_type,
            architectures=["EvilForCausalLM"],
            auto_map={
                "AutoConfig": "configuration_evil.EvilConfig",
                "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM",
            },
        ),
    )
    code = f"open({str(canary)!r}, 'w').write('pwned')\nclass EvilForCausalLM: pass\nclass EvilConfig: pass\n"
    (folder / "modeling_evil.py").write_text(code)
    (folder / "configuration_evil.py").write_text(code)
    return folder


def test_row08_remote_code_never_executed(tmp_path):
    canary = tmp_path / "canary"
    folder = _remote_code_repo(tmp_path, canary)
    with pytest.raises(
        RemoteCodeError, match=rf"custom Python code.*does not run; inspect it at {re.escape(str(folder))}"
    ):
        open_model(folder)
    assert not canary.exists()


def test_row08_known_type_but_custom_class_also_refused(tmp_path):
    canary = tmp_path / "canary"
    folder = _remote_code_repo(tmp_path, canary, model_type="llama")  # architectures names the auto_map class
    with pytest.raises(RemoteCodeError):
        open_model(folder)
    assert not canary.exists()


def test_row08_cli_no_prompt_no_hang(tmp_path):
    canary = tmp_path / "canary"
    folder = _remote_code_repo(tmp_path, canary)
    out = subprocess.run(
        [sys.executable, "-m", "studio.cli", "inspect", str(folder)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )
    assert out.returncode == 2 and "custom Python code" in out.stderr and out.stderr.count("\n") == 1
    assert not canary.exists()


# ------------------------------------------------------------------------------------ rows 10-14, 16


@pytest.mark.parametrize(
    "data,match",
    [
        (b"", "empty"),
        (b"GGML" + b"\0" * 40, "GGUF magic"),
        (b"GGUF" + struct.pack("<IQQ", 1, 0, 0), "version 1"),
        (b"GGUF" + struct.pack("<IQQ", 99, 0, 0), "version 99"),
    ],
    ids=["empty", "bad-magic", "v1", "future"],
)
def test_row10_bad_magic_version_empty(tmp_path, data, match):
    p = tmp_path / "x.gguf"
    p.write_bytes(data)
    with pytest.raises(CorruptFileError, match=match):
        open_model(p)


@pytest.mark.parametrize("field", ["n_tensors", "n_kv"])
def test_row11_counts_larger_than_file(tmp_path, monkeypatch, field):
    p = tmp_path / "poc.gguf"
    counts = {"n_tensors": 0, "n_kv": 0, field: 2**64 - 1}
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, counts["n_tensors"], counts["n_kv"]) + b"\0" * 20)
    # gguf-py's GGUFReader must never be reached for such a file
    monkeypatch.setattr(gguf, "GGUFReader", lambda *a, **k: pytest.fail("GGUFReader was called"))
    with pytest.raises(CorruptFileError, match="more than its 44 bytes can hold"):
        open_model(p)


def test_row12_huge_string_and_array_lengths(tmp_path):
    for i, kv in enumerate(
        [struct.pack("<Q", 2**40) + b"k", s("tokenizer.ggml.scores") + struct.pack("<IIQ", 9, 6, 2**30)]
    ):
        p = tmp_path / f"x{i}.gguf"
        p.write_bytes(gguf_bytes([kv]))
        with pytest.raises(CorruptFileError, match="bytes but only"):
            read_gguf(p)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(ne=(32, 1, 1, 1, 1)), "5 dimensions"),
        (dict(ne=(32, 2**64 - 1)), "negative dimension"),
        (dict(ne=(2**40, 2**40)), "overflows"),
        (dict(typ=77), "unknown ggml type id 77"),
        (dict(offset=3), "not a multiple of the alignment"),
    ],
    ids=["n_dims", "dim-1", "ne-overflow", "type", "offset"],
)
def test_row13_tensor_info_names_the_tensor(tmp_path, kwargs, match):
    p = tmp_path / "x.gguf"
    p.write_bytes(one_tensor_file(name="blk.0.attn_q.weight", **kwargs))
    with pytest.raises(CorruptFileError, match=match) as err:
        open_model(p)
    assert "blk.0.attn_q.weight" in str(err.value)


def test_row13_duplicate_and_alignment(tmp_path):
    p = tmp_path / "dup.gguf"
    p.write_bytes(gguf_bytes([], [tinfo("blk.0.x", [32], 0, 0), tinfo("blk.0.x", [32], 0, 128)], b"\0" * 256))
    with pytest.raises(CorruptFileError, match="'blk.0.x' appears twice"):
        open_model(p)
    for a in (0, 13):
        p = tmp_path / f"align{a}.gguf"
        p.write_bytes(one_tensor_file(extra_kvs=[s("general.alignment") + struct.pack("<II", 4, a)]))
        with pytest.raises(CorruptFileError, match="general.alignment"):
            open_model(p)


def _real_tiny_gguf(path):
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_block_count(1)
    w.add_name("XXXXXXXX")
    w.add_tensor("blk.0.attn_q.weight", np.ones((32, 64), np.float32))
    w.add_tensor("output.weight", np.ones((16, 64), np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_row14_truncated_gguf(tmp_path):
    p = tmp_path / "cut.gguf"
    _real_tiny_gguf(p)
    with open(p, "r+b") as f:
        f.truncate(p.stat().st_size - 100)
    with pytest.raises(CorruptFileError, match=r"incomplete.*Re-download"):
        open_model(p)


def test_row16_non_utf8_metadata_patched_into_a_real_file(tmp_path):
    p = tmp_path / "name.gguf"
    _real_tiny_gguf(p)
    raw = p.read_bytes()
    assert raw.count(b"XXXXXXXX") == 1
    p.write_bytes(raw.replace(b"XXXXXXXX", b"ab\xff\xfe\xc3cd\x80"))
    with open_model(p) as ck:
        assert ck.gguf.metadata["general.name"] == "ab\ufffd\ufffd\ufffdcd\ufffd"
        assert any("general.name" in w and "UTF-8" in w for w in ck.info.warnings)
        np.testing.assert_array_equal(ck.read("blk.0.attn_q.weight"), np.ones((32, 64), np.float32))


# ---------------------------------------------------------------------------------------- row 21


def test_row21_empty_scalar_and_odd_shapes(tmp_path):
    header_entries = [
        ("empty", "F32", [0, 64], b""),
        ("scalar", "F32", [], F4),
        ("odd", "F32", [7, 13], np.ones(91, np.float32).tobytes()),
        ("row33", "F16", [4, 33], np.ones(132, np.float16).tobytes()),
        ("mat", "F32", [64, 64], np.ones(4096, np.float32).tobytes()),
    ]
    folder = _st_folder(tmp_path, raw_safetensors(header_entries))
    (folder / "config.json").write_text(json.dumps({"model_type": "oddball", "architectures": ["Odd"]}))
    with open_model(folder) as ck:
        assert ck.read("empty").shape == (0, 64)
        assert float(ck.read("scalar")) == 1.0
        ests = {e.preset: e for e in estimate_presets(ck.info, HW)}
    q4 = ests["Q4_K_M"]
    assert q4.types["empty"] == "F32" and q4.types["scalar"] == "F32"
    assert q4.types["odd"] == "F16" and q4.types["row33"] == "F16"  # no block size divides 13 or 33
    assert q4.types["mat"] == "Q5_0"  # 64 is not a multiple of 256: llama.cpp's Q4_K fallback
    assert q4.n_fallbacks == 3
    assert all(np.isfinite(e.bits_per_weight) for e in ests.values())


def test_row21_llama_with_rows_not_multiple_of_32(tmp_path):
    cfg = dict(
        LLAMA_CONFIG,
        hidden_size=40,
        intermediate_size=72,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=20,
    )
    with open_model(write_folder(tmp_path / "m", llama_tensors(cfg), cfg)) as ck:
        e = {e.preset: e for e in estimate_presets(ck.info, HW)}
    assert e["Q4_K_M"].exact
    assert set(e["Q4_K_M"].types.values()) == {"F16", "F32"}  # every matrix falls back to F16
    assert e["Q4_K_M"].tensor_bytes == e["F16"].tensor_bytes


# ---------------------------------------------------------------------------------------- row 22


def test_row22_garbled_config(tmp_path):
    for i, text in enumerate(['{"model_type": "llama", ', "[1, 2, 3]", "\xff\xfe garbage"]):
        folder = write_folder(tmp_path / f"m{i}", llama_tensors(), None)
        (folder / "config.json").write_bytes(text.encode("latin-1"))
        with pytest.raises(CorruptFileError, match=r"config\.json") as err:
            open_model(folder)
        assert str(folder) in str(err.value)


def test_row22_missing_config_and_tokenizer_are_visible_warnings(tmp_path):
    folder = write_folder(tmp_path / "m", llama_tensors(), None)
    with open_model(folder) as ck:
        assert any("no config.json" in w for w in ck.info.warnings)
    folder = write_folder(tmp_path / "n", llama_tensors(), LLAMA_CONFIG)
    (folder / "tokenizer.json").unlink()
    with open_model(folder) as ck:
        assert any("no tokenizer files" in w for w in ck.info.warnings)


def test_row22_unsupported_architecture_and_nonsense_values(tmp_path):
    cfg = {"model_type": "rwkv9", "architectures": ["Rwkv9ForCausalLM"], "num_hidden_layers": "two"}
    with open_model(write_folder(tmp_path / "m", llama_tensors(), cfg)) as ck:
        assert any("not one Quant Studio knows" in w for w in ck.info.warnings)
        assert ck.info.n_layers == 2  # from the names, since "two" is not a number
        ests = estimate_presets(ck.info, HW)
        assert not ests[0].exact


def test_row22_index_that_is_not_an_index(tmp_path):
    folder = write_folder(tmp_path / "m", llama_tensors(), LLAMA_CONFIG, shards=2)
    (folder / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(CorruptFileError, match="has no weight_map"):
        open_model(folder)
    (folder / "model.safetensors.index.json").write_text("not json")
    with pytest.raises(CorruptFileError, match="model.safetensors.index.json .* not valid JSON"):
        open_model(folder)


def test_no_stray_files_written(tmp_path):
    folder = write_folder(tmp_path / "m", llama_tensors(), LLAMA_CONFIG, shards=2)
    before = _snapshot(folder)
    with open_model(folder) as ck:
        ck.read("lm_head.weight")
        estimate_presets(ck.info, HW)
    assert _snapshot(folder) == before
    assert os.listdir(tmp_path) == ["m"]
