"""FAULTS rows 5 and 7: opted-in pickle checkpoints are unpickled only in a memory-limited spawn child.

A spawn child that imports torch costs seconds here, so one conversion (two shards, one child) is shared
by the module and the process-death tests use children that do not import torch at all.
"""

from __future__ import annotations

import collections
import json
import os
import pickle
import signal
import stat
import struct
import sys
import threading
import time

import numpy as np
import pytest

from studio.core.errors import ChildProcessError_, UnsafeFileError
from studio.core.jobs import JobCancelled, JobContext
from studio.core.model import CheckpointFormat, Role, open_model
from studio.core.model import pickle_loader as pl
from studio.core.model.pickle_loader import PickleOptions
from tests.core.model.test_model_helpers import LLAMA_CONFIG

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_AS and signals are POSIX")


def _torch():
    return pytest.importorskip("torch")


def _legacy_bomb(path, numel):
    """A ~400-byte legacy torch file whose one float storage claims ``numel`` elements (4*numel bytes)."""
    torch = _torch()
    from torch.serialization import MAGIC_NUMBER, PROTOCOL_VERSION

    marker = object()

    class Rebuild:
        def __reduce__(self):
            args = (marker, 0, (numel,), (1,), False, collections.OrderedDict())
            return (torch._utils._rebuild_tensor_v2, args)

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            return ("storage", torch.FloatStorage, "0", "cpu", numel, None) if obj is marker else None

    with open(path, "wb") as f:
        pickle.dump(MAGIC_NUMBER, f, protocol=2)
        pickle.dump(PROTOCOL_VERSION, f, protocol=2)
        sys_info = {"protocol_version": PROTOCOL_VERSION, "little_endian": True, "type_sizes": {}}
        pickle.dump(sys_info, f, protocol=2)
        Pickler(f, protocol=2).dump({"model.norm.weight": Rebuild()})
        pickle.dump(["0"], f, protocol=2)
        f.write(struct.pack("<q", numel) + bytes(16))  # 4 real floats; the rest never arrives


class _Canary:
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


# ------------------------------------------------------------------------- shared good conversion


def _expected_state(torch):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(16, 8, generator=g)
    embed = torch.randn(32, 8, generator=g)
    return {
        "model.embed_tokens.weight": embed,
        "model.layers.0.self_attn.q_proj.weight": q,
        "model.layers.0.self_attn.k_proj.weight": q.t(),  # not contiguous
        "model.layers.0.self_attn.v_proj.weight": torch.randn(8, 8, generator=g).to(torch.bfloat16),
        "model.layers.0.mlp.up_proj.weight": torch.randn(4, 8, generator=g).to(torch.float16),
        "model.layers.0.input_layernorm.weight": torch.ones(8),
        "lm_head.weight": embed,  # tied: same storage as the embedding
        "model.rotary.inv_freq": torch.arange(4, dtype=torch.int64),
        "model.mask": torch.tensor([True, False, True]),
        "model.scale": torch.tensor(0.5),  # 0-d
        "model.empty": torch.zeros(0, 8),
        "model.odd": torch.zeros(2, dtype=torch.complex128),  # safetensors cannot hold it
    }


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A two-shard pickle model (zip + legacy format) opened once through the child; torch.load banned here."""
    torch = _torch()
    root = tmp_path_factory.mktemp("pickle-child")
    folder = root / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    state = _expected_state(torch)
    names = list(state)
    shard1 = {k: state[k] for k in names[:8]}
    shard2 = {k: state[k] for k in names[8:]}
    torch.save(shard1, folder / "pytorch_model-00001-of-00002.bin")
    torch.save(
        {"state_dict": shard2},
        folder / "pytorch_model-00002-of-00002.bin",
        _use_new_zipfile_serialization=False,
    )
    index = {"weight_map": {k: "pytorch_model-00001-of-00002.bin" for k in shard1}}
    index["weight_map"].update({k: "pytorch_model-00002-of-00002.bin" for k in shard2})
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    cache = root / "cache"
    options = PickleOptions(cache_dir=cache)

    def banned(*a, **k):
        raise AssertionError("torch.load ran in the application's process")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "load", banned)
        ck = open_model(folder, allow_pickle=True, pickle_options=options)
    yield {"folder": folder, "cache": cache, "ck": ck, "state": state, "options": options}
    ck.close()


def test_inventory_matches_the_pickle(converted):
    torch = _torch()
    ck, state, folder = converted["ck"], converted["state"], converted["folder"]
    info = ck.info
    assert info.format is CheckpointFormat.PYTORCH
    assert info.architecture == LLAMA_CONFIG["architectures"][0]
    kept = [k for k in state if k != "model.odd"]
    assert [t.name for t in info.tensors] == kept  # the state dicts' order, both shards
    for t in info.tensors:
        want = state[t.name]
        assert t.shape == tuple(want.shape), t.name
        assert t.nbytes == want.numel() * want.element_size(), t.name
        shard = 1 if t.name in list(state)[:8] else 2
        assert t.file == folder / f"pytorch_model-0000{shard}-of-00002.bin", t.name
    by = {t.name: t for t in info.tensors}
    assert by["model.layers.0.self_attn.v_proj.weight"].dtype == "BF16"
    assert by["model.layers.0.mlp.up_proj.weight"].dtype == "F16"
    assert by["model.mask"].dtype == "BOOL" and by["model.rotary.inv_freq"].dtype == "I64"
    assert by["model.layers.0.self_attn.q_proj.weight"].role is Role.ATTN_Q
    assert by["model.layers.0.self_attn.q_proj.weight"].layer == 0
    assert by["lm_head.weight"].role is Role.OUTPUT
    assert any("pickle checkpoint" in w and "weights_only=True" in w for w in info.warnings)
    assert any("'model.odd'" in w and "left out" in w for w in info.warnings)
    assert info.parameters == sum(state[k].numel() for k in kept)
    del torch


def test_reads_equal_the_pickle(converted):
    torch = _torch()
    ck, state = converted["ck"], converted["state"]
    for name in ck.tensor_names:
        want = state[name]
        got = ck.read_torch(name)
        assert got.dtype == want.dtype, name
        assert torch.equal(got, want.contiguous()), name
        if want.dtype not in (torch.bool,):
            np.testing.assert_array_equal(ck.read(name), want.to(torch.float32).numpy(), err_msg=name)
    raw = ck.read_raw("model.layers.0.self_attn.v_proj.weight")
    assert raw.dtype == np.uint16
    np.testing.assert_array_equal(
        raw, state["model.layers.0.self_attn.v_proj.weight"].view(torch.int16).numpy().view(np.uint16)
    )


def test_cache_is_private_complete_and_reused(converted, monkeypatch):
    cache, folder, options = converted["cache"], converted["folder"], converted["options"]
    if os.name == "posix":
        assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    files = sorted(p.name for p in cache.iterdir())
    assert len(files) == 2 and all(f.endswith(".safetensors") for f in files), files  # no .partial left

    def no_child(*a, **k):
        raise AssertionError("a cached conversion started a child")

    monkeypatch.setattr(pl, "_run_child", no_child)
    with open_model(folder, allow_pickle=True, pickle_options=options) as again:
        assert again.tensor_names == converted["ck"].tensor_names
        np.testing.assert_array_equal(
            again.read("model.layers.0.self_attn.q_proj.weight"),
            converted["state"]["model.layers.0.self_attn.q_proj.weight"].numpy(),
        )


def test_cache_key_follows_the_file(tmp_path):
    f = tmp_path / "pytorch_model.bin"
    f.write_bytes(b"a" * 3_000_000)
    k1 = pl.cache_key(f)
    assert pl.cache_key(f) == k1
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    k2 = pl.cache_key(f)
    assert k2 != k1
    with open(f, "r+b") as h:  # same size, same mtime, a byte changed in the first MB
        h.seek(10)
        h.write(b"b")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert pl.cache_key(f) not in (k1, k2)


def test_damaged_cache_entry_is_reconverted(tmp_path, monkeypatch):
    src = tmp_path / "pytorch_model.bin"
    src.write_bytes(b"PK\x03\x04 not really")
    cache = tmp_path / "cache"
    cache.mkdir()
    target = cache / f"{pl.cache_key(src)}.safetensors"
    target.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      garbage")  # bytes after the last tensor
    calls = []

    def fake_child(jobs, budget, ctx, target_fn=None):
        calls.append([(s.name, t.name) for s, _p, t in jobs])
        pl.write_safetensors({}, str(jobs[0][2]), "x")

    monkeypatch.setattr(pl, "_run_child", fake_child)
    assert pl.convert_pickles([src], cache_dir=cache) == [target]
    assert calls == [[(src.name, target.name)]]


def test_memory_budget_is_a_share_of_free_ram_capped(monkeypatch):
    import studio.core.hardware as hw

    monkeypatch.setattr(hw, "ram", lambda: (16 << 30, 10 << 30))
    assert pl.memory_budget() == int((10 << 30) * pl.RAM_FRACTION)
    assert pl.memory_budget(1 << 30) == 1 << 30
    monkeypatch.setattr(hw, "ram", lambda: (0, 0))  # the OS would not say
    assert pl.memory_budget() == pl.DEFAULT_MEMORY_CAP


# ------------------------------------------------------------------------------------ row 7: bombs


@posix_only
def test_row07_pickle_bomb_hits_the_memory_limit(tmp_path):
    folder = tmp_path / "bomb"
    folder.mkdir()
    _legacy_bomb(folder / "pytorch_model.bin", 2**38)  # claims 1 TiB in a 400-byte file
    assert (folder / "pytorch_model.bin").stat().st_size < 1000
    cache = tmp_path / "cache"
    with pytest.raises(ChildProcessError_) as err:
        open_model(folder, allow_pickle=True, pickle_options=PickleOptions(cache_dir=cache))
    msg = str(err.value)
    assert "ran out of memory" in msg and "limit" in msg and "pytorch_model.bin" in msg, msg
    assert list(cache.iterdir()) == []  # no partial, nothing under a final name


@posix_only
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS is enforced on Linux")
def test_row07_legit_tensor_over_a_tiny_limit(tmp_path):
    """A real 32 MB tensor loads without a limit, so only RLIMIT_AS can make this fail."""
    torch = _torch()
    folder = tmp_path / "big"
    folder.mkdir()
    torch.save(
        {"model.norm.weight": torch.zeros(8 << 20)},
        folder / "pytorch_model.bin",
        _use_new_zipfile_serialization=False,
    )
    cache = tmp_path / "cache"
    options = PickleOptions(cache_dir=cache, memory_cap=8 << 20)
    with pytest.raises(
        ChildProcessError_, match=r"ran out of memory \(limit 8 MB\) loading pytorch_model\.bin"
    ):
        open_model(folder, allow_pickle=True, pickle_options=options)
    assert list(cache.iterdir()) == []


# ------------------------------------------------------------------------ row 5: code, not tensors


def test_row05_reduce_payload_refused_in_the_child(tmp_path, monkeypatch):
    torch = _torch()
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # row 6: must change nothing
    canary = tmp_path / "canary"
    folder = tmp_path / "evil"
    folder.mkdir()
    torch.save({"model.norm.weight": torch.ones(4), "evil": _Canary(canary)}, folder / "pytorch_model.bin")
    cache = tmp_path / "cache"
    with pytest.raises(UnsafeFileError) as err:
        open_model(folder, allow_pickle=True, pickle_options=PickleOptions(cache_dir=cache))
    msg = str(err.value)
    assert "pytorch_model.bin was refused" in msg and "(it asks for io.open)" in msg, msg
    assert "weights_only=False" not in msg
    assert not canary.exists()
    assert list(cache.iterdir()) == []


# --------------------------------------------------------------- child death and cancellation


def _die_by_sigkill(conn, jobs, budget):
    conn.send({"kind": "progress", "message": ""})
    os.kill(os.getpid(), signal.SIGKILL)


def _die_by_sigsegv(conn, jobs, budget):
    os.kill(os.getpid(), signal.SIGSEGV)


def _hang(conn, jobs, budget):
    with open(jobs[0][1], "wb") as f:  # a partial the parent must clean up
        f.write(b"half")
    with open(os.path.join(os.path.dirname(jobs[0][1]), "pid"), "w") as f:
        f.write(str(os.getpid()))
    conn.send({"kind": "progress", "message": ""})
    time.sleep(120)


def _jobs(tmp_path):
    src = tmp_path / "pytorch_model.bin"
    src.write_bytes(b"x")
    return [(src, tmp_path / "t.safetensors.partial-1", tmp_path / "t.safetensors")]


@posix_only
@pytest.mark.parametrize(
    ("target", "want"),
    [(_die_by_sigkill, "ran out of memory"), (_die_by_sigsegv, r"crashed \(signal 11\)")],
    ids=["sigkill", "sigsegv"],
)
def test_child_death_is_reported_and_parent_survives(tmp_path, target, want):
    jobs = _jobs(tmp_path)
    with pytest.raises(ChildProcessError_, match=want) as err:
        pl._run_child(jobs, 1 << 30, JobContext(), target_fn=target)
    assert "pytorch_model.bin" in str(err.value)
    assert not jobs[0][2].exists()


@posix_only
def test_cancel_kills_the_child_and_removes_the_partial(tmp_path):
    jobs = _jobs(tmp_path)
    ctx = JobContext()
    pid_file = tmp_path / "pid"

    def cancel_once_running():
        deadline = time.monotonic() + 60
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.1)
        ctx.cancel()

    t = threading.Thread(target=cancel_once_running, daemon=True)
    t.start()
    with pytest.raises(JobCancelled):
        pl._run_child(jobs, 1 << 30, ctx, target_fn=_hang)
    t.join()
    assert pid_file.exists(), "the child never ran"
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(int(pid_file.read_text()), 0)
    assert not jobs[0][1].exists() and not jobs[0][2].exists()


def test_writer_streams_a_valid_safetensors_file(tmp_path):
    """The child's writer, run in-process: safetensors' own reader agrees, odd entries are left out."""
    torch = _torch()
    from safetensors.torch import load_file

    from studio.core.model.st_header import read_header

    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    tensors = {
        "a": base,
        "a_t": base.t(),
        "tied": base,
        "h": torch.ones(2, 2, dtype=torch.float16),
        "__metadata__": torch.zeros(1),  # would collide with the header's metadata key
        "c": torch.zeros(2, dtype=torch.complex128),
        "empty": torch.zeros(0, 3),
    }
    out = tmp_path / "x.safetensors"
    pl.write_safetensors(tensors, str(out), "pytorch_model.bin")
    header = read_header(out)
    assert [e.name for e in header.entries] == ["a", "a_t", "tied", "h", "empty"]
    assert pl.skipped_tensors(header.metadata) == ["__metadata__", "c"]
    assert header.metadata["quant_studio.source"] == "pytorch_model.bin"
    got = load_file(str(out))
    for name in ("a", "a_t", "tied", "h", "empty"):
        assert torch.equal(got[name], tensors[name].contiguous()), name
