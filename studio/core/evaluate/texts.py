"""Texts to evaluate on: the English sample shipped in resources/eval, a user's file, or WikiText-2."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from studio.core.errors import EvaluationError
from studio.core.textfile import decode_utf8, read_untrusted
from studio.paths import resource_path

SAMPLE_PATH = resource_path("eval", "sample_en.txt")
"""About 3,000 words of plain English prose written for this project."""

SOURCES = ("sample", "wikitext-2")


@dataclass(frozen=True)
class EvalText:
    """A text and where it came from."""

    name: str
    text: str


def load_text(source: str | os.PathLike[str] = "sample") -> EvalText:
    """``"sample"``, ``"wikitext-2"`` (needs ``datasets`` with a cached copy) or a path to a UTF-8 file."""
    if str(source) == "sample":
        return EvalText("sample (resources/eval/sample_en.txt)", _read(SAMPLE_PATH))
    if str(source) in ("wikitext-2", "wikitext2", "wikitext"):
        return _wikitext2()
    return EvalText(Path(source).name, _read(Path(source).expanduser()))


def _read(path: Path) -> str:
    data = read_untrusted(path, "evaluation text", EvaluationError, kind="text")
    text = decode_utf8(
        data,
        path,
        "evaluation text",
        EvaluationError,
        hint="Choose a plain-text file or convert it to UTF-8.",
    )
    if "\x00" in text:
        raise EvaluationError(f"The evaluation text {path} contains NUL bytes; it looks like a binary file.")
    if not text.strip():
        raise EvaluationError(f"The evaluation text {path} is empty.")
    return text


def _wikitext2() -> EvalText:
    try:
        import datasets  # optional, not a dependency of the studio; it imports huggingface_hub
    except ImportError:
        raise EvaluationError(
            "WikiText-2 needs the 'datasets' package, which is not installed.",
            hint="Use the built-in sample or choose a text file.",
        ) from None
    try:
        ds = datasets.load_dataset(
            "wikitext", "wikitext-2-raw-v1", split="test", download_mode="reuse_cache_if_exists"
        )
    except Exception as err:  # noqa: BLE001 - offline or not cached: one sentence
        raise EvaluationError(
            f"WikiText-2 is not available offline ({type(err).__name__}).",
            hint="Download it once with the datasets package, or use the built-in sample or a text file.",
        ) from None
    return EvalText("WikiText-2 (test)", "".join(ds["text"]))
