"""The local Hub cache: cached models with sizes and revisions, deleting them, and crash leftovers.

Listing uses ``huggingface_hub.scan_cache_dir`` so what we show agrees with ``hf cache``; the only
things we add are our resumable ``*.studio-partial`` files and their cleanup.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from studio.core.errors import HubError
from studio.core.hub.errors import OfflineError
from studio.core.hub.paths import (
    HF_INCOMPLETE_SUFFIX,
    META_DIR,
    PARTIAL_SUFFIX,
    check_repo_id,
    default_cache_dir,
    is_commit,
    long_path,
    repo_cache_path,
    safe_repo_path,
)


@dataclass(frozen=True)
class CachedRevision:
    """One snapshot of a cached repository."""

    commit: str
    refs: tuple[str, ...]
    path: Path
    size_on_disk: int
    n_files: int
    last_modified: float


@dataclass(frozen=True)
class CachedModel:
    """One cached model repository."""

    repo_id: str
    path: Path
    size_on_disk: int
    n_files: int
    last_accessed: float
    last_modified: float
    revisions: tuple[CachedRevision, ...]
    partial_bytes: int = 0  # resumable partial downloads not counted in size_on_disk

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict."""
        return {
            "repo_id": self.repo_id,
            "path": str(self.path),
            "size_on_disk": self.size_on_disk,
            "n_files": self.n_files,
            "last_accessed": self.last_accessed,
            "last_modified": self.last_modified,
            "partial_bytes": self.partial_bytes,
            "revisions": [
                {
                    "commit": r.commit,
                    "refs": list(r.refs),
                    "path": str(r.path),
                    "size_on_disk": r.size_on_disk,
                }
                for r in self.revisions
            ],
        }


@dataclass(frozen=True)
class Leftover:
    """A file left behind by an interrupted download or a crashed process."""

    path: Path
    kind: str  # "partial" (ours, resumable) | "incomplete" (huggingface_hub's) | "lock" | "temp"
    size: int
    mtime: float
    repo_id: str | None


def _cache(cache_dir: str | os.PathLike[str] | None) -> Path:
    return Path(cache_dir) if cache_dir is not None else default_cache_dir()


def list_cached(cache_dir: str | os.PathLike[str] | None = None) -> list[CachedModel]:
    """Cached model repositories, most recently used first (empty if the cache does not exist)."""
    from huggingface_hub import scan_cache_dir

    cache = _cache(cache_dir)
    if not cache.is_dir():
        return []
    info = scan_cache_dir(cache)
    out = []
    for repo in info.repos:
        if repo.repo_type != "model":
            continue
        revisions = tuple(
            sorted(
                (
                    CachedRevision(
                        commit=r.commit_hash,
                        refs=tuple(sorted(r.refs)),
                        path=Path(r.snapshot_path),
                        size_on_disk=r.size_on_disk,
                        n_files=len(r.files),
                        last_modified=r.last_modified,
                    )
                    for r in repo.revisions
                ),
                key=lambda r: r.last_modified,
                reverse=True,
            )
        )
        partial = sum(_stat_size(p) for p in (Path(repo.repo_path) / "blobs").glob(f"*{PARTIAL_SUFFIX}"))
        out.append(
            CachedModel(
                repo_id=repo.repo_id,
                path=Path(repo.repo_path),
                size_on_disk=repo.size_on_disk,
                n_files=repo.nb_files,
                last_accessed=repo.last_accessed,
                last_modified=repo.last_modified,
                revisions=revisions,
                partial_bytes=partial,
            )
        )
    return sorted(out, key=lambda m: m.last_accessed, reverse=True)


def _stat_size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def _commit_of(repo_dir: Path, revision: str) -> str | None:
    if is_commit(revision):
        return revision
    ref = repo_dir / "refs" / safe_repo_path(revision)
    return ref.read_text().strip() if ref.is_file() else None


def cached_path(
    repo_id: str, revision: str | None = None, cache_dir: str | os.PathLike[str] | None = None
) -> Path:
    """The local snapshot folder of a cached model (to open it); raises if it is not cached."""
    check_repo_id(repo_id)
    repo_dir = repo_cache_path(_cache(cache_dir), repo_id)
    commit = _commit_of(repo_dir, revision or "main")
    if commit is None:
        snaps = sorted((repo_dir / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime, reverse=True)
        if revision is None and snaps:
            return snaps[0]
        raise OfflineError(f"'{repo_id}' (revision {revision or 'main'}) is not in the local cache.")
    path = repo_dir / "snapshots" / commit
    if not path.is_dir():
        raise OfflineError(f"'{repo_id}' (commit {commit[:10]}) is not in the local cache.")
    return path


def delete_cached(
    repo_id: str, revision: str | None = None, cache_dir: str | os.PathLike[str] | None = None
) -> int:
    """Delete a cached model (or one revision of it); returns the bytes freed."""
    check_repo_id(repo_id)
    cache = _cache(cache_dir)
    repo_dir = repo_cache_path(cache, repo_id)
    if not repo_dir.is_dir():
        raise OfflineError(f"'{repo_id}' is not in the local cache {cache}; nothing to delete.")
    if revision is None:
        freed = sum(_stat_size(p) for p in repo_dir.rglob("*") if p.is_file() and not p.is_symlink())
        shutil.rmtree(long_path(str(repo_dir.resolve())))
        shutil.rmtree(long_path(str((cache / ".locks" / repo_dir.name).resolve())), ignore_errors=True)
        return freed
    from huggingface_hub import scan_cache_dir

    commit = _commit_of(repo_dir, revision)
    if commit is None:
        raise OfflineError(f"Revision '{revision}' of '{repo_id}' is not in the local cache.")
    strategy = scan_cache_dir(cache).delete_revisions(commit)
    freed = strategy.expected_freed_size
    strategy.execute()
    manifest = repo_dir / META_DIR / "snapshots" / f"{commit}.json"
    if manifest.exists():
        manifest.unlink()
    return freed


def find_leftovers(cache_dir: str | os.PathLike[str] | None = None) -> list[Leftover]:
    """Partial downloads, huggingface_hub ``.incomplete`` files, stale temps and lock files in the cache."""
    cache = _cache(cache_dir)
    out: list[Leftover] = []
    if not cache.is_dir():
        return out
    for repo_dir in cache.glob("models--*"):
        repo_id = repo_dir.name[len("models--") :].replace("--", "/")
        for p in (repo_dir / "blobs").glob("*"):
            kind = None
            if p.name.endswith(PARTIAL_SUFFIX):
                kind = "partial"
            elif p.name.endswith(HF_INCOMPLETE_SUFFIX):
                kind = "incomplete"
            if kind:
                st = p.stat()
                out.append(Leftover(p, kind, st.st_size, st.st_mtime, repo_id))
        for p in repo_dir.rglob("*.tmp"):
            st = p.lstat()
            out.append(Leftover(p, "temp", st.st_size, st.st_mtime, repo_id))
    for p in (cache / ".locks").rglob("*.lock"):
        st = p.stat()
        repo_id = (
            p.parent.name[len("models--") :].replace("--", "/")
            if p.parent.name.startswith("models--")
            else None
        )
        out.append(Leftover(p, "lock", st.st_size, st.st_mtime, repo_id))
    return sorted(out, key=lambda x: str(x.path))


def remove_leftovers(items: list[Leftover], *, older_than: float = 0.0) -> int:
    """Remove leftovers that no running download holds (and older than ``older_than`` seconds); bytes freed."""
    freed = 0
    now = time.time()
    for item in items:
        if now - item.mtime < older_than:
            continue
        lock_path = item.path if item.kind == "lock" else _lock_for(item)
        try:
            if lock_path is not None:
                lock = FileLock(str(lock_path))
                lock.acquire(timeout=0)
                try:
                    _unlink(item.path)
                finally:
                    lock.release()
            else:
                _unlink(item.path)
        except Timeout:
            continue  # a download is using it right now
        freed += item.size
    return freed


def _lock_for(item: Leftover) -> Path | None:
    if item.kind != "partial" or item.repo_id is None:
        return None
    blob = item.path.name[: -len(PARTIAL_SUFFIX)]
    cache = item.path.parent.parent.parent
    return cache / ".locks" / item.path.parent.parent.name / f"{blob}.lock"


def _unlink(path: Path) -> None:
    try:
        os.remove(long_path(str(path)))
    except FileNotFoundError:
        pass
    except OSError as err:
        raise HubError(
            f"Could not remove {path}: {err.strerror}; close programs using it and retry."
        ) from None
