"""The rotation's check: the rotated model computes the unrotated one's float32 logits, within rounding.

Both models run in transformers on the CPU, on a few seeded token sequences. A model too large to
hold twice in float32 within ``max_bytes`` is checked on its first blocks only (embedding, the first
``k`` blocks, the final norm and the head): every block is rotated by the same rule, so the first
blocks exercise every kind of tensor the rotation touches, at a bounded cost.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from studio.core.jobs import JobContext, null_context
from studio.core.model.checkpoint import Checkpoint
from studio.core.model.rotate import RotatedCheckpoint, RotationError

TOLERANCE = 1e-3
"""Largest logit difference allowed, relative to the largest logit (float32 rounding is ~1e-6)."""


@dataclass(frozen=True)
class RotationCheck:
    """What the check compared and found."""

    layers_checked: int
    layers: int
    max_abs_diff: float
    max_abs_logit: float

    @property
    def relative(self) -> float:
        """Largest difference over the largest logit."""
        return self.max_abs_diff / max(self.max_abs_logit, 1e-30)


def _layers_within(view: RotatedCheckpoint, max_bytes: int) -> int:
    info = view.inner.info
    n = max(1, int(info.n_layers or 1))
    outside = sum(t.n_elements for t in info.tensors if t.layer is None)
    per_layer = sum(t.n_elements for t in info.tensors if t.layer is not None) / n
    outside += view.untied_bytes // 4
    k = int((max_bytes / 8 - outside) // max(per_layer, 1))  # two float32 copies
    return max(1, min(n, k))


_PER_LAYER = ("layer_types", "no_rope_layers")  # config lists with one entry per decoder layer


def _model(config: dict[str, Any], state: dict[str, Any]) -> Any:
    import torch
    import transformers
    from transformers.initialization import no_init_weights

    cfg = transformers.AutoConfig.for_model(**config)
    with no_init_weights():  # every weight is loaded next: a random init would only cost time
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    # assign: the model takes the state's tensors instead of copying them (one copy of the weights)
    missing, _ = model.load_state_dict(state, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    if cfg.tie_word_embeddings:  # the tied head is the embedding itself
        missing = [m for m in missing if m != "lm_head.weight"]
    if missing:
        raise RotationError(f"The rotation check could not load {missing[0]} into transformers.")
    return model.eval()


def _logits(ckpt: Checkpoint, config: dict[str, Any], k: int, tokens: Any) -> np.ndarray:
    import torch

    state = {}
    for t in ckpt.info.tensors:
        if t.layer is not None and t.layer >= k:
            continue
        if t.name.endswith("rotary_emb.inv_freq"):
            continue
        a = ckpt.read(t.name)  # a new float32 array: torch takes it as it is (a copy held two at once)
        state[t.name] = torch.from_numpy(a if a.flags.writeable else np.array(a, dtype=np.float32))
    cfg = dict(config)
    n = cfg.get("num_hidden_layers")
    cfg["num_hidden_layers"] = k
    for key in _PER_LAYER:
        # one entry per layer (Qwen2's layer_types): transformers refuses a list longer than the layers
        v = cfg.get(key)
        if isinstance(v, list) and len(v) == n:
            cfg[key] = v[:k]
    cfg.pop("torch_dtype", None)
    cfg.pop("dtype", None)
    model = _model(cfg, state)
    with torch.no_grad():
        out = model(input_ids=tokens).logits.float().numpy()
    del model, state
    return out


def check_rotation(
    view: RotatedCheckpoint,
    *,
    seed: int = 0,
    n_prompts: int = 2,
    n_tokens: int = 24,
    max_bytes: int = 2 << 30,
    ctx: JobContext | None = None,
) -> RotationCheck:
    """Compare ``view``'s float32 logits with its unrotated model's on seeded token sequences;
    ``RotationError`` (one sentence, nothing written) when they differ by more than ``TOLERANCE``."""
    import torch

    ctx = ctx or null_context()
    info = view.inner.info
    n = max(1, int(info.n_layers or 1))
    k = _layers_within(view, max_bytes)
    vocab = int(info.config.get("vocab_size") or view.info.tensor(view.head_name).shape[0])
    rng = np.random.default_rng(seed)
    tokens = torch.from_numpy(rng.integers(0, vocab, size=(n_prompts, n_tokens), dtype=np.int64))
    ctx.report(0, 2, "Checking the rotation: the original model")
    want = _logits(view.inner, info.config, k, tokens)
    ctx.check_cancelled()
    ctx.report(1, 2, "Checking the rotation: the rotated model")
    got = _logits(view, view.info.config, k, tokens)
    ctx.report(2, 2, "Checked the rotation")
    res = RotationCheck(k, n, float(np.max(np.abs(got - want))), float(np.max(np.abs(want))))
    if not np.isfinite(res.max_abs_diff) or res.relative > TOLERANCE:
        raise RotationError(
            f"The rotated model's logits differ from the original's by {res.relative:.2e} of the largest "
            f"logit (allowed {TOLERANCE:.0e}), so nothing was written."
        )
    return res
