"""Faults during export (FAULTS.md rows 19, 21, 37–42): no file under the final name unless complete
and validated, partial files removed or recognisable, old files untouched, clear errors."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from studio.core.errors import ChildProcessError_, ExportError, QuantizationError, StudioError
from studio.core.export.run import export_gguf, llamacpp_validator
from studio.core.gguf.read import read_gguf
from studio.core.gguf.writer import AtomicGGUFWriter, remove_stale_partials, stale_partials
from studio.core.jobs import JobCancelled, JobContext
from studio.core.llamacpp import LoadOptions
from studio.core.model import open_model
from studio.core.quant.nonfinite import scan_nonfinite

OLD = b"an older, good file that must survive"


def _cancel_at(fraction: float) -> tuple[JobContext, list[float]]:
    seen: list[float] = []
    ctx = JobContext(min_interval=0.0)

    def progress(done: int, total: int, msg: str) -> None:
        seen.append(done / total if total else 1.0)
        if total and done / total >= fraction:
            ctx.cancel()

    ctx.on_progress = progress
    return ctx, seen


@contextlib.contextmanager
def _tmpfs(path: Path, opts: str):
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True)
    if r.returncode != 0:
        yield False
        return
    try:
        yield True
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


# ------------------------------------------------------------------------------------- FAULTS 38


def test_cancel_at_half_leaves_no_file_and_old_file_intact(llama_model, tmp_path):
    out = tmp_path / "model.gguf"
    out.write_bytes(OLD)
    ctx, seen = _cancel_at(0.5)
    with pytest.raises(JobCancelled):
        export_gguf(llama_model, out, "Q8_0", ctx=ctx)
    assert 0.5 <= max(seen) < 1.0
    assert out.read_bytes() == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf"]
    # the next job runs normally and replaces the old file atomically
    res = export_gguf(llama_model, out, "Q8_0")
    assert res.path == out and read_gguf(out).metadata["general.file_type"] == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf"]


def test_cancel_llamacpp_backend_leaves_nothing(llama_model, tmp_path):
    ctx, _ = _cancel_at(0.25)
    with pytest.raises(JobCancelled):
        export_gguf(llama_model, tmp_path / "m.gguf", "Q4_K_M", backend="llama.cpp", ctx=ctx)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------- FAULTS 39

_SLOW_EXPORT = textwrap.dedent(
    """
    import sys, time
    from studio.core.export.run import export_gguf
    from studio.core.jobs import JobContext
    import studio.core.export.run as ex
    ex.CHUNK_BYTES = 4096  # many small chunks, each followed by a progress report
    def slow(done, total, msg):
        print("progress", done, total, flush=True)
        time.sleep(0.02)
    export_gguf(sys.argv[1], sys.argv[2], "F32", ctx=JobContext(on_progress=slow, min_interval=0.0))
    print("finished", flush=True)
    """
)


def test_killed_export_leaves_only_partial(llama_model, tmp_path):
    out = tmp_path / "killed.gguf"
    out.write_bytes(OLD)
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_EXPORT, str(llama_model), str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    partial = tmp_path / "killed.gguf.partial"
    try:
        lines = 0
        for line in proc.stdout:  # wait until tensor data is being written
            lines += 1
            if line.startswith("progress") and lines > 20 and partial.exists() and partial.stat().st_size > 0:
                break
        # while the exporter holds it, the partial file is not "stale"
        assert partial in [p for p in tmp_path.iterdir()]
        assert stale_partials(tmp_path) == []
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert out.read_bytes() == OLD  # the final name never holds a truncated GGUF
    assert sorted(p.name for p in tmp_path.iterdir()) == ["killed.gguf", "killed.gguf.partial"]
    assert stale_partials(tmp_path) == [partial]
    assert remove_stale_partials(tmp_path) == [partial]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["killed.gguf"]


# ------------------------------------------------------------------------------------- FAULTS 37


def test_full_disk_is_a_clear_error(llama_model, tmp_path, monkeypatch):
    mnt = tmp_path / "small"
    with _tmpfs(mnt, "size=1m") as mounted:
        if not mounted:
            pytest.skip("cannot mount a tmpfs here (see the injected-ENOSPC test)")
        out = mnt / "model.gguf"
        out.write_bytes(OLD)
        # up-front: the free-space check refuses before writing anything
        with pytest.raises(ExportError, match=r"Out of disk space writing .*model\.gguf \(need about"):
            export_gguf(llama_model, out, "F32")
        assert out.read_bytes() == OLD and sorted(p.name for p in mnt.iterdir()) == ["model.gguf"]
        # mid-write: skip the estimate, so the file system itself runs out (ENOSPC)
        import studio.core.export.run as ex

        monkeypatch.setattr(ex, "check_output_path", lambda out, inputs=(), need_bytes=0: out)
        with pytest.raises(
            ExportError, match=r"Out of disk space writing .*model\.gguf \(need about [0-9.]+ MB\)"
        ):
            export_gguf(llama_model, out, "F32")
        assert out.read_bytes() == OLD
        assert sorted(p.name for p in mnt.iterdir()) == ["model.gguf"]


def test_injected_enospc_removes_partial(llama_model, tmp_path, monkeypatch):
    import errno

    real = AtomicGGUFWriter.write_tensor_chunks
    calls = {"n": 0}

    def failing(self, name, chunks):
        calls["n"] += 1
        if calls["n"] == 5:
            raise self._raise_os(
                OSError(errno.ENOSPC, "No space left on device"), f"writing tensor {name} to"
            )
        return real(self, name, chunks)

    monkeypatch.setattr(AtomicGGUFWriter, "write_tensor_chunks", failing)
    with pytest.raises(ExportError, match="Out of disk space"):
        export_gguf(llama_model, tmp_path / "m.gguf", "Q8_0")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------- FAULTS 40, 41


def test_output_equal_to_input_is_refused(llama_model):
    src = llama_model / "model.safetensors"
    before = src.stat().st_mtime_ns, src.stat().st_size
    with pytest.raises(ExportError, match="is the input model file itself"):
        export_gguf(llama_model, src, "F32")
    assert (src.stat().st_mtime_ns, src.stat().st_size) == before


def test_missing_folder_is_refused(llama_model, tmp_path):
    with pytest.raises(ExportError, match="does not exist"):
        export_gguf(llama_model, tmp_path / "nope" / "m.gguf", "F32")


def test_read_only_folder_is_refused(llama_model, tmp_path):
    ro = tmp_path / "ro"
    with _tmpfs(ro, "ro,size=1m") as mounted:
        if not mounted:
            if os.geteuid() == 0:
                pytest.skip("root ignores chmod and tmpfs cannot be mounted here")
            ro.chmod(0o555)
        with pytest.raises(ExportError, match="permission denied"):
            export_gguf(llama_model, ro / "m.gguf", "F32")


# ------------------------------------------------------------------------------------- FAULTS 42


def test_writer_bug_fails_validation_and_deletes(llama_model, tmp_path, monkeypatch):
    out = tmp_path / "m.gguf"
    out.write_bytes(OLD)
    real_commit = AtomicGGUFWriter.commit

    def corrupting_commit(self, validate=None):
        # a "writer bug": one byte of the last tensor differs from what was produced
        self._file.flush()
        last = self.planned[-1]
        with open(self.partial, "r+b") as f:
            f.seek(-max(1, last.nbytes // 2) - ((-last.nbytes) % 32), os.SEEK_END)
            b = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([b[0] ^ 0xFF]))
        return real_commit(self, validate)

    monkeypatch.setattr(AtomicGGUFWriter, "commit", corrupting_commit)
    with pytest.raises(ExportError, match="failed validation and was deleted"):
        export_gguf(llama_model, out, "Q8_0")
    assert out.read_bytes() == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


def test_optional_llamacpp_validation_passes(llama_model, tmp_path):
    res = export_gguf(llama_model, tmp_path / "m.gguf", "Q8_0", validate=llamacpp_validator)
    assert res.path.exists()


def test_llamacpp_validation_rejects_unloadable_file(llama_model, tmp_path, monkeypatch):
    def broken_validator(path):
        # what llama.cpp would see if our metadata were wrong: a header with no architecture
        bad = tmp_path / "bad.gguf"
        bad.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(16))
        llamacpp_validator(bad)

    with pytest.raises(ExportError, match="cannot load"):
        export_gguf(llama_model, tmp_path / "m.gguf", "F32", validate=broken_validator)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf"]


# ------------------------------------------------------------------------------------- FAULTS 19


def _copy_with(model: Path, dst: Path, edit) -> Path:
    from safetensors.numpy import load_file, save_file

    shutil.copytree(model, dst)
    st = dst / "model.safetensors"
    tensors = load_file(st)
    edit(tensors)
    save_file(tensors, st, metadata={"format": "pt"})
    return dst


def test_nan_and_inf_are_refused_with_tensor_and_count(llama_model, tmp_path):
    name = "model.layers.1.mlp.down_proj.weight"

    def poison(t):
        w = t[name].copy()
        w[3, :5] = np.nan
        w[7, 1] = np.inf
        w[8, 2] = -np.inf
        t[name] = w

    model = _copy_with(llama_model, tmp_path / "bad", poison)
    out = tmp_path / "out" / "m.gguf"
    out.parent.mkdir()
    with pytest.raises(QuantizationError, match=rf"{name}.*5 NaN and 2 Inf"):
        export_gguf(model, out, "Q4_K_M")
    assert list(out.parent.iterdir()) == []
    with open_model(model) as ck:
        bad = scan_nonfinite(ck)
    assert [(b.tensor, b.nan, b.inf) for b in bad] == [(name, 5, 2)]


# ------------------------------------------------------------------------------------- FAULTS 21


def test_empty_and_scalar_tensors_are_skipped_with_a_note(llama_model, tmp_path, llama_worker):
    def extra(t):
        t["model.layers.0.extra_empty"] = np.zeros((0, 256), dtype=np.float32)
        t["model.extra_scale"] = np.array(2.0, dtype=np.float32)

    model = _copy_with(llama_model, tmp_path / "odd", extra)
    res = export_gguf(model, tmp_path / "m.gguf", "Q4_K_M")
    assert any("model.extra_scale" in n for n in res.notes)
    assert any("model.layers.0.extra_empty" in n for n in res.notes)
    names = {t.name for t in read_gguf(res.path).tensors}
    assert not any("extra" in n for n in names)
    llama_worker.load(res.path, LoadOptions(vocab_only=True))


def test_rows_not_divisible_fall_back_visibly(odd_hidden_model, tmp_path):
    res = export_gguf(odd_hidden_model, tmp_path / "m.gguf", "Q4_K_M")
    assert res.fallbacks, "hidden 320 cannot be split into 256-blocks"
    types = {t.name: t.type_name for t in read_gguf(res.path).tensors}
    for f in res.fallbacks:
        assert types[f.gguf_name] == f.got
        assert f.wanted in ("Q4_K", "Q6_K") and f.got in ("Q5_0", "Q8_0")
        assert "320" in f.reason or "960" in f.reason


# ------------------------------------------------------------------------------------- child crash


def test_crashing_llamacpp_child_is_an_error_not_a_crash(llama_model, tmp_path):
    from studio.core.export.verify import verify_gguf
    from studio.core.llamacpp import LlamaWorker

    with LlamaWorker() as wk:
        with pytest.raises(ChildProcessError_, match="SIGSEGV"):
            wk.request("crash", how="segv")
        assert not wk.alive
    with LlamaWorker() as wk:
        with pytest.raises(ChildProcessError_, match="SIGABRT"):
            wk.request("crash", how="abort")
    # a damaged GGUF reaching verification: our bounded reader accepts its header (an architecture
    # name llama.cpp does not know), so it is llama.cpp in the child that refuses it; the parent goes on
    good = export_gguf(llama_model, tmp_path / "good.gguf", "F32").path
    raw = good.read_bytes()
    key = b"general.architecture"
    at = raw.index(key) + len(key) + 4 + 8  # after the key, its value type (u32) and length (u64)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(raw[:at] + b"zzzzz" + raw[at + 5 :])
    assert read_gguf(bad).metadata["general.architecture"] == "zzzzz"
    with pytest.raises(StudioError, match=r"llama\.cpp could not load \S*bad\.gguf: Failed to load model"):
        verify_gguf(bad, llama_model)
    # the parent is alive and a fresh worker serves requests again
    with LlamaWorker() as wk:
        assert wk.request("ping") == "pong"


def test_stale_partials_are_cleaned(tmp_path):
    (tmp_path / "a.gguf.partial").write_bytes(b"GGUF...")
    (tmp_path / "b.gguf").write_bytes(b"GGUF...")
    (tmp_path / "notes.json").write_text(json.dumps({}))
    removed = remove_stale_partials(tmp_path)
    assert [p.name for p in removed] == ["a.gguf.partial"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.gguf", "notes.json"]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_a_process_knows_when_it_started_to_a_clock_tick():
    """Stale partials are those written before this run started: a start time a second early (btime is whole
    seconds) kept the partial a kill -9 had left less than a second before the rerun (CI, issue 25's test)."""
    before = time.time()
    code = "import time; from studio.core.gguf.writer import process_start_time as s; print(s(), time.time())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parents[3],
    )
    start, now = map(float, out.stdout.split())
    assert before - 0.02 <= start <= now  # forked after ``before``; one 10 ms tick of rounding
