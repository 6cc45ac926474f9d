"""The bounded GGUF reader: agrees with gguf-py on good files, rejects hostile headers (FAULTS 10-14, 16)."""

from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest

from studio.core.errors import CorruptFileError
from studio.core.gguf.read import read_gguf
from studio.core.model import CheckpointFormat, Role, open_model

Q = gguf.GGMLQuantizationType


# ------------------------------------------------------------------------------- hand-built bytes


def s(text: bytes | str) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv_u32(key: str, v: int) -> bytes:
    return s(key) + struct.pack("<II", 4, v)


def kv_str(key: str, v: bytes | str) -> bytes:
    return s(key) + struct.pack("<I", 8) + s(v)


def tinfo(name: str, ne: list[int], typ: int, offset: int) -> bytes:
    return (
        s(name)
        + struct.pack("<I", len(ne))
        + b"".join(struct.pack("<Q", d) for d in ne)
        + struct.pack("<IQ", typ, offset)
    )


def gguf_bytes(
    kvs: list[bytes] = (),
    tensors: list[bytes] = (),
    data: bytes = b"",
    *,
    version: int = 3,
    n_tensors: int | None = None,
    n_kv: int | None = None,
    alignment: int = 32,
) -> bytes:
    head = b"GGUF" + struct.pack(
        "<IQQ", version, len(tensors) if n_tensors is None else n_tensors, len(kvs) if n_kv is None else n_kv
    )
    body = head + b"".join(kvs) + b"".join(tensors)
    body += b"\0" * (-len(body) % alignment)
    return body + data


def one_tensor_file(name="t", ne=(32, 2), typ=0, offset=0, extra_kvs=(), alignment=32) -> bytes:
    return gguf_bytes(
        [kv_str("general.architecture", "llama"), *extra_kvs],
        [tinfo(name, list(ne), typ, offset)],
        np.arange(64, dtype=np.float32).tobytes(),  # room for the default (32, 2) F32 tensor
        alignment=alignment,
    )


@pytest.fixture
def write(tmp_path):
    def _write(data: bytes, name: str = "m.gguf"):
        p = tmp_path / name
        p.write_bytes(data)
        return p

    return _write


# ---------------------------------------------------------------------------------- good files


def _writer_file(path, tie=False):
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_context_length(128)
    w.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(40)])
    w.add_array("tokenizer.ggml.scores", [float(i) for i in range(40)])
    arrays = {
        "token_embd.weight": rng.standard_normal((40, 64)).astype(np.float32),
        "blk.0.attn_norm.weight": rng.standard_normal(64).astype(np.float32),
        "blk.0.attn_q.weight": rng.standard_normal((64, 64)).astype(np.float16),
        "blk.1.ffn_down.weight": rng.standard_normal((64, 64)).astype(np.float32),
        "output.weight": rng.standard_normal((40, 64)).astype(np.float32),
    }
    for name, a in arrays.items():
        if name == "blk.1.ffn_down.weight":
            w.add_tensor(name, gguf.quants.quantize(a, Q.Q8_0), raw_dtype=Q.Q8_0)
        else:
            w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return arrays


def test_agrees_with_gguf_py_on_a_written_file(tmp_path):
    p = tmp_path / "good.gguf"
    arrays = _writer_file(p)
    g = read_gguf(p)
    ref = gguf.GGUFReader(p)
    assert g.version == 3 and g.alignment == 32
    assert [t.name for t in g.tensors] == [t.name for t in ref.tensors]
    for mine, theirs in zip(g.tensors, ref.tensors, strict=True):
        assert mine.ne == tuple(int(d) for d in theirs.shape)
        assert mine.type_id == int(theirs.tensor_type)
        assert mine.offset == theirs.data_offset
        assert mine.nbytes == theirs.n_bytes
        assert mine.shape == arrays[mine.name].shape
    assert g.metadata["general.architecture"] == "llama"
    assert g.metadata["llama.block_count"] == 2
    assert g.metadata["tokenizer.ggml.tokens"][:2] == ["tok0", "tok1"]
    np.testing.assert_array_equal(g.metadata["tokenizer.ggml.scores"][:3], [0.0, 1.0, 2.0])
    assert g.warnings == ()


def test_open_model_on_gguf_reads_and_dequantizes(tmp_path):
    p = tmp_path / "good.gguf"
    arrays = _writer_file(p)
    with open_model(p) as ck:
        info = ck.info
        assert info.format is CheckpointFormat.GGUF
        assert info.model_type == "llama" and info.n_layers == 2
        assert info.config["num_key_value_heads"] == 2 and info.config["vocab_size"] == 40
        roles = {t.name: (t.role, t.layer, t.dtype) for t in info.tensors}
        assert roles["blk.1.ffn_down.weight"] == (Role.FFN_DOWN, 1, "Q8_0")
        assert roles["blk.0.attn_q.weight"] == (Role.ATTN_Q, 0, "F16")
        assert roles["output.weight"] == (Role.OUTPUT, None, "F32")
        np.testing.assert_array_equal(ck.read("token_embd.weight"), arrays["token_embd.weight"])
        np.testing.assert_array_equal(
            ck.read("blk.0.attn_q.weight"), arrays["blk.0.attn_q.weight"].astype(np.float32)
        )
        x = arrays["blk.1.ffn_down.weight"]
        want = gguf.quants.dequantize(gguf.quants.quantize(x, Q.Q8_0), Q.Q8_0)
        np.testing.assert_array_equal(ck.read("blk.1.ffn_down.weight"), want)
        assert ck.read("blk.1.ffn_down.weight").shape == (64, 64)


def test_zero_tensors_and_custom_alignment(write):
    g = read_gguf(write(gguf_bytes([kv_u32("general.alignment", 64)])))
    assert g.alignment == 64 and g.tensors == ()
    p = write(one_tensor_file(extra_kvs=[kv_u32("general.alignment", 64)], alignment=64))
    g = read_gguf(p)
    assert g.tensors[0].offset % 64 == 0
    assert g.tensors[0].shape == (2, 32)


# ------------------------------------------------------------------------------ FAULTS row 10


@pytest.mark.parametrize(
    "data,match",
    [
        (b"", "empty"),
        (b"hello, this is a text file\n" * 4, "GGUF magic"),
        (b"GGU", "GGUF magic"),
        (b"GGUF" + struct.pack("<IQQ", 1, 0, 0), "version 1"),
        (b"GGUF" + struct.pack("<IQQ", 4, 0, 0), "version 4"),
        (b"GGUF" + struct.pack(">IQQ", 3, 0, 0), "big-endian"),
        (b"GGUF\x03\x00", "version"),
    ],
    ids=["empty", "text", "short-magic", "v1", "future", "big-endian", "cut-version"],
)
def test_bad_magic_and_versions(write, data, match):
    with pytest.raises(CorruptFileError, match=match) as err:
        read_gguf(write(data))
    assert "m.gguf" in str(err.value)


def test_text_file_named_gguf_through_open_model(write):
    p = write(b"just some text, definitely not weights\n", "notes.gguf")
    with pytest.raises(CorruptFileError, match=r"notes\.gguf is not a GGUF file"):
        open_model(p)


# ------------------------------------------------------------------------------ FAULTS row 11


@pytest.mark.parametrize(
    "n_tensors,n_kv",
    [(2**60, 0), (2**64 - 1, 0), (0, 2**64 - 1), (1, 2**40), (100, 0)],
    ids=["2^60-tensors", "u64max-tensors", "u64max-kv", "2^40-kv", "100-tensors-in-24-bytes"],
)
def test_counts_bounded_by_file_size(write, n_tensors, n_kv):
    data = b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + b"\0" * 20  # 44 bytes like the PoC
    with pytest.raises(CorruptFileError, match="more than its 44 bytes can hold"):
        read_gguf(write(data))


# ------------------------------------------------------------------------------ FAULTS row 12


@pytest.mark.parametrize(
    "kv",
    [
        struct.pack("<Q", 2**40) + b"key",  # 1 TB key length
        s("k") + struct.pack("<I", 8) + struct.pack("<Q", 2**62),  # string value length
        s("tokenizer.ggml.scores") + struct.pack("<IIQ", 9, 6, 2**30),  # 2^30 float32 scores
        s("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2**40),  # 2^40 strings
        s("nested") + struct.pack("<IIQ", 9, 9, 2**50),  # 2^50 arrays
    ],
    ids=["key-1TB", "string-2^62", "f32-array-2^30", "str-array-2^40", "array-of-arrays"],
)
def test_lengths_checked_before_allocation(write, kv):
    with pytest.raises(CorruptFileError, match="needs .* bytes but only .* remain"):
        read_gguf(write(gguf_bytes([kv])))


@pytest.mark.parametrize(
    "kv,match",
    [
        (s("k") + struct.pack("<I", 77) + b"\0" * 8, "unknown value type 77"),
        (s("k") + struct.pack("<IIQ", 9, 66, 1) + b"\0" * 8, "unknown array element type 66"),
        (kv_u32("k", 1) + kv_u32("k", 2), "appears twice"),
    ],
    ids=["value-type", "array-type", "dup-key"],
)
def test_bad_kv(write, kv, match):
    with pytest.raises(CorruptFileError, match=match):
        read_gguf(write(gguf_bytes([kv], n_kv=2 if "dup" in match or "twice" in match else 1)))


# ------------------------------------------------------------------------------ FAULTS row 13


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(ne=(32, 1, 1, 1, 1)), "'t' has 5 dimensions"),
        (dict(ne=(32, 2**64 - 1)), "'t' has a negative dimension"),
        (dict(ne=(2**32, 2**32)), "'t' has shape .* overflows"),
        (dict(typ=4), "'t' has unknown ggml type id 4"),
        (dict(typ=999), "'t' has unknown ggml type id 999"),
        (dict(typ=int(Q.Q4_K), ne=(32, 2)), "'t' has rows of 32 elements, not a multiple of Q4_K"),
        (dict(offset=7), "'t' has offset 7, not a multiple"),
        (dict(offset=2**40), "data of tensor 't' lies beyond the end"),
        (dict(name="x" * 70), "name longer than 63 bytes"),
    ],
    ids=[
        "5-dims",
        "dim-minus-1",
        "ne-overflow",
        "removed-type",
        "bad-type",
        "row-block",
        "unaligned",
        "offset-outside",
        "long-name",
    ],
)
def test_bad_tensor_info(write, kwargs, match):
    with pytest.raises(CorruptFileError, match=match):
        read_gguf(write(one_tensor_file(**kwargs)))


def test_duplicate_tensor_name(write):
    data = gguf_bytes(
        [],
        [tinfo("dup", [32], 0, 0), tinfo("dup", [32], 0, 128)],
        np.zeros(64, np.float32).tobytes() + b"\0" * 128,
    )
    with pytest.raises(CorruptFileError, match="'dup' appears twice"):
        read_gguf(write(data))


def test_overlapping_tensors(write):
    data = gguf_bytes(
        [], [tinfo("a", [64], 0, 0), tinfo("b", [64], 0, 32)], np.zeros(96, np.float32).tobytes()
    )
    with pytest.raises(CorruptFileError, match="'b' overlaps tensor 'a'"):
        read_gguf(write(data))


@pytest.mark.parametrize("alignment", [0, 13, 48])
def test_bad_alignment(write, alignment):
    with pytest.raises(
        CorruptFileError, match=f"general.alignment is {alignment}, not a positive power of two"
    ):
        read_gguf(write(one_tensor_file(extra_kvs=[kv_u32("general.alignment", alignment)])))


def test_huge_alignment_puts_data_outside(write):
    with pytest.raises(CorruptFileError, match="beyond the end of the file"):
        read_gguf(write(one_tensor_file(extra_kvs=[kv_u32("general.alignment", 0x80000000)])))


# ------------------------------------------------------------------------------ FAULTS row 14


def test_truncated_after_valid_header(tmp_path):
    p = tmp_path / "cut.gguf"
    _writer_file(p)
    size = p.stat().st_size
    g = read_gguf(p)
    last = max(g.tensors, key=lambda t: t.offset)
    with open(p, "r+b") as f:
        f.truncate(last.offset + last.nbytes // 2)
    assert p.stat().st_size < size
    with pytest.raises(CorruptFileError, match=r"cut\.gguf is incomplete.*Re-download") as err:
        read_gguf(p)
    assert last.name in str(err.value)
    with pytest.raises(CorruptFileError, match="incomplete"):
        open_model(p)


def test_truncated_inside_metadata(tmp_path):
    p = tmp_path / "cut.gguf"
    _writer_file(p)
    with open(p, "r+b") as f:
        f.truncate(300)
    with pytest.raises(CorruptFileError, match="incomplete or corrupt"):
        read_gguf(p)


# ------------------------------------------------------------------------------ FAULTS row 16


def test_non_utf8_metadata_is_replaced_not_fatal(write):
    data = gguf_bytes(
        [kv_str("general.name", b"bad \xff\xfe name"), kv_str("tokenizer.chat_template", b"{{ x }}\xc3")],
        [tinfo("t", [32], 0, 0)],
        np.zeros(32, np.float32).tobytes(),
    )
    p = write(data)
    g = read_gguf(p)
    assert g.metadata["general.name"] == "bad \ufffd\ufffd name"
    assert g.metadata["tokenizer.chat_template"] == "{{ x }}\ufffd"
    assert len(g.warnings) == 2 and "general.name" in g.warnings[0]
    with open_model(p) as ck:
        assert any("not valid UTF-8" in w for w in ck.info.warnings)
