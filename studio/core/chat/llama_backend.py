"""Any GGUF through llama-cpp-python in a child process (``LlamaWorker``), streaming tokens back.

The file's header is read here first with our bounded reader (template, special tokens, non-UTF-8
warnings); llama.cpp then loads it in the child through ``LlamaRunner`` (the one way, which decides
extra buffers and restarts a first-decode crash once without them). A GPU load that fails is
retried with fewer GPU layers and then a smaller context; a child that dies (crash, abort, out of
memory) becomes a ``ChildProcessError_`` of this back end only.
"""

from __future__ import annotations

import codecs
import contextlib
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from studio.core.chat.backend import StopCheck
from studio.core.chat.batching import WINDOW_S
from studio.core.chat.child_column import ChildColumn, detail, exit_how, make_flag
from studio.core.chat.types import ChatError, Sampling, StopReason, TokenEvent
from studio.core.errors import ChildProcessError_, ModelOpenError, StudioError
from studio.core.gguf.read import read_gguf
from studio.core.jobs import JobContext
from studio.core.llamacpp.kvcache import kv_type as check_kv_type
from studio.core.llamacpp.options import ExtraBuffers, LoadOptions
from studio.core.llamacpp.runner import LlamaRunner
from studio.core.model.gguf_source import check_tokenizer

CHAT_OPS = "studio.core.chat.llama_ops"
MIN_CTX = 256


def _gguf_header(path: Path) -> Any:
    header = read_gguf(path)
    check_tokenizer(header)  # no vocabulary: one sentence, instead of llama.cpp's "failed to load"
    return header


def gpu_attempts(n_gpu_layers: int, n_layers: int, n_ctx: int) -> list[tuple[int, int]]:
    """(GPU layers, context) to try in order: as asked, fewer layers, CPU only, then smaller contexts."""
    out: list[tuple[int, int]] = []

    def add(layers: int, ctx: int) -> None:
        if (layers, ctx) not in out:
            out.append((layers, ctx))

    add(n_gpu_layers, n_ctx)
    if n_gpu_layers != 0:
        layers = n_layers if n_gpu_layers < 0 else min(n_gpu_layers, n_layers)
        while layers > 1:
            layers //= 2
            add(layers, n_ctx)
        add(0, n_ctx)
    ctx = n_ctx
    while ctx // 2 >= MIN_CTX:
        ctx //= 2
        add(0, ctx)
    return out


class LlamaCppBackend(ChildColumn):
    """A GGUF file run by llama.cpp in its own process."""

    kind = "llama.cpp"
    engine = "llama.cpp"

    def __init__(
        self,
        path: str | Path,
        *,
        n_ctx: int = 2048,
        n_gpu_layers: int = 0,
        n_threads: int | None = None,
        f32_kv: bool = True,
        kv_type: str | None = None,
        logits_all: bool = False,
        label: str | None = None,
        extra_ops: str = CHAT_OPS,
        worker_factory: Callable[..., Any] | None = None,
        extra_buffers: ExtraBuffers | str = ExtraBuffers.AUTO,
        on_note: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(path, n_ctx=n_ctx, label=label)
        self.n_gpu_layers_request = int(n_gpu_layers)
        self.n_gpu_layers = 0
        self.n_threads = n_threads
        self.f32_kv = f32_kv
        if kv_type:
            kv_type = check_kv_type(kv_type).name  # an unknown name fails here, before a child starts
        self.kv_type = kv_type  # a ``studio.core.llamacpp.kvcache`` type; None keeps ``f32_kv``
        self.logits_all = logits_all
        self.extra_ops = extra_ops
        self.options = LoadOptions(
            n_ctx=self.n_ctx,
            n_threads=n_threads,
            f32_kv=f32_kv,
            logits_all=logits_all,
            kv_type=kv_type,
            extra_buffers=extra_buffers,
        )
        self._on_note = on_note
        self._runner = LlamaRunner(
            label=f"llama.cpp ({self.path.name})",
            extra_ops=extra_ops,
            worker_factory=worker_factory,
            on_note=self._note,
        )
        self._shm: Any = None
        self.n_vocab = 0
        self.header_warnings: tuple[str, ...] = ()
        self._vocab: tuple[str, ...] | None = None
        self._threads_in_child: int | None = None  # what the loaded child runs with
        # the child sends tokens in batches at most this far apart (``studio.core.chat.batching``)
        self.stream_window_s = WINDOW_S

    def set_threads(self, n: int | None) -> None:
        """llama.cpp's threads (generation and prompt) from the next load, or the next reply if loaded."""
        self.n_threads = int(n) if n else None
        self.options = self.options.replace(n_threads=self.n_threads)

    def _sync_threads(self) -> None:
        if self.n_threads is None or self.n_threads == self._threads_in_child or self.extra_ops != CHAT_OPS:
            return
        self._call("chat_threads", n=self.n_threads)
        self._threads_in_child = self.n_threads

    # -- loading ------------------------------------------------------------------------------------

    @property
    def worker(self) -> Any:
        """The ``LlamaWorker`` running this model (None until loaded)."""
        return self._runner.worker

    @property
    def runner(self) -> LlamaRunner:
        """The ``LlamaRunner`` that loads this model."""
        return self._runner

    def _note(self, text: str) -> None:
        self._notes.append(text)
        if self._on_note is not None:
            self._on_note(text)

    def load(self, ctx: JobContext | None = None) -> None:
        """Validate the header, start the child and load; retry smaller on a GPU failure."""
        if self._loaded:
            return
        header = _gguf_header(self.path)  # CorruptFileError for bad files, before llama.cpp sees them
        meta = header.metadata
        self.header_warnings = tuple(header.warnings)
        self._notes.extend(f"{self.path.name}: {w}" for w in header.warnings)
        self._read_template(meta)
        arch = str(meta.get("general.architecture", ""))
        n_layers = int(meta.get(f"{arch}.block_count", 0) or 0)
        train_ctx = meta.get(f"{arch}.context_length")
        if isinstance(train_ctx, (int, np_integer())) and 0 < int(train_ctx) < self.n_ctx:
            self._notes.append(
                f"The context of {self.label} is limited to the {int(train_ctx)} positions it was trained for."
            )
            self.n_ctx = int(train_ctx)
        if ctx is not None:
            ctx.check_cancelled()
        if self._shm is None:
            # made before the child starts, so the child shares the parent's resource tracker
            self._shm = make_flag()
        attempts = gpu_attempts(self.n_gpu_layers_request, max(n_layers, 1), self.n_ctx)
        threads_at_load = self.options.n_threads
        first_error: str | None = None
        for i, (layers, n_ctx) in enumerate(attempts):
            if ctx is not None:
                ctx.check_cancelled()
            try:
                info = self._runner.load(
                    self.path, self.options.replace(n_ctx=n_ctx, n_gpu_layers=layers), op="chat_load"
                )
            except StudioError as err:
                crashed = not self._runner.alive
                if crashed and layers == 0:
                    how = exit_how(self.worker)
                    self._kill()
                    raise ChildProcessError_(
                        f"{self.path.name} crashed the llama.cpp loader ({how}); the model may be damaged or malicious.",
                        hint="Do not open it again; if it came from a trusted source, update llama-cpp-python.",
                    ) from None
                text = detail(err)
                if "utf-8" in text.lower() and "decode" in text.lower():
                    self._kill()
                    raise ModelOpenError(
                        f"llama.cpp cannot load {self.path.name} because some of its metadata or token text is not valid UTF-8.",
                        hint="Re-export the model; Quant Studio can still show its header.",
                    ) from None
                if i + 1 < len(attempts):
                    first_error = first_error or text
                    if crashed:
                        self._kill()
                    continue
                self._kill()
                raise ModelOpenError(
                    f"llama.cpp could not load {self.path.name}: {text}",
                    hint="The file may use an architecture or type this llama.cpp build does not know; try updating llama-cpp-python.",
                ) from None
            if first_error is not None:
                where = f"{layers} GPU layers" if layers else "the CPU only"
                self._notes.append(
                    f"{self.path.name} did not load as asked ({first_error}); it was loaded with {where} and a context of {n_ctx}."
                )
            self.n_gpu_layers = layers
            self._threads_in_child = threads_at_load
            # llama.cpp pads a small context up (to 256) but llama-cpp-python's token buffers keep the
            # size asked for: writing past it failed with a numpy broadcast error, so keep the smaller
            self.n_ctx = min(int(info.get("n_ctx", n_ctx)), n_ctx)
            self.n_vocab = int(info.get("n_vocab", 0))
            break
        self._loaded = True

    def _read_template(self, meta: dict[str, Any]) -> None:
        template = meta.get("tokenizer.chat_template")
        self.template = template if isinstance(template, str) and template.strip() else None
        tokens = meta.get("tokenizer.ggml.tokens")
        self._vocab = tuple(str(t) for t in tokens) if isinstance(tokens, (list, tuple)) else None

        def token_text(key: str) -> str:
            tid = meta.get(key)
            try:
                return str(tokens[int(tid)]) if tokens is not None and tid is not None else ""
            except (IndexError, ValueError, TypeError):
                return ""

        self.bos_token = token_text("tokenizer.ggml.bos_token_id")
        self.eos_token = token_text("tokenizer.ggml.eos_token_id")

    # -- chat ---------------------------------------------------------------------------------------

    def _call(self, op: str, **args: Any) -> Any:
        self._require_loaded()
        try:
            return self._runner.request(op, **args)
        except ChildProcessError_:
            if not self._runner.alive:
                self._loaded = False
                raise self._died(op) from None
            raise

    def _child(self) -> Any:
        return self._runner

    def vocab_tokens(self) -> tuple[str, ...] | None:
        """Token strings by id, from the GGUF header."""
        return self._vocab

    def _tokenize(self, text: str, add_special: bool) -> list[int]:
        return list(self._call("tokenize", text=text, add_bos=add_special, special=True))

    def stream(
        self, ids: Sequence[int], sampling: Sampling, should_stop: StopCheck | None = None
    ) -> Generator[TokenEvent, None, StopReason]:
        """Stream tokens from the child (sent in batches); Stop sets the shared flag, which the child
        checks per token, and tokens of a batch after Stop are dropped here."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a piece may end mid-character
        return (yield from self._child_stream("chat_generate", ids, sampling, should_stop, decoder.decode))

    def logits(self, ids: Sequence[int]) -> Any:
        """float32 logits (n, vocab) of every position of ``ids`` (needs ``logits_all=True``)."""
        if not self.logits_all:
            raise ChatError(f"{self.label} was loaded without logits for every position.")
        return self._call("eval_logits", ids=[int(i) for i in ids])

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of plain text (BOS added as the file's flags say)."""
        return self._tokenize(text, add_special)

    @property
    def bos_id(self) -> int | None:
        """The BOS id when the file adds one to plain text, else None."""
        probe = self._tokenize("a", True)
        probe0 = self._tokenize("a", False)
        return int(probe[0]) if len(probe) > len(probe0) else None

    # -- teardown -----------------------------------------------------------------------------------

    def _kill(self) -> None:
        with contextlib.suppress(Exception):
            self._runner.close()


def np_integer() -> type:
    """numpy's integer base class (header values may be numpy scalars)."""
    return np.integer
