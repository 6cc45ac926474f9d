"""The one way the studio loads a GGUF into llama.cpp: ``LlamaRunner`` (chat, evaluation,
verification, embeddings, export validation and the tests all use it).

It owns a ``LlamaWorker`` child and decides ``use_extra_bufts`` for every load
(``resolve_extra_buffers``): an explicit on/off wins, ``auto`` is off when this machine remembers a
crash with them or when its CPU reports AMX, and on otherwise. A child that dies by a signal while
loading, or in the first decode after a load, with extra buffers on is restarted once with them off;
the runner then tells the caller in one sentence (``on_note``/``notes``) and remembers the choice for
this machine (``studio.core.llamacpp.memory``). Any later death is reported as before.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from studio.core.errors import ChildProcessError_
from studio.core.llamacpp.cpu import amx_in_system_info, cpu_has_amx
from studio.core.llamacpp.memory import MachineChoice, remember_choice, remembered_choice
from studio.core.llamacpp.options import ExtraBuffers, LoadOptions, requested_extra_buffers
from studio.core.llamacpp.worker import LlamaWorker

DECODE_OPS = frozenset({"eval_logits", "embed", "chat", "generate_stream", "chat_generate"})
"""Ops that run the model (a crash in the first of these after a load is retried)."""


@dataclass(frozen=True)
class ExtraBuffersDecision:
    """Whether a load uses extra buffers, and why (shown in notes and benches)."""

    use: bool
    why: str  # "asked", "remembered", "amx" or "default"

    def describe(self) -> str:
        """A few words for a note: ``off (this CPU has AMX)``."""
        state = "on" if self.use else "off"
        reason = {
            "asked": "as asked",
            "remembered": "this machine crashed with them before",
            "amx": "this CPU has AMX",
            "default": "llama.cpp's default",
        }.get(self.why, self.why)
        return f"{state} ({reason})"


def resolve_extra_buffers(
    requested: ExtraBuffers, *, amx: bool | None, remembered: MachineChoice | None
) -> ExtraBuffersDecision:
    """Decide ``use_extra_bufts``: explicit on/off, else the remembered choice, else off on AMX, else on."""
    if requested is ExtraBuffers.ON:
        return ExtraBuffersDecision(True, "asked")
    if requested is ExtraBuffers.OFF:
        return ExtraBuffersDecision(False, "asked")
    if remembered is not None:
        return ExtraBuffersDecision(remembered.extra_buffers, "remembered")
    if amx:
        return ExtraBuffersDecision(False, "amx")
    return ExtraBuffersDecision(True, "default")


def _signal_text(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


WorkerFactory = Callable[..., Any]


class LlamaRunner:
    """A llama.cpp child that loads one GGUF at a time the studio's one way; use as a context manager."""

    def __init__(
        self,
        *,
        label: str = "llama.cpp",
        extra_ops: str | None = None,
        worker_factory: WorkerFactory | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        on_note: Callable[[str], None] | None = None,
    ) -> None:
        self.label = label
        self.extra_ops = extra_ops
        self._factory = worker_factory
        self._cache_dir = cache_dir
        self._on_note = on_note
        self._worker: Any = None
        self._notes: list[str] = []
        self._amx: bool | None = None
        self._loaded: tuple[str, str, LoadOptions, dict[str, Any], float | None] | None = None
        self._first_decode = False  # a model loaded with extra buffers on has not decoded yet
        self.decision: ExtraBuffersDecision | None = None
        self.extra_buffers: bool | None = None  # what the loaded model uses (None: nothing loaded)

    # -- the child ----------------------------------------------------------------------------------

    @property
    def worker(self) -> Any:
        """The ``LlamaWorker`` (None before the first load or request)."""
        return self._worker

    @property
    def alive(self) -> bool:
        """Whether the child is running."""
        return self._worker is not None and self._worker.alive

    @property
    def notes(self) -> tuple[str, ...]:
        """The sentences this runner told its caller (restarts without extra buffers)."""
        return tuple(self._notes)

    def _start(self) -> Any:
        if self._worker is not None and self._worker.alive:
            return self._worker
        self._stop_worker()
        if self._factory is not None:
            self._worker = self._factory(label=self.label, extra_ops=self.extra_ops)
        else:
            self._worker = LlamaWorker(label=self.label, extra_ops=self.extra_ops)
        return self._worker

    def _stop_worker(self) -> None:
        if self._worker is not None:
            try:
                self._worker.close(timeout=2.0)
            except Exception:  # noqa: BLE001 - a dead child has nothing left to close
                pass
            self._worker = None

    def __enter__(self) -> LlamaRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the child (the runner can load again afterwards, in a new one)."""
        self._stop_worker()
        self._loaded = None
        self._first_decode = False
        self.extra_buffers = None

    # -- deciding -----------------------------------------------------------------------------------

    def cpu_has_amx(self) -> bool:
        """AMX from the kernel's CPU flags, or (elsewhere) from llama.cpp's own system info in the child."""
        if self._amx is None:
            amx = cpu_has_amx()
            if amx is None:
                amx = amx_in_system_info(str(self._start().request("system_info", timeout=120)))
            self._amx = amx
        return self._amx

    def decide(self, options: LoadOptions) -> ExtraBuffersDecision:
        """Whether a load with ``options`` uses extra buffers (see the module docstring)."""
        requested = requested_extra_buffers(options.extra_buffers)
        if requested is not ExtraBuffers.AUTO:
            return resolve_extra_buffers(requested, amx=None, remembered=None)
        remembered = remembered_choice(self._cache_dir)
        if remembered is not None:
            return resolve_extra_buffers(requested, amx=None, remembered=remembered)
        return resolve_extra_buffers(requested, amx=self.cpu_has_amx(), remembered=None)

    # -- loading ------------------------------------------------------------------------------------

    def load(
        self,
        path: str | Path,
        options: LoadOptions | None = None,
        *,
        op: str = "load",
        timeout: float | None = None,
        **extra: Any,
    ) -> dict[str, Any]:
        """Load ``path`` in the child with ``options`` (``op``: the child's load op, ``extra``: its other args)."""
        options = options or LoadOptions()
        decision = self.decide(options)
        self.decision = decision
        self._loaded = None
        self._first_decode = False
        self.extra_buffers = None
        worker = self._start()
        args = {"path": str(path), **options.child_args(decision.use), **extra}
        try:
            info = worker.request(op, timeout=timeout, **args)
        except ChildProcessError_:
            sig = worker.exit_signal
            if not decision.use or sig is None:
                raise
            info = self._start_without_extra_buffers(op, args, timeout)
            self._tell(sig, "while loading", Path(path).name)
        else:
            self.extra_buffers = decision.use
        self._loaded = (op, str(path), options, extra, timeout)
        self._first_decode = bool(self.extra_buffers)
        return info if isinstance(info, dict) else {}

    def _start_without_extra_buffers(self, op: str, args: dict[str, Any], timeout: float | None) -> Any:
        self._stop_worker()
        args = {**args, "extra_buffers": False}
        info = self._start().request(op, timeout=timeout, **args)
        self.extra_buffers = False
        self._first_decode = False
        return info

    def _reload_without_extra_buffers(self) -> None:
        assert self._loaded is not None
        op, path, options, extra, timeout = self._loaded
        args = {"path": path, **options.child_args(False), **extra}
        self._start_without_extra_buffers(op, args, timeout)

    def _loaded_name(self) -> str:
        return Path(self._loaded[1]).name if self._loaded else "the model"

    def _tell(self, sig: int, when: str, name: str) -> None:
        how = _signal_text(sig)
        note = (
            f"llama.cpp crashed ({how}) {when} {name} with its extra buffer types (repacked weights) on, "
            "so it was restarted once with them off; this machine keeps them off from now on "
            "(the setting 'on' tries them again)."
        )
        remember_choice(False, f"{how} {when} {name}", self._cache_dir)
        self._notes.append(note)
        if self._on_note is not None:
            self._on_note(note)

    # -- requests -----------------------------------------------------------------------------------

    def _need(self) -> Any:
        if self._worker is None:
            return self._start()
        return self._worker

    def _retry_first_decode(self, worker: Any, start: Callable[[Any], Any]) -> Any:
        """``start(worker)``; a crash with extra buffers on restarts the child without them and starts again."""
        try:
            return start(worker)
        except ChildProcessError_:
            sig = worker.exit_signal
            if sig is None:
                raise
            # nothing reached the caller yet, so the whole op can run again in a fresh child
            self._reload_without_extra_buffers()
            result = start(self._worker)
            self._tell(sig, "in the first decode of", self._loaded_name())
            return result

    def request(self, op: str, timeout: float | None = None, **args: Any) -> Any:
        """Run ``op`` in the child; a crash in the first decode with extra buffers on is retried once without."""
        worker = self._need()
        if not (self._first_decode and op in DECODE_OPS):
            return worker.request(op, timeout=timeout, **args)
        result = self._retry_first_decode(worker, lambda w: w.request(op, timeout=timeout, **args))
        self._first_decode = False
        return result

    def stream(self, op: str, timeout: float | None = None, **args: Any) -> Generator[Any, None, Any]:
        """Run a streaming ``op``: its partial items, then its result; the first decode is retried as in ``request``."""
        worker = self._need()
        if not (self._first_decode and op in DECODE_OPS):
            return (yield from worker.stream(op, timeout=timeout, **args))

        def first_item(w: Any) -> tuple[Any, bool, Any]:
            # (the stream, whether it yielded, its first item or, when it yielded none, its result)
            it = w.stream(op, timeout=timeout, **args)
            try:
                return it, True, next(it)
            except StopIteration as end:
                return it, False, end.value

        it, yielded, first = self._retry_first_decode(worker, first_item)
        self._first_decode = False
        if not yielded:
            return first
        yield first
        return (yield from it)
