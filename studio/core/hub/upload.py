"""Upload a GGUF to the Hugging Face Hub with a generated model card: all of it, or nothing.

``upload_gguf(path, "user/name")`` goes through ``huggingface_hub.HfApi``:

1. local checks first, so a bad file never touches the Hub: the header is read (bounded), the file
   is hashed (sha256, which the large-file protocol needs), the card is written;
2. ``repo_info`` (does the repository exist?) and, if not, ``create_repo``;
3. one ``create_commit`` holding the GGUF and README.md: ``POST /api/models/{repo}/preupload/main``
   (upload mode), ``POST /{repo}.git/info/lfs/objects/batch`` (where to put the bytes), ``PUT`` to
   the storage address it names (single part, or one ``PUT`` per part and a completion ``POST``),
   ``POST .../objects/verify``, then ``POST /api/models/{repo}/commit/main``. The commit is atomic:
   until it lands the repository shows nothing new.

The GGUF goes through the Git LFS path, not Xet: huggingface_hub 2.x picks Xet whenever ``hf_xet``
is installed and the data is a path, and falls back to LFS for an open binary file, which is what
we hand it (our reader also reports progress, notices cancel and remembers a read error). The Hub
keeps serving LFS uploads for Xet-backed repositories, and it is the protocol our tests can serve.

A failure after this call created the repository deletes that (empty) repository again; if even
that fails the message says the empty repository is left and where. A lost answer to the commit is
checked against the repository, so a commit that did land is reported as the success it is. The
token is only ever handed to huggingface_hub; no message or log line contains it.
"""

from __future__ import annotations

import http.client
import io
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from studio.core.errors import CorruptFileError, HubError
from studio.core.evaluate.record import last_evaluation
from studio.core.gguf.read import read_gguf
from studio.core.hub.api import _license, endpoint, fetch_text, get_model_info, transport_errors
from studio.core.hub.auth import redact
from studio.core.hub.errors import RepoNotFound, UploadError
from studio.core.hub.model_card import card_facts, is_studio_card, merge_card
from studio.core.hub.paths import check_repo_id
from studio.core.hub.retry import (
    DEFAULT_POLICY,
    RETRYABLE_STATUS,
    backoff_delay,
    cancellable_wait,
    parse_retry_after,
)
from studio.core.jobs import JobCancelled, JobContext

T = TypeVar("T")
_LOG_LOCK = threading.Lock()
# Upload states, as UploadError.state says them.
NOTHING_CREATED, UNCHANGED, ROLLED_BACK, EMPTY_REPO_LEFT, UNKNOWN = (
    "nothing-created",
    "unchanged",
    "rolled-back",
    "empty-repo-left",
    "unknown",
)


@dataclass(frozen=True)
class UploadResult:
    """What an upload put on the Hub."""

    repo_id: str
    url: str  # the repository's page
    file_url: str
    file_name: str
    file_bytes: int
    sha256: str
    commit: str | None
    created_repo: bool
    card_written: bool
    card: str  # the README text that was (or would have been) uploaded
    notes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "repo_id": self.repo_id,
            "url": self.url,
            "file_url": self.file_url,
            "file": self.file_name,
            "file_bytes": self.file_bytes,
            "sha256": self.sha256,
            "commit": self.commit,
            "created_repo": self.created_repo,
            "card_written": self.card_written,
            "notes": list(self.notes),
            "card": self.card,
        }


class UploadReader(io.BufferedReader):
    """The GGUF as huggingface_hub reads it (hash pass, then upload): progress, cancel, read errors."""

    def __init__(self, path: Path, ctx: JobContext, size: int) -> None:
        super().__init__(io.FileIO(path, "rb"), buffer_size=1 << 20)
        self.name_shown = path.name
        self.ctx = ctx
        self.size = size
        self.phase = 0  # 0: hashing, 1: uploading
        self.error: OSError | None = None

    def _before(self) -> None:
        self.ctx.check_cancelled()  # raising inside a read aborts the request under way

    def _after(self) -> None:
        what = "Checking" if self.phase == 0 else "Uploading"
        done = self.phase * self.size + min(self.tell(), self.size)
        self.ctx.report(done, 2 * self.size + 1, f"{what} {self.name_shown}")

    def _guard(self, fn: Callable[[], T]) -> T:
        self._before()
        try:
            out = fn()
        except OSError as err:
            self.error = err
            raise
        self._after()
        return out

    def read(self, size: int | None = -1) -> bytes:  # noqa: D102
        return self._guard(lambda: super(UploadReader, self).read(size))

    def read1(self, size: int = -1) -> bytes:  # noqa: D102
        return self._guard(lambda: super(UploadReader, self).read1(size))

    def readinto(self, b: Any) -> int:  # noqa: D102
        return self._guard(lambda: super(UploadReader, self).readinto(b))


def open_reader(path: Path, ctx: JobContext, size: int) -> UploadReader:
    """The reader an upload streams from (tests replace it to inject disk errors)."""
    return UploadReader(path, ctx, size)


# -- errors -------------------------------------------------------------------------------------------


def _chain(err: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = err
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def _status(err: BaseException) -> tuple[int, Any, str]:
    """(HTTP status, headers, server message) of the first HTTP error in ``err``'s chain; status 0 if none."""
    from huggingface_hub.errors import HfHubHTTPError

    for e in _chain(err):
        if isinstance(e, HfHubHTTPError):
            resp = getattr(e, "response", None)
            status = int(getattr(resp, "status_code", 0) or 0)
            headers = getattr(resp, "headers", None)
            msg = (headers.get("X-Error-Message") if headers is not None else None) or getattr(
                e, "server_message", None
            )
            return status, headers, str(msg or "").strip().splitlines()[0][:200] if msg else ""
    return 0, None, ""


def _cause(err: BaseException, reader: UploadReader | None, file: str, repo: str) -> tuple[str, str, str]:
    """(kind, why it failed, what to do) for an upload failure."""
    if reader is not None and reader.error is not None:
        e = reader.error
        return (
            "disk",
            f"reading {file} from the disk failed ({e.strerror or e})",
            "check the disk (or copy the file elsewhere) and run the upload again",
        )
    status, _headers, msg = _status(err)
    if status == 401:
        return (
            "auth",
            "the Hub refused the Hugging Face token (HTTP 401: expired, revoked or mistyped)",
            "sign in with a valid write token (HF_TOKEN or `hf auth login`) and run the upload again",
        )
    if status == 403:
        detail = f": {msg}" if msg else ""
        return (
            "forbidden",
            f"the token may not write to '{repo}' (HTTP 403{detail})",
            "use a write token of an account that owns the repository or may write to it",
        )
    if status == 429:
        return (
            "rate-limited",
            "the Hub kept answering HTTP 429 (too many requests) after every retry",
            "wait a few minutes and run the upload again",
        )
    if status:
        detail = f" ({msg})" if msg else ""
        return ("server", f"the Hub answered HTTP {status}{detail}", "try again later")
    net = transport_errors()
    for e in _chain(err):
        if isinstance(e, net) or isinstance(e, http.client.HTTPException):
            line = (str(e).strip().splitlines() or [type(e).__name__])[0][:100]
            return (
                "network",
                "the connection to the Hub dropped and did not come back after retries",
                f"check the network ({endpoint()}: {line}) and run the upload again",
            )
    line = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
    return ("unexpected", f"of an unexpected error ({type(err).__name__}: {line})", "run the upload again")


def _state_text(state: str, repo: str) -> str:
    page = f"{endpoint()}/{repo}"
    return {
        NOTHING_CREATED: "nothing was created on the Hub",
        UNCHANGED: f"'{repo}' is unchanged",
        ROLLED_BACK: f"the repository '{repo}' it had just created was deleted again, so nothing is left",
        EMPTY_REPO_LEFT: f"the empty repository '{repo}' it created is still there (delete it at {page})",
        UNKNOWN: f"whether the file arrived is unknown (look at {page})",
    }[state]


def _error(
    err: BaseException, reader: UploadReader | None, file: str, repo: str, state: str, token: str
) -> UploadError:
    kind, why, todo = _cause(err, reader, file, repo)
    # what happened is the sentence, what to do its hint: each stays whole within the error's bounds
    text = f"Uploading {file} to '{repo}' failed because {why}, and {_state_text(state, repo)}."
    hint = todo[:1].upper() + todo[1:] + "."
    return UploadError(redact(text, token), kind=kind, state=state, repo_id=repo, hint=redact(hint, token))


# -- Hub calls ----------------------------------------------------------------------------------------


def _retrying(fn: Callable[[], T], ctx: JobContext) -> T:
    """Run one idempotent Hub call, retrying 408/429/5xx and dropped connections (cancellable waits)."""
    net = (*transport_errors(), http.client.HTTPException)
    policy = DEFAULT_POLICY
    for attempt in range(1, policy.max_tries + 1):
        ctx.check_cancelled()
        try:
            return fn()
        except Exception as err:
            status, headers, _ = _status(err)
            retry = status in RETRYABLE_STATUS or (not status and isinstance(err, net))
            wait = backoff_delay(attempt, parse_retry_after(headers), policy)
            if not retry or attempt == policy.max_tries or wait > policy.max_retry_after:
                raise
            reason = (
                "rate-limited" if status == 429 else (f"Hub answered {status}" if status else "network error")
            )
            cancellable_wait(ctx, wait, None, reason)
    raise AssertionError("unreachable")  # pragma: no cover


def _repo_exists(api: Any, repo_id: str, ctx: JobContext) -> bool:
    from huggingface_hub.errors import RepositoryNotFoundError

    try:
        _retrying(lambda: api.repo_info(repo_id, repo_type="model"), ctx)
    except RepositoryNotFoundError as err:
        if _status(err)[0] == 401 and _has_token_error(err):
            raise
        return False
    return True


def _has_token_error(err: BaseException) -> bool:
    # The Hub answers 401 "Repository not found" for a private repo of someone else, and 401
    # "Invalid credentials" for a bad token; only the second is a token problem.
    _status_code, _headers, msg = _status(err)
    return "credential" in msg.lower() or "token" in msg.lower()


def _repo_has(api: Any, repo_id: str, name: str, sha256: str, ctx: JobContext) -> bool:
    info = _retrying(lambda: api.model_info(repo_id, files_metadata=True), ctx)
    for s in info.siblings or ():
        lfs = getattr(s, "lfs", None)
        if s.rfilename == name and lfs is not None and str(getattr(lfs, "sha256", "")).lower() == sha256:
            return True
    return False


def _existing_card(repo_id: str, token: str, ctx: JobContext) -> str | None:
    try:
        return fetch_text(repo_id, "README.md", revision="main", token=token, ctx=ctx)
    except RepoNotFound:
        return None


class _ToContext(logging.Handler):
    """huggingface_hub's warnings (its retries) as job log lines, without the Xet fallback notice."""

    def __init__(self, ctx: JobContext, token: str) -> None:
        super().__init__(logging.WARNING)
        self.ctx, self.token = ctx, token

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "not supported by Xet Storage" in msg:
            return  # we chose the LFS path on purpose
        self.ctx.log(redact(msg, self.token))


@contextmanager
def _hf_log_to(ctx: JobContext, token: str) -> Iterator[None]:
    lib = logging.getLogger("huggingface_hub")
    with _LOG_LOCK:
        saved = (lib.handlers[:], lib.propagate)
        lib.handlers = [_ToContext(ctx, token)]
        lib.propagate = False
        try:
            yield
        finally:
            lib.handlers, lib.propagate = saved


def source_license(repo_id: str, revision: str | None, token: str | None, ctx: JobContext) -> str | None:
    """The license the source repository declares, or None when the Hub cannot say."""
    try:
        return _license(get_model_info(repo_id, revision=revision, token=token, ctx=ctx))
    except HubError:
        return None


# -- the upload ---------------------------------------------------------------------------------------


def upload_gguf(
    path: str | os.PathLike[str],
    repo_id: str,
    *,
    token: str | None,
    private: bool = False,
    ctx: JobContext | None = None,
) -> UploadResult:
    """Upload the GGUF at ``path`` to the model repository ``repo_id`` with a generated README card."""
    ctx = ctx or JobContext()
    p = Path(path).expanduser()
    check_repo_id(repo_id)
    if "/" not in repo_id:
        raise HubError(f"Give the repository as USER/NAME (or ORG/NAME), not '{repo_id}'.")
    if not token:
        raise UploadError(
            f"Uploading {p.name} to '{repo_id}' needs a Hugging Face token with write access; set HF_TOKEN "
            "or sign in with `hf auth login`, then run the upload again.",
            kind="auth",
            state=NOTHING_CREATED,
            repo_id=repo_id,
        )
    if p.suffix.lower() != ".gguf":
        raise HubError(f"{p} is not a .gguf file; only GGUF files are uploaded.")
    try:
        header = read_gguf(p)  # a truncated or hostile file is refused before anything is sent
    except CorruptFileError as err:
        raise HubError(f"{err} It was not uploaded.") from None
    except OSError as err:
        raise HubError(f"Cannot read {p} ({err.strerror or err}); nothing was uploaded.") from None
    size = header.file_size

    from huggingface_hub import CommitOperationAdd, HfApi

    reader: UploadReader | None = None
    created = False
    api = HfApi(endpoint=endpoint(), token=token)
    state = NOTHING_CREATED
    notes: list[str] = []
    try:
        with _hf_log_to(ctx, token):
            facts0 = card_facts(p)
            lic = None
            if facts0.license is None and facts0.source_repo:
                ctx.report(0, 2 * size + 1, f"Reading the license of {facts0.source_repo}")
                lic = source_license(facts0.source_repo, facts0.source_revision, token, ctx)
            reader = open_reader(p, ctx, size)
            gguf_op = CommitOperationAdd(path_in_repo=p.name, path_or_fileobj=reader)  # hashes the file
            reader.phase = 1
            sha = gguf_op.upload_info.sha256.hex()
            facts = card_facts(p, sha256=sha, source_license=lic, evaluation=last_evaluation(p))

            existed = _repo_exists(api, repo_id, ctx)
            if existed:
                state = UNCHANGED
                if private:
                    notes.append(f"'{repo_id}' already existed; its visibility was left as it is.")
            else:
                ctx.log(f"Creating the {'private ' if private else ''}repository {repo_id}")
                _retrying(lambda: api.create_repo(repo_id, private=private, exist_ok=True), ctx)
                created, state = True, EMPTY_REPO_LEFT

            old = _existing_card(repo_id, token, ctx) if existed else None
            card = merge_card(old if is_studio_card(old) else None, facts)
            ops = [gguf_op]
            if old is None or is_studio_card(old):
                ops.append(CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=card.encode("utf-8")))
            else:
                notes.append(f"'{repo_id}' has its own README.md; it was left unchanged.")
            quant = facts.quant or "GGUF"
            try:
                info = api.create_commit(
                    repo_id,
                    ops,
                    commit_message=f"Upload {p.name} ({quant}) with Quant Studio",
                    commit_description="The model card was generated from the file's metadata and its last evaluation.",
                )
                commit = getattr(info, "oid", None)
            except Exception as err:
                if any(isinstance(e, JobCancelled) for e in _chain(err)):
                    raise JobCancelled() from None  # stopped in a read, before the commit was sent
                # The commit's answer can be lost after the commit landed: ask the repository.
                try:
                    landed = _repo_has(api, repo_id, p.name, sha, ctx)
                except Exception:
                    state = UNKNOWN
                    raise err from None
                if not landed:
                    raise
                commit = None
                notes.append("The answer to the commit was lost, but the file is in the repository.")
    except BaseException as err:
        if created and state != UNKNOWN:
            state = _roll_back(api, repo_id, ctx)
        if isinstance(err, JobCancelled):
            ctx.log(f"Upload cancelled: {_state_text(state, repo_id)}.")
            raise
        if isinstance(err, UploadError):
            raise
        if isinstance(err, HubError) and not isinstance(err, UploadError) and _status(err)[0] == 0:
            raise UploadError(
                f"{err.message.rstrip('.')}; {_state_text(state, repo_id)}.",
                kind="hub",
                state=state,
                repo_id=repo_id,
            ) from None
        if not isinstance(err, Exception):
            raise
        raise _error(err, reader, p.name, repo_id, state, token) from None
    finally:
        if reader is not None:
            reader.close()
    ctx.report(2 * size + 1, 2 * size + 1, f"Uploaded {p.name}")
    page = f"{endpoint()}/{repo_id}"
    return UploadResult(
        repo_id=repo_id,
        url=page,
        file_url=f"{page}/blob/main/{p.name}",
        file_name=p.name,
        file_bytes=size,
        sha256=sha,
        commit=commit,
        created_repo=created,
        card_written=len(ops) > 1,
        card=card,
        notes=tuple(notes),
    )


def _roll_back(api: Any, repo_id: str, ctx: JobContext) -> str:
    """Delete the repository this upload created; the state that is left."""
    try:
        api.delete_repo(repo_id, missing_ok=True)
    except Exception:
        return EMPTY_REPO_LEFT
    ctx.log(f"Deleted the repository {repo_id} again")
    return ROLLED_BACK


__all__ = ["UploadReader", "UploadResult", "open_reader", "source_license", "upload_gguf"]
