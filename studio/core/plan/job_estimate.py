"""Peak memory and time of a calibrated job, known from the model's shapes before it starts.

The layer runner holds, at its peak, the largest of three phases (on a CPU, in float32): the
embeddings while the chunks are embedded; one decoder layer with its inputs' Hessians, GPTQ's inverse
factor and working copies; the output head with its logits. Every phase also holds the hidden states
of all chunks twice (a layer's inputs and outputs). With ``--device cuda`` the layers run in GPU
memory and the process keeps only the hidden states and the spool. ``check_fits`` turns an estimate
above the free RAM into one sentence with what would fit, before anything starts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from studio.core.errors import CalibrationError, EvaluationError
from studio.core.quant.methods import method_info
from studio.core.units import format_bytes

__all__ = [
    "SPOOL_ABOVE",
    "JobEstimate",
    "LayerShapes",
    "check_fits",
    "check_whole_fits",
    "estimate_calibrated",
    "fit_remedy",
    "estimate_whole",
    "LATTICE_SECONDS",
    "lattice_seconds",
    "lattice_weights",
    "layer_shapes",
    "smaller_calibration",
    "spool_states",
    "thin_calibration",
]

BASE_BYTES = 900 * 1024**2  # torch, transformers and the tokenizer, imported (measured: 0.8-0.9 GB)
_F32 = 4
_F64 = 8  # Hessians are summed in float64
_GPTQ_COPIES = 4  # a GPTQ slab's working copies (weights, codes, errors, scales)
_SLAB_ROWS = 16384  # as studio.core.calib.quantize rounds tall matrices
_CPU_MACS_PER_S = 2.0e10  # multiply-adds per second a desktop CPU sustains in float32 (rough)

LATTICE_SECONDS: Mapping[str, float] = {
    "IQ3_XXS": 1.5e-6,  # the IQ3_XXS preset: 1.30 G lattice weights, 47 min 36 s against Q3_K_M's ~15 min
    "IQ2_S": 1.3e-6,  # the IQ2_M preset (IQ2_S 1.19 G, IQ3_S 0.11 G): 46 min 25 s, partly beside a test run
    "IQ3_S": 1.0e-6,  # the IQ3_M preset (IQ3_S 1.19 G): 36 min 24 s beside another run, so at most this
    "IQ2_XS": 1.3e-6,  # as IQ2_S (bench/gptq.py --lattice: within 5 % of it at both widths)
    "IQ2_XXS": 1.3e-6,
    "IQ1_S": 2.0e-6,  # bench/gptq.py --lattice: 1.1-1.7x IQ2_S's time, the most at 1536 inputs
    "IQ1_M": 2.0e-6,
}
"""Seconds a weight of GPTQ's sweep onto each i-quant lattice (``studio.core.quant.gptq_lattice``) on the
2-core machine, two threads. The sweep searches every 8-weight group's grid, so it costs per weight and per
type, far above the block grids' rows × cols² products: the 1.5B bench model's IQ3_XXS preset took 47 min
(`export BENCH --preset IQ3_XXS --method gptq`) where those products predict, and its Q3_K_M took, 15.
Fitted to the bench model's whole GPTQ exports (README, "GPTQ at the i-quant presets"); the types no preset
uses alone in proportion to ``python bench/gptq.py --lattice T`` (one thread, beside an export). Its keys are
``gptq_lattice.LATTICE_TYPES`` (a test keeps them so; that module is not imported here: it is heavy).
"""


SPOOL_ABOVE = 256 * 1024**2
"""Bytes of hidden states (one set, all chunks) above which a CPU run spools them to disk: an 8B's
default calibration (57 chunks of 512 at 4,096 wide, 2 × 0.48 GB) spools, a 1.5B's (0.18 GB) stays."""


def spool_states(device: str, n_chunks: int, n_ctx: int, hidden: int) -> bool:
    """Whether a run on ``device`` keeps its hidden states in a ``studio.core.calib.hidden_spool.HiddenSpool`` (a CPU run whose float32
    states take more than ``SPOOL_ABOVE``; ``QUANT_STUDIO_SPOOL_HIDDEN=1``/``0`` forces it on or off)."""
    forced = os.environ.get("QUANT_STUDIO_SPOOL_HIDDEN", "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    return device == "cpu" and n_chunks * n_ctx * hidden * 4 > SPOOL_ABOVE


@dataclass(frozen=True)
class JobEstimate:
    """A calibrated job's expected peak resident memory (bytes) and wall time (seconds)."""

    peak_bytes: int
    seconds: float
    phase: str  # what holds the peak: "embeddings", "a decoder layer" or "the output head"

    def describe(self) -> str:
        """One line: ``about 5.1 GB at its peak (a decoder layer), about 12 min``."""
        mins = self.seconds / 60
        t = f"{mins:.0f} min" if mins >= 1 else f"{max(1, round(self.seconds))} s"
        return f"about {format_bytes(self.peak_bytes)} at its peak ({self.phase}), about {t} on a CPU"


@dataclass(frozen=True)
class LayerShapes:
    """A model's decoder-layer linears as (rows, cols) and its depth, vocabulary and widths (config.json)."""

    mats: tuple[tuple[int, int], ...]  # q, k, v, o, gate, up, down
    layers: int
    vocab: int
    hidden: int
    ffn: int

    @property
    def layer_params(self) -> int:
        """The weights of one decoder layer's linears."""
        return sum(r * c for r, c in self.mats)

    @property
    def inputs(self) -> tuple[int, ...]:
        """The widths of a layer's distinct inputs (q/k/v, o, gate/up, down): one Hessian each."""
        return (self.mats[0][1], self.mats[3][1], self.mats[4][1], self.mats[6][1])


def layer_shapes(config: dict[str, Any]) -> LayerShapes:
    """The shapes of the model of ``config`` (its ``text_config`` where it has one; ``head_dim`` where the
    config names one, else hidden / heads)."""
    c = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    hidden = int(c.get("hidden_size") or 0)
    ffn = int(c.get("intermediate_size") or 4 * hidden)
    heads = int(c.get("num_attention_heads") or 1)
    kv = int(c.get("num_key_value_heads") or heads)
    hd = int(c.get("head_dim") or hidden // max(heads, 1))
    mats = ((heads * hd, hidden), (kv * hd, hidden), (kv * hd, hidden), (hidden, heads * hd))
    mats += ((ffn, hidden), (ffn, hidden), (hidden, ffn))
    return LayerShapes(mats, int(c.get("num_hidden_layers") or 0), int(c.get("vocab_size") or 0), hidden, ffn)


def lattice_weights(info: Any, types: Mapping[str, str], uses_gptq: Callable[[str], bool]) -> dict[str, int]:
    """Weights GPTQ rounds onto each i-quant lattice in the plan ``types`` (HF name → qtype) of the model of
    ``info``: the planned tensors whose method ``uses_gptq`` (by name), but the token embedding (no method
    GPTQ-rounds it) and a tensor a GGUF original already stores in its planned type (copied)."""
    out: dict[str, int] = {}
    for t in info.tensors:
        q = types.get(t.name)
        if q not in LATTICE_SECONDS or t.dtype == q or str(getattr(t.role, "value", "")) == "token_embd":
            continue
        if uses_gptq(t.name):
            out[q] = out.get(q, 0) + t.n_elements
    return out


def lattice_seconds(weights: Mapping[str, int]) -> float:
    """CPU seconds of GPTQ's lattice sweeps for ``weights`` (lattice qtype → weights rounded onto it)."""
    return sum(n * LATTICE_SECONDS.get(q, 0.0) for q, n in weights.items())


def estimate_calibrated(
    config: dict[str, Any],
    n_ctx: int,
    n_chunks: int,
    *,
    hessian: bool,
    head: bool,
    device: str = "cpu",
    outer: bool = False,
    narrow_head: bool = False,
    lattice: Mapping[str, int] | None = None,
) -> JobEstimate:
    """The estimate for a layer-wise calibrated run of the model of ``config`` (a config.json dict) on
    ``n_chunks`` chunks of ``n_ctx`` tokens; ``hessian``: GPTQ/AWQ (Hessians and sweeps), else
    activation statistics only; ``head``: the output head is calibrated too; ``outer``: the sensitivity
    scan, whose streams reach the embeddings at its start and the head at its finish; ``narrow_head``: the
    checkpoint stores the head in bfloat16 or float16, which the scan's finish holds instead of float32;
    ``lattice``: the weights GPTQ rounds onto each i-quant lattice (``lattice_weights``), whose sweeps cost
    per weight."""
    sh = layer_shapes(config)
    hidden, ffn, layers, vocab, mats = sh.hidden, sh.ffn, sh.layers, sh.vocab, sh.mats
    tokens = max(1, n_ctx * n_chunks)
    layer_params = sh.layer_params
    gpu = device.startswith("cuda")
    # the hidden states of all chunks, twice (a layer's inputs and outputs), or one chunk of each when
    # the run spools them to disk (studio.core.calib.hidden_spool)
    spooled = spool_states("cpu" if not gpu and device != "mps" else device, n_chunks, n_ctx, hidden)
    states = 2 * (n_ctx if spooled else tokens) * hidden * _F32
    embed = vocab * hidden * _F32
    layer = layer_params * _F32
    if hessian:
        # the layer's Hessians, one per distinct input (q/k/v, o, gate/up, down): summed in float64 while
        # the chunks run, then float32 while GPTQ rounds beside the widest input's working copy (its
        # inverse factor is made in that copy's buffer, LAPACK in place) and the sweep's copies; at 8B
        # widths one layer on 2 × 128 tokens measured 4.28 GB peak RSS (estimate 4.59 GB; 5.63 GB before
        # torch's column-major copy of the factor and ``isfinite``'s copies of the Hessian were gone)
        pairs = 3 * hidden * hidden + ffn * ffn
        collect = pairs * _F64
        rounding = pairs * _F32 + ffn * ffn * _F32
        rounding += _GPTQ_COPIES * max(min(r, _SLAB_ROWS) * c for r, c in mats) * _F32
        layer += max(collect, rounding)
    head_b = embed + n_ctx * vocab * _F32 if head else 0
    if head and hessian:
        head_b += hidden * hidden * _F64 + _GPTQ_COPIES * _SLAB_ROWS * hidden * _F32
    first = embed
    if outer:
        # the scan (studio.core.calib.scan_streams): its start holds the embeddings and one candidate's
        # decoded rows, its finish the original's distribution at every position and the head; the runner
        # keeps a tied matrix loaded through the layers, an untied model's only for those two ends. The
        # finish holds the head in float32 with its bfloat16 copy and one candidate's bfloat16 difference,
        # or, stored narrow and untied, the float32 head until the stored one replaces it (``OuterView.stored``)
        tied = bool(config.get("tie_word_embeddings", False))
        if tied:
            layer += embed
        first = 2 * embed
        head_b = max(head_b, tokens * vocab * _F32 + (embed if narrow_head and not tied else 2 * embed))
    phases = {"embeddings": first, "a decoder layer": layer, "the output head": head_b}
    if gpu:  # the weights, Hessians and sweeps live in GPU memory
        phases = {k: 0 for k in phases}
    phase = max(phases, key=lambda k: phases[k])
    peak = BASE_BYTES + states + phases[phase]
    passes = 2 if hessian else 1
    macs = passes * tokens * (layers * layer_params + (vocab * hidden if head else 0))
    if hessian:
        macs += layers * sum(r * c * c for r, c in mats) + (vocab * hidden * hidden if head else 0)
    sweeps = lattice_seconds(lattice or {}) if hessian else 0.0
    return JobEstimate(int(peak), macs / _CPU_MACS_PER_S + sweeps, phase)


def smaller_calibration(
    peak_of: Callable[[int, int], int], free_bytes: int, n_ctx: int, n_chunks: int
) -> tuple[int, int] | None:
    """The calibration size (context, chunks) below (``n_ctx``, ``n_chunks``) with the most tokens whose peak
    (``peak_of(ctx, chunks)``, bytes) fits ``free_bytes``, the chunks halved and the context cut to 256 or
    128; None when none fits (the peak is a layer or the head, which no calibration size makes smaller)."""
    counts = [n_chunks]
    while counts[-1] > 1:
        counts.append(max(1, counts[-1] // 2))
    sizes = [(c, k) for c in (n_ctx, 256, 128) if c <= n_ctx for k in counts if (c, k) != (n_ctx, n_chunks)]
    fits = [(c * k, c, k) for c, k in dict.fromkeys(sizes) if peak_of(c, k) <= free_bytes]
    return max(fits)[1:] if fits else None


def fit_remedy(size: tuple[int, int] | None, n_ctx: int) -> str:
    """The end of a refusal's sentence: what to change (``smaller_calibration``'s answer) besides closing
    programs or a GPU, or that no calibration size would fit on this CPU."""
    if size is None:
        return "--device cuda (no smaller calibration would fit)"
    ctx, chunks = size
    if ctx == n_ctx:
        return f"--device cuda or fewer chunks (--calib-chunks {chunks})"
    return f"--device cuda or a smaller context (--calib-ctx {ctx} --calib-chunks {chunks})"


def check_fits(
    est: JobEstimate,
    free_bytes: int,
    n_ctx: int,
    n_chunks: int,
    peak_of: Callable[[int, int], int],
) -> None:
    """Refuse (CalibrationError, one sentence) a job whose estimated peak is above ``free_bytes``, saying
    which smaller calibration would fit (``peak_of(n_ctx, n_chunks)``: the same job's peak at another size)."""
    if free_bytes <= 0 or est.peak_bytes <= free_bytes:
        return
    size = smaller_calibration(peak_of, free_bytes, n_ctx, n_chunks)
    raise CalibrationError(
        f"This calibration needs about {format_bytes(est.peak_bytes)} of memory at its peak "
        f"({est.phase}), more than the {format_bytes(free_bytes)} free: close other programs, or run it "
        f"with {fit_remedy(size, n_ctx)}."
    )


def calibration_estimate_line(
    config: dict[str, Any],
    method: str,
    n_ctx: int,
    n_chunks: int,
    device: str,
    *,
    guessed: bool = False,
    lattice: Mapping[str, int] | None = None,
) -> str:
    """What the Export and budget dialogs show before a calibrated job: ``Calibrating: about 5.1 GB at its
    peak (a decoder layer), about 12 min on a CPU (64 chunks of 512 tokens).`` ("" for rtn); ``guessed``:
    the chunk count is a guess from the text's size (``about 64 chunks``); ``lattice``: the plan's weights
    on i-quant lattices (``lattice_weights``)."""

    m = method_info(method)
    if not m.calibrated:
        return ""
    est = estimate_calibrated(
        config, n_ctx, n_chunks, hessian=m.hessian, head=m.hessian, device=device, lattice=lattice
    )
    return (
        f"Calibrating: {est.describe()} ({'about ' if guessed else ''}{n_chunks} chunks of {n_ctx} tokens)."
    )


def thin_calibration(config: dict[str, Any], method: str, n_ctx: int, n_chunks: int) -> str:
    """A warning ("" when none) for a GPTQ method calibrated on fewer tokens than the model is wide: each
    input's Hessian XᵀX then has rank at most the token count, so GPTQ fits those tokens and little else,
    and a budget's rounding probe (fitted on half of them, judged on the rest) promises far too much (the
    2-layer 8B fixture's best-method budget on 256 tokens: llama.cpp measured 19× its prediction)."""
    if "gptq" not in method_info(method).name:
        return ""
    hidden = layer_shapes(config).hidden
    tokens = max(0, n_ctx) * max(0, n_chunks)
    if hidden <= 0 or tokens >= hidden:
        return ""
    need = -(-hidden // max(1, n_ctx))
    return (
        f"GPTQ will fit each matrix to {tokens:,} calibration tokens, fewer than the model is wide "
        f"({hidden:,}): it fits that text and little else, and a budget's predictions will be hopeful; "
        f"calibrate on {need} chunks of {n_ctx} tokens or more."
    )


def estimate_whole(
    config: dict[str, Any], n_ctx: int, *, dtype_bytes: int = _F32, device: str = "cpu"
) -> JobEstimate:
    """The estimate for a job that loads the whole model of ``config`` through transformers (eval's
    original checkpoint): every weight at ``dtype_bytes`` plus one chunk's logits (kept and scored)."""
    sh = layer_shapes(config)
    tied = 1 if config.get("tie_word_embeddings") else 2
    params = sh.layers * sh.layer_params + tied * sh.vocab * sh.hidden
    weights = 0 if device.startswith("cuda") else params * dtype_bytes
    peak = BASE_BYTES + weights + 2 * n_ctx * sh.vocab * _F32
    return JobEstimate(int(peak), 2 * params * n_ctx / _CPU_MACS_PER_S, "the whole model loaded")


def check_whole_fits(est: JobEstimate, free_bytes: int, what: str) -> None:
    """Refuse (EvaluationError, one sentence) loading ``what`` whole when its estimate is above ``free_bytes``."""
    if free_bytes <= 0 or est.peak_bytes <= free_bytes:
        return
    raise EvaluationError(
        f"Loading {what} whole needs about {format_bytes(est.peak_bytes)} of memory, more than the "
        f"{format_bytes(free_bytes)} free: close other programs, or compare against its F16 GGUF "
        f"(quant-studio-cli export {what} -o original.gguf --preset F16), which llama.cpp maps from disk, "
        f"or run it with --device cuda."
    )
