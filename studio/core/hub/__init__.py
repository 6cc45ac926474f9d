"""Hugging Face Hub client: search, model details, resumable verified downloads, and the local cache."""

from __future__ import annotations

from studio.core.hub.api import (
    ModelDetails,
    ModelSummary,
    RepoFileInfo,
    endpoint,
    model_details,
    search,
)
from studio.core.hub.download import (
    DownloadProgress,
    DownloadResult,
    cached_snapshot,
    download,
    download_snapshot,
)
from studio.core.hub.errors import (
    AuthRequired,
    CorruptDownload,
    DiskSpaceError,
    FileTooLarge,
    IncompleteSnapshot,
    NetworkError,
    OfflineError,
    RateLimited,
    RepoNotFound,
    UploadError,
)
from studio.core.hub.gguf_quant import quant_type, quant_type_from_header, quant_type_from_name

__all__ = [
    "AuthRequired",
    "CorruptDownload",
    "DiskSpaceError",
    "DownloadProgress",
    "DownloadResult",
    "FileTooLarge",
    "IncompleteSnapshot",
    "ModelDetails",
    "ModelSummary",
    "NetworkError",
    "OfflineError",
    "RateLimited",
    "RepoFileInfo",
    "RepoNotFound",
    "UploadError",
    "cached_snapshot",
    "download",
    "download_snapshot",
    "endpoint",
    "model_details",
    "quant_type",
    "quant_type_from_header",
    "quant_type_from_name",
    "search",
]
