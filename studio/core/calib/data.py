"""Calibration data: the built-in text, a user's text file or a JSONL of chats, tokenized as llama-imatrix does.

llama-imatrix tokenizes the whole text once (BOS in front when the model adds one), cuts the tokens
into chunks of ``n_ctx``, puts BOS first in every chunk when the model adds BOS, evaluates each chunk
from an empty context and counts every position. It wants at least two chunks' worth of tokens.
``make_chunks`` follows those rules; where llama-imatrix silently takes fewer chunks than asked for,
we refuse in one sentence instead.

The built-in text (``resources/calibration``) was written for Quant Studio: prose on many subjects,
dialogues (rendered through the model's own chat template, so the special tokens a chat model sees
are calibrated too), code in several languages and prose in several natural languages. Its pieces are
interleaved so that any prefix of chunks is already a mix.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from studio.core import safejson
from studio.core.chat.render import render_chats as render_all
from studio.core.chat.template import fallback_text
from studio.core.errors import CalibrationError
from studio.core.jobs import JobContext
from studio.core.textfile import decode_utf8, read_untrusted
from studio.paths import resource_path

BUILTIN = "builtin"
"""The name that selects the built-in calibration text."""

MAX_JSONL_LINE = 4 << 20
PIECE_SEPARATOR = "\n----\n"  # between pieces inside the built-in text files
_BUILTIN_FILES = ("prose.txt", "dialogues.jsonl", "code.txt", "languages.txt")


@dataclass(frozen=True)
class CalibrationText:
    """A calibration text ready to tokenize, and the dataset name recorded in the imatrix."""

    name: str
    text: str
    parse_special: bool = False  # True: special-token text (from a chat template) becomes special tokens
    warnings: tuple[str, ...] = ()  # e.g. the model's chat template fell back to the built-in format
    # a mix (``mix``): each part is tokenized on its own, with its own parse_special, its tokens in order
    parts: tuple[CalibrationText, ...] = ()

    @property
    def digest(self) -> str:
        """sha256 of the text (cache keys); a mix's also covers where its parts meet and how each is read."""
        h = hashlib.sha256(self.text.encode("utf-8"))
        for p in self.parts:
            h.update(f"|{len(p.text)}:{int(p.parse_special)}".encode())
        return h.hexdigest()


@dataclass(frozen=True)
class Chunks:
    """The token chunks a calibration runs over: ``tokens[i]`` is chunk i, BOS first when the model adds one."""

    tokens: np.ndarray  # int64 (n_chunks, n_ctx)
    n_ctx: int
    n_text_tokens: int  # tokens of the whole text (before cutting)
    bos: int | None
    dataset: str

    @property
    def n_chunks(self) -> int:
        """Number of chunks."""
        return int(self.tokens.shape[0])

    @property
    def n_tokens(self) -> int:
        """Positions evaluated (all of them are counted)."""
        return int(self.tokens.size)


# ------------------------------------------------------------------------------------------ reading


def _read_bytes(path: Path, what: str) -> bytes:
    return read_untrusted(path, what, CalibrationError, kind="text")


def _decode(data: bytes, path: Path, what: str) -> str:
    text = decode_utf8(data, path, what, CalibrationError, hint="Save it as UTF-8.")
    if text.startswith("\ufeff"):
        text = text[1:]
    if not text.strip():
        raise CalibrationError(f"The {what} {path} is empty.")
    return text


def load_text_file(path: str | os.PathLike[str]) -> CalibrationText:
    """A user's UTF-8 text file, used as it is (special-token text stays plain text, as in llama-imatrix)."""
    p = Path(path).expanduser()
    return CalibrationText(str(path), _decode(_read_bytes(p, "calibration text"), p, "calibration text"))


def _messages_of(obj: Any, where: str) -> list[dict[str, str]]:
    msgs = obj.get("messages") if isinstance(obj, dict) else obj
    if not isinstance(msgs, list) or not msgs:
        raise CalibrationError(f'{where} is not a list of chat messages or an object with "messages".')
    out = []
    for m in msgs:
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise CalibrationError(f'{where} has a message without string "role" and "content".')
        for text in (m["role"], m["content"]):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as err:
                raise CalibrationError(
                    f"{where} has a lone surrogate ({text[err.start]!r}) in a message; it is not Unicode text."
                ) from None
        out.append({"role": m["role"], "content": m["content"]})
    return out


def read_chats(path: str | os.PathLike[str]) -> list[list[dict[str, str]]]:
    """Conversations from a JSONL file: one per line, ``{"messages": [{"role", "content"}, ...]}`` or a bare list."""
    p = Path(path).expanduser()
    text = _decode(_read_bytes(p, "chat file"), p, "chat file")
    chats = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if len(line) > MAX_JSONL_LINE:
            raise CalibrationError(f"Line {i} of {p} is longer than {MAX_JSONL_LINE >> 20} MB.")
        obj = safejson.loads(line, f"Line {i} of {p}", CalibrationError)
        chats.append(_messages_of(obj, f"Line {i} of {p}"))
    if not chats:
        raise CalibrationError(f"The chat file {p} has no conversations.")
    return chats


@dataclass(frozen=True)
class ChatFormat:
    """What rendering a conversation needs from the model's tokenizer."""

    template: str | None
    bos_token: str = ""
    eos_token: str = ""
    source: str = "the model"

    @classmethod
    def of_tokenizer(cls, tok: Any, source: str = "the model") -> ChatFormat:
        """The chat template and special tokens of a transformers tokenizer."""
        template = getattr(tok, "chat_template", None)
        if isinstance(template, dict):
            template = template.get("default") or next(iter(template.values()), None)
        return cls(
            template if isinstance(template, str) else None,
            str(getattr(tok, "bos_token", None) or ""),
            str(getattr(tok, "eos_token", None) or ""),
            source,
        )


def render_chats(
    chats: Sequence[Sequence[dict[str, str]]], fmt: ChatFormat, ctx: JobContext | None = None
) -> tuple[list[str], list[str]]:
    """Each conversation rendered through the model's chat template (sandboxed, in one child process
    for all of them, with progress); returns (texts, warnings)."""

    if not fmt.template:
        return [fallback_text(msgs, add_generation_prompt=False) for msgs in chats], []
    texts, warnings = [], []
    for r in render_all(
        fmt.template,
        chats,
        bos_token=fmt.bos_token,
        eos_token=fmt.eos_token,
        add_generation_prompt=False,
        source=fmt.source,
        ctx=ctx,
    ):
        texts.append(r.text)
        if r.warning and r.warning not in warnings:
            warnings.append(r.warning)
    return texts, warnings


def load_chat_file(
    path: str | os.PathLike[str], fmt: ChatFormat, ctx: JobContext | None = None
) -> CalibrationText:
    """A JSONL of conversations, rendered through the model's chat template and joined."""
    texts, warnings = render_chats(read_chats(path), fmt, ctx)
    return CalibrationText(str(path), "\n".join(texts), parse_special=True, warnings=tuple(warnings))


# ------------------------------------------------------------------------------------------ built-in


def builtin_dir() -> Path:
    """The folder of the built-in calibration text."""
    return resource_path("calibration")


def _pieces(path: Path) -> list[str]:
    text = _decode(_read_bytes(path, "built-in calibration file"), path, "built-in calibration file")
    return [p.strip("\n") for p in text.split(PIECE_SEPARATOR) if p.strip()]


def builtin_pieces(
    fmt: ChatFormat, ctx: JobContext | None = None, warnings: list[str] | None = None
) -> dict[str, list[str]]:
    """The built-in pieces per kind (prose, dialogues rendered with ``fmt``, code, languages);
    template warnings are appended to ``warnings``."""
    folder = builtin_dir()
    out: dict[str, list[str]] = {}
    for name in _BUILTIN_FILES:
        path = folder / name
        if not path.is_file():
            raise CalibrationError(
                f"The built-in calibration file {path} is missing.",
                hint="Reinstall Quant Studio so that its resources folder is present.",
            )
        if name.endswith(".jsonl"):
            out[name.split(".")[0]], got = render_chats(read_chats(path), fmt, ctx)
            if warnings is not None:
                warnings.extend(got)
        else:
            out[name.split(".")[0]] = _pieces(path)
    return out


def interleave(groups: Sequence[Sequence[str]]) -> list[str]:
    """Round-robin over the groups (a, b, c, a, b, c, ...) until every piece is used."""
    out: list[str] = []
    longest = max((len(g) for g in groups), default=0)
    for i in range(longest):
        out.extend(g[i] for g in groups if i < len(g))
    return out


def load_builtin(fmt: ChatFormat, ctx: JobContext | None = None) -> CalibrationText:
    """The built-in calibration text, dialogues rendered through ``fmt`` and all kinds interleaved."""
    warnings: list[str] = []
    pieces = builtin_pieces(fmt, ctx, warnings)
    text = "\n\n".join(interleave(list(pieces.values())))
    return CalibrationText(
        "quant-studio built-in calibration text", text, parse_special=True, warnings=tuple(warnings)
    )


def mix(texts: Sequence[CalibrationText]) -> CalibrationText:
    """Several calibration texts as one, in order: each part keeps how it is tokenized (a user's plain text
    keeps special-token text as text, rendered chats parse it), so a mix calibrates as its parts would."""
    flat = [p for t in texts for p in (t.parts or (t,))]
    if not flat:
        raise CalibrationError("A calibration mix needs at least one text.")
    if len(flat) == 1:
        return flat[0]
    return CalibrationText(
        " + ".join(t.name for t in flat),
        "\n\n".join(t.text for t in flat),
        parse_special=any(t.parse_special for t in flat),
        warnings=tuple(w for t in flat for w in t.warnings),
        parts=tuple(flat),
    )


MIXED_METHODS = ("gptq", "awq+gptq")
"""The methods calibrated on the user's text followed by the built-in text unless told otherwise: fitted to
licence prose and judged on Python code, the demo's awq+gptq file had 0.53× llama.cpp's KL on the prose
alone and 0.39× with the built-in text after it (README, issue 23); the 1.5B bench model's GPTQ Q3_K_M file
1.66× on the prose alone and 1.30× with the mix, at the same 4,096 tokens (README, issue 38: GPTQ fits the
kind of text it is shown); the imatrix's plan gained nothing."""


def calibration_sources(
    own: str | os.PathLike[str] | None, method: str | None, *, own_only: bool = False
) -> str | os.PathLike[str] | list[str | os.PathLike[str]]:
    """What ``method`` calibrates on: ``own`` (None: the built-in text), followed by the built-in text for
    the ``MIXED_METHODS`` unless ``own_only``: GPTQ fits what it is shown, and the mix keeps it from
    fitting one kind of text only."""
    if own is None or str(own) == BUILTIN:
        return BUILTIN
    if own_only or method not in MIXED_METHODS:
        return own
    return [own, BUILTIN]


GUESS_BYTES_PER_TOKEN = 4
"""Bytes of text a token covers, for a guess made before any tokenizer is loaded: about right for English
through a 32k–150k-token vocabulary; a tokenizer with a small vocabulary makes more tokens (the 8B fixture's
2.5× as many: 57 chunks of 512 of the built-in text, guessed 23)."""


def guess_chunks(sources: Any, n_ctx: int) -> int:
    """About how many chunks of ``n_ctx`` tokens ``sources`` (``calibration_sources``'s answer) hold, from
    the files' sizes (``GUESS_BYTES_PER_TOKEN``): what an estimate says before the text is tokenized."""
    size = 0
    for src in sources if isinstance(sources, (list, tuple)) else [sources]:
        paths = (
            [p for p in builtin_dir().iterdir() if p.suffix in (".txt", ".jsonl")]
            if str(src) == BUILTIN
            else [Path(src).expanduser()]
        )
        for path in paths:
            try:
                size += path.stat().st_size
            except OSError:  # a missing file is refused, in its own words, when the job reads it
                continue
    return max(1, size // GUESS_BYTES_PER_TOKEN // max(1, n_ctx))


def load_calibration(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    fmt: ChatFormat,
    ctx: JobContext | None = None,
) -> CalibrationText:
    """``"builtin"``, a ``.jsonl`` file of chats, a text file, or a list of these (``mix``, in order)."""
    if isinstance(source, (list, tuple)):
        return mix([load_calibration(s, fmt, ctx) for s in source])
    if str(source) == BUILTIN:
        return load_builtin(fmt, ctx)
    if str(source).lower().endswith(".jsonl"):
        return load_chat_file(source, fmt, ctx)
    return load_text_file(source)


# ------------------------------------------------------------------------------------------ tokens


def tokenize(tok: Any, data: CalibrationText) -> list[int]:
    """Token ids of the whole text, special tokens added as the tokenizer does for plain text.

    Plain text files keep special-token text as text (llama-imatrix's default); rendered chats
    have their special tokens parsed (llama-imatrix's ``--parse-special``).
    """
    if data.parts:
        bos, parts = _part_ids(tok, data)
        return [*(() if bos is None else (bos,)), *(t for ids in parts for t in ids)]
    kw: dict[str, Any] = {"add_special_tokens": True, "verbose": False}
    if not data.parse_special:
        kw["split_special_tokens"] = True
    try:
        return [int(i) for i in tok(data.text, **kw)["input_ids"]]
    except TypeError:  # a tokenizer without split_special_tokens
        kw.pop("split_special_tokens", None)
        return [int(i) for i in tok(data.text, **kw)["input_ids"]]


def _part_ids(tok: Any, data: CalibrationText) -> tuple[int | None, list[list[int]]]:
    """(the BOS, a mix's parts' ids each tokenized as it would be alone, less the BOS in front of it): the
    mix's text runs on, and make_chunks puts BOS first in every chunk."""
    bos = bos_of(tok)
    parts = [tokenize(tok, part) for part in data.parts]
    return bos, [ids[1:] if bos is not None and ids[:1] == [bos] else ids for ids in parts]


def chunk_ids(tok: Any, data: CalibrationText, n_ctx: int) -> list[int]:
    """The token ids ``make_chunks`` cuts into chunks of ``n_ctx``: the text's, or for a mix each part's
    whole chunks interleaved in proportion to their counts, so that the first chunks (``--calib-chunks``,
    the rounding probe's sample) are already a mix; each part's last partial chunk is dropped, as
    llama-imatrix drops the text's."""
    if not data.parts or n_ctx < 16:  # make_chunks refuses a context that small in one sentence
        return tokenize(tok, data)
    keyed: list[tuple[float, int, list[int]]] = []
    for i, ids in enumerate(_part_ids(tok, data)[1]):
        n = len(ids) // n_ctx
        keyed.extend(((k + 0.5) / n, i, ids[k * n_ctx : (k + 1) * n_ctx]) for k in range(n))
    keyed.sort(key=lambda x: (x[0], x[1]))
    return [t for _, _, chunk in keyed for t in chunk]


def bos_of(tok: Any) -> int | None:
    """The BOS id when the tokenizer puts one in front of plain text, else None."""
    bos = getattr(tok, "bos_token_id", None)
    if bos is None:
        return None
    probe = tok("a", add_special_tokens=True)["input_ids"]
    return int(bos) if probe and int(probe[0]) == int(bos) else None


def make_chunks(
    ids: Sequence[int], n_ctx: int, n_chunks: int | None, bos: int | None, dataset: str
) -> Chunks:
    """Cut ``ids`` into chunks of ``n_ctx`` as llama-imatrix does; one sentence when the text is too short."""
    if n_ctx < 16:
        # llama.cpp ignores matrix products over fewer than 16 rows when collecting the imatrix
        raise CalibrationError(f"A context of {n_ctx} tokens is too small to calibrate; use at least 16.")
    n = len(ids)
    if n < 2 * n_ctx:
        raise CalibrationError(
            f"The calibration text {dataset} has {n} tokens; at least {2 * n_ctx} (two chunks of "
            f"{n_ctx}) are needed.",
            hint="Use a longer text or a smaller --ctx.",
        )
    most = n // n_ctx
    if n_chunks is not None:
        if n_chunks < 1:
            raise CalibrationError(f"At least one chunk must be used, not {n_chunks}.")
        if n_chunks > most:
            raise CalibrationError(
                f"The calibration text {dataset} holds {most} chunks of {n_ctx} tokens, not {n_chunks}.",
                hint=f"Ask for at most {most} chunks or give a longer text.",
            )
        most = n_chunks
    arr = np.asarray(ids[: most * n_ctx], dtype=np.int64).reshape(most, n_ctx).copy()
    if bos is not None:
        arr[:, 0] = bos
    return Chunks(arr, n_ctx, n, bos, dataset)


__all__ = [
    "BUILTIN",
    "GUESS_BYTES_PER_TOKEN",
    "MIXED_METHODS",
    "CalibrationText",
    "ChatFormat",
    "Chunks",
    "bos_of",
    "builtin_dir",
    "guess_chunks",
    "builtin_pieces",
    "calibration_sources",
    "chunk_ids",
    "interleave",
    "load_builtin",
    "load_calibration",
    "load_chat_file",
    "load_text_file",
    "make_chunks",
    "mix",
    "read_chats",
    "render_chats",
    "tokenize",
]
