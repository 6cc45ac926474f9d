"""The KL of a perturbed model's next-token distributions against the original's, from the change of
the logits alone: ``KL = log Σ_v p_v e^{δ_v} − Σ_v p_v δ_v`` (llama.cpp's convention: natural log,
every position counted), and the small torch helpers the scan's streams share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def torch_cat(parts: Sequence[Any]) -> Any:
    """``torch.cat`` along the batch axis (a lazy import for module-level helpers)."""
    import torch

    return torch.cat(list(parts), 0)


def torch_stack(parts: Sequence[Any]) -> Any:
    """``torch.stack`` (a lazy import for module-level helpers)."""
    import torch

    return torch.stack(list(parts))


_EXP_SAFE = 80.0  # exp(80) × a vocabulary of 10⁶ stays below float32's 3.4e38


def kl_from_delta(p: Any, delta: Any, shift: Any = None, *, owned: bool = False) -> float:
    """Mean over positions of KL(p ‖ softmax(log p + δ)) (``p`` and ``δ``: positions × vocabulary).

    ``KL = log Σ p e^δ − Σ p δ`` is unchanged when a constant is taken from δ per position; with the
    mean ``Σ p δ`` taken off (``shift`` when the caller knows it) the two terms no longer cancel, so
    float32 keeps ~1e-5 relative precision where the uncentred sum needed float64 (and four times the
    memory traffic). ``owned``: ``delta`` is a scratch float32 tensor that may be overwritten. NaN when
    the KL is not finite even in float64 (a δ that holds NaN or Inf).
    """
    rows = kl_rows(p, delta, shift, owned=owned)
    return float("nan") if rows is None else float(rows.mean())


def kl_rows(p: Any, delta: Any, shift: Any = None, *, owned: bool = False) -> Any:
    """The KL of each position (float64, clamped at 0) as in ``kl_from_delta``; None when one is not finite
    even in float64. Positions are independent, so a caller may measure a long run block by block."""
    import torch

    v = p.shape[-1]
    pf = p.reshape(-1, 1, v).float()
    d = delta.reshape(-1, v)
    d = d if owned and d.dtype == torch.float32 else d.to(torch.float32, copy=True)

    def dot(x: Any) -> Any:  # Σ_v p_v x_v per position, one pass
        return torch.bmm(pf, x.unsqueeze(2)).reshape(-1)

    d -= (dot(d) if shift is None else shift.reshape(-1).float()).unsqueeze(1)
    if not float(d.amax()) < _EXP_SAFE:
        # a change beyond float32's exp range (or not finite): the float64 form, decided before the
        # in-place exp below overwrites d (which may be the caller's ``delta``); KL does not change
        # when a constant is taken from δ per position, so the centred d is as good as δ
        return _kl_float64_rows(p, d)
    r = dot(d)
    s = dot(d.expm1_())
    kl = torch.log1p(s.double()) - r.double()
    if not bool(torch.isfinite(kl).all()):  # log1p(s ≤ −1) by rounding: d is spent, the caller marks it
        return None
    return kl.clamp_min(0)


def _kl_float64(p: Any, delta: Any) -> float:
    rows = _kl_float64_rows(p, delta)
    return float("nan") if rows is None else float(rows.mean())


def _kl_float64_rows(p: Any, delta: Any) -> Any:
    import torch

    d = delta.double().reshape(-1, p.shape[-1])
    m = d.amax(-1, keepdim=True)
    pd = p.double().reshape(d.shape)
    lse = torch.log((pd * torch.exp(d - m)).sum(-1)) + m.squeeze(-1)
    kl = lse - (pd * d).sum(-1)
    if not bool(torch.isfinite(kl).all()):
        return None  # clamp_min would turn a NaN into 0: the caller marks the candidate instead
    return kl.clamp_min(0)


def head_is_linear(hh: Any, w: Any, ref: Any) -> bool:
    """Whether the logits are ``ĥ Wᵀ`` (no soft-capping, no scaling), so that δ = W(ĥ' − ĥ) holds
    (``hh``: chunks × tokens × hidden; ``ref``: the logits of each chunk; compared a chunk at a time, so
    that no second vocabulary-wide copy of every chunk is made)."""
    import torch

    scale = max((float(r.abs().amax()) for r in ref), default=0.0) or 1.0
    wf = w.float()
    for h, r in zip(hh, ref, strict=True):
        z = h.float() @ wf.T
        if not torch.allclose(z, r.float(), atol=1e-4 * scale, rtol=1e-4):
            return False
    return True
