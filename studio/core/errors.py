"""One error tree whose messages are written for the user: one clear sentence each."""

from __future__ import annotations

import re
from typing import Any

from studio.core.untrusted import redact_secrets

MAX_MESSAGE_CHARS = 300  # an error line longer than this quotes something hostile; it is cut in the middle
MAX_HINT_CHARS = 200
_LONG_QUOTED = re.compile(r"(['\"])([^'\"\n]{80,})\1")  # a quoted value of 80+ characters


def shorten(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``text`` cut in the middle to at most ``limit`` characters (``…`` marks the cut)."""
    text = str(text)
    if len(text) <= limit:
        return text
    head = (limit - 1) * 2 // 3
    return text[:head] + "…" + text[len(text) - (limit - 1 - head) :]


def bound_message(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """An error line of at most ``limit`` characters: long quoted values are shortened first (so the
    sentence around them survives), then the whole line is cut in the middle if still too long."""
    text = str(text)
    if len(text) <= limit:
        return text
    text = _LONG_QUOTED.sub(lambda m: m.group(1) + shorten(m.group(2), 60) + m.group(1), text)
    return shorten(text, limit)


def quote(value: Any, limit: int = 60) -> str:
    """``repr(value)`` shortened to ``limit`` characters: how an error quotes an offending value."""
    if isinstance(value, str) and len(value) > 4 * limit:
        value = value[: 2 * limit] + value[-2 * limit :]  # repr of a huge string is never built
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # a 5000-digit int, a deeply nested list
        text = f"<{type(value).__name__}>"
    return shorten(text, limit)


class StudioError(Exception):
    """Base of every error the user may see; ``str(err)`` is the sentence to show.

    The message and hint are bounded (``MAX_MESSAGE_CHARS``, ``MAX_HINT_CHARS``): a hostile name or
    value quoted in them cannot make a megabyte-long error line.
    """

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        # The one place every error sentence is built: no bearer token survives it (a server may echo
        # it), and a hostile name or value quoted in it cannot make a megabyte-long line.
        message = bound_message(redact_secrets(message), MAX_MESSAGE_CHARS)
        hint = bound_message(redact_secrets(hint), MAX_HINT_CHARS) if hint else hint
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


class CalibrationError(StudioError):
    """Calibration cannot run or its result cannot be used (bad text, NaN activations, wrong model)."""


def unexpected_error_sentence(title: str, err: BaseException) -> str:
    """One sentence for an exception that is not a ``StudioError`` (a bug or an environment problem)."""
    detail = str(err).strip().splitlines()[0] if str(err).strip() else ""
    what = f"{type(err).__name__}: {detail}" if detail else type(err).__name__
    return f"{title} failed with an unexpected error ({what}); the details are in the log."
