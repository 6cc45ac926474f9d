"""How a GGUF file is loaded into llama.cpp: one typed options object for every caller.

``extra_buffers`` is llama.cpp's ``use_extra_bufts`` (``--no-repack`` turns it off): weights of
some types are repacked into CPU-specific layouts (AMX tiles, interleaved AVX rows). On CPUs with
AMX, llama-cpp-python 0.3.36 crashes in the first decode of such weights (llama.cpp #20824), so
``auto`` decides per machine; see ``studio.core.llamacpp.runner.resolve_extra_buffers``.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from dataclasses import dataclass
from typing import Any

from studio.core.errors import StudioError

EXTRA_BUFFERS_ENV = "QUANT_STUDIO_LLAMA_EXTRA_BUFFERS"
"""on/off here makes ``auto`` mean that in this process and its children (the window's setting
writes it, so panels and the export dialog's verification child follow it without extra wiring)."""


class ExtraBuffers(str, enum.Enum):
    """Whether llama.cpp may repack weights into its extra buffer types."""

    AUTO = "auto"  # off on a CPU with AMX or when this machine crashed with them, else on
    ON = "on"
    OFF = "off"


EXTRA_BUFFER_CHOICES = tuple(e.value for e in ExtraBuffers)


def parse_extra_buffers(value: ExtraBuffers | str | None) -> ExtraBuffers:
    """``auto``/``on``/``off`` (any case; None is auto) as an ``ExtraBuffers``; anything else is refused."""
    if isinstance(value, ExtraBuffers):
        return value
    text = (value or "auto").strip().lower()
    try:
        return ExtraBuffers(text)
    except ValueError:
        raise StudioError(
            f"Extra buffers must be one of {', '.join(EXTRA_BUFFER_CHOICES)}, not {value!r}."
        ) from None


def requested_extra_buffers(value: ExtraBuffers | str | None) -> ExtraBuffers:
    """The request after the process-wide preference: ``auto`` follows ``EXTRA_BUFFERS_ENV`` when it says on/off."""
    choice = parse_extra_buffers(value)
    if choice is ExtraBuffers.AUTO:
        env = os.environ.get(EXTRA_BUFFERS_ENV, "").strip().lower()
        if env in (ExtraBuffers.ON.value, ExtraBuffers.OFF.value):
            return ExtraBuffers(env)
    return choice


@dataclass(frozen=True)
class LoadOptions:
    """Everything about one llama.cpp load except the file; the child's ``load`` op takes these fields."""

    n_ctx: int = 512
    n_gpu_layers: int = 0
    n_threads: int | None = None
    f32_kv: bool = True  # F32 KV cache: the default F16 alone moves logits by ~1e-2
    kv_type: str | None = None  # the lab's KV-cache precision (f32, f16, q8_0, q4_0); overrides f32_kv
    logits_all: bool = False
    embedding: bool = False
    vocab_only: bool = False
    seed: int = 0
    extra_buffers: ExtraBuffers = ExtraBuffers.AUTO

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra_buffers", parse_extra_buffers(self.extra_buffers))

    def replace(self, **changes: Any) -> LoadOptions:
        """A copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)

    def child_args(self, use_extra_buffers: bool) -> dict[str, Any]:
        """The keyword arguments of the child's ``load`` op, with extra buffers decided."""
        args = dataclasses.asdict(self)
        args["extra_buffers"] = bool(use_extra_buffers)
        return args
