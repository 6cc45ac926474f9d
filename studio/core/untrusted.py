"""Text that came from someone else (the Hub, a model card, a file name): made safe to show.

Three rules, each one function. ``terminal_safe`` escapes control characters (a Hub file name or
license must not move the cursor, retitle the terminal or hide text). ``redact_secrets`` takes bearer
tokens out of any sentence (a server that echoes the Authorization header must not get the token
printed). ``card_markdown`` turns a model card into a bounded Markdown subset that any renderer lays out
in bounded time: no raw HTML (nested ``<table>`` tags lay out in exponential time in Qt), no images
(which a renderer would load from local paths), capped size, line length and nesting depth.
``link_allowed`` says which card links may leave the application.
"""

from __future__ import annotations

import re
import unicodedata
from urllib.parse import urlsplit

# A card beyond this is cut (with a note): enough for every real card, small enough for any layout.
MAX_CARD_CHARS = 48_000
# Longer lines are broken: one 2 MB line of brackets is a pathological inline parse.
MAX_LINE_CHARS = 2_000
# Nesting deeper than this (quotes, list indentation) is flattened.
MAX_QUOTE_DEPTH = 4
MAX_INDENT = 16
# Runs of one punctuation character longer than this are shortened ("[[[[…" is never content).
MAX_RUN = 32
# Lines of the whole card; rows per Markdown table, and table cells of the whole card (a table row
# costs Qt about a millisecond to lay out, so a long table is cut and the rest shown as text).
MAX_CARD_LINES = 1200
MAX_TABLE_ROWS = 60
MAX_TABLE_CELLS = 3000
MAX_TABLES = 40
# More "[" than this on one line are shown as text, not parsed as links.
MAX_BRACKETS = 64

_FRONT_MATTER = re.compile(r"\A---[ \t]*\n.{0,65536}?\n---[ \t]*(\n|\Z)", re.DOTALL)
_TAG = re.compile(r"</?(?!https?://)[A-Za-z!][^<>]{0,2000}>")
_IMAGE = re.compile(r"!\[([^\[\]\n]{0,500})\]\([^()\n]{0,2000}\)")
_BEARER = re.compile(r"(?i)\b(bearer\s+)[^\s'\",;)\]}]{4,}")
# "Authorization: X" and "token=X" (a query string); not "token: X", which names special tokens in chat errors.
_KEY_VALUE = re.compile(
    r"(?i)\b((?:authorization\s*[:=]|(?:access_|auth_|hf_|api_)?token\s*=)\s*)(?!bearer\b)[^\s'\",;)\]}]{4,}"
)
_HF_TOKEN = re.compile(r"\b(hf|api_org)_[A-Za-z0-9]{20,}\b")
_RUN = re.compile(r"([^\w\s])\1{" + str(MAX_RUN) + ",}")
_QUOTE = re.compile(r"^(?:[ \t]{0,3}>)+")
_DELIMITER_ROW = re.compile(r"^ {0,3}\|?[ \t]*:?-+:?[ \t]*(?:\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$")
# What a renderer must not see (controls, bidi and zero-width marks, separators); a regex, not a loop.
_RENDER_CONTROL = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]"
)

_SAFE_SCHEMES = ("http", "https")


def _escape_char(c: str) -> str:
    o = ord(c)
    if o < 0x100:
        return f"\\x{o:02x}"
    return f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


def _is_control(c: str) -> bool:
    # Cc: C0/C1 controls and DEL; Cf: bidi overrides, zero-width marks; Zl/Zp: line/paragraph separators.
    return unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp")


def has_control_chars(text: str) -> bool:
    """Whether ``text`` holds a control, format (bidi) or line-separator character."""
    return any(_is_control(c) for c in text)


def terminal_safe(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with control characters written as ``\\xNN``/``\\uNNNN``; ``keep_newlines`` keeps line ends."""
    if not has_control_chars(text):
        return text
    return "".join(
        c if (keep_newlines and c == "\n") or not _is_control(c) else _escape_char(c) for c in text
    )


def redact_secrets(text: str, token: str | None = None) -> str:
    """``text`` without bearer tokens: ``token`` itself, anything after "Bearer", and Hub token shapes."""
    if token and len(token) >= 4:
        text = text.replace(token, "hf_***")
    low = text.lower()
    if "bearer" in low:
        text = _BEARER.sub(lambda m: m.group(1) + "hf_***", text)
    if "token" in low or "authorization" in low:
        text = _KEY_VALUE.sub(lambda m: m.group(1) + "hf_***", text)
    if "_" in text:
        text = _HF_TOKEN.sub("hf_***", text)
    return text


def link_allowed(url: str) -> bool:
    """Whether a card link may be opened outside the application: an absolute http(s) address with a host."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return False
    return parts.scheme.lower() in _SAFE_SCHEMES and bool(parts.hostname) and not has_control_chars(url)


def short(text: str, limit: int = 120) -> str:
    """``text`` cut to ``limit`` characters (with an ellipsis), for one-line labels."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _strip_comments(text: str) -> str:
    # str.find, not a regex: many unterminated "<!--" must stay linear.
    out, pos = [], 0
    while True:
        i = text.find("<!--", pos)
        if i < 0:
            out.append(text[pos:])
            return "".join(out)
        out.append(text[pos:i])
        j = text.find("-->", i + 4)
        if j < 0:
            return "".join(out)
        pos = j + 3


def _line(line: str) -> str:
    if len(line) > MAX_LINE_CHARS:
        line = line[:MAX_LINE_CHARS] + " …"
    if line.count("[") > MAX_BRACKETS:  # link brackets are matched in quadratic time: these are text
        line = line.replace("[", "\\[")
    m = _QUOTE.match(line)
    if m and m.group(0).count(">") > MAX_QUOTE_DEPTH:
        line = "> " * MAX_QUOTE_DEPTH + line[m.end() :].lstrip()
    stripped = line.lstrip(" \t")
    indent = len(line) - len(stripped)
    if indent > MAX_INDENT:
        line = " " * MAX_INDENT + stripped
    return line


def _tables(lines: list[str]) -> list[str]:
    """Cut long Markdown tables (a blank line ends one; its other rows stay as text) and stop new
    tables once the card's cell budget is spent (their delimiter row is made plain text)."""
    out: list[str] = []
    cells = rows = tables = 0
    in_table = False
    prev_pipe = False
    for ln in lines:
        if "|" not in ln:
            in_table = prev_pipe = False
            out.append(ln)
            continue
        if not in_table and prev_pipe and _DELIMITER_ROW.match(ln):
            if cells >= MAX_TABLE_CELLS or tables >= MAX_TABLES:
                ln = ln.replace("-", "=")  # no longer a delimiter row: no new table
            else:
                in_table, rows = True, 0
                tables += 1
                cells += 2 * ln.count("|") + 2  # the header row and this one
        elif in_table:
            rows += 1
            cells += ln.count("|")
            if rows > MAX_TABLE_ROWS or cells > MAX_TABLE_CELLS:
                out.append("")  # the table ends here
                in_table = False
        prev_pipe = True
        out.append(ln)
    return out


def card_markdown(text: str, *, max_chars: int = MAX_CARD_CHARS) -> str:
    """A model card (or license) as a Markdown subset that lays out in bounded time; see the module doc.

    The work here is linear in the input, and the result is at most about ``max_chars`` characters
    and ``MAX_CARD_LINES`` lines.
    """
    total = len(text)
    # Cut first, so every step below sees a bounded text; spare room for what they remove.
    text = text[: 3 * max_chars + 65536]
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _FRONT_MATTER.sub("", text, count=1)
    text = _strip_comments(text)
    text = _IMAGE.sub(lambda m: m.group(1), text)
    text = _TAG.sub("", text)
    text = _RUN.sub(lambda m: m.group(0)[:MAX_RUN], text)
    text = _RENDER_CONTROL.sub("", text)
    lines = _tables([_line(ln) for ln in text.split("\n", MAX_CARD_LINES)[:MAX_CARD_LINES]])
    text = "\n".join(lines)
    cut = len(text) > max_chars or total > 3 * max_chars + 65536 or len(lines) >= MAX_CARD_LINES
    if cut:
        text = text[:max_chars]
        nl = text.rfind("\n")
        if nl > max_chars // 2:
            text = text[:nl]
        text += (
            f"\n\n*(The card is cut here: it has {total:,} characters; open it on the Hub to read it all.)*\n"
        )
    return text


__all__ = [
    "MAX_CARD_CHARS",
    "card_markdown",
    "has_control_chars",
    "link_allowed",
    "redact_secrets",
    "short",
    "terminal_safe",
]
