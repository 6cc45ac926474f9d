"""Reading a user's file: one door (``read_untrusted``: regular files only, a size cap by kind), one
size limit and one UTF-8 check for text, with the caller's error type."""

from __future__ import annotations

import os
import stat
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


# ------------------------------------------------------------------------------------------ the one door

# The most bytes read of a user's file, by its kind: a larger file is the wrong file.
KIND_LIMITS = {
    "text": MAX_TEXT_BYTES,
    "json": 256 << 20,  # plans and scans are small; a 256 MB "JSON" is not one of ours
    "header": 1 << 16,  # a probe of a file's first bytes (magic, safetensors length, UTF-8 check)
}


def _kind_of(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def read_untrusted(
    path: str | os.PathLike[str],
    what: str,
    error: type[StudioError],
    *,
    kind: str = "text",
    head: int | None = None,
) -> bytes:
    """The bytes of a user-given file: the one door every user-given path is read through.

    Anything but a regular file (a FIFO, a device such as /dev/zero, a socket, a folder) is refused
    with ``error`` before a byte is read: it is looked at with ``stat``, opened with ``O_NONBLOCK`` (so
    a FIFO cannot hang the open) and checked again with ``fstat`` (so a swap between the two is seen).
    A file over ``KIND_LIMITS[kind]`` bytes is refused; ``head`` reads only the first ``head`` bytes.
    """
    p = Path(path)
    limit = KIND_LIMITS[kind]
    try:
        st = os.stat(p)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"The {what} {p} is {_kind_of(st.st_mode)}, not a regular file.")
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise error(f"The {what} {p} cannot be read ({err.strerror or err}).") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"The {what} {p} is {_kind_of(st.st_mode)}, not a regular file.")
        if head is None and st.st_size > limit:
            raise error(
                f"The {what} {p} is {st.st_size / 1e6:,.0f} MB; at most {limit >> 20} MB is read.",
                hint="Give the right file, or a shorter excerpt.",
            )
        want = min(head, limit) if head is not None else limit + 1
        chunks: list[bytes] = []
        got = 0
        while got < want:
            b = os.read(fd, min(1 << 20, want - got))
            if not b:
                break
            chunks.append(b)
            got += len(b)
    except OSError as err:
        raise error(f"The {what} {p} cannot be read ({err.strerror or err}).") from None
    finally:
        os.close(fd)
    if head is None and got > limit:  # grew while being read
        raise error(f"The {what} {p} is larger than {limit >> 20} MB; it is not read.")
    return b"".join(chunks)
