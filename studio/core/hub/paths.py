"""Where things live in the Hugging Face cache, and path handling that survives odd names and long paths.

The layout is the standard one so huggingface_hub's own tools (``scan_cache_dir``, ``hf cache``) see
our downloads: ``models--org--name/{blobs,snapshots/<commit>,refs}``. Everything is resolved at call
time from the environment (not from ``huggingface_hub.constants``, which froze it at import).
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

from studio.core.hub.errors import RepoNotFound
from studio.core.untrusted import has_control_chars

PARTIAL_SUFFIX = ".studio-partial"
# Files huggingface_hub itself leaves behind after a crash; ignored by us, offered for cleanup.
HF_INCOMPLETE_SUFFIX = ".incomplete"
# Our own bookkeeping inside a repo folder (file lists of snapshots); scan_cache_dir ignores it.
META_DIR = ".studio"

_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
WINDOWS_MAX_PATH = 260


def default_cache_dir() -> Path:
    """The Hub cache directory as huggingface_hub would pick it, read from the environment now."""
    env = os.environ
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(key):
            return Path(os.path.expandvars(os.path.expanduser(env[key])))
    if env.get("HF_HOME"):
        home = Path(os.path.expandvars(os.path.expanduser(env["HF_HOME"])))
    else:
        xdg = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        home = Path(xdg) / "huggingface"
    return home / "hub"


def is_offline() -> bool:
    """Whether the user asked for offline mode (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE), read now."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in {"1", "ON", "YES", "TRUE"}


def is_commit(revision: str | None) -> bool:
    """Whether ``revision`` is a full 40-hex commit hash."""
    return bool(revision) and bool(_COMMIT.match(revision or ""))


def check_repo_id(repo_id: str) -> str:
    """Return ``repo_id`` if it is a valid Hub model id (``name`` or ``org/name``), else raise."""
    if not isinstance(repo_id, str) or not _REPO_ID.match(repo_id) or ".." in repo_id or "--" in repo_id:
        raise RepoNotFound(
            f"'{repo_id}' is not a valid Hub repository id; use the form 'organisation/model-name'."
        )
    return repo_id


def repo_folder_name(repo_id: str) -> str:
    """The cache folder name of a model repository (``models--org--name``)."""
    return "models--" + "--".join(check_repo_id(repo_id).split("/"))


def repo_cache_path(cache_dir: Path, repo_id: str) -> Path:
    """The cache folder of a model repository."""
    return Path(cache_dir) / repo_folder_name(repo_id)


def safe_repo_path(filename: str) -> PurePosixPath:
    """Validate a file name that came from the server; refuse anything that could escape the snapshot.

    A hostile endpoint could list ``../../.bashrc`` or an absolute path; those never reach the disk.
    """
    # Control characters (terminal escapes, bidi overrides) are refused like traversal: such a name
    # would be printed and created as it is.
    if not filename or "\x00" in filename or "\\" in filename or has_control_chars(filename):
        raise RepoNotFound(
            f"The Hub listed an invalid file name {filename!r}; the repository was not downloaded."
        )
    p = PurePosixPath(filename)
    if (
        p.is_absolute()
        or any(part in ("", ".", "..") for part in filename.split("/"))
        or re.match(r"^[A-Za-z]:", filename)
    ):
        raise RepoNotFound(
            f"The Hub listed an unsafe file name {filename!r}; the repository was not downloaded."
        )
    return p


def long_path(path: str | os.PathLike[str], *, windows: bool | None = None) -> str:
    """The path as a string the OS accepts even past 260 characters.

    On Windows an absolute path longer than MAX_PATH gets the ``\\\\?\\`` prefix (``\\\\?\\UNC\\`` for
    network shares), like huggingface_hub does for its own files; elsewhere the path is unchanged.
    ``windows`` overrides the platform check (for tests).
    """
    s = os.fspath(path)
    if windows is None:
        windows = os.name == "nt"
    if not windows or s.startswith("\\\\?\\") or len(s) < WINDOWS_MAX_PATH:
        return s
    s = s.replace("/", "\\")
    if s.startswith("\\\\"):
        return "\\\\?\\UNC\\" + s[2:]
    if re.match(r"^[A-Za-z]:\\", s):
        return "\\\\?\\" + s
    return s  # relative paths cannot take the prefix; the caller made them absolute first


def relative_symlink_target(link: PurePosixPath, blob_name: str) -> str:
    """Target of the snapshot symlink ``snapshots/<commit>/<link>`` pointing at ``blobs/<blob_name>``."""
    depth = len(link.parts) - 1  # folders inside the snapshot
    return "/".join([".."] * (depth + 2) + ["blobs", blob_name])
