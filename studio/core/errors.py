"""One error tree whose messages are written for the user: one clear sentence each."""

from __future__ import annotations

from studio.core.untrusted import redact_secrets


class StudioError(Exception):
    """Base of every error the user may see; ``str(err)`` is the sentence to show."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        # The one place every error sentence is built: no bearer token survives it (a server may echo it).
        message = redact_secrets(message)
        hint = redact_secrets(hint) if hint else hint
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} {self.hint}"


class ModelOpenError(StudioError):
    """A model folder or file cannot be opened (missing, empty, unsupported)."""


class CorruptFileError(StudioError):
    """A file is truncated, malformed or lies about its own contents."""


class RemoteCodeError(StudioError):
    """A model needs custom Python code from its repository, which we never run silently."""


class UnsafeFileError(StudioError):
    """A file is refused because loading it could run code or exhaust the machine."""


class QuantizationError(StudioError):
    """A tensor cannot be quantized as asked (bad shape, NaN/Inf, unknown type)."""


class ExportError(StudioError):
    """Writing a GGUF file failed (disk full, permission, bad path, validation)."""


class HubError(StudioError):
    """Talking to the Hugging Face Hub failed (not found, gated, rate-limited, network)."""


class ChildProcessError_(StudioError):
    """A worker child process died or reported an error (crash, out of memory)."""


class EvaluationError(StudioError):
    """An evaluation could not be run (text too short, tokenizer mismatch, context too small)."""
