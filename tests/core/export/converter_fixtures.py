"""Shared set-up of the tests that need llama.cpp's converter (installed by packaging/install.sh)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

# The architectures only llama.cpp's converter maps (tiny checkpoints from studio.core.factory).
# Gemma 3: 6 layers so one is a full-attention layer (llama.cpp's pattern 6); no planted outliers,
# because llama.cpp's CPU GELU reads a float16 table whose error the outliers amplify past 1e-3 of
# the logit range (emulating that table in the reference brings it back to 3.9e-4: it measures
# llama.cpp's GELU, not the conversion). SmolLM3: 4 layers, so layer 3 runs without RoPE.
NEW_ARCHS: dict[str, dict[str, Any]] = {
    "gemma3_text": {"layers": 6, "outliers": False},
    "qwen3_moe": {},
    "mixtral": {},
    "olmo2": {},
    "granite": {},
    "smollm3": {"layers": 4},
}
MOE = ("qwen3_moe", "mixtral")


def need_converter() -> None:
    """Skip (or, where CI installed it, fail) when llama.cpp's converter is not installed."""
    from studio.core.gguf.converter_bundle import converter_available

    ok, why = converter_available()
    if not ok:
        if os.environ.get("QUANT_STUDIO_REQUIRE_CONVERTER"):
            pytest.fail(f"llama.cpp's converter must be installed here: {why}")
        pytest.skip(str(why))


def new_arch_model(tiny_model: Any, arch: str) -> Path:
    """The session's tiny checkpoint of one of ``NEW_ARCHS``."""
    return tiny_model(arch, **NEW_ARCHS[arch])


def read_gguf_all(path: Path) -> tuple[dict[str, Any], dict[str, tuple[str, tuple[int, ...], bytes]]]:
    """(key → value, tensor name → (type, shape, bytes)) of a GGUF file, read with gguf-py."""
    import gguf

    r = gguf.GGUFReader(path)
    kv = {f.name: f.contents() for f in r.fields.values() if not f.name.startswith("GGUF.")}
    ts = {t.name: (t.tensor_type.name, tuple(int(x) for x in t.shape), bytes(t.data)) for t in r.tensors}
    return kv, ts
