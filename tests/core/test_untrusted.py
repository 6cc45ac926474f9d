"""studio.core.untrusted: what the faces do with text from strangers (issue 25)."""

from __future__ import annotations

import time

import pytest

from studio.core.errors import HubError, StudioError
from studio.core.untrusted import (
    MAX_CARD_CHARS,
    MAX_CARD_LINES,
    card_markdown,
    has_control_chars,
    link_allowed,
    redact_secrets,
    terminal_safe,
)

TOKEN = "hf_" + "Zq8rT2vLm9XwY4bN6cJ1kP3sD5fG7hA0eU"


@pytest.mark.parametrize(
    "text",
    [
        f"HTTP 403: Authorization header 'Bearer {TOKEN}' is not allowed",
        "HTTP 403: Authorization header 'Bearer some-other-secret-42' is not allowed",
        "echo: authorization: Bearer some-other-secret-42",
        "echo {'token': 'x'} token=some-other-secret-42",
        f"the key {TOKEN} leaked",
    ],
)
def test_every_error_sentence_is_redacted(text):
    for err in (StudioError(text), HubError("x", hint=text)):
        assert TOKEN not in str(err) and "some-other-secret-42" not in str(err)
        assert "hf_***" in str(err)


def test_redaction_keeps_ordinary_words():
    for text in (
        "sign in with a Hugging Face token that can read it",
        "download it with the hf_xet-enabled 'hf download' tool instead",
        "the bearer of bad news",
        "the template has no EOS token: <|im_end|>; token: <s> is used",
    ):
        assert redact_secrets(text) == text
    assert redact_secrets("x my-own-token y", "my-own-token") == "x hf_*** y"


def test_terminal_safe_escapes_controls_bidi_and_separators():
    assert terminal_safe("a\x1b]0;t\x07b") == "a\\x1b]0;t\\x07b"
    assert terminal_safe("evil\u202eexe.txt") == "evil\\u202eexe.txt"
    assert terminal_safe("a\u2028b\x9bc") == "a\\u2028b\\x9bc"
    assert terminal_safe("line\nnext", keep_newlines=True) == "line\nnext"
    assert terminal_safe("Grüße, 模型 🙂") == "Grüße, 模型 🙂"
    assert has_control_chars("x\x00") and not has_control_chars("plain name.gguf")


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("https://huggingface.co/x", True),
        ("http://example.org", True),
        ("file:///etc/passwd", False),
        ("../secret.txt", False),
        ("/etc/passwd", False),
        ("javascript:alert(1)", False),
        ("smb://host/share", False),
        ("vscode://file/x", False),
        ("ms-msdt:/id", False),
        ("https:///no-host", False),
        ("https://a.b/\x1b[2J", False),
    ],
)
def test_only_absolute_http_links_are_allowed(url, ok):
    assert link_allowed(url) is ok


def test_card_markdown_drops_html_images_and_front_matter_but_keeps_text():
    card = (
        "---\nlicense: mit\n---\n# Title\n\n<div align='center'><table><tr><td>cell text</td></tr></table></div>\n"
        "<!-- hidden -->![logo](file:///etc/passwd) see <https://example.org>\n"
    )
    md = card_markdown(card)
    assert "license: mit" not in md and "# Title" in md and "cell text" in md
    assert "<table" not in md and "<div" not in md and "hidden" not in md
    assert "file:///etc/passwd" not in md and "logo" in md and "<https://example.org>" in md


@pytest.mark.parametrize(
    "card",
    [
        "<table><tr><td>" * 3000,
        "[" * 2_000_000,
        "[a](" * 500_000,
        "<!--" * 500_000,
        ">" * 2_000_000,
        "|a|b|\n|-|-|\n" + "|x|y|\n" * 300_000,
        "- x\n" * 500_000,
        "  " * 1_000_000 + "- x",
    ],
)
def test_card_markdown_is_bounded_and_fast(card):
    t0 = time.perf_counter()
    md = card_markdown(card)
    assert time.perf_counter() - t0 < 1.0  # linear work over a 2 MB card (about 50 ms here)
    assert len(md) <= MAX_CARD_CHARS + 200 and md.count("\n") <= MAX_CARD_LINES + 4


def test_a_long_table_is_cut_and_its_other_rows_are_text():
    md = card_markdown("|a|b|\n|-|-|\n" + "|x|y|\n" * 1000)
    lines = md.split("\n")
    assert lines[2 + 59] == "|x|y|" and lines[2 + 60] == ""  # a blank line ends the table after 60 rows
    assert lines[2 + 61] == "|x|y|"  # the other rows stay, as text
