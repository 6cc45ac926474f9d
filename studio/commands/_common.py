"""What the subcommands share: JSON output, progress lines on stderr, reading and writing small files."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path
from typing import Any, TextIO

from studio.core.atomic import write_atomic
from studio.core.errors import StudioError
from studio.core.jobs import JobContext
from studio.core.model.gguf_source import hf_folder_for
from studio.core.textfile import read_untrusted
from studio.core.untrusted import terminal_safe


def dequantized(model: str, line: ProgressLine) -> str:
    """The float32 Hugging Face folder made (once, cached) from the GGUF ``model``; other models as given."""
    if not str(model).lower().endswith(".gguf"):
        return model

    return hf_folder_for(model, JobContext(on_progress=line.fraction, min_interval=0.2))


def torch_original(model: str, what: str) -> str:
    """The model that ``what`` (a step that runs the model in torch: calibration, GPTQ, a scan) runs on:
    for a GGUF file its float32 Hugging Face folder, converted once into the cache (streamed, tensor by
    tensor) after a one-line note on stderr; any other model as given."""
    if not str(model).lower().endswith(".gguf"):
        return model
    name = Path(model).name
    print(
        f"note: {terminal_safe(name)} is a GGUF file and {what} runs the model in torch: using its float32 "
        "Hugging Face folder, converted from it once into the cache (later runs reuse it).",
        file=sys.stderr,
    )
    with ProgressLine() as line:
        return str(dequantized(model, line))


def print_notes(notes: Iterable[str]) -> None:
    """Print each note on stderr as ``note: ...`` (things the user should know, not errors)."""
    for n in notes:
        print(f"note: {n}", file=sys.stderr)


def print_json(obj: Any, *, indent: int | None = 2) -> None:
    """Print ``obj`` as JSON on stdout (the whole of what ``--json`` prints)."""
    print(json.dumps(obj, indent=indent))


def format_table(header: Sequence[str], rows: Iterable[Sequence[str]], *, right: Collection[int] = ()) -> str:
    """Columns separated by two spaces, each as wide as its widest cell; ``right`` lists right-aligned ones."""
    cells = [list(header), *(list(r) for r in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    last = len(header) - 1

    def line(row: list[str]) -> str:
        parts = [
            c.rjust(widths[i]) if i in right else (c if i == last else c.ljust(widths[i]))
            for i, c in enumerate(row)
        ]
        return "  ".join(parts)

    return "\n".join(line(r) for r in cells)


class ProgressLine:
    """Progress on stderr: one line rewritten in place on a terminal, plain throttled lines in a log.

    Use it as a context manager so that the line is ended before anything else is printed, also when
    the work fails (the error then starts on a line of its own).
    """

    def __init__(
        self, *, width: int = 100, interval: float = 0.5, stream: TextIO | None = None, preface: str = ""
    ) -> None:
        """``preface``: a line said once, just before the first progress or log line (a job's estimate):
        a job refused before its work starts says only its one sentence."""
        self.stream = stream or sys.stderr
        self._preface = preface
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.width = width
        self.interval = interval
        self._last = -float("inf")
        self._open = False

    def show(self, text: str, *, final: bool = False) -> None:
        """Show ``text``; intermediate updates closer than ``interval`` seconds are dropped."""
        now = time.monotonic()
        if not final and now - self._last < self.interval:
            return
        self._last = now
        self._say_preface()
        text = terminal_safe(text)  # file names and messages may come from the Hub or a model's files
        if self.tty:
            self.stream.write("\r" + text[: self.width].ljust(self.width))
            self._open = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def fraction(self, done: int, total: int, msg: str) -> None:
        """A ``JobContext`` progress callback: ``[ 42.0%] msg``."""
        pct = 100.0 * done / total if total else 100.0
        self.show(f"[{pct:5.1f}%] {msg}", final=done >= total)

    def log(self, msg: str) -> None:
        """A message of its own line (a ``JobContext`` log callback), below the progress line."""
        self.end()
        self._say_preface()
        self.stream.write(terminal_safe(msg, keep_newlines=True) + "\n")
        self.stream.flush()

    def _say_preface(self) -> None:
        if self._preface:
            self.stream.write(terminal_safe(self._preface) + "\n")
            self._preface = ""

    def end(self) -> None:
        """Finish the rewritten line, if one is open."""
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False

    def __enter__(self) -> ProgressLine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.end()


def read_text(path: str | os.PathLike[str], what: str) -> str:
    """The UTF-8 text of a small input file, or a StudioError naming ``what`` and the path."""
    p = Path(path)
    data = read_untrusted(p, what, StudioError, kind="json" if p.suffix.lower() == ".json" else "text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise StudioError(f"The {what} {p} is not UTF-8 text.") from None


def write_text(path: str | os.PathLike[str], text: str, what: str) -> None:
    """Write a small output file atomically (``write_atomic``); errors name ``what`` and the path."""
    p = Path(path).expanduser()
    try:
        if p.is_dir():
            raise IsADirectoryError(21, "it is a folder")
        write_atomic(p, text)
    except OSError as err:
        raise StudioError(f"Cannot write the {what} {p}: {err.strerror or err}.") from None
