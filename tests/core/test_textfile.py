"""Reading a user's text file: the size limit and the UTF-8 check raise the caller's error with one sentence."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from studio.core.errors import EvaluationError, StudioError
from studio.core.textfile import MAX_TEXT_BYTES, check_text_size, decode_utf8


def test_decode_names_the_first_bad_byte_with_the_callers_error_and_hint():
    assert decode_utf8("naïve".encode(), Path("t.txt"), "text", EvaluationError, hint="h") == "naïve"
    with pytest.raises(
        EvaluationError, match=r"The text t.txt is not UTF-8 text \(byte 2 cannot be decoded\)\."
    ) as e:
        decode_utf8(b"ab\xe9c", Path("t.txt"), "text", EvaluationError, hint="Save it as UTF-8.")
    assert e.value.hint == "Save it as UTF-8."


def test_size_limit_is_inclusive():
    check_text_size(MAX_TEXT_BYTES, Path("big.txt"), "text", EvaluationError)
    with pytest.raises(EvaluationError, match="at most 64 MB is read"):
        check_text_size(MAX_TEXT_BYTES + 1, Path("big.txt"), "text", EvaluationError)


# --- the one door (issue 39): read_untrusted refuses what is not a regular file before reading a byte


@pytest.mark.parametrize("kind", ["fifo", "device", "socket", "folder"])
def test_read_untrusted_refuses_non_regular_files_at_once(tmp_path, kind):
    import socket
    import time

    from studio.core.textfile import read_untrusted

    if kind == "fifo":
        path = tmp_path / "f"
        os.mkfifo(path)  # no writer: a plain open() would block forever
    elif kind == "device":
        path = Path("/dev/zero")  # endless bytes: a plain read() would grow until killed
    elif kind == "socket":
        path = tmp_path / "s"
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
    else:
        path = tmp_path
    t0 = time.monotonic()
    with pytest.raises(StudioError, match=r"The plan .* is a .*, not a regular file\."):
        read_untrusted(path, "plan", StudioError, kind="json")
    assert time.monotonic() - t0 < 1.0


def test_read_untrusted_caps_bytes_by_kind(tmp_path, monkeypatch):
    from studio.core import textfile

    monkeypatch.setitem(textfile.KIND_LIMITS, "json", 10)
    p = tmp_path / "p.json"
    p.write_bytes(b"x" * 11)
    with pytest.raises(StudioError, match="at most"):
        textfile.read_untrusted(p, "plan", StudioError, kind="json")
    p.write_bytes(b"x" * 10)
    assert textfile.read_untrusted(p, "plan", StudioError, kind="json") == b"x" * 10
    assert textfile.read_untrusted(p, "plan", StudioError, kind="json", head=4) == b"xxxx"
    with pytest.raises(StudioError, match="cannot be read"):
        textfile.read_untrusted(tmp_path / "missing", "plan", StudioError)
