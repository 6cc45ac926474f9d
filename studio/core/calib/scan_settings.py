"""How a sensitivity scan runs (candidates, mode, chunks, the imatrix's calibration) and the inputs it
takes: the scan chunks spread over the calibration text, the imatrix keyed by HF tensor names."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from studio.core.calib.data import Chunks
from studio.core.errors import CalibrationError
from studio.core.gguf.layout import layout
from studio.core.plan.menu import default_menu
from studio.core.plan.scan import LOW_BIT_SCAN_TYPES

ALL_SCAN_TYPES: tuple[str, ...] = (
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    "Q8_0",
    "IQ4_XS",
    "IQ4_NL",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    *LOW_BIT_SCAN_TYPES,
)
"""Every qtype a scan can measure (Q2_K … Q8_0, IQ4_XS, IQ4_NL, the legacy 32-weight types and the low-bit ones)."""

DEFAULT_TYPES: tuple[str, ...] = default_menu(ALL_SCAN_TYPES)
"""Candidate qtypes of a scan of weights trained in float: ``ALL_SCAN_TYPES`` less the ternary and 1-2-bit
types (``studio.core.plan.menu``); ``default_types`` adds them for a model trained for them."""


def default_types(config: Mapping[str, Any] | None = None) -> tuple[str, ...]:
    """The default candidates for a model with this Hugging Face ``config`` (``plan.menu.default_menu``)."""
    return default_menu(ALL_SCAN_TYPES, config)


SCAN_CTX = 128  # tokens per scan chunk: short chunks keep the perturbed streams cheap
SCAN_CHUNKS = 2


@dataclass(frozen=True)
class ScanSettings:
    """How a scan runs: candidates, mode, the chunks it measures on and the imatrix's calibration."""

    types: tuple[str, ...] = DEFAULT_TYPES
    exact: bool = False
    n_ctx: int = SCAN_CTX
    n_chunks: int = SCAN_CHUNKS
    calib_ctx: int = 512
    calib_chunks: int | None = None
    device: str = "cpu"
    check_pairs: int = 2  # proxy: held-out pairs per role measured exactly as a check


def spread_chunks(chunks: Any, n_chunks: int, n_ctx: int) -> Any:
    """``n_chunks`` chunks of ``n_ctx`` tokens taken evenly across ``chunks`` (each chunk's first
    ``n_ctx`` tokens, BOS first as before), so a few short chunks still mix the calibration text."""
    if n_ctx > chunks.n_ctx:
        raise CalibrationError(
            f"Scan chunks of {n_ctx} tokens do not fit calibration chunks of {chunks.n_ctx}; use --scan-ctx "
            f"{chunks.n_ctx} or less."
        )
    if n_chunks < 1:
        raise CalibrationError(f"At least one scan chunk is needed, not {n_chunks}.")
    n = min(n_chunks, chunks.n_chunks)
    idx = np.unique(np.round(np.linspace(0, chunks.n_chunks - 1, n)).astype(int))
    return Chunks(
        np.ascontiguousarray(chunks.tokens[idx, :n_ctx]),
        n_ctx,
        chunks.n_text_tokens,
        chunks.bos,
        chunks.dataset,
    )


def hf_imatrix(imatrix: Mapping[str, np.ndarray], info: Any) -> dict[str, np.ndarray]:
    """An imatrix keyed by GGUF names (``Imatrix``) re-keyed by the HF tensor names a scan uses."""
    out = {}
    for tm in layout(info).tensors:
        if tm.gguf_name in imatrix:
            out[tm.hf_name] = np.asarray(imatrix[tm.gguf_name], dtype=np.float32)
    return out
