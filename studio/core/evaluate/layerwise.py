"""The original checkpoint's logits layer by layer, for evaluation: one decoder layer in float32 at a time
through the calibration runner (``studio.core.calib.runner``), the hidden states of every chunk between
layers (spooled to disk when large), and the head a chunk at a time. Loaded whole through transformers
the original of an 8B is 33.6 GB of float32 on a CPU; layer by layer it is one layer (0.87 GB at 8B
widths) plus the embeddings or the head (2.1 GB at Llama 3's vocabulary).

``LayerwiseOriginal`` has the tokenizer and facts of ``TransformersBackend``; its logits come from
``logits_of_chunks`` for all chunks at once, not per chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from studio.core import hardware, safejson
from studio.core.calib.data import Chunks
from studio.core.calib.runner import Consumer, run_model
from studio.core.chat.hf_backend import TransformersBackend, check_folder, resolve_device, resolve_dtype
from studio.core.errors import EvaluationError, ModelOpenError
from studio.core.jobs import JobContext, null_context
from studio.core.model import open_model
from studio.core.model.hf_folder import transformers_folder
from studio.core.plan.job_estimate import estimate_calibrated, estimate_whole
from studio.core.units import format_bytes

MODES = ("auto", "whole", "layers")
# "auto" runs an original layer by layer when loading it whole would take more than this (or more than
# the free RAM): below it transformers' own forward is as fast and holds little
WHOLE_LIMIT = 4 << 30


def use_layers(config: dict[str, Any], n_ctx: int, device: str, nbytes: int, mode: str) -> bool:
    """Whether eval runs the original of ``config`` layer by layer (``mode``: auto, whole or layers)."""
    if mode not in MODES:
        raise EvaluationError(f"Unknown way to run the original {mode!r}; use one of {', '.join(MODES)}.")
    if mode != "auto":
        return mode == "layers"
    est = estimate_whole(config, n_ctx, dtype_bytes=nbytes, device=device)
    free = hardware.ram()[1]
    return est.peak_bytes > WHOLE_LIMIT or (free > 0 and est.peak_bytes > free)


def original_facts(path: Path, device: str, dtype: str) -> tuple[dict[str, Any], str, int] | None:
    """(config.json, device, bytes per weight) of an original checkpoint folder; None for a GGUF."""
    cfg_file = path / "config.json"
    if path.suffix.lower() == ".gguf" or not cfg_file.is_file():
        return None
    cfg = safejson.loads(cfg_file.read_bytes(), "config.json", EvaluationError)
    dev = resolve_device(device)
    nbytes = 2 if str(resolve_dtype(dtype, dev)) in ("torch.bfloat16", "torch.float16") else 4
    return cfg, dev, nbytes


def original_in_layers(path: Path, n_ctx: int, device: str, dtype: str, mode: str) -> bool:
    """Whether the original checkpoint runs layer by layer (``layerwise.use_layers``); a GGUF never does."""
    facts = original_facts(path, device, dtype)
    if facts is None:
        if mode == "layers":
            raise EvaluationError(f"{path.name} is not a checkpoint folder; only those run layer by layer.")
        return False
    cfg, dev, nbytes = facts
    return use_layers(cfg, n_ctx, dev, nbytes, mode)


class _Logits(Consumer):
    """Hands each chunk's logits to ``on_logits`` as the runner's head pass makes them."""

    wants_head = True

    def __init__(self, on_logits: Callable[[int, np.ndarray], None]) -> None:
        self._on = on_logits

    def logits(self, chunk: int, logits: Any) -> None:
        """Pass the chunk's float32 logits on, as numpy."""
        self._on(chunk, logits.detach().float().cpu().numpy())


class LayerwiseOriginal(TransformersBackend):
    """An original checkpoint whose logits are computed layer by layer (see the module docstring)."""

    layerwise = True

    def __init__(self, path: str | Path, *, device: str, dtype: str, n_ctx: int, allow_pickle: bool) -> None:
        super().__init__(path, device=device, dtype=dtype, n_ctx=n_ctx, allow_pickle=allow_pickle)
        self._weights: Path | None = None
        self._config: dict[str, Any] = {}
        self._params = 0

    def load(self, ctx: JobContext | None = None) -> None:
        """Load the tokenizer and read the checkpoint's headers; no weight is loaded here."""
        if self._loaded:
            return
        cfg = check_folder(self.path)
        weights = transformers_folder(self.path, allow_pickle=self.allow_pickle, ctx=ctx)
        from transformers import AutoTokenizer

        self.device = resolve_device(self.device_request)
        try:
            tok = AutoTokenizer.from_pretrained(str(weights), trust_remote_code=False)
        except Exception as err:  # noqa: BLE001 - one sentence for the user, whatever transformers raised
            line = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
            raise ModelOpenError(f"transformers could not load the tokenizer of {self.path}: {line}") from err
        with open_model(weights, ctx) as ck:
            self._params = ck.info.parameters
        self._tok, self._weights, self._config = tok, Path(weights), cfg
        self._table = None
        max_pos = cfg.get("max_position_embeddings")
        if isinstance(max_pos, int) and 0 < max_pos < self.n_ctx:
            self._notes.append(f"The context of {self.label} is limited to its {max_pos} positions.")
            self.n_ctx = max_pos
        self._loaded = True

    @property
    def param_count(self) -> int:
        """Number of parameters, from the checkpoint's headers."""
        self._require_loaded()
        return self._params

    def logits(self, ids: Sequence[int]) -> Any:
        """Not offered: a layer-wise run computes every chunk at once (``logits_of_chunks``)."""
        raise EvaluationError("A layer-by-layer original computes its chunks together, not one at a time.")

    def logits_of_chunks(
        self,
        chunk_ids: Sequence[Sequence[int]],
        on_logits: Callable[[int, np.ndarray], None],
        ctx: JobContext | None = None,
    ) -> None:
        """Run every chunk (each ``n_ctx`` ids) through the original layer by layer and hand chunk i's float32
        logits (tokens × vocabulary) to ``on_logits(i, logits)``, in order."""
        self._require_loaded()
        assert self._weights is not None
        ctx = ctx or null_context()
        ids = np.asarray([[int(t) for t in c] for c in chunk_ids], dtype=np.int64)
        n_chunks, n_ctx = int(ids.shape[0]), int(ids.shape[1])
        est = estimate_calibrated(self._config, n_ctx, n_chunks, hessian=False, head=True, device=self.device)
        free = hardware.ram()[1]
        if free > 0 and est.peak_bytes > free:
            raise EvaluationError(
                f"Evaluating {self.path.name} layer by layer needs about {format_bytes(est.peak_bytes)} of "
                f"memory at its peak ({est.phase}), more than the {format_bytes(free)} free: close other "
                f"programs, or evaluate fewer chunks (--chunks {max(1, n_chunks // 2)}) or run it with --device cuda."
            )
        ctx.log(f"{self.path.name} runs layer by layer (one layer in memory at a time).")
        chunks = Chunks(ids, n_ctx, int(ids.size), None, "evaluation text")
        with open_model(self._weights, ctx) as ck:
            run_model(ck, chunks, [_Logits(on_logits)], device=self.device, dtype=self.dtype_request, ctx=ctx)

    def close(self) -> None:
        """Drop the tokenizer."""
        self._tok = None
        self._loaded = False
