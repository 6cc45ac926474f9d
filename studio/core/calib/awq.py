"""AWQ for one decoder layer: per-input-channel scales searched under the target GGUF grid, folded away.

For each group of linears that read one input (q/k/v after the input norm, gate/up after the
post-attention norm, down after up_proj, o after v_proj), the scales are ``s = mean|x|^α``
(normalised so that max·min = 1) with α on a grid in [0, 1]. The loss of an α is the output error
of the group's linears over the calibration rows, ``Σ tr((W − Ŵ) H (W − Ŵ)ᵀ)`` with ``H = 2XᵀX/n``
(the Hessian GPTQ uses) and ``Ŵ = Q(W·diag(s)) · diag(s)⁻¹``, ``Q`` being llama.cpp's imatrix-weighted
search for the tensor's qtype; α = 0 (no scaling) is on the grid, so AWQ never loses to the plain search
on this loss. The winning scales are folded into the preceding op, so the model computes the same
function with no extra operation: the norm's weight is divided by ``s`` (q/k/v, gate/up), up_proj's
rows by ``s`` (down), v_proj's rows by ``s`` (o, with the scales tied across the query heads that
share one key/value head), and the linears' columns are multiplied by ``s``.
tests/core/calib/test_awq.py shows the float model's logits unchanged after folding.

AWQ runs for the architectures whose layers are laid out as Llama's (``AWQ_ARCHITECTURES``); a layer
of another kind is left unscaled, with a note.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from studio.core.quant.gptq import output_error_by_rows

AWQ_ARCHITECTURES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
"""config.json model types whose decoder layers have the module names of ``GROUPS``."""

GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    ("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj")),
    ("mlp.up_proj", ("mlp.down_proj",)),
    ("self_attn.v_proj", ("self_attn.o_proj",)),
)
"""(preceding op, linears reading its output) inside a decoder layer, as module paths in the layer."""

DEFAULT_GRID = 20  # α = 0, 1/20, ..., 1


@dataclass(frozen=True)
class AwqGroup:
    """One group of linears sharing an input, and the op whose output is that input."""

    prev: str  # module path inside the layer
    linears: tuple[str, ...]
    tie: int = 1  # o after v: query heads per key/value head (scales shared across them)
    head_dim: int = 0


@dataclass(frozen=True)
class AwqChoice:
    """The scales chosen for one group."""

    group: AwqGroup
    alpha: float
    scales: Any  # torch float32 (in_features of the linears,) on the layer's device
    loss: float
    loss_unscaled: float

    @property
    def gain(self) -> float:
        """Output error relative to no scaling (at most 1)."""
        return self.loss / self.loss_unscaled if self.loss_unscaled > 0 else 1.0


def layer_groups(
    module: Any, model_type: str, config: Mapping[str, Any]
) -> tuple[list[AwqGroup], str | None]:
    """The AWQ groups of one decoder layer ``module``, and why there are none (None if there are)."""
    if model_type not in AWQ_ARCHITECTURES:
        return [], f"AWQ is not available for {model_type} layers"
    out = []
    n_head = int(config.get("num_attention_heads") or 0)
    n_kv = int(config.get("num_key_value_heads") or n_head or 0)
    for prev, lins in GROUPS:
        try:
            p = module.get_submodule(prev)
            ms = [module.get_submodule(x) for x in lins]
        except AttributeError:
            continue
        if prev.endswith("_proj"):
            if prev == "self_attn.v_proj":
                if not n_head or not n_kv or n_head % n_kv:
                    continue
                hd = int(config.get("head_dim") or (p.weight.shape[0] // n_kv))
                if p.weight.shape[0] != n_kv * hd or ms[0].weight.shape[1] != n_head * hd:
                    continue  # a head layout the fold cannot follow
                out.append(AwqGroup(prev, lins, n_head // n_kv, hd))
                continue
            if p.weight.shape[0] != ms[0].weight.shape[1]:
                continue
        elif not _is_scaling_norm(p):
            continue
        out.append(AwqGroup(prev, lins))
    return out, None


def _is_scaling_norm(norm: Any) -> bool:
    """Whether the norm's output is proportional to its weight (y = f(x) · w), so 1/s folds into w."""
    import torch

    w = getattr(norm, "weight", None)
    if w is None or w.ndim != 1:
        return False
    x = torch.randn(3, w.shape[0], dtype=w.dtype, device=w.device, generator=None)
    with torch.no_grad():
        y = norm(x)
        old = w.detach().clone()
        try:
            w.mul_(2.0)
            y2 = norm(x)
        finally:
            w.copy_(old)
    return bool(torch.allclose(y2, 2 * y, rtol=1e-3, atol=1e-5))


def group_scales(mean_abs: Any, alpha: float, tie: int = 1, head_dim: int = 0) -> Any:
    """``mean|x|^α`` per input channel, normalised to max·min = 1 (tied across ``tie`` heads)."""
    import torch

    m = torch.as_tensor(mean_abs, dtype=torch.float32)
    if tie > 1:  # o_proj's input: (kv heads, tie, head_dim) -> one scale per kv-head channel
        m = m.reshape(-1, tie, head_dim).mean(1, keepdim=True).expand(-1, tie, -1).reshape(-1)
    s = m.clamp(min=1e-4).pow(alpha)
    return s / torch.sqrt(s.max() * s.min())


def _quant_error(w: Any, s: Any, h: Any, qtype: str, imatrix: np.ndarray | None) -> float:
    """Σ tr((W − Ŵ) H (W − Ŵ)ᵀ) with Ŵ = Q(W·s)/s, a block of rows at a time (every type rounds rows apart)."""
    import torch

    from studio.core.quant.blocks import dequantize, quantize

    qw = None if imatrix is None else (imatrix / (s.double().cpu().numpy() ** 2)).astype(np.float32)

    def values(a: int, b: int) -> Any:
        ws = w[a:b] * s[None, :]
        x = ws if ws.device.type != "cpu" else ws.numpy()
        q = torch.as_tensor(dequantize(quantize(x, qtype, qw), qtype, tuple(ws.shape)), device=w.device)
        del ws, x
        return q / s[None, :]

    return output_error_by_rows(w, h, values)


def search_group(
    group: AwqGroup,
    weights: Sequence[Any],
    qtypes: Sequence[str | None],
    hessian: Any,
    mean_abs: Any,
    imatrix: np.ndarray | None,
    *,
    grid: int = DEFAULT_GRID,
    ctx: Any = None,
    on_point: Callable[[int, int], None] | None = None,
) -> AwqChoice:
    """The α (and scales) whose quantized outputs are closest to the float ones, for one group.

    ``weights`` (rows × in, float32) and ``qtypes`` (None: kept in a float type) follow ``group.linears``;
    ``on_point(done, total)`` is called after each of the grid's points (the progress).
    """
    import torch

    dev = hessian.device
    h = hessian.to(torch.float32)
    best: tuple[float, float, Any] | None = None
    base = math.nan
    for k in range(grid + 1):
        if ctx is not None:
            ctx.check_cancelled()
        alpha = k / grid
        s = group_scales(mean_abs, alpha, group.tie, group.head_dim).to(dev)
        loss = 0.0
        for w, qt in zip(weights, qtypes, strict=True):
            if qt is not None:
                loss += _quant_error(w.to(torch.float32), s, h, qt, imatrix)
        if k == 0:
            base = loss
        if best is None or loss < best[0]:
            best = (loss, alpha, s)
        if on_point is not None:
            on_point(k + 1, grid + 1)
    assert best is not None
    return AwqChoice(group, best[1], best[2], best[0], base)


def fold(view: Any, choice: AwqChoice) -> list[str]:
    """Apply ``choice`` to the layer on the device: 1/s into the preceding op, s into the linears' columns.

    Returns the layer-relative parameter paths that changed.
    """
    import torch

    g = choice.group
    s = choice.scales
    changed = []
    if g.prev.endswith("_proj"):
        sv = s if g.tie == 1 else s.reshape(-1, g.tie, g.head_dim)[:, 0, :].reshape(-1)
        for name in (f"{g.prev}.weight", f"{g.prev}.bias"):
            try:
                p = view.param(name)
            except AttributeError:
                continue
            if p is None:
                continue
            d = sv.to(p.dtype)
            view.set_param(name, p / (d[:, None] if p.ndim == 2 else d))
            changed.append(name)
    else:
        name = f"{g.prev}.weight"
        p = view.param(name)
        view.set_param(name, p / s.to(p.dtype))
        changed.append(name)
    for lin in g.linears:
        name = f"{lin}.weight"
        p = view.param(name)
        with torch.no_grad():
            view.set_param(name, p * s.to(p.dtype)[None, :])
        changed.append(name)
    return changed


__all__ = [
    "AWQ_ARCHITECTURES",
    "DEFAULT_GRID",
    "GROUPS",
    "AwqChoice",
    "AwqGroup",
    "fold",
    "group_scales",
    "layer_groups",
    "search_group",
]
