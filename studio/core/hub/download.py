"""Resumable, verified downloads into the standard Hugging Face cache layout.

Why our own: recent huggingface_hub deletes a partial file when a download fails, never resumes
across calls and does not check sha256. Here every blob is written to ``blobs/<etag>.studio-partial``
(kept across failures, cancels and app restarts), continued with an HTTP ``Range`` request, checked
against the hash the Hub published (sha256 for LFS files, the git blob sha1 otherwise) and only then
renamed to ``blobs/<etag>``; ``snapshots/<commit>/<file>`` are relative symlinks and ``refs/<branch>``
holds the commit, exactly as huggingface_hub lays it out, so its cache tools see our files.
"""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import http.client
import json
import os
import re
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from filelock import FileLock, Timeout

from studio.core.atomic import write_atomic
from studio.core.errors import HubError
from studio.core.hub.api import (
    RepoFileInfo,
    auth_headers,
    download_timeout,
    endpoint,
    get_model_info,
    http_error,
    repo_files,
    resolve_url,
)
from studio.core.hub.errors import (
    CorruptDownload,
    DiskSpaceError,
    FileTooLarge,
    IncompleteSnapshot,
    NetworkError,
    OfflineError,
)
from studio.core.hub.http import Response, open_url
from studio.core.hub.paths import (
    META_DIR,
    PARTIAL_SUFFIX,
    check_repo_id,
    default_cache_dir,
    is_commit,
    is_offline,
    long_path,
    relative_symlink_target,
    repo_cache_path,
    safe_repo_path,
)
from studio.core.hub.retry import (
    DEFAULT_POLICY,
    RETRYABLE_STATUS,
    RetryPolicy,
    backoff_delay,
    cancellable_wait,
    parse_retry_after,
)
from studio.core.jobs import JobCancelled, JobContext
from studio.core.units import format_bytes, format_eta

# huggingface_hub refuses single files above this over plain HTTP (constants.MAX_HTTP_DOWNLOAD_SIZE).
MAX_HTTP_DOWNLOAD_SIZE = 50 * 1000 * 1000 * 1000
CHUNK = 1024 * 1024
# Extra free space demanded beyond the download itself (file system metadata, other writers).
MIN_MARGIN = 16 * 1024 * 1024
_BLOB_NAME = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_DISK_FULL = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


@dataclass(frozen=True)
class DownloadProgress:
    """One progress update of a download, for the GUI's per-file table and the CLI line."""

    repo_id: str
    file: str
    file_index: int  # 1-based position of ``file`` among the files being fetched
    n_files: int
    file_done: int
    file_total: int
    done: int  # bytes of all selected files present so far (cached ones included)
    total: int
    speed: float  # bytes per second over the last few seconds
    eta: float | None  # seconds left at that speed
    message: str = ""


@dataclass(frozen=True)
class DownloadResult:
    """Where a snapshot landed and how it got there."""

    path: Path
    repo_id: str
    commit: str
    files: tuple[str, ...]
    downloaded_bytes: int
    from_cache: bool = False  # True when the Hub was unreachable (or offline) and the cache answered
    note: str = ""


ProgressCallback = Callable[[DownloadProgress], None]


# -- small file-system helpers (long-path safe) ----------------------------------------------------


def _lp(p: Path | str) -> str:
    return long_path(os.path.abspath(p))


def _exists(p: Path) -> bool:
    return os.path.exists(_lp(p))


def _size(p: Path) -> int:
    try:
        return os.stat(_lp(p)).st_size
    except FileNotFoundError:
        return 0


def _remove(p: Path) -> None:
    try:
        os.remove(_lp(p))
    except FileNotFoundError:
        pass


def _makedirs(p: Path) -> None:
    os.makedirs(_lp(p), exist_ok=True)


def _write_atomic(path: Path, data: bytes) -> None:
    """Write a small bookkeeping file atomically; a killed write leaves a ``*.tmp`` the cache cleaner finds."""
    _makedirs(path.parent)
    write_atomic(_lp(path), data, temp_suffix=".tmp")


def free_bytes(path: Path) -> int:
    """Free bytes on the file system that holds ``path`` (or its nearest existing parent)."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p.parent != p:
        p = p.parent
    return shutil.disk_usage(long_path(str(p))).free


def manifest_path(cache_dir: Path, repo_id: str, commit: str) -> Path:
    """Our record of a snapshot's full file list, used offline to tell which files are missing."""
    return repo_cache_path(cache_dir, repo_id) / META_DIR / "snapshots" / f"{commit}.json"


def _select(files: Iterable[RepoFileInfo], include: Iterable[str] | None, exclude: Iterable[str] | None):
    inc = [include] if isinstance(include, str) else list(include or [])
    exc = [exclude] if isinstance(exclude, str) else list(exclude or [])
    out = []
    for f in files:
        if inc and not any(fnmatch.fnmatch(f.name, pat) for pat in inc):
            continue
        if exc and any(fnmatch.fnmatch(f.name, pat) for pat in exc):
            continue
        out.append(f)
    return out


# -- progress ---------------------------------------------------------------------------------------


class _Meter:
    """Speed over a sliding window and the progress callbacks, throttled like ``JobContext.report``."""

    def __init__(
        self, repo_id: str, total: int, done: int, n_files: int, ctx: JobContext, cb: ProgressCallback | None
    ):
        self.repo_id, self.total, self.done, self.n_files = repo_id, total, done, n_files
        self.ctx, self.cb = ctx, cb
        self.samples: deque[tuple[float, int]] = deque()
        self.last_emit = 0.0
        self.file, self.index, self.file_done, self.file_total = "", 0, 0, 0
        self.status = ""

    def start_file(self, name: str, index: int, total: int, already: int) -> None:
        self.file, self.index, self.file_total, self.file_done = name, index, total, already
        self.emit(force=True)

    def add(self, n: int) -> None:
        self.file_done += n
        self.done += n
        self.emit()

    def rewind(self, n: int) -> None:
        """Forget ``n`` bytes of the current file (a restart from zero or a dropped partial)."""
        self.file_done -= n
        self.done -= n
        self.samples.clear()
        self.emit(force=True)

    def note(self, msg: str) -> None:
        self.status = msg
        self.emit(force=True)

    def speed(self) -> float:
        now = time.monotonic()
        self.samples.append((now, self.done))
        while len(self.samples) > 2 and now - self.samples[0][0] > 3.0:
            self.samples.popleft()
        t0, d0 = self.samples[0]
        return (self.done - d0) / (now - t0) if now > t0 else 0.0

    def emit(self, force: bool = False) -> None:
        now = time.monotonic()
        speed = self.speed()
        if not force and now - self.last_emit < 0.1:
            return
        self.last_emit = now
        left = max(0, self.total - self.done)
        eta = left / speed if speed > 0 else None
        msg = self.status or (
            f"{self.file}: {format_bytes(self.file_done)} of {format_bytes(self.file_total)}, "
            f"{format_bytes(speed)}/s, ETA {format_eta(eta)}"
        )
        self.status = ""
        self.ctx.report(self.done, max(self.total, 1), msg)
        if self.cb is not None:
            self.cb(
                DownloadProgress(
                    self.repo_id, self.file, self.index, self.n_files, self.file_done, self.file_total,
                    self.done, self.total, speed, eta, msg,
                )
            )  # fmt: skip


class _Canceller:
    """Watches the job and shuts the current socket down when it is cancelled, waking a blocked read."""

    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx
        self._abort: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hub-download-cancel", daemon=True)

    def __enter__(self) -> _Canceller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)

    def set(self, abort: Callable[[], None] | None) -> None:
        with self._lock:
            self._abort = abort
        if abort is not None and self.ctx.cancelled:
            abort()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            if self.ctx.cancelled:
                with self._lock:
                    if self._abort is not None:
                        self._abort()
                return


# -- the download -----------------------------------------------------------------------------------


def download(
    repo_id: str,
    revision: str | None = None,
    include: str | Iterable[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    ctx: JobContext | None = None,
    token: str | None = None,
    *,
    exclude: str | Iterable[str] | None = None,
    on_progress: ProgressCallback | None = None,
    policy: RetryPolicy = DEFAULT_POLICY,
) -> Path:
    """Download (or resume) a repository snapshot into the HF cache and return its local path."""
    return download_snapshot(
        repo_id,
        revision,
        include,
        cache_dir,
        ctx,
        token,
        exclude=exclude,
        on_progress=on_progress,
        policy=policy,
    ).path


def download_snapshot(
    repo_id: str,
    revision: str | None = None,
    include: str | Iterable[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    ctx: JobContext | None = None,
    token: str | None = None,
    *,
    exclude: str | Iterable[str] | None = None,
    on_progress: ProgressCallback | None = None,
    policy: RetryPolicy = DEFAULT_POLICY,
) -> DownloadResult:
    """Like ``download`` but also tells the commit, the files, the bytes fetched and whether the cache answered.

    Offline (``HF_HUB_OFFLINE``) it answers from the cache only; when the Hub cannot be reached it falls
    back to a complete cached snapshot and says so in ``note``.
    """
    check_repo_id(repo_id)
    ctx = ctx or JobContext()
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    if is_offline():
        return cached_snapshot(repo_id, revision, include, cache, exclude=exclude)
    try:
        info = get_model_info(repo_id, revision=revision, token=token, ctx=ctx)
    except NetworkError as err:
        try:
            res = cached_snapshot(repo_id, revision, include, cache, exclude=exclude)
        except IncompleteSnapshot as inc:
            raise IncompleteSnapshot(
                f"The Hub could not be reached, and the cached copy of '{repo_id}' lacks "
                f"{len(inc.missing)} file(s) ({', '.join(inc.missing[:5])}); check the connection and retry.",
                missing=inc.missing,
            ) from None
        except OfflineError:
            raise err from None
        note = f"The Hub could not be reached, so the cached copy of '{repo_id}' (commit {res.commit[:10]}) is used."
        ctx.log(note)
        return DownloadResult(res.path, res.repo_id, res.commit, res.files, 0, True, note)
    commit = info.sha
    if not commit or not is_commit(commit):
        raise HubError(
            f"The Hub did not give a commit for '{repo_id}'; the download cannot be pinned. Try again."
        )
    all_files = repo_files(info)
    files = _select(all_files, include, exclude)
    if not files:
        raise HubError(
            f"No file of '{repo_id}' matches {list(include) if include and not isinstance(include, str) else include!r}; "
            "check the --include pattern."
        )
    return _fetch(repo_id, revision, commit, all_files, files, cache, ctx, token, on_progress, policy)


def _fetch(
    repo_id: str,
    revision: str | None,
    commit: str,
    all_files: tuple[RepoFileInfo, ...],
    files: list[RepoFileInfo],
    cache: Path,
    ctx: JobContext,
    token: str | None,
    on_progress: ProgressCallback | None,
    policy: RetryPolicy,
) -> DownloadResult:
    repo_dir = repo_cache_path(cache, repo_id)
    blobs = repo_dir / "blobs"
    snapshot = repo_dir / "snapshots" / commit

    # Fill in the blob name and size of files the listing left open (rare: a HEAD per such file).
    resolved: list[RepoFileInfo] = []
    for f in files:
        if f.blob_name is None or f.size is None:
            f = _head_file(repo_id, commit, f, token, ctx, policy)
        resolved.append(f)
    files = resolved

    for f in files:
        # The blob name becomes a file name: only a plain hex hash from the server is acceptable.
        if not _BLOB_NAME.fullmatch(str(f.blob_name)):
            raise CorruptDownload(
                f"The Hub gave an invalid checksum {f.blob_name!r} for '{f.name}' of '{repo_id}'; "
                "the download was refused (check HF_ENDPOINT)."
            )
        if (f.size or 0) > MAX_HTTP_DOWNLOAD_SIZE:
            raise FileTooLarge(
                f"'{f.name}' of '{repo_id}' is {format_bytes(f.size or 0)}, more than the 50 GB a plain HTTP "
                "download allows; download it with the hf_xet-enabled 'hf download' tool instead."
            )

    # Everything that is not yet a verified blob, and what is still missing of it.
    todo: list[RepoFileInfo] = []
    need = 0
    for f in files:
        if _exists(blobs / (f.blob_name or "")):
            continue
        todo.append(f)
        need += max(0, (f.size or 0) - _size(blobs / f"{f.blob_name}{PARTIAL_SUFFIX}"))
    if todo:
        free = free_bytes(cache)
        margin = max(MIN_MARGIN, need // 100)
        if free < need + margin:
            raise DiskSpaceError(
                f"Not enough disk space for '{repo_id}' in {cache}: it needs {format_bytes(need + margin)} "
                f"but only {format_bytes(free)} is free; free up space or choose another cache folder."
            )

    # Bookkeeping first, so an interrupted download shows up (offline) with its list of missing files.
    manifest = [{"name": f.name, "size": f.size, "blob": f.blob_name} for f in all_files]
    _write_atomic(manifest_path(cache, repo_id, commit), json.dumps({"files": manifest}).encode())
    if revision is None or not is_commit(revision):
        ref = safe_repo_path(revision or "main")
        _write_atomic(repo_dir / "refs" / ref, commit.encode())

    # Small files first: the card, config and tokenizer are usable while the weights still come.
    files = sorted(files, key=lambda f: (f.size or 0, f.name))
    total = sum(f.size or 0 for f in files)
    present = (
        total
        - sum(f.size or 0 for f in todo)
        + sum(_size(blobs / f"{f.blob_name}{PARTIAL_SUFFIX}") for f in todo)
    )
    meter = _Meter(repo_id, total, present, len(files), ctx, on_progress)
    fetched = 0
    with _Canceller(ctx) as canceller:
        for i, f in enumerate(files, 1):
            ctx.check_cancelled()
            blob = blobs / str(f.blob_name)
            if f in todo:
                fetched += _download_blob(
                    repo_id, commit, f, blob, cache, token, ctx, meter, i, canceller, policy
                )
            _link(snapshot, f, blob)
    meter.note(f"{repo_id}: {len(files)} file(s) ready")
    return DownloadResult(snapshot, repo_id, commit, tuple(f.name for f in files), fetched)


def _head_file(
    repo_id: str, commit: str, f: RepoFileInfo, token: str | None, ctx: JobContext, policy: RetryPolicy
) -> RepoFileInfo:
    """Blob name (etag) and size of one file from a HEAD request, when the listing lacked them."""
    url = resolve_url(repo_id, f.name, commit)
    for attempt in range(1, policy.max_tries + 1):
        ctx.check_cancelled()
        try:
            with open_url(
                "HEAD", url, auth_headers(token), timeout=download_timeout(), follow_redirects=False
            ) as r:
                status, headers = r.status, r.headers
        except (OSError, http.client.HTTPException) as err:
            if attempt >= policy.max_tries:
                raise NetworkError(
                    f"Could not reach the Hub at {endpoint()} for '{f.name}' of '{repo_id}' ({err})."
                ) from None
            cancellable_wait(ctx, backoff_delay(attempt, None, policy), None, "network error")
            continue
        if status in RETRYABLE_STATUS and attempt < policy.max_tries:
            cancellable_wait(
                ctx, backoff_delay(attempt, parse_retry_after(headers), policy), None, "rate-limited"
            )
            continue
        if status >= 400:
            raise http_error(
                status, headers, repo_id=repo_id, revision=commit, filename=f.name, had_token=bool(token)
            )
        etag = (
            (headers.get("X-Linked-Etag") or headers.get("ETag") or "").strip().removeprefix("W/").strip('"')
        )
        size = headers.get("X-Linked-Size") or headers.get("Content-Length")
        if not etag or not size or not size.isdigit():
            raise HubError(
                f"The Hub gave no size or ETag for '{f.name}' of '{repo_id}'; it cannot be downloaded safely."
            )
        lfs = headers.get("X-Linked-Etag") is not None
        return RepoFileInfo(
            f.name,
            int(size),
            blob_id=None if lfs else etag.lower(),
            sha256=etag.lower() if lfs else f.sha256,
            quant_type=f.quant_type,
        )
    raise AssertionError("unreachable")  # pragma: no cover


def _hasher(f: RepoFileInfo):  # noqa: ANN202
    """A hash object that must end equal to what the Hub published for ``f`` (None: nothing to check)."""
    if f.sha256:
        return hashlib.sha256()
    if f.blob_id and f.size is not None:
        h = hashlib.sha1()  # git blob id: sha1("blob <size>\0" + content)
        h.update(b"blob %d\x00" % f.size)
        return h
    return None


def _lock(cache: Path, repo_id: str, blob_name: str):  # noqa: ANN202

    # Same place huggingface_hub locks its own downloads, so its tools and ours exclude each other too.
    path = cache / ".locks" / repo_cache_path(cache, repo_id).name / f"{blob_name}.lock"
    _makedirs(path.parent)
    return FileLock(_lp(path))


def _download_blob(
    repo_id: str,
    commit: str,
    f: RepoFileInfo,
    blob: Path,
    cache: Path,
    token: str | None,
    ctx: JobContext,
    meter: _Meter,
    index: int,
    canceller: _Canceller,
    policy: RetryPolicy,
) -> int:
    """Fetch one blob (resuming its partial), verify it and move it in place; returns bytes fetched."""
    _makedirs(blob.parent)
    partial = blob.with_name(blob.name + PARTIAL_SUFFIX)
    expected = int(f.size or 0)
    lock = _lock(cache, repo_id, str(f.blob_name))
    counted = _size(partial)  # already in the meter's total of bytes present
    waited = False
    while True:
        ctx.check_cancelled()
        try:
            lock.acquire(timeout=0.1)
            break
        except Timeout:
            if not waited:
                waited = True
                meter.note(f"{f.name}: waiting for another download of the same file to finish")
    try:
        if _exists(blob):  # another download (or an identical file of this repo) finished it
            meter.start_file(f.name, index, expected, 0)
            meter.add(max(0, expected - counted))
            return 0
        return _download_locked(
            repo_id, commit, f, blob, partial, expected, token, ctx, meter, index, canceller, policy
        )
    finally:
        lock.release()


def _download_locked(
    repo_id: str,
    commit: str,
    f: RepoFileInfo,
    blob: Path,
    partial: Path,
    expected: int,
    token: str | None,
    ctx: JobContext,
    meter: _Meter,
    index: int,
    canceller: _Canceller,
    policy: RetryPolicy,
) -> int:
    url = resolve_url(repo_id, f.name, commit)
    have = _size(partial)
    if have > expected:
        _remove(partial)
        meter.done -= have
        have = 0
    meter.start_file(f.name, index, expected, have)
    fetched = 0
    last_problem = ""
    for attempt in range(1, policy.max_tries + 1):
        ctx.check_cancelled()
        offset = _size(partial)
        if offset == expected:
            break
        headers = auth_headers(token)
        if offset:
            headers["Range"] = f"bytes={offset}-"
        resp: Response | None = None
        try:
            resp = open_url("GET", url, headers, timeout=download_timeout(), on_connection=canceller.set)
            canceller.set(resp.abort)
            status = resp.status
            if status in RETRYABLE_STATUS:
                retry_after = parse_retry_after(resp.headers)
                resp.close()
                resp = None
                if attempt >= policy.max_tries:
                    raise http_error(status, None, repo_id=repo_id, filename=f.name, had_token=bool(token))
                wait = backoff_delay(attempt, retry_after, policy)
                if wait > policy.max_retry_after:
                    raise http_error(status, None, repo_id=repo_id, filename=f.name, had_token=bool(token))
                last_problem = f"HTTP {status}"
                cancellable_wait(
                    ctx, wait, meter.note, "rate-limited" if status == 429 else f"server error {status}"
                )
                continue
            if status == 416 and offset:
                # The server cannot serve our range: the partial is not a prefix of this file any more.
                _remove(partial)
                meter.rewind(offset)
                last_problem = "HTTP 416"
                continue
            if status >= 400:
                raise http_error(
                    status,
                    resp.headers,
                    repo_id=repo_id,
                    revision=commit,
                    filename=f.name,
                    had_token=bool(token),
                )
            start = _response_start(resp)
            if start is None:
                raise NetworkError(
                    f"The Hub answered HTTP {status} for '{f.name}' of '{repo_id}'; the download cannot continue."
                )
            if start != offset:
                meter.rewind(offset)
                if start != 0:  # a range we did not ask for: start clean on the next try
                    _remove(partial)
                    raise http.client.HTTPException("the server answered a different byte range than asked")
                # 200 to a Range request: the body starts at byte 0, so the partial is overwritten, not
                # appended to (no duplicated bytes).
                meter.note(f"{f.name}: the server ignored the resume request; restarting the file from zero")
                offset = 0
            fetched += _receive(resp, partial, offset, expected, f, repo_id, ctx, meter)
            if _size(partial) < expected:  # the body ended early (short body or a clean disconnect)
                raise http.client.IncompleteRead(b"", expected - _size(partial))
        except JobCancelled:
            raise
        except (OSError, http.client.HTTPException) as err:
            if ctx.cancelled:
                raise JobCancelled() from None
            if isinstance(err, OSError) and err.errno in _DISK_FULL:
                raise  # pragma: no cover - converted inside _receive
            last_problem = type(err).__name__ if not str(err) else str(err).splitlines()[0]
            if attempt < policy.max_tries:
                got = _size(partial)
                cancellable_wait(
                    ctx,
                    backoff_delay(attempt, None, policy),
                    meter.note,
                    f"connection lost at {format_bytes(got)} of {format_bytes(expected)} of {f.name}; "
                    f"resuming (try {attempt + 1} of {policy.max_tries})",
                )
        finally:
            canceller.set(None)
            if resp is not None:
                resp.close()
    got = _size(partial)
    if got != expected:
        if got > expected:
            _remove(partial)
            raise CorruptDownload(
                f"Consistency check failed for '{f.name}' of '{repo_id}': the server sent more bytes than the "
                f"{expected} it announced; the partial file was deleted, try again."
            )
        raise NetworkError(
            f"Consistency check failed for '{f.name}' of '{repo_id}': only {format_bytes(got)} of "
            f"{format_bytes(expected)} arrived after {policy.max_tries} tries ({last_problem or 'short body'}); "
            "the partial file is kept and the next download resumes from there."
        )
    _verify(partial, f, repo_id, ctx, meter)
    os.replace(_lp(partial), _lp(blob))
    return fetched


def _response_start(resp: Response) -> int | None:
    """Byte offset the body starts at: 0 for a 200, the Content-Range start for a 206, None otherwise."""
    if resp.status == 200:
        return 0
    if resp.status == 206:
        cr = resp.headers.get("Content-Range") or ""
        try:
            return int(cr.split()[1].split("-")[0])
        except (IndexError, ValueError):
            return -1  # unusable: not the range we asked for
    return None


def _receive(
    resp: Response,
    partial: Path,
    offset: int,
    expected: int,
    f: RepoFileInfo,
    repo_id: str,
    ctx: JobContext,
    meter: _Meter,
) -> int:
    """Append the body to the partial (from ``offset``); returns bytes received. Network errors propagate."""
    mode = "r+b" if offset and _exists(partial) else "wb"
    received = 0
    try:
        with open(_lp(partial), mode) as out:
            out.seek(offset)
            out.truncate()
            written = offset
            while True:
                chunk = resp.read(CHUNK)
                if not chunk:
                    break
                if written + len(chunk) > expected:
                    out.flush()
                    raise CorruptDownload(
                        f"Consistency check failed for '{f.name}' of '{repo_id}': the server sent more than the "
                        f"{expected} bytes the Hub announced; the partial file was deleted, try again."
                    )
                out.write(chunk)
                written += len(chunk)
                received += len(chunk)
                meter.add(len(chunk))
                ctx.check_cancelled()
            out.flush()
            os.fsync(out.fileno())
    except CorruptDownload:
        _remove(partial)
        meter.rewind(meter.file_done)
        raise
    except OSError as err:
        if err.errno in _DISK_FULL:
            _remove(partial)
            raise DiskSpaceError(
                f"The disk holding {partial.parent} filled up while downloading '{f.name}' of '{repo_id}'; "
                "the partial file was removed. Free up space and download again."
            ) from None
        raise
    return received


def _verify(partial: Path, f: RepoFileInfo, repo_id: str, ctx: JobContext, meter: _Meter) -> None:
    """Check the finished partial against the Hub's hash; delete it and raise on a mismatch."""
    h = _hasher(f)
    if h is None:
        return
    meter.note(f"{f.name}: verifying checksum")
    with open(_lp(partial), "rb") as src:
        while True:
            ctx.check_cancelled()
            block = src.read(CHUNK * 4)
            if not block:
                break
            h.update(block)
    got = h.hexdigest()
    want = f.sha256 or f.blob_id or ""
    if got != want:
        _remove(partial)
        meter.rewind(meter.file_done)
        kind = "sha256" if f.sha256 else "git checksum"
        raise CorruptDownload(
            f"'{f.name}' downloaded from {endpoint()} for '{repo_id}' does not match the {kind} the Hub "
            f"published (expected {want[:12]}…, got {got[:12]}…); the file was deleted. Download it again, and "
            "if it fails the same way check your HF_ENDPOINT mirror or proxy."
        )


def _link(snapshot: Path, f: RepoFileInfo, blob: Path) -> None:
    """Make ``snapshots/<commit>/<name>`` point at the blob (a relative symlink, or a copy without symlinks)."""
    rel = safe_repo_path(f.name)
    dest = snapshot.joinpath(*rel.parts)
    _makedirs(dest.parent)
    target = relative_symlink_target(PurePosixPath(rel), blob.name)
    if os.name == "nt":
        target = target.replace("/", "\\")
    if os.path.islink(_lp(dest)) and os.readlink(_lp(dest)) == target and _exists(blob):
        return
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{threading.get_ident()}.link")
    _remove(tmp)
    try:
        os.symlink(target, _lp(tmp))
    except (OSError, NotImplementedError):
        # No symlink rights (Windows without developer mode): a copy, as huggingface_hub does.
        shutil.copyfile(_lp(blob), _lp(tmp))
    os.replace(_lp(tmp), _lp(dest))


# -- the cache when offline -------------------------------------------------------------------------


def cached_snapshot(
    repo_id: str,
    revision: str | None = None,
    include: str | Iterable[str] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    exclude: str | Iterable[str] | None = None,
) -> DownloadResult:
    """The snapshot already in the cache, without any network; raises if it is absent or incomplete."""
    check_repo_id(repo_id)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    repo_dir = repo_cache_path(cache, repo_id)
    rev = revision or "main"
    if is_commit(rev):
        commit = rev
    else:
        ref = repo_dir / "refs" / safe_repo_path(rev)
        if not ref.is_file():
            raise OfflineError(
                f"'{repo_id}' (revision {rev}) is not in the local cache {cache}; connect to the network to download it."
            )
        commit = ref.read_text().strip()
    snapshot = repo_dir / "snapshots" / commit
    mpath = manifest_path(cache, repo_id, commit)
    if mpath.is_file():
        try:
            listed = [
                RepoFileInfo(str(safe_repo_path(e["name"])), e.get("size"), blob_id=e.get("blob"))
                for e in json.loads(mpath.read_text())["files"]  # noqa: TID251 - the manifest is written by this module next to the snapshot
            ]
        except (ValueError, KeyError, TypeError):
            listed = None
    else:
        listed = None
    if listed is not None:
        wanted = [f.name for f in _select(listed, include, exclude)]
    else:  # a snapshot made by other tools: what is there is all we know
        wanted = sorted(
            p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file() or p.is_symlink()
        ) if snapshot.is_dir() else []  # fmt: skip
        wanted = [w for w in wanted if not include or _select([RepoFileInfo(w, None)], include, exclude)]
    if not snapshot.is_dir() and not wanted:
        raise OfflineError(
            f"'{repo_id}' is not in the local cache {cache}; connect to the network to download it."
        )
    missing = tuple(n for n in wanted if not _exists(snapshot.joinpath(*PurePosixPath(n).parts)))
    if missing or not wanted:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise IncompleteSnapshot(
            f"The cached copy of '{repo_id}' (commit {commit[:10]}) is incomplete: {len(missing)} file(s) missing "
            f"({shown or 'no files'}); connect to the network to finish the download.",
            missing=missing,
        )
    return DownloadResult(snapshot, repo_id, commit, tuple(wanted), 0, True, "from the local cache (offline)")
