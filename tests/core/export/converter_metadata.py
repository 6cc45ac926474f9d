"""What llama.cpp's own converter writes in general.* (and attention key/value lengths) for factory models.

``tests/core/export/data/converter_metadata.json`` is its record, made by running the pinned
llama.cpp's ``convert_hf_to_gguf.py`` (vendored in the llama-cpp-python sdist) on the models built
here. The record is checked in because CI has no converter: a test that only ran the converter
would be skipped there. Where the converter is present, a slow test runs it again and checks the
record is still what it writes, so moving the llama-cpp-python pin cannot leave it stale.

    python -m tests.core.export.converter_metadata [CONVERTER]   # rewrite the record
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

RECORD = Path(__file__).with_name("data") / "converter_metadata.json"
VENDORED = Path("/work/tools/llama_cpp_python-0.3.36/vendor/llama.cpp/convert_hf_to_gguf.py")
CONVERTER_ENV = "QUANT_STUDIO_CONVERTER"  # path of convert_hf_to_gguf.py, when not the vendored copy

# (folder name, factory arch, model card front matter); the names follow Hugging Face's
# <basename>-<size>-<finetune>-<version> pattern so the converter's name heuristics all fire
MODELS: list[tuple[str, str, str]] = [
    (
        "TinyLlama-2.1M-Chat-v0.3",
        "llama",
        "license: apache-2.0\nlanguage:\n- en\n- de\ntags:\n- tiny\nbase_model: quant-studio/TinyLlama-2.1M",
    ),
    ("Mistral-Mini-0.6M-Instruct", "mistral", "license: mit\npipeline_tag: text-generation"),
    ("Gemma2-Test-1.2M-it", "gemma2", "license: gemma\nlicense_name: gemma-terms"),
    ("phi3-demo", "phi3", ""),
]
# byte-level BPE factory tokenizers (qwen2, gpt2) are unknown to the converter's pre-tokenizer table
KEEP_PREFIX = "general."
ARCH_KEYS = ("attention.key_length", "attention.value_length")


def converter_path() -> Path | None:
    """The converter script to compare with, or None when this machine has none."""
    env = os.environ.get(CONVERTER_ENV)
    p = Path(env) if env else VENDORED
    return p if p.is_file() and (p.parent / "gguf-py").is_dir() else None


def build_models(root: Path) -> list[Path]:
    """The factory models of ``MODELS`` (with their README.md) under ``root``."""
    from studio.core.factory import make_tiny_model

    out = []
    for name, arch, card in MODELS:
        folder = root / name
        if not folder.exists():
            tmp = make_tiny_model(
                root / f".{name}.tmp", arch, outliers=False, hidden=128 if arch != "gemma2" else 256
            )
            if card:
                (tmp / "README.md").write_text(f"---\n{card}\n---\n\n# {name}\n", encoding="utf-8")
            tmp.rename(folder)
        out.append(folder)
    return out


def compared_keys(metadata: dict[str, Any]) -> dict[str, Any]:
    """The keys this comparison is about, JSON-ready (numpy scalars as Python numbers)."""
    arch = str(metadata.get("general.architecture", ""))
    keep = {}
    for k, v in metadata.items():
        if k.startswith(KEEP_PREFIX) or k in {f"{arch}.{a}" for a in ARCH_KEYS}:
            keep[k] = v.item() if hasattr(v, "item") else (list(v) if isinstance(v, tuple) else v)
    return keep


_DRIVER = r"""
import json, runpy, sys
conv, jobs = sys.argv[1], json.loads(sys.argv[2])
sys.argv = [conv]
mod = runpy.run_path(conv, run_name="quant_studio_converter")
for folder, out in jobs:
    sys.argv = [conv, folder, "--outfile", out, "--outtype", "f32"]
    mod["main"]()
"""


def run_converter(converter: Path, folders: list[Path], out_dir: Path) -> list[Path]:
    """Convert every folder to F32 GGUF with llama.cpp's converter (one child process)."""
    outs = [out_dir / f"{f.name}.gguf" for f in folders]
    jobs = json.dumps([[str(f), str(o)] for f, o in zip(folders, outs, strict=True)])
    env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}  # its own gguf-py, not ours
    r = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(converter), jobs],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(converter.parent),
        timeout=600,
    )
    if r.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf.py failed:\n{r.stderr[-3000:]}")
    return outs


def converter_record(converter: Path, root: Path) -> dict[str, dict[str, Any]]:
    """{folder name: compared keys} of the converter's output for ``MODELS`` built under ``root``."""
    from studio.core.gguf.read import read_gguf

    folders = build_models(root)
    outs = run_converter(converter, folders, root)
    return {f.name: compared_keys(read_gguf(o).metadata) for f, o in zip(folders, outs, strict=True)}


def main(argv: list[str]) -> int:
    conv = Path(argv[0]) if argv else converter_path()
    if conv is None:
        print("no convert_hf_to_gguf.py here; pass its path", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="qs-converter-"))
    try:
        record = converter_record(conv, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    RECORD.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {RECORD}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
