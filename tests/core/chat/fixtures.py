"""Session-wide GGUF exports of the tiny Llama for the chat, evaluation, CLI and GUI tests.

Import the fixtures into a conftest or test module (``from tests.core.chat.fixtures import ...``).
Exports are cached in this module, so several importing folders still export each preset once.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

_CACHE: dict[tuple[str, str], Path] = {}

PRESETS = ("F32", "Q8_0", "Q6_K", "Q4_K_M", "Q2_K")


def export_once(model: Path, preset: str, root: Path) -> Path:
    """Export ``model`` with ``preset`` once per session (files under ``root``)."""
    from studio.core.export.run import export_gguf

    key = (str(model), preset)
    if key not in _CACHE:
        out = root / f"{model.name}-{preset}.gguf"
        if not out.exists():
            root.mkdir(parents=True, exist_ok=True)
            export_gguf(model, out, preset)
        _CACHE[key] = out
    return _CACHE[key]


@pytest.fixture(scope="session")
def gguf_of(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path, str], Path]:
    """``gguf_of(model, preset) -> Path``: a cached GGUF export."""
    root = tmp_path_factory.getbasetemp() / "chat-exports"
    return lambda model, preset: export_once(Path(model), preset, root)


@pytest.fixture(scope="session")
def chat_model(llama_model: Path) -> Path:
    """The tiny Llama (hidden 256, 2 layers, planted outliers, a Zephyr-style chat template)."""
    return llama_model


@pytest.fixture(scope="session")
def f32_gguf(chat_model: Path, gguf_of: Callable[[Path, str], Path]) -> Path:
    """The tiny Llama exported as F32."""
    return gguf_of(chat_model, "F32")


def model_with_template(src: Path, dst: Path, template: str | None) -> Path:
    """A copy of checkpoint ``src`` whose chat template is ``template`` (None removes it)."""
    if not dst.exists():
        tmp = dst.with_name(dst.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp)
        cfg_path = tmp / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        cfg.pop("chat_template", None)
        if template is not None:
            cfg["chat_template"] = template
        cfg_path.write_text(json.dumps(cfg), encoding="utf-8")
        for extra in ("chat_template.jinja", "chat_template.json"):
            (tmp / extra).unlink(missing_ok=True)
        tmp.rename(dst)
    return dst


@pytest.fixture(scope="session")
def plain_model(chat_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama without any chat template (plain completion)."""
    return model_with_template(chat_model, tmp_path_factory.getbasetemp() / "chat-plain-llama", None)


@pytest.fixture
def canary(tmp_path: Path) -> Iterator[Path]:
    """A path a malicious template tries to create; it must never exist."""
    p = tmp_path / "canary-owned"
    yield p
    assert not p.exists(), "a chat template ran a command"


def evil_template(canary: Path) -> str:
    """The sglang-style PoC: reach ``os`` through ``lipsum.__globals__`` and run a command."""
    return '{{ lipsum.__globals__["os"].popen("touch ' + str(canary) + '").read() }}'
