"""Reading a user's text file: one size limit and one UTF-8 check, with the caller's error type."""

from __future__ import annotations

from pathlib import Path

from studio.core.errors import StudioError

MAX_TEXT_BYTES = 64 << 20  # a larger file is almost certainly not meant as calibration or evaluation text


def check_text_size(size: int, path: Path, what: str, error: type[StudioError]) -> None:
    """Raise ``error`` when a text file of ``size`` bytes is over ``MAX_TEXT_BYTES``."""
    if size > MAX_TEXT_BYTES:
        raise error(
            f"The {what} {path} is {size / 1e6:.0f} MB; at most {MAX_TEXT_BYTES >> 20} MB is read.",
            hint="Use a shorter excerpt.",
        )


def decode_utf8(data: bytes, path: Path, what: str, error: type[StudioError], *, hint: str) -> str:
    """``data`` as UTF-8 text; a binary or legacy-encoded file raises ``error`` naming the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        # it would be read as replacement characters: refuse it
        raise error(
            f"The {what} {path} is not UTF-8 text (byte {err.start} cannot be decoded).", hint=hint
        ) from None
