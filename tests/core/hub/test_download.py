"""Downloads against the fake Hub: correctness, resume, verification, retries, auth, disk, cancel.

Each FAULTS.md row 23-36 has at least one test here (named ``test_row_NN_...``).
"""

from __future__ import annotations

import errno
import importlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from studio.core.hub import (
    AuthRequired,
    CorruptDownload,
    DiskSpaceError,
    FileTooLarge,
    IncompleteSnapshot,
    NetworkError,
    OfflineError,
    RateLimited,
    RepoNotFound,
    download,
    download_snapshot,
    retry,
)
from studio.core.hub.cache import find_leftovers, remove_leftovers
from studio.core.hub.paths import PARTIAL_SUFFIX, long_path, repo_cache_path, safe_repo_path
from studio.core.jobs import JobCancelled, JobContext
from tests.core.hub.fakehub import FakeRepo, Fault

dl_module = importlib.import_module("studio.core.hub.download")
LLAMA = "tiny-org/tiny-llama"
ST = "model.safetensors"


def _files_equal(path: Path, repo: FakeRepo, names=None) -> None:
    names = names if names is not None else list(repo.files)
    for name in names:
        assert (path / name).read_bytes() == repo.files[name], name


def _blobs(hub, repo_id=LLAMA) -> Path:
    return repo_cache_path(hub.cache_dir, repo_id) / "blobs"


def _partials(hub, repo_id=LLAMA) -> list[Path]:
    return sorted(_blobs(hub, repo_id).glob(f"*{PARTIAL_SUFFIX}"))


def _final_blob(hub, repo_id=LLAMA, name=ST) -> Path:
    return _blobs(hub, repo_id) / hub.repos[repo_id].etag(name)


# -- the happy path ---------------------------------------------------------------------------------


def test_download_is_byte_identical_and_in_hf_cache_layout(hub):
    repo = hub.repos[LLAMA]
    seen = []
    path = download(LLAMA, on_progress=seen.append)
    assert path == hub.cache_dir / "models--tiny-org--tiny-llama" / "snapshots" / repo.commit
    _files_equal(path, repo)
    assert (path / ST).is_symlink() and os.readlink(path / ST) == f"../../blobs/{repo.sha256(ST)}"
    assert (path.parent.parent / "refs" / "main").read_text() == repo.commit
    # huggingface_hub's own tools see our files as a proper cache entry.
    from huggingface_hub import hf_hub_download, scan_cache_dir

    info = scan_cache_dir(hub.cache_dir)
    assert [r.repo_id for r in info.repos] == [LLAMA] and not info.warnings
    assert next(iter(info.repos)).nb_files == len(repo.files)
    cached = hf_hub_download(LLAMA, "config.json", cache_dir=hub.cache_dir, local_files_only=True)
    assert Path(cached).read_bytes() == repo.files["config.json"]
    # Progress: per file, with totals, ending at 100 %.
    assert seen[-1].done == seen[-1].total == sum(len(b) for b in repo.files.values())
    assert {p.file for p in seen} >= set(repo.files)
    st_updates = [p for p in seen if p.file == ST and p.file_total == len(repo.files[ST])]
    assert st_updates and st_updates[-1].file_done == len(repo.files[ST])
    # A second call is answered from the cache: no file is fetched again.
    hub.clear()
    assert download(LLAMA) == path
    assert not [r for r in hub.requests if "/resolve/" in r.path]


def test_include_glob_and_revision_commit(hub):
    repo = hub.repos[LLAMA]
    res = download_snapshot(LLAMA, repo.commit, include="*.json")
    assert sorted(res.files) == ["config.json", "tokenizer.json", "tokenizer_config.json"]
    _files_equal(res.path, repo, res.files)
    assert not (res.path / ST).exists()
    assert not (res.path.parent.parent / "refs" / "main").exists()  # a commit is not a branch
    with pytest.raises(Exception, match="No file of"):
        download(LLAMA, include="*.bin")


@pytest.mark.parametrize("redirect", [False, True], ids=["direct", "cdn-redirect"])
def test_files_without_listed_sizes_are_headed_first(hub, redirect):
    hub.list_blobs = False
    hub.redirect_lfs = redirect
    path = download(LLAMA)
    _files_equal(path, hub.repos[LLAMA])
    heads = [r for r in hub.requests if r.method == "HEAD"]
    assert len(heads) == len(hub.repos[LLAMA].files)
    assert _final_blob(hub).is_file()  # named by the X-Linked-Etag sha256, and verified against it


def test_missing_repo_and_revision(hub):
    with pytest.raises(RepoNotFound, match="'nobody/nothing' does not exist on the Hub"):
        download("nobody/nothing")
    with pytest.raises(RepoNotFound, match="Revision 'v9' does not exist"):
        download(LLAMA, revision="v9")


# -- row 23: network drop ----------------------------------------------------------------------------


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
def test_row_23_dropped_connection_resumes_with_range(hub, waits, reset):
    repo = hub.repos[LLAMA]
    hub.add_fault(Fault("drop", path=f"*/{ST}", after_bytes=100_000, reset=reset))
    notes = []
    path = download(LLAMA, on_progress=lambda p: notes.append(p.message))
    _files_equal(path, repo)
    gets = hub.file_requests(ST)
    assert [g.range for g in gets] == [None, "bytes=100000-"]
    assert any("connection lost" in n and "resuming (try 2 of 5)" in n for n in notes)
    assert not _partials(hub)


def test_row_23_retries_exhausted_error_keeps_resumable_partial(hub, waits):
    hub.add_fault(Fault("drop", path=f"*/{ST}", after_bytes=10_000, times=None))
    with pytest.raises(NetworkError, match=r"only 50 KB of 263 KB arrived after 5 tries"):
        download(LLAMA)
    assert not _final_blob(hub).exists()  # nothing under a blob's final name
    assert [p.stat().st_size for p in _partials(hub)] == [50_000]
    assert len(hub.file_requests(ST)) == 5
    # The next call (or the next app start) continues where the last one stopped, and verifies.
    hub.clear()
    path = download(LLAMA)
    _files_equal(path, hub.repos[LLAMA])
    assert [g.range for g in hub.file_requests(ST)] == ["bytes=50000-"]


# -- row 24: Range ignored ---------------------------------------------------------------------------


def test_row_24_server_ignores_range_restarts_from_zero(hub, waits):
    repo = hub.repos[LLAMA]
    hub.add_fault(Fault("drop", path=f"*/{ST}", after_bytes=100_000))
    hub.add_fault(Fault("ignore_range", path=f"*/{ST}"))
    notes = []
    path = download(LLAMA, on_progress=lambda p: notes.append(p.message))
    _files_equal(path, repo)  # no duplicated bytes: the 200 body replaced the partial
    assert [g.range for g in hub.file_requests(ST)] == [None, "bytes=100000-"]
    assert any("restarting the file from zero" in n for n in notes)


# -- row 25: short body ------------------------------------------------------------------------------


def test_row_25_short_body_once_is_completed_by_range(hub, waits):
    hub.add_fault(Fault("short", path=f"*/{ST}", missing=1000))
    path = download(LLAMA)
    _files_equal(path, hub.repos[LLAMA])
    assert hub.file_requests(ST)[-1].range == f"bytes={len(hub.repos[LLAMA].files[ST]) - 1000}-"


def test_row_25_short_body_always_is_a_consistency_error(hub, waits):
    hub.add_fault(Fault("short", path=f"*/{ST}", missing=100_000, times=None))
    with pytest.raises(NetworkError, match="Consistency check failed for 'model.safetensors'"):
        download(LLAMA)
    assert not _final_blob(hub).exists()
    snap = repo_cache_path(hub.cache_dir, LLAMA) / "snapshots" / hub.repos[LLAMA].commit
    assert not (snap / ST).exists()


# -- row 26: wrong bytes -----------------------------------------------------------------------------


def test_row_26_flipped_byte_is_rejected_and_removed(hub):
    hub.add_fault(Fault("flip", path=f"*/{ST}", offset=123_456))
    with pytest.raises(
        CorruptDownload, match=r"'model.safetensors'.*does not match the sha256.*the file was deleted"
    ):
        download(LLAMA)
    assert not _partials(hub) and not _final_blob(hub).exists()
    snap = repo_cache_path(hub.cache_dir, LLAMA) / "snapshots" / hub.repos[LLAMA].commit
    assert not (snap / ST).exists()
    # Asking again fetches a good copy.
    _files_equal(download(LLAMA), hub.repos[LLAMA])


def test_row_26_flipped_byte_in_small_file_fails_git_checksum(hub):
    hub.add_fault(Fault("flip", path="*/config.json", offset=5))
    with pytest.raises(CorruptDownload, match="'config.json'.*git checksum"):
        download(LLAMA, include="config.json")


# -- row 27: 429 -------------------------------------------------------------------------------------


def test_row_27_429_retry_after_is_honoured_and_visible(hub, waits):
    hub.add_fault(Fault("status", path=f"*/{ST}", times=2, status=429, headers={"Retry-After": "7"}))
    notes, logs = [], []
    path = download(LLAMA, ctx=JobContext(on_log=logs.append), on_progress=lambda p: notes.append(p.message))
    _files_equal(path, hub.repos[LLAMA])
    assert logs.count("rate-limited, waiting 7 s") == 2
    assert "rate-limited, waiting 7 s" in notes
    assert sum(waits) == pytest.approx(14.0)


def test_row_27_rate_limit_header_and_give_up_after_5_tries(hub, waits):
    hub.add_fault(
        Fault("status", path=f"*/{ST}", times=None, status=429, headers={"RateLimit": '"api";r=0;t=3'})
    )
    with pytest.raises(RateLimited, match="rate-limiting"):
        download(LLAMA)
    assert len(hub.file_requests(ST)) == 5
    assert sum(waits) == pytest.approx(4 * 3.0)


def test_row_27_wait_is_cancellable(hub, monkeypatch):
    hub.add_fault(Fault("status", path=f"*/{ST}", times=None, status=429, headers={"Retry-After": "200"}))
    ctx = JobContext()
    ticks = []

    def tick(s):
        ticks.append(s)
        if len(ticks) == 3:
            ctx.cancel()

    monkeypatch.setattr(retry, "_sleep", tick)
    with pytest.raises(JobCancelled):
        download(LLAMA, ctx=ctx)
    assert len(ticks) == 3  # stopped at the first tick after the cancel, not after 300 s


# -- row 28: 5xx, timeouts, cache fallback -----------------------------------------------------------


def test_row_28_5xx_storm_then_clear_error(hub, waits):
    hub.add_fault(Fault("status", path=f"*/{ST}", times=None, status=503))
    with pytest.raises(NetworkError, match="HTTP 503"):
        download(LLAMA)
    assert len(hub.file_requests(ST)) == 5
    assert sum(waits) == pytest.approx(1 + 2 + 4 + 8)  # exponential backoff


def test_row_28_stalled_body_times_out_and_resumes(hub, waits, monkeypatch):
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "1")  # huggingface_hub parses it as an int at import
    hub.add_fault(Fault("stall", path=f"*/{ST}", delay=2.5))
    path = download(LLAMA)
    _files_equal(path, hub.repos[LLAMA])
    assert len(hub.file_requests(ST)) == 2


def test_row_28_unreachable_hub_falls_back_to_cache_and_says_so(hub, waits):
    first = download(LLAMA)
    hub.add_fault(Fault("status", path="/api/models/*", times=None, status=502))
    logs = []
    res = download_snapshot(LLAMA, ctx=JobContext(on_log=logs.append))
    assert res.path == first and res.from_cache
    assert "cached copy" in res.note and any("cached copy" in line for line in logs)


# -- row 29: gated / private / bad token -------------------------------------------------------------


def test_row_29_gated_without_token_asks_for_one(hub):
    with pytest.raises(AuthRequired, match="gated: accept its terms at .*/gated-org/gated-llama") as info:
        download("gated-org/gated-llama")
    assert info.value.gated and info.value.repo_id == "gated-org/gated-llama"


def test_row_29_wrong_token_is_refused_and_never_echoed(hub):
    with pytest.raises(AuthRequired, match="no access to the gated repository") as info:
        download("gated-org/gated-llama", token="hf_secret_wrong_token")
    assert "hf_secret_wrong_token" not in str(info.value)


def test_row_29_good_token_downloads_and_is_not_sent_to_other_hosts(hub):
    hub.redirect_lfs = True  # LFS files come from /cdn on "localhost", as the Hub redirects to its CDN
    path = download("gated-org/gated-llama", token="hf_good_token")
    _files_equal(path, hub.repos["gated-org/gated-llama"])
    cdn = [r for r in hub.requests if r.path.startswith("/cdn/")]
    assert cdn and all(r.host == "localhost" and r.authorization is None for r in cdn)
    resolve = [r for r in hub.requests if "/resolve/" in r.path]
    assert all(r.authorization == "Bearer hf_good_token" for r in resolve)


def test_row_29_private_repo_without_token(hub):
    hub.repos[LLAMA].private = True
    with pytest.raises(AuthRequired, match="not found or is private"):
        download(LLAMA)
    with pytest.raises(AuthRequired, match="token was refused"):
        download(LLAMA, token="hf_expired")


# -- row 30: offline ---------------------------------------------------------------------------------


def test_row_30_offline_with_full_cache_makes_no_request(hub, monkeypatch):
    path = download(LLAMA)
    hub.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    res = download_snapshot(LLAMA)
    assert res.path == path and res.from_cache and hub.requests == []
    _files_equal(res.path, hub.repos[LLAMA])


def test_row_30_offline_with_partial_cache_lists_missing_files(hub, monkeypatch, waits):
    hub.add_fault(Fault("drop", path=f"*/{ST}", after_bytes=1000, times=None))
    with pytest.raises(NetworkError):
        download(LLAMA)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(IncompleteSnapshot, match=r"1 file\(s\) missing \(model.safetensors\)") as info:
        download(LLAMA)
    assert info.value.missing == (ST,)
    assert download(LLAMA, include="*.json").is_dir()  # what is complete still opens
    with pytest.raises(OfflineError, match="not in the local cache"):
        download("tiny-org/tiny-llama-GGUF")


def test_row_30_no_network_at_all(hub, waits):
    path = download(LLAMA, include="*.json")
    hub.stop()  # connection refused from now on
    res = download_snapshot(LLAMA, include="*.json")
    assert res.from_cache and res.path == path
    with pytest.raises(IncompleteSnapshot):
        download(LLAMA)


# -- row 31: disk full -------------------------------------------------------------------------------


def test_row_31_too_small_disk_fails_before_any_byte(hub, monkeypatch):
    import shutil

    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=100_000))
    with pytest.raises(
        DiskSpaceError, match="Not enough disk space for 'tiny-org/tiny-llama'.*only 100 KB is free"
    ):
        download(LLAMA)
    assert not [r for r in hub.requests if "/resolve/" in r.path]
    assert not repo_cache_path(hub.cache_dir, LLAMA).exists()


def test_row_31_enospc_mid_write_removes_partial(hub, monkeypatch):
    real_open = open

    class Full:
        def __init__(self, f):
            self.f, self.n = f, 0

        def write(self, b):
            self.n += len(b)
            if self.n > 50_000:
                raise OSError(errno.ENOSPC, "No space left on device")
            return self.f.write(b)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def fake_open(path, mode="r", *a, **k):
        f = real_open(path, mode, *a, **k)
        return Full(f) if str(path).endswith(PARTIAL_SUFFIX) else f

    monkeypatch.setattr(dl_module, "open", fake_open, raising=False)
    with pytest.raises(
        DiskSpaceError,
        match="filled up while downloading '(config.json|README.md|model.safetensors|tokenizer.json|tokenizer_config.json)'",
    ):
        download(LLAMA, include=ST)
    assert not _partials(hub) and not _final_blob(hub).exists()


# -- row 32: two downloads of the same file ----------------------------------------------------------


def test_row_32_two_threads_one_waits_visibly(hub):
    hub.add_fault(Fault("slow", path=f"*/{ST}", times=1, chunk=32_768, delay=0.05))
    results, notes = {}, []

    def run(key):
        results[key] = download(LLAMA, on_progress=lambda p: notes.append(p.message))

    threads = [threading.Thread(target=run, args=(k,)) for k in "ab"]
    for t in threads:
        t.start()
        time.sleep(0.2)
    for t in threads:
        t.join(30)
    assert results["a"] == results["b"]
    _files_equal(results["a"], hub.repos[LLAMA])
    assert len(hub.file_requests(ST)) == 1  # the second waited instead of fetching again
    assert any("waiting for another download" in n for n in notes)


def test_row_32_two_processes_both_end_correct(hub, tmp_path):
    hub.add_fault(Fault("slow", path=f"*/{ST}", times=None, chunk=65_536, delay=0.05))
    code = "import sys; from studio.core.hub import download; print(download('tiny-org/tiny-llama'))"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[3]))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    paths = {Path(o[0].strip()) for o in outs}
    assert len(paths) == 1
    _files_equal(paths.pop(), hub.repos[LLAMA])
    assert not _partials(hub)


# -- row 33: stale leftovers -------------------------------------------------------------------------


def test_row_33_stale_incomplete_and_locks_are_ignored_then_cleaned(hub):
    repo = hub.repos[LLAMA]
    blobs = _blobs(hub)
    blobs.mkdir(parents=True)
    (blobs / f"{repo.sha256(ST)}.incomplete").write_bytes(b"garbage from an old crash")
    lock_dir = hub.cache_dir / ".locks" / "models--tiny-org--tiny-llama"
    lock_dir.mkdir(parents=True)
    (lock_dir / f"{repo.sha256(ST)}.lock").write_bytes(b"")
    path = download(LLAMA)
    _files_equal(path, repo)
    kinds = sorted(x.kind for x in find_leftovers(hub.cache_dir) if x.kind in ("incomplete",))
    assert kinds == ["incomplete"]
    assert any(x.kind == "lock" for x in find_leftovers(hub.cache_dir))
    remove_leftovers(find_leftovers(hub.cache_dir))
    assert find_leftovers(hub.cache_dir) == []
    _files_equal(path, repo)  # cleanup never touches finished files


def test_row_33_partial_from_a_previous_run_is_resumed(hub):
    repo = hub.repos[LLAMA]
    blobs = _blobs(hub)
    blobs.mkdir(parents=True)
    (blobs / f"{repo.sha256(ST)}{PARTIAL_SUFFIX}").write_bytes(repo.files[ST][:70_000])
    path = download(LLAMA)
    _files_equal(path, repo)
    assert [g.range for g in hub.file_requests(ST)] == ["bytes=70000-"]


def test_row_33_corrupt_partial_from_a_previous_run_is_caught(hub):
    repo = hub.repos[LLAMA]
    blobs = _blobs(hub)
    blobs.mkdir(parents=True)
    (blobs / f"{repo.sha256(ST)}{PARTIAL_SUFFIX}").write_bytes(b"\x00" * 70_000)
    with pytest.raises(CorruptDownload):
        download(LLAMA)
    assert not _partials(hub)
    _files_equal(download(LLAMA), repo)


# -- row 34: cancel ----------------------------------------------------------------------------------


def test_row_34_cancel_mid_file_is_prompt_and_resumable(hub):
    repo = hub.repos[LLAMA]
    hub.add_fault(Fault("slow", path=f"*/{ST}", times=1, chunk=8192, delay=0.1))  # ~3 s for the file
    ctx = JobContext()
    half = threading.Event()

    def progress(p):
        if p.file == ST and p.file_done >= p.file_total // 4:
            half.set()

    errors = []

    def run():
        try:
            download(LLAMA, ctx=ctx, on_progress=progress)
        except BaseException as err:  # noqa: BLE001 - the test inspects it
            errors.append(err)

    t = threading.Thread(target=run)
    t.start()
    assert half.wait(20)
    cancelled_at = time.monotonic()
    ctx.cancel()
    t.join(10)
    stopped_after = time.monotonic() - cancelled_at
    assert not t.is_alive() and len(errors) == 1 and isinstance(errors[0], JobCancelled)
    assert stopped_after < 1.5  # it did not finish the remaining ~2.4 s of body first
    partial = _partials(hub)
    assert len(partial) == 1 and 0 < partial[0].stat().st_size < len(repo.files[ST])
    assert not _final_blob(hub).exists()
    kept = partial[0].stat().st_size
    hub.clear()
    _files_equal(download(LLAMA), repo)
    assert [g.range for g in hub.file_requests(ST)] == [f"bytes={kept}-"]


def test_row_34_cancel_while_blocked_in_a_read(hub):
    hub.add_fault(Fault("stall", path=f"*/{ST}", delay=5))
    ctx = JobContext()
    started = threading.Event()
    errors = []

    def run():
        try:
            download(LLAMA, ctx=ctx, on_progress=lambda p: started.set() if p.file == ST else None)
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    t = threading.Thread(target=run)
    t.start()
    assert started.wait(10)
    time.sleep(0.3)
    ctx.cancel()
    t.join(5)
    assert not t.is_alive() and isinstance(errors[0], JobCancelled)


# -- row 35: huge files ------------------------------------------------------------------------------


def test_row_35_file_over_50_gb_is_refused_before_download(hub):
    hub.add_fault(Fault("huge", path=f"*/{ST}", times=None, methods=("GET", "HEAD"), size=60 * 10**9))
    with pytest.raises(
        FileTooLarge, match="'model.safetensors' of 'tiny-org/tiny-llama' is 60 GB, more than the 50 GB"
    ):
        download(LLAMA)
    assert not hub.file_requests(ST)


# -- row 36: long paths and odd names ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("C:\\" + "a" * 300, "\\\\?\\C:\\" + "a" * 300),
        ("C:/" + "b" * 300, "\\\\?\\C:\\" + "b" * 300),
        ("\\\\server\\share\\" + "c" * 300, "\\\\?\\UNC\\server\\share\\" + "c" * 300),
        ("\\\\?\\C:\\" + "d" * 300, "\\\\?\\C:\\" + "d" * 300),
        ("C:\\short\\path", "C:\\short\\path"),
    ],
    ids=["drive", "slashes", "unc", "already", "short"],
)
def test_row_36_windows_long_path_prefix(path, expected):
    assert long_path(path, windows=True) == expected


def test_row_36_long_path_unchanged_elsewhere():
    p = "/" + "x" * 400
    assert long_path(p, windows=False) == p


@pytest.mark.parametrize(
    "bad", ["../../etc/passwd", "/etc/passwd", "a/../../b", "C:evil", "a\\b", "", "a//b", "x\x00y"]
)
def test_row_36_unsafe_file_names_from_server_are_refused(bad):
    with pytest.raises(RepoNotFound, match="file name"):
        safe_repo_path(bad)


def test_row_36_odd_file_names_and_deep_long_paths(hub, tmp_path):
    odd = {
        "sub dir/wéird #1%.json": b'{"x": 1}',
        "a?b&c=d+e.txt": b"query-like name",
        "deep/" + "/".join(["n" * 60] * 5) + "/file.bin": b"deep file " * 100,
    }
    hub.repos["tiny-org/odd.names_repo-1"] = FakeRepo(
        "tiny-org/odd.names_repo-1", files=odd, lfs={list(odd)[2]}
    )
    path = download("tiny-org/odd.names_repo-1")
    for name, data in odd.items():
        target = path / name
        assert target.read_bytes() == data
    assert len(str(path / list(odd)[2])) > 260


def test_hostile_server_file_name_never_reaches_disk(hub, tmp_path):
    hub.repos["tiny-org/evil"] = FakeRepo("tiny-org/evil", files={"../../../escape.txt": b"pwned"})
    with pytest.raises(RepoNotFound, match="unsafe file name"):
        download("tiny-org/evil")
    assert not list(tmp_path.rglob("escape.txt"))


def test_hostile_blob_name_from_server_is_refused(hub, monkeypatch, tmp_path):
    import tests.core.hub.fakehub as fake

    monkeypatch.setattr(fake, "git_blob_id", lambda data: "../../../../outside")
    with pytest.raises(CorruptDownload, match="invalid checksum '../../../../outside' for 'config.json'"):
        download(LLAMA, include="config.json")
    assert not list(tmp_path.rglob("outside*"))
