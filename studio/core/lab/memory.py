"""Memory calculator: weights, KV cache and overhead of a model at each precision, and which GPU it fits.

The numbers are exactly these formulas (``FORMULAS`` holds them as text for the window to show,
``MemoryReport.worked`` fills them in):

    weights  = parameters × bits per weight ÷ 8
    KV cache = 2 (K and V) × layers × KV heads × head dim × context × bytes per cached value
               (F32 4, F16 2, Q8_0 34/32, Q4_0 18/32 bytes); the context is rounded up to a multiple
               of 256, as llama.cpp allocates it; 0 for encoder-only models
    overhead = 5 % of the weights + 67.1 MB (64 × 2²⁰ bytes) + vocabulary × 512 × 4 bytes
               (llama.cpp's compute buffers and the logits of one 512-token batch)
    total    = weights + KV cache + overhead
    fits a "G GB" card when total ≤ G × 1.074 GB − 537 MB (a card sold as G GB holds G × 2³⁰
    bytes; 537 MB = 512 × 2²⁰ bytes stay for the driver's context and the display)

Sizes are shown in decimal units (MB, GB), as everywhere in the studio.

Bits per weight: a format's own storage (FP16 16, Q8_0 34 bytes per 32 values = 8.5, Q6_K 210 per 256
= 6.5625, Q4_0 18 per 32 = 4.5) or, for llama.cpp's mixed presets (Q5_K_M, Q4_K_M, Q3_K_M, Q2_K),
the average those presets reach on 7-8B Llama models. When the model itself is known (its tensors),
every GGUF preset's weights are instead the sum over its tensors of the bytes of the type llama.cpp's
rules give each one (``studio.core.plan.estimate``), and bits per weight is 8 × that ÷ parameters, so the
first formula still holds. "This machine" is ``studio.core.plan.estimate.verdict_for`` on the total.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from studio.core import hardware
from studio.core.errors import StudioError
from studio.core.gguf.read import read_gguf
from studio.core.hub import api
from studio.core.llamacpp.kvcache import KV_TYPES, kv_type
from studio.core.model.checkpoint import gguf_config
from studio.core.modelinfo import config_int as _cfg_int
from studio.core.plan import memory as memory_model  # the one memory model (this module has its own names)
from studio.core.plan.estimate import _TYPICAL_BPW as typical
from studio.core.plan.estimate import LOW_BIT_PRESETS, estimate_preset, verdict_for
from studio.core.plan.estimate import kv_cache_bytes as f16_kv
from studio.core.quant.types import qtype_info
from studio.core.units import format_memory

if TYPE_CHECKING:
    from studio.core.hardware import HardwareInfo
    from studio.core.jobs import JobContext
    from studio.core.modelinfo import ModelInfo

__all__ = [
    "CONTEXTS",
    "FORMULAS",
    "GPU_RESERVE_BYTES",
    "GPU_SIZES_GB",
    "PRECISIONS",
    "MemoryReport",
    "MemoryRow",
    "ModelShape",
    "Precision",
    "kv_cache_bytes",
    "memory_report",
    "shape_from_config",
    "shape_from_hub",
    "shape_from_info",
]

GPU_SIZES_GB: tuple[int, ...] = (8, 12, 16, 24, 48, 80)
GPU_RESERVE_BYTES = 512 * 1024**2
CONTEXTS: tuple[int, ...] = (2048, 4096, 8192, 16384, 32768, 65536, 131072)
CTX_PADDING = 256
GIB = 1024**3

FORMULAS = """\
weights  = parameters × bits per weight ÷ 8
KV cache = 2 (K and V) × layers × KV heads × head dim × context × bytes per cached value
           (F32 4, F16 2, Q8_0 34/32, Q4_0 18/32); context rounded up to a multiple of 256
overhead = 5 % of weights + 67.1 MB + vocabulary × 512 × 4 bytes
total    = weights + KV cache + overhead
fits a G GB card when total ≤ G × 1.074 GB − 537 MB
           (a "G GB" card holds G × 2³⁰ bytes; 512 × 2²⁰ bytes stay for the driver and display)"""
"""The formulas, as text for the window to show beside the numbers."""


@dataclass(frozen=True)
class Precision:
    """One row of the calculator: a precision and the bits per weight it costs without a model."""

    name: str
    bpw: float
    source: str  # "format": its own storage; "typical": the average of llama.cpp's preset on 7-8B Llama;
    # "stated": what llama-quantize --help states for the preset
    preset: str | None = None  # the GGUF preset whose exact per-tensor sizes a known model gets
    note: str = ""


def _format_bpw(type_name: str) -> float:
    return qtype_info(type_name).bits_per_weight


def _precisions() -> tuple[Precision, ...]:
    return (
        Precision("FP32", 32.0, "format", None, "training precision"),
        Precision("FP16/BF16", 16.0, "format", "F16"),
        Precision("FP8", 8.0, "format", None, "E4M3 with one scale per tensor; not a llama.cpp type"),
        Precision("INT8/Q8_0", _format_bpw("Q8_0"), "format", "Q8_0"),
        Precision("Q6_K", _format_bpw("Q6_K"), "format", "Q6_K"),
        Precision("Q5_K_M", typical["Q5_K_M"], "typical", "Q5_K_M"),
        Precision("Q4_K_M", typical["Q4_K_M"], "typical", "Q4_K_M"),
        Precision("INT4/Q4_0", _format_bpw("Q4_0"), "format", "Q4_0"),
        Precision("Q3_K_M", typical["Q3_K_M"], "typical", "Q3_K_M"),
        Precision("Q2_K", typical["Q2_K"], "typical", "Q2_K"),
        *(
            Precision(name, bpw, "stated", name)
            for name, bpw in _LOW_BIT_STATED.items()
            if name in LOW_BIT_PRESETS
        ),
    )


# llama-quantize --help's bits per weight of its low-bit presets (pinned build; Q2_K_S: the help gives
# it Q2_K's size; MXFP4_MOE: MXFP4's own 4.25, the experts' share of a mixture-of-experts model)
_LOW_BIT_STATED = {
    "IQ4_XS": 4.25,
    "IQ4_NL": 4.5,
    "IQ3_M": 3.66,
    "IQ3_S": 3.44,
    "IQ3_XS": 3.3,
    "IQ3_XXS": 3.06,
    "Q2_K_S": 3.35,
    "IQ2_M": 2.7,
    "IQ2_S": 2.5,
    "Q2_0": 2.25,
    "IQ2_XS": 2.31,
    "TQ2_0": 2.06,
    "IQ2_XXS": 2.06,
    "IQ1_M": 1.75,
    "TQ1_0": 1.69,
    "IQ1_S": 1.56,
    "Q1_0": 1.125,
    "MXFP4_MOE": 4.25,
}


PRECISIONS: tuple[Precision, ...] = _precisions()


@dataclass(frozen=True)
class ModelShape:
    """What the calculator needs to know about a model."""

    name: str
    params: int
    layers: int
    kv_heads: int
    head_dim: int
    vocab: int = 0
    has_kv_cache: bool = True  # False for encoder-only models (BERT), which keep no cache
    info: ModelInfo | None = field(default=None, compare=False, repr=False)  # tensors, for exact sizes

    def __post_init__(self) -> None:
        for what, v in (("parameters", self.params), ("layers", self.layers)):
            if v <= 0:
                raise StudioError(f"The number of {what} must be positive, not {v}.")
        if self.has_kv_cache and (self.kv_heads <= 0 or self.head_dim <= 0):
            raise StudioError(
                f"KV heads and head dim must be positive, not {self.kv_heads} and {self.head_dim}."
            )
        if self.vocab < 0:
            raise StudioError(f"The vocabulary size cannot be negative ({self.vocab}).")


def shape_from_config(
    config: Mapping[str, Any], params: int, *, name: str = "model", info: ModelInfo | None = None
) -> ModelShape:
    """The shape from a config.json (or a GGUF's ``gguf_config``) and a parameter count."""
    cfg = dict(config.get("text_config") or config)
    layers = _cfg_int(cfg, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _cfg_int(cfg, "hidden_size", "n_embd", "d_model")
    heads = _cfg_int(cfg, "num_attention_heads", "n_head")
    kv_heads = _cfg_int(cfg, "num_key_value_heads", "n_head_kv") or heads
    head_dim = _cfg_int(cfg, "head_dim") or (hidden // heads if hidden and heads else None)
    if not (layers and kv_heads and head_dim):
        raise StudioError(
            f"The config of {name} does not give its layers, attention heads and head size.",
            hint="Give them with --params, --layers, --kv-heads and --head-dim.",
        )
    # estimate's rule for which models keep no KV cache (encoder-only), so both agree
    has_kv = f16_kv(cfg, layers, 1) > 0
    return ModelShape(
        name, int(params), layers, kv_heads, head_dim, _cfg_int(cfg, "vocab_size") or 0, has_kv, info
    )


def shape_from_info(info: ModelInfo) -> ModelShape:
    """The shape of an opened checkpoint (``studio.core.model.open_model(...).info``); exact sizes."""
    cfg = dict(info.config)
    if info.n_layers and not _cfg_int(cfg, "num_hidden_layers", "n_layer", "num_layers"):
        cfg["num_hidden_layers"] = info.n_layers
    return shape_from_config(cfg, info.parameters, name=info.path.name, info=info)


def shape_from_hub(repo_id: str, *, token: str | None = None, ctx: JobContext | None = None) -> ModelShape:
    """The shape of a Hub model from its config.json and parameter count (no weights downloaded)."""

    d = api.model_details(repo_id, token=token, with_card=False, ctx=ctx)
    if not d.params or not d.config:
        raise StudioError(
            f"The Hub does not say how many parameters {repo_id} has, or it has no config.json.",
            hint="Give its shape with --params, --layers, --kv-heads and --head-dim.",
        )
    return shape_from_config(d.config, d.params, name=repo_id)


def allocated_context(ctx_len: int) -> int:
    """The context llama.cpp allocates the cache for: ``ctx_len`` rounded up to a multiple of 256."""
    return -(-ctx_len // CTX_PADDING) * CTX_PADDING


def kv_cache_bytes(shape: ModelShape, ctx_len: int, kv: str = "f16") -> int:
    """2 × layers × KV heads × head dim × allocated context × bytes per value (0 without a cache)."""
    if ctx_len <= 0:
        raise StudioError(f"The context must be a positive number of tokens, not {ctx_len}.")
    kv_type(kv)  # an unknown type is refused also for a model without a cache
    if not shape.has_kv_cache:
        return 0
    return memory_model.kv_bytes(
        [allocated_context(ctx_len)] * shape.layers, shape.kv_heads, shape.head_dim, kv
    )


def overhead_bytes(weights: int, shape: ModelShape) -> int:
    """5 % of the weights + 64 × 2²⁰ bytes + vocabulary × 512 × 4 bytes (no logits term without a cache)."""
    return memory_model.overhead_bytes(weights, shape.vocab if shape.has_kv_cache else 0)


def fits_card(total: int, size_gb: int) -> bool:
    """Whether ``total`` bytes fit a card sold as ``size_gb`` GB (G × 2³⁰ bytes minus the reserve)."""
    return total <= size_gb * GIB - GPU_RESERVE_BYTES


@dataclass(frozen=True)
class MemoryRow:
    """One precision: its weights, the shared KV cache, overhead, total and where it fits."""

    precision: str
    bpw: float
    bpw_source: str  # "format", "typical", "stated" or "plan" (this model's per-tensor types)
    weights_bytes: int
    kv_cache_bytes: int
    overhead_bytes: int
    total_bytes: int
    fits: dict[str, bool]  # "8GB" … "80GB"
    this_machine: str  # an ``estimate.Verdict`` value, e.g. "fits on the GPU"
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (what ``memory --json`` prints per row)."""
        return {
            "precision": self.precision,
            "bpw": round(self.bpw, 6),
            "bpw_source": self.bpw_source,
            "weights_bytes": self.weights_bytes,
            "kv_cache_bytes": self.kv_cache_bytes,
            "overhead_bytes": self.overhead_bytes,
            "total_bytes": self.total_bytes,
            "fits": {**self.fits, "this_machine": self.this_machine},
            "note": self.note,
        }


@dataclass(frozen=True)
class MemoryReport:
    """The calculator's answer for one model, context and KV-cache type."""

    shape: ModelShape
    ctx_len: int
    ctx_allocated: int
    kv_type: str
    kv_cache_bytes: int
    rows: tuple[MemoryRow, ...]
    machine: str  # ``HardwareInfo.describe()``

    def row(self, precision: str) -> MemoryRow:
        """The row of ``precision`` (e.g. ``"Q4_K_M"``); KeyError if there is none."""
        for r in self.rows:
            if r.precision == precision:
                return r
        raise KeyError(precision)

    def worked(self, precision: str) -> str:
        """The formulas with this report's numbers filled in, for one precision."""
        r = self.row(precision)
        s = self.shape
        t = kv_type(self.kv_type)
        kv = (
            f"KV cache = 2 × {s.layers} layers × {s.kv_heads} KV heads × {s.head_dim} head dim × "
            f"{self.ctx_allocated} tokens × {t.block_bytes}/{t.block_size} bytes ({self.kv_type.upper()})"
            if s.has_kv_cache
            else "KV cache = 0 (encoder-only model)"
        )
        return "\n".join(
            (
                f"weights  = {s.params:,} parameters × {r.bpw:.4g} bits ÷ 8 = {format_memory(r.weights_bytes)}",
                f"{kv} = {format_memory(r.kv_cache_bytes)}",
                f"overhead = 5 % × weights + 67.1 MB + {s.vocab if s.has_kv_cache else 0:,} × 512 × 4 bytes "
                f"= {format_memory(r.overhead_bytes)}",
                f"total    = {format_memory(r.total_bytes)}",
            )
        )

    def to_dict(self) -> dict[str, Any]:
        """What ``memory --json`` prints."""
        s = self.shape
        return {
            "model": s.name,
            "params": s.params,
            "layers": s.layers,
            "kv_heads": s.kv_heads,
            "head_dim": s.head_dim,
            "vocab": s.vocab,
            "ctx": self.ctx_len,
            "ctx_allocated": self.ctx_allocated,
            "kv_type": self.kv_type,
            "kv_cache_bytes": self.kv_cache_bytes,
            "gpu_sizes_gb": list(GPU_SIZES_GB),
            "gpu_reserve_bytes": GPU_RESERVE_BYTES,
            "machine": self.machine,
            "formulas": FORMULAS,
            "rows": [r.to_dict() for r in self.rows],
        }


def _plan_weights(shape: ModelShape, preset: str, hw: HardwareInfo) -> int | None:
    """Tensor bytes of ``preset`` by the exporter's per-tensor rules, when the tensors are known."""
    if shape.info is None:
        return None

    return estimate_preset(shape.info, preset, hw, CTX_PADDING, header=False).tensor_bytes


def memory_report(
    shape: ModelShape, ctx_len: int, kv: str = "f16", hw: HardwareInfo | None = None
) -> MemoryReport:
    """Every precision of ``PRECISIONS`` for ``shape`` at ``ctx_len`` tokens with a ``kv`` cache."""
    if hw is None:
        hw = hardware.detect(probe_torch=False)
    kv = str(kv).lower()
    if kv not in KV_TYPES:
        kv_type(kv)  # raises the StudioError naming the choices
    cache = kv_cache_bytes(shape, ctx_len, kv)
    rows = []
    for p in PRECISIONS:
        plan = _plan_weights(shape, p.preset, hw) if p.preset else None
        if plan is not None:
            weights, bpw, source = plan, 8.0 * plan / shape.params, "plan"
        else:
            weights, bpw, source = int(shape.params * p.bpw / 8), p.bpw, p.source
        over = overhead_bytes(weights, shape)
        total = weights + cache + over
        rows.append(
            MemoryRow(
                precision=p.name,
                bpw=bpw,
                bpw_source=source,
                weights_bytes=weights,
                kv_cache_bytes=cache,
                overhead_bytes=over,
                total_bytes=total,
                fits={f"{g}GB": fits_card(total, g) for g in GPU_SIZES_GB},
                this_machine=verdict_for(total, hw).value,
                note=p.note,
            )
        )
    return MemoryReport(shape, ctx_len, allocated_context(ctx_len), kv, cache, tuple(rows), hw.describe())


def gguf_kv_cache_bytes(path: Any, ctx_len: int, kv: str = "f16") -> int:
    """The KV cache llama.cpp allocates for the GGUF at ``path`` (dims from its header), by the formula."""
    header = read_gguf(path)
    params = sum(t.n_elements for t in header.tensors) or 1
    shape = shape_from_config(gguf_config(header.metadata), params, name=str(path))
    return kv_cache_bytes(shape, ctx_len, kv)
