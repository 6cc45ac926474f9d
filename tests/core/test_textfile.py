"""Reading a user's text file: the size limit and the UTF-8 check raise the caller's error with one sentence."""

from __future__ import annotations

from pathlib import Path

import pytest

from studio.core.errors import EvaluationError
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
