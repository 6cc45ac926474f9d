"""Hub errors the user may see, each one sentence that names the repository or file and what to do."""

from __future__ import annotations

from studio.core.errors import HubError


class AuthRequired(HubError):
    """The repository is gated or private and needs a (valid) token; the GUI turns this into a token prompt."""

    def __init__(self, message: str, *, repo_id: str, gated: bool = False, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.repo_id = repo_id
        self.gated = gated


class RepoNotFound(HubError):
    """The repository (or revision, or file) does not exist on the Hub."""


class RateLimited(HubError):
    """The Hub kept answering 429 (too many requests) after every retry."""


class NetworkError(HubError):
    """The Hub could not be reached or kept failing (connection, timeout, 5xx) after every retry."""


class CorruptDownload(HubError):
    """A downloaded file does not match the size or checksum the Hub published; it was removed."""


class DiskSpaceError(HubError):
    """The cache disk is too small for the download, or filled up while writing."""


class FileTooLarge(HubError):
    """A single file is larger than a plain HTTP download allows."""


class OfflineError(HubError):
    """Offline (by setting or lack of network) and the local cache cannot answer."""


class IncompleteSnapshot(OfflineError):
    """Offline, and the cached snapshot lacks some files; ``missing`` lists them."""

    def __init__(self, message: str, *, missing: tuple[str, ...], hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.missing = missing


class UploadError(HubError):
    """An upload failed: ``kind`` says why (auth, forbidden, rate-limited, network, disk, ...) and
    ``state`` what is left on the Hub (see ``studio.core.hub.upload``)."""

    def __init__(self, message: str, *, kind: str, state: str, repo_id: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.kind = kind
        self.state = state
        self.repo_id = repo_id
