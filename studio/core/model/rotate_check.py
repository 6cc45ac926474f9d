"""The rotation's check: the rotated model computes the unrotated one's float32 logits, within rounding.

Both models run in transformers on the CPU, on a few seeded token sequences. A model too large to
hold twice in float32 within ``max_bytes`` is checked on its first blocks only (embedding, the first
``k`` blocks, the final norm and the head): every block is rotated by the same rule, so the first
blocks exercise every kind of tensor the rotation touches, at a bounded cost.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from studio.core.jobs import JobContext, null_context
from studio.core.model.checkpoint import Checkpoint
from studio.core.model.hf_progress import no_hf_progress_bars
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


def _encoder(config: dict[str, Any]) -> bool:
    """Whether the model is an encoder (BERT): checked on its last hidden states, as llama.cpp embeds."""
    return str(config.get("model_type", "")).lower() == "bert"


def _model(config: dict[str, Any], state: dict[str, Any]) -> Any:
    import torch
    import transformers
    from transformers.initialization import no_init_weights

    cfg = transformers.AutoConfig.for_model(**config)
    auto = transformers.AutoModel if _encoder(config) else transformers.AutoModelForCausalLM
    with no_init_weights():  # every weight is loaded next: a random init would only cost time
        model = auto.from_config(cfg, dtype=torch.float32)
    # assign: the model takes the state's tensors instead of copying them (one copy of the weights)
    missing, _ = model.load_state_dict(state, strict=False, assign=True)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    if cfg.tie_word_embeddings:  # the tied head is the embedding itself
        missing = [m for m in missing if m != "lm_head.weight"]
    missing = [m for m in missing if not m.startswith("pooler.")]  # BERT's pooler: not in the hidden states
    if missing:  # the checkpoint's names are not the module's (Mixtral's, Qwen3-MoE's experts are fused)
        del model
        return _through_folder(config, state, auto)
    return model.eval()


def _through_folder(config: dict[str, Any], state: dict[str, Any], auto: Any) -> Any:
    """The model loaded by ``from_pretrained`` from a temporary folder of ``state``: transformers' own
    checkpoint conversion maps the stored names (per-expert matrices) onto its modules."""
    import torch
    from safetensors.torch import save_file  # safetensors.torch imports torch: only when a check needs it

    with tempfile.TemporaryDirectory(prefix="qs-rotcheck-") as tmp:
        save_file(
            {k: v.contiguous() for k, v in state.items()},
            f"{tmp}/model.safetensors",
            metadata={"format": "pt"},
        )
        with open(f"{tmp}/config.json", "w", encoding="utf-8") as f:
            json.dump(config, f)
        try:
            with no_hf_progress_bars():
                model = auto.from_pretrained(tmp, dtype=torch.float32, trust_remote_code=False)
        except Exception as err:  # noqa: BLE001 - transformers raises anything; one sentence out
            raise RotationError(
                f"The rotation check could not load the model into transformers ({type(err).__name__})."
            ) from err
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
        name = t.name.removeprefix("bert.") if _encoder(config) else t.name  # BertModel's own names
        state[name] = torch.from_numpy(a if a.flags.writeable else np.array(a, dtype=np.float32))
    cfg = dict(config)
    layers_key = "n_layer" if "n_layer" in cfg else "num_hidden_layers"  # GPT-2 names it n_layer
    n = cfg.get(layers_key)
    cfg[layers_key] = k
    for key in _PER_LAYER:
        # one entry per layer (Qwen2's layer_types): transformers refuses a list longer than the layers
        v = cfg.get(key)
        if isinstance(v, list) and len(v) == n:
            cfg[key] = v[:k]
    cfg.pop("torch_dtype", None)
    cfg.pop("dtype", None)
    model = _model(cfg, state)
    with torch.no_grad():
        res = model(input_ids=tokens)
        out = (res.last_hidden_state if _encoder(config) else res.logits).float().numpy()
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
    vocab = int(info.config.get("vocab_size") or view.info.tensor(view.head_name or "").shape[0])
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
