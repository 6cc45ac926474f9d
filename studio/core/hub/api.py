"""Search and model details over ``huggingface_hub.HfApi``, with errors turned into one clear sentence.

The endpoint is read from ``HF_ENDPOINT`` at call time and passed to ``HfApi`` explicitly, so nothing
depends on when huggingface_hub was first imported.
"""

from __future__ import annotations

import http.client
import importlib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from itertools import islice
from typing import Any, TypeVar
from urllib.parse import quote

from studio import __version__
from studio.core import safejson
from studio.core.errors import HubError
from studio.core.hub.errors import AuthRequired, NetworkError, OfflineError, RateLimited, RepoNotFound
from studio.core.hub.gguf_quant import quant_type_from_name
from studio.core.hub.http import open_url
from studio.core.hub.paths import check_repo_id, is_offline, safe_repo_path
from studio.core.hub.reach import check_reachable, unreachable_error, unreachable_reason
from studio.core.hub.retry import (
    DEFAULT_POLICY,
    RETRYABLE_STATUS,
    RetryPolicy,
    backoff_delay,
    cancellable_wait,
    parse_retry_after,
)
from studio.core.jobs import JobContext

DEFAULT_ENDPOINT = "https://huggingface.co"
SORTS = {
    "downloads": "downloads",
    "likes": "likes",
    "last_modified": "last_modified",
    "trending": "trending_score",
}
_SEARCH_EXPAND = [
    "downloads",
    "likes",
    "lastModified",
    "tags",
    "pipeline_tag",
    "library_name",
    "gated",
    "private",
    "safetensors",
    "gguf",
]
# A model card or config larger than this is not something we render or parse.
MAX_SMALL_FILE = 4 * 1024 * 1024

T = TypeVar("T")


def endpoint() -> str:
    """The Hub address: ``HF_ENDPOINT`` if set (a mirror or a test server), else huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


@dataclass(frozen=True)
class ModelSummary:
    """One search result."""

    id: str
    downloads: int = 0
    likes: int = 0
    last_modified: datetime | None = None
    tags: tuple[str, ...] = ()
    pipeline_tag: str | None = None
    library: str | None = None
    gated: bool = False
    private: bool = False
    params: int | None = None

    @property
    def is_gguf(self) -> bool:
        """Whether the repository holds GGUF files (by its tags)."""
        return "gguf" in self.tags

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (dates as ISO strings)."""
        return {
            "id": self.id,
            "downloads": self.downloads,
            "likes": self.likes,
            "last_modified": self.last_modified.isoformat() if self.last_modified else None,
            "tags": list(self.tags),
            "pipeline_tag": self.pipeline_tag,
            "library": self.library,
            "gated": self.gated,
            "private": self.private,
            "params": self.params,
        }


@dataclass(frozen=True)
class RepoFileInfo:
    """One file of a repository at a revision, with what we need to download and verify it."""

    name: str
    size: int | None
    blob_id: str | None = None  # git blob sha1 (ETag of non-LFS files)
    sha256: str | None = None  # LFS files only
    quant_type: str | None = None  # GGUF files only, from the file name

    @property
    def is_lfs(self) -> bool:
        """Whether the file is stored in LFS (and so has a sha256)."""
        return self.sha256 is not None

    @property
    def blob_name(self) -> str | None:
        """The name of its blob in the cache (``blobs/<etag>``), if the listing told us."""
        return self.sha256 or self.blob_id

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "name": self.name,
            "size": self.size,
            "blob_id": self.blob_id,
            "sha256": self.sha256,
            "lfs": self.is_lfs,
            "quant_type": self.quant_type,
        }


@dataclass(frozen=True)
class ModelDetails:
    """Everything the detail pane shows about one model repository at one revision."""

    id: str
    sha: str | None
    files: tuple[RepoFileInfo, ...]
    params: int | None = None
    params_by_dtype: Mapping[str, int] = field(default_factory=dict)
    license: str | None = None
    gated: bool = False
    private: bool = False
    last_modified: datetime | None = None
    downloads: int = 0
    likes: int = 0
    pipeline_tag: str | None = None
    library: str | None = None
    tags: tuple[str, ...] = ()
    card: str = ""
    config: Mapping[str, Any] | None = None

    @property
    def total_size(self) -> int:
        """Bytes of all files whose size is known."""
        return sum(f.size or 0 for f in self.files)

    @property
    def is_gguf(self) -> bool:
        """Whether the repository holds GGUF files."""
        return any(f.name.lower().endswith(".gguf") for f in self.files)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "id": self.id,
            "sha": self.sha,
            "params": self.params,
            "params_by_dtype": dict(self.params_by_dtype),
            "license": self.license,
            "gated": self.gated,
            "private": self.private,
            "last_modified": self.last_modified.isoformat() if self.last_modified else None,
            "downloads": self.downloads,
            "likes": self.likes,
            "pipeline_tag": self.pipeline_tag,
            "library": self.library,
            "tags": list(self.tags),
            "total_size": self.total_size,
            "files": [f.to_json() for f in self.files],
            "card": self.card,
        }


# -- errors ---------------------------------------------------------------------------------------


def http_error(
    status: int,
    headers: Mapping[str, str] | None,
    *,
    repo_id: str,
    revision: str | None = None,
    filename: str | None = None,
    had_token: bool = False,
) -> HubError:
    """The user-facing error for an HTTP failure status from the Hub (401/403/404/429/5xx...)."""
    get = (lambda k: headers.get(k)) if headers is not None else (lambda k: None)  # noqa: E731
    code = get("X-Error-Code") or ""
    server_msg = get("X-Error-Message") or ""
    page = f"{endpoint()}/{repo_id}"
    if status in (401, 403):
        if code == "GatedRepo":
            if had_token:
                return AuthRequired(
                    f"Your token has no access to the gated repository '{repo_id}'; accept its terms at {page} "
                    "with the account that owns the token, then retry.",
                    repo_id=repo_id,
                    gated=True,
                )
            return AuthRequired(
                f"Repository '{repo_id}' is gated: accept its terms at {page} and sign in with a Hugging Face token.",
                repo_id=repo_id,
                gated=True,
            )
        if had_token and (status == 401 or "credentials" in server_msg.lower()):
            return AuthRequired(
                f"The Hugging Face token was refused for '{repo_id}' (expired, revoked or mistyped); "
                "sign in with a new read token.",
                repo_id=repo_id,
            )
        if status == 401:
            return AuthRequired(
                f"Repository '{repo_id}' was not found or is private; if it is private, sign in with a "
                "Hugging Face token that can read it.",
                repo_id=repo_id,
            )
        return AuthRequired(
            f"Access to '{repo_id}' was refused (HTTP 403{': ' + server_msg if server_msg else ''}); "
            "check that your token has read permission for it.",
            repo_id=repo_id,
        )
    if status == 404:
        if code == "RevisionNotFound":
            return RepoNotFound(f"Revision '{revision}' does not exist in repository '{repo_id}' on the Hub.")
        if code == "EntryNotFound" or (filename and code != "RepoNotFound"):
            return RepoNotFound(
                f"File '{filename}' does not exist in repository '{repo_id}'"
                f"{' at revision ' + repr(revision) if revision else ''}."
            )
        return RepoNotFound(
            f"Repository '{repo_id}' does not exist on the Hub ({endpoint()}); check the spelling of the id."
        )
    if status == 429:
        return RateLimited(
            f"The Hub is rate-limiting requests for '{repo_id}' (HTTP 429) even after retries; wait a few "
            "minutes (signing in with a token raises the limit) and try again."
        )
    what = f"'{filename}' of '{repo_id}'" if filename else f"'{repo_id}'"
    return NetworkError(f"The Hub answered HTTP {status} for {what} after retries; try again later.")


def _hub_errors() -> tuple[type[BaseException], type[BaseException]]:
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    return HfHubHTTPError, OfflineModeIsEnabled


def transport_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean "the network failed" for the HTTP stacks in use."""
    errs: list[type[BaseException]] = [OSError, http.client.HTTPException]
    for mod_name in ("httpx2", "httpx"):
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:
            continue
        err = getattr(mod, "TransportError", None)
        if isinstance(err, type):
            errs.append(err)
    return tuple(errs)


def call_hub(
    fn: Callable[[], T],
    *,
    repo_id: str,
    ctx: JobContext | None = None,
    had_token: bool = False,
    revision: str | None = None,
    policy: RetryPolicy = DEFAULT_POLICY,
    notify: Callable[[str], None] | None = None,
) -> T:
    """Run a huggingface_hub call with visible, cancellable retries and our error sentences."""
    ctx = ctx or JobContext()
    http_err, offline_err = _hub_errors()
    net_errs = transport_errors()
    if is_offline():
        raise OfflineError(
            f"Offline mode is on (HF_HUB_OFFLINE), so '{repo_id}' cannot be looked up on the Hub; "
            "unset it or use a model from the local cache."
        )
    check_reachable(endpoint())  # no name, no listener: one sentence now, not after 25 s of retries
    for attempt in range(1, policy.max_tries + 1):
        ctx.check_cancelled()
        try:
            return fn()
        except offline_err as err:
            raise OfflineError(
                f"Offline mode is on, so '{repo_id}' cannot be looked up on the Hub; use the local cache."
            ) from err
        except http_err as err:
            resp = getattr(err, "response", None)
            status = getattr(resp, "status_code", None) or 0
            headers = getattr(resp, "headers", None)
            if status in RETRYABLE_STATUS and attempt < policy.max_tries:
                wait = backoff_delay(attempt, parse_retry_after(headers), policy)
                if wait > policy.max_retry_after:
                    raise http_error(
                        status, headers, repo_id=repo_id, revision=revision, had_token=had_token
                    ) from None
                reason = "rate-limited" if status == 429 else f"Hub answered {status}"
                cancellable_wait(ctx, wait, notify, reason)
                continue
            if not status:
                if (why := unreachable_reason(err)) is not None:
                    raise unreachable_error(endpoint(), why) from None
                raise NetworkError(
                    f"Talking to the Hub about '{repo_id}' failed: {_first_line(err)}."
                ) from None
            raise http_error(
                status, headers, repo_id=repo_id, revision=revision, had_token=had_token
            ) from None
        except net_errs as err:
            if (why := unreachable_reason(err)) is not None:
                raise unreachable_error(endpoint(), why) from None
            if attempt < policy.max_tries:
                cancellable_wait(ctx, backoff_delay(attempt, None, policy), notify, "network error")
                continue
            raise NetworkError(
                f"Could not reach the Hub at {endpoint()} for '{repo_id}' ({_first_line(err)}); check the "
                "connection, or set HF_HUB_OFFLINE=1 to use the local cache."
            ) from None
    raise AssertionError("unreachable")  # pragma: no cover


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


# -- search and details ---------------------------------------------------------------------------


def _api(token: str | None):  # noqa: ANN202
    from huggingface_hub import HfApi

    # token=False (not None) so a stray login file never sneaks in when the caller chose no token.
    return HfApi(endpoint=endpoint(), token=token if token else False)


def _gated(value: Any) -> bool:
    return bool(value) and value not in ("false", "False")


def _summary(info: Any) -> ModelSummary:
    params = None
    if getattr(info, "safetensors", None) is not None:
        params = int(info.safetensors.total)
    elif isinstance(getattr(info, "gguf", None), dict) and info.gguf.get("total"):
        params = int(info.gguf["total"])
    return ModelSummary(
        id=info.id,
        downloads=int(info.downloads or 0),
        likes=int(info.likes or 0),
        last_modified=info.last_modified,
        tags=tuple(info.tags or ()),
        pipeline_tag=info.pipeline_tag,
        library=info.library_name,
        gated=_gated(info.gated),
        private=bool(info.private),
        params=params,
    )


def search(
    query: str = "",
    *,
    task: str | None = None,
    library: str | None = None,
    sort: str = "downloads",
    limit: int = 20,
    offset: int = 0,
    token: str | None = None,
    ctx: JobContext | None = None,
) -> list[ModelSummary]:
    """Search models by text, task (pipeline tag) and library, sorted (descending) by ``sort``.

    ``offset`` skips that many results, so page ``n`` is ``offset=n * limit``.
    """
    if sort not in SORTS:
        raise HubError(f"Unknown sort '{sort}'; use one of: {', '.join(SORTS)}.")
    if limit < 1 or offset < 0:
        raise HubError(f"Search limit must be at least 1 and offset at least 0 (got {limit}, {offset}).")
    api = _api(token)

    def run() -> list[ModelSummary]:
        items = api.list_models(
            search=query or None,
            pipeline_tag=task or None,
            filter=library or None,
            sort=SORTS[sort],
            limit=offset + limit,
            expand=_SEARCH_EXPAND,
        )
        return [_summary(i) for i in islice(items, offset, offset + limit)]

    # list_models pages through huggingface_hub's http_backoff, which itself retries dropped
    # connections, 429 and 5xx (five times, with backoff, honouring Retry-After). Retrying around it
    # again made an unreachable Hub cost 30 attempts and over two minutes, so the outer loop tries once.
    return call_hub(
        lambda: _without_hf_retry_warnings(run),
        repo_id=query or "search",
        ctx=ctx,
        had_token=bool(token),
        policy=replace(DEFAULT_POLICY, max_tries=1),
    )


def _without_hf_retry_warnings(fn: Callable[[], T]) -> T:
    """Run ``fn`` with huggingface_hub's per-retry warnings off (our own error says what failed)."""
    log = logging.getLogger("huggingface_hub.utils._http")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        return fn()
    finally:
        log.setLevel(level)


def _license(info: Any) -> str | None:
    card = getattr(info, "card_data", None)
    lic = getattr(card, "license", None) if card is not None else None
    if lic:
        return str(lic)
    for tag in info.tags or ():
        if tag.startswith("license:"):
            return tag.split(":", 1)[1]
    return None


def repo_files(info: Any) -> tuple[RepoFileInfo, ...]:
    """Our file records from a ``model_info(..., files_metadata=True)`` answer (names validated)."""
    files = []
    names = {str(s.rfilename) for s in info.siblings or ()}
    for s in info.siblings or ():
        name = str(safe_repo_path(s.rfilename))
        folder = name.rpartition("/")[0]
        while folder:  # "config.json" and "config.json/inner.txt": one path cannot be file and folder
            if folder in names:
                raise RepoNotFound(
                    f"The Hub listed {folder!r} both as a file and as a folder (of {name!r}) in "
                    f"'{info.id}'; the listing is broken, so nothing was downloaded."
                )
            folder = folder.rpartition("/")[0]
        lfs = s.lfs
        sha256 = getattr(lfs, "sha256", None) if lfs is not None else None
        size = s.size if s.size is not None else (getattr(lfs, "size", None) if lfs is not None else None)
        files.append(
            RepoFileInfo(
                name=name,
                size=size,
                blob_id=s.blob_id.lower() if isinstance(s.blob_id, str) else None,
                sha256=sha256.lower() if isinstance(sha256, str) else None,  # validated before use
                quant_type=quant_type_from_name(name) if name.lower().endswith(".gguf") else None,
            )
        )
    return tuple(sorted(files, key=lambda f: f.name))


def get_model_info(
    repo_id: str, *, revision: str | None = None, token: str | None = None, ctx: JobContext | None = None
) -> Any:
    """``HfApi.model_info`` with file sizes and hashes, with our retries and errors."""
    check_repo_id(repo_id)
    api = _api(token)
    return call_hub(
        lambda: api.model_info(repo_id, revision=revision, files_metadata=True, timeout=metadata_timeout()),
        repo_id=repo_id,
        ctx=ctx,
        had_token=bool(token),
        revision=revision,
    )


def model_details(
    repo_id: str,
    *,
    revision: str | None = None,
    token: str | None = None,
    with_card: bool = True,
    with_config: bool = True,
    ctx: JobContext | None = None,
) -> ModelDetails:
    """Files (sizes, hashes, GGUF quant types), parameters, license, gating and the model card of a repo."""
    ctx = ctx or JobContext()
    info = get_model_info(repo_id, revision=revision, token=token, ctx=ctx)
    files = repo_files(info)
    names = {f.name for f in files}
    sha = info.sha or revision
    params: int | None = None
    by_dtype: dict[str, int] = {}
    if info.safetensors is not None:
        params = int(info.safetensors.total)
        by_dtype = {str(k): int(v) for k, v in (info.safetensors.parameters or {}).items()}
    elif isinstance(info.gguf, dict) and info.gguf.get("total"):
        params = int(info.gguf["total"])
    elif "model.safetensors" in names or "model.safetensors.index.json" in names:
        params, by_dtype = _params_from_headers(repo_id, sha, token, ctx)
    # A gated repository shows its metadata to everyone but its files only to accepted users: the
    # details still load, without card or config, and the download asks for the token.
    card = ""
    if with_card and "README.md" in names:
        try:
            card = fetch_text(repo_id, "README.md", revision=sha, token=token, ctx=ctx)
        except AuthRequired:
            card = ""
    config = None
    if with_config and "config.json" in names:
        try:
            config = fetch_json(repo_id, "config.json", revision=sha, token=token, ctx=ctx)
        except AuthRequired:
            config = None
    return ModelDetails(
        id=info.id,
        sha=info.sha,
        files=files,
        params=params,
        params_by_dtype=by_dtype,
        license=_license(info),
        gated=_gated(info.gated),
        private=bool(info.private),
        last_modified=info.last_modified,
        downloads=int(info.downloads or 0),
        likes=int(info.likes or 0),
        pipeline_tag=info.pipeline_tag,
        library=info.library_name,
        tags=tuple(info.tags or ()),
        card=card,
        config=config,
    )


def _params_from_headers(
    repo_id: str, revision: str | None, token: str | None, ctx: JobContext
) -> tuple[int | None, dict[str, int]]:
    """Parameter count read from the safetensors headers (Range requests), when the Hub did not say."""
    api = _api(token)
    try:
        meta = call_hub(
            lambda: api.get_safetensors_metadata(repo_id, revision=revision),
            repo_id=repo_id,
            ctx=ctx,
            had_token=bool(token),
        )
    except HubError:
        raise
    except Exception:  # a malformed header only costs us the parameter count, not the details
        return None, {}
    by_dtype: dict[str, int] = {}
    for fm in meta.files_metadata.values():
        for dtype, n in fm.parameter_count.items():
            by_dtype[dtype] = by_dtype.get(dtype, 0) + int(n)
    return (sum(by_dtype.values()) or None), by_dtype


def fetch_bytes(
    repo_id: str,
    filename: str,
    *,
    revision: str | None = None,
    token: str | None = None,
    max_bytes: int = MAX_SMALL_FILE,
    ctx: JobContext | None = None,
) -> bytes:
    """A small file's bytes straight from the Hub (not cached), refusing anything over ``max_bytes``."""
    check_repo_id(repo_id)
    safe_repo_path(filename)
    url = resolve_url(repo_id, filename, revision)
    headers = auth_headers(token)

    def run() -> bytes:
        with open_url("GET", url, headers, timeout=download_timeout()) as resp:
            if resp.status in RETRYABLE_STATUS:
                raise _HTTPStatus(resp.status, dict(resp.headers.items()))
            if resp.status >= 400:
                raise http_error(
                    resp.status,
                    resp.headers,
                    repo_id=repo_id,
                    revision=revision,
                    filename=filename,
                    had_token=bool(token),
                )
            data = bytearray()
            while True:
                chunk = resp.read(65536)
                if not chunk:
                    break
                data += chunk
                if len(data) > max_bytes:
                    raise HubError(
                        f"'{filename}' of '{repo_id}' is larger than {max_bytes // (1024 * 1024)} MB; it is not shown."
                    )
            return bytes(data)

    return retry_plain(run, repo_id=repo_id, ctx=ctx, had_token=bool(token))


class _HTTPStatus(Exception):
    """A retryable HTTP status seen by our own client (internal to the retry loop)."""

    def __init__(self, status: int, headers: Mapping[str, str]) -> None:
        super().__init__(status)
        self.status = status
        self.headers = headers


def retry_plain(
    fn: Callable[[], T],
    *,
    repo_id: str,
    ctx: JobContext | None,
    had_token: bool,
    policy: RetryPolicy = DEFAULT_POLICY,
    notify: Callable[[str], None] | None = None,
) -> T:
    """Retry a call made with our own HTTP client (``_HTTPStatus`` for 429/5xx, OSError for the network)."""
    ctx = ctx or JobContext()
    if is_offline():
        raise OfflineError(
            f"Offline mode is on (HF_HUB_OFFLINE), so '{repo_id}' cannot be fetched from the Hub."
        )
    check_reachable(endpoint())
    for attempt in range(1, policy.max_tries + 1):
        ctx.check_cancelled()
        try:
            return fn()
        except _HTTPStatus as err:
            if attempt >= policy.max_tries:
                raise http_error(err.status, err.headers, repo_id=repo_id, had_token=had_token) from None
            wait = backoff_delay(attempt, parse_retry_after(err.headers), policy)
            if wait > policy.max_retry_after:
                raise http_error(err.status, err.headers, repo_id=repo_id, had_token=had_token) from None
            cancellable_wait(
                ctx, wait, notify, "rate-limited" if err.status == 429 else f"Hub answered {err.status}"
            )
        except (OSError, http.client.HTTPException) as err:
            if (why := unreachable_reason(err)) is not None:
                raise unreachable_error(endpoint(), why) from None
            if attempt >= policy.max_tries:
                raise NetworkError(
                    f"Could not reach the Hub at {endpoint()} for '{repo_id}' ({_first_line(err)}); check the connection."
                ) from None
            cancellable_wait(ctx, backoff_delay(attempt, None, policy), notify, "network error")
    raise AssertionError("unreachable")  # pragma: no cover


def fetch_text(repo_id: str, filename: str, **kwargs: Any) -> str:
    """A small text file (e.g. the model card) decoded leniently."""
    return fetch_bytes(repo_id, filename, **kwargs).decode("utf-8", errors="replace")


def fetch_json(repo_id: str, filename: str, **kwargs: Any) -> dict[str, Any] | None:
    """A small JSON file (e.g. config.json) parsed, or None when it is not a JSON object."""
    try:
        data = safejson.loads(fetch_bytes(repo_id, filename, **kwargs), filename, ValueError)
    except (ValueError, UnicodeDecodeError, RecursionError):  # deep nesting too: not a usable config
        return None
    if safejson.depth(data) > safejson.MAX_DEPTH:
        return None
    return data if isinstance(data, dict) else None


def resolve_url(repo_id: str, filename: str, revision: str | None) -> str:
    """The download address of one file (names and revisions URL-quoted, so odd characters work)."""
    rev = quote(revision or "main", safe="")
    return f"{endpoint()}/{repo_id}/resolve/{rev}/{quote(filename)}"


def auth_headers(token: str | None) -> dict[str, str]:
    """Request headers, with the token when there is one."""
    headers = {"User-Agent": f"quant-studio/{__version__}", "Accept-Encoding": "identity"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def metadata_timeout() -> float:
    """Seconds a metadata call may take before it is retried (``HF_HUB_ETAG_TIMEOUT``, default 10)."""
    try:
        return float(os.environ.get("HF_HUB_ETAG_TIMEOUT") or 10)
    except ValueError:
        return 10.0


def download_timeout() -> float:
    """Seconds a read may stall before we retry (``HF_HUB_DOWNLOAD_TIMEOUT``, default 10)."""
    try:
        return float(os.environ.get("HF_HUB_DOWNLOAD_TIMEOUT") or 10)
    except ValueError:
        return 10.0
