"""Exported GGUFs carry llama.cpp's converter's general.* keys and no local paths.

The converter's keys come from ``data/converter_metadata.json`` (recorded with the pinned
llama.cpp's ``convert_hf_to_gguf.py``, see ``converter_metadata``); a slow test re-records them
with the converter where this machine has it and checks the record still holds.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from studio.core.export.run import export_gguf
from studio.core.gguf.read import read_gguf
from tests.core.export import converter_metadata as cm

HEX40 = "0123456789abcdef" * 2 + "01234567"


@pytest.fixture(scope="module")
def converter_models(tmp_path_factory) -> list[Path]:
    return cm.build_models(tmp_path_factory.mktemp("converter-models"))


def _strings(meta: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, text) of every string value, array element and string inside the JSON plan."""
    out: list[tuple[str, str]] = []

    def walk(key: str, v: Any) -> None:
        if isinstance(v, str):
            out.append((key, v))
            if v[:1] in "{[":
                try:
                    walk(key + "(json)", json.loads(v))
                except ValueError:
                    pass
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(key, str(k))
                walk(key, x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(key, x)

    for k, v in meta.items():
        if k != "tokenizer.ggml.tokens":  # the vocabulary: model text, not ours
            walk(k, v)
    return out


_ABSOLUTE = re.compile(r"(^|[\s\"'=(:,])(/[^/\s]+/|[A-Za-z]:[\\/]|\\\\|~/)")


def _path_like(meta: dict[str, Any], *folders: Path) -> list[str]:
    bad = []
    for key, text in _strings(meta):
        if any(str(f) in text or str(f.resolve()) in text for f in folders) or _ABSOLUTE.search(text):
            if not text.startswith("https://"):
                bad.append(f"{key}: {text[:120]!r}")
        elif str(Path.home()) in text:
            bad.append(f"{key}: {text[:120]!r}")
    return bad


@pytest.mark.parametrize("backend", ["studio", "llama.cpp"])
def test_no_string_in_an_export_is_a_local_path(backend, llama_model, tmp_path):
    src = tmp_path / "home" / "someone" / "models" / "my-llama"
    shutil.copytree(llama_model, src)
    out = export_gguf(src, tmp_path / "m.gguf", "Q4_K_M", backend=backend).path
    meta = read_gguf(out).metadata
    assert _path_like(meta, src, tmp_path) == []
    assert "general.source.path" not in meta
    assert meta["general.name"] == "My Llama"  # the folder's name, as the converter writes it
    # the detector itself finds a path where there is one
    assert _path_like({"general.x": f"made from {src}"}, src) and _path_like({"y": "C:\\Users\\me\\m"})


def test_a_hub_cache_model_records_repo_and_revision_not_its_path(llama_model, tmp_path):
    snap = tmp_path / "hub" / "models--tiny-org--TinyLlama-2.1M-Chat" / "snapshots" / HEX40
    shutil.copytree(llama_model, snap)
    meta = read_gguf(export_gguf(snap, tmp_path / "h.gguf", "Q8_0").path).metadata
    assert meta["general.source.repo_url"] == "https://huggingface.co/tiny-org/TinyLlama-2.1M-Chat"
    assert meta["general.source.url"] == f"https://huggingface.co/tiny-org/TinyLlama-2.1M-Chat/tree/{HEX40}"
    # named as the converter names a clone of that repository, never after the snapshot hash
    assert meta["general.name"] == "TinyLlama 2.1M Chat" and meta["general.basename"] == "TinyLlama"
    assert meta["general.finetune"] == "Chat" and HEX40 not in meta["general.name"]
    assert _path_like(meta, snap, tmp_path) == []


def test_general_keys_equal_llama_cpps_converter(converter_models, tmp_path):
    record = json.loads(cm.RECORD.read_text(encoding="utf-8"))
    assert sorted(record) == sorted(f.name for f in converter_models)
    for folder in converter_models:
        ours = cm.compared_keys(
            read_gguf(export_gguf(folder, tmp_path / f"{folder.name}.gguf", "F32").path).metadata
        )
        want = record[folder.name]
        both = set(ours) & set(want)
        assert {k: ours[k] for k in both} == {k: want[k] for k in both}, folder.name
        # and we write every one of them: the converter's general.* keys and key/value lengths
        assert set(want) - set(ours) == set(), f"{folder.name}: missing {sorted(set(want) - set(ours))}"
        extra = set(ours) - set(want)
        assert extra <= {"general.source.repo_url", "general.source.url"}, extra


@pytest.mark.slow
@pytest.mark.skipif(
    cm.converter_path() is None, reason="llama.cpp's convert_hf_to_gguf.py is not on this machine"
)
def test_the_record_is_what_the_converter_writes(tmp_path):
    """Run llama.cpp's converter now on the same models: the checked-in record must still be its output."""
    got = cm.converter_record(cm.converter_path(), tmp_path)
    assert got == json.loads(cm.RECORD.read_text(encoding="utf-8"))


def test_key_length_follows_config_head_dim(tiny_model, tmp_path):
    """The converter writes <arch>.attention.key_length/value_length whenever config.json names head_dim."""
    src = tmp_path / "m"
    shutil.copytree(tiny_model("llama"), src)
    meta = read_gguf(export_gguf(src, tmp_path / "a.gguf", "F32").path).metadata
    assert meta["llama.attention.key_length"] == meta["llama.attention.value_length"] == 64
    cfg = json.loads((src / "config.json").read_text())
    cfg.pop("head_dim", None)
    (src / "config.json").write_text(json.dumps(cfg))
    meta = read_gguf(export_gguf(src, tmp_path / "b.gguf", "F32").path).metadata
    assert "llama.attention.key_length" not in meta  # as the converter: nothing to say when implied
    assert os.path.exists(tmp_path / "b.gguf")
