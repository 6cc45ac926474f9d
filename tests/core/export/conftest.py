"""Fixtures shared by the export tests: tiny models, one llama.cpp runner, cached exports."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def llama_worker() -> Iterator[Any]:
    """One llama.cpp runner (child process) for the whole session; tests load models with ``.load``."""
    from studio.core.llamacpp import LlamaRunner

    w = LlamaRunner(label="llama.cpp (tests)")
    yield w
    w.close()


@pytest.fixture(scope="session")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``exported(model, key, plan, **kw) -> Path``: export once per (model, key) for the session."""
    from studio.core.export.run import export_gguf

    root = tmp_path_factory.mktemp("exports")
    cache: dict[tuple[str, str], Path] = {}

    def run(model: Path, key: str, plan: Any, **kw: Any) -> Path:
        k = (str(model), key)
        if k not in cache:
            out = root / f"{Path(model).name}-{key}.gguf"
            export_gguf(model, out, plan, **kw)
            cache[k] = out
        return cache[k]

    return run
